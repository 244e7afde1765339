"""A sweep's points side by side: max |Δaction| against the CPU fp32 point on the same inputs, which points are
bit-identical (device agreement, e.g. npu:0 vs npu:1), and per device the fastest dtype whose precision passes.

Pure functions over the summary rows and the jobs' actions.npy; sweep.py writes and logs what they return.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import numpy as np

from huggy_exp import certify, loadgen, plots
from huggy_exp.config import (DTYPE_NAMES, GRAPH_BACKENDS, PLAN_PREFIX, REFERENCE_BACKEND, SWEEP_REFERENCE, modes,
                              numerics_label, ran_dtype)
from huggy_exp.headline import ERROR
from huggy_exp.foreign import check_npy
from huggy_exp.report import OBS_PER_S, fmt, obs_per_s_differs
from huggy_exp.verify import DECLARED, FINGERPRINT


def inputs_key(row: dict) -> tuple:
    """Points are comparable when the mode and its action-shaping knobs, the observations, seed and model agree (and,
    where the mode verifies only the job's batch of rows, the batch size)."""
    judges = {f.name for f in fields(modes()[row["mode"]]) if f.metadata.get("judges")}  # config.rule(judges=True)
    knobs = {k: v for k, v in (row.get("knobs") or {}).items() if k not in judges and k != "_target_"}
    obs = f"{row['obs']}/b{row['batch_size']}" if modes()[row["mode"]].per_batch else row["obs"]
    return row["mode"], json.dumps(knobs, sort_keys=True, default=str), obs, row["seed"], row["model_sha256"]


def load_outputs(row: dict) -> dict[str, np.ndarray]:
    """A point's output arrays by file stem: continuous `actions`, `discrete_actions`, `memories` (empty on error)."""
    if row["status"] == "error":
        return {}
    d = Path(row["dir"])
    found = [d / f"{o.stem}.npy" for o in DECLARED if (d / f"{o.stem}.npy").is_file()]
    for f in found:  # a foreign job dir (mode=diff) may hold a header that declares terabytes
        check_npy(f, "output")
    return {f.stem: np.load(f, allow_pickle=False) for f in found}


def compare(rows: list[dict]) -> dict:
    """{"vs_cpu_fp32": {job: max |Δ|}, "agreement": [groups], "recommended": {device: {...}}, "lines": [...]}.

    A point's numerics (dtype, and its precision mode off IEEE: `fp32-tf32`) stand where a dtype would: agreement groups,
    the per-device pick and the lines compare `fp32` and `fp32-tf32` as two choices."""
    for row in rows:  # rows of older result.json files have no precision mode: they ran in IEEE fp32
        row.setdefault("numerics", numerics(row))
    outputs = {r["job"]: load_outputs(r) for r in rows}

    # --- each point against the CPU fp32 point on the same inputs (same batch size preferred): max |Δ| of the
    # continuous actions, the share of discrete decisions equal to its (against another point only)
    for row, stem in ((row, stem) for row in rows for stem in ("actions", "discrete_actions")):
        mine = outputs[row["job"]].get(stem)
        refs = [r for r in rows if r["device"] == "cpu" and numerics(r) == SWEEP_REFERENCE and inputs_key(r) == inputs_key(row)
                and (stem == "actions" or r is not row) and mine is not None
                and getattr(outputs[r["job"]].get(stem), "shape", None) == mine.shape]
        if not refs or len(refs) == 1 and refs[0] is row:
            continue
        ref = outputs[min(refs, key=lambda r: (r["batch_size"] != row["batch_size"], r is row))["job"]][stem]
        if stem == "actions":
            row["vs_cpu_fp32_max_abs"] = float(np.abs(mine.astype(np.float64) - ref).max(initial=0.0))
        else:
            row["vs_cpu_fp32_discrete_agreement"] = float(np.mean(mine == ref))
    vs_ref = {r["job"]: r["vs_cpu_fp32_max_abs"] for r in rows if "vs_cpu_fp32_max_abs" in r}

    # --- device agreement: equal fingerprints (every output's bytes) within (inputs, dtype), across devices or repeats
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if row.get(FINGERPRINT) and row["status"] != "error":
            groups.setdefault((*inputs_key(row), row["numerics"]), []).append(row)
    agreement = []
    for (mode, _, obs, seed, _, dtype), members in groups.items():
        if len(members) < 2:
            continue
        hashes = list(dict.fromkeys(r[FINGERPRINT] for r in members))
        points = [{"job": r["job"], "device": r["device"], "batch_size": r["batch_size"], "card": r.get("card"),
                   "class": hashes.index(r[FINGERPRINT]), FINGERPRINT: r[FINGERPRINT]} for r in members]
        agreement.append({"mode": mode, "dtype": dtype, "obs": obs, "seed": seed, "identical": len(hashes) == 1,
                          "points": points, "cards_disagree": cards_disagree(points), "one_card": one_card(points)})

    recommended = recommend(rows)
    replays = replay_agreement(rows)
    dual = dual_benchmarks(rows)
    return {"vs_cpu_fp32": vs_ref, "agreement": agreement, "recommended": recommended,
            "lines": (comparison_lines(rows, agreement, recommended) + dual_lines(dual) + replays["lines"] + port_lines(rows)
                      + loadgen_lines(rows)),
            "table": comparison_table(rows), "device_agreement": replays["table"], "dual_benchmark": dual}


DUAL_STEMS = tuple(o.stem for o in DECLARED)  # outputs a point records `<stem>/vs_fp64/<metric>` for


def dual_benchmarks(rows: list[dict]) -> list[dict]:
    """msprobe's dual benchmark across hosts: where a CUDA and an NPU point ran the same inputs in the same dtype, each
    output's error vs fp64 on the NPU over the GPU's (certify.dual_rows: ratio <= 1 pass, <= 2 warn for RMSE)."""
    found = []
    judged = [r for r in rows if r["status"] in ("passed", "failed") and r.get("vs_fp64")]
    for npu in (r for r in judged if str(r["device"]).startswith("npu")):
        for gpu in (r for r in judged if str(r["device"]).startswith("cuda")):
            if (gpu["dtype"] != npu["dtype"] or inputs_key(gpu) != inputs_key(npu) or gpu["batch_size"] != npu["batch_size"]
                    or (gpu.get("precision_mode", "ieee") == "ieee") != (npu.get("precision_mode", "ieee") == "ieee")):
                continue
            outputs = [o for stem in DUAL_STEMS if stem in npu["vs_fp64"] and stem in gpu["vs_fp64"]
                       for o in certify.dual_rows(stem, npu["vs_fp64"][stem], gpu["vs_fp64"][stem])]
            if outputs:
                sides = {side: {k: r.get(k) for k in ("job", "device", "host")}
                         for side, r in (("npu", npu), ("cuda", gpu))}
                found.append({"dtype": npu["dtype"], "mode": npu["mode"], **sides, "rows": outputs,
                              "verdict": certify.worst(o["verdict"] for o in outputs)})
    return found


def errors_vs_fp64(metrics: dict) -> dict[str, dict[str, float]]:
    """A point's recorded errors vs fp64 per output, as certify.errors() names them (rmse, max_rel; mismatch_share)."""
    out: dict[str, dict[str, float]] = {}
    for stem in DUAL_STEMS:
        found = {m: float(v) for m in ("rmse", "max_rel", "agreement")
                 if isinstance(v := metrics.get(f"{stem}/vs_fp64/{m}"), (int, float))}
        if stem == "discrete_actions" and "agreement" in found:
            out[stem] = {"mismatch_share": 1.0 - found["agreement"]}
        elif found.keys() - {"agreement"}:
            out[stem] = {m: v for m, v in found.items() if m != "agreement"}
    return out


def dual_lines(dual: list[dict]) -> list[str]:
    """`dual benchmark fp16 precision: npu:0(job 3 on a2) vs cuda:0(job 1 on g1): pass (actions rmse ratio 0.93 pass, …)`."""
    def where(p: dict) -> str:
        return f"{p['device']}(job {p['job']}" + (f" on {p['host']})" if p.get("host") else ")")

    return [f"dual benchmark {d['dtype']} {d['mode']}: {where(d['npu'])} vs {where(d['cuda'])}: {d['verdict']} ("
            + ", ".join(f"{o['output']} {o['metric']} ratio {o['ratio']:.3g} {o['verdict']}" for o in d["rows"]) + ")"
            for d in dual]


def verified(row: dict) -> bool:
    """A point of a mode that verifies its outputs (the mode's `verified` trait, config.py)."""
    return getattr(modes().get(row["mode"]), "verified", False)


def negative_control(row: dict) -> bool:
    """A case that expected to fail and did: its limits were tightened on purpose, so it says nothing against its dtype."""
    return row["status"] == "failed" and row.get("expect") == "failed" and row.get("expectation_met") is True


def numerics(row: dict) -> str:
    """The choice a point stands for: its dtype, and its precision mode off IEEE (`fp32-tf32`)."""
    return row.get("numerics") or numerics_label(row["dtype"], row.get("precision_mode"))


def timed_points(judged: list[dict]) -> list[dict]:
    """Every latency the judged points measured, one per (point, backend, batch): its p50, IQR, obs/s, noise flag, and
    the numerics that really ran it (config.ran_dtype: onnxruntime's fp32 graph in a bf16 job is an fp32 figure)."""
    out = []
    for r in judged:
        extra = {stat: {(b, int(n)): v for b, n, v in r.get(f"{stat}_points") or ()} for stat in ("throughput", "noisy", "iqr")}
        for backend, batch, p50 in r.get("latency_points") or ():
            if isinstance(p50, (int, float)) and math.isfinite(p50):
                where = (backend, int(batch))
                out.append({"row": r, "backend": backend, "batch": int(batch), "p50_us": float(p50),
                            "dtype": numerics(r) if ran_dtype(backend, r["dtype"]) == r["dtype"]  # a plan stays one
                            else numerics_label(ran_dtype(backend, r["dtype"]), r.get("precision_mode")),
                            "iqr_us": extra["iqr"].get(where), "obs_per_s": extra["throughput"].get(where),
                            "noisy": bool(extra["noisy"].get(where, r.get("noisy")))})
    return out


def recommend(rows: list[dict]) -> dict:
    """Per device, model and batch size: the fastest passing dtype and backend, comparing only latencies measured at that
    batch size on that device (a benchmark's ladder gives one per backend and batch). A dtype with a point that failed
    there is not picked, unless the failure was a case's expected one (a negative control); a noisy latency is named as
    such, never the silent basis of a pick."""
    recommended: dict[str, dict] = {}
    judged = [r for r in rows if verified(r) and r["status"] in ("passed", "failed")]
    several = len({_model(r) for r in judged}) > 1
    timed = timed_points(judged)
    for device, model in dict.fromkeys((r["device"], _model(r)) for r in judged):
        checked = [r for r in judged if r["device"] == device and _model(r) == model]
        suffix = f" with {checked[0].get('model_name') or model}" if several else ""
        weights = {}
        for r in checked:  # the numbers each point ran: a checkpoint replaced mid-sweep shows here
            weights.setdefault(r.get("weights_sha256") or r["model_sha256"], []).append(r["job"])
        here = [t for t in timed if t["row"]["device"] == device and _model(t["row"]) == model]
        if len(weights) > 1:  # no pick across different weights: the checkpoint was replaced during the sweep
            ran = "; ".join(f"job{'s' * (len(jobs) > 1)} {', '.join(map(str, jobs))} ran weights {str(w)[:12]}"
                            for w, jobs in weights.items())
            recommended[device + suffix] = {**_no_pick(device, None), "mixed_weights": weights, "why": (
                f"no recommendation across different weights: the model's weights changed during the sweep ({ran}); "
                "re-run the sweep on one checkpoint")}
            continue
        if not here:  # judged, never timed: the verdicts without a pick
            failing = sorted({numerics(r) for r in checked if r["status"] == "failed" and not negative_control(r)}, key=_narrow_first)
            recommended[device + suffix] = {
                **_no_pick(device, None), "failing": failing, "why": "no judged point on this device measured a latency: speed unknown",
                "passing": [d for d in dict.fromkeys(numerics(r) for r in checked if r["status"] == "passed") if d not in failing]}
        for batch in sorted({t["batch"] for t in here}):
            recommended[f"{device} at batch {batch}{suffix}"] = _pick(device, batch, [t for t in here if t["batch"] == batch])
    return recommended


def _no_pick(device: str, batch: int | None) -> dict:
    return {"device": device, "batch_size": batch, "dtype": None, "backend": None, "p50_us": None, "obs_per_s": None,
            "job": None, "jobs": [], "noisy": False, "options": [], "passing": [], "failing": [], "expected_failures": [],
            "tie": []}


def _pick(device: str, batch: int, here: list[dict]) -> dict:
    """The fastest passing (numerics that ran, backend) among the latencies measured at one batch size on one device; of
    figures within each other's noise (a tie), the more precise choice."""
    failing = sorted({numerics(t["row"]) for t in here if t["row"]["status"] == "failed" and not negative_control(t["row"])},
                     key=_narrow_first)
    options = _options(here)
    eligible = [o for o in options if o["verdict"] == "passed" and o["dtype"] not in failing]
    rec = {**_no_pick(device, batch), "options": options, "failing": failing,
           "passing": [d for d in dict.fromkeys(numerics(t["row"]) for t in here) if d in {o["dtype"] for o in eligible}],
           "expected_failures": [f"{o['dtype']} (job {o['job']})" for o in options if o["verdict"] == "expected failure"]}
    if not eligible:
        failed = ", ".join(f"{o['dtype']} {o['backend']} (job {o['job']})" for o in options if o["verdict"] == "failed")
        passed = any(o["verdict"] == "passed" for o in options)
        return {**rec, "why": f"no pick at batch {batch}: " + (f"every dtype timed here also failed a point here ({failed})"
                                                                if passed else f"no point timed here passed ({failed or 'expected failures only'})")}
    fastest = min(eligible, key=lambda o: o["p50_us"])
    tied = [o for o in eligible if tie(o, fastest)]
    choice = max(tied, key=lambda o: (_precise_first(o["dtype"]), -o["p50_us"]))
    judged = [t["row"] for t in here if numerics(t["row"]) == choice["dtype"] and t["row"]["status"] == "passed"]
    row = next((r for r in judged if r["job"] == choice["job"]), judged[0])  # the point that judged the dtype that ran
    rec.update({k: choice[k] for k in ("dtype", "backend", "p50_us", "obs_per_s", "job", "noisy", "jobs")})
    return {**rec, "tie": [o["label"] for o in tied if o is not choice],
            "why": _why(choice, [o for o in eligible if o not in tied], tied, batch, row)}


def tie(a: dict, b: dict) -> bool:
    """Two p50s within their noise: their interquartile ranges, centred on them, overlap (no IQR: equal figures only)."""
    return abs(a["p50_us"] - b["p50_us"]) <= ((a.get("iqr_us") or 0.0) + (b.get("iqr_us") or 0.0)) / 2


def _options(here: list[dict]) -> list[dict]:
    """One option per (numerics that ran, backend, verdict): the fastest of its figures, with every job that timed it
    (two jobs timing onnxruntime's fp32 graph are one fp32 graph timed twice). A figure of another dtype than its point's
    takes the verdict of the points that judged the dtype it ran here (none: `not judged`)."""
    judged = {}
    for t in here:
        judged.setdefault(numerics(t["row"]), set()).add("expected failure" if negative_control(t["row"]) else t["row"]["status"])
    grouped: dict[tuple, list[dict]] = {}
    for t in sorted(here, key=lambda t: t["p50_us"]):
        if t["dtype"] == numerics(t["row"]):
            verdict = "expected failure" if negative_control(t["row"]) else t["row"]["status"]
        else:
            verdict = "passed" if "passed" in judged.get(t["dtype"], ()) else "not judged"
        grouped.setdefault((t["dtype"], t["backend"], verdict), []).append(t)
    options = []
    for (dtype, backend, verdict), timed in grouped.items():
        t = timed[0]
        jobs = list(dict.fromkeys(x["row"]["job"] for x in timed))
        label = f"{dtype} {backend}" + _provenance(dtype, backend, timed)
        options.append({"dtype": dtype, "backend": backend, "verdict": verdict, "p50_us": t["p50_us"], "iqr_us": t["iqr_us"],
                        "obs_per_s": t["obs_per_s"], "noisy": t["noisy"], "job": t["row"]["job"], "jobs": jobs,
                        "mode": t["row"]["mode"], "label": label})
    return options


def _provenance(dtype: str, backend: str, timed: list[dict]) -> str:
    """Where one option's figures came from when it is not simply its own job's: `(one fp32 graph, timed in jobs 1
    (fp32) 76.1 µs, 3 (bf16) 76.2 µs)`, `(in the bf16 job 3)`."""
    if len(timed) > 1:
        what = f"{dtype} graph" if backend in GRAPH_BACKENDS else f"{dtype} {backend}"
        return f" (one {what}, timed in jobs " + ", ".join(
            f"{t['row']['job']} ({numerics(t['row'])}) {fmt(t['p50_us'])} µs" for t in timed) + ")"
    return f" (in the {numerics(timed[0]['row'])} job {timed[0]['row']['job']})" if numerics(timed[0]["row"]) != dtype else ""


def _precise_first(numerics: str) -> tuple[int, bool]:
    """The more precise of two choices sorts higher: the wider dtype, and within a dtype IEEE over tf32/hf32; a precision
    plan (several dtypes) lowest."""
    width, mode = _narrow_first(numerics)
    return (-1, False) if numerics.startswith(PLAN_PREFIX) else (width, not mode)


def _narrow_first(numerics: str) -> tuple[int, str]:
    """Narrowest first (config.DTYPE_NAMES: int8 ... fp64); within a dtype, ieee before tf32/hf32; plans last."""
    dtype, _, mode = numerics.partition("-")
    return (len(DTYPE_NAMES), numerics) if numerics.startswith(PLAN_PREFIX) else (DTYPE_NAMES.index(dtype), mode)


def _model(row: dict) -> str:
    """Which model a point asked for (its file, or the embedded default): the points a recommendation compares."""
    return row.get("model_name") or str(row.get("model_sha256"))


def _why(choice: dict, others: list[dict], tied: list[dict], batch: int, row: dict) -> str:
    """The figures a pick rests on, all measured at one batch size; the error is that of the point that judged the dtype
    that ran (`row`)."""
    word = "fastest passing" + ("" if len(tied) == 1 else " within noise (a tie: their IQRs overlap), the more precise")
    plan = " (a precision plan, compared like for like: same device, batch and backend)" * choice["dtype"].startswith(PLAN_PREFIX)
    text = (f"{word} at batch {batch}: {choice['label']}{plan}, p50 {fmt(choice['p50_us'])} µs"
            + (f", {fmt(choice['obs_per_s'])} obs/s" if choice.get("obs_per_s") else "") + f" (job {choice['job']}, {choice['mode']})")
    if obs_per_s_differs(batch, choice["p50_us"], choice.get("obs_per_s")):
        text += f" ({OBS_PER_S})"
    error, limit = row["metrics"].get("max_abs_vs_fp64"), row.get("max_abs_limit")
    if isinstance(error, (int, float)):
        text += (f", {choice['dtype']} max_abs vs fp64 {error:.2g}" + (f" (limit {limit:.2g})" if isinstance(limit, (int, float)) else "")
                 + (f" (job {row['job']})" if row["job"] != choice["job"] else ""))
    if len(tied) > 1:
        text += "; tied with " + ", ".join(f"{o['label']} {fmt(o['p50_us'])} µs" for o in tied if o is not choice)
    if others:
        text += f"; also passing at batch {batch}: " + ", ".join(
            f"{o['label']} {fmt(o['p50_us'])} µs" + (" (noisy)" if o["noisy"] else "") for o in others)
    if choice["noisy"]:
        text += "; NOTE: the picked latency is noisy (IQR/median > 0.1): re-measure on a quiet machine before relying on it"
    return text


def port_lines(rows: list[dict]) -> list[str]:
    """What a record or replay sweep found, in its own terms: per bundle the points recorded (p50, error vs fp64); for
    the replays, the agreement with their recordings (bitwise, worst ULP), the dual benchmark's verdicts and worst
    ratio, and the latency changes."""
    lines = []
    recorded = [r for r in rows if r["mode"] == "record" and r["status"] == "passed"]
    for bundle in dict.fromkeys(_port(r).get("bundle") for r in recorded):
        mine = [r for r in recorded if _port(r).get("bundle") == bundle]
        lines.append(f"record into {bundle}: {len(mine)} point(s): " + "; ".join(
            f"{r['port'].get('point')} p50 {fmt(r['metrics']['p50_us'])} µs" * ("p50_us" in r["metrics"])
            + (f", max_abs vs fp64 {r['metrics'][ERROR]:.2g}" if ERROR in r["metrics"] else "") for r in mine))
    replays = [r for r in rows if r["mode"] == "replay" and r["status"] in ("passed", "failed")]
    if not replays:
        return lines
    def figure(r: dict, k: str) -> float | None:
        return r["metrics"].get(k) if isinstance(r["metrics"].get(k), (int, float)) else None

    compared = [r for r in replays if figure(r, "bitwise") is not None]
    text = (f"replay: {len(replays)} point(s); bitwise equal to their recording: "
            f"{sum(figure(r, 'bitwise') == 1.0 for r in compared)}/{len(compared)}")
    ulps = [figure(r, "ulp_max") for r in compared if figure(r, "ulp_max") is not None]
    text += f" (worst {max(ulps):,.0f} ULP)" if ulps else ""
    for word, key, metric in (("dual benchmark", "dual_benchmark", "dual_ratio"), ("latency vs recording", "latency_change", "lat_ratio")):
        verdicts = [_port(r)[key] for r in replays if _port(r).get(key)]
        ratios = [figure(r, metric) for r in replays if figure(r, metric) is not None]
        if verdicts:
            text += f"; {word}: " + ", ".join(f"{v} {verdicts.count(v)}" for v in dict.fromkeys(verdicts))
            text += f" (ratios {min(ratios):.3g}..{max(ratios):.3g})" if ratios else ""
    return lines + [text]


def loadgen_lines(rows: list[dict]) -> list[str]:
    """What each benchmark point's LoadGen scenarios and control loop found, in their own terms (loadgen.answer)."""
    found = [(row, loadgen.answer(_metrics(row))) for row in rows if row["mode"] == "benchmark" and row["status"] != "skipped"]
    return [f"loadgen job {row['job']} ({row['device']} {numerics(row)} b{row['batch_size']}): {text}" for row, text in found if text]


def _metrics(row: dict) -> dict:
    """A point's every metric, from its result.json (a summary row holds the headline only)."""
    path = Path(row.get("dir") or "") / "result.json"
    return (json.loads(path.read_text()).get("metrics") or {}) if row.get("dir") and path.is_file() else {}


def _port(row: dict) -> dict:
    return row.get("port") or {}


def replay_agreement(rows: list[dict]) -> dict:
    """The replays of a sweep (`-m device=npu:0,npu:1`, or `threads=1,2`) as one device-agreement table: per bundle and
    dtype, which points gave the same output bytes as each other (class 0 = the first's) and as the recording."""
    table = []
    for row in rows:
        if row["mode"] != "replay" or row["status"] == "error" or not row.get(FINGERPRINT):
            continue
        record = json.loads((Path(row["dir"]) / "result.json").read_text())
        share = (record.get("metrics") or {}).get("agreement/bitwise_share")
        record = {**record, **(record.get("details") or {})}  # a task's details, wherever result.json keeps them
        table.append({"job": row["job"], "bundle": record.get("bundle"), "point": record.get("point"), "dtype": row["dtype"],
                      "threads": record.get("threads"), "recorded_point": record.get("recorded_point"),
                      "equal_to_recording": None if share is None else share == 1.0, FINGERPRINT: row[FINGERPRINT],
                      "status": row["status"]})
    lines = []
    for group in dict.fromkeys((t["bundle"], t["dtype"]) for t in table):
        members = [t for t in table if (t["bundle"], t["dtype"]) == group]
        hashes = list(dict.fromkeys(t[FINGERPRINT] for t in members))
        for t in members:
            t["class"] = hashes.index(t[FINGERPRINT])
        cells = ", ".join(f"{t['point']} t{t['threads']} (job {t['job']}): class {t['class']}, "
                          + {True: "= recording", False: "≠ recording", None: "no recording"}[t["equal_to_recording"]] for t in members)
        verdict = "all bit-identical" if len(hashes) == 1 else f"{len(hashes)} different results"
        lines.append(f"device agreement {group[1]} (bundle {Path(str(group[0])).name}): {verdict}; {cells}")
    return {"table": table, "lines": lines}


def cards_disagree(points: list[dict]) -> str | None:
    """Two cards of one kind (npu:0, npu:1) at one batch size must give the same bytes: which card does not, or None.

    The odd card is one outside the largest class of the group (the CPU's points count as witnesses); on a tie, outside
    the first point's class."""
    by_kind: dict[tuple[str, int], list[dict]] = {}
    for p in points:
        if not str(p["device"]).startswith("cpu"):
            by_kind.setdefault((str(p["device"]).split(":")[0], p["batch_size"]), []).append(p)
    sizes = [sum(q["class"] == c for q in points) for c in range(max((p["class"] for p in points), default=-1) + 1)]
    usual = max(range(len(sizes)), key=lambda c: (sizes[c], c == points[0]["class"])) if sizes else 0
    found = []
    for cards in by_kind.values():
        if len({_card(c) for c in cards}) > 1 and len({c["class"] for c in cards}) > 1:
            good = [c for c in cards if c["class"] == usual] or cards[:1]
            odd = [c for c in cards if c["class"] != good[0]["class"]]
            found += [f"{c['device']} (job {c['job']}) differs bit for bit from {good[0]['device']} (job {good[0]['job']})" for c in odd]
    return "; ".join(found) or None


def _card(point: dict) -> str:
    """The card a point ran on: the one a launcher recorded (Ray: `host/npu:3`, as the node numbers it), else its device."""
    return point.get("card") or str(point["device"])


def one_card(points: list[dict]) -> str | None:
    """Points asked for different cards of one kind (npu:0, npu:1) but ran on one (Ray placed them): which, or None.
    Their agreement compares a card with itself, never two cards."""
    found = []
    for card in dict.fromkeys(_card(p) for p in points if p.get("card")):
        asked = [p for p in points if _card(p) == card]
        if len({p["device"] for p in asked}) > 1:
            found.append(", ".join(f"{p['device']} (job {p['job']})" for p in asked) + f" all ran on {card}")
    return "; ".join(found) or None


VS_CPU_FP32 = (("vs_cpu_fp32_max_abs", "max |Δaction| vs cpu fp32 = {:.3g}"),
               ("vs_cpu_fp32_discrete_agreement", "discrete actions equal to cpu fp32's: {:.2%}"))


def comparison_lines(rows: list[dict], agreement: list[dict], recommended: dict) -> list[str]:
    """The terminal's dtype comparison: one line per compared point, per agreement group, per device pick."""
    lines = []
    for r, (key, text) in ((r, kt) for r in rows for kt in VS_CPU_FP32):
        if key in r and not (r["device"] == "cpu" and r["dtype"] == SWEEP_REFERENCE):
            lines.append(f"{r['job']:>3} {r['mode']} {r['device']} {r['numerics']} b{r['batch_size']} {r['obs']} "
                         f"seed {r['seed']}: " + text.format(r[key]))
    for g in agreement:
        where = ", ".join(f"{p['device']}(job {p['job']})" for p in g["points"])
        verdict = "bit-identical" if g["identical"] else f"{len({p['class'] for p in g['points']})} different results"
        if g.get("cards_disagree"):
            verdict += f"; FAILED: {g['cards_disagree']} (cards of one kind must agree)"
        if g.get("one_card"):
            verdict += f"; NOT a two-card check: {g['one_card']}"
        lines.append(f"agreement {g['mode']} {g['dtype']} {g['obs']} seed {g['seed']}: {where}: {verdict}")
    for where, rec in recommended.items():
        lines.append(f"recommended on {where}: {pick_text(rec)}")
    return lines


def pick_text(rec: dict) -> str:
    """`bf16 eager (fastest passing at batch 64: ...; passing: fp32, bf16; failing: fp16)`, or `no pick (why)`: never a bare
    'none' beside a table that holds a passing timed point."""
    if not rec.get("dtype"):
        return f"no pick ({rec['why']})"
    text = f"{rec['dtype']}" + (f" {rec['backend']}" if rec.get("backend") else "") + f" ({rec['why']}"
    text += f"; passing: {', '.join(rec['passing'])}" if rec.get("passing") else ""
    text += f"; failing: {', '.join(rec['failing'])}" if rec.get("failing") else ""
    text += f"; expected failures, met: {', '.join(rec['expected_failures'])}" if rec.get("expected_failures") else ""
    return text + ")"


def comparison_table(rows: list[dict]) -> list[dict]:
    """One row per point for the parent run's table artifact."""
    keys = ("job", "case", "mode", "device", "dtype", "precision_mode", "batch_size", "obs", "seed", "status",
            "vs_cpu_fp32_max_abs", FINGERPRINT)
    return [{**{k: r.get(k) for k in keys}, **{f"m.{k}": v for k, v in r["metrics"].items()}} for r in rows]


def draw(sweep_dir: Path, rows: list[dict], result: dict) -> list[Path]:
    """Plots for the parent run, only those the sweep has data for: error vs dtype, latency vs batch, agreement."""
    files = []
    errors: dict[str, dict[str, float]] = {}  # the worst error per device and dtype
    limits: dict[str, float] = {}
    versus = "vs cpu fp64" if any(r["metrics"].get(ERROR) is not None for r in rows) else "vs cpu fp32"
    for r in rows:
        value = r["metrics"].get(ERROR) if versus == "vs cpu fp64" else r.get("vs_cpu_fp32_max_abs")
        if isinstance(value, (int, float)):
            worst = errors.setdefault(r["device"], {})
            worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), value)
            if isinstance((r.get("limits") or {}).get("max_abs"), (int, float)):
                limits[r["dtype"]] = max(limits.get(r["dtype"], 0.0), r["limits"]["max_abs"])
    if errors:
        files.append(sweep_dir / plots.categories(sweep_dir / "error_vs_dtype.png", errors, DTYPE_NAMES[::-1],
                                                  f"max |Δaction| {versus}", f"worst action error per dtype {versus}, "
                                                  "per device (red: the dtype's limit)", limits))
    curves: dict[str, dict[str, list]] = {}
    for r in rows:
        if r.get("latency_points") is None and isinstance(r["metrics"].get("p50_us"), (int, float)):
            r = {**r, "latency_points": [[REFERENCE_BACKEND, r["batch_size"], r["metrics"]["p50_us"]]]}  # rows without a ladder
        for stat, key in (("latency_points", "p50_us"), ("throughput_points", "obs_per_s")):
            for backend, batch, value in r.get(stat) or ():
                label = f"{r['device']} {r['numerics']} {backend}"
                curves.setdefault(label, {"p50_us": [], "obs_per_s": []})[key].append((batch, value))
    if curves:
        files.append(sweep_dir / plots.versus_batch(sweep_dir / "latency_vs_batch.png", curves,
                                                    "latency and throughput vs batch size, per device, dtype and backend"))
    if result["agreement"]:
        labels = [f"{g['mode']} {g['dtype']} {g['obs']} s{g['seed']}" for g in result["agreement"]]
        cells = [[(f"{p['device']} #{p['job']}", p["class"]) for p in g["points"]] for g in result["agreement"]]
        files.append(sweep_dir / plots.agreement(sweep_dir / "fingerprint_agreement.png", labels, cells))
    return files
