"""ML-Agents .onnx graphs read by structure: weights from initializers, found by the ops that use them."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.foreign import MAX_ONNX_BYTES, check_file_size
from huggy_exp.host import size
from huggy_exp.mlagents.heads import read_heads
from huggy_exp.mlagents.onnx_graph import RESHAPES, Graph, expose, follow, linear, slice_start, value_info
from huggy_exp.mlagents.onnx_write import interface
from huggy_exp.mlagents.results import step_from_name
from huggy_exp.mlagents.weights import (
    ACTION_MASKS, RECURRENT_IN, LoadedModel, Lstm, Normalizer, ObsInput, PolicyWeights, check_shapes, obs_name,
    require_file, sha256_file,
)


def load_onnx(path: str | Path) -> LoadedModel:
    """Read the policy from an ML-Agents .onnx alone: weights from initializers, found by graph structure."""
    path = require_file(Path(path), "onnx file")
    weights = weights_from_onnx(read_onnx(path), f"onnx file {path}")
    return LoadedModel(weights, "onnx", path, sha256_file(path), step=step_from_name(path), onnx_path=path)


def read_onnx(path: Path):
    """Parse an .onnx; external data is read only from inside the model's folder, as onnx's own checks allow."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    check_file_size(path, MAX_ONNX_BYTES, "onnx file")
    try:
        model = onnx.load(str(path), format="protobuf", load_external_data=False)  # never a format the suffix picks
    except Exception as exc:
        raise UserError(f"onnx file {path} could not be parsed (truncated or not ONNX?): {type(exc).__name__}") from None
    check_external_sizes(model, path)
    try:
        load_external_data_for_model(model, str(path.parent))
    except onnx.checker.ValidationError as exc:
        reason = str(exc).strip().splitlines()[0].rstrip(".")
        if "not regular file" in reason or "exist" in reason:
            raise UserError(f"onnx file {path}: external data missing: {reason}; keep its data files beside the model") from None
        raise UserError(f"onnx file {path}: external data refused: {reason}") from None
    except Exception as exc:
        raise UserError(f"onnx file {path}: external data could not be read: {type(exc).__name__}: {str(exc).strip()[:200]}") from None
    return model


def check_external_sizes(model, path: Path) -> None:
    """Before any external data is read: each tensor's declared length must be what its shape and type hold, and the
    model with all of them within MAX_ONNX_BYTES (a data file's real size counts where no length is declared)."""
    from onnx import TensorProto, external_data_helper, helper

    total = path.stat().st_size
    for tensor in external_data_helper._get_all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        info = {e.key: e.value for e in tensor.external_data}
        try:
            itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        except (KeyError, TypeError, ValueError):
            itemsize = 1
        expected = math.prod(tensor.dims) * itemsize if tensor.data_type != TensorProto.STRING else None
        declared = int(info["length"]) if str(info.get("length", "")).isdigit() else None
        where = f"onnx file {path}: initializer {tensor.name!r}"
        if declared is not None and expected is not None and declared != expected:
            raise UserError(f"{where} declares {size(declared)} of external data, but its shape {list(tensor.dims)} "
                            f"holds {size(expected)}; refused before reading it")
        if declared is None:  # onnx reads the data file from the offset to its end
            data = path.parent / info.get("location", "")
            offset = int(info["offset"]) if str(info.get("offset", "")).isdigit() else 0
            declared = max(data.stat().st_size - offset, 0) if data.is_file() else 0
        total += declared
        if total > MAX_ONNX_BYTES:
            raise UserError(f"{where}: the model with its external data reaches {size(total)}, over the "
                            f"{size(MAX_ONNX_BYTES)} limit for a policy network (docs/reliability.md); refused before reading it")


def check_onnx_pairing(path: Path, w: PolicyWeights) -> None:
    """The .onnx compared with a policy must take ML-Agents' inputs (obs_<i>, action_masks, recurrent_in) at the policy's
    widths, in order, and expose its action outputs at the policy's widths."""
    model = read_onnx(Path(path))
    inits = {i.name for i in model.graph.initializer}
    inputs = [value_info(i) for i in model.graph.input if i.name not in inits]
    outputs = dict(value_info(o) for o in model.graph.output)
    io = interface(w)
    want_in = [(name, dims[1:]) for name, _, dims in io["inputs"]]
    want_out = {name: dims[1:] for name, _, dims in io["outputs"] if dims[:1] == ["batch"]}
    if [(n, list(d[1:])) for n, d in inputs] == want_in and all(
            name in outputs and list(outputs[name][1:]) == dims for name, dims in want_out.items()):
        return
    show = lambda items: ", ".join(f"{n} [{', '.join(str(d) if isinstance(d, int) else 'N' for d in dims)}]" for n, dims in items) or "none"  # noqa: E731
    raise UserError(f"onnx file {path} is not an ML-Agents policy for this checkpoint: expected inputs "
                    f"{show((n, ['N', *d]) for n, d in want_in)} and outputs {show((n, ['N', *d]) for n, d in want_out.items())}; "
                    f"found inputs {show(inputs)}; outputs {show(outputs.items())}")


def onnx_input_sizes(path: Path) -> tuple[int, ...] | None:
    """Widths of an ML-Agents .onnx's observation inputs obs_0, obs_1, ... (None when it has none readable)."""
    try:
        model = read_onnx(Path(path))
    except UserError:
        return None
    dims = dict(value_info(i) for i in model.graph.input)
    names = sorted((n for n in dims if re.fullmatch(r"obs_\d+", n)), key=lambda n: int(n[4:]))
    if not names or names != [obs_name(i) for i in range(len(names))]:
        return None
    sizes = [dims[n][-1] if len(dims[n]) == 2 else None for n in names]
    return tuple(sizes) if all(isinstance(s, int) and s > 0 for s in sizes) else None


def _observation_inputs(g: Graph) -> tuple[list[str], str | None, str | None]:
    """(observation input names in order, action mask input, memory input); unsupported inputs are refused by what they are."""
    conv = next((n for n in g.nodes if n.op_type in ("Conv", "MaxPool", "AveragePool")), None)
    masks = ACTION_MASKS if ACTION_MASKS in g.inputs else None
    memory = RECURRENT_IN if RECURRENT_IN in g.inputs else None
    obs = [n for n in g.inputs if n not in (masks, memory)]
    for name in obs:
        rank = len(g.dims.get(name, []))
        if rank in (3, 4) or conv is not None:
            what = "a visual observation (CNN encoder)" if rank == 4 or conv is not None else "a variable-length observation (attention)"
            raise UserError(f"{g.origin}: unsupported policy shape: {what} (found input {name} {g.dims.get(name)}"
                            f"{f', node {conv.op_type}' if conv is not None else ''}); supported: vector observation inputs, "
                            "an MLP, an optional LSTM, continuous and/or discrete actions")
    if len(obs) > 1:
        expected = [obs_name(i) for i in range(len(obs))]
        if sorted(obs) != sorted(expected):
            raise g.fail(f"observation inputs {obs} are not ML-Agents' {expected}")
        obs = expected
    if not obs:
        raise g.fail(f"no observation input (inputs: {g.inputs})")
    return obs, masks, memory


def _normalizer_of(g: Graph, name: str) -> tuple[Normalizer | None, str]:
    """An input's Sub(mean) -> Div(std) -> Clip(-5, 5), if any, and the tensor after it."""
    cursor = follow(g, name)
    sub = g.only(cursor, "Sub")
    if sub is None:
        return None, cursor
    mean = g.const_input(sub)
    div = g.only(sub.output[0], "Div") if sub.output else None
    clip = g.only(div.output[0], "Clip") if div is not None and div.output else None
    std = g.const_input(div) if div is not None else None
    if mean is None or std is None or clip is None or not clip.output:
        raise g.fail("observation input feeds a Sub that is not followed by Div(constant) -> Clip")
    if (std <= 0).any():
        first = int(np.argwhere(std.reshape(-1) <= 0)[0][0])
        raise UserError(f"{g.origin}: normalizer std (the Div constant) has {int((std <= 0).sum())} values <= 0 (first at [{first}]); "
                        "ML-Agents folds sqrt(running_variance / normalization_steps) there, which is > 0")
    return Normalizer(mean.reshape(-1), None, None, folded_std=std.reshape(-1)), clip.output[0]


def _body(g: Graph, cursor: str) -> tuple[list, list[str], str]:
    """The chain of Gemm -> Sigmoid -> Mul (Swish) layers from `cursor`; the layers, each one's output (Policy.trace's
    hidden_<i>) and the last hidden tensor."""
    gemms, hidden = [], []
    while True:
        for gemm in (n for n in g.consumers(cursor) if n.op_type == "Gemm" and n.output):
            sig = g.only(gemm.output[0], "Sigmoid")
            mul = next((n for n in g.consumers(gemm.output[0]) if n.op_type == "Mul" and sig is not None and sig.output
                        and sig.output[0] in n.input and n.output), None)
            if mul is not None:
                break
        else:
            return gemms, hidden, cursor
        if any(gemm is seen for seen in gemms):
            raise g.fail("the layer chain loops back on itself")
        gemms.append(gemm)
        cursor = mul.output[0]
        hidden.append(cursor)


def _lstm(g: Graph, cursor: str, memory: str | None) -> tuple[Lstm | None, str]:
    """ML-Agents' LSTM after the MLP (ONNX gate order i, o, f, c back to torch's i, f, g, o); the tensor the heads read."""
    node = next((n for n in g.nodes if n.op_type == "LSTM"), None)
    if node is None:
        if memory is not None:
            raise g.fail(f"input {memory} is not used by an LSTM")
        return None, cursor
    if memory is None:
        raise g.fail(f"an LSTM without ML-Agents' {RECURRENT_IN} input")
    names = list(node.input) + [""] * (7 - len(node.input))
    if not all(n in g.const for n in names[1:4]) or not node.output:
        raise g.fail("the LSTM has no constant W, R and B")
    hidden = int(g.attr(node, "hidden_size", 0) or 0)
    W, R, B = (g.weight(n) for n in names[1:4])
    if hidden <= 0 or W.shape[:2] != (1, 4 * hidden) or R.shape != (1, 4 * hidden, hidden) or B.shape != (1, 8 * hidden):
        raise g.fail(f"LSTM W {list(W.shape)} / R {list(R.shape)} / B {list(B.shape)} do not fit hidden_size {hidden}")
    if (g.attr(node, "direction", b"forward") not in (b"forward", "forward") or g.attr(node, "clip") is not None
            or g.attr(node, "input_forget", 0) or g.attr(node, "activations") is not None):
        raise g.fail("the LSTM is not a plain forward LSTM (direction, clip, input_forget or activations set)")
    order = lambda a: np.concatenate([a[k * hidden:(k + 1) * hidden] for k in (0, 2, 3, 1)])  # noqa: E731
    lstm = Lstm(order(W[0]), order(R[0]), order(B[0, :4 * hidden]), order(B[0, 4 * hidden:]))
    for index, start in ((5, 0), (6, hidden)):
        begin = slice_start(g, g.producer.get(names[index]))
        if begin is not None and begin != start:
            raise g.fail(f"LSTM initial {'h' if index == 5 else 'c'} is {RECURRENT_IN}[..., {begin}:], ML-Agents puts it at [{start}:]")
    return lstm, follow(g, node.output[0], RESHAPES)


def weights_from_onnx(model, origin: str) -> PolicyWeights:
    """Rebuild PolicyWeights from an ML-Agents graph: per-input normalizers, Concat, Swish MLP, optional LSTM, heads."""
    return read_graph(Graph(model, origin))[0]


def read_graph(g: Graph) -> tuple[PolicyWeights, dict[str, list[str]]]:
    """The weights, and where each part Policy.trace names is computed in the graph: its tensor (several, side by side on
    axis 1: the branches' logits). Found by the same walk that reads the weights, so a part is named only where the
    walk identified it."""
    obs, masks, memory = _observation_inputs(g)
    processed = [_normalizer_of(g, name) for name in obs]
    concat = g.only(processed[0][1], "Concat")
    if len(obs) > 1:
        if concat is None or list(concat.input) != [c for _, c in processed] or not concat.output:
            raise g.fail(f"the observation inputs {obs} do not meet in one Concat, in input order")
        cursor = concat.output[0]
    else:
        cursor = concat.output[0] if concat is not None and len(concat.input) == 1 and concat.output else processed[0][1]
    gemms, hidden, cursor = _body(g, cursor)
    if not gemms:
        raise g.fail("no chain of Gemm -> Sigmoid -> Mul layers followed by a mu Gemm")
    layers = tuple(linear(g, n) for n in gemms)
    lstm, cursor = _lstm(g, cursor, memory)
    parts = {"normalized_obs": [processed[0][1]]} if len(obs) == 1 else {
        f"normalized_obs_{i}": [tensor] for i, (_, tensor) in enumerate(processed)}
    parts.update({f"hidden_{i}": [tensor] for i, tensor in enumerate(hidden)}, **({"lstm": [cursor]} if lstm else {}))
    heads, head_parts = read_heads(g, cursor, masks)
    if heads["branches"] and masks is None:
        raise g.fail("discrete branches without ML-Agents' action_masks input")
    inputs = _input_widths(g, obs, layers[0][0].shape[1], processed)
    scalars = {}
    for out, default in (("version_number", 3.0), ("memory_size", 0.0)):
        node = g.producer.get(out)
        name = node.input[0] if node is not None and node.op_type == "Identity" and node.input else out
        value = g.weight(name) if name in g.const else None
        scalars[out] = float(value.reshape(-1)[0]) if value is not None and value.size else default
    weights = PolicyWeights(layers, normalizer=None, inputs=inputs, lstm=lstm, **scalars, **heads)
    check_shapes(weights, g.origin)
    return weights, {**parts, **head_parts}


def with_parts(model, origin: str):
    """The graph (an onnx ModelProto, changed in place) with the parts Policy.trace names as outputs too (normalized_obs,
    hidden_<i>, lstm, mu, logits), so onnxruntime's intermediates line up with torch's per-layer attribution."""
    _, parts = read_graph(Graph(model, origin))
    outputs = {o.name for o in model.graph.output}
    expose(model, {name: tensors for name, tensors in parts.items() if name not in outputs}, typed=False)
    return model


def _input_widths(g: Graph, obs: list[str], width: int, processed: list) -> tuple[ObsInput, ...]:
    """Each input's width: its normalizer's, else its declared [batch, d], else (one input) the first layer's."""
    out = []
    for name, (normalizer, _) in zip(obs, processed):
        declared = g.dims.get(name, [])
        size = normalizer.running_mean.size if normalizer is not None else (declared[-1] if len(declared) == 2 else None)
        if len(obs) == 1 and normalizer is None:
            size = width
        if not isinstance(size, int) or size <= 0:
            raise g.fail(f"input {name} has no fixed width ({declared})")
        out.append(ObsInput(int(size), normalizer))
    return tuple(out)
