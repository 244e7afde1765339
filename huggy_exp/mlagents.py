"""Unity ML-Agents file formats: checkpoints (.pt), exported graphs (.onnx), results folders, the embedded default."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError

# --- state_dict keys, exactly as ML-Agents' SimpleActor names them
NORMALIZER_PREFIXES = (
    "network_body.observation_encoder.processors.0.normalizer.",
    "network_body.processors.0.normalizer.",
)
NORMALIZER_FIELDS = ("running_mean", "running_variance", "normalization_steps")
BODY_PREFIX = "network_body._body_endoder.seq_layers."
MU_PREFIX = "action_model._continuous_distribution.mu."
LOG_SIGMA = "action_model._continuous_distribution.log_sigma"
METADATA_KEYS = (
    "version_number",
    "is_continuous_int_deprecated",
    "continuous_act_size_vector",
    "discrete_act_size_vector",
    "act_size_vector_deprecated",
    "memory_size_vector",
)
ONNX_INPUT = "obs_0"
ONNX_OUTPUTS = (
    "version_number",
    "memory_size",
    "continuous_actions",
    "continuous_action_output_shape",
    "deterministic_continuous_actions",
)
ACTION_CLAMP = 3.0
NORMALIZER_CLAMP = 5.0
LOG_SIGMA_RANGE = (-20.0, 2.0)


@dataclass(frozen=True)
class Normalizer:
    """ML-Agents' running observation statistics; float32, as ML-Agents keeps them."""

    running_mean: np.ndarray
    running_variance: np.ndarray | None
    steps: int | None
    folded_std: np.ndarray | None = None

    @property
    def std(self) -> np.ndarray:
        """sqrt(running_variance / steps), computed by torch exactly as ML-Agents computes it (bit-identical).

        torch divides a float32 tensor by an int64 step count differently from numpy's float32 division
        (22% of Huggy's dimensions differ by one ulp), so numpy is not used here.
        """
        if self.folded_std is not None:
            return self.folded_std
        import torch

        variance = torch.from_numpy(np.ascontiguousarray(self.running_variance, np.float32))
        return torch.sqrt(variance / torch.tensor(self.steps, dtype=torch.int64)).numpy()

    def fp16_overflow_dims(self) -> int | None:
        """How many running-variance entries become inf when cast to float16; None when only a folded std is known (.onnx)."""
        if self.running_variance is None:
            return None
        with np.errstate(over="ignore"):
            return int(np.sum(~np.isfinite(self.running_variance.astype(np.float16))))


@dataclass(frozen=True)
class PolicyWeights:
    """Everything needed to rebuild an ML-Agents continuous-action actor, as float32 arrays."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    mu: tuple[np.ndarray, np.ndarray]
    log_sigma: np.ndarray | tuple[np.ndarray, np.ndarray]
    normalizer: Normalizer | None
    tanh_squash: bool = False
    version_number: float = 3.0
    memory_size: float = 0.0

    @property
    def obs_dim(self) -> int:
        return int(self.layers[0][0].shape[1])

    @property
    def act_dim(self) -> int:
        return int(self.mu[0].shape[0])

    @property
    def hidden_units(self) -> int:
        return int(self.layers[0][0].shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def conditional_sigma(self) -> bool:
        return isinstance(self.log_sigma, tuple)

    @property
    def parameter_count(self) -> int:
        """Weights and biases of the MLP and the mu head (566,805 for Huggy); log_sigma not included."""
        return int(sum(w.size + b.size for w, b in (*self.layers, self.mu)))

    @property
    def log_sigma_count(self) -> int:
        parts = self.log_sigma if self.conditional_sigma else (self.log_sigma,)
        return int(sum(p.size for p in parts))


@dataclass(frozen=True)
class LoadedModel:
    """A policy plus where it came from."""

    weights: PolicyWeights
    source: str
    path: Path
    sha256: str
    step: int | None = None
    synthetic: bool = False
    onnx_path: Path | None = None
    behavior: str | None = None

    def describe(self) -> dict:
        return {
            "source": self.source,
            "path": str(self.path),
            "sha256": self.sha256,
            "synthetic": self.synthetic,
            "step": self.step,
            "onnx": str(self.onnx_path) if self.onnx_path else None,
        }


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _require_file(path: Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    return path


# --- .pt checkpoints


def load_checkpoint(path: str | Path) -> LoadedModel:
    """Read an ML-Agents .pt checkpoint with torch.load(weights_only=True); no pickled code ever runs."""
    import torch

    path = _require_file(Path(path), "checkpoint")
    if path.stat().st_size == 0:
        raise UserError(f"checkpoint {path} is empty (0 bytes)")
    kind = _torch_container(path)
    if kind is None:
        raise UserError(f"checkpoint {path} is not a torch file: neither a zip archive (torch.save) nor a pickle stream")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for bad files; all mean the same to the user
        text = str(exc).strip()
        first = re.split(r"(?<=\.) ", text.splitlines()[0])[0] if text else type(exc).__name__
        if "Weights only load failed" in text or "weights_only" in text:
            raise UserError(
                f"checkpoint {path} holds pickled objects other than tensors; refused to unpickle it "
                "(torch.load weights_only=True)"
            ) from None
        raise UserError(f"checkpoint {path} is a {kind} but not a readable torch checkpoint (truncated or corrupt?): {first}") from None
    origin = f"checkpoint {path}"
    state, step = _policy_state(blob, origin)
    weights = weights_from_state_dict(state, origin)
    return LoadedModel(weights, "pt", path, sha256_file(path), step=step, onnx_path=_sibling_onnx(path))


def _torch_container(path: Path) -> str | None:
    """'zip archive' (torch.save), 'pickle stream' (legacy torch.save or a bare pickle), or None for anything else.

    The pickle opcodes are only parsed (pickletools), never executed.
    """
    import pickletools
    import zipfile

    with open(path, "rb") as fh:
        if fh.read(4) == b"PK\x03\x04" or zipfile.is_zipfile(fh):
            return "zip archive"
        fh.seek(0)
        try:
            for opcode, _, _ in pickletools.genops(fh):
                if opcode.name == "STOP":
                    return "pickle stream"
        except Exception:  # any parse failure means: not a pickle
            return None
    return None


def _policy_state(blob: object, origin: str) -> tuple[dict, int | None]:
    """The actor's state_dict and the global step from a checkpoint dict (or a bare actor state_dict)."""
    if not isinstance(blob, dict):
        raise UserError(f"{origin} is not an ML-Agents checkpoint: top level is {type(blob).__name__}, not a dict")
    step = None
    gs = blob.get("global_step")
    if isinstance(gs, dict) and gs:
        key, value = next(iter(gs.items()))
        step = _count(_array(value, f"key global_step.{key}", origin), f"key global_step.{key}", origin, minimum=0)
    if isinstance(blob.get("Policy"), dict):
        return blob["Policy"], step
    if any(isinstance(k, str) and k.startswith(BODY_PREFIX) for k in blob):
        return blob, step
    keys = ", ".join(sorted(map(str, blob))[:8]) or "none"
    raise UserError(f"{origin} is not an ML-Agents checkpoint: no 'Policy' state_dict (top-level keys: {keys})")


def _array(value: object, key: str, origin: str) -> np.ndarray:
    """A state_dict entry as a numeric numpy array; anything else (strings, lists, complex, sparse) is refused."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        try:
            if t.is_floating_point() and t.dtype not in (torch.float16, torch.float32, torch.float64):
                t = t.float()  # bfloat16, float8: numpy has no such dtype
            value = t.numpy()
        except Exception:
            raise UserError(f"{origin}: {key} is a {t.dtype} {t.layout} tensor, which cannot be read as numbers") from None
    elif isinstance(value, (bool, int, float)):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
        what = f"{value.dtype} array" if isinstance(value, np.ndarray) else type(value).__name__
        raise UserError(f"{origin}: {key} is a {what}, not a real-valued tensor")
    return value


def _count(a: np.ndarray, key: str, origin: str, minimum: int) -> int:
    """A one-element integer entry (a step count, a size); empty, fractional or too small is refused."""
    flat = a.reshape(-1)
    value = float(flat[0]) if flat.size == 1 else None
    if value is None or not np.isfinite(value) or value != int(value) or value < minimum or value > 2**62:
        shown = flat[:4].tolist() if flat.size else "empty"
        raise UserError(f"{origin}: {key} is {shown}, expected one integer >= {minimum}")
    return int(value)


def _nonfinite(a: np.ndarray) -> str | None:
    """'1 NaN (first at [3, 17])' when a float array holds NaN or inf as float32; None when every value is finite."""
    if a.dtype.kind != "f":
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = a.astype(np.float32)
    bad = ~np.isfinite(f32)
    if not bad.any():
        return None
    nan, inf = int(np.isnan(f32).sum()), int(np.isinf(f32).sum())
    what = " and ".join(f"{n} {label}" for n, label in ((nan, "NaN"), (inf, "inf")) if n)
    where = [int(i) for i in np.argwhere(bad)[0]]
    overflow = " once cast to float32" if np.isfinite(a[tuple(where)]) else ""
    return f"{what}{overflow} (first at {where})"


def _check_finite(a: np.ndarray, name: str, origin: str) -> None:
    if (bad := _nonfinite(a)) is not None:
        raise UserError(f"{origin}: {name} has {bad}")


def weights_from_state_dict(state: dict, origin: str) -> PolicyWeights:
    """Rebuild PolicyWeights from ML-Agents actor keys; sizes come from tensor shapes, never assumed."""
    known: set[str] = set(METADATA_KEYS)
    odd = next((k for k in state if not isinstance(k, str)), None)
    if odd is not None:
        raise UserError(f"{origin}: Policy key {odd!r} is a {type(odd).__name__}, not a string")
    arrays = {k: _array(v, f"Policy key {k}", origin) for k, v in state.items()}

    discrete = [k for k in arrays if k.startswith("action_model._discrete_distribution")]
    if discrete:
        raise UserError(f"{origin}: discrete action branches are not supported (found {discrete[0]})")

    layer_ids = sorted({int(m.group(1)) for k in arrays if (m := re.match(re.escape(BODY_PREFIX) + r"(\d+)\.", k))})
    if not layer_ids:
        raise UserError(f"{origin}: missing keys {BODY_PREFIX}0.weight/bias (no MLP body found)")
    if layer_ids != list(range(0, 2 * len(layer_ids), 2)):
        raise UserError(f"{origin}: MLP layers must be {BODY_PREFIX}0,2,4,...; found indices {layer_ids}")
    required = [f"{BODY_PREFIX}{i}.{p}" for i in layer_ids for p in ("weight", "bias")]
    required += [MU_PREFIX + "weight", MU_PREFIX + "bias"]
    conditional = f"{LOG_SIGMA}.weight" in arrays
    sigma_keys = [f"{LOG_SIGMA}.weight", f"{LOG_SIGMA}.bias"] if conditional else [LOG_SIGMA]
    required += sigma_keys
    missing = [k for k in required if k not in arrays]
    if missing:
        raise UserError(f"{origin}: missing keys {missing}")
    known.update(required)

    normalizer = _normalizer(arrays, origin, known)
    unexpected = sorted(k for k in arrays if k not in known)
    if unexpected:
        raise UserError(f"{origin}: unexpected keys {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")
    for k in arrays:
        _check_finite(arrays[k], f"Policy key {k}", origin)
    scalar = lambda k, default: float(arrays[k].reshape(-1)[0]) if k in arrays and arrays[k].size else default  # noqa: E731

    f32 = lambda k: arrays[k].astype(np.float32)  # noqa: E731
    layers = tuple((f32(f"{BODY_PREFIX}{i}.weight"), f32(f"{BODY_PREFIX}{i}.bias")) for i in layer_ids)
    mu = (f32(MU_PREFIX + "weight"), f32(MU_PREFIX + "bias"))
    log_sigma = tuple(f32(k) for k in sigma_keys) if conditional else f32(LOG_SIGMA).reshape(1, -1)
    weights = PolicyWeights(
        layers=layers,
        mu=mu,
        log_sigma=log_sigma,
        normalizer=normalizer,
        tanh_squash=conditional,
        version_number=scalar("version_number", 3.0),
        memory_size=scalar("memory_size_vector", 0.0),
    )
    check_shapes(weights, origin)
    if "continuous_act_size_vector" in arrays:
        declared = _count(arrays["continuous_act_size_vector"], "Policy key continuous_act_size_vector", origin, minimum=0)
        if declared != weights.act_dim:
            raise UserError(f"{origin}: continuous_act_size_vector says {declared} actions but mu has {weights.act_dim} rows")
    return weights


def _normalizer(arrays: dict, origin: str, known: set[str]) -> Normalizer | None:
    """Read the normalizer under either key spelling; each must be finite and valid, and when both are present they must agree."""
    found = []
    for prefix in NORMALIZER_PREFIXES:
        present = [f for f in NORMALIZER_FIELDS if prefix + f in arrays]
        if not present:
            continue
        if len(present) != len(NORMALIZER_FIELDS):
            raise UserError(f"{origin}: missing keys {[prefix + f for f in NORMALIZER_FIELDS if f not in present]}")
        known.update(prefix + f for f in NORMALIZER_FIELDS)
        mean, var, steps = (arrays[prefix + f] for f in NORMALIZER_FIELDS)
        _check_finite(mean, f"Policy key {prefix}running_mean", origin)
        _check_finite(var, f"Policy key {prefix}running_variance", origin)
        _check_finite(steps, f"Policy key {prefix}normalization_steps", origin)
        if (var <= 0).any():
            first = int(np.argwhere(var.reshape(-1) <= 0)[0][0])
            raise UserError(f"{origin}: Policy key {prefix}running_variance has {int((var <= 0).sum())} values <= 0 "
                            f"(first at [{first}]: {float(var.reshape(-1)[first]):g}); ML-Agents starts it at 1 and only adds squared deviations")
        n = _count(steps, f"Policy key {prefix}normalization_steps", origin, minimum=1)
        found.append((prefix, [mean, var, n]))
    if not found:
        return None
    (p0, first), *others = found
    for p1, other in others:
        if not all(np.shape(a) == np.shape(b) and np.array_equal(a, b) for a, b in zip(first, other)):
            raise UserError(f"{origin}: normalizer statistics under '{p0}' and '{p1}' disagree")
    mean, var, steps = first
    return Normalizer(mean.astype(np.float32), var.astype(np.float32), steps)


def check_shapes(w: PolicyWeights, origin: str) -> None:
    """Every tensor must chain: [H, obs] -> [H, H]... -> mu [act, H]; normalizer and log_sigma match."""
    for key, weight, bias in [(f"{BODY_PREFIX}{2 * i}", *layer) for i, layer in enumerate(w.layers)] + [(MU_PREFIX[:-1], *w.mu)]:
        if weight.ndim != 2 or bias.ndim != 1 or 0 in weight.shape:
            raise UserError(f"{origin}: shape mismatch: {key}.weight {list(weight.shape)} / .bias {list(bias.shape)} "
                            "(expected a non-empty [out, in] matrix and an [out] vector)")
    problems = []
    width = w.obs_dim
    for i, (weight, bias) in enumerate(w.layers):
        key = f"{BODY_PREFIX}{2 * i}"
        if weight.ndim != 2 or weight.shape[1] != width or bias.shape != (weight.shape[0],):
            problems.append(f"{key}.weight {list(weight.shape)} / .bias {list(bias.shape)} (expected [*, {width}] and [*])")
        width = weight.shape[0] if weight.ndim == 2 else width
    if w.mu[0].shape[1:] != (width,) or w.mu[1].shape != (w.mu[0].shape[0],):
        problems.append(f"{MU_PREFIX}weight {list(w.mu[0].shape)} / .bias {list(w.mu[1].shape)} (expected [act, {width}] and [act])")
    if w.conditional_sigma:
        if w.log_sigma[0].shape != w.mu[0].shape or w.log_sigma[1].shape != w.mu[1].shape:
            problems.append(f"{LOG_SIGMA}.weight {list(w.log_sigma[0].shape)} does not match {MU_PREFIX}weight {list(w.mu[0].shape)}")
    elif w.log_sigma.shape != (1, w.act_dim):
        problems.append(f"{LOG_SIGMA} {list(w.log_sigma.shape)} (expected [1, {w.act_dim}])")
    if w.normalizer is not None:
        n = w.normalizer
        stats = {"running_mean": n.running_mean,
                 "running_variance" if n.running_variance is not None else "folded std": n.std if n.running_variance is None else n.running_variance}
        for name, value in stats.items():
            if value.shape != (w.obs_dim,):
                problems.append(f"{NORMALIZER_PREFIXES[0]}{name} {list(value.shape)} (expected [{w.obs_dim}])")
    if problems:
        raise UserError(f"{origin}: shape mismatch: " + "; ".join(problems))


def state_dict_of(w: PolicyWeights) -> dict:
    """The actor state_dict ML-Agents would save for these weights (both normalizer spellings)."""
    import torch

    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    state = {
        "version_number": t(np.array([w.version_number], np.float32)),
        "is_continuous_int_deprecated": t(np.array([1.0], np.float32)),
        "continuous_act_size_vector": t(np.array([w.act_dim], np.float32)),
        "discrete_act_size_vector": t(np.zeros((1, 0), np.float32)),
        "act_size_vector_deprecated": t(np.array([w.act_dim], np.float32)),
        "memory_size_vector": t(np.array([w.memory_size], np.float32)),
    }
    if w.normalizer is not None:
        n = w.normalizer
        variance = n.running_variance if n.running_variance is not None else n.std**2
        for prefix in NORMALIZER_PREFIXES:
            state[prefix + "normalization_steps"] = torch.tensor(n.steps or 1, dtype=torch.int64)
            state[prefix + "running_mean"] = t(n.running_mean)
            state[prefix + "running_variance"] = t(variance)
    for i, (weight, bias) in enumerate(w.layers):
        state[f"{BODY_PREFIX}{2 * i}.weight"] = t(weight)
        state[f"{BODY_PREFIX}{2 * i}.bias"] = t(bias)
    if w.conditional_sigma:
        state[f"{LOG_SIGMA}.weight"], state[f"{LOG_SIGMA}.bias"] = t(w.log_sigma[0]), t(w.log_sigma[1])
    else:
        state[LOG_SIGMA] = t(w.log_sigma)
    state[MU_PREFIX + "weight"], state[MU_PREFIX + "bias"] = t(w.mu[0]), t(w.mu[1])
    return state


def save_checkpoint(w: PolicyWeights, path: Path, step: int) -> None:
    """Write a .pt laid out as ML-Agents' TorchModelSaver does (Policy + global_step)."""
    import torch

    blob = {"Policy": state_dict_of(w), "global_step": {"_GlobalSteps__global_step": torch.tensor([step])}}
    _atomic_write(path, lambda tmp: torch.save(blob, tmp))


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


# --- .onnx graphs


def load_onnx(path: str | Path) -> LoadedModel:
    """Read the policy from an ML-Agents .onnx alone: weights from initializers, found by graph structure."""
    path = _require_file(Path(path), "onnx file")
    weights = weights_from_onnx(read_onnx(path), f"onnx file {path}")
    return LoadedModel(weights, "onnx", path, sha256_file(path), step=_step_from_name(path), onnx_path=path)


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
        _check_finite(value, f"initializer {name}", self.origin)
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


def write_onnx(w: PolicyWeights, path: Path) -> None:
    """Build the graph ML-Agents' exporter writes (opset 9, same names), directly with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes = [], []
    counter = iter(range(10_000))

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"/{op}_{next(counter)}_output_0"
        nodes.append(helper.make_node(op, inputs, [out], name=f"/{op}_{next(counter)}", **attrs))
        return out

    def scalar(value: float) -> str:
        out = f"/Constant_{next(counter)}_output_0"
        nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.array(value, np.float32))))
        return out

    const("version_number.1", [w.version_number])
    const("continuous_act_size_vector", [float(w.act_dim)])
    const("memory_size_vector", [w.memory_size])
    x = ONNX_INPUT
    if w.normalizer is not None:
        prefix = NORMALIZER_PREFIXES[0]
        x = node("Sub", [x, const(prefix + "running_mean", w.normalizer.running_mean)])
        x = node("Div", [x, const("normalizer_folded_std", w.normalizer.std)])
        x = node("Clip", [x], min=-NORMALIZER_CLAMP, max=NORMALIZER_CLAMP)
    x = node("Concat", [x], axis=1)
    for i, (weight, bias) in enumerate(w.layers):
        x = node("Gemm", [x, const(f"{BODY_PREFIX}{2 * i}.weight", weight), const(f"{BODY_PREFIX}{2 * i}.bias", bias)],
                 alpha=1.0, beta=1.0, transB=1)
        x = node("Mul", [x, node("Sigmoid", [x])])
    mu = node("Gemm", [x, const(MU_PREFIX + "weight", w.mu[0]), const(MU_PREFIX + "bias", w.mu[1])],
              alpha=1.0, beta=1.0, transB=1)
    if w.conditional_sigma:
        s = node("Gemm", [x, const(LOG_SIGMA + ".weight", w.log_sigma[0]), const(LOG_SIGMA + ".bias", w.log_sigma[1])],
                 alpha=1.0, beta=1.0, transB=1)
        log_sigma = node("Clip", [s], min=LOG_SIGMA_RANGE[0], max=LOG_SIGMA_RANGE[1])
    else:
        log_sigma = node("Add", [node("Mul", [mu, scalar(0.0)]), const(LOG_SIGMA, w.log_sigma)])
    std = node("Exp", [log_sigma])
    noisy = node("Add", [mu, node("Mul", [node("RandomNormalLike", [mu], dtype=TensorProto.FLOAT), std])])
    if w.tanh_squash:
        node("Tanh", [noisy], "continuous_actions")
        node("Identity", [mu], "deterministic_continuous_actions")
    else:
        node("Div", [node("Clip", [noisy], min=-ACTION_CLAMP, max=ACTION_CLAMP), scalar(ACTION_CLAMP)], "continuous_actions")
        node("Div", [node("Clip", [mu], min=-ACTION_CLAMP, max=ACTION_CLAMP), scalar(ACTION_CLAMP)],
             "deterministic_continuous_actions")
    node("Identity", ["version_number.1"], "version_number")
    node("Identity", ["memory_size_vector"], "memory_size")
    node("Identity", ["continuous_act_size_vector"], "continuous_action_output_shape")

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "huggy_exp policy",
        [helper.make_tensor_value_info(ONNX_INPUT, f, ["batch", w.obs_dim])],
        [
            helper.make_tensor_value_info("version_number", f, [1]),
            helper.make_tensor_value_info("memory_size", f, [1]),
            helper.make_tensor_value_info("continuous_actions", f, ["batch", w.act_dim]),
            helper.make_tensor_value_info("continuous_action_output_shape", f, [1]),
            helper.make_tensor_value_info("deterministic_continuous_actions", f, ["batch", w.act_dim]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="huggy_exp", opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    _atomic_write(path, lambda tmp: onnx.save(model, tmp))


# --- results folders


def _step_from_name(path: Path) -> int | None:
    m = re.search(r"-(\d+)\.(pt|onnx)$", path.name)
    return int(m.group(1)) if m else None


def _sibling_onnx(pt: Path) -> Path | None:
    candidate = pt.with_suffix(".onnx")
    return candidate if candidate.is_file() else None


def list_checkpoints(results_dir: str | Path) -> list[dict]:
    """Every checkpoint of an ML-Agents results folder: files on disk joined with run_logs/training_status.json.

    A bare copy of the run logs (training_status.json at the top) is read too; its files are then not present.
    """
    root = Path(results_dir).expanduser()
    if not root.is_dir():
        raise UserError(f"results folder not found: {root}")
    status_file = next((p for p in (root / "run_logs" / "training_status.json", root / "training_status.json") if p.is_file()), None)
    status = read_training_status(status_file) if status_file is not None else {}
    rows: dict[tuple[str, int], dict] = {}
    for behavior_dir in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "run_logs"):
        for f in sorted(behavior_dir.iterdir()):
            step = _step_from_name(f)
            if step is None or not f.name.startswith(behavior_dir.name + "-"):
                continue
            row = rows.setdefault((behavior_dir.name, step), _row(behavior_dir.name, step))
            row["files"][f.suffix[1:]] = {"path": str(f), "bytes": f.stat().st_size, "sha256": sha256_file(f)}
    for behavior, info in status.items():
        for ck in info["checkpoints"]:
            row = rows.setdefault((behavior, ck["steps"]), _row(behavior, ck["steps"]))
            row["reward"] = ck.get("reward")
            row["creation_time"] = ck.get("creation_time")
            row["logged_files"] = [ck.get("file_path"), *ck.get("auxillary_file_paths", [])]
            row["final"] = row["final"] or ck["steps"] == info["final"]
    out = sorted(rows.values(), key=lambda r: (r["behavior"], r["step"]))
    for r in out:
        r["present"] = bool(r["files"])
    return out


def read_training_status(path: Path) -> dict[str, dict]:
    """ML-Agents' run_logs/training_status.json, checked: {behavior: {"checkpoints": [entry, ...], "final": steps or None}}.

    Behaviors without a "checkpoints" list (ML-Agents also records lesson numbers and ELO there) and "metadata" are skipped.
    """
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (bad byte at offset {exc.start}); ML-Agents writes it as UTF-8 JSON") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"{path} is not valid JSON: {str(exc) or 'nested too deeply'}") from None
    except OSError as exc:
        raise UserError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: top level is a JSON {_json_kind(doc)}, expected an object of behaviors "
                        '({"<Behavior>": {"checkpoints": [...]}, "metadata": {...}})')
    out = {}
    for behavior, info in doc.items():
        if behavior == "metadata":
            continue
        if not isinstance(info, dict):
            raise _bad_status(path, behavior, info, 'an object with "checkpoints"')
        if "checkpoints" not in info:
            continue
        if not isinstance(info["checkpoints"], list):
            raise _bad_status(path, f"{behavior}.checkpoints", info["checkpoints"], "a list of checkpoint entries")
        entries = [_status_entry(path, f"{behavior}.checkpoints[{i}]", ck) for i, ck in enumerate(info["checkpoints"])]
        final = info.get("final_checkpoint")
        if final is not None:
            final = _status_entry(path, f"{behavior}.final_checkpoint", final)["steps"]
        out[behavior] = {"checkpoints": entries, "final": final}
    return out


def _json_kind(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _bad_status(path: Path, where: str, value: object, expected: str) -> UserError:
    shown = f"a JSON {_json_kind(value)}" if isinstance(value, (dict, list)) else json.dumps(value)[:60]
    return UserError(f"{path}: {where} is {shown}, expected {expected}")


def _status_entry(path: Path, where: str, ck: object) -> dict:
    """One checkpoint entry of training_status.json: integer steps, numeric or null reward, string paths."""
    if not isinstance(ck, dict):
        raise _bad_status(path, where, ck, 'an object with "steps"')
    if "steps" not in ck:
        raise UserError(f'{path}: {where} has no "steps" (keys: {", ".join(map(str, ck)) or "none"})')
    steps = ck["steps"]
    if isinstance(steps, bool) or not isinstance(steps, (int, float)) or not np.isfinite(steps) or steps < 0 or steps != int(steps):
        raise _bad_status(path, f"{where}.steps", steps, "a non-negative integer")
    number = lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))  # noqa: E731
    for key in ("reward", "creation_time"):
        if not number(ck.get(key)):
            raise _bad_status(path, f"{where}.{key}", ck[key], "a number or null")
    if not (ck.get("file_path") is None or isinstance(ck["file_path"], str)):
        raise _bad_status(path, f"{where}.file_path", ck["file_path"], "a string")
    aux = ck.get("auxillary_file_paths", [])
    if not isinstance(aux, list) or not all(isinstance(a, str) for a in aux):
        raise _bad_status(path, f"{where}.auxillary_file_paths", aux, "a list of strings")
    return {**ck, "steps": int(steps), "auxillary_file_paths": aux}


def read_configuration(root: Path) -> dict[str, dict]:
    """Per behavior, the trainer and network settings of an ML-Agents configuration.yaml ({} when absent)."""
    import yaml

    path = Path(root) / "configuration.yaml"
    if not path.is_file():
        return {}
    try:
        doc = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (bad byte at offset {exc.start})") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise UserError(f"{path} is not valid YAML: {(str(exc).strip() or 'nested too deeply').splitlines()[0]}") from None
    shape = "a mapping 'behaviors: {<Behavior>: {trainer_type: ..., network_settings: {...}}}'"
    behaviors = (doc or {}).get("behaviors") if isinstance(doc or {}, dict) else None
    if not isinstance(doc or {}, dict) or not isinstance(behaviors or {}, dict):
        raise UserError(f"{path}: expected {shape}, found {'behaviors: ' if isinstance(doc, dict) else ''}a {type(behaviors if isinstance(doc, dict) else doc).__name__}")
    out = {}
    for behavior, settings in (behaviors or {}).items():
        net = (settings or {}).get("network_settings") if isinstance(settings or {}, dict) else None
        if not isinstance(settings or {}, dict) or not isinstance(net or {}, dict):
            where, bad = (f"behaviors.{behavior}", settings) if not isinstance(settings or {}, dict) else (f"behaviors.{behavior}.network_settings", net)
            raise UserError(f"{path}: {where} is a {type(bad).__name__}, expected a mapping")
        settings, net = settings or {}, net or {}
        out[str(behavior)] = {"trainer_type": settings.get("trainer_type"), "hidden_units": net.get("hidden_units"),
                              "num_layers": net.get("num_layers"), "normalize": net.get("normalize"),
                              "max_steps": settings.get("max_steps")}
    return out


def configuration_mismatches(config: dict, w: PolicyWeights) -> list[str]:
    """Where a behavior's configuration.yaml disagrees with the sizes read from the weights."""
    found = {"hidden_units": w.hidden_units, "num_layers": w.num_layers, "normalize": w.normalizer is not None}
    return [f"{k}: configuration.yaml says {config[k]}, weights have {v}" for k, v in found.items()
            if config.get(k) is not None and config[k] != v]


def _row(behavior: str, step: int) -> dict:
    return {"behavior": behavior, "step": step, "reward": None, "creation_time": None, "files": {}, "logged_files": [], "final": False}


def latest_checkpoint(results_dir: Path, behavior: str | None = None, step: int | None = None) -> Path:
    """The .pt (else .onnx) of the chosen step, or of the newest one present."""
    rows = [r for r in list_checkpoints(results_dir) if r["present"] and (behavior is None or r["behavior"] == behavior)]
    if step is not None:
        rows = [r for r in rows if r["step"] == step]
    if not rows:
        want = f" for behavior {behavior}" if behavior else ""
        want += f" at step {step}" if step is not None else ""
        raise UserError(f"results folder {results_dir} has no checkpoint files{want}")
    files = rows[-1]["files"]
    return Path((files.get("pt") or files["onnx"])["path"])


def results_model(results_dir: Path, behavior: str | None = None, step: int | None = None) -> Path:
    """The model file a results folder offers: the behavior's checkpoint (newest, or at `step`), else its final <Behavior>.onnx.

    An unknown behavior, or several behaviors and none chosen, is an error naming the behaviors found.
    """
    root = Path(results_dir).expanduser()
    rows = list_checkpoints(root)
    finals = {p.stem: p for p in sorted(root.glob("*.onnx")) if p.is_file()}
    found = sorted({r["behavior"] for r in rows} | set(finals))
    with_files = sorted({r["behavior"] for r in rows if r["present"]} | set(finals))
    if behavior is not None and str(behavior) not in found:
        raise UserError(f"results folder {root} has no behavior {behavior!r}; behaviors found: {', '.join(found) or 'none'}")
    if behavior is None and len(with_files) > 1:
        raise UserError(f"results folder {root} holds several behaviors ({', '.join(with_files)}); choose one with model.behavior=<name>")
    behavior = None if behavior is None else str(behavior)
    try:
        return latest_checkpoint(root, behavior, step)
    except UserError:
        final = finals.get(behavior) if behavior else next(iter(finals.values()), None)
        if final is None or step is not None:
            raise
        return final


# --- the embedded default model

DEFAULT_NAME = "Huggy"
DEFAULT_STEP = 2_000_050
DEFAULT_SEED = 20_240_601
DEFAULT_VERSION = "v2"  # bump when default_weights changes: the cache is keyed by it


def default_weights(obs_dim: int = 59, act_dim: int = 21, hidden: int = 512, layers: int = 3, seed: int = DEFAULT_SEED) -> PolicyWeights:
    """A deterministic Huggy-shaped PPO actor with a normalizer at realistic magnitudes (numpy PCG64, stable bytes)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    mlp, fan_in = [], obs_dim
    for _ in range(layers):
        mlp.append((f32(rng.normal(0, 1.0 / np.sqrt(fan_in), (hidden, fan_in))), f32(rng.normal(0, 0.05, hidden))))
        fan_in = hidden
    mu = (f32(rng.normal(0, 7.0 / np.sqrt(hidden), (act_dim, hidden))), f32(rng.normal(0, 0.2, act_dim)))
    log_sigma = f32(rng.uniform(-0.5, 0.5, (1, act_dim)))
    steps = DEFAULT_STEP
    mean = f32(rng.uniform(-20, 40, obs_dim))
    std = np.exp(rng.uniform(np.log(0.02), np.log(17.0), obs_dim))
    variance = f32(std**2 * steps)
    variance[[obs_dim // 3, 2 * obs_dim // 3]] = 1.0  # two dimensions that never varied, as in real runs
    return PolicyWeights(tuple(mlp), mu, log_sigma, Normalizer(mean, variance, steps))


def cache_dir() -> Path:
    return Path(os.environ.get("HUGGY_EXP_CACHE", Path.home() / ".cache" / "huggy_exp")).expanduser()


def default_results_dir() -> Path:
    """The embedded default, written once in ML-Agents results-folder layout (.pt, .onnx, run_logs)."""
    root = cache_dir() / f"default-{DEFAULT_VERSION}"
    behavior = root / DEFAULT_NAME
    pt, onnx_file = behavior / f"{DEFAULT_NAME}-{DEFAULT_STEP}.pt", behavior / f"{DEFAULT_NAME}-{DEFAULT_STEP}.onnx"
    status, config = root / "run_logs" / "training_status.json", root / "configuration.yaml"
    if all(p.is_file() for p in (pt, onnx_file, root / f"{DEFAULT_NAME}.onnx", status, config)):
        return root
    w = default_weights()
    save_checkpoint(w, pt, DEFAULT_STEP)
    write_onnx(w, onnx_file)
    write_onnx(w, root / f"{DEFAULT_NAME}.onnx")
    entry = {"steps": DEFAULT_STEP, "file_path": str(onnx_file), "reward": None, "creation_time": None,
             "auxillary_file_paths": [str(pt)]}
    doc = {DEFAULT_NAME: {"checkpoints": [entry], "final_checkpoint": entry},
           "metadata": {"stats_format_version": "0.3.0", "mlagents_version": "synthetic (huggy_exp embedded default)"}}
    _atomic_write(status, lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=2)))
    import yaml

    settings = {"behaviors": {DEFAULT_NAME: {"trainer_type": "ppo", "max_steps": 2_000_000, "network_settings": {
        "normalize": True, "hidden_units": w.hidden_units, "num_layers": w.num_layers}}}}
    _atomic_write(config, lambda tmp: Path(tmp).write_text("# synthetic: huggy_exp's embedded default\n" + yaml.safe_dump(settings)))
    return root


def load_default() -> LoadedModel:
    root = default_results_dir()
    loaded = load_checkpoint(root / DEFAULT_NAME / f"{DEFAULT_NAME}-{DEFAULT_STEP}.pt")
    return LoadedModel(loaded.weights, "embedded", loaded.path, loaded.sha256, loaded.step, True, loaded.onnx_path, DEFAULT_NAME)


def fetch_hub(repo_id: str) -> Path:
    """Download a Hugging Face ML-Agents repo (Huggy layout) and return it as a results folder."""
    hint = "pass local files instead: model.checkpoint=<file.pt>, model.onnx=<file.onnx> or model.results_dir=<folder>"
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id or ""):
        raise UserError(f"model.hub_repo={repo_id!r} is not of the form <owner>/<name>")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(f"model.hub_repo needs huggingface_hub (pip install 'huggy-exp[hub]'); or {hint}") from None
    try:
        return Path(snapshot_download(repo_id, cache_dir=str(cache_dir() / "hub")))
    except Exception as exc:
        raise UserError(f"could not fetch {repo_id} from the Hugging Face Hub ({type(exc).__name__}; offline?); {hint}") from None
