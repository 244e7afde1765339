"""One job end to end: config -> context -> task -> Result -> result.json + MLflow. Nothing flows back up."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from huggy_exp import bundle, environment, mlagents, terminal, tracking
from huggy_exp.config import modes, numerics_label
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.headline import headline_metrics
from huggy_exp.preflight import validate
from huggy_exp.report import write_job_report
from huggy_exp.results import (EXIT_CODES, EXIT_PENDING, Result, expectation, held_result, read_result, update_result,
                               write_json, write_result, write_table)
from huggy_exp.files import disk_full_message, is_disk_full
from huggy_exp.memory import check_job_memory

if TYPE_CHECKING:  # context and placement import torch: a command (sync, ui, rejudge) never loads it
    from huggy_exp.context import Context

JOB_LOG = "huggy_exp.job"  # conf/hydra/job_logging/huggy.yaml sends it to the job's run.log only


# --- a job's output, context and task


def say(line: str, error: bool = False) -> None:
    """Job output: printed, and logged to Hydra's run.log; a password in a URI never shows."""
    line = tracking.redact(line)
    print(line, file=sys.stderr if error else sys.stdout, flush=True)
    log = logging.getLogger(JOB_LOG)
    if log.handlers:  # configured by Hydra's job logging; in-process callers without it get the print alone
        log.log(logging.ERROR if error else logging.INFO, line)


def build_context(cfg: DictConfig, workdir: Path) -> Context:
    """The job's Context: the composed config as the schema's own objects (config.Config, OmegaConf.to_object)."""
    from huggy_exp.context import Context

    conf = OmegaConf.to_object(cfg)
    settings = {f.name: getattr(conf, f.name) for f in fields(Context) if hasattr(conf, f.name)}
    db = tracking.local_store(conf.tracking.uri)  # its folder (database, lock, artifacts) is the tool's own
    return Context(**settings, model_spec=conf.model, workdir=workdir,
                   owned=(workdir, mlagents.cache_dir(), *([db.parent] if db else []), *job_inputs(cfg)))


def job_inputs(cfg: DictConfig) -> list[Path]:
    """What a job reads besides the model: every existing file or folder its config names (obs.path, a mode's input;
    mode.path, an output, aside) and the config folders Hydra composed it from (conf/, --config-dir)."""
    from hydra.core.hydra_config import HydraConfig

    named = [Path(v).expanduser() for k, v in environment.flatten(OmegaConf.to_container(cfg, resolve=True)).items()
             if isinstance(v, str) and k != "mode.path" and v.strip()]
    sources = HydraConfig.get().runtime.config_sources if HydraConfig.initialized() else []
    return [p for p in named if p.exists()] + [Path(s.path) for s in sources if s.provider != "hydra" and s.schema == "file"]


def make_task(mode: DictConfig):
    """The mode's task (its `_target_` class), built with the mode's schema object (config.<Name>Mode)."""
    from hydra.utils import get_class

    return get_class(mode._target_)(OmegaConf.to_object(mode))


# --- where a job sits in its sweep, and its name


@dataclass(frozen=True)
class JobInfo:
    """Where a job sits: its sweep (dir, id, number) in a multirun, and the overrides that made it."""

    overrides: tuple[str, ...] = ()
    case: str | None = None
    sweep_dir: Path | None = None
    num: int | None = None
    launcher: str = "basic"
    shared_machine: bool = False  # a parallel launcher runs other jobs beside this one: timings are not clean
    tracker: object | None = field(default=None, compare=False)  # tracking_worker.Helper: logs in place of tracking.log_job
    # set by a launcher that places points on other hosts (the Ray launcher, through POINT_ENV):
    job_id: str | None = None  # chosen before submission, so that the head and the worker name one record
    host: dict | None = None  # where the point ran: hostname, Ray node, card, device name, driver/CANN versions
    preset: tuple[str, str] | None = None  # (status, reason) decided before the job could run (no node has its device)
    pending: str | None = None  # do not log now, leave tracking pending with this reason (`mode=sync` logs it)


POINT_ENV = "HUGGY_EXP_POINT"  # JSON of JobInfo's launcher fields (job_id, host, preset, pending) for the job in this process


def point_info() -> dict:
    """The launcher's fields of the job this process runs now (empty unless a launcher set POINT_ENV)."""
    point = json.loads(os.environ.get(POINT_ENV) or "{}")
    return point and {"job_id": point.get("job_id"), "host": point.get("host"), "pending": point.get("pending"),
                      "preset": tuple(point["preset"]) if point.get("preset") else None}


CASE_KEEPS = ("case", "expect", "tracking", "hydra")  # overrides that leave a case's point as its file declares it


def run_name(mode: str, cfg: DictConfig, case: str | None = None, overrides: tuple[str, ...] = ()) -> str:
    """What is special about the job: mode, device, numerics (`fp32-tf32`, a plan), batch (a benchmark's ladder,
    zero-padded to sort: b00064 < b01024), and obs when not random. A case's point is named by its case alone, as its
    file declares what runs; `<case>:<name>` when an override changes what runs (`case=x dtype=fp16`)."""
    if case and all(o.lstrip("+~").split("=")[0].split(".")[0] in CASE_KEEPS for o in overrides):
        return case
    name = f"{mode}-{cfg.device}-{numerics_label(cfg.dtype, cfg.get('precision_mode'), plan_name(cfg))}-b{batch_label(mode, cfg)}"
    source = (cfg.get("obs") or {}).get("source")
    if source and source != "random":
        name += f"-{source}"
    return f"{case}:{name}" if case else name


def plan_name(cfg: DictConfig) -> str | None:
    """The job's precision plan's name, None without one (conf/plan/none.yaml)."""
    plan = cfg.get("plan")
    return None if plan is None or plan.get("parts") is None else str(plan.name)


BATCH_DIGITS = 5  # benchmark names: b00064 sorts before b01024 (and a batch of 100000 or more after both)


def batch_label(mode: str, cfg: DictConfig) -> str:
    if mode != "benchmark":
        return str(cfg.batch_size)
    return "-".join(f"{b:0{BATCH_DIGITS}d}" for b in sorted(set(cfg.mode.batch_sizes or [cfg.batch_size])))


# --- one job: run, written to result.json, then tracked


def execute(cfg: DictConfig, workdir: Path, mode: str, job: JobInfo | None = None) -> Result:
    """Run the mode's task: result.json is written before MLflow is touched (tracking `pending`), then updated with the
    outcome; Ctrl-C during the task is recorded (status error, `interrupted`), then re-raised so a sweep stops."""
    job = job or JobInfo()
    started = time.time()
    logging.raiseExceptions = False  # a full disk under run.log must not print a traceback per line logged
    workdir.mkdir(parents=True, exist_ok=True)
    held = held_result(workdir)
    if held is not None:  # a second job in the same folder (a race past run.py's check): the first one's result stays
        reason = f"job folder {workdir} already holds a job's result ({held}); left as it was, this job did not run"
        say(f"  ERROR: {reason}", error=True)
        return Result(status="error", reason=reason)
    sweep = (tracking.read_sweep(job.sweep_dir) or {}) if job.sweep_dir is not None else None
    if sweep is not None:
        say(progress(sweep, job, started))
    result, ctx, interrupted = _run_task(cfg, workdir, mode, job.preset)
    head = _lead_with_headline(result, mode, job, int(cfg.batch_size))
    settings = OmegaConf.to_container(cfg.tracking, resolve=True)
    record = _job_record(cfg, mode, job, result, ctx, started, interrupted, head, settings)
    if job.host:
        record["host"] = job.host
    if job.shared_machine:
        result.tags["shared_machine"] = "true"
    if sweep is not None:
        record["sweep"] = {"dir": str(job.sweep_dir), "id": sweep.get("id"), "num": job.num,
                           "parent_run_id": sweep.get("parent_run_id")}
    with terminal.deferred():  # a signal now would lose the job's result: it is raised once result.json is written
        path = _write(workdir, record, result)
    if path is None:
        say(f"  ERROR: {result.reason}; the job's result was not written (nothing of it is half-written)", error=True)
        if interrupted:
            raise interrupted from None
        return result
    write_job_report(workdir, read_result(workdir), [workdir / f for f in result.files if str(f).endswith(".png")])
    _print_summary(record, result, path)
    if interrupted:
        update_result(workdir, tracking={"status": "pending", "reason": "interrupted: `python run.py mode=sync` logs it"})
        raise interrupted
    _track(result, settings, workdir, path, job)
    return result


def _write(workdir: Path, record: dict, result: Result) -> Path | None:
    """result.json and the files beside it. A full disk turns the job into an error: result.json is written again
    without the arrays and tables (it is small: the disk may still hold it); None when even that cannot be written."""
    for _ in range(2):
        try:
            return write_result(workdir, record, result)
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            result.status, result.reason = "error", disk_full_message(exc)
            result.arrays, result.tables = {}, {}
    return None


def _run_task(cfg: DictConfig, workdir: Path, mode: str,
              preset: tuple[str, str] | None = None) -> tuple[Result, Context | None, KeyboardInterrupt | None]:
    """Validate, build the context, run the task, check its outputs are finite: (result, context, interrupted). Every
    failure becomes a result (a bad value `error`, a missing device or file `skipped`, a bug `error` with its traceback
    printed); Ctrl-C is recorded for the caller to re-raise. `preset`: a launcher's (status, reason): nothing runs."""
    from huggy_exp.placement import set_precision

    ctx = None
    try:
        validate(cfg, mode)
        if preset is not None and preset[0] == "skipped":
            raise Unsupported(preset[1])
        if preset is not None:
            return Result(status=preset[0], reason=preset[1]), None, None
        missing = [p for p in cfg.get("needs") or () if not Path(p).expanduser().exists()]
        if missing:
            raise Unsupported(f"needs {missing[0]}, which is not on this host (shared fixtures: set HUGGY_EXP_SHARED)")
        ctx, switches = build_context(cfg, workdir), {}
        if modes()[mode].runs_policy:
            ctx.precision_plan  # noqa: B018 (a bad plan is one line before anything runs)
            switches = set_precision(ctx.device, ctx.dtype, ctx.precision_mode)  # as read back; Unsupported: skipped
            check_job_memory(mode, OmegaConf.to_container(cfg, resolve=True), ctx.weights)
        result = make_task(cfg.mode).run(ctx)
        result.tags.update({f"fp32_precision/{name}": value for name, value in switches.items()})
        result.check_finite()
    except OSError as exc:
        if not is_disk_full(exc):
            say(traceback.format_exc().rstrip(), error=True)
        result = Result(status="error", reason=disk_full_message(exc) if is_disk_full(exc)
                        else f"internal error: {type(exc).__name__}: {exc}")
    except Unsupported as exc:
        result = Result(status="skipped", reason=str(exc))
    except UserError as exc:
        result = Result(status="error", reason=str(exc))
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM (terminal.Interrupted)
        return Result(status="error", reason=f"interrupted ({terminal.describe(exc)}) before the job finished"), ctx, exc
    except Exception as exc:  # a bug, not a user error: keep the traceback, record the job, let a sweep go on
        say(traceback.format_exc().rstrip(), error=True)
        result = Result(status="error", reason=f"internal error: {type(exc).__name__}: {exc}")
    return result, ctx, None


def _lead_with_headline(result: Result, mode: str, job: JobInfo, batch_size: int) -> dict[str, float]:
    """The headline line (a timed one says when other jobs shared the machine) and the headline metrics, put first in
    `result.metrics` so that MLflow lists them first; returns the headline metrics."""
    if result.summary and not result.headline:
        result.headline = result.summary[0]
    if job.shared_machine and modes()[mode].timed and result.headline:
        result.headline += " [timed while other jobs shared the machine]"
    head = headline_metrics(mode, result.metrics, result.status, batch_size)
    result.metrics = {**head, **result.metrics}
    return head


def _job_record(cfg: DictConfig, mode: str, job: JobInfo, result: Result, ctx: Context | None, started: float,
                interrupted: KeyboardInterrupt | None, head: dict[str, float], settings: dict) -> dict:
    """Everything result.json holds about the job besides its Result: what ran, on what, when, and tracking's state."""
    loaded = ctx.loaded_model if ctx is not None else None
    params = OmegaConf.to_container(cfg, resolve=True)
    params["tracking"] = tracking.public_settings(params.get("tracking") or {})
    return {
        "mode": mode, "run_name": run_name(mode, cfg, job.case, job.overrides), "job_id": job.job_id or uuid.uuid4().hex,
        "case": job.case, "overrides": [tracking.redact(o) for o in job.overrides], "device": str(cfg.device),
        "dtype": str(cfg.dtype), "precision_mode": str(cfg.precision_mode), "batch_size": cfg.batch_size,
        "seed": cfg.seed, "model": loaded.describe() if loaded is not None else _model_stub(cfg),
        "plan": _plan_record(cfg, ctx), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "start_time_ms": int(started * 1000),  # MLflow's run starts here, not when it is logged
        "duration_s": round(time.time() - started, 3), "environment": environment.summary(),
        "emulated": environment.emulated(str(cfg.device)),  # an emulated device (tests/emulated_npu.py), not a card
        "switches": environment.device_switches(),  # CPU fallback, jit compile, internal formats, visible devices
        "params": params, "interrupted": interrupted is not None, "headline_metrics": head, "launcher": job.launcher,
        "shared_machine": job.shared_machine, "expect": cfg.get("expect"),
        "expectation_met": None if cfg.get("expect") is None else result.status == cfg.get("expect"),
        "tracking": {"status": "pending", "reason": "not logged yet"} if settings["enabled"] else {"status": "off"},
    }


def _plan_record(cfg: DictConfig, ctx: Context | None) -> dict | None:
    """The plan the point ran: name, content hash, limits dtype and every part's dtype (its name alone where it was
    refused before it ran); None without one."""
    if plan_name(cfg) is None:
        return None
    resolved = ctx.__dict__.get("precision_plan") if ctx is not None else None
    return resolved.describe() if resolved is not None else {"name": plan_name(cfg), "hash": None}


def _track(result: Result, settings: dict, workdir: Path, path: Path, job: JobInfo) -> None:
    """Log the written result to MLflow (or leave it pending), record the outcome in result.json and say where it is."""
    outcome = ({"status": "pending", "reason": job.pending} if job.pending and settings["enabled"]
               else (job.tracker or tracking).log_job(settings, workdir))
    try:
        update_result(workdir, tracking=outcome)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        say(f"  ERROR: {disk_full_message(exc)}; result.json keeps its earlier tracking state", error=True)
        result.status, result.reason = "error", disk_full_message(exc)
    if outcome["status"] == "logged":
        say(f"  mlflow: run {outcome['run_id']} in {outcome['uri']}, experiment {outcome['experiment']!r}")
        if not job.sweep_dir:  # a sweep prints its runs' address at its end
            say(f"  UI: {tracking.ui_link(settings, outcome['experiment_id'], outcome['run_id'])}")
    elif outcome["status"] == "pending":
        say(f"warning: not in MLflow yet ({outcome['reason']}); result kept in {path}; "
            "`python run.py mode=sync` logs it later", error=True)
    result.tracking = outcome["status"]


# --- exit codes, the commands (a mode without a task: run.py calls app.<mode>(cfg, job folder)), the terminal


def exit_code(result: Result, expect: str | None = None) -> int:
    """0 passed/skipped (or the expected verdict), 1 failed (or a missed expectation), 2 error, 3 not in MLflow yet."""
    code = EXIT_CODES[result.status] if expect is None else int(result.status != expect)
    return code or (EXIT_PENDING if result.tracking == "pending" else 0)


def sync(cfg: DictConfig, out: Path) -> int:
    """`mode=sync`: log every pending result.json under mode.paths and end RUNNING runs no live process owns. Exit 0
    when all is in, 2 when a file was skipped (named on its own line), else 3 while some result stays pending."""
    settings = {**OmegaConf.to_container(cfg.tracking, resolve=True), "enabled": True}
    roots = [Path(p).expanduser() for p in cfg.mode.paths]
    counts = tracking.sync(settings, roots, say=lambda line: say(line, error=line.startswith("sync: skipped")))
    say(f"sync: {counts['seen']} pending result(s) under {', '.join(map(str, roots))}: {counts['logged']} logged, "
        f"{counts['pending']} still pending" + (f", {counts['skipped']} file(s) skipped" if counts["skipped"] else "")
        + (f"; {counts['closed']} orphaned RUNNING run(s) ended" if counts["closed"] else ""))
    if counts["skipped"]:
        return EXIT_CODES["error"]
    return EXIT_PENDING if counts["pending"] else 0


def rejudge(cfg: DictConfig, out: Path) -> int:
    """`mode=rejudge`: every result.json under mode.path, or every point of the port bundle there, judged again by the
    limits as composed now (rejudge.py), the policy never loaded, into `out` (summaries, report.html, changed.csv),
    logged as a new MLflow parent whose children name what they re-judge; the originals are never written. Exit: the
    worst re-judged verdict, 2 on a refusal."""
    from huggy_exp import rejudge as judge, sweep

    source = Path(cfg.mode.path).expanduser() if cfg.mode.path else None
    try:
        if source is None or not source.is_dir():
            raise UserError(f"mode.path={cfg.mode.path}: {'required' if source is None else 'no such folder'}: a sweep "
                            "folder (multirun/<date>/<time>), a job folder, a record job's folder or a port bundle")
        is_bundle = bundle.is_bundle(source)
        found = [] if is_bundle else sorted(source.rglob("result.json"), key=lambda p: (len(p.parts), str(p)))
        if not (found or is_bundle) or out.resolve().is_relative_to(source.resolve()):
            why = "holds this job folder" if found or is_bundle else "no result.json under it"
            raise UserError(f"mode.path={source}: {why}")
        table, specialize = (OmegaConf.to_container(cfg.verify[k], resolve=True) for k in ("limits", "specialize"))
        if is_bundle:
            b, rel_floor = bundle.read(source), cfg.verify.rel_floor
            points = [(None, *p) for p in judge.bundle_points(b, table, specialize, rel_floor)]
        else:
            points = [(path.parent, str(path.parent), record := read_result(path.parent),
                       judge.rejudge(record, table, specialize, str(path))) for path in found]
    except UserError as exc:
        say(f"error: {exc}", error=True)
        return EXIT_CODES["error"]
    settings = OmegaConf.to_container(cfg.tracking, resolve=True)
    info = tracking.start_sweep(settings, out, uuid.uuid4().hex[:12], sys.argv[1:])
    changed = [row for num, point in enumerate(points)
               if (row := _rejudged_point(out / str(num), num, *point, info, settings))]
    summary = sweep.summarize(out)
    flips = ", ".join(f"{c['run_name']} {c['was']} → {c['now']}" for c in changed) or "no verdict changed"
    said = f"re-judged {len(points)} result(s) of {source} by the limits as composed now: {flips}. "
    summary["line"] = said + summary["line"]
    summary["title"] = f"rejudge of {source.name} · {time.strftime('%m-%d %H:%M')}"
    summary["changed"] = changed
    write_table(out / "changed.csv", changed, ["point", "run_name", "was", "now", "why", "checks"])
    tracking.end_sweep(settings, out, summary, sweep.write_summary(out, summary, bool(cfg.plots)) + [out / "changed.csv"])
    say(summary["line"])
    for c in changed:
        say(f"  {c['run_name']}: {c['was']} → {c['now']}: {c['why']}")
    say(f"summary, report and changed.csv in {out}")
    return EXIT_CODES[max((p[3]["status"] for p in points), key=lambda s: (EXIT_CODES[s], s), default="passed")]


def _rejudged_point(point: Path, num: int, folder: Path | None, where: str, record: dict, verdict: dict, info: dict,
                    settings: dict) -> dict | None:
    """One re-judged point in `point` (a job's files copied, result.json with the new verdict, the limits it is now
    held to and the run, or the bundle and point key, it re-judges), logged under the new parent; the row of
    changed.csv when its verdict changed."""
    if folder is None:
        point.mkdir(parents=True)
    else:
        shutil.copytree(folder, point, ignore=shutil.ignore_patterns("result.json", "*.lock", ".hydra"))
    original = (record.get("tracking") or {}).get("run_id") if folder else None
    origin = {"from": str(folder or record["bundle"]), "run_id": original, "point": None if folder else where}
    limits = verdict.pop("limits")  # the re-judged figures are shown beside the limits they now meet or miss
    write_json(point / "result.json", {
        **record, "status": verdict["status"], "reason": verdict["reason"], "job_id": uuid.uuid4().hex,
        "metrics": (metrics := {**(record.get("metrics") or {}), **limits}),
        "headline_metrics": headline_metrics(record["mode"], metrics, verdict["status"], record.get("batch_size")),
        "rejudged": {**origin, "was": record["status"], **verdict},
        "tags": {**(record.get("tags") or {}), "rejudged_from": origin["from"], "rejudged_was": record["status"],
                 **({"rejudged_from_run_id": original} if original else {}),
                 **({} if folder else {"rejudged_point": where})},
        "sweep": {"dir": str(point.parent), "id": info["id"], "num": num, "parent_run_id": info.get("parent_run_id")},
        "tracking": {"status": "pending" if settings.get("enabled") else "off"}})
    if settings.get("enabled"):
        update_result(point, tracking=tracking.log_job(settings, point))
    if verdict["status"] == record["status"]:
        return None
    return {"point": where, "run_name": record["run_name"], "was": record["status"], "now": verdict["status"],
            "why": verdict["reason"] or "every re-judged check holds",
            "checks": "; ".join(f"{c['check']} {c['value']:.3g}: limit {c['was']:g} → {c['now']:g}" for c in verdict["changed"])}


def ui(cfg: DictConfig, out: Path) -> int:
    """`mode=ui`: MLflow's UI on the store, on a free loopback port, at the latest sweep's runs; Ctrl-C stops it."""
    from huggy_exp import ui as mlflow_ui

    settings = {**OmegaConf.to_container(cfg.tracking, resolve=True), "enabled": True}
    uri = tracking.store_uri(settings.get("uri"))
    try:
        latest = tracking.latest_sweep_url(settings)
        if uri.startswith(("http://", "https://")):
            print(f"tracking server {tracking.redact(uri)}: its UI is already there"
                  + (f"; latest sweep's runs: {latest}" if latest else ""))
            return 0
        return mlflow_ui.serve(uri, latest, settings["ui_port"], cfg.mode.wait_s)
    except (tracking.StoreDown, UserError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _model_stub(cfg: DictConfig) -> dict:
    """What the config asked for, when the model could not be (or was not) loaded."""
    m = cfg.model
    path = m.checkpoint or m.onnx or m.results_dir or m.hub_repo
    return {"source": "unloaded", "path": path, "sha256": None, "synthetic": path is None, "step": None, "onnx": None}


def _print_summary(record: dict, result: Result, path: Path) -> None:
    model = record["model"]
    label = "embedded synthetic default (not real Huggy weights)" if model["synthetic"] else model["path"]
    say(f"[{record['mode']}] {record['device']} {record['dtype']} batch {record['batch_size']} · model: {label}")
    for line in result.summary:
        say(f"  {line}")
    status = result.status.upper() + expectation(record) + (f": {result.reason}" if result.reason else "")
    say(f"  {status}", error=result.status == "error")
    say(f"  result: {path}")


def progress(sweep: dict, job: JobInfo, now: float) -> str:
    """`[3/50] case=bf16_extreme (elapsed 12 s)`: the point starting, how many the sweep has, time since it began."""
    total = sweep.get("jobs") or "?"
    what = " ".join(job.overrides) or "(defaults)"
    elapsed = now - float(sweep.get("started", now))
    return f"[{(job.num or 0) + 1}/{total}] {what} (elapsed {elapsed:.0f} s)"
