"""Deterministic observation sources: random (seeded), zeros, extreme (hits the normalizer clamp), file (.npy or .npz);
`make_feeds` gives every input a policy has, keyed by ML-Agents' ONNX names."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from huggy_exp.config import FLOAT32_MAX, MAX_OBS_BYTES, OBS_SOURCES
from huggy_exp.errors import UserError, first_line
from huggy_exp.mlagents import ACTION_MASKS, Normalizer, PolicyWeights, obs_name
from huggy_exp.foreign import check_npz, npy_header

EXTREME = 1.0e4


def make_observations(source: str, obs_dim: int, rows: int = 64, seed: int = 0, scale: float = 1.0,
                      path: str | None = None, normalizer: Normalizer | None = None) -> np.ndarray:
    """float32 [rows, obs_dim]; `random` draws around the policy's own normalizer (mean + scale * std * z)."""
    if source not in OBS_SOURCES:
        raise UserError(f"unknown obs.source {source!r}; valid: {', '.join(OBS_SOURCES)}")
    if source == "file":
        return load_observations(path, obs_dim)
    if rows <= 0:
        raise UserError(f"obs.rows must be positive, got {rows}")
    need = int(rows) * int(obs_dim) * 4  # refused before allocating
    if need > MAX_OBS_BYTES:
        limit = MAX_OBS_BYTES // (4 * max(int(obs_dim), 1))
        raise UserError(f"obs.rows={rows}: [{rows}, {obs_dim}] float32 observations need {need / 2**30:,.1f} GiB, over the "
                        f"{MAX_OBS_BYTES / 2**30:g} GiB limit; obs.rows must be at most {limit:,} for obs_dim {obs_dim}")
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
    with np.errstate(over="ignore"):
        drawn = z.astype(np.float32)
    if not np.isfinite(drawn).all():  # refused as a file holding inf is: no mode ever runs on inf inputs
        raise UserError(f"obs.scale={scale}: {int(np.sum(~np.isfinite(drawn)))} observations drawn at this scale overflow "
                        f"float32 (|x| > {FLOAT32_MAX:.4g} with this policy's normalizer); lower obs.scale")
    return drawn


def load_observations(path: str | None, obs_dim: int, sequence: bool = False) -> np.ndarray:
    """A float32 [N, obs_dim] .npy ([T, N, obs_dim] too when `sequence`), its header checked against the file and the
    size limit before any data is read."""
    if not path:
        raise UserError("obs.source=file needs obs.path=<file.npy> (float32 [N, obs_dim])")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"observation file not found: {p}")
    with open(p, "rb") as fh:
        try:
            shape, dtype = npy_header(fh)
        except (ValueError, OSError, EOFError, SyntaxError) as exc:
            raise UserError(f"observation file {p} is not a .npy array (save it with numpy.save): "
                            f"{first_line(exc)[:200]}") from None
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
    if sequence and obs.ndim == 3:
        return _check_feed(obs, obs_dim, f"observation file {p}")
    if obs.ndim != 2 or obs.shape[1] != obs_dim:
        raise UserError(f"{p}: wrong observation width: expected [N, {obs_dim}], got {list(obs.shape)}")
    if obs.shape[0] == 0:
        raise UserError(f"{p}: no observation rows")
    with np.errstate(over="ignore"):
        obs = obs.astype(np.float32)
    bad = ~np.isfinite(obs)
    if bad.any():
        r, c = map(int, np.argwhere(bad)[0])
        raise UserError(f"{p}: {int(bad.sum())} NaN/inf values (first at row {r}, column {c})")
    return obs


# --- feeds: every input a policy has, keyed by ML-Agents' ONNX names


def make_feeds(source: str, weights: PolicyWeights, rows: int = 64, seed: int = 0, scale: float = 1.0,
               path: str | None = None) -> dict[str, np.ndarray]:
    """{'obs_0': [N, d_0], ...} (plus 'action_masks' when a file gives them) for every input of the policy. Drawn like
    `make_observations`, input 0 from `seed` itself (a single-input policy sees the same rows as before), input i > 0
    from the stream (seed, i); all actions allowed. A file is a .npy (one input) or an .npz of obs_0..obs_<k> [and
    action_masks]; [T, N, d] arrays are a sequence."""
    if source == "file":
        return load_feeds(path, weights)
    seeds = [seed] + [int(np.random.SeedSequence([int(seed), i]).generate_state(1, np.uint64)[0] >> 1)  # (seed, i)
                      for i in range(1, len(weights.inputs))]
    return {obs_name(i): make_observations(source, obs.size, rows, seeds[i], scale, path, obs.normalizer)
            for i, obs in enumerate(weights.inputs)}


def load_feeds(path: str | None, weights: PolicyWeights) -> dict[str, np.ndarray]:
    """Observations from a .npy (one input) or an .npz (obs_0..obs_<k>, optional action_masks); checked against the policy."""
    names = [obs_name(i) for i in range(len(weights.inputs))]
    if not path:
        raise UserError(f"obs.source=file needs obs.path=<file.npy or file.npz> (arrays {', '.join(names)})")
    p = Path(path).expanduser()
    if p.suffix != ".npz":
        if len(names) > 1:
            raise UserError(f"observation file {p}: this policy has {len(names)} observation inputs {list(weights.obs_sizes)}; "
                            f"pass an .npz with arrays {', '.join(names)} (numpy.savez)")
        return {names[0]: load_observations(path, weights.obs_dim, sequence=True)}
    arrays = _read_npz(p)
    given = sorted((n for n in arrays if n.startswith("obs_")), key=lambda n: (len(n), n))
    if names == ["obs_0"] and weights.normalizer is None and len(given) > 1 and given == [obs_name(i) for i in range(len(given))]:
        arrays = {**{k: v for k, v in arrays.items() if k not in given},  # one input of the concatenated width: concatenate
                  "obs_0": np.concatenate([_check_feed(arrays[n], arrays[n].shape[-1], f"observation file {p}: {n}") for n in given], axis=-1)}
    allowed = [*names, ACTION_MASKS] if weights.branches else names
    unknown = sorted(set(arrays) - set(allowed))
    missing = [n for n in names if n not in arrays]
    if unknown or missing:
        raise UserError(f"observation file {p}: arrays {sorted(arrays)}; this policy takes {', '.join(allowed)}"
                        + (f" (missing {', '.join(missing)})" if missing else "") + (f" (unexpected {', '.join(unknown)})" if unknown else ""))
    feeds = {name: _check_feed(arrays[name], obs.size, f"observation file {p}: {name}")
             for name, obs in zip(names, weights.inputs)}
    lead = feeds[names[0]].shape[:-1]
    bad = next((n for n in names if feeds[n].shape[:-1] != lead), None)
    if bad is not None:
        raise UserError(f"observation file {p}: {bad} is {list(feeds[bad].shape)}, {names[0]} is {list(feeds[names[0]].shape)}; "
                        "every input needs the same leading [N] (or [T, N])")
    if ACTION_MASKS in arrays:
        masks = _check_feed(arrays[ACTION_MASKS], sum(weights.branch_sizes), f"observation file {p}: {ACTION_MASKS}")
        if masks.shape[:-1] != lead:
            raise UserError(f"observation file {p}: {ACTION_MASKS} is {list(masks.shape)}, expected {[*lead, sum(weights.branch_sizes)]}")
        if not np.isin(masks, (0.0, 1.0)).all():
            raise UserError(f"observation file {p}: {ACTION_MASKS} must hold 1 (allowed) and 0 (masked) only")
        feeds[ACTION_MASKS] = masks
    return feeds


def _read_npz(p: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz, sized from the zip directory before anything is decompressed; pickles refused."""
    if not p.is_file():
        raise UserError(f"observation file not found: {p}")
    try:
        with zipfile.ZipFile(p) as zf:
            total = sum(i.file_size for i in zf.infolist())
    except (zipfile.BadZipFile, OSError) as exc:
        raise UserError(f"observation file {p} is not an .npz archive (save it with numpy.savez): {exc}") from None
    if total > MAX_OBS_BYTES:
        raise UserError(f"observation file {p} holds {total / 2**30:,.1f} GiB of arrays, over the {MAX_OBS_BYTES / 2**30:g} GiB limit")
    check_npz(p, "observation file", MAX_OBS_BYTES, MAX_OBS_BYTES)  # what the headers declare and the members inflate to
    try:
        with np.load(p, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (ValueError, OSError, EOFError) as exc:
        raise UserError(f"observation file {p} is not a plain .npz of arrays (pickles are refused): {exc}") from None


def _check_feed(a: np.ndarray, width: int, origin: str) -> np.ndarray:
    """[N, width] or [T, N, width], numeric and finite, as float32."""
    if a.dtype.hasobject or a.dtype.kind not in "fiub":
        raise UserError(f"{origin} must hold numbers, found dtype {a.dtype}")
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim not in (2, 3) or a.shape[-1] != width or 0 in a.shape:
        raise UserError(f"{origin}: expected [N, {width}] (or [T, N, {width}] for a sequence), got {list(a.shape)}")
    with np.errstate(over="ignore"):
        a = a.astype(np.float32)
    bad = ~np.isfinite(a)
    if bad.any():
        raise UserError(f"{origin}: {int(bad.sum())} NaN/inf values (first at {[int(i) for i in np.argwhere(bad)[0]]})")
    return a


def random_masks(branch_sizes: tuple[int, ...], lead: tuple[int, ...], seed: int) -> np.ndarray:
    """float32 action_masks [*lead, sum of branch sizes] from the seed stream (seed, 'masks'), as ML-Agents' references
    mask: rows r % 3 == 0 mask k ~ U{1..size-1} random actions in every branch, rows r % 3 == 1 one action of the first
    branch, rows r % 3 == 2 none; every branch keeps at least one allowed action."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0x6D61736B])))
    rows = int(np.prod(lead, dtype=np.int64))
    kind = np.arange(rows) % 3
    parts = []
    for b, size in enumerate(branch_sizes):
        k = np.where(kind == 0, rng.integers(1, max(size, 2), rows), (kind == 1) & (b == 0)) * (size > 1)
        rank = np.argsort(np.argsort(rng.random((rows, size)), axis=1), axis=1)  # a random order of the actions per row
        parts.append((rank >= k[:, None]).astype(np.float32))
    return np.concatenate(parts, axis=1).reshape(*lead, -1)
