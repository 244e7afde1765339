"""Weights and normalizer types, the ML-Agents key names and constants, and the checks every reader shares."""

from __future__ import annotations

import hashlib
import os
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


def require_file(path: Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    return path



def read_count(a: np.ndarray, key: str, origin: str, minimum: int) -> int:
    """A one-element integer entry (a step count, a size); empty, fractional or too small is refused."""
    flat = a.reshape(-1)
    value = float(flat[0]) if flat.size == 1 else None
    if value is None or not np.isfinite(value) or value != int(value) or value < minimum or value > 2**62:
        shown = flat[:4].tolist() if flat.size else "empty"
        raise UserError(f"{origin}: {key} is {shown}, expected one integer >= {minimum}")
    return int(value)


def nonfinite(a: np.ndarray) -> str | None:
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


def check_finite(a: np.ndarray, name: str, origin: str) -> None:
    if (bad := nonfinite(a)) is not None:
        raise UserError(f"{origin}: {name} has {bad}")



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



def atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
