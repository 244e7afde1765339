"""`diff`: what changed between two sweeps (or bundles, or job dirs), point by point, with replay's rules.
Described in docs/modes.md#diff and docs/port-certificate.md."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from huggy_exp import bundle, environment
from huggy_exp.certify import DUAL_RULES, bitwise, dual_benchmark, errors, latency_change, rule_verdict, test05_tolerance, worst
from huggy_exp.compare import load_outputs
from huggy_exp.config import REFERENCE_BACKEND, SQNR, DiffMode
from huggy_exp.context import Context
from huggy_exp.errors import UserError
from huggy_exp.numerics import error_ratio
from huggy_exp.report import escape
from huggy_exp.results import Result
from huggy_exp.files import atomic_write_text
from huggy_exp.foreign import read_json
from huggy_exp.tasks import Task
from huggy_exp.verify import is_fingerprint, nonfinite_failures

ACCURACY_MARKS = ("vs_fp64", "vs_fp32", "vs_cpu", "vs_torch", "deterministic", "agreement")
REPORTED_ONLY = "/" + SQNR.path.rsplit("/", 1)[1]


@dataclass
class Point:
    """One point of a side: where it came from and what it recorded."""

    key: str
    origin: str
    status: str | None = None
    accuracy: dict = field(default_factory=dict)
    fingerprints: dict = field(default_factory=dict)
    latency_s: np.ndarray | None = None
    p50_us: float | None = None
    environment: dict = field(default_factory=dict)
    model: str | None = None
    outputs: dict = field(default_factory=dict)
    fp64: dict | None = None
    inputs: str | None = None  # what the inputs were: a bundle's computed sha256, a job's obs settings and seed
    feeds: dict = field(default_factory=dict)  # a bundle's input arrays, read (a NaN in them fails the diff)


def load_side(path: str | None, which: str) -> dict[str, Point]:
    """Points of a bundle (manifest.json), or of every result.json under a sweep or job dir (a `record` job: its bundle's point)."""
    if not path:
        raise UserError(f"mode=diff needs mode.{which}=<sweep dir, job dir or bundle>")
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(f"mode.{which}={path}: no such folder")
    if bundle.is_bundle(root):
        b = bundle.read(root)
        return {key: bundle_point(b, key) for key in b.points}
    records = sorted(root.rglob("result.json"), key=lambda p: (len(p.parts), str(p)))
    if not records:
        raise UserError(f"mode.{which}={path}: neither a bundle (manifest.json) nor a sweep or job dir (no result.json under it)")
    points: dict[str, Point] = {}
    for path_ in records:
        record = read_json(path_, f"mode.{which}:")  # a foreign file: under the caps, or one line naming it
        if not isinstance(record, dict):
            raise UserError(f"mode.{which}: {path_} is a JSON {type(record).__name__}, not a job's result")
        if record.get("mode") == "diff":
            continue
        record = {**(record.get("details") or {}), **record}  # a task's details, wherever result.json keeps them
        point = job_point(record, path_.parent)
        key, n = point.key, 2
        while key in points:
            key, n = f"{point.key} #{n}", n + 1
        point.key = key
        points[key] = point
    return points


def bundle_point(b: bundle.Bundle, key: str) -> Point:
    """A bundle's point; its inputs read and hashed here, never taken from the manifest's declared digest."""
    p, feeds = b.points[key], b.inputs()
    accuracy = {f"{name}/vs_fp64/{k}": v for name, m in b.comparison(key).get("outputs", {}).items() for k, v in m.items()}
    return Point(key, f"bundle {b.root}", None, accuracy, dict(p.get("fingerprints", {})),
                 b.latency(key), p.get("latency", {}).get("p50_us"), p.get("environment", {}), b.manifest["model"].get("sha256"),
                 b.outputs(key), b.reference(), bundle.arrays_sha256(feeds), feeds)


def job_point(record: dict, workdir: Path) -> Point:
    params = record.get("params") or {}
    mode, backend = record.get("mode"), params.get("backend", REFERENCE_BACKEND)
    key = f"{record.get('run_name')} {backend} seed {record.get('seed')}"  # case:mode-device-dtype-b<batch>[-obs]
    if mode == "record" and record.get("bundle") and record.get("point") and bundle.is_bundle(record["bundle"]):
        b = bundle.read(record["bundle"])
        if record["point"] in b.points:
            point = bundle_point(b, record["point"])
            point.key, point.status, point.origin = key, record.get("status"), str(workdir)
            return point
    metrics = record.get("metrics") or {}
    accuracy = {k: v for k, v in metrics.items()  # SQNR is reported, never judged: +inf is two equal outputs
                if any(mark in k for mark in ACCURACY_MARKS) and not k.endswith(REPORTED_ONLY)}
    prints = {k: v for k, v in {**(record.get("tags") or {}), **record}.items()
              if isinstance(v, str) and (k.endswith("sha256") or is_fingerprint(k)) and k != "job_id"}
    p50 = next((metrics[k] for k in ("latency.p50_us", "latency/p50_us", "p50_us") if isinstance(metrics.get(k), (int, float))), None)
    outputs = load_outputs({"status": record.get("status"), "dir": str(workdir)})
    inputs = json.dumps({"obs": params.get("obs"), "seed": record.get("seed")}, sort_keys=True)
    return Point(key, str(workdir), record.get("status"), accuracy, prints, None, p50, record.get("environment") or {},
                 (record.get("model") or {}).get("sha256"), outputs, None, inputs)


def nonfinite(side: str, p: Point) -> list[str]:
    """Every figure of a point that is not a finite number: its inputs, outputs, fp64 reference, accuracy and p50."""
    where = f"{side} {p.key}:"
    figures = {**p.accuracy, **({"p50_us": p.p50_us} if p.p50_us is not None else {})}
    return (nonfinite_failures(p.feeds, f"{where} inputs") + nonfinite_failures(p.outputs, where)
            + nonfinite_failures(p.fp64 or {}, f"{where} fp64 reference")
            + [f"{where} {k} is not a finite number ({v!r})" for k, v in figures.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)])


def compare_points(base: Point, cand: Point, alpha: float) -> dict:
    """Everything that differs between two recordings of one point."""
    row: dict = {"point": base.key, "side": "both", "changes": []}
    if base.status != cand.status:
        row["changes"].append(f"status {base.status} -> {cand.status}")
    row["regressed"] = base.status == "passed" and cand.status == "failed"
    changed = {k: (base.accuracy.get(k), cand.accuracy.get(k)) for k in sorted(set(base.accuracy) | set(cand.accuracy))
               if base.accuracy.get(k) != cand.accuracy.get(k)}
    row["accuracy_changed"] = len(changed)
    if changed:
        shown = "; ".join(f"{k} {_num(a)} -> {_num(b)}" for k, (a, b) in list(changed.items())[:4])
        row["changes"].append(f"{len(changed)} accuracy metric(s) changed: {shown}" + (" ..." if len(changed) > 4 else ""))
    _dual(base, cand, row)
    _outputs(base, cand, row)
    if base.model != cand.model:
        row["changes"].append(f"model sha256 {str(base.model)[:12]}.. -> {str(cand.model)[:12]}..")
    env = environment.diff(base.environment, cand.environment)
    row["env_changed"] = len(env)
    if env:
        row["changes"].append("environment: " + "; ".join(f"{e['field']} {e['recorded']} -> {e['here']}" for e in env[:5])
                              + (" ..." if len(env) > 5 else ""))
    row["changed"] = bool(row["changes"])  # what the policy computed and where: latency is judged on its own below
    _latency(base, cand, alpha, row)
    return row


def _dual(base: Point, cand: Point, row: dict) -> None:
    """The dual benchmark: candidate error / baseline error, both against fp64 (not applicable to other inputs)."""
    if base.inputs != cand.inputs:
        row["changes"].append(f"inputs differ ({str(base.inputs)[:40]} -> {str(cand.inputs)[:40]}): no dual benchmark")
        dual = []  # the dual benchmark holds two runs of the same inputs to one reference: not applicable
    elif base.fp64 is not None and cand.fp64 is not None and cand.outputs and base.outputs:
        dual = dual_benchmark(cand.outputs, base.outputs, cand.fp64, base.fp64)
    else:
        dual = [{"output": k, "metric": k.split("/")[-1], "ratio": _ratio(cand.accuracy[k], base.accuracy[k]),
                 "verdict": rule_verdict(_ratio(cand.accuracy[k], base.accuracy[k]), k.split("/")[-1].split(".")[-1])}
                for k in base.accuracy if k in cand.accuracy and "vs_fp64" in k and k.replace("/", ".").split(".")[-1] in DUAL_RULES]
    row["dual"] = worst(d["verdict"] for d in dual) if dual else None
    if dual:
        row["dual_worst_ratio"] = max(d["ratio"] for d in dual)
        if row["dual"] != "pass":
            row["changes"].append(f"dual benchmark {row['dual']} (worst ratio {row['dual_worst_ratio']:.3g})")


def _outputs(base: Point, cand: Point, row: dict) -> None:
    """The outputs both sides hold, bit for bit and in ULPs (not applicable to other inputs, or to outputs of another
    shape), and the fingerprints that changed."""
    shared = [n for n in base.outputs if n in cand.outputs]
    if shared and base.inputs != cand.inputs:
        row["changes"].append("outputs not compared: not applicable, the inputs differ")
        shared = []
    reshaped = [n for n in shared if np.shape(base.outputs[n]) != np.shape(cand.outputs[n])]
    if reshaped:
        row["changes"].append("outputs not compared: not applicable, other shapes (" + "; ".join(
            f"{n} {list(np.shape(base.outputs[n]))} -> {list(np.shape(cand.outputs[n]))}" for n in reshaped) + ")")
        shared = [n for n in shared if n not in reshaped]
    if shared:
        agree = [bitwise(cand.outputs[n], base.outputs[n]) for n in shared]
        row["bitwise_share"] = min(a["bitwise_share"] for a in agree)
        row["ulp_max"] = max(a["ulp_max"] for a in agree)
        if row["bitwise_share"] < 1:
            diffs = [errors(cand.outputs[n], base.outputs[n]) for n in shared]
            row["changes"].append(f"outputs {row['bitwise_share']:.1%} bitwise equal (max {row['ulp_max']:.0f} ULP, max |Δ| "
                                  f"{max(d.get('max_abs', d.get('mismatch_share', 0.0)) for d in diffs):.3g})")
    prints = sorted(k for k in set(base.fingerprints) & set(cand.fingerprints) if base.fingerprints[k] != cand.fingerprints[k])
    row["fingerprints_changed"] = len(prints)
    if prints:
        row["changes"].append(f"fingerprint(s) changed: {', '.join(prints)}")


def _latency(base: Point, cand: Point, alpha: float, row: dict) -> None:
    """The samples' test where both sides carry them, else the p50 ratio against TEST05's tolerance."""
    if base.latency_s is not None and cand.latency_s is not None:
        lat = latency_change(base.latency_s, cand.latency_s, alpha)
    elif all(isinstance(v, (int, float)) and np.isfinite(v) and v > 0 for v in (base.p50_us, cand.p50_us)):
        ratio, tol = cand.p50_us / base.p50_us, test05_tolerance(base.p50_us * 1e-6)
        lat = {"median_ratio": ratio, "tolerance": tol, "test": "p50 ratio only: a sweep's result.json has no samples, no test",
               "verdict": "within tolerance" if abs(ratio - 1) <= tol else ("slower (untested)" if ratio > 1 else "faster (untested)")}
    else:
        lat = {"verdict": "not measured"}
    row.update(latency=lat["verdict"], latency_ratio=lat.get("median_ratio"), latency_p_value=lat.get("p_value"))
    if lat["verdict"] not in ("within tolerance", "not measured", "not significant"):
        p = f", p = {lat['p_value']:.2g}" if "p_value" in lat else ""
        row["changes"].append(f"latency {lat['verdict']}: {lat['median_ratio']:.2f}x median{p}")
    row["latency_changed"] = lat["verdict"] in ("slower", "faster")


def _ratio(a, b) -> float:
    return error_ratio(float(a), float(b)) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else float("nan")


def _num(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


class DiffTask(Task):
    mode: DiffMode

    def run(self, ctx: Context) -> Result:
        m = self.mode
        base, cand = load_side(m.baseline, "baseline"), load_side(m.candidate, "candidate")
        bad = [why for side, points in (("baseline", base), ("candidate", cand)) for p in points.values()
               for why in nonfinite(side, p)]
        rows = [compare_points(base[k], cand[k], m.alpha) for k in base if k in cand]
        rows += [{"point": k, "side": "baseline only", "changed": True, "changes": ["only in the baseline"]} for k in base if k not in cand]
        rows += [{"point": k, "side": "candidate only", "changed": True, "changes": ["only in the candidate"]} for k in cand if k not in base]
        both = [r for r in rows if r["side"] == "both"]
        counts = {"points": len(rows), "changed": sum(r["changed"] for r in both), "unchanged": sum(not r["changed"] for r in both),
                  "latency_changed": sum(r["latency_changed"] for r in both),
                  "only_baseline": sum(r["side"] == "baseline only" for r in rows),
                  "only_candidate": sum(r["side"] == "candidate only" for r in rows)}
        result = Result(metrics={f"diff/{k}": float(v) for k, v in counts.items()},
                        tables={"diff": [{**r, "changes": " | ".join(r["changes"])} for r in rows]})
        for why in bad:  # nothing that is not finite passes, on either side
            result.fail(why)
        for r in both:
            if r.get("regressed"):
                result.fail(f"{r['point']}: passed in the baseline, failed in the candidate")
            if r.get("dual") == "fail":
                result.fail(f"{r['point']}: dual benchmark fails (candidate error {r['dual_worst_ratio']:.3g}x the baseline's)")
            if m.fail_on_latency and r.get("latency") == "slower":
                result.fail(f"{r['point']}: latency slower ({r['latency_ratio']:.2f}x, p = {r['latency_p_value']:.2g})")
        headline = (f"{counts['changed']} of {len(both)} common point(s) changed (accuracy, outputs, fingerprints, status, "
                    f"environment), {counts['latency_changed']} in latency; {counts['only_baseline']} only in the baseline, "
                    f"{counts['only_candidate']} only in the candidate")
        result.summary = [headline, *(f"{r['point']}: {'; '.join(r['changes'])}" for r in rows if r["changes"])]
        md = [f"# Diff: {escape(m.baseline)} -> {escape(m.candidate)}", "", headline, "", "| point | side | what changed |",
              "| --- | --- | --- |"]
        md += [f"| {escape(r['point'])} | {r['side']} | {escape('; '.join(r['changes'])) or 'nothing'} |" for r in rows]
        atomic_write_text(ctx.workdir / "report.md", "\n".join(md) + "\n")
        result.files.append("report.md")
        result.details.update({"headline": headline, "baseline": m.baseline, "candidate": m.candidate, "points": rows})
        return result
