"""Write the graph ML-Agents' exporter writes (opset 9, same names, inputs and outputs in its order), with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.mlagents.weights import (
    ACTION_CLAMP, ACTION_MASKS, BODY_PREFIX, BRANCH_PREFIX, LOG_SIGMA, LOG_SIGMA_RANGE, MASK_PENALTY, MU_PREFIX, NORMALIZER_CLAMP,
    PROCESSOR_PREFIXES, RECURRENT_IN, RECURRENT_OUT, PolicyWeights, atomic_write, obs_name,
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
    g.const("version_number.1", [w.version_number])
    if w.mu is not None:
        g.const("continuous_act_size_vector", [float(w.act_dim)])
    if w.branches:
        g.const("discrete_act_size_vector", [[float(s) for s in w.branch_sizes]])
    g.const("memory_size_vector", [w.memory_size])
    x = g.node("Concat", [_normalized(g, w, i) for i in range(len(w.inputs))], axis=1)
    for i, (weight, bias) in enumerate(w.layers):
        x = g.gemm(x, f"{BODY_PREFIX}{2 * i}.", weight, bias)
        x = g.node("Mul", [x, g.node("Sigmoid", [x])])
    if w.lstm is not None:
        x = _lstm(g, w, x)
    if w.mu is not None:
        _continuous(g, w, x)
    if w.branches:
        _discrete(g, w, x)
    g.node("Identity", ["version_number.1"], "version_number")
    g.node("Identity", ["memory_size_vector"], "memory_size")
    if w.mu is not None:
        g.node("Identity", ["continuous_act_size_vector"], "continuous_action_output_shape")
    if w.branches:
        g.node("Identity", ["discrete_act_size_vector"], "discrete_action_output_shape")

    f, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [helper.make_tensor_value_info(obs_name(i), f, ["batch", obs.size]) for i, obs in enumerate(w.inputs)]
    outputs = [helper.make_tensor_value_info("version_number", f, [1]), helper.make_tensor_value_info("memory_size", f, [1])]
    if w.mu is not None:
        outputs += [helper.make_tensor_value_info("continuous_actions", f, ["batch", w.act_dim]),
                    helper.make_tensor_value_info("continuous_action_output_shape", f, [1]),
                    helper.make_tensor_value_info("deterministic_continuous_actions", f, ["batch", w.act_dim])]
    if w.branches:
        n = len(w.branches)
        inputs.append(helper.make_tensor_value_info(ACTION_MASKS, f, ["batch", sum(w.branch_sizes)]))
        outputs += [helper.make_tensor_value_info("discrete_actions", i64, ["batch", n]),
                    helper.make_tensor_value_info("discrete_action_output_shape", f, [1, n]),
                    helper.make_tensor_value_info("deterministic_discrete_actions", i64, ["batch", n])]
    if w.lstm is not None:
        inputs.append(helper.make_tensor_value_info(RECURRENT_IN, f, ["batch", 1, w.memory]))
        outputs.append(helper.make_tensor_value_info(RECURRENT_OUT, f, ["batch", 1, w.memory]))
    graph = helper.make_graph(g.nodes, "huggy_exp policy", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, producer_name="huggy_exp", opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    atomic_write(path, lambda tmp: onnx.save(model, tmp))


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


def _continuous(g: _Builder, w: PolicyWeights, x: str) -> None:
    """mu, log_sigma (PPO: mu * 0 + constant; SAC: clipped Gemm), RandomNormalLike samples, clamp / 3 or tanh."""
    from onnx import TensorProto

    mu = g.gemm(x, MU_PREFIX, *w.mu)
    if w.conditional_sigma:
        log_sigma = g.node("Clip", [g.gemm(x, LOG_SIGMA + ".", *w.log_sigma)], min=LOG_SIGMA_RANGE[0], max=LOG_SIGMA_RANGE[1])
    else:
        log_sigma = g.node("Add", [g.node("Mul", [mu, g.scalar(0.0)]), g.const(LOG_SIGMA, w.log_sigma)])
    std = g.node("Exp", [log_sigma])
    noisy = g.node("Add", [mu, g.node("Mul", [g.node("RandomNormalLike", [mu], dtype=TensorProto.FLOAT), std])])
    if w.tanh_squash:
        g.node("Tanh", [noisy], "continuous_actions")
        g.node("Identity", [mu], "deterministic_continuous_actions")
    else:
        g.node("Div", [g.node("Clip", [noisy], min=-ACTION_CLAMP, max=ACTION_CLAMP), g.scalar(ACTION_CLAMP)], "continuous_actions")
        g.node("Div", [g.node("Clip", [mu], min=-ACTION_CLAMP, max=ACTION_CLAMP), g.scalar(ACTION_CLAMP)],
               "deterministic_continuous_actions")


def _discrete(g: _Builder, w: PolicyWeights, x: str) -> None:
    """Per branch: mask slice, logits * mask - 1e8 * (1 - mask), Softmax; Multinomial(Log(p)) and ArgMax(p), concatenated."""
    from onnx import TensorProto

    sampled, deterministic, start = [], [], 0
    for b, (weight, bias) in enumerate(w.branches):
        mask = g.node("Slice", [ACTION_MASKS], axes=[1], starts=[start], ends=[start + weight.shape[0]])
        logits = g.gemm(x, f"{BRANCH_PREFIX}{b}.", weight, bias)
        block = g.node("Add", [g.node("Mul", [mask, g.scalar(-1.0)]), g.scalar(1.0)])
        masked = g.node("Sub", [g.node("Mul", [logits, mask]), g.node("Mul", [block, g.scalar(MASK_PENALTY)])])
        probs = g.node("Softmax", [masked], axis=1)
        sampled.append(g.node("Multinomial", [g.node("Log", [probs])], dtype=TensorProto.INT64, sample_size=1))
        deterministic.append(g.node("ArgMax", [probs], axis=1, keepdims=1))
        start += weight.shape[0]
    g.node("Concat", sampled, "discrete_actions", axis=1)
    g.node("Concat", deterministic, "deterministic_discrete_actions", axis=1)
