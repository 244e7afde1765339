"""The Hydra runner end to end: every mode composes, execute() writes result.json and tracks to MLflow, run.py's CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    CONF,
    HUGGY_PT,
    PYTHON,
    REFERENCE,
    REPO,
    SHARED,
    compose_config,
    job_context,
    run_job,
    subprocess_env,
)
from huggy_exp import config

MODES = sorted(p.stem for p in CONF.glob("mode/*.yaml") if config.modes()[p.stem].is_task())  # sync, ui: not tasks
CORE_MODES = ("info", "checkpoints", "action", "sample", "batch")
COMMON_KEYS = ("mode", "run_name", "device", "dtype", "batch_size", "seed", "model", "status", "reason", "metrics",
               "started", "duration_s", "environment")


def _npu_present() -> bool:
    return hasattr(torch, "npu")


# --- composition


def test_core_modes_are_present():
    assert set(CORE_MODES) <= set(MODES)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_composes_and_instantiates(mode):
    from huggy_exp.app import make_task
    from huggy_exp.config import modes

    cfg = compose_config([f"mode={mode}", "tracking=none"])
    assert cfg.mode._target_.startswith("huggy_exp.tasks.")
    task = make_task(cfg.mode)
    assert callable(getattr(task, "run", None))
    assert type(task.mode) is modes()[mode]  # the task holds its mode's schema object, not loose knobs
    assert {"device", "dtype", "batch_size", "seed", "model", "obs", "tracking"} <= set(cfg)


def test_every_mode_without_a_task_is_a_command_of_app_taking_the_config_and_job_folder():
    """run.py runs a mode whose `_target_` is null as `app.<mode>(cfg, job folder)`: each has one, with that shape."""
    import inspect

    from huggy_exp import app

    commands = [name for name, schema in config.modes().items() if not schema.is_task()]
    assert {"sync", "ui", "rejudge"} <= set(commands)
    for name in commands:
        assert list(inspect.signature(getattr(app, name)).parameters) == ["cfg", "out"], name


def test_a_context_holds_the_schemas_own_objects(tmp_path):
    from huggy_exp.config import ModelConf, ObsConf, VerifyConf

    ctx = job_context(tmp_path, "obs.rows=8", "verify.limits.bf16.max_abs=0.25")
    assert (type(ctx.model_spec), type(ctx.obs), type(ctx.verify)) == (ModelConf, ObsConf, VerifyConf)
    assert ctx.obs.rows == 8 and ctx.limits("bf16").atol == 0.25  # the composed values, read as they are


def test_default_config_is_action_on_cpu_fp32_with_mlflow_tracking():
    cfg = compose_config()
    assert cfg.mode._target_ == "huggy_exp.tasks.action.ActionTask"
    assert (cfg.device, cfg.dtype, cfg.batch_size, cfg.seed) == ("cpu", "fp32", 64, 0)
    assert cfg.tracking.enabled is True
    assert all(v is None for v in cfg.model.values())


# --- execute(), in-process


def _assert_common_record(record: dict, mode: str, status: str):
    missing = [k for k in COMMON_KEYS if k not in record]
    assert not missing, f"result.json lacks {missing}"
    assert record["mode"] == mode and record["status"] == status
    assert {"source", "path", "sha256", "synthetic"} <= set(record["model"])


def test_info_on_embedded_default(tmp_path):
    job = run_job(tmp_path, "info")
    r = job.record
    _assert_common_record(r, "info", "passed")
    assert r["model"]["synthetic"] is True and r["model"]["source"] == "embedded"
    assert r["metrics"]["parameters"] == 566_805
    assert r["details"]["policy"]["obs_dim"] == 59 and r["details"]["policy"]["act_dim"] == 21 and r["details"]["policy"]["num_layers"] == 3
    assert r["details"]["normalizer"]["fp16_overflow_dims"] > 0
    assert r["details"]["devices"]["cpu"] == 1


def _find_file_entries(tree, found=None) -> list[dict]:
    """Every dict in result.json that describes a file by bytes and sha256."""
    found = [] if found is None else found
    if isinstance(tree, dict):
        if "bytes" in tree and "sha256" in tree:
            found.append(tree)
        for value in tree.values():
            _find_file_entries(value, found)
    elif isinstance(tree, list):
        for value in tree:
            _find_file_entries(value, found)
    return found


def test_info_records_file_sizes_and_sha256_in_result_json(tmp_path, huggy_pt):
    # conf/mode/info.yaml promises "file sizes and sha256"; they must reach result.json, not only the console
    r = run_job(tmp_path, "info", f"model.checkpoint={huggy_pt}").record
    assert r["status"] == "passed"
    entry = next((e for e in _find_file_entries(r) if e["sha256"] == r["model"]["sha256"]), None)
    assert entry is not None, f"no file entry for {huggy_pt} in result.json (top-level 'files' is {r.get('files')!r})"
    assert entry["bytes"] == huggy_pt.stat().st_size


def test_info_on_a_checkpoint_without_normalizer(tmp_path, checkpoint_files):
    r = run_job(tmp_path, "info", f"model.checkpoint={checkpoint_files['3dball']}").record
    assert r["status"] == "passed" and r["model"]["synthetic"] is False
    assert r["details"]["normalizer"] is None
    assert (r["details"]["policy"]["obs_dim"], r["details"]["policy"]["act_dim"], r["details"]["policy"]["hidden_units"]) == (8, 2, 128)


def test_checkpoints_lists_a_results_folder(tmp_path, results_folder):
    job = run_job(tmp_path, "checkpoints", f"model.results_dir={results_folder}")
    r = job.record
    _assert_common_record(r, "checkpoints", "passed")
    assert r["metrics"]["checkpoints"] == 3 and r["metrics"]["present"] == 2 and r["metrics"]["best_reward"] == 2.5
    assert [c["step"] for c in r["details"]["checkpoints"]] == [100, 200, 300]
    assert (tmp_path / "checkpoints.csv").read_text().count("\n") == 4
    # with a results folder as the model source, the newest present .pt is the model
    r = run_job(tmp_path / "action", "action", f"model.results_dir={results_folder}", "obs.rows=4").record
    assert r["status"] == "passed" and r["model"]["path"].endswith("Huggy-200.pt") and r["model"]["step"] == 200


def test_action_on_own_checkpoint_matches_numpy_reference(tmp_path, huggy_pt, huggy_actor):
    obs = huggy_actor.in_distribution_obs(24, seed=9)
    np.save(tmp_path / "in.npy", obs)
    job = run_job(tmp_path / "job", "action", f"model.checkpoint={huggy_pt}", "obs.source=file",
                  f"obs.path={tmp_path / 'in.npy'}", "batch_size=5")
    _assert_common_record(job.record, "action", "passed")
    actions = np.load(job.workdir / "actions.npy")
    assert actions.dtype == np.float32 and actions.shape == (24, 21)
    np.testing.assert_allclose(actions, huggy_actor.actions(obs), atol=1e-5, rtol=0)
    np.testing.assert_array_equal(np.load(job.workdir / "obs.npy"), obs)
    assert job.record["model"]["path"] == str(huggy_pt) and job.record["model"]["synthetic"] is False


def test_sample_same_seed_gives_identical_actions_file(tmp_path):
    a = run_job(tmp_path / "a", "sample", "seed=3", "obs.rows=16")
    b = run_job(tmp_path / "b", "sample", "seed=3", "obs.rows=16")
    c = run_job(tmp_path / "c", "sample", "seed=4", "obs.rows=16")
    assert a.record["status"] == "passed"
    assert (a.workdir / "actions.npy").read_bytes() == (b.workdir / "actions.npy").read_bytes()
    assert a.record["tags"]["fingerprint"] == b.record["tags"]["fingerprint"] != c.record["tags"]["fingerprint"]


def test_batch_reports_invariance_and_common_fields(tmp_path):
    job = run_job(tmp_path, "batch", "obs.rows=16", "batch_size=4", "mode.budget_s=0.05", "seed=2")
    r = job.record
    _assert_common_record(r, "batch", "passed")
    assert (r["device"], r["dtype"], r["batch_size"], r["seed"]) == ("cpu", "fp32", 4, 2)
    assert r["model"]["synthetic"] is True and len(r["model"]["sha256"]) == 64
    assert r["reason"] == ""
    assert r["metrics"]["rows"] == 16 and r["metrics"]["batch_invariance_max_abs"] <= 1e-5
    assert r["metrics"]["batched_rows_per_s"] > 0
    assert r["arrays"] == {"actions": "actions.npy"} and (tmp_path / "batch_invariance.csv").is_file()


def test_batch_fails_when_invariance_exceeds_tolerance(tmp_path):
    r = run_job(tmp_path, "batch", "obs.rows=16", "batch_size=8", "mode.budget_s=0.05", "verify.limits.fp32.batch_max_abs=0").record
    assert r["status"] == "failed" and "batch invariance" in r["reason"]


def test_npu_device_is_skipped_with_a_reason(tmp_path):
    if _npu_present():
        pytest.skip("torch_npu is installed here")
    job = run_job(tmp_path, "action", "device=npu:0")
    r = job.record
    _assert_common_record(r, "action", "skipped")
    assert "torch_npu" in r["reason"] and r["device"] == "npu:0"
    assert not (tmp_path / "actions.npy").exists()


# --- MLflow tracking


def _mlflow_client(uri: str):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def test_tracking_creates_an_mlflow_run_with_params_metrics_tags_and_result_artifact(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    job = run_job(tmp_path / "job", "action", "obs.rows=8", tracking=uri)
    assert job.record["status"] == "passed"
    client = _mlflow_client(uri)
    experiment = client.get_experiment_by_name("huggy_exp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "action-cpu-fp32-b64" and run.info.status == "FINISHED"
    assert run.data.params["device"] == "cpu" and run.data.params["obs.rows"] == "8"
    assert run.data.params["mode"] == "action" and "mode._target_" not in run.data.params  # plumbing is not a setting
    assert run.data.metrics["answer/act_mean"] == job.record["headline_metrics"]["act_mean"]  # result.json's value
    assert run.data.metrics["answer/passed"] == 1.0 and "rows" not in run.data.metrics  # the detail: in metrics.csv
    table = Path(client.download_artifacts(run.info.run_id, "metrics.csv", str(tmp_path / "dl"))).read_text()
    assert "rows,,8.0\n" in table and "action_mean," in table
    tags = run.data.tags
    assert tags["mode"] == "action" and tags["status"] == "passed" and tags["synthetic"] == "true"
    assert tags["model.sha256"] == job.record["model"]["sha256"]
    assert tags["fingerprint"] == job.record["tags"]["fingerprint"] and len(tags["fingerprint"]) == 64
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "actions.npy", "obs.npy"} <= artifacts
    local = client.download_artifacts(run.info.run_id, "result.json", str(tmp_path))
    assert json.loads(Path(local).read_text()) == job.record


def _chart_section(key: str) -> str:
    """The chart section MLflow's run page puts a metric in: its name up to the last `/` ("" for none)."""
    return key.rsplit("/", 1)[0] if "/" in key else ""


def test_a_precision_run_logs_the_answer_first_and_at_most_twenty_metrics(tmp_path):
    from huggy_exp import headline

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    job = run_job(tmp_path / "job", "precision", "obs.rows=4", "dtype=bf16", tracking=uri)
    run = _mlflow_client(uri).get_run(job.record["tracking"]["run_id"])
    metrics = run.data.metrics
    assert len(job.record["metrics"]) > 100 and len(metrics) <= headline.MAX_LOGGED
    assert metrics["answer/max_abs"] == job.record["headline_metrics"]["max_abs_vs_fp64"]  # result.json's value
    assert metrics["vs_fp64/actions/max_abs_limit"] == job.record["metrics"]["actions/vs_fp64/max_abs_limit"]
    assert {"answer/cosine", "answer/p50_us", "answer/p99_us", "vs_fp64/actions/cosine_min_row"} <= set(metrics)
    # MLflow's run page: one chart section per prefix, sorted by name (locale order: case-insensitive)
    sections = {_chart_section(k) for k in metrics}
    assert min(sections, key=str.casefold) == "answer" and "" not in sections
    # no per-dtype key: runs of fp32 and bf16 compare row for row
    assert not [k for k in run.data.params if ".bf16" in k] and run.data.params["limit/max_abs"]


def test_a_failed_point_is_failed_in_mlflow_with_the_jobs_own_start_and_end(tmp_path):
    from huggy_exp import tracking
    from huggy_exp.results import update_result

    job = run_job(tmp_path / "job", "action", "obs.rows=4")
    update_result(tmp_path / "job", status="failed", reason="over its limit", tracking={"status": "pending", "reason": "x"})
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    outcome = tracking.log_job({"uri": uri}, tmp_path / "job")
    run = _mlflow_client(uri).get_run(outcome["run_id"])
    assert run.info.status == "FAILED" and run.data.tags["verdict"] == "failed: over its limit"
    # the run spans the job, not the logging that came after it
    assert run.info.start_time == job.record["start_time_ms"]
    assert run.info.end_time - run.info.start_time == pytest.approx(job.record["duration_s"] * 1000, abs=2)
    assert tracking.run_status({"status": "error", "interrupted": True}) == "KILLED"


def test_a_job_with_more_params_than_one_mlflow_batch_takes_gets_every_one(tmp_path):
    """MLflow takes at most 100 params per request: a job's run still holds all of them, and its metrics."""
    from huggy_exp import tracking
    from huggy_exp.results import read_result, update_result

    job = run_job(tmp_path / "job", "action", "obs.rows=4")
    extra = {f"k{i:03d}": i for i in range(250)}
    update_result(tmp_path / "job", params={**read_result(tmp_path / "job")["params"], "extra": extra},
                  tracking={"status": "pending", "reason": "x"})
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    run = _mlflow_client(uri).get_run(tracking.log_job({"uri": uri}, tmp_path / "job")["run_id"])
    assert {f"extra.{k}": str(v) for k, v in extra.items()}.items() <= run.data.params.items()
    assert set(job.record["headline_metrics"]) and len(run.data.metrics) >= len(job.record["headline_metrics"])


def _benchmark_record(backends: tuple[str, ...], scenarios: tuple[str, ...]) -> dict:
    from huggy_exp import headline

    metrics = {"actions/vs_fp64/max_abs": 1e-7, "actions/vs_fp64/max_abs_limit": 1e-5,
               "actions/vs_fp64/cosine_min_row": 0.99999968, "actions/vs_fp64/cosine_min_row_limit": 0.99999,
               "control_loop/miss_rate": 0.0, "control_loop/miss_rate_upper": 0.004, "control_loop/ticks": 1000.0}
    for backend, p50 in (("eager", 400.0), ("compile", 300.0), ("fused", 90.0), ("onnxruntime", 120.0)):
        for batch in (1, 64):
            if backend in backends:
                metrics.update({f"{backend}/b{batch}/p50_us": p50 * batch, f"{backend}/b{batch}/p99_us": 2 * p50 * batch,
                                f"{backend}/b{batch}/obs_per_s": 1e6 / p50})
    for scenario in scenarios:
        metrics.update({f"loadgen/{scenario}/valid": 1.0, f"loadgen/{scenario}/p90_us": 100.0,
                        f"loadgen/{scenario}/p99_us": 200.0, f"loadgen/{scenario}/samples_per_s": 5e3})
    record = {"mode": "benchmark", "status": "passed", "batch_size": 64, "metrics": metrics}
    return {**record, "headline_metrics": headline.headline_metrics("benchmark", metrics, "passed", 64)}


def test_a_benchmark_logs_each_backend_and_scenario_at_its_batch_within_twenty_metrics():
    from huggy_exp import headline

    logged = headline.logged_metrics(_benchmark_record(("eager", "fused"), ("single_stream", "server")))
    assert len(logged) <= headline.MAX_LOGGED
    assert logged["best/p50_us"] == 90.0 * 64 and logged["eager/p50_us"] == 400.0 * 64  # at the job's batch
    assert {"fused/obs_per_s", "answer/server_valid", "loadgen/server/p99_us", "loadgen/single_stream/p90_us",
            "control_loop/miss_rate_upper", "vs_fp64/actions/max_abs_limit"} <= set(logged)
    assert min({_chart_section(k) for k in logged}, key=str.casefold) == "answer"
    # every backend and scenario at once: still at most twenty, the answer and every backend first
    everything = headline.logged_metrics(_benchmark_record(("eager", "compile", "fused", "onnxruntime"),
                                                           ("single_stream", "multi_stream", "offline", "server")))
    assert len(everything) == headline.MAX_LOGGED and {"compile/p50_us", "onnxruntime/obs_per_s"} <= set(everything)
    assert list(everything)[0] == "answer/passed"


def test_tracking_failure_keeps_result_json_pending_and_warns(tmp_path, capsys):
    started = time.monotonic()
    job = run_job(tmp_path, "info", tracking="sqlite:////proc/nope/mlflow.db")
    assert time.monotonic() - started < 10  # found by the probe, not by MLflow's retries
    err = capsys.readouterr().err
    assert job.record["status"] == "passed" and (tmp_path / "result.json").is_file()
    assert job.record["tracking"]["status"] == "pending" and "/proc/nope" in job.record["tracking"]["reason"]
    assert "not in MLflow yet" in err and str(tmp_path / "result.json") in err and "mode=sync" in err


# --- bad inputs, in-process: every one is a recorded error naming the value, never a traceback


class _Payload:
    """Unpickling this runs a shell command (what a malicious .pt would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def write_evil_pt(path: Path, marker: Path) -> Path:
    torch.save({"Policy": _Payload(marker), "global_step": {"_GlobalSteps__global_step": torch.tensor([1])}}, path)
    return path


def test_evil_checkpoint_payload_is_armed(tmp_path):
    # the payload does run when unpickled without weights_only: the refusal test below is meaningful
    marker = tmp_path / "ARMED"
    torch.load(write_evil_pt(tmp_path / "armed.pt", marker), weights_only=False)
    assert marker.exists()


def _bad(tmp_path: Path, name: str, huggy_pt: Path):
    """(overrides, text the reason must contain) for each bad input."""
    if name == "missing file":
        p = tmp_path / "absent.pt"
        return [f"model.checkpoint={p}"], str(p)
    if name == "empty pt":
        p = tmp_path / "empty.pt"
        p.write_bytes(b"")
        return [f"model.checkpoint={p}"], str(p)
    if name == "truncated pt":
        p = tmp_path / "truncated.pt"
        p.write_bytes(huggy_pt.read_bytes()[: huggy_pt.stat().st_size // 2])
        return [f"model.checkpoint={p}"], str(p)
    if name == "other structure":
        p = tmp_path / "list.pt"
        torch.save([torch.zeros(3), torch.ones(2)], p)
        return [f"model.checkpoint={p}"], str(p)
    if name == "missing onnx":
        p = tmp_path / "absent.onnx"
        return [f"model.onnx={p}"], str(p)
    if name == "wrong obs width":
        p = tmp_path / "narrow.npy"
        np.save(p, np.zeros((4, 58), np.float32))
        return ["obs.source=file", f"obs.path={p}"], "58"
    if name == "unknown dtype":
        return ["dtype=fp8"], "fp8"
    if name == "unknown device":
        return ["device=tpu"], "tpu"
    if name == "zero batch size":
        return ["batch_size=0"], "batch_size"
    raise AssertionError(name)


BAD_INPUTS = ["missing file", "empty pt", "truncated pt", "other structure", "missing onnx", "wrong obs width",
              "unknown dtype", "unknown device", "zero batch size"]


@pytest.mark.parametrize("name", BAD_INPUTS)
def test_bad_input_is_a_recorded_error_naming_the_value(name, tmp_path, huggy_pt, capsys):
    overrides, needle = _bad(tmp_path, name, huggy_pt)
    job = run_job(tmp_path / "job", "action", *overrides)
    r = job.record
    assert r["status"] == "error"
    assert needle in r["reason"]
    assert not r["reason"].startswith("internal error")
    assert "Traceback" not in capsys.readouterr().err


def test_wrong_observation_width_names_expected_and_actual(tmp_path):
    np.save(tmp_path / "narrow.npy", np.zeros((4, 58), np.float32))
    r = run_job(tmp_path / "job", "action", "obs.source=file", f"obs.path={tmp_path / 'narrow.npy'}").record
    assert r["status"] == "error" and "[N, 59]" in r["reason"] and "[4, 58]" in r["reason"]


def test_pickled_checkpoint_is_refused_without_running_its_code(tmp_path, capsys):
    marker = tmp_path / "PWNED"
    evil = write_evil_pt(tmp_path / "evil.pt", marker)
    r = run_job(tmp_path / "job", "info", f"model.checkpoint={evil}").record
    assert r["status"] == "error" and str(evil) in r["reason"] and "refused" in r["reason"]
    assert r["model"]["source"] == "unloaded" and r["model"]["path"] == str(evil)
    assert not marker.exists()
    assert "Traceback" not in capsys.readouterr().err


# --- run.py as a subprocess (each start costs seconds: three in all)


def _run_py(args: list[str], cache: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "run.py", *args], cwd=REPO, env=subprocess_env(cache), capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def cli_reference(tmp_path_factory, huggy_actor):
    """(checkpoint, obs file, expected actions, atol): ML-Agents' own files when ../shared exists, else ours."""
    if SHARED.is_dir():
        return HUGGY_PT, REFERENCE / "obs.npy", np.load(REFERENCE / "actions_torch.npy"), 3e-6  # other CPU: see test_conformance
    root = tmp_path_factory.mktemp("cli")
    obs = huggy_actor.in_distribution_obs(32, seed=5)
    np.save(root / "obs.npy", obs)
    return huggy_actor.save(root / "Huggy" / "Huggy-7.pt", 7), root / "obs.npy", huggy_actor.actions(obs), 1e-5


def test_cli_action_reproduces_mlagents_actions(tmp_path, cli_reference, huggy_exp_cache):
    pt, obs, expected, atol = cli_reference
    out = tmp_path / "run"
    proc = _run_py(["mode=action", f"model.checkpoint={pt}", "obs.source=file", f"obs.path={obs}",
                    f"hydra.run.dir={out}", "tracking=none"], huggy_exp_cache)
    assert proc.returncode == 0, proc.stderr
    actions = np.load(out / "actions.npy")
    np.testing.assert_allclose(actions, expected, atol=atol, rtol=0)
    record = json.loads((out / "result.json").read_text())
    assert record["status"] == "passed" and record["model"]["path"] == str(pt)
    assert (out / ".hydra" / "config.yaml").is_file()


@pytest.mark.slow
def test_cli_sweep_over_dtype_and_device_records_every_point(tmp_path, huggy_exp_cache):
    sweep = tmp_path / "sweep"
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _run_py(["-m", "dtype=fp32,fp16,bf16", "device=cpu,npu:0", f"hydra.sweep.dir={sweep}", f"tracking.uri={uri}",
                    "obs.rows=16"], huggy_exp_cache, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]
    assert len(records) == 6
    points = {(r["dtype"], r["device"]): r for r in records}
    assert set(points) == {(d, v) for d in ("fp32", "fp16", "bf16") for v in ("cpu", "npu:0")}
    for dtype in ("fp32", "fp16", "bf16"):
        assert points[(dtype, "cpu")]["status"] == "passed"
        npu = points[(dtype, "npu:0")]
        if not _npu_present():
            assert npu["status"] == "skipped" and "torch_npu" in npu["reason"]
    assert "sweep summary (6 jobs)" in proc.stdout
    client = _mlflow_client(uri)
    everything = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id], max_results=100)
    parents = [r for r in everything if r.data.tags.get("huggy.parent") == "true"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    runs = [r for r in everything if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(runs) == 6 == len(everything) - 1
    assert sorted(r.info.run_name for r in runs) == sorted(f"action-{v}-{d}-b64" for d in ("fp32", "fp16", "bf16")
                                                           for v in ("cpu", "npu:0"))
    assert {r.data.tags["status"] for r in runs} == ({"passed", "skipped"} if not _npu_present() else {"passed"})


@pytest.mark.slow
def test_cli_bad_inputs_exit_nonzero_with_one_line_naming_the_value(tmp_path, huggy_exp_cache):
    marker = tmp_path / "PWNED"
    evil = write_evil_pt(tmp_path / "evil.pt", marker)
    cases = {
        "mode": (["mode=nope"], "'nope'"),
        "dtype": (["dtype=fp8"], "'fp8'"),
        "evil": ([f"model.checkpoint={evil}"], str(evil)),
    }
    lines = []
    for name, (args, _) in cases.items():
        argv = " ".join(shlex.quote(a) for a in [PYTHON, "run.py", *args, f"hydra.run.dir={tmp_path / name}", "tracking=none"])
        lines.append(f"{argv} >{shlex.quote(str(tmp_path / (name + '.out')))} 2>{shlex.quote(str(tmp_path / (name + '.err')))};"
                     f" echo $? >{shlex.quote(str(tmp_path / (name + '.rc')))}")
    proc = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=REPO, env=subprocess_env(huggy_exp_cache),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    for name, (_, needle) in cases.items():
        rc = int((tmp_path / f"{name}.rc").read_text())
        out, err = (tmp_path / f"{name}.out").read_text(), (tmp_path / f"{name}.err").read_text()
        assert rc != 0, f"{name}: exit code 0\n{out}\n{err}"
        assert any(needle in line for line in (out + err).splitlines()), f"{name}: no line names {needle}\n{out}\n{err}"
        assert "Traceback" not in err, f"{name}:\n{err}"
    assert "valid:" in (tmp_path / "mode.err").read_text()
    assert not marker.exists()
