"""Hydra edges of a multirun: the parent run before any job, the summary files and the exit code after the last one."""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from huggy_exp import report, terminal, tracking
from huggy_exp.config import REFERENCE_BACKEND, VERDICTS, numerics_label
from huggy_exp.preflight import JOBS_ENV
from huggy_exp.headline import judged_limits, ladder, noisy
from huggy_exp.compare import compare, draw, errors_vs_fp64, verified
from huggy_exp.files import disk_full_message, is_disk_full
from huggy_exp.results import (EXIT_CODES, EXIT_INTERRUPTED, EXIT_PENDING, atomic_write_text, expectation, jsonable,
                               write_table)
from huggy_exp.report import fmt
from huggy_exp.verify import FINGERPRINT


class SweepCallback(Callback):
    """Before the jobs: sweep.json and the MLflow parent run. After: summary.{json,csv,md}, tally, exit code."""

    def __init__(self) -> None:
        self.started = 0.0
        self.sweep_dir: Path | None = None
        self.settings: dict = {}
        self.plots = True

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.started = time.time()
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.settings = OmegaConf.to_container(config.tracking, resolve=True)
        self.plots = bool(config.plots)  # the sweep's own plots follow the command line's `plots=`
        ACTIVE[0] = self
        jobs = os.environ.get(JOBS_ENV)
        info = tracking.start_sweep(self.settings, self.sweep_dir, uuid.uuid4().hex[:12], sys.argv[1:],
                                    int(jobs) if jobs and jobs.isdigit() else None)
        if info["tracking"]["status"] == "down":
            print(f"warning: MLflow store not ready ({info['tracking']['reason']}); every point stays pending in its "
                  "result.json: `python run.py mode=sync` logs them later", file=sys.stderr)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        ACTIVE[0] = None
        sys.exit(self.finish("FINISHED"))

    def finish(self, status: str) -> int:
        """Write the summaries, close the parent run, print the tally; returns the sweep's exit code.

        Hydra turns a callback's exception into a warning and exit 0: a summary that cannot be written (a full disk) is
        one line and exit 2 here, and the parent run is ended FAILED all the same (every point's result.json stays)."""
        assert self.sweep_dir is not None
        try:
            info = tracking.read_sweep(self.sweep_dir) or {}
            summary = summarize(self.sweep_dir, since=self.started, sweep=info)
            summary["title"] = tracking.sweep_name(info.get("argv", sys.argv[1:]), info.get("started") or self.started)
            files = write_summary(self.sweep_dir, summary, self.plots)
        except Exception as exc:
            reason = disk_full_message(exc) if is_disk_full(exc) else f"{type(exc).__name__}: {exc}"
            tracking.end_sweep(self.settings, self.sweep_dir, {}, [], "FAILED")
            print(f"error: the sweep's summary was not written: {reason}; each point's result.json under "
                  f"{self.sweep_dir} is kept", file=sys.stderr)
            return EXIT_INTERRUPTED if status == "KILLED" else EXIT_CODES["error"]
        url = tracking.end_sweep(self.settings, self.sweep_dir, summary, files, status)
        print(f"\nsweep summary ({len(summary['rows'])} jobs) in {self.sweep_dir}:")
        for row in summary["rows"]:
            print("  " + painted(row))
        lines = summary["comparison"]["lines"]
        picks = [line for line in lines if line.startswith("recommended")]
        if len(picks) < len(lines):
            print("comparison:\n" + "\n".join("  " + line for line in lines if line not in picks))
        # picks: none in a sweep without verdicts vs fp64 (record, replay): their lines say what they found
        print("\n".join("  " + line for line in [summary["line"], *picks]))
        if url:
            base = ""  # a server's URLs are whole; a SQLite store's are paths under mode=ui's address
            if not url["runs"].startswith("http"):
                uri = info.get("tracking", {}).get("uri", "")
                port = int(self.settings.get("ui_port") or 5000)
                store = "" if uri == tracking.default_uri() else f" tracking.uri={uri}"
                print(f"  UI: python run.py mode=ui{store} (or: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 "
                      f"--port {port} --workers 1), then open")
                base = f"http://127.0.0.1:{port}/"
            print(f"  runs:       {base}{url['runs']}\n  parent run: {base}{url['parent']}")
        if status == "KILLED":
            return EXIT_INTERRUPTED
        worst = max((EXIT_CODES.get(r["status"], 2) if r["expect"] is None else int(not r["expectation_met"])
                     for r in summary["rows"]), default=0)
        if summary["tally"]["no_result"]:  # a point that wrote no result of this sweep never passed
            worst = max(worst, EXIT_CODES["error"])
        if any(g.get("cards_disagree") for g in summary["comparison"]["agreement"]):
            worst = max(worst, EXIT_CODES["failed"])  # the dual-card check: two cards of one kind gave different bytes
        if not worst and summary["tally"]["pending"]:
            return EXIT_PENDING
        return worst


ACTIVE: list[SweepCallback | None] = [None]  # the running sweep, for run.py's Ctrl-C handler (one per process)


def interrupted(exc: BaseException) -> int:
    """A sweep ended by a signal (Ctrl-C, SIGTERM, a closed pipe): summaries of what finished, the parent run KILLED;
    the exit code to use (128 + the signal)."""
    callback = ACTIVE[0]
    if callback is None or callback.sweep_dir is None:
        return terminal.exit_code(exc)
    ACTIVE[0] = None
    print(f"\ninterrupted ({terminal.describe(exc)}): the jobs that finished are summarised below", file=sys.stderr)
    code = callback.finish("KILLED")
    return terminal.exit_code(exc) if code == EXIT_INTERRUPTED else code


def summarize(sweep_dir: Path, since: float = 0.0, sweep: dict | None = None) -> dict:
    """One row per result.json written under the sweep dir since `since` (older ones are a reused dir's leftovers) by
    this `sweep` (its sweep.json: another run's result.json is never its point), the tally (with the points that wrote
    none), and the comparison of the points (compare.py)."""
    rows = []
    found = [p for p in sweep_dir.rglob("result.json") if p.stat().st_mtime >= since]
    for path in sorted(found, key=lambda p: (len(str(p.parent)), str(p.parent))):
        r = json.loads(path.read_text())
        if sweep is not None and (r.get("sweep") or {}).get("id") != sweep.get("id"):
            continue
        note = r.get("reason") or r.get("headline") or ""
        track = (r.get("tracking") or {}).get("status", "off")
        is_verified = verified(r)  # record, replay, ...: their own headline is their answer
        figures = point_figures(r) if is_verified else ""
        placed = r.get("host") or {}  # a launcher's placement (Ray): the host and node that ran the point
        shown = r.get("reason") if figures else note  # a verified point's figures say what its headline says
        line = (f"{path.parent.name:>3} {r['run_name']:<32} {r['status'].upper() + expectation(r):<7}" + figures
                + (f" {shown}" if shown else "") + (" [not in MLflow yet]" if track == "pending" else "")
                + (f" [on {placed.get('hostname')} {placed.get('ray_node_ip', '')}]".replace(" ]", "]") if placed else ""))
        params, model, metrics = (r.get(k) or {} for k in ("params", "model", "metrics"))
        numerics, card = r.get("precision_mode", "ieee"), placed.get("card") or "none"
        named = "/".join(Path(str(model.get("path") or "?")).parts[-3:])  # huggy_lstm/Huggy/Huggy-2000049.pt
        rows.append({
            "job": path.parent.name, "run_name": r["run_name"], "mode": r["mode"], "verified": is_verified,
            "device": r["device"], "port": port_details(r), "dtype": r["dtype"], "precision_mode": numerics,
            "numerics": numerics_label(r["dtype"], numerics, (r.get("plan") or {}).get("name")),
            "plan": r.get("plan"), "batch_size": r["batch_size"], "case": r.get("case"), "status": r["status"],
            "note": note, "tracking": track, "expect": r.get("expect"), "expectation_met": r.get("expectation_met"),
            "line": line, "dir": str(path.parent), "seed": r.get("seed"), "obs": obs_label(params.get("obs") or {}),
            "model_sha256": model.get("sha256"), "weights_sha256": model.get("weights_sha256"),
            "model_name": "embedded default" if model.get("synthetic") else named,
            **{f"{name}_points": latency_points(r, stat) for name, stat in
               (("latency", "p50_us"), ("throughput", "obs_per_s"), ("noisy", "noisy"), ("iqr", "iqr_us"))},
            "metrics": r.get("headline_metrics") or {}, "shared_machine": r.get("shared_machine", False),
            "noisy": noisy(r), "run_id": (r.get("tracking") or {}).get("run_id"), "limits": judged_limits(r),
            "latency": r.get("latency") or {}, "max_abs_limit": _limit(metrics),
            "fingerprint": (r.get("tags") or {}).get(FINGERPRINT), "knobs": params.get("mode") or {},
            "vs_fp64": errors_vs_fp64(metrics),
            "host": placed.get("hostname") or (r.get("environment") or {}).get("host"),
            "node": placed.get("ray_node_ip"),  # card: `a2/npu:3`, the host and the card a launcher placed it on
            "card": None if card == "none" else f"{placed.get('hostname')}/{card}"})
    tally = {s: sum(r["status"] == s for r in rows) for s in VERDICTS}
    tally["pending"] = sum(r["tracking"] == "pending" for r in rows)
    tally["expected"] = sum(r["expect"] is not None for r in rows)
    tally["missed"] = sum(r["expectation_met"] is False for r in rows)
    tally["no_result"] = max(0, int((sweep or {}).get("jobs") or 0) - len(rows))
    line = (f"{tally['expected'] - tally['missed']}/{tally['expected']} cases met their expected verdict; "
            if tally["expected"] else "") + f"{tally['passed']}/{len(rows) + tally['no_result']} passed, "
    line += ", ".join(f"{tally[s]} {s}" for s in VERDICTS[1:])  # failed, skipped, error
    line += f"; {tally['pending']} not in MLflow yet (python run.py mode=sync)" if tally["pending"] else ""
    line += f"; {tally['no_result']} of the sweep's points wrote no result" if tally["no_result"] else ""
    return {"rows": rows, "tally": tally, "line": line, "comparison": compare(rows)}


def port_details(record: dict) -> dict:
    """A record or replay point's own answer, for the sweep's port lines (compare.port_lines): its bundle, point, and
    the replay's verdict words (dual benchmark, latency change)."""
    details, tags = {**record, **(record.get("details") or {})}, record.get("tags") or {}
    if not details.get("bundle"):  # only record and replay name the bundle they wrote or read
        return {}
    found = {"bundle": details.get("bundle"), "point": details.get("point"), "recorded_point": details.get("recorded_point"),
             "dual_benchmark": tags.get("dual_benchmark"), "latency_change": tags.get("latency_change")}
    return {k: v for k, v in found.items() if v is not None}


def painted(row: dict) -> str:
    """A row's line, its verdict coloured on a terminal: green passed or an expected outcome met (an expected failure
    too), red failed, an error or an expectation not met, yellow skipped."""
    if not sys.stdout.isatty():
        return row["line"]
    key = ("passed" if row.get("expectation_met") else "failed") if row.get("expect") is not None else row["status"]
    word = row["status"].upper()
    return row["line"].replace(f" {word}", f" \033[{COLOURS.get(key, '0')}m{word}\033[0m", 1)


COLOURS = {"passed": "32", "failed": "31", "error": "31", "skipped": "33"}  # ANSI: green, red, red, yellow


FIGURES = (("max_abs_vs_fp64", "max_abs"), ("cosine_vs_fp64", "cos"), ("agreement_vs_fp64", "agree"),
           ("kl_vs_fp64", "KL"), ("shift_vs_fp64", "|Δμ|/σ"), ("p50_us", "p50"))  # a verified point's, in its line


def point_figures(record: dict) -> str:
    """` max_abs 5.9e-07/1e-05 cos 1 p50 52 µs fingerprint 68a9080ce4d8` of a point (empty for other modes)."""
    head, metrics = record.get("headline_metrics") or {}, record.get("metrics") or {}
    limit = _limit(metrics)
    after = {"max_abs_vs_fp64": "" if limit is None else f"/{fmt(limit)}",
             "p50_us": " µs" + (" (noisy)" if noisy(record) else "")}
    parts = [f"{name} {fmt(head[key])}{after.get(key, '')}" for key, name in FIGURES if key in head]
    if fp := (record.get("tags") or {}).get(FINGERPRINT):
        parts.append(f"{FINGERPRINT} {fp[:12]}")
    if "ort_int8_kl" in head:
        verdict = "PASSED" if metrics.get("onnxruntime_int8/passed") else "FAILED"
        parts.append(f"| onnxruntime int8 {verdict} KL {fmt(head['ort_int8_kl'])} "
                     f"p50 {fmt(head['ort_int8_p50_us'])} µs")
    return (" " + " ".join(parts)) if parts else ""


def _limit(metrics: dict) -> float | None:
    """The max_abs limit beside the headline max_abs vs fp64 (continuous actions, else memories)."""
    keys = (f"{stem}/vs_fp64/max_abs_limit" for stem in ("actions", "sampled_actions", "memories"))
    return next((metrics[k] for k in keys if k in metrics), None)


def latency_points(record: dict, stat: str = "p50_us") -> list[list]:
    """[backend, batch, value] a job timed: benchmark's `<backend>/b<N>/<stat>` ladder, else its `latency/<stat>`
    (stat p50_us or obs_per_s)."""
    metrics = record.get("metrics") or {}
    points = [list(point) for point in ladder(metrics, stat)]
    if not points and isinstance(metrics.get(f"latency/{stat}"), (int, float)):
        backend = (record.get("params") or {}).get("backend") or REFERENCE_BACKEND
        points.append([backend, int(record.get("batch_size") or 0), float(metrics[f"latency/{stat}"])])
    return points


def obs_label(obs: dict) -> str:
    """`random/64/x1.0`, `zeros/8`, `file:obs.npy`: what identifies the observations a point ran on."""
    source = obs.get("source", "?")
    if source == "file":
        return f"file:{obs.get('path')}"
    return f"{source}/{obs.get('rows')}" + (f"/x{obs.get('scale')}" if source == "random" else "")


def write_summary(sweep_dir: Path, summary: dict, plot: bool) -> list[Path]:
    """summary.json, summary.csv and summary.md in the sweep dir; the comparison table and (with `plot`) plots beside them."""
    columns = ["job", "run_name", "mode", "device", "dtype", "precision_mode", "batch_size", "case", "host", "node", "obs", "seed",
               "status", "expect", "tracking", "vs_cpu_fp32_max_abs", "vs_cpu_fp32_discrete_agreement", FINGERPRINT, "note"]
    metric_names = list(dict.fromkeys(k for r in summary["rows"] for k in r["metrics"]))
    flat = [{**r, **{f"m.{k}": v for k, v in r["metrics"].items()}} for r in summary["rows"]]
    paths = [sweep_dir / "summary.json", sweep_dir / "summary.csv", sweep_dir / "summary.md"]
    atomic_write_text(paths[0], json.dumps(jsonable(summary), indent=2) + "\n")
    write_table(paths[1], flat, columns + [f"m.{k}" for k in metric_names])
    title = summary.get("title") or f"Sweep {sweep_dir.name}"
    md = [f"# {report.escape(title)}", "", report.escape(summary["line"]), ""]
    if advice := tracking.recommendation(summary["comparison"]):
        md += [f"**Recommended:** {report.escape(advice)}", ""]
    if found := tracking.own_answer(summary["comparison"]):  # record, replay, LoadGen: what they found, in view
        md += [f"**Found:** {report.escape(found)}", ""]
    md += ["| " + " | ".join(report.VERDICT_HEAD) + " |", "|" + " --- |" * len(report.VERDICT_HEAD)]
    md += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in report.verdict_rows(summary["rows"])]
    comparison = summary["comparison"]
    if comparison["lines"]:
        md += ["", "## Comparison", "", *(f"- {report.escape(line)}" for line in comparison["lines"])]
    table = sweep_dir / "comparison.csv"
    write_table(table, comparison["table"])
    if comparison.get("device_agreement"):  # replays (mode=replay): one table of which points agree bit for bit
        write_table(sweep_dir / "device_agreement.csv", comparison["device_agreement"])
        paths.append(sweep_dir / "device_agreement.csv")
    plots = draw(sweep_dir, summary["rows"], comparison) if plot else []
    md += ["", f"Everything above with the plots embedded, in one file: [{report.REPORT}]({report.REPORT})."]
    if plots:
        md += ["", *(f"![{p.stem}]({p.name})" for p in plots)]
    atomic_write_text(paths[2], "\n".join(md) + "\n")
    env = next((json.loads((Path(r["dir"]) / "result.json").read_text()).get("environment") for r in summary["rows"]), {}) or {}
    page = report.write_sweep_report(sweep_dir, title, summary, plots, env)
    return paths + [table, page] + plots


def _cell(value) -> str:
    """A markdown table cell: numbers as the report prints them, a report's marked-up cell as its (escaped) text."""
    if isinstance(value, tuple) and value and value[0] == "html":
        return re.sub(r"<[^>]+>", "", value[1]).strip().replace("|", "&#124;")
    return report.escape(report.fmt(value))
