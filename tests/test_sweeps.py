"""Sweeps a person can browse: headline metrics, the case library, the comparison, launchers and remote tracking."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import (CONF, PYTHON, REPO, compose_config, free_port, run_job, start_server, stop_server,
                      subprocess_env)
from huggy_exp import compare, config, preflight
from huggy_exp.errors import UserError
from huggy_exp.headline import headline_metrics, settings
from huggy_exp.verify import fingerprint

CASES = sorted(p.stem for p in (CONF / "case").glob("*.yaml"))
# one or more per mode, the expected failures, accelerator points (skipped here), a fixture case, a repeat pair
SAMPLE = ["info_default", "checkpoints_genuine", "action_random", "action_bf16", "sample_repeat_a", "sample_repeat_b",
          "batch_b7", "precision_bf16_relative_fail", "bf16_extreme", "onnx_compare_zeros", "export_onnx_random",
          "fingerprint_closed", "stats_extreme", "npu_precision_bf16", "dual_npu1_fp32"]


def _run_py(args: list[str], cache: Path, timeout: int = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "run.py", *args], cwd=REPO, env=subprocess_env(cache), capture_output=True,
                          text=True, timeout=timeout, **kw)


def _runs(uri: str) -> tuple[list, list]:
    """(parents, children) in the huggy_exp experiment of a store."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("huggy_exp")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    parents = [r for r in runs if r.data.tags.get("huggy.parent") == "true"]
    return parents, [r for r in runs if r not in parents]


# --- headline metrics and params


def test_headline_metrics_copy_the_modes_detail_and_say_passed():
    metrics = {"actions/vs_fp64/max_abs": 3.0123e-7, "actions/vs_fp64/cosine_min_row": 0.999876, "relative/ratio": 1.0,
               "actions/vs_fp32/max_abs": float("nan"), "latency/p50_us": 12.5}
    head = headline_metrics("precision", metrics, "failed")
    assert head == {"passed": 0.0, "rel_ratio": 1.0, "max_abs_vs_fp64": 3.01e-7, "cosine_vs_fp64": 0.999876, "p50_us": 12.5}
    assert "passed" not in headline_metrics("action", {}, "skipped")


def test_every_mode_with_a_task_declares_headline_metrics():
    tasks = {name for name, schema in config.modes().items() if schema.is_task()}
    assert tasks == {p.stem for p in (CONF / "mode").glob("*.yaml")} - {"sync", "ui", "rejudge"}  # run.py's own
    assert all(config.modes()[name].headline for name in tasks), [n for n in tasks if not config.modes()[n].headline]


def test_params_keep_the_runs_own_dtype_and_drop_plumbing():
    cfg = compose_config(["mode=precision", "dtype=bf16"])
    from omegaconf import OmegaConf

    kept = settings(OmegaConf.to_container(cfg, resolve=True), "bf16")
    assert set(kept["verify"]["limits"]) == {"bf16"}
    assert "_target_" not in kept["mode"] and "http_retries" not in kept["tracking"]
    assert kept["mode"]["relative"] == {"warn": 1.0, "fail": 2.0}


def test_job_records_headline_metrics_first(tmp_path):
    job = run_job(tmp_path, "batch", "obs.rows=8", "batch_size=4")
    metrics = list(job.record["metrics"])
    assert metrics[:4] == ["passed", "invariance_max", "rows_identical", "rows_per_s"]
    detail = job.record["metrics"]["batch_invariance_max_abs"]
    assert job.record["headline_metrics"]["invariance_max"] == pytest.approx(detail, rel=5e-3, abs=0)


# --- the comparison of a sweep's points


def _point(root: Path, job: str, device: str, dtype: str, actions: np.ndarray | None, status: str = "passed",
           mode: str = "precision", p50: float | None = None, batch: int = 64) -> dict:
    d = root / job
    d.mkdir(parents=True)
    if actions is not None:
        np.save(d / "actions.npy", actions.astype(np.float32))
    return {"job": job, "dir": str(d), "mode": mode, "device": device, "dtype": dtype, "batch_size": batch,
            "status": status, "obs": "random/8/x1.0", "seed": 0, "model_sha256": "m", "knobs": {},
            "metrics": {} if p50 is None else {"p50_us": p50}, "latency_points": [] if p50 is None else [["eager", batch, p50]],
            "fingerprint": None if actions is None else fingerprint({"actions": actions})["fingerprint"]}


def test_comparison_measures_each_point_against_cpu_fp32_and_groups_identical_devices(tmp_path):
    base = np.random.default_rng(0).uniform(-1, 1, (8, 21))
    off = base.copy()
    off[3, 4] += 1e-6
    rows = [_point(tmp_path, "0", "cpu", "fp32", base), _point(tmp_path, "1", "npu:0", "fp32", base),
            _point(tmp_path, "2", "npu:1", "fp32", off), _point(tmp_path, "3", "npu:0", "bf16", base + 0.01),
            _point(tmp_path, "4", "npu:0", "fp16", base + 0.002, status="failed"),
            _point(tmp_path, "5", "npu:1", "fp16", None, status="skipped")]
    out = compare.compare(rows)
    assert out["vs_cpu_fp32"]["1"] == 0.0
    assert out["vs_cpu_fp32"]["2"] == pytest.approx(1e-6, rel=0.1)
    assert out["vs_cpu_fp32"]["3"] == pytest.approx(0.01, rel=1e-3)
    assert "0" not in out["vs_cpu_fp32"] and "5" not in out["vs_cpu_fp32"]
    (fp32,) = [g for g in out["agreement"] if g["dtype"] == "fp32"]
    assert not fp32["identical"] and [p["class"] for p in fp32["points"]] == [0, 0, 1]
    assert any("npu:0(job 1), npu:1(job 2): 2 different results" in line for line in out["lines"])
    rec = out["recommended"]["npu:0"]
    assert rec["dtype"] is None and rec["passing"] == ["fp32", "bf16"] and rec["failing"] == ["fp16"]


def test_recommended_dtype_is_the_fastest_that_passes(tmp_path):
    a = np.zeros((4, 21))
    rows = [_point(tmp_path, "0", "cuda", "fp32", a, p50=40.0), _point(tmp_path, "1", "cuda", "bf16", a, p50=9.0),
            _point(tmp_path, "2", "cuda", "fp16", a, status="failed", p50=7.0)]
    rec = compare.compare(rows)["recommended"]["cuda at batch 64"]
    assert rec["dtype"] == "bf16" and rec["p50_us"] == 9.0 and rec["failing"] == ["fp16"]


def test_discrete_and_memory_outputs_are_compared_and_fingerprinted(tmp_path):
    """A discrete/memory policy: decisions compared with CPU fp32, and a memory that differs breaks bit-identity."""
    rows = [_point(tmp_path, str(i), dev, dt, None) for i, (dev, dt) in enumerate([("cpu", "fp32"), ("npu:0", "fp32"),
                                                                                   ("npu:1", "fp32"), ("npu:0", "bf16")])]
    picks = np.array([[0, 1], [2, 1], [1, 0], [3, 1]], np.int64)
    memory = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    for row, (p, m) in zip(rows, [(picks, memory), (picks, memory), (picks, memory + np.float32(1e-6)),
                                  (np.where(picks == 3, 2, picks), memory)]):
        np.save(Path(row["dir"]) / "discrete_actions.npy", p)
        np.save(Path(row["dir"]) / "memories.npy", m)
        row["fingerprint"] = fingerprint({"discrete_actions": p, "memories": m})["fingerprint"]
    out = compare.compare(rows)
    assert rows[3]["vs_cpu_fp32_discrete_agreement"] == pytest.approx(7 / 8)
    assert rows[1]["vs_cpu_fp32_discrete_agreement"] == 1.0 and "vs_cpu_fp32_max_abs" not in rows[1]
    assert any(x.endswith("discrete actions equal to cpu fp32's: 87.50%") for x in out["lines"]), out["lines"]
    (fp32,) = [g for g in out["agreement"] if g["dtype"] == "fp32"]
    assert [p["class"] for p in fp32["points"]] == [0, 0, 1]  # same decisions, memory one ulp off: not identical


def test_recommendation_is_per_model_when_a_sweep_has_several(tmp_path):
    a = np.zeros((4, 21))
    rows = [_point(tmp_path, "0", "cpu", "fp32", a, p50=40.0), _point(tmp_path, "1", "cpu", "bf16", a, p50=9.0),
            _point(tmp_path, "2", "cpu", "fp32", a, p50=50.0), _point(tmp_path, "3", "cpu", "bf16", a, status="failed", p50=5.0)]
    for row, (sha, name) in zip(rows, [("m1", "Huggy.pt")] * 2 + [("m2", "Pyramids.pt")] * 2):
        row.update(model_sha256=sha, model_name=name)
    rec = compare.compare(rows)["recommended"]
    assert rec["cpu at batch 64 with Huggy.pt"]["dtype"] == "bf16" and rec["cpu at batch 64 with Pyramids.pt"]["dtype"] == "fp32"
    assert rec["cpu at batch 64 with Pyramids.pt"]["failing"] == ["bf16"]


def test_comparison_plots_cover_error_latency_and_agreement(tmp_path):
    a = np.random.default_rng(1).uniform(-1, 1, (4, 21))
    rows = [_point(tmp_path, str(i), dev, dt, a + (0.01 if dt == "bf16" else 0.0), p50=p50, batch=b)
            for i, (dev, dt, b, p50) in enumerate([("cpu", "fp32", 1, 30.0), ("cpu", "fp32", 64, 90.0),
                                                     ("npu:0", "fp32", 64, 20.0), ("npu:0", "bf16", 64, 8.0)])]
    files = compare.draw(tmp_path, rows, compare.compare(rows))
    assert [f.name for f in files] == ["error_vs_dtype.png", "latency_vs_batch.png", "fingerprint_agreement.png"]
    assert all(f.stat().st_size > 5_000 for f in files)


@pytest.mark.parametrize("plots", ["true", "false"])
def test_a_sweeps_own_plots_follow_plots_on_the_command_line(plots, tmp_path):
    """The sweep's comparison plots are drawn with `plots=true` and skipped, like every job's, with `plots=false`."""
    from test_trust import cli

    sweep = tmp_path / "sweep"
    got = cli(["-m", "seed=0", "obs.rows=4", "tracking=none", f"plots={plots}", f"hydra.sweep.dir={sweep}"], None)
    assert got.code == 0, got.err[-2000:]
    drawn = sorted(p.relative_to(sweep).as_posix() for p in sweep.rglob("*.png"))
    assert drawn == (["error_vs_dtype.png", "latency_vs_batch.png"] if plots == "true" else []), drawn
    assert ("![error_vs_dtype](error_vs_dtype.png)" in (sweep / "summary.md").read_text()) == (plots == "true")


def test_latency_points_follow_the_benchmark_ladder_per_backend():
    from huggy_exp.sweep import latency_points

    bench = {"metrics": {"eager/b1/p50_us": 90.0, "eager/b64/p50_us": 400.0, "onnxruntime/b64/p50_us": 300.0,
                         "eager/b1/p99_us": 120.0, "eager/load_s": 0.1}, "batch_size": 64}
    assert latency_points(bench) == [["eager", 1, 90.0], ["eager", 64, 400.0], ["onnxruntime", 64, 300.0]]
    job = {"metrics": {"latency/p50_us": 12.0}, "batch_size": 8, "params": {"backend": "onnxruntime"}}
    assert latency_points(job) == [["onnxruntime", 8, 12.0]] and latency_points({"metrics": {}}) == []


def test_points_with_different_action_shaping_knobs_are_not_grouped(tmp_path):
    a = np.zeros((32, 21))
    rows = [_point(tmp_path, "0", "cpu", "fp32", a, mode="fingerprint"), _point(tmp_path, "1", "cpu", "fp32", a + 1, mode="fingerprint")]
    rows[1]["knobs"] = {"loop": "closed"}
    rows[0]["knobs"] = {"require_match": ["fp32"]}  # a verdict knob: does not make points incomparable
    assert compare.compare(rows)["agreement"] == []


# --- the case library


def test_case_library_has_50_cases_each_with_an_expected_verdict():
    assert len(CASES) >= 50
    for name in CASES:
        text = (CONF / "case" / f"{name}.yaml").read_text()
        assert text.startswith("# @package _global_\n"), name
        assert "+case" not in text, name
        assert "expect" in yaml.safe_load(text), name


def test_the_case_glob_matches_every_case_file():
    plain, sweeps = preflight.expand(["case=glob(*)"], [CONF])
    assert not plain and sorted(v.split("=", 1)[1] for v in sweeps[0]) == CASES


CASE_CHUNKS = [CASES[i::6] for i in range(6)]  # six tests, so that the default run's workers share the 73 compositions


@pytest.mark.parametrize("chunk", CASE_CHUNKS, ids=[f"cases{i}" for i in range(len(CASE_CHUNKS))])
def test_every_case_composes_and_validates(chunk):
    """preflight composes and validates each case (expect among the verdicts, known keys, ranges) and counts them."""
    preflight.setup()
    assert preflight.check(["-m", f"case={','.join(chunk)}"], CONF) == len(chunk)


def test_device_expectations_hold_on_every_host():
    assert preflight.available("cpu", "passed", "skipped") == "passed"
    from huggy_exp.errors import Unsupported
    from huggy_exp.placement import resolve_device

    try:
        resolve_device("npu:1")
        here = True
    except Unsupported:
        here = False
    assert preflight.available("npu:1", "passed", "skipped") == ("passed" if here else "skipped")
    assert preflight.available(str(CONF / "config.yaml"), "passed", "skipped") == "passed"
    assert preflight.available(str(CONF / "nothing.pt"), "passed", "skipped") == "skipped"


def test_missing_fixture_makes_a_case_skipped_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HUGGY_EXP_SHARED", str(tmp_path / "absent"))
    job = run_job(tmp_path / "job", "info", "case=info_genuine")
    assert job.record["status"] == "skipped" and "absent" in job.record["reason"]
    assert job.record["expect"] == "skipped" and job.record["expectation_met"]


@pytest.fixture()
def config_dir(tmp_path) -> Path:
    cases = tmp_path / "mine" / "case"
    cases.mkdir(parents=True)
    (cases / "mine.yaml").write_text("# @package _global_\ndefaults:\n  - override /mode: action\nobs:\n  rows: 4\nexpect: passed\n")
    (cases / "bad_key.yaml").write_text("# @package _global_\ndefaults:\n  - override /mode: batch\nmode:\n  tolerence: 1\n")
    (cases / "bad_threshold.yaml").write_text("# @package _global_\ndefaults:\n  - override /mode: precision\n"
                                              "verify:\n  limits:\n    bf16: {max_rel: 0.01}\n")
    (cases / "bad_yaml.yaml").write_text("# @package _global_\nbatch_size: [1\n")
    (cases / "bad_expect.yaml").write_text("# @package _global_\nexpect: pased\n")
    return tmp_path / "mine"


@pytest.mark.parametrize("case, needle", [
    ("bad_key", "unknown key mode.tolerence; valid keys of mode (batch): budget_s"),
    ("bad_threshold", "unknown key verify.limits.bf16.max_rel"),
    ("bad_yaml", "not valid YAML: line 3"),
    ("bad_expect", "unknown expect 'pased'"),
])
def test_a_malformed_case_fails_fast_naming_its_file_and_key(config_dir, case, needle):
    preflight.setup()
    with pytest.raises(UserError) as err:
        preflight.check(["--config-dir", str(config_dir), f"case={case}"], CONF)
    message = str(err.value)
    assert message.startswith(f"case {case} ({config_dir / 'case' / case}.yaml): ") and needle in message
    assert "\n" not in message


@pytest.mark.slow
def test_a_case_from_config_dir_runs(config_dir, tmp_path, huggy_exp_cache):
    proc = _run_py(["--config-dir", str(config_dir), "case=mine", f"hydra.run.dir={tmp_path / 'run'}", "tracking=none"],
                   huggy_exp_cache)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "result.json").read_text())
    assert record["case"] == "mine" and record["expectation_met"] is True and record["run_name"] == "mine"


@pytest.mark.slow
def test_case_library_runs_with_its_tally_parent_run_comparison_and_job_logs(tmp_path, huggy_exp_cache):
    """A sample of the library (all of it with HUGGY_EXP_FULL_LIBRARY=1): every case meets its expected verdict."""
    full = os.environ.get("HUGGY_EXP_FULL_LIBRARY") == "1"
    cases = CASES if full else SAMPLE
    sweep, uri = tmp_path / "sweep", f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _run_py(["-m", "case=glob(*)" if full else "case=" + ",".join(cases), f"hydra.sweep.dir={sweep}",
                    f"tracking.uri={uri}"], huggy_exp_cache, timeout=900 if full else 300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    summary = json.loads((sweep / "summary.json").read_text())
    tally = summary["tally"]
    assert tally["expected"] == len(cases) and tally["missed"] == 0 and tally["failed"] >= 2
    assert f"{len(cases)}/{len(cases)} cases met their expected verdict" in proc.stdout
    assert f"[1/{len(cases)}] case=" in proc.stdout and f"[{len(cases)}/{len(cases)}] case=" in proc.stdout
    # comparison: bf16 against cpu fp32 on the same inputs, and the repeat pair bit-identical
    lines = summary["comparison"]["lines"]
    assert any("action cpu bf16" in x and "vs cpu fp32" in x for x in lines), lines
    assert any(x.startswith("agreement sample fp32") and x.endswith("bit-identical") for x in lines), lines
    assert "comparison:" in proc.stdout and (sweep / "comparison.csv").is_file()
    assert (sweep / "error_vs_dtype.png").is_file() and (sweep / "fingerprint_agreement.png").is_file()
    # each job's run.log holds what it printed
    row = next(r for r in summary["rows"] if r["case"] == "precision_bf16_relative_fail")
    log = (Path(row["dir"]) / "run.log").read_text()
    assert "FAILED (expected FAILED: met): device error is 1.00x the CPU's in bf16" in log and row["note"] in log
    # MLflow: one parent, one child per case, headline metrics on the children, comparison on the parent
    parents, children = _runs(uri)
    assert len(parents) == 1 and len(children) == len(cases)
    assert {c.data.tags["case"] for c in children} == set(cases)
    assert all(c.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for c in children)
    prec = next(c for c in children if c.data.tags["case"] == "precision_bf16_relative_fail")
    assert prec.data.metrics["answer/passed"] == 0.0 and prec.data.metrics["answer/max_abs"] > 0
    # an expected failure met: MLflow says so and does not paint it a red Failed (a missed expectation is Failed)
    assert prec.info.status == "FINISHED" and prec.data.tags["verdict"].startswith("failed as expected")
    import mlflow

    artifacts = {a.path for a in mlflow.MlflowClient(uri).list_artifacts(parents[0].info.run_id)}
    assert {"summary.md", "comparison.csv", "comparison_table.json", "error_vs_dtype.png"} <= artifacts
    assert "bit-identical" in parents[0].data.tags["mlflow.note.content"]


# --- launchers and remote tracking


EIGHT_POINTS = ["dtype=fp32,bf16", "seed=0,1,2,3", "mode=batch", "obs.rows=4", "batch_size=2", "mode.budget_s=0.05"]


def _three_sweeps_at_once(tmp_path: Path, cache: Path, uri: str, launcher: list[str]) -> None:
    """Three 8-point sweeps started together into one store: 3 parents, 24 children, none lost or duplicated."""
    procs = [subprocess.Popen([PYTHON, "run.py", "-m", *launcher, *EIGHT_POINTS,
                               f"hydra.sweep.dir={tmp_path / f'sweep{i}'}", f"tracking.uri={uri}"],
                              cwd=REPO, env=subprocess_env(cache), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    outputs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, out[-3000:] + err[-3000:]
        assert "database is locked" not in out + err
    parents, children = _runs(uri)
    assert len(parents) == 3 and len(children) == 24
    assert len({c.data.tags["huggy.job_id"] for c in children}) == 24
    for parent in parents:
        mine = [c for c in children if c.data.tags["mlflow.parentRunId"] == parent.info.run_id]
        assert len(mine) == 8 and {c.data.tags["sweep_id"] for c in mine} == {parent.data.tags["sweep_id"]}
        assert parent.data.metrics["jobs_passed"] == 8.0
    for c in children:
        assert c.data.metrics["answer/passed"] == 1.0 and "answer/invariance_max" in c.data.metrics
        assert c.info.status == "FINISHED"


@pytest.mark.slow
def test_three_parallel_joblib_sweeps_into_one_sqlite_store_lose_and_duplicate_nothing(tmp_path, huggy_exp_cache):
    """Three 8-point joblib sweeps at once (2 workers each) into one SQLite store: 3 parents, 24 children."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _three_sweeps_at_once(tmp_path, huggy_exp_cache, uri, ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    parents, children = _runs(uri)
    assert all(c.data.tags["shared_machine"] == "true" for c in children)
    record = json.loads((tmp_path / "sweep0" / "0" / "result.json").read_text())
    assert record["launcher"] == "joblib" and record["shared_machine"] is True
    assert "[timed while other jobs shared the machine]" in record["headline"]


@pytest.mark.skipif(os.environ.get("HUGGY_EXP_FULL_LAUNCHERS") != "1",
                    reason="~2.5 min of subprocesses: HUGGY_EXP_FULL_LAUNCHERS=1 runs it (the slow run always has a 2-point submitit sweep)")
@pytest.mark.slow
def test_three_submitit_local_sweeps_into_one_sqlite_store(tmp_path, huggy_exp_cache):
    _three_sweeps_at_once(tmp_path, huggy_exp_cache, f"sqlite:///{tmp_path / 'mlflow.db'}",
                          ["hydra/launcher=submitit_local", f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}"])


@pytest.mark.slow
def test_submitit_local_sweep_logs_a_parent_and_its_children(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = _run_py(["-m", "hydra/launcher=submitit_local", "dtype=fp32,bf16", "obs.rows=4",
                    f"hydra.sweep.dir={tmp_path / 'sweep'}", f"tracking.uri={uri}"], huggy_exp_cache, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parents, children = _runs(uri)
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.tags["dtype"] for c in children} == {"fp32", "bf16"}
    assert all("answer/act_mean" in c.data.metrics for c in children)
    assert "max |Δaction| vs cpu fp32" in proc.stdout


def test_slurm_launcher_preset_composes():
    from hydra import compose, initialize_config_dir

    preflight.setup()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher") and cfg.hydra.launcher.timeout_min == 60


@pytest.mark.slow
def test_sweep_against_a_loopback_mlflow_server(tmp_path, huggy_exp_cache):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    try:
        proc = _run_py(["-m", "dtype=fp32,bf16", "obs.rows=4", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                        f"tracking.uri={uri}"], huggy_exp_cache)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        parents, children = _runs(uri)
        assert len(parents) == 1 and len(children) == 2
        assert f"parent run: {uri}/#/experiments/" in proc.stdout and "workflowType=machine_learning" in proc.stdout
        import mlflow

        client = mlflow.MlflowClient(uri)
        assert "result.json" in {a.path for a in client.list_artifacts(children[0].info.run_id)}
        assert "summary.json" in {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    finally:
        stop_server(server)


@pytest.mark.skipif(os.environ.get("HUGGY_EXP_FULL_LAUNCHERS") != "1",
                    reason="~1 min of subprocesses: HUGGY_EXP_FULL_LAUNCHERS=1 runs it (the slow run always has the 2-point check above)")
@pytest.mark.slow
def test_three_sweeps_into_one_loopback_mlflow_server(tmp_path, huggy_exp_cache):
    port = free_port()
    server = start_server(tmp_path, port)
    try:
        _three_sweeps_at_once(tmp_path, huggy_exp_cache, f"http://127.0.0.1:{port}", [])
    finally:
        stop_server(server)

