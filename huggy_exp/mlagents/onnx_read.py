"""ML-Agents .onnx graphs read by structure: weights from initializers, found by the ops that use them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents.results import step_from_name
from huggy_exp.mlagents.weights import LoadedModel, Normalizer, ONNX_INPUT, PolicyWeights, check_finite, require_file, check_shapes, sha256_file


def load_onnx(path: str | Path) -> LoadedModel:
    """Read the policy from an ML-Agents .onnx alone: weights from initializers, found by graph structure."""
    path = require_file(Path(path), "onnx file")
    weights = weights_from_onnx(read_onnx(path), f"onnx file {path}")
    return LoadedModel(weights, "onnx", path, sha256_file(path), step=step_from_name(path), onnx_path=path)


def read_onnx(path: Path):
    """Parse an .onnx; external data is read only from inside the model's folder, as onnx's own checks allow."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise UserError(f"onnx file {path} could not be parsed (truncated or not ONNX?): {type(exc).__name__}") from None
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


def _value_info(v) -> tuple[str, list]:
    """(name, dims) of a graph input/output; a dim is an int, its symbolic name, or '?'."""
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in v.type.tensor_type.shape.dim]
    return v.name, dims


def check_onnx_pairing(path: Path, w: PolicyWeights) -> None:
    """The .onnx compared with a policy must expose ML-Agents' input and outputs at the policy's widths."""
    model = read_onnx(Path(path))
    inits = {i.name for i in model.graph.initializer}
    inputs = [_value_info(i) for i in model.graph.input if i.name not in inits]
    outputs = dict(_value_info(o) for o in model.graph.output)
    want_out = {"deterministic_continuous_actions": w.act_dim, "continuous_actions": w.act_dim}
    fits = lambda dims, width: len(dims) == 2 and dims[1] == width  # noqa: E731
    if len(inputs) == 1 and inputs[0][0] == ONNX_INPUT and fits(inputs[0][1], w.obs_dim) and all(
            name in outputs and fits(outputs[name], width) for name, width in want_out.items()):
        return
    show = lambda items: ", ".join(f"{n} [{', '.join(str(d) if isinstance(d, int) else 'N' for d in dims)}]" for n, dims in items) or "none"  # noqa: E731
    raise UserError(
        f"onnx file {path} is not an ML-Agents policy for this checkpoint: expected input {ONNX_INPUT} [N, {w.obs_dim}] and outputs "
        + ", ".join(f"{n} [N, {k}]" for n, k in want_out.items())
        + f"; found inputs {show(inputs)}; outputs {show(outputs.items())}"
    )


class _Graph:
    """Producer/consumer/constant lookups over an ONNX graph."""

    def __init__(self, model, origin: str):
        from onnx import numpy_helper

        self.origin = origin
        self.nodes = list(model.graph.node)
        tensors = [(i.name, i) for i in model.graph.initializer]
        tensors += [(n.output[0], a.t) for n in self.nodes if n.op_type == "Constant" and n.output
                    for a in n.attribute if a.name == "value"]
        self.const = {}
        for name, tensor in tensors:
            try:
                self.const[name] = numpy_helper.to_array(tensor)
            except Exception as exc:
                raise self.fail(f"constant {name!r} cannot be read ({type(exc).__name__})") from None
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.inputs = [i.name for i in model.graph.input if i.name not in self.const]

    def consumers(self, name: str) -> list:
        return [n for n in self.nodes if name in n.input]

    def only(self, name: str, op: str | None = None):
        users = [n for n in self.consumers(name) if op is None or n.op_type == op]
        return users[0] if len(users) == 1 else None

    def const_input(self, node) -> np.ndarray | None:
        name = next((n for n in node.input if n in self.const), None)
        return None if name is None else self.weight(name)

    def weight(self, name: str) -> np.ndarray:
        """A constant as float32: numeric and finite, or an error naming it."""
        value = self.const[name]
        if value.dtype.kind not in "biuf":
            raise self.fail(f"constant {name!r} is {value.dtype}, not numbers")
        check_finite(value, f"initializer {name}", self.origin)
        return value.astype(np.float32)

    def attr(self, node, name: str, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def fail(self, what: str) -> UserError:
        return UserError(f"{self.origin}: not an ML-Agents policy graph: {what}")


def weights_from_onnx(model, origin: str) -> PolicyWeights:
    g = _Graph(model, origin)
    if len(g.inputs) != 1:
        raise g.fail(f"expected one observation input, found {g.inputs} (multiple sensors, masks or memory are not supported)")
    cursor, seen = g.inputs[0], set()
    while (passthrough := g.only(cursor, "Cast") or g.only(cursor, "Identity")) is not None and passthrough.output:
        if id(passthrough) in seen:
            raise g.fail("the graph has a cycle")
        seen.add(id(passthrough))
        cursor = passthrough.output[0]

    normalizer = None
    sub = g.only(cursor, "Sub")
    if sub is not None:
        mean = g.const_input(sub)
        div = g.only(sub.output[0], "Div")
        clip = g.only(div.output[0], "Clip") if div is not None else None
        std = g.const_input(div) if div is not None else None
        if mean is None or std is None or clip is None:
            raise g.fail("observation input feeds a Sub that is not followed by Div(constant) -> Clip")
        if (std <= 0).any():
            first = int(np.argwhere(std.reshape(-1) <= 0)[0][0])
            raise UserError(f"{origin}: normalizer std (the Div constant) has {int((std <= 0).sum())} values <= 0 (first at [{first}]); "
                            "ML-Agents folds sqrt(running_variance / normalization_steps) there, which is > 0")
        normalizer = Normalizer(mean.reshape(-1), None, None, folded_std=std.reshape(-1))
        cursor = clip.output[0]
    concat = g.only(cursor, "Concat")
    if concat is not None and len(concat.input) == 1:
        cursor = concat.output[0]

    gemms = []
    while True:
        candidates = [n for n in g.consumers(cursor) if n.op_type == "Gemm"]
        # after the last hidden layer a SAC actor has two heads: mu, and a log_sigma Gemm that feeds Clip -> Exp
        heads = [n for n in candidates if not any(c.op_type == "Clip" and any(e.op_type == "Exp" for e in g.consumers(c.output[0]))
                                                   for c in g.consumers(n.output[0]))]
        if len(heads) != 1:
            break
        gemm = heads[0]
        if any(gemm is seen for seen in gemms) or not gemm.output:
            raise g.fail("the layer chain loops back on itself or has no output")
        gemms.append(gemm)
        sig = g.only(gemm.output[0], "Sigmoid")
        mul = next((n for n in g.consumers(gemm.output[0]) if n.op_type == "Mul" and sig is not None and sig.output[0] in n.input), None)
        if mul is None:
            break
        cursor = mul.output[0]
    if len(gemms) < 2:
        raise g.fail("no chain of Gemm -> Sigmoid -> Mul layers followed by a mu Gemm")

    def linear(node) -> tuple[np.ndarray, np.ndarray]:
        names = list(node.input[1:3])
        if len(names) < 2 or not all(n in g.const for n in names):
            raise g.fail(f"Gemm {node.name or node.output[0]} has no constant weight and bias")
        weight, bias = (g.weight(n) for n in names)
        if not g.attr(node, "transB", 0):
            weight = weight.T
        return weight, bias.reshape(-1)

    layers = tuple(linear(n) for n in gemms[:-1])
    mu_node = gemms[-1]
    mu = linear(mu_node)

    exp = next((n for n in g.nodes if n.op_type == "Exp"), None)
    if exp is None:
        raise g.fail("no Exp node computing the action std")
    src = g.producer.get(exp.input[0]) if exp.input else None
    if src is not None and src.op_type == "Clip":
        sigma_gemm = g.producer.get(src.input[0]) if src.input else None
        if sigma_gemm is None or sigma_gemm.op_type != "Gemm":
            raise g.fail("clipped log_sigma is not produced by a Gemm")
        log_sigma: np.ndarray | tuple = linear(sigma_gemm)
    elif src is not None and src.op_type == "Add" and g.const_input(src) is not None:
        log_sigma = g.const_input(src).reshape(1, -1)
    else:
        raise g.fail("log_sigma is neither an added constant nor a clipped Gemm")

    det = g.producer.get("deterministic_continuous_actions")
    tanh_squash = not (det is not None and det.op_type == "Div")
    scalars = {}
    for out, default in (("version_number", 3.0), ("memory_size", 0.0)):
        node = g.producer.get(out)
        name = node.input[0] if node is not None and node.op_type == "Identity" and node.input else out
        value = g.weight(name) if name in g.const else None
        scalars[out] = float(value.reshape(-1)[0]) if value is not None and value.size else default
    weights = PolicyWeights(layers, mu, log_sigma, normalizer, tanh_squash, scalars["version_number"], scalars["memory_size"])
    check_shapes(weights, origin)
    return weights
