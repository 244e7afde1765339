"""The only module that imports mlflow. A tracking failure is a warning: result.json already holds everything."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
DEFAULT_EXPERIMENT = "huggy_exp"
MAX_PARAM_CHARS = 6000


def default_uri() -> str:
    return f"sqlite:///{REPO / 'mlruns' / 'mlflow.db'}"


def store_uri(uri: str | None) -> str:
    return uri or default_uri()


def artifact_root(uri: str) -> str | None:
    """Artifacts live beside a SQLite store (mlruns/ by default); a server chooses its own."""
    if uri.startswith("sqlite:///"):
        return Path(uri[len("sqlite:///") :]).parent.as_uri()
    return None


def _prepare_store(uri: str) -> None:
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    elif urlparse(uri).scheme in ("", "file"):
        raise ValueError(f"tracking.uri={uri!r}: MLflow 3 needs a database or server store, e.g. sqlite:///path/mlflow.db")


def ensure_experiment(uri: str, name: str) -> str:
    """Create the experiment once (call before parallel jobs start: SQLite races on creation)."""
    mlflow = _mlflow()
    from mlflow.exceptions import MlflowException

    _prepare_store(uri)
    client = mlflow.MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_root(uri))
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = str(value)[:MAX_PARAM_CHARS]
    return flat


def record(settings: dict, run_name: str, params: dict, record: dict, metrics: dict, tags: dict, workdir: Path,
           artifacts: list[Path], series: dict | None = None) -> str | None:
    """One MLflow run per job; returns a line saying where it went, or None when tracking is off."""
    if not settings.get("enabled", True):
        return None
    uri = store_uri(settings.get("uri"))
    http_limits(settings)
    try:
        return _log(uri, settings.get("experiment") or DEFAULT_EXPERIMENT, run_name, params, record, metrics, tags, artifacts,
                    series)
    except Exception as exc:  # tracking is best effort; the job's result is already on disk
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"warning: MLflow tracking failed ({type(exc).__name__}: {first}); result kept in {workdir / 'result.json'}",
              file=sys.stderr)
        return None


def http_limits(settings: dict) -> None:
    """Bound MLflow's HTTP retries: its defaults wait about 4 minutes on a server that is down.

    Variables already set in the environment win; the config supplies the rest.
    """
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", str(int(settings.get("http_retries", 2))))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(settings.get("http_timeout_s", 10))))


def _mlflow():
    """Import mlflow (1.4 s, so only here) with its INFO chatter about database migrations silenced."""
    import logging

    import mlflow

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return mlflow


def series_metrics(series: dict, stamp: int) -> list:
    """Stepped metrics (name -> [(step, value)], e.g. latency against batch size) as MLflow Metric entries."""
    from mlflow.entities import Metric

    return [Metric(name, float(value), stamp, int(step)) for name, points in series.items() for step, value in points
            if isinstance(value, (int, float)) and math.isfinite(float(value))]


def _log(uri, experiment, run_name, params, record, metrics, tags, artifacts, series=None) -> str:
    mlflow = _mlflow()

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(uri, experiment)
    run = client.create_run(experiment_id, run_name=run_name, tags={k: str(v)[:5000] for k, v in tags.items()})
    run_id = run.info.run_id
    try:
        from mlflow.entities import Metric, Param

        stamp = int(run.info.start_time)
        items = [Param(k, v) for k, v in flatten(params).items()]
        finite = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}
        entries = [Metric(k, v, stamp, 0) for k, v in finite.items()] + series_metrics(series or {}, stamp)
        for i in range(0, max(len(items), len(entries)), 100):
            client.log_batch(run_id, metrics=entries[i : i + 100], params=items[i : i + 100])
        for path in artifacts:
            if path.is_file():
                client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, "FAILED" if record.get("status") == "error" else "FINISHED")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return f"mlflow: run {run_id} ({run_name}) in {uri}, experiment {experiment!r}"
