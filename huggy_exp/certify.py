"""The judgements of a port certificate, as pure functions over arrays and samples: which recorded point a replay is held
to, bitwise agreement and ULP distance (verify.ulp's), msprobe's dual benchmark, and the latency change with its test.

Sources of the rules (docs/port-certificate.md):
- dual benchmark (msprobe's accuracy pre-check, "benchmark comparison"): the error of the device under test against a
  CPU high-precision reference, divided by the reference device's error against the same reference. RMSE-like
  metrics: ratio <= 1 pass, <= 2 warn, above fail; max relative error: <= 1 pass, <= 10 warn, above fail.
- latency (MLPerf inference compliance TEST05): the new run is within 5% of the reference run, relaxed to 20% where
  the reference latency is <= 0.2 ms; the change is tested with a two-sided Mann-Whitney U test on the per-call samples
  and a bootstrap 95% confidence interval of the median ratio.
"""

from __future__ import annotations

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.numerics import error_ratio, ratio_verdict
from huggy_exp.verify import DECLARED, elementwise, ulp

DUAL_RULES = {"rmse": (1.0, 2.0), "max_rel": (1.0, 10.0)}  # metric: (pass up to, warn up to); msprobe's thresholds
TEST05_TOLERANCE, TEST05_SHORT_TOLERANCE, TEST05_SHORT_S = 0.05, 0.20, 0.2e-3
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_MAX_SAMPLES = 100_000  # per side: a larger sample's interval comes from a seeded subsample of this many
BOOTSTRAP_CHUNK = 1 << 23  # resampled indices drawn at once (64 MiB of int64)
VERDICT_ORDER = ("pass", "warn", "fail")


def named_outputs(out: dict[str, np.ndarray], float_dtype=np.float32) -> dict[str, np.ndarray]:
    """A runner's deterministic outputs by file stem as their files hold them (floats `float_dtype`: fp64 keeps its)."""
    return {o.stem: o.stored(out[o.name], float_dtype) for o in DECLARED if o.name in out}


def is_discrete(a: np.ndarray) -> bool:
    return np.asarray(a).dtype.kind in "iub"


def errors(actual: np.ndarray, expected: np.ndarray, dtype: str = "fp32") -> dict[str, float]:
    """The engine's element-wise metrics of one float output against another (ULPs of `dtype`); discrete: mismatches."""
    if is_discrete(actual) or is_discrete(expected):
        a, e = np.asarray(actual), np.asarray(expected)
        if a.shape != e.shape:
            raise UserError(f"cannot compare discrete actions of shapes {list(a.shape)} and {list(e.shape)}")
        return {"mismatch_share": float(np.mean(a != e)) if a.size else 0.0, "mismatches": float(np.sum(a != e))}
    return elementwise(actual, expected, dtype=dtype)


def bitwise(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    """Share of elements with identical bytes, and the distance in float32 ULPs of `expected` (verify.ulp: max, mean,
    share above 1 ULP). NaN never counts as equal in ULPs (distance inf); discrete actions: |a - b| in action indices."""
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return {"bitwise_share": 0.0, "ulp_max": float("inf"), "ulp_mean": float("inf"), "ulp_over_1_share": 1.0}
    if is_discrete(a):
        same = a == e
        dist = np.abs(a.astype(np.int64) - e.astype(np.int64)).astype(np.float64)
    else:
        a32, e32 = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(e, np.float32)
        same = a32.view(np.uint32) == e32.view(np.uint32)
        with np.errstate(invalid="ignore", over="ignore"):
            dist = np.abs(a32.astype(np.float64) - e32) / ulp(e32, "fp32")
        dist[~(np.isfinite(a32) & np.isfinite(e32))] = np.inf
        dist[same] = 0.0
    n = max(a.size, 1)
    return {"bitwise_share": float(same.sum() / n) if a.size else 1.0, "ulp_max": float(dist.max(initial=0.0)),
            "ulp_mean": float(dist.mean()) if a.size else 0.0, "ulp_over_1_share": float(np.sum(dist > 1) / n)}


def rule_verdict(ratio: float, metric: str) -> str:
    return ratio_verdict(ratio, *DUAL_RULES[metric])


def worst(verdicts) -> str:
    return max((v for v in verdicts if v in VERDICT_ORDER), key=VERDICT_ORDER.index, default="pass")


def dual_benchmark(here: dict[str, np.ndarray], reference_device: dict[str, np.ndarray],
                   fp64: dict[str, np.ndarray], reference_fp64: dict[str, np.ndarray] | None = None) -> list[dict]:
    """Per output and metric: this point's error vs fp64, the reference device's, their ratio and msprobe's verdict.

    `reference_fp64`: the reference device's own fp64 reference where it ran other inputs (two sweeps); by default both
    are held to `fp64`. Discrete actions have no RMSE or relative error: their error is the share of actions that
    differ from fp64's, judged by the RMSE-like thresholds (both exact: ratio 1, pass)."""
    rows, theirs64 = [], fp64 if reference_fp64 is None else reference_fp64
    for name in (n for n in here if n in reference_device and n in fp64 and n in theirs64):
        rows += dual_rows(name, errors(here[name], fp64[name]), errors(reference_device[name], theirs64[name]))
    return rows


def dual_rows(name: str, mine: dict[str, float], theirs: dict[str, float]) -> list[dict]:
    """One output's dual benchmark from the two errors vs fp64 (`errors()`' metrics, or a sweep point's recorded
    `<output>/vs_fp64/<metric>`): per metric the ratio mine / theirs and msprobe's verdict."""
    rows = []
    metrics = (("mismatch_share", "rmse"),) if "mismatch_share" in mine else (("rmse", "rmse"), ("max_rel", "max_rel"))
    for metric, rule in metrics:
        if metric not in mine or metric not in theirs:
            continue
        ratio, (ok, warn) = error_ratio(mine[metric], theirs[metric]), DUAL_RULES[rule]
        rows.append({"output": name, "metric": metric, "error": mine[metric], "reference_error": theirs[metric],
                     "ratio": ratio, "verdict": ratio_verdict(ratio, ok, warn), "pass_up_to": ok, "warn_up_to": warn})
    return rows


def test05_tolerance(reference_median_s: float) -> float:
    return TEST05_SHORT_TOLERANCE if reference_median_s <= TEST05_SHORT_S else TEST05_TOLERANCE


def latency_change(recorded_s, here_s, alpha: float = 0.01, seed: int = 0) -> dict:
    """Median and p90 ratios (here / recorded), Mann-Whitney U p-value, bootstrap 95% CI of the median ratio, and a
    verdict: `slower`/`faster` when the change is significant (p < alpha) and beyond TEST05's tolerance, `within
    tolerance` when the median ratio is inside it, else `not significant`."""
    from scipy.stats import mannwhitneyu

    r, h = np.asarray(recorded_s, np.float64), np.asarray(here_s, np.float64)
    if len(r) < 2 or len(h) < 2:
        return {"verdict": "not measured", "why": f"too few samples ({len(r)} recorded, {len(h)} here; 2 each at least)"}
    bad = int(np.sum(~np.isfinite(r) | (r < 0))), int(np.sum(~np.isfinite(h) | (h < 0)))
    if any(bad):  # a NaN latency is no measurement: never "within tolerance"
        return {"verdict": "not measured", "why": f"{bad[0]} recorded and {bad[1]} measured samples are not finite "
                                                  "non-negative seconds"}
    med_r, med_h = float(np.median(r)), float(np.median(h))
    tol = test05_tolerance(med_r)
    p = float(mannwhitneyu(h, r, alternative="two-sided").pvalue)
    rng = np.random.default_rng(seed)
    boot_r, boot_h = bootstrap_medians(r, rng), bootstrap_medians(h, rng)
    low, high = (float(x) for x in np.percentile(boot_h / boot_r, [2.5, 97.5]))
    ratio = med_h / med_r if med_r > 0 else float("inf")
    outside = ratio > 1 + tol or ratio < 1 - tol
    significant = ("slower" if ratio > 1 else "faster") if p < alpha else "not significant"
    verdict = significant if outside else "within tolerance"
    return {"verdict": verdict, "median_ratio": ratio, "p90_ratio": float(np.percentile(h, 90) / np.percentile(r, 90)),
            "ci95_low": low, "ci95_high": high, "p_value": p, "alpha": alpha, "tolerance": tol,
            "recorded_median_us": med_r * 1e6, "here_median_us": med_h * 1e6, "recorded_samples": len(r), "here_samples": len(h),
            "test": "two-sided Mann-Whitney U on per-call latencies; bootstrap 95% CI of the median ratio "
                    f"({BOOTSTRAP_RESAMPLES} resamples); tolerance {tol:.0%} (MLPerf TEST05: 5%, 20% at <= 0.2 ms)"}


def bootstrap_medians(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES medians of resamples of x, drawn BOOTSTRAP_CHUNK indices at a time (memory stays bounded
    whatever the sample count); a sample over BOOTSTRAP_MAX_SAMPLES is first subsampled (seeded, without replacement)."""
    if len(x) > BOOTSTRAP_MAX_SAMPLES:
        x = rng.choice(x, BOOTSTRAP_MAX_SAMPLES, replace=False)
    per = max(1, BOOTSTRAP_CHUNK // len(x))
    return np.concatenate([np.median(x[rng.integers(0, len(x), (min(per, BOOTSTRAP_RESAMPLES - i), len(x)))], axis=1)
                           for i in range(0, BOOTSTRAP_RESAMPLES, per)])


def same_dtype_point(points: dict[str, dict], device: str, dtype: str, backend: str, batch: int) -> str | None:
    """The recorded point a replay is held to: the same dtype, preferring the same key, then the same backend and
    batch, then the same device, then the same batch; None when the bundle has no point of that dtype."""
    def rank(k: str) -> tuple:
        other = points[k]["backend"] != backend, points[k]["batch"] != batch, points[k]["device"] != device
        return any(other), *other, k

    return min((k for k, p in points.items() if p["dtype"] == dtype), key=rank, default=None)
