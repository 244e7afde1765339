"""Deterministic observation sources: random (seeded), zeros, extreme (hits the normalizer clamp), file (.npy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents import Normalizer

SOURCES = ("random", "zeros", "extreme", "file")
EXTREME = 1.0e4


def make_observations(
    source: str,
    obs_dim: int,
    rows: int = 64,
    seed: int = 0,
    scale: float = 1.0,
    path: str | None = None,
    normalizer: Normalizer | None = None,
) -> np.ndarray:
    """float32 [rows, obs_dim]; `random` draws around the policy's own normalizer (mean + scale * std * z)."""
    if source not in SOURCES:
        raise UserError(f"unknown obs.source {source!r}; valid: {', '.join(SOURCES)}")
    if source == "file":
        return load_observations(path, obs_dim)
    if rows <= 0:
        raise UserError(f"obs.rows must be positive, got {rows}")
    if source == "zeros":
        return np.zeros((rows, obs_dim), np.float32)
    rng = np.random.Generator(np.random.PCG64(seed))
    if source == "extreme":
        signs = rng.choice(np.array([-1.0, 1.0]), size=(rows, obs_dim))
        signs[0::4] = 1.0
        signs[1::4] = -1.0
        return (signs * EXTREME).astype(np.float32)
    z = rng.standard_normal((rows, obs_dim)) * scale
    if normalizer is not None:
        z = normalizer.running_mean.astype(np.float64) + normalizer.std.astype(np.float64) * z
    return z.astype(np.float32)


def load_observations(path: str | None, obs_dim: int) -> np.ndarray:
    if not path:
        raise UserError("obs.source=file needs obs.path=<file.npy> (float32 [N, obs_dim])")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"observation file not found: {p}")
    try:
        obs = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"observation file {p} is not a plain .npy array (pickles are refused): {exc}") from None
    if not isinstance(obs, np.ndarray) or obs.dtype.kind not in "fiu":
        raise UserError(f"observation file {p} must hold a numeric array, found dtype {getattr(obs, 'dtype', type(obs))}")
    if obs.ndim == 1:
        obs = obs[None, :]
    return check_observations(obs.astype(np.float32), obs_dim, str(p))


def check_observations(obs: np.ndarray, obs_dim: int, origin: str = "observations") -> np.ndarray:
    """Width must match the policy; NaN and inf are refused, naming where the first one is."""
    if obs.ndim != 2 or obs.shape[1] != obs_dim:
        raise UserError(f"{origin}: wrong observation width: expected [N, {obs_dim}], got {list(obs.shape)}")
    if obs.shape[0] == 0:
        raise UserError(f"{origin}: no observation rows")
    bad = ~np.isfinite(obs)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise UserError(f"{origin}: {int(bad.sum())} NaN/inf values (first at row {r}, column {c})")
    return obs
