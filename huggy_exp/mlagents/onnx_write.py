"""Write the graph ML-Agents' exporter writes (opset 9, same names, inputs and outputs in its order), with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.mlagents.heads import HEADS
from huggy_exp.files import atomic_write
from huggy_exp.mlagents.weights import (
    ACTION_MASKS, BODY_PREFIX, NORMALIZER_CLAMP, PROCESSOR_PREFIXES, RECURRENT_IN, RECURRENT_OUT, PolicyWeights,
    obs_name,
)


class _Builder:
    """Nodes and initializers of one graph, with ML-Agents-like generated names."""

    def __init__(self):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.inits, self.nodes = [], []
        self.counter = iter(range(100_000))

    def const(self, name: str, value, dtype=np.float32) -> str:
        self.inits.append(self.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(self, op: str, inputs: list[str], out: str | list[str] | None = None, **attrs) -> str | list[str]:
        outs = [out or f"/{op}_{next(self.counter)}_output_0"] if not isinstance(out, list) else out
        self.nodes.append(self.helper.make_node(op, inputs, outs, name=f"/{op}_{next(self.counter)}", **attrs))
        return outs[0] if not isinstance(out, list) else outs

    def scalar(self, value: float) -> str:
        out = f"/Constant_{next(self.counter)}_output_0"
        self.nodes.append(self.helper.make_node("Constant", [], [out], value=self.numpy_helper.from_array(np.array(value, np.float32))))
        return out

    def gemm(self, x: str, prefix: str, weight: np.ndarray, bias: np.ndarray) -> str:
        return self.node("Gemm", [x, self.const(prefix + "weight", weight), self.const(prefix + "bias", bias)],
                         alpha=1.0, beta=1.0, transB=1)


def write_onnx(w: PolicyWeights, path: Path) -> None:
    """Build the graph ML-Agents' exporter writes for these weights (opset 9), check it, and write it atomically."""
    import onnx
    from onnx import TensorProto, helper

    g = _Builder()
    heads = [h for h in HEADS if h.sizes(w)]
    g.const("version_number.1", [w.version_number])
    for head in heads:
        g.const(head.size_vector, head.sizes(w)[0])
    g.const("memory_size_vector", [w.memory_size])
    x = g.node("Concat", [_normalized(g, w, i) for i in range(len(w.inputs))], axis=1)
    for i, (weight, bias) in enumerate(w.layers):
        x = g.gemm(x, f"{BODY_PREFIX}{2 * i}.", weight, bias)
        x = g.node("Mul", [x, g.node("Sigmoid", [x])])
    if w.lstm is not None:
        x = _lstm(g, w, x)
    for head in heads:
        head.write_onnx(g, w, x)
    g.node("Identity", ["version_number.1"], "version_number")
    g.node("Identity", ["memory_size_vector"], "memory_size")
    for head in heads:
        g.node("Identity", [head.size_vector], head.outputs[1])

    elem = {"float": TensorProto.FLOAT, "int64": TensorProto.INT64}
    inputs, outputs = ([helper.make_tensor_value_info(name, elem[kind], dims) for name, kind, dims in side]
                       for side in interface(w).values())
    graph = helper.make_graph(g.nodes, "huggy_exp policy", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, producer_name="huggy_exp", opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    atomic_write(path, lambda tmp: onnx.save(model, tmp, format="protobuf"))


def interface(w: PolicyWeights) -> dict[str, list[tuple[str, str, list]]]:
    """ML-Agents' graph inputs and outputs for these weights, in its order, as (name, element type, dims); "batch" is the
    symbolic batch: obs_<i>, action_masks (discrete), recurrent_in (memory); version_number, memory_size, each head's
    three outputs (continuous, then discrete), recurrent_out (memory)."""
    heads = [h for h in HEADS if h.sizes(w)]
    inputs = [(obs_name(i), "float", ["batch", obs.size]) for i, obs in enumerate(w.inputs)]
    outputs = [("version_number", "float", [1]), ("memory_size", "float", [1])]
    for head in heads:
        vector, width = head.sizes(w)
        outputs += [(head.outputs[0], head.dtype, ["batch", width]), (head.outputs[1], "float", list(np.shape(vector))),
                    (head.outputs[2], head.dtype, ["batch", width])]
    if w.branches:
        inputs.append((ACTION_MASKS, "float", ["batch", sum(w.branch_sizes)]))
    if w.lstm is not None:
        inputs.append((RECURRENT_IN, "float", ["batch", 1, w.memory]))
        outputs.append((RECURRENT_OUT, "float", ["batch", 1, w.memory]))
    return {"inputs": inputs, "outputs": outputs}


def _normalized(g: _Builder, w: PolicyWeights, i: int) -> str:
    """obs_<i>, through Sub(running_mean) -> Div(folded std) -> Clip(-5, 5) when the input has a normalizer."""
    x, n = obs_name(i), w.inputs[i].normalizer
    if n is None:
        return x
    x = g.node("Sub", [x, g.const(f"{PROCESSOR_PREFIXES[0]}{i}.normalizer.running_mean", n.running_mean)])
    x = g.node("Div", [x, g.const("normalizer_folded_std" + (f"_{i}" if i else ""), n.std)])
    return g.node("Clip", [x], min=-NORMALIZER_CLAMP, max=NORMALIZER_CLAMP)


def _lstm(g: _Builder, w: PolicyWeights, x: str) -> str:
    """One LSTM step as ML-Agents exports it: recurrent_in [N, 1, m] -> h (first half), c (second half); recurrent_out."""
    m, hidden = w.lstm, w.lstm.hidden_size
    onnx_order = lambda a: np.concatenate([a[k * hidden:(k + 1) * hidden] for k in (0, 3, 1, 2)])  # noqa: E731  i,f,g,o -> i,o,f,c
    seq = g.node("Transpose", [g.node("Reshape", [x, g.const("lstm_input_shape", [-1, 1, w.layers[-1][0].shape[0]], np.int64)])],
                 perm=[1, 0, 2])
    memory = g.node("Transpose", [RECURRENT_IN], perm=[1, 0, 2])
    h0 = g.node("Slice", [memory], axes=[2], starts=[0], ends=[hidden])
    c0 = g.node("Slice", [memory], axes=[2], starts=[hidden], ends=[2**63 - 1])
    weights = [g.const("lstm_W", onnx_order(m.weight_ih)[None]), g.const("lstm_R", onnx_order(m.weight_hh)[None]),
               g.const("lstm_B", np.concatenate([onnx_order(m.bias_ih), onnx_order(m.bias_hh)])[None])]
    y, y_h, y_c = g.node("LSTM", [seq, *weights, "", h0, c0], ["/lstm/Y", "/lstm/Y_h", "/lstm/Y_c"], hidden_size=hidden)
    g.node("Transpose", [g.node("Concat", [y_h, y_c], axis=-1)], RECURRENT_OUT, perm=[1, 0, 2])
    y = g.node("Transpose", [g.node("Squeeze", [y], axes=[1])], perm=[1, 0, 2])
    return g.node("Reshape", [y, g.const("lstm_output_shape", [-1, hidden], np.int64)])
