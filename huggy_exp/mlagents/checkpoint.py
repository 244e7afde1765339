"""ML-Agents .pt checkpoints: read with torch.load(weights_only=True), written as TorchModelSaver lays them out."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents.results import sibling_onnx
from huggy_exp.mlagents.weights import BODY_PREFIX, LOG_SIGMA, LoadedModel, METADATA_KEYS, MU_PREFIX, NORMALIZER_FIELDS, NORMALIZER_PREFIXES, Normalizer, PolicyWeights, atomic_write, check_finite, read_count, require_file, check_shapes, sha256_file


def load_checkpoint(path: str | Path) -> LoadedModel:
    """Read an ML-Agents .pt checkpoint with torch.load(weights_only=True); no pickled code ever runs."""
    import torch

    path = require_file(Path(path), "checkpoint")
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
    return LoadedModel(weights, "pt", path, sha256_file(path), step=step, onnx_path=sibling_onnx(path))


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
        step = read_count(_array(value, f"key global_step.{key}", origin), f"key global_step.{key}", origin, minimum=0)
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
        check_finite(arrays[k], f"Policy key {k}", origin)
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
        declared = read_count(arrays["continuous_act_size_vector"], "Policy key continuous_act_size_vector", origin, minimum=0)
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
        check_finite(mean, f"Policy key {prefix}running_mean", origin)
        check_finite(var, f"Policy key {prefix}running_variance", origin)
        check_finite(steps, f"Policy key {prefix}normalization_steps", origin)
        if (var <= 0).any():
            first = int(np.argwhere(var.reshape(-1) <= 0)[0][0])
            raise UserError(f"{origin}: Policy key {prefix}running_variance has {int((var <= 0).sum())} values <= 0 "
                            f"(first at [{first}]: {float(var.reshape(-1)[first]):g}); ML-Agents starts it at 1 and only adds squared deviations")
        n = read_count(steps, f"Policy key {prefix}normalization_steps", origin, minimum=1)
        found.append((prefix, [mean, var, n]))
    if not found:
        return None
    (p0, first), *others = found
    for p1, other in others:
        if not all(np.shape(a) == np.shape(b) and np.array_equal(a, b) for a, b in zip(first, other)):
            raise UserError(f"{origin}: normalizer statistics under '{p0}' and '{p1}' disagree")
    mean, var, steps = first
    return Normalizer(mean.astype(np.float32), var.astype(np.float32), steps)



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
    atomic_write(path, lambda tmp: torch.save(blob, tmp))
