"""A job's memory, estimated from its values and the policy's weights before the task allocates it, refused when it
would not fit in what the host has left (docs/reliability.md)."""

from __future__ import annotations

import math
import re
import zipfile
from pathlib import Path

from huggy_exp import host
from huggy_exp.config import MAX_OBS_BYTES, RowBytes, modes
from huggy_exp.errors import UserError
from huggy_exp.foreign import npy_header
from huggy_exp.host import MEMORY_SHARE, size


def require_memory(need: int, what: str, keys: str) -> None:
    """Refuse, before allocating, what would not fit in MEMORY_SHARE of the memory available (one line, the user's keys)."""
    free, why = host.available_memory()
    if need > MEMORY_SHARE * free:
        advice = "pass a file of fewer rows" if keys.startswith("obs.path=") else f"lower {_names(keys)}"
        raise UserError(f"{keys}: {what} would take about {size(need)}, but only {size(free)} is {why}; {advice}")


def _names(keys: str) -> str:
    """`mode.steps=10 × mode.envs=4` -> `mode.steps or mode.envs`."""
    return " or ".join(dict.fromkeys(re.findall(r"([\w.]+)=", keys))) or keys


def job_allocations(mode: str, cfg: dict, w) -> list[tuple[int, str, str]]:
    """(bytes, what, the user's keys) of each allocation a job's values size: rows x bytes per row x the copies the modes
    hold (feeds, device and reference outputs, float64 draws and comparisons), and what the mode's own knobs allocate
    (its schema's `allocations`). Rough on purpose: it is there to refuse what cannot fit, not to pack memory tightly."""
    schema = modes()[mode]
    if not schema.runs_policy:
        return []
    lstm = w.lstm.weight_ih.shape[0] if w.lstm is not None else 0
    width_in = w.obs_dim + sum(w.branch_sizes) + 2 * w.memory  # obs, masks, recurrent_in
    width_out = w.act_dim * 3 + 2 * len(w.branch_sizes) + 2 * w.memory  # actions, mu, sampled; discrete; recurrent_out
    hidden = sum(int(weight.shape[0]) for weight, _ in w.layers) + lstm
    row = RowBytes(feed=8 * 3 * width_in + 4 * 6 * width_out, forward=4 * (width_in + width_out) * 4 + 8 * hidden * 3,
                   io=4 * (width_in + width_out))
    out = [(int(cfg["batch_size"]) * row.forward, "a forward call of batch_size rows", f"batch_size={cfg['batch_size']}")]
    obs = cfg.get("obs") or {}
    obs_row = row.feed + row.forward  # the feeds run through the runners and the fp64 reference in one call (run_feeds)
    if obs.get("source") != "file":
        _obs_cap(int(obs["rows"]), w.obs_dim, f"obs.rows={obs['rows']}")
        out.append((int(obs["rows"]) * obs_row, "the observations and their outputs", f"obs.rows={obs['rows']}"))
    elif obs.get("path") and (rows := file_rows(obs["path"], w.obs_dim)) * w.obs_dim * 4 <= MAX_OBS_BYTES:  # else its reader refuses it at the cap
        out.append((rows * obs_row, f"the {rows:,} observation rows of the file and their outputs", f"obs.path={obs['path']}"))
    for need, what, keys, drawn in schema.allocations(cfg, row):
        if drawn:
            _obs_cap(drawn, w.obs_dim, keys)  # drawn by the observation source, whose cap would name obs.rows
        out.append((need, what, keys))
    return out


def file_rows(path: str | Path, width: int) -> int:
    """The observation rows a .npy (its header's leading dims) or an .npz (its arrays' inflated bytes over a float32 row
    of `width`) holds, read without loading it; 0 when it cannot be told (its reader then says why)."""
    try:
        p = Path(path).expanduser()
        if p.suffix == ".npz":
            with zipfile.ZipFile(p) as zf:
                return sum(i.file_size for i in zf.infolist()) // max(4 * width, 1)
        with open(p, "rb") as fh:
            shape, _ = npy_header(fh)
        return math.prod(shape[:-1]) if len(shape) > 1 else 1
    except (OSError, ValueError, SyntaxError, zipfile.BadZipFile, EOFError):
        return 0


def _obs_cap(rows: int, obs_dim: int, keys: str) -> None:
    if rows * obs_dim * 4 > MAX_OBS_BYTES:
        raise UserError(f"{keys}: {rows:,} rows of {obs_dim} float32 observations need {size(rows * obs_dim * 4)}, over the "
                        f"{size(MAX_OBS_BYTES)} limit of the observation source; lower {_names(keys)}")


def check_job_memory(mode: str, cfg: dict, weights) -> None:
    """Each user-sized allocation of the job, and all of them together, against the memory available now."""
    allocations = job_allocations(mode, cfg, weights)
    for need, what, keys in allocations:
        require_memory(need, what, keys)
    if len(allocations) > 1:
        need, what, keys = max(allocations)
        require_memory(sum(a[0] for a in allocations), f"the job (largest part: {what})", keys)
