"""A single run's start-up: its config is composed once (Hydra's main composes it twice more), and it imports nothing
that the run does not use."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import yaml
from conftest import CONF, run_job, subprocess_env

from huggy_exp import preflight

REPO = CONF.parent


def load_run_py():
    spec = importlib.util.spec_from_file_location("run_cli", REPO / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_single_run_composes_its_config_once(tmp_path, monkeypatch):
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    calls = []
    original = ConfigLoaderImpl.load_configuration
    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    monkeypatch.setattr(sys, "argv", ["run.py"])
    job = tmp_path / "job"
    load_run_py().cli(["mode=info", "tracking=none", f"hydra.run.dir={job}"])
    assert len(calls) == 1
    record = json.loads((job / "result.json").read_text())
    assert record["status"] == "passed" and record["mode"] == "info"
    hydra_cfg = yaml.safe_load((job / ".hydra" / "hydra.yaml").read_text())["hydra"]
    assert hydra_cfg["mode"] == "RUN" and hydra_cfg["job"]["name"] == "run" and "hydra.mode=RUN" in hydra_cfg["overrides"]["hydra"]
    assert hydra_cfg["runtime"]["output_dir"] == str(job)
    assert yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) == ["mode=info", "tracking=none"]
    assert "[info]" in (job / "run.log").read_text()  # the job's own log, named after run.py as Hydra's main names it


@pytest.mark.parametrize("argv, single", [(["mode=action", "seed=3"], True), ([], True), (["-m", "seed=1,2"], False),
                                          (["--cfg", "job"], False), (["--config-dir", "x", "mode=info"], False)])
def test_only_plain_overrides_take_the_single_compose_path(argv, single):
    assert preflight.single_run(argv) is single


def test_a_single_action_run_imports_no_tracking_plotting_or_onnx_packages(tmp_path, huggy_exp_cache):
    from huggy_exp.mlagents.default import default_results_dir

    default_results_dir()  # the first run ever writes the embedded default (its .onnx too); every later run only reads it
    probe = ("import runpy, sys; sys.argv = ['run.py', 'mode=action', 'tracking=none', 'hydra.run.dir=" + str(tmp_path / "job")
             + "']\ntry:\n    runpy.run_path('" + str(REPO / "run.py") + "', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in ('mlflow', 'matplotlib', 'scipy', 'onnx', 'onnxruntime', 'pandas', 'sqlalchemy', 'ray') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(huggy_exp_cache), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_a_command_that_runs_no_policy_never_imports_torch(tmp_path, huggy_exp_cache):
    """mode=rejudge answers in under 5 s (issue 35): torch's import alone is 1.6 s idle (placement through preflight's
    device check, app's context, and the sweep summary's LoadGen answer through timing)."""
    job = run_job(tmp_path / "sweep" / "0", "precision", "dtype=fp16", "obs.rows=4", "plots=false")
    argv = ["run.py", "mode=rejudge", f"mode.path={job.workdir.parent}", "verify.limits.fp16.max_abs=1e-9",
            "tracking=none", "plots=false", f"hydra.run.dir={tmp_path / 'rejudged'}"]
    probe = (f"import runpy, sys; sys.argv = {argv!r}\ntry:\n    runpy.run_path({str(REPO / 'run.py')!r}, "
             "run_name='__main__')\nexcept SystemExit as exc:\n    print(exc.code)\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=subprocess_env(huggy_exp_cache),
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip().splitlines()[-2:] == ["1", "False"], out.stdout[-2000:] + out.stderr[-2000:]
    assert "passed → failed" in out.stdout


# --- MLflow beside the job: the helper process


def pending_job(tmp_path):
    job = run_job(tmp_path / "job", "info")
    record = json.loads((job.workdir / "result.json").read_text())
    record["tracking"] = {"status": "pending", "reason": "not logged yet"}
    (job.workdir / "result.json").write_text(json.dumps(record))
    return job.workdir, record


def test_the_helper_logs_the_job_as_log_job_would(tmp_path):
    from huggy_exp import tracking
    from huggy_exp.tracking_worker import Helper

    workdir, record = pending_job(tmp_path)
    settings = {"enabled": True, "uri": f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}", "experiment": "helper"}
    outcome = Helper.spawn().log_job(settings, workdir)
    assert outcome["status"] == "logged", outcome
    store = tracking.Store.open(settings)
    [run] = store.runs(f"tags.`huggy.job_id` = '{record['job_id']}'")
    assert run.info.run_id == outcome["run_id"] and run.data.tags["huggy.complete"] == "true"


def test_a_helper_that_died_leaves_the_logging_to_the_job(tmp_path):
    from huggy_exp.tracking_worker import Helper

    workdir, _ = pending_job(tmp_path)
    settings = {"enabled": True, "uri": f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}", "experiment": "helper"}
    dead = Helper(subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    assert dead.log_job(settings, workdir)["status"] == "logged"


def test_no_helper_where_mlflow_is_imported_and_an_idle_one_ends_at_once():
    import time

    import mlflow  # noqa: F401
    from huggy_exp.tracking_worker import Helper

    assert Helper.start() is None
    helper = Helper.spawn()
    started = time.perf_counter()
    helper.close()
    assert helper.proc.returncode is not None and time.perf_counter() - started < 3
