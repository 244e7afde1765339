"""Deterministic observation sources: random (seeded), zeros, extreme (hits the normalizer clamp), file (.npy)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents import Normalizer

SOURCES = ("random", "zeros", "extreme", "file")
EXTREME = 1.0e4
MAX_OBS_BYTES = 1 << 30  # 1 GiB of float32 observations (~4.5M Huggy rows); the random source needs ~3x that while drawing


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
    _check_rows(rows, obs_dim)
    if not np.isfinite(scale):
        raise UserError(f"obs.scale must be a finite number, got {scale}")
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


def _check_rows(rows: int, obs_dim: int) -> None:
    """Refuse, before allocating, more rows than MAX_OBS_BYTES of float32 observations hold."""
    need = int(rows) * int(obs_dim) * 4
    if need > MAX_OBS_BYTES:
        limit = MAX_OBS_BYTES // (4 * max(int(obs_dim), 1))
        raise UserError(f"obs.rows={rows}: [{rows}, {obs_dim}] float32 observations need {need / 2**30:,.1f} GiB, over the "
                        f"{MAX_OBS_BYTES / 2**30:g} GiB limit; obs.rows must be at most {limit:,} for obs_dim {obs_dim}")


def load_observations(path: str | None, obs_dim: int) -> np.ndarray:
    """A float32 [N, obs_dim] .npy; the header is checked against the file and the size limit before any data is read."""
    if not path:
        raise UserError("obs.source=file needs obs.path=<file.npy> (float32 [N, obs_dim])")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"observation file not found: {p}")
    with open(p, "rb") as fh:
        shape, dtype = _npy_header(fh, p)
        if dtype.hasobject or dtype.kind not in "fiu":
            raise UserError(f"observation file {p} must hold a numeric array (float32 [N, {obs_dim}]), found dtype {dtype}")
        count = int(np.prod(shape, dtype=object))
        if count * max(4, dtype.itemsize) > MAX_OBS_BYTES:
            raise UserError(f"observation file {p}: its header claims {dtype} {list(shape)} ({count * 4 / 2**30:,.1f} GiB as float32), "
                            f"over the {MAX_OBS_BYTES / 2**30:g} GiB limit (at most {MAX_OBS_BYTES // (4 * max(obs_dim, 1)):,} rows of {obs_dim})")
        data_bytes, held = count * dtype.itemsize, p.stat().st_size - fh.tell()
        if held < data_bytes:
            raise UserError(f"observation file {p} is truncated: its header says {dtype} {list(shape)} ({data_bytes:,} bytes) "
                            f"but it holds {held:,} bytes of data")
    try:
        obs = np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"observation file {p} is not a plain .npy array (pickles are refused): {exc}") from None
    if obs.ndim == 1:
        obs = obs[None, :]
    with np.errstate(over="ignore"):
        return check_observations(obs.astype(np.float32), obs_dim, str(p))


def _npy_header(fh, p: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a .npy header, read with numpy's own header parser; nothing else is read."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(fh)
        if version == (1, 0):
            shape, _, dtype = npy.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, _, dtype = npy.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"observation file {p} is not a .npy array (save it with numpy.save): {first[:200]}") from None
    return tuple(int(d) for d in shape), np.dtype(dtype)


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
