"""What a run shows first: a few short headline metrics per mode (each mode's schema declares its own, config.py),
derived from its detailed metrics, and the params that matter; the full detail stays beside them."""

from __future__ import annotations

import math
import re
from itertools import product

from huggy_exp.config import (AGREEMENT, COSINE_MIN_ROW, KL_MAX, LATENCY, MAX_ABS, ORT_INT8_KL, ORT_INT8_P50, SHIFT_MAX, SQNR,
                              Headline, Metric, modes)
from huggy_exp.verify import DECLARED

# every inference point (docs/verification.md): its errors vs CPU fp64 and fp32, and its latency. These are the one
# headline error and cosine of every mode: no mode has a second name for them.
ANY_MODE = {
    "max_abs_vs_fp64": Headline((MAX_ABS.at(ref="fp64"),)),
    "cosine_vs_fp64": Headline((COSINE_MIN_ROW.at(ref="fp64"),)),
    "agreement_vs_fp64": Headline((AGREEMENT.at(ref="fp64"),)),
    "max_abs_vs_fp32": Headline((MAX_ABS.at(ref="fp32"),)),
    "kl_vs_fp64": Headline((KL_MAX.at(ref="fp64"),)),  # in the policy's units
    "shift_vs_fp64": Headline((SHIFT_MAX.at(ref="fp64"),)),  # |Δμ| / σ
    "ort_int8_kl": Headline((ORT_INT8_KL.at(ref="fp64"),)),
    "ort_int8_p50_us": Headline((ORT_INT8_P50,)),  # an int8 point's peer, onnxruntime's own int8
    **{stat: Headline((LATENCY.at(stat=stat),)) for stat in ("p50_us", "p99_us", "obs_per_s")},
}
# the first screen's figures: the engine's error and cosine against CPU fp64
ERROR = "max_abs_vs_fp64"
COSINE = "cosine_vs_fp64"
OUTPUTS = tuple(o for out in DECLARED for o in (out, out.twin()) if o is not None)
STEMS = tuple(o.stem for o in OUTPUTS)  # a headline's `{stem}`, in order
LIMIT_STEMS = tuple(o.stem for o in OUTPUTS if o.rule in ("continuous", "memory"))  # the verdict's `_limit`s: the first
NOISE = ("mode._target_", "tracking.http_retries", "tracking.http_timeout_s", "tracking.enabled")
SIGNIFICANT = 3  # headline values are for reading (the UI prints every digit: 0.00942 not 0.0094211900...)


def readable(name: str, value: float) -> float:
    """`value` to 3 significant digits, a figure of 100 and more to a whole number (1,449 µs, as report.fmt prints it,
    not 1,450); a cosine to 3 significant digits of its distance from 1 (0.99999968, not 1.0)."""
    if "cosine" in name and 0 < value < 1:
        return 1 - float(f"{1 - value:.{SIGNIFICANT}g}")
    return float(round(value)) if abs(value) >= 100 else float(f"{value:.{SIGNIFICANT}g}")


def headline_metrics(mode: str, metrics: dict[str, float], status: str, batch_size: int | None = None) -> dict[str, float]:
    """`passed` (1/0, absent for skipped/error) and the mode's short metrics that the job produced, finite only,
    `readable` (the detailed metric beside each keeps full precision)."""
    out: dict[str, float] = {}
    if status in ("passed", "failed"):
        out["passed"] = float(status == "passed")
    batch, top = timed_batch(metrics, batch_size)
    fastest = fastest_backend(metrics, batch)
    own = modes()[mode].headline if mode in modes() else {}  # the mode's schema declares its headline
    for short, head in {**own, **{k: v for k, v in ANY_MODE.items() if k not in own}}.items():
        fields = {"batch": top if head.top else batch, "backend": fastest}
        value = first(metrics, head.of, fields)
        if head.over:
            under = first(metrics, head.over, fields)
            value = value / under if _finite(value) and _finite(under) and under else None
        if _finite(value):
            out[short] = readable(short, float(value))
    return out


def first(metrics: dict[str, float], of: tuple[Metric, ...], fields: dict):
    """The value of the first metric of `of` the job produced, its open fields filled (`{stem}`: each in turn)."""
    paths = (m.at(**{k: v for k, v in {**fields, "stem": s}.items() if f"{{{k}}}" in m.path}).path for m in of for s in STEMS)
    return next((metrics[p] for p in paths if p in metrics), None)


def timed_batch(metrics: dict[str, float], batch_size: int | None) -> tuple[int | None, int | None]:
    """(the batch a benchmark's headline reads: the job's own when it was timed, else the largest; the largest)."""
    timed = {batch for _, batch, _ in ladder(metrics, "obs_per_s")}
    top = max(timed, default=None)
    return (batch_size if batch_size in timed else top), top


def fastest_backend(metrics: dict[str, float], batch: int | None) -> str | None:
    """The backend with the least p50 at `batch` (each was verified against eager before it was timed), or None."""
    times = {backend: value for backend, b, value in ladder(metrics, "p50_us") if b == batch and _finite(value)}
    return min(times, key=times.get) if times else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(float(value))


# --- what MLflow gets: at most MAX_LOGGED metrics; everything else stays in result.json and the run's metrics.csv

MAX_LOGGED = 20
# MLflow's run page draws one chart section per name prefix (up to the last `/`), sorted by name (unprefixed names
# last): `answer/` sorts before every other section logged here (tests/test_ui.py checks the order)
ANSWER = "answer/"
ANSWER_ORDER = ("passed", ERROR, COSINE, "agreement_vs_fp64", "p50_us", "p99_us", "obs_per_s", "max_abs_vs_fp32")
OUTPUT_STATS = (MAX_ABS, COSINE_MIN_ROW, AGREEMENT)  # per output vs fp64, each with its `_limit`
BACKEND_STATS = ("p50_us", "obs_per_s")  # benchmark: per backend at the job's batch, as `<backend>/<stat>`
LOADGEN_LATENCY = {"single_stream": "p90_us", "multi_stream": "p99_us", "server": "p99_us", "offline": "samples_per_s"}
CONTROL_LOOP = ("control_loop/miss_rate", "control_loop/miss_rate_upper", "control_loop/max_rate_hz")  # the miss rate,
# its confidence bound, the highest rate within the miss budget; and LoadGen's server search: its highest QPS
SERVER_SEARCH = ("loadgen/server/max_qps",)


def logged_metrics(record: dict) -> dict[str, float]:
    """The first MAX_LOGGED metrics MLflow gets for a job, `readable` (its table prints every digit), under names every
    dtype and batch share so that a compare view lines them up: the mode's answer (`answer/`), each backend's p50 and
    obs/s at the job's batch, the control loop's and LoadGen's figures, the rest of the headline, each judged output's
    error vs fp64 beside its limit."""
    mode, metrics = record["mode"], record.get("metrics") or {}
    head = headline_metrics(mode, metrics, record["status"], record.get("batch_size"))
    conf = modes().get(mode)
    ours = answers(mode)
    skip = conf.not_logged if conf else ()
    names = [n for n in dict.fromkeys((*ANSWER_ORDER, *head)) if n in head and n not in skip]
    out = {logged_name(n): head[n] for n in names if n in ours}  # the answer first: the cap below keeps it
    spec = {**ANY_MODE, **(conf.headline if conf else {})}
    copied = {m.path for n in names if n in ours and n in spec for m in spec[n].of}  # the answer's, not logged twice
    batch, _ = timed_batch(metrics, record.get("batch_size"))
    keys = [(f"{backend}/{s}", f"{backend}/b{b}/{s}") for backend, b, _ in ladder(metrics, "p50_us") if b == batch
            for s in BACKEND_STATS] + [(k, k) for k in (*CONTROL_LOOP, *SERVER_SEARCH) if k not in copied]
    keys += [(k, k) for s, latency in LOADGEN_LATENCY.items() for k in (f"loadgen/{s}/valid", f"loadgen/{s}/{latency}")
             if k not in copied]
    out.update({name: readable(key, metrics[key]) for name, key in keys if _finite(metrics.get(key))})
    out.update({logged_name(n, answer=False): head[n] for n in names if n not in ours})
    stems = dict.fromkeys(k.split("/vs_fp64/")[0] for k in metrics if "/vs_fp64/" in k and k.count("/") == 2)
    for stem, metric, suffix in product(stems, OUTPUT_STATS, ("", "_limit")):
        path, stat = metric.at(stem=stem, ref="fp64").path, metric.path.rsplit("/", 1)[1]
        value = metrics.get(path + suffix)
        if _finite(value) and f"{path}_limit" in metrics:  # judged outputs only
            out[f"vs_fp64/{stem}/{stat}{suffix}"] = float(value) if suffix else readable(stat, float(value))
    for stem in stems:  # SQNR last, reported not judged: only in the room the rest left under the cap (+inf: not logged)
        value = metrics.get(SQNR.at(stem=stem, ref="fp64").path)
        if _finite(value) and MAX_ABS.at(stem=stem, ref="fp64").path + "_limit" in metrics:
            out[f"vs_fp64/{stem}/sqnr_db"] = readable("sqnr_db", float(value))
    return dict(list(out.items())[:MAX_LOGGED])


def answers(mode: str) -> set[str]:
    """The headline names that answer the mode's own question, logged as `answer/<name>` (the run page's first chart
    section: MLflow 3.17 sorts sections by name): `passed`, the mode's own headline, and where the mode declares no
    `first_screen` of its own, a verified point's error, cosine and p50 (ANY_MODE: precision's answer)."""
    conf = modes().get(mode)
    return {"passed", *(conf.headline if conf else ()), *(() if conf and conf.first_screen else ANY_MODE)}


def logged_name(name: str, answer: bool = True) -> str:
    """A headline's MLflow key: the answer's `answer/<name>`, an error vs fp64 named as its `limit/` param
    (`answer/max_abs` for `max_abs_vs_fp64`), the fastest backend's `best_<stat>` as `best/<stat>`; a figure that is
    not the mode's answer in the section of what it is measured against, after the answer (`vs_fp64/cosine`,
    `latency/p50_us`)."""
    if name.startswith("best_"):
        return "best/" + name[len("best_"):]
    if answer:
        return ANSWER + name.removesuffix("_vs_fp64")
    stem, vs, ref = name.rpartition("_vs_")
    return f"vs_{ref}/{stem}" if vs else f"{ANY_MODE[name].of[0].path.split('/')[0]}/{name}"


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


def ladder(metrics: dict[str, float], stat: str) -> list[tuple[str, int, float]]:
    """(backend, batch, value) of a benchmark's per-point metrics `<backend>/b<batch>/<stat>`."""
    found = ((re.fullmatch(r"([^/]+)/b(\d+)/" + re.escape(stat), key), value) for key, value in metrics.items())
    return [(m[1], int(m[2]), float(value)) for m, value in found if m]


def noisy(record: dict) -> bool:
    """Whether the point's own p50 (`latency/p50_us`) flagged itself noisy (IQR / median above timing.py's bound): the
    one flag every screen shows beside that p50; a ladder's other figures carry their own (`<backend>/b<N>/noisy`)."""
    return bool((record.get("latency") or {}).get("noisy", (record.get("metrics") or {}).get("latency/noisy")))


def settings(params: dict, dtype: str, prefix: str = "") -> dict:
    """The resolved config minus what does not describe this run: other dtypes' thresholds and plumbing keys."""
    if prefix == "verify.limits.":
        params = {k: v for k, v in params.items() if k == dtype}
    return {k: settings(v, dtype, f"{prefix}{k}.") if isinstance(v, dict) else v for k, v in params.items()
            if f"{prefix}{k}" not in NOISE}
