"""One job end to end: config -> context -> task -> Result -> result.json + MLflow. Nothing flows back up."""

from __future__ import annotations

import platform
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from huggy_exp import tracking
from huggy_exp.context import Context, ModelSpec, ObsSpec
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.results import Result, write_result


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


def _number(value, key: str, kind=int, optional: bool = False):
    """Command-line values arrive untyped: `seed=abc` is the user's error, named, not a ValueError."""
    if value is None and optional:
        return None
    try:
        if isinstance(value, bool) or (kind is int and float(value) != int(float(value))):
            raise ValueError
        return kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}") from None


def build_context(cfg: DictConfig, workdir: Path) -> Context:
    model = OmegaConf.to_container(cfg.model, resolve=True)
    obs = OmegaConf.to_container(cfg.obs, resolve=True)
    model["step"] = _number(model.get("step"), "model.step", optional=True)
    obs["rows"], obs["scale"] = _number(obs.get("rows"), "obs.rows"), _number(obs.get("scale"), "obs.scale", float)
    return Context(
        device=str(cfg.device),
        dtype=str(cfg.dtype),
        batch_size=_number(cfg.batch_size, "batch_size"),
        seed=_number(cfg.seed, "seed"),
        backend=str(cfg.get("backend", "eager")),
        threads=_number(cfg.get("threads", 1), "threads"),
        model_spec=ModelSpec(**{k: model.get(k) for k in ModelSpec.__dataclass_fields__}),
        obs=ObsSpec(**{k: obs[k] for k in ObsSpec.__dataclass_fields__ if k in obs}),
        workdir=workdir,
    )


def run_name(mode: str, cfg: DictConfig) -> str:
    return f"{mode}-{cfg.device}-{cfg.dtype}-b{cfg.batch_size}"


def execute(cfg: DictConfig, workdir: Path, mode: str) -> Result:
    """Run the mode's task; user errors and unavailable devices become results, never tracebacks."""
    started = time.time()
    ctx = None
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        ctx = build_context(cfg, workdir)
        task = _instantiate(cfg.mode)
        result = task.run(ctx)
    except Unsupported as exc:
        result = Result(status="skipped", reason=str(exc))
    except UserError as exc:
        result = Result(status="error", reason=str(exc))
    except Exception as exc:  # a bug, not a user error: keep the traceback, record the job, let a sweep go on
        traceback.print_exc()
        result = Result(status="error", reason=f"internal error: {type(exc).__name__}: {exc}")
    if result.summary and "headline" not in result.details:
        result.details["headline"] = result.summary[0]  # one line for sweep summaries and result.json readers
    loaded = ctx.loaded_model if ctx is not None else None
    model = loaded.describe() if loaded is not None else _model_stub(cfg)
    name = run_name(mode, cfg)
    record = {
        "mode": mode,
        "run_name": name,
        "device": str(cfg.device),
        "dtype": str(cfg.dtype),
        "batch_size": cfg.batch_size,
        "seed": cfg.seed,
        "model": model,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 3),
        "environment": environment(),
    }
    path = write_result(workdir, record, result)
    _print_summary(record, result, path)
    tags = {
        **{f"env.{k}": v for k, v in record["environment"].items()},
        "mode": mode, "device": record["device"], "dtype": record["dtype"], "status": result.status,
        "reason": result.reason, "synthetic": str(model["synthetic"]).lower(), "model.sha256": str(model["sha256"]),
        **result.tags,
    }
    artifacts = [path, *(workdir / f"{n}.npy" for n in result.arrays), *(workdir / f"{n}.csv" for n in result.tables),
                 *(workdir / f for f in result.files), workdir / ".hydra" / "config.yaml"]
    params = OmegaConf.to_container(cfg, resolve=True)
    where = tracking.record(OmegaConf.to_container(cfg.tracking, resolve=True), name, params, record,
                            result.metrics, tags, workdir, artifacts, result.series)
    if where:
        print(f"  {where}")
    return result


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
