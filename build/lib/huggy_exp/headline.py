"""What a run shows first: a few short headline metrics per mode, derived from its detailed metrics, and the params
that matter. One table here instead of a line in every task; the full detail stays beside them."""

from __future__ import annotations

import math

# short name -> the detailed metric it copies; per mode, in the order a reader wants them
HEADLINES: dict[str, dict[str, str]] = {
    "info": {"parameters": "parameters", "fp16_overflow_dims": "fp16_overflow_dims"},
    "checkpoints": {"checkpoints": "checkpoints", "best_reward": "best_reward"},
    "action": {"act_mean": "action_mean", "act_std": "action_std"},
    "sample": {"act_mean": "action_mean", "act_std": "action_std"},
    "batch": {"invariance_max": "batch_invariance_max_abs", "rows_identical": "rows_bit_identical",
              "rows_per_s": "batched_rows_per_s"},
    "precision": {"rel_ratio": "relative/ratio"},
    "onnx-compare": {"err_max_abs": "deterministic.max_abs", "cos_min": "deterministic.cosine_min_row",
                     "sampled_z": "sampled.mean_z_max"},
    "export-onnx": {"err_max_abs": "vs_torch.max_abs", "src_identical": "vs_source.bit_identical"},
    "fingerprint": {"fp_match": "matches_cpu_fp32", "fp_qmatch": "quantized_matches_cpu_fp32",
                    "err_max_abs": "max_abs_vs_cpu_fp32"},
    "stats": {"drift_max": "drift_max", "saturation": "saturation_rate", "smoothness": "smoothness"},
    "record": {"err_max_abs": "actions/vs_fp64/max_abs", "points": "bundle/points"},
    "replay": {"bitwise": "agreement/bitwise_share", "ulp_max": "agreement/ulp_max", "dual_ratio": "dual/worst_ratio",
               "lat_ratio": "latency_change/median_ratio", "lat_p": "latency_change/p_value"},
    "diff": {"changed": "diff/changed", "only_base": "diff/only_baseline", "only_cand": "diff/only_candidate"},
    # at the job's own batch size ({batch}; a ladder without it: its largest): eager's and onnxruntime's p50 and
    # `eager_vs_ort` = eager p50 / onnxruntime p50 (> 1: torch is slower); throughput at the largest batch timed;
    # the LoadGen server's highest QPS under its p99 bound, and the control loop's miss rate and highest rate
    "benchmark": {"p50_us": "eager/b{batch}/p50_us", "p99_us": "eager/b{batch}/p99_us",
                  "ort_p50_us": "onnxruntime/b{batch}/p50_us",
                  "eager_vs_ort": "eager/b{batch}/p50_us / onnxruntime/b{batch}/p50_us",
                  "obs_per_s": "eager/b{top}/obs_per_s", "server_qps": "loadgen/server/max_qps",
                  "miss_rate": "control_loop/miss_rate", "loop_hz_max": "control_loop/max_rate_hz"},
}
# every inference point (docs/verification.md): its errors vs CPU fp64 and fp32, and its latency; `a | b`: the first found
ANY_MODE = {
    "max_abs_vs_fp64": "actions/vs_fp64/max_abs | sampled_actions/vs_fp64/max_abs | memories/vs_fp64/max_abs",
    "cosine_vs_fp64": "actions/vs_fp64/cosine_min_row | sampled_actions/vs_fp64/cosine_min_row | memories/vs_fp64/cosine_min_row",
    "agreement_vs_fp64": "discrete_actions/vs_fp64/agreement | sampled_discrete_actions/vs_fp64/agreement",
    "max_abs_vs_fp32": "actions/vs_fp32/max_abs | sampled_actions/vs_fp32/max_abs | memories/vs_fp32/max_abs",
    "p50_us": "latency/p50_us",
    "p99_us": "latency/p99_us",
    "obs_per_s": "latency/obs_per_s",
}
# the first screen's figures, each the first present: vs CPU fp64 where the engine verified the point, else the mode's own
ERROR = ("max_abs_vs_fp64", "err_max_abs")
COSINE = ("cosine_vs_fp64", "cos_min")
LIMIT_STEMS = ("actions", "sampled_actions", "memories")  # whose `<stem>/vs_fp64/<x>_limit` the verdict used
PER_DTYPE = ("thresholds", "layer_thresholds", "tolerance", "atol")  # mode tables keyed by dtype
NOISE = ("mode._target_", "tracking.http_retries", "tracking.http_timeout_s", "tracking.enabled")


SIGNIFICANT = 3  # headline values are for reading (the UI prints every digit: 0.00942 not 0.0094211900...)
DIGITS = {"cos_min": 6, "cosine_vs_fp64": 6}  # cosines live next to 1: 0.999968 must not read as 1


def headline_metrics(mode: str, metrics: dict[str, float], status: str, batch_size: int | None = None) -> dict[str, float]:
    """`passed` (1/0, absent for skipped/error) and the mode's short metrics that the job produced, finite only,
    rounded to 3 significant digits, cosines to 6 (the detailed metric beside each keeps full precision)."""
    out: dict[str, float] = {}
    if status in ("passed", "failed"):
        out["passed"] = float(status == "passed")
    timed = {batch for _, batch, _ in ladder(metrics, "obs_per_s")}
    top = max(timed, default=None)  # benchmark: the largest batch timed
    batch = batch_size if batch_size in timed else top  # ... and the job's own batch size, when it was timed
    for short, long in {**HEADLINES.get(mode, {}), **{k: v for k, v in ANY_MODE.items() if k not in HEADLINES.get(mode, {})}}.items():
        value = _lookup(metrics, long.replace("{top}", str(top)).replace("{batch}", str(batch)))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value)):
            out[short] = float(f"{float(value):.{DIGITS.get(short, SIGNIFICANT)}g}")
    return out


def first_of(metrics: dict, names: tuple[str, ...]) -> float | None:
    """The first of `names` that `metrics` holds (ERROR, COSINE), else None."""
    return next((metrics[n] for n in names if n in metrics), None)


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
    return {"passed", *ANY_MODE, *(k for table in HEADLINES.values() for k in table)}


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
