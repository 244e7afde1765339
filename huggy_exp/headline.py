"""What a run shows first: a few short headline metrics per mode (each mode's schema declares its own, config.py),
derived from its detailed metrics, and the params that matter; the full detail stays beside them."""

from __future__ import annotations

import math

from huggy_exp.config import modes

# every inference point (docs/verification.md): its errors vs CPU fp64 and fp32, and its latency; `a | b`: the first found.
# These are the one headline error and cosine of every mode: no mode has a second name for them.
ANY_MODE = {
    "max_abs_vs_fp64": "actions/vs_fp64/max_abs | sampled_actions/vs_fp64/max_abs | memories/vs_fp64/max_abs",
    "cosine_vs_fp64": "actions/vs_fp64/cosine_min_row | sampled_actions/vs_fp64/cosine_min_row | memories/vs_fp64/cosine_min_row",
    "agreement_vs_fp64": "discrete_actions/vs_fp64/agreement | sampled_discrete_actions/vs_fp64/agreement",
    "max_abs_vs_fp32": "actions/vs_fp32/max_abs | sampled_actions/vs_fp32/max_abs | memories/vs_fp32/max_abs",
    "p50_us": "latency/p50_us",
    "p99_us": "latency/p99_us",
    "obs_per_s": "latency/obs_per_s",
}
# the first screen's figures: the engine's error and cosine against CPU fp64
ERROR = "max_abs_vs_fp64"
COSINE = "cosine_vs_fp64"
LIMIT_STEMS = ("actions", "sampled_actions", "memories")  # whose `<stem>/vs_fp64/<x>_limit` the verdict used
PER_DTYPE = ("thresholds", "layer_thresholds", "tolerance", "atol")  # mode tables keyed by dtype
NOISE = ("mode._target_", "tracking.http_retries", "tracking.http_timeout_s", "tracking.enabled")


SIGNIFICANT = 3  # headline values are for reading (the UI prints every digit: 0.00942 not 0.0094211900...)
DIGITS = {COSINE: 6}  # cosines live next to 1: 0.999968 must not read as 1


def headline_metrics(mode: str, metrics: dict[str, float], status: str, batch_size: int | None = None) -> dict[str, float]:
    """`passed` (1/0, absent for skipped/error) and the mode's short metrics that the job produced, finite only,
    rounded to 3 significant digits, cosines to 6 (the detailed metric beside each keeps full precision)."""
    out: dict[str, float] = {}
    if status in ("passed", "failed"):
        out["passed"] = float(status == "passed")
    timed = {batch for _, batch, _ in ladder(metrics, "obs_per_s")}
    top = max(timed, default=None)  # benchmark: the largest batch timed
    batch = batch_size if batch_size in timed else top  # ... and the job's own batch size, when it was timed
    own = modes()[mode].headline if mode in modes() else {}  # the mode's schema declares its headline
    for short, long in {**own, **{k: v for k, v in ANY_MODE.items() if k not in own}}.items():
        value = _lookup(metrics, long.replace("{top}", str(top)).replace("{batch}", str(batch)))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[short] = float(f"{float(value):.{DIGITS.get(short, SIGNIFICANT)}g}")
    return out


def judged_limits(record: dict) -> dict:
    """The limits a point's verdict used (`max_abs`, `rtol`, `cosine_min_row`, ...): the engine's own `_limit` metrics
    beside the headline output, else the limits a mode reported itself (precision's, a case's)."""
    metrics = record.get("metrics") or {}
    for stem in LIMIT_STEMS:
        prefix = f"{stem}/vs_fp64/"
        found = {k[len(prefix):-len("_limit")]: v for k, v in metrics.items() if k.startswith(prefix) and k.endswith("_limit")}
        if found:
            return found
    return dict(record.get("limits") or (record.get("details") or {}).get("limits") or {})


def headline_names() -> set[str]:
    """Every short metric name any mode can show first."""
    return {"passed", *ANY_MODE, *(k for schema in modes().values() for k in schema.headline)}


def ladder(metrics: dict[str, float], stat: str) -> list[tuple[str, int, float]]:
    """(backend, batch, value) of a benchmark's per-point metrics `<backend>/b<batch>/<stat>`."""
    points = []
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[2] == stat and parts[1][:1] == "b" and parts[1][1:].isdigit():
            points.append((parts[0], int(parts[1][1:]), float(value)))
    return points


def noisy(record: dict) -> bool:
    """Whether a timing the job reported flagged itself noisy (IQR / median above timing.py's bound)."""
    metrics = record.get("metrics") or {}
    return bool(metrics.get("latency/noisy") or (record.get("latency") or {}).get("noisy")) or any(value for _, _, value in ladder(metrics, "noisy"))


def _lookup(metrics: dict[str, float], name: str):
    """A metric by name, `a | b` (the first present), or `a / b` of two metrics (None where either is missing or b is 0)."""
    if " | " in name:
        return next((metrics[n] for n in name.split(" | ") if n in metrics), None)
    if " / " not in name:
        return metrics.get(name)
    a, b = (metrics.get(n) for n in name.split(" / "))
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def settings(params: dict, dtype: str) -> dict:
    """The resolved config minus what does not describe this run: other dtypes' thresholds and plumbing keys."""
    def prune(tree: dict, prefix: str) -> dict:
        kept = {}
        for key, value in tree.items():
            name = f"{prefix}{key}"
            if name in NOISE:
                continue
            if isinstance(value, dict) and (prefix == "mode." and key in PER_DTYPE or name == "verify.limits"):
                value = {k: v for k, v in value.items() if k == dtype}
            kept[key] = prune(value, name + ".") if isinstance(value, dict) else value
        return kept

    return prune(params, "")
