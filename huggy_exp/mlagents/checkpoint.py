"""ML-Agents .pt checkpoints: read with torch.load(weights_only=True), written as TorchModelSaver lays them out."""

from __future__ import annotations

import pickletools
import re
import zipfile
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents.onnx_read import onnx_input_sizes
from huggy_exp.mlagents.results import sibling_onnx
from huggy_exp.files import atomic_write
from huggy_exp.foreign import MAX_CHECKPOINT_BYTES, check_file_size, check_zip
from huggy_exp.mlagents.weights import (
    BODY_PREFIX, BRANCH_PREFIX, LOG_SIGMA, LSTM_FIELDS, LSTM_PREFIX, METADATA_KEYS, MU_PREFIX, NORMALIZER_FIELDS,
    PROCESSOR_PREFIXES, LoadedModel, Lstm, Normalizer, ObsInput, PolicyWeights, check_finite, check_shapes,
    read_count, require_file, sha256_file,
)


def load_checkpoint(path: str | Path, onnx: str | Path | None = None) -> LoadedModel:
    """Read an ML-Agents .pt checkpoint with torch.load(weights_only=True); no pickled code ever runs. Without
    normalizers the .pt does not record how the first layer splits among the observation inputs: the `onnx` given
    (else the .onnx beside the .pt) tells it, else the policy reads as one input of the whole width."""
    import torch

    path = require_file(Path(path), "checkpoint")
    if path.stat().st_size == 0:
        raise UserError(f"checkpoint {path} is empty (0 bytes)")
    kind = _torch_container(path)
    if kind is None:
        raise UserError(f"checkpoint {path} is not a torch file: neither a zip archive (torch.save) nor a pickle stream")
    # a zip's storages by their inflated sizes, before torch reads one
    (check_zip if kind == "zip archive" else check_file_size)(path, MAX_CHECKPOINT_BYTES, "checkpoint")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for bad files; all mean the same to the user
        text = str(exc).strip()
        first = re.split(r"(?<=\.) ", text.splitlines()[0])[0] if text else type(exc).__name__
        if "Weights only load failed" in text or "weights_only" in text:
            raise UserError(f"checkpoint {path} holds pickled objects other than tensors; refused to unpickle it "
                            "(torch.load weights_only=True)") from None
        raise UserError(f"checkpoint {path} is a {kind} but not a readable torch checkpoint (truncated or corrupt?): {first}") from None
    origin = f"checkpoint {path}"
    state, step = _policy_state(blob, origin)
    onnx_path = Path(onnx).expanduser() if onnx else sibling_onnx(path)
    sizes = None
    if onnx_path is not None and onnx_path.is_file() and not any(isinstance(k, str) and ".normalizer." in k for k in state):
        sizes = onnx_input_sizes(onnx_path)
    weights = weights_from_state_dict(state, origin, sizes)
    return LoadedModel(weights, "pt", path, sha256_file(path), step=step, onnx_path=sibling_onnx(path))


def _torch_container(path: Path) -> str | None:
    """'zip archive' (torch.save), 'pickle stream' (legacy torch.save or a bare pickle: its opcodes only parsed by
    pickletools, never executed), or None for anything else."""
    with open(path, "rb") as fh:
        if fh.read(4) == b"PK\x03\x04" or zipfile.is_zipfile(fh):
            return "zip archive"
        fh.seek(0)
        try:
            if any(opcode.name == "STOP" for opcode, _, _ in pickletools.genops(fh)):
                return "pickle stream"
        except Exception:  # any parse failure means: not a pickle
            pass
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


UNSUPPORTED_ENCODERS = (  # key fragments of ML-Agents encoders this package does not rebuild, and what they are
    (("conv_layers", "conv", "dense", "SimpleVisualEncoder", "NatureVisualEncoder", "ResNet", "resnet"), "a visual (CNN) encoder"),
    (("rsa", "entity", "ent_encoder", "x_self_encoder", "residual", "attention"), "attention over variable-length observations"),
    (("conditioning", "hypernet", "goal"), "goal-conditioned layers (hypernetwork)"),
)
ENCODER_PREFIXES = ("network_body.observation_encoder.", "network_body.processors.")
CONTINUOUS_PREFIX = "action_model._continuous_distribution."


def weights_from_state_dict(state: dict, origin: str, input_sizes: tuple[int, ...] | None = None) -> PolicyWeights:
    """Rebuild PolicyWeights from ML-Agents actor keys; sizes come from tensor shapes, never assumed. `input_sizes`
    splits the first layer among the observation inputs when no normalizer tells their widths (normalize: false);
    without it such a policy reads as one input of the concatenated width (the same numbers)."""
    odd = next((k for k in state if not isinstance(k, str)), None)
    if odd is not None:
        raise UserError(f"{origin}: Policy key {odd!r} is a {type(odd).__name__}, not a string")
    arrays = {k: _array(v, f"Policy key {k}", origin) for k, v in state.items()}
    layer_ids, branch_ids, sigma_keys, memory, required = _layout(arrays, origin)
    known: set[str] = {*METADATA_KEYS, *required}
    normalizers = _normalizers(arrays, origin, known)
    _refuse_unknown(arrays, known, origin)
    for k in arrays:
        check_finite(arrays[k], f"Policy key {k}", origin)
    scalar = lambda k, default: float(arrays[k].reshape(-1)[0]) if k in arrays and arrays[k].size else default  # noqa: E731
    f32 = lambda k: arrays[k].astype(np.float32)  # noqa: E731
    linear = lambda prefix: (f32(prefix + "weight"), f32(prefix + "bias"))  # noqa: E731
    layers = tuple(linear(f"{BODY_PREFIX}{i}.") for i in layer_ids)
    width = int(layers[0][0].shape[1]) if layers[0][0].ndim == 2 else 0
    conditional = len(sigma_keys) == 2  # SAC: log_sigma is a Linear of the features, the actions tanh-squashed
    sigma = (tuple(map(f32, sigma_keys)) if conditional else f32(LOG_SIGMA).reshape(1, -1)) if sigma_keys else None
    weights = PolicyWeights(  # normalizer: the one input's, when there is one (PolicyWeights takes it from `inputs`)
        layers, linear(MU_PREFIX) if sigma_keys else None, sigma, normalizer=None, tanh_squash=conditional,
        version_number=scalar("version_number", 3.0), memory_size=scalar("memory_size_vector", 0.0),
        inputs=_inputs(normalizers, width, input_sizes),
        branches=tuple(linear(f"{BRANCH_PREFIX}{b}.") for b in branch_ids),
        lstm=Lstm(*(f32(LSTM_PREFIX + f) for f in LSTM_FIELDS)) if memory else None)
    check_shapes(weights, origin)
    _check_declared(arrays, weights, origin)
    return weights


def _layout(arrays: dict, origin: str) -> tuple[list[int], list[int], list[str], bool, list[str]]:
    """The parts the keys declare (MLP layer and branch indices, the continuous head's log_sigma keys or none, an LSTM)
    and every key they require; gaps in the layer or branch indices and missing keys are refused."""
    layer_ids = sorted({int(m.group(1)) for k in arrays if (m := re.match(re.escape(BODY_PREFIX) + r"(\d+)\.", k))})
    if not layer_ids:
        raise UserError(f"{origin}: missing keys {BODY_PREFIX}0.weight/bias (no MLP body found)")
    if layer_ids != list(range(0, 2 * len(layer_ids), 2)):
        raise UserError(f"{origin}: MLP layers must be {BODY_PREFIX}0,2,4,...; found indices {layer_ids}")
    required = [f"{BODY_PREFIX}{i}.{p}" for i in layer_ids for p in ("weight", "bias")]
    branch_ids = sorted({int(m.group(1)) for k in arrays if (m := re.match(re.escape(BRANCH_PREFIX) + r"(\d+)\.", k))})
    if branch_ids != list(range(len(branch_ids))):
        raise UserError(f"{origin}: discrete branches must be {BRANCH_PREFIX}0,1,2,...; found indices {branch_ids}")
    required += [f"{BRANCH_PREFIX}{b}.{p}" for b in branch_ids for p in ("weight", "bias")]
    sigma_keys = [f"{LOG_SIGMA}.weight", f"{LOG_SIGMA}.bias"] if f"{LOG_SIGMA}.weight" in arrays else [LOG_SIGMA]
    if any(k.startswith(CONTINUOUS_PREFIX) for k in arrays) or not branch_ids:
        required += [MU_PREFIX + "weight", MU_PREFIX + "bias", *sigma_keys]
    else:
        sigma_keys = []  # no continuous head
    memory = any(k.startswith(LSTM_PREFIX) for k in arrays)
    if memory:
        required += [LSTM_PREFIX + f for f in LSTM_FIELDS]
    missing = [k for k in required if k not in arrays]
    if missing:
        raise UserError(f"{origin}: missing keys {missing}")
    return layer_ids, branch_ids, sigma_keys, memory, required


def _refuse_unknown(arrays: dict, known: set[str], origin: str) -> None:
    """A key no part explains: an encoder this package does not rebuild is named as such, anything else listed."""
    unexpected = sorted(k for k in arrays if k not in known)
    encoder = next((k for k in unexpected if k.startswith(ENCODER_PREFIXES) or (
        k.startswith("network_body.") and not k.startswith((LSTM_PREFIX, BODY_PREFIX))
        and any(f in k for fs, _ in UNSUPPORTED_ENCODERS for f in fs))), None)
    if encoder is not None:
        what = next((what for fragments, what in UNSUPPORTED_ENCODERS if any(f in encoder for f in fragments)),
                    "an observation encoder other than a vector normalizer")
        raise UserError(f"{origin}: unsupported policy shape: {what} (found {encoder}); supported: vector "
                        "observation inputs, an MLP, an optional LSTM, continuous and/or discrete actions")
    if unexpected:
        raise UserError(f"{origin}: unexpected keys {unexpected[:6]}{' ...' if len(unexpected) > 6 else ''}")


def _inputs(normalizers: list[Normalizer], width: int, input_sizes: tuple[int, ...] | None) -> tuple[ObsInput, ...]:
    """The observation inputs: one per normalizer, else split by `input_sizes`, else one as wide as the first layer."""
    if len(normalizers) == 1:  # one input: as wide as the first layer, so a wrong-sized normalizer is named as such
        return (ObsInput(width, normalizers[0]),)
    if normalizers:
        return tuple(ObsInput(int(n.running_mean.size), n) for n in normalizers)
    if input_sizes and sum(input_sizes) == width:
        return tuple(ObsInput(int(s)) for s in input_sizes)
    return (ObsInput(width),)


def _check_declared(arrays: dict, w: PolicyWeights, origin: str) -> None:
    """The metadata ML-Agents saves beside the weights must agree with them (action counts, branch sizes, memory)."""
    if "continuous_act_size_vector" in arrays:
        declared = read_count(arrays["continuous_act_size_vector"], "Policy key continuous_act_size_vector", origin, minimum=0)
        if declared != w.act_dim:
            raise UserError(f"{origin}: continuous_act_size_vector says {declared} actions but mu has {w.act_dim} rows")
    if "discrete_act_size_vector" in arrays:
        declared = arrays["discrete_act_size_vector"].reshape(-1)
        if declared.tolist() != list(w.branch_sizes):
            raise UserError(f"{origin}: discrete_act_size_vector says branches {declared.tolist()[:8]} but the weights have "
                            f"{list(w.branch_sizes)}")
    if w.lstm is not None and "memory_size_vector" in arrays:
        declared = read_count(arrays["memory_size_vector"], "Policy key memory_size_vector", origin, minimum=0)
        if declared != w.memory:
            raise UserError(f"{origin}: memory_size_vector says {declared} but the LSTM holds {w.memory} (2 x hidden {w.lstm.hidden_size})")


def _normalizers(arrays: dict, origin: str, known: set[str]) -> list[Normalizer]:
    """One normalizer per observation input (processors.0, 1, ...), under either key spelling or both: each finite and
    valid, and the two the same."""
    ids = sorted({int(m.group(1)) for k in arrays for prefix in PROCESSOR_PREFIXES
                  if (m := re.match(re.escape(prefix) + r"(\d+)\.normalizer\.", k))})
    if ids != list(range(len(ids))):
        raise UserError(f"{origin}: observation normalizers must be processors.0,1,2,...; found indices {ids}")
    out = []
    for index in ids:
        found = []
        for prefix in (f"{p}{index}.normalizer." for p in PROCESSOR_PREFIXES):
            present = [f for f in NORMALIZER_FIELDS if prefix + f in arrays]
            if not present:
                continue
            if len(present) != len(NORMALIZER_FIELDS):
                raise UserError(f"{origin}: missing keys {[prefix + f for f in NORMALIZER_FIELDS if f not in present]}")
            known.update(prefix + f for f in NORMALIZER_FIELDS)
            for f in NORMALIZER_FIELDS:
                check_finite(arrays[prefix + f], f"Policy key {prefix}{f}", origin)
            mean, var, steps = (arrays[prefix + f] for f in NORMALIZER_FIELDS)
            if (var <= 0).any():
                first = int(np.argwhere(var.reshape(-1) <= 0)[0][0])
                raise UserError(f"{origin}: Policy key {prefix}running_variance has {int((var <= 0).sum())} values <= 0 "
                                f"(first at [{first}]: {float(var.reshape(-1)[first]):g}); ML-Agents starts it at 1 and "
                                "only adds squared deviations")
            found.append((prefix, [mean, var, read_count(steps, f"Policy key {prefix}normalization_steps", origin, 1)]))
        (p0, first), *others = found
        for p1, other in others:
            if not all(np.shape(a) == np.shape(b) and np.array_equal(a, b) for a, b in zip(first, other)):
                raise UserError(f"{origin}: normalizer statistics under '{p0}' and '{p1}' disagree")
        mean, var, steps = first
        if mean.ndim != 1:
            raise UserError(f"{origin}: shape mismatch: {p0}running_mean {list(mean.shape)} (expected one vector per input)")
        out.append(Normalizer(mean.astype(np.float32), var.astype(np.float32), steps))
    return out


def save_checkpoint(w: PolicyWeights, path: Path, step: int) -> None:
    """Write a .pt laid out as ML-Agents' TorchModelSaver does: the actor's state_dict (both normalizer spellings) as
    `Policy`, and `global_step`."""
    import torch

    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    metadata = (w.version_number, float(not w.branches), w.act_dim, w.branch_sizes, w.act_dim + sum(w.branch_sizes),
                w.memory_size)  # as METADATA_KEYS name them; discrete_act_size_vector is [1, branches]
    state = {key: t(np.array([value], np.float32)) for key, value in zip(METADATA_KEYS, metadata)}
    for i, obs in enumerate(w.inputs):
        n = obs.normalizer
        if n is None:
            continue
        variance = n.running_variance if n.running_variance is not None else n.std**2
        for prefix in (f"{p}{i}.normalizer." for p in PROCESSOR_PREFIXES):
            state[prefix + "normalization_steps"] = torch.tensor(n.steps or 1, dtype=torch.int64)
            state[prefix + "running_mean"] = t(n.running_mean)
            state[prefix + "running_variance"] = t(variance)
    for i, (weight, bias) in enumerate(w.layers):
        state[f"{BODY_PREFIX}{2 * i}.weight"], state[f"{BODY_PREFIX}{2 * i}.bias"] = t(weight), t(bias)
    if w.lstm is not None:
        for field, value in zip(LSTM_FIELDS, (w.lstm.weight_ih, w.lstm.weight_hh, w.lstm.bias_ih, w.lstm.bias_hh)):
            state[LSTM_PREFIX + field] = t(value)
    if w.mu is not None:
        if w.conditional_sigma:
            state[f"{LOG_SIGMA}.weight"], state[f"{LOG_SIGMA}.bias"] = t(w.log_sigma[0]), t(w.log_sigma[1])
        else:
            state[LOG_SIGMA] = t(w.log_sigma)
        state[MU_PREFIX + "weight"], state[MU_PREFIX + "bias"] = t(w.mu[0]), t(w.mu[1])
    for b, (weight, bias) in enumerate(w.branches):
        state[f"{BRANCH_PREFIX}{b}.weight"], state[f"{BRANCH_PREFIX}{b}.bias"] = t(weight), t(bias)
    blob = {"Policy": state, "global_step": {"_GlobalSteps__global_step": torch.tensor([step])}}
    atomic_write(path, lambda tmp: torch.save(blob, tmp))
