"""Reliability, round three (issue 36): each failure class of the third hostile run, with variants of other folders,
files, fields and sizes. Every refusal is one line with the documented exit code; every file is kept; no pass is
reported that did not happen. docs/reliability.md ("Hostile probes (issue 36)") lists each class and its tests.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import test_certificate
from test_certificate import copy_bundle, rewrite_npz, run_job
from test_reliability import one_line
from test_reliability_verdicts import edit_result, pending_job, rehash, store
from test_trust import _runs, cli

from huggy_exp import terminal, tracking

small_bundle = test_certificate.small_bundle  # the fixture: the small policy recorded in fp32


# --- 3. output that cannot be written is lost output, never a lost job


class FullDevice:
    """A stream on a full device (`> /dev/full`): every write and flush fails with ENOSPC."""

    def __init__(self):
        self.fd = open("/dev/null", "w")  # a real descriptor for Output to point at /dev/null

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def fileno(self) -> int:
        return self.fd.fileno()


def test_class_3_output_on_a_full_device_is_lost_output_never_a_lost_job(tmp_path, monkeypatch):
    import run

    for stream in ("stdout", "stderr"):  # `> /dev/full 2>&1`
        monkeypatch.setattr(f"sys.{stream}", FullDevice())
    monkeypatch.setattr(terminal, "PIPE_CLOSED", __import__("threading").Event())
    uri = store(tmp_path)
    code = 0
    try:
        run.cli(["obs.rows=4", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'job'}"])
    except SystemExit as exc:
        code = exc.code
    record = json.loads((tmp_path / "job" / "result.json").read_text())
    assert code in (0, None) and record["status"] == "passed", record.get("reason")
    assert record["tracking"]["status"] == "logged" and len(_runs(uri)) == 1
    assert not terminal.PIPE_CLOSED.is_set()  # not a closed pipe: the sweep would stop there


@pytest.mark.slow
def test_class_3_run_py_into_dev_full_writes_and_logs_its_result(tmp_path, huggy_exp_cache):
    import subprocess

    from conftest import PYTHON, REPO, subprocess_env

    uri = store(tmp_path)
    with open("/dev/full", "w") as full:
        for args, job in ((["obs.rows=4"], "job"), (["-m", "seed=0,1", "obs.rows=4"], "sweep")):
            where = "hydra.sweep.dir" if args[0] == "-m" else "hydra.run.dir"
            proc = subprocess.run([PYTHON, str(REPO / "run.py"), *args, f"tracking.uri={uri}", f"{where}={tmp_path / job}"],
                                  cwd=tmp_path, env=subprocess_env(huggy_exp_cache), stdout=full, stderr=full, timeout=300)
            assert proc.returncode == 0, job
    records = [json.loads(p.read_text()) for p in [tmp_path / "job" / "result.json", *(tmp_path / "sweep").glob("*/result.json")]]
    assert len(records) == 3 and {r["status"] for r in records} == {"passed"}
    assert {r["tracking"]["status"] for r in records} == {"logged"} and (tmp_path / "sweep" / "summary.json").is_file()


# --- 4. NaN or inf never passes mode=diff, wherever diff reads a figure


def test_class_4_nan_in_a_bundles_inputs_fails_diff_whatever_the_manifest_declares(small_bundle, tmp_path):
    nan_in = copy_bundle(small_bundle, tmp_path / "nan_in")
    rewrite_npz(nan_in / "inputs.npz", lambda k, v: np.where(np.arange(v.size).reshape(v.shape) == 3, np.nan, v).astype(v.dtype)
                if v.dtype.kind == "f" else v)
    rehash(nan_in, "inputs.npz")  # the manifest's declared inputs_sha256 left as it was
    for n, (base, cand) in enumerate(((small_bundle, nan_in), (nan_in, nan_in))):
        r = run_job(tmp_path / f"d{n}", "diff", f"mode.baseline={base}", f"mode.candidate={cand}").record
        assert r["status"] == "failed" and "inputs obs_0 holds 1 NaN/Inf" in r["reason"], r["reason"]


@pytest.mark.parametrize("field, value", [("max_abs", float("nan")), ("rmse", float("inf")), ("cosine", float("-inf"))])
def test_class_4_a_non_finite_figure_in_a_comparison_json_fails_diff(small_bundle, tmp_path, field, value):
    cand = copy_bundle(small_bundle, tmp_path / "cand")
    name = next(p.relative_to(cand).as_posix() for p in cand.glob("points/*/comparison.json"))
    comparison = json.loads((cand / name).read_text())
    output = next(iter(comparison["outputs"]))
    comparison["outputs"][output][field] = value
    (cand / name).write_text(json.dumps(comparison))
    rehash(cand, name)
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={small_bundle}", f"mode.candidate={cand}").record
    assert r["status"] == "failed" and f"{output}/vs_fp64/{field} is not a finite number" in r["reason"], r["reason"]


def test_class_4_a_non_finite_metric_or_latency_in_a_job_dir_fails_diff(small, tmp_path):
    for side in ("base", "cand"):
        job = run_job(tmp_path / side / "0", "precision", small.model, "obs.rows=8")
        assert job.record["status"] == "passed", job.record["reason"]
    key = next(k for k in job.record["metrics"] if "vs_fp64" in k)
    edit_result(tmp_path / "cand" / "0", metrics={**job.record["metrics"], key: float("nan")})
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={tmp_path / 'base'}", f"mode.candidate={tmp_path / 'cand'}").record
    assert r["status"] == "failed" and f"{key} is not a finite number" in r["reason"], r["reason"]


# --- 5. a finite obs.scale whose observations overflow float32: one line, the same in every mode


def test_class_5_an_obs_scale_past_float32_is_one_line(tmp_path):
    got = cli(["obs.rows=4", "tracking=none", "obs.scale=1e39"], tmp_path / "job")
    assert got.code == 2 and "out of range" in one_line(got, "obs.scale=1e+39")


@pytest.mark.parametrize("mode", ["action", "precision", "batch", "onnx-compare"])
def test_class_5_observations_that_overflow_float32_are_refused_alike_in_every_mode(tmp_path, mode):
    got = cli([f"mode={mode}", "obs.rows=8", "tracking=none", "obs.scale=1e38"], tmp_path / "job")
    assert got.code == 2, (mode, got.err[-2000:])
    assert "overflow float32" in one_line(got, "obs.scale=1e+38") and got.record["status"] == "error"


# --- 7. sync: a value MLflow never takes is skipped in one line (exit 2), never pending forever


UNLOGGABLE = {  # a field of a pending result.json set to what MLflow never takes, and what the skip line names
    "start-1e30": ({"start_time_ms": 1e30}, "start_time_ms"),
    "start-negative": ({"start_time_ms": -5, "duration_s": 0}, "start_time_ms"),
    "duration-1e300": ({"duration_s": 1e300}, "duration_s"),
    "surrogate-run-name": ({"run_name": "a\ud800b"}, "run_name"),
    "long-param-key": ({"params": {"k" * 1000: 1}}, "param"),
    "surrogate-param": ({"params": {"obs": {"path": "/data/\udc80.npy"}}}, "param"),
    "bad-tag-key": ({"tags": {"bad key!": "x"}}, "tag"),
    "long-tag-key": ({"tags": {"t" * 300: "x"}}, "tag"),
    "surrogate-headline": ({"headline": "lone \udfff surrogate"}, "tag"),
}


def test_class_7_sync_skips_a_value_mlflow_never_takes_in_one_line(tmp_path):
    import shutil

    good = pending_job(tmp_path, "zz-good")  # sorted last: every bad one is met first
    for name, (fields, _) in UNLOGGABLE.items():
        shutil.copytree(good, tmp_path / "runs" / name)
        edit_result(tmp_path / "runs" / name, job_id=name, **fields)
    lines = []
    uri = store(tmp_path)
    counts = tracking.sync({"uri": uri}, [tmp_path / "runs"], say=lines.append)
    skipped = {ln.split("/runs/")[1].split("/")[0]: ln for ln in lines if ln.startswith("sync: skipped")}
    assert counts["skipped"] == len(UNLOGGABLE) and counts["pending"] == 0 and counts["logged"] == 1, lines
    for name, (_, named) in UNLOGGABLE.items():
        assert named in skipped[name] and "MLflow" in skipped[name] and "\n" not in skipped[name], skipped[name]
    assert [r.info.run_id for r in _runs(uri)] == [json.loads((good / "result.json").read_text())["tracking"]["run_id"]]
    got = cli(["mode=sync", f"mode.paths=[{tmp_path / 'runs'}]", f"tracking.uri={uri}"], None)
    assert got.code == 2 and "start_time_ms" in one_line(got, "start-1e30/result.json")  # every retry: exit 2, not 3


# --- 8. system tags come from the tool only


def test_class_8_sync_never_writes_the_system_tags_a_foreign_result_asks_for(tmp_path):
    job = pending_job(tmp_path)
    record = json.loads((job / "result.json").read_text())
    record["params"]["tracking"]["user"] = "root"  # the job's config, as a foreign file may claim it
    edit_result(job, params=record["params"], tags={"mlflow.user": "admin", "mlflow.parentRunId": "0" * 32, "mlflow.source.name": "evil.py",
                           "huggy.complete": "false", "huggy.owner": "elsewhere", "status": "passed", "mine": "kept"},
                status="failed", reason="it failed")
    uri = store(tmp_path)
    assert tracking.sync({"uri": uri}, [tmp_path / "runs"])["logged"] == 1
    (run,) = _runs(uri)
    tags = run.data.tags
    assert "mlflow.user" not in tags and "mlflow.parentRunId" not in tags, tags
    assert tags["mlflow.source.name"] == "run.py" and tags["huggy.complete"] == "true" and tags["status"] == "failed"
    assert tags["huggy.owner"] == tracking.owner() and tags["mine"] == "kept"
    assert tags["huggy.job_id"] == record["job_id"]


# --- 12. Hydra's sweeps our launcher cannot list: one line


@pytest.mark.parametrize("sweep", ["seed=interval(0,1)", "obs.scale=interval(0.5,2.0)", "seed=tag(a,interval(0,1))"])
def test_class_12_an_interval_sweep_is_one_line(tmp_path, sweep):
    got = cli(["-m", sweep, "mode=info", "tracking=none", f"hydra.sweep.dir={tmp_path / 's'}"], None)
    assert got.code == 2 and "interval" in one_line(got, sweep.split("=")[0]), got.err[-2000:]
    assert not (tmp_path / "s").exists()



# --- 9. a password with a raw `@` or `/`: masked as the driver reads it, or refused without being echoed


@pytest.mark.parametrize("uri, secret", [
    ("postgresql://bob:ab/S-hunter7@127.0.0.1:{port}/db", "hunter7"),
    ("mysql://eve:a/b/c-hunter8@127.0.0.1:{port}/db", "hunter8"),
    ("postgresql://ann@corp:x/y-hunter9@127.0.0.1:{port}/mlflow", "hunter9"),  # SQLAlchemy's user may hold an `@`
])
def test_class_9_a_password_with_a_raw_slash_is_masked_everywhere(uri, secret, tmp_path, monkeypatch):
    from conftest import free_port

    monkeypatch.delenv(tracking.SECRETS_ENV, raising=False)
    uri = uri.format(port=free_port())
    assert secret not in tracking.redact(uri) and secret not in tracking.redact(f"failed: {uri}, retry")
    got = cli(["mode=info", f"tracking.uri='{uri}'"], tmp_path / "job")
    assert got.code in (0, 3), got.err[-2000:]
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert (tmp_path / "job" / ".hydra" / "config.yaml").is_file() and ":***@127.0.0.1" in written
    assert secret not in written + got.out + got.err, [ln for ln in written.splitlines() if secret in ln]
    assert tracking.store_uri(tracking.redact(uri)) == uri  # the store's client still gets the whole URI


@pytest.mark.parametrize("uri", ["postgresql://bob:ab@S-hunter7@127.0.0.1:5432/db",
                                 "http://admin:ab/S-hunter7@127.0.0.1:5000",
                                 "mysql://u:p@q@r-hunter7@10.0.0.1/db"])
def test_class_9_a_password_the_driver_cannot_read_is_refused_without_echoing_it(uri, tmp_path, monkeypatch):
    monkeypatch.delenv(tracking.SECRETS_ENV, raising=False)
    got = cli(["mode=info", f"tracking.uri='{uri}'"], tmp_path / "job")
    assert got.code == 2 and "percent-encode" in one_line(got, "tracking.uri"), got.err[-2000:]
    assert "hunter7" not in got.out + got.err and not (tmp_path / "job").exists()


# --- 11. benchmarks/bench.py: run.py's rules, one line and exit 2 before anything is measured


@pytest.mark.parametrize("argv, fragment", [
    (["--rows", "0"], "--rows=0 is out of range"),
    (["--rows", "100"], "--rows=100 is out of range: must be >= 512"),
    (["--rows", "100000000"], "--rows=100000000"),  # within MAX_BATCH's order, far past memory: the estimator's line
    (["--rows", "1e8"], "--rows: invalid int value"),
    (["--budget", "nan"], "--budget=nan must be a finite number"),
    (["--budget", "-1"], "--budget=-1.0 is out of range"),
    (["--rounds", "0"], "--rounds=0 is out of range"),
    (["--startup-runs", "-3"], "--startup-runs=-3 is out of range"),
    (["--model", "/nonexistent/Huggy.pt"], "/nonexistent/Huggy.pt"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--markdown", "/etc/hostname"], "--markdown=/etc/hostname already exists"),  # never replaced, as run.py's outputs
    (["--json", "/tmp"], "--json=/tmp is a folder"),
    (["--json", "/dev/null"], "refused even with"),  # a device: never an output
    (["--markdown", str(Path(__file__).parents[1] / "conf" / "config.yaml")], "refused even with"),  # the tool's own
])
def test_class_11_bench_py_refuses_a_bad_flag_in_one_line(argv, fragment, monkeypatch, capsys):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("bench_under_test", REPO / "benchmarks" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr("sys.argv", ["bench.py", *argv])
    monkeypatch.setattr(bench, "measure_backends", lambda *a: pytest.fail("measured after a bad flag"))
    with pytest.raises(SystemExit) as exc:
        bench.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and fragment in err, err
    assert "Traceback" not in err


# --- 1. a folder inside a claimed sweep (or job) folder belongs to that run


@pytest.mark.parametrize("inside", ["0", "0/deeper", "new"])
def test_class_1_a_folder_inside_a_claimed_sweep_belongs_to_that_sweep(tmp_path, inside):
    from huggy_exp import files

    sweep = files.claim_folder(tmp_path / "sweep", "hydra.sweep.dir")  # as a running sweep holds it
    for args in (["mode=info", f"hydra.run.dir={sweep / inside}"],
                 ["-m", "mode=info", "seed=0,1", f"hydra.sweep.dir={sweep / inside}"]):
        got = cli([*args, "tracking=none"], None)
        assert got.code == 2 and f"is inside {sweep}" in one_line(got, str(sweep / inside)), got.err[-2000:]
    assert [p.name for p in sweep.iterdir()] == [files.CLAIM]  # nothing of the foreign job written


def test_class_1_a_sweeps_summary_never_reads_a_foreign_result_as_its_own_point(tmp_path, monkeypatch):
    """The race the claim closes, forced: a foreign fp16 job's result.json lands in point 0's folder before the point
    runs. The point is refused (nothing replaced), and the summary counts it as a point that wrote no result."""
    import shutil

    from huggy_exp import preflight

    foreign = cli(["mode=info", "dtype=fp16", "tracking=none"], tmp_path / "foreign")
    assert foreign.code == 0, foreign.err[-2000:]
    sweep, claim = tmp_path / "sweep", preflight.claim

    def claim_then_race(cfg, multirun):
        claim(cfg, multirun)
        shutil.copytree(tmp_path / "foreign", sweep / "0")

    monkeypatch.setattr(preflight, "claim", claim_then_race)
    got = cli(["-m", "mode=info", "seed=0,1", "tracking=none", f"hydra.sweep.dir={sweep}"], None)
    summary = json.loads((sweep / "summary.json").read_text())
    assert {r["dtype"] for r in summary["rows"]} == {"fp32"} and len(summary["rows"]) == 1, summary["rows"]
    assert "1/2 passed" in summary["line"] and "1 of the sweep's points wrote no result" in summary["line"]
    assert got.code == 2 and "info-cpu-fp16" not in got.out
    assert (sweep / "0" / "result.json").read_bytes() == (tmp_path / "foreign" / "result.json").read_bytes()


# --- 2. export-onnx mode.overwrite=true never replaces what the job reads or what the tool is made of


def _export_targets(tmp_path: Path, results_folder: Path, obs_dim: int) -> dict[str, tuple[list[str], Path]]:
    """(arguments, a file the job reads or the tool is made of) for mode.path, each found by what it is."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(results_folder, run)
    obs = tmp_path / "inputs" / "obs.npy"
    obs.parent.mkdir()
    np.save(obs, np.zeros((4, obs_dim), np.float32) + 0.5)
    mine = tmp_path / "mine"
    (mine / "obs").mkdir(parents=True)
    (mine / "obs" / "mine.yaml").write_text("source: random\nrows: 4\nscale: 1.0\npath: null\n")
    alias = tmp_path / "alias.pt"
    alias.hardlink_to(run / "Huggy" / "Huggy-200.pt")
    final = [f"model.onnx={run / 'Huggy.onnx'}"]
    return {
        "the job's obs.path": ([f"model.checkpoint={run / 'Huggy' / 'Huggy-200.pt'}", "obs.source=file",
                                f"obs.path={obs}"], obs),
        "a checkpoint beside the final .onnx": (final, run / "Huggy" / "Huggy-100.pt"),
        "the results folder's training status": (final, run / "run_logs" / "training_status.json"),
        "its configuration.yaml": (final, run / "configuration.yaml"),
        "a hard link to the checkpoint": ([f"model.checkpoint={run / 'Huggy' / 'Huggy-200.pt'}"], alias),
        "a --config-dir file": (["--config-dir", str(mine), "obs=mine"], mine / "obs" / "mine.yaml"),
    }


def test_class_2_export_never_replaces_what_the_job_reads(tmp_path, results_folder, huggy_actor):
    targets = _export_targets(tmp_path, results_folder, huggy_actor.policy_weights().obs_dim)
    for i, (what, (args, target)) in enumerate(targets.items()):
        before, data = target.stat(), target.read_bytes()
        got = cli([*args, "mode=export-onnx", "obs.rows=4", "tracking=none", f"mode.path={target}", "mode.overwrite=true"],
                  tmp_path / f"job{i}")
        assert got.code == 2, (what, got.err[-2000:])
        assert "refused even with mode.overwrite=true" in one_line(got, f"mode.path={target}"), what
        assert target.stat().st_ino == before.st_ino and target.read_bytes() == data, what


def test_class_2_what_the_tool_is_made_of_is_never_an_output(tmp_path):
    import torch

    from conftest import REPO

    from huggy_exp import files
    from huggy_exp.errors import UserError

    for target in (REPO / "conf" / "config.yaml", REPO / "conf" / "mode" / "info.yaml", Path(files.__file__),
                   REPO / "run.py", Path(torch.__file__), Path(np.__file__).parent / "linalg" / "__init__.py"):
        with pytest.raises(UserError, match="refused even with mode.overwrite=true"):
            files.claim_output(target, True, [], "mode.path")
    assert files.claim_output(tmp_path / "new.onnx", True, [], "mode.path") == tmp_path / "new.onnx"


@pytest.mark.parametrize("group", ["obs", "tracking", "mode"])
def test_class_2_a_config_file_that_is_not_text_is_one_line_naming_it(tmp_path, group):
    broken = tmp_path / "mine" / group / "mine.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"\x89ONNX\xff\xfe\x00" + bytes(range(256)))  # what an export over it would leave
    got = cli(["--config-dir", str(tmp_path / "mine"), f"{group}=mine", *(["tracking=none"] if group != "tracking" else [])],
              tmp_path / "job")
    assert got.code == 2 and "is not UTF-8 text" in one_line(got, str(broken)), got.err[-2000:]
