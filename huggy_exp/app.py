"""One job end to end: config -> context -> task -> Result -> result.json + MLflow. Nothing flows back up."""

from __future__ import annotations

import platform
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from huggy_exp import tracking
from huggy_exp.config import validate
from huggy_exp.context import Context, ModelSpec, ObsSpec
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.results import EXIT_CODES, EXIT_PENDING, Result, update_result, write_result


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, str]:
    """Versions without importing the heavy packages (importlib.metadata only)."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node()}
    for dist in ("torch", "torch_npu", "onnxruntime", "onnx", "numpy", "hydra-core", "mlflow"):
        env[dist.replace("-", "_")] = _version(dist)
    return env


def build_context(cfg: DictConfig, workdir: Path) -> Context:
    model = OmegaConf.to_container(cfg.model, resolve=True)
    obs = OmegaConf.to_container(cfg.obs, resolve=True)
    return Context(
        device=str(cfg.device),
        dtype=str(cfg.dtype),
        batch_size=int(cfg.batch_size),
        seed=int(cfg.seed),
        backend=str(cfg.backend),
        threads=int(cfg.threads),
        model_spec=ModelSpec(**{k: model.get(k) for k in ModelSpec.__dataclass_fields__}),
        obs=ObsSpec(**{k: obs[k] for k in ObsSpec.__dataclass_fields__ if k in obs}),
        workdir=workdir,
    )


@dataclass(frozen=True)
class JobInfo:
    """Where a job sits: its sweep (dir, id, number) in a multirun, and the overrides that made it."""

    overrides: tuple[str, ...] = ()
    case: str | None = None
    sweep_dir: Path | None = None
    num: int | None = None


def run_name(mode: str, cfg: DictConfig, case: str | None = None) -> str:
    """What is special about the job first: the case, then mode, device, dtype, batch, and obs when not random."""
    name = f"{mode}-{cfg.device}-{cfg.dtype}-b{cfg.batch_size}"
    source = (cfg.get("obs") or {}).get("source")
    if source and source != "random":
        name += f"-{source}"
    return f"{case}:{name}" if case else name


def execute(cfg: DictConfig, workdir: Path, mode: str, job: JobInfo | None = None) -> Result:
    """Run the mode's task; user errors and unavailable devices become results, never tracebacks.

    result.json is written before MLflow is touched (tracking `pending`), then updated with the outcome; Ctrl-C
    during the task is recorded (status error, `interrupted`) and then re-raised so a sweep stops.
    """
    job = job or JobInfo()
    started = time.time()
    ctx = None
    interrupted = False
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        validate(cfg, mode)
        ctx = build_context(cfg, workdir)
        task = _instantiate(cfg.mode)
        result = task.run(ctx)
        result.check_finite()
    except Unsupported as exc:
        result = Result(status="skipped", reason=str(exc))
    except UserError as exc:
        result = Result(status="error", reason=str(exc))
    except KeyboardInterrupt:
        interrupted = True
        result = Result(status="error", reason="interrupted (Ctrl-C) before the job finished")
    except Exception as exc:  # a bug, not a user error: keep the traceback, record the job, let a sweep go on
        traceback.print_exc()
        result = Result(status="error", reason=f"internal error: {type(exc).__name__}: {exc}")
    if result.summary and "headline" not in result.details:
        result.details["headline"] = result.summary[0]  # one line for sweep summaries and result.json readers
    loaded = ctx.loaded_model if ctx is not None else None
    model = loaded.describe() if loaded is not None else _model_stub(cfg)
    settings = OmegaConf.to_container(cfg.tracking, resolve=True)
    record = {
        "mode": mode,
        "run_name": run_name(mode, cfg, job.case),
        "job_id": uuid.uuid4().hex,
        "case": job.case,
        "overrides": list(job.overrides),
        "device": str(cfg.device),
        "dtype": str(cfg.dtype),
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "model": model,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 3),
        "environment": environment(),
        "params": OmegaConf.to_container(cfg, resolve=True),
        "interrupted": interrupted,
        "expect": cfg.get("expect"),
        "expectation_met": None if cfg.get("expect") is None else result.status == cfg.get("expect"),
        "tracking": {"status": "pending", "reason": "not logged yet"} if settings.get("enabled", True) else {"status": "off"},
    }
    if job.sweep_dir is not None:
        sweep = tracking.read_sweep(job.sweep_dir) or {}
        record["sweep"] = {"dir": str(job.sweep_dir), "id": sweep.get("id"), "num": job.num,
                           "parent_run_id": sweep.get("parent_run_id")}
    path = write_result(workdir, record, result)
    _print_summary(record, result, path)
    if interrupted:
        update_result(workdir, tracking={"status": "pending", "reason": "interrupted: `python run.py mode=sync` logs it"})
        raise KeyboardInterrupt
    outcome = tracking.log_job(settings, workdir)
    update_result(workdir, tracking=outcome)
    if outcome["status"] == "logged":
        print(f"  mlflow: run {outcome['run_id']} in {outcome['uri']}, experiment {outcome['experiment']!r}")
    elif outcome["status"] == "pending":
        print(f"warning: not in MLflow yet ({outcome['reason']}); result kept in {path}; "
              "`python run.py mode=sync` logs it later", file=sys.stderr)
    result.tracking = outcome["status"]
    return result


def exit_code(result: Result, expect: str | None = None) -> int:
    """0 passed/skipped (or the expected verdict), 1 failed (or a missed expectation), 2 error, 3 not in MLflow yet."""
    if expect is not None:
        code = 0 if result.status == expect else 1
    else:
        code = EXIT_CODES[result.status]
    return code or (EXIT_PENDING if result.tracking == "pending" else 0)


def sync(cfg: DictConfig) -> int:
    """`mode=sync`: log every pending result.json under mode.paths; exit 0 when none is left pending, else 3."""
    settings = {**OmegaConf.to_container(cfg.tracking, resolve=True), "enabled": True}
    roots = [Path(p).expanduser() for p in cfg.mode.paths]
    counts = tracking.sync(settings, roots)
    print(f"sync: {counts['seen']} pending result(s) under {', '.join(map(str, roots))}: {counts['logged']} logged, "
          f"{counts['pending']} still pending")
    return EXIT_PENDING if counts["pending"] else 0


def _instantiate(mode_cfg: DictConfig):
    """Hydra wraps errors raised in a task's __init__; a UserError there is still the user's, not a bug."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(mode_cfg)
    except InstantiationException as exc:
        if isinstance(exc.__cause__, UserError):
            raise exc.__cause__ from None
        raise


def _model_stub(cfg: DictConfig) -> dict:
    """What the config asked for, when the model could not be (or was not) loaded."""
    m = cfg.model
    path = m.checkpoint or m.onnx or m.results_dir or m.hub_repo
    return {"source": "unloaded", "path": path, "sha256": None, "synthetic": path is None, "step": None, "onnx": None}


def _print_summary(record: dict, result: Result, path: Path) -> None:
    model = record["model"]
    label = "embedded synthetic default (not real Huggy weights)" if model["synthetic"] else model["path"]
    head = f"[{record['mode']}] {record['device']} {record['dtype']} batch {record['batch_size']} · model: {label}"
    stream = sys.stderr if result.status == "error" else sys.stdout
    print(head)
    for line in result.summary:
        print(f"  {line}")
    status = result.status.upper() + (f": {result.reason}" if result.reason else "")
    print(f"  {status}", file=stream)
    print(f"  result: {path}")
