"""Trust: every bad input gets one line and the right exit code; no verdict passes on NaN; no run is lost.

The command-line matrix runs run.py's own entry point in-process (torch is imported once); the concurrency,
outage and interrupt tests start real processes (and a real `mlflow server` on 127.0.0.1).
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (BODY, NORM_PREFIXES, PYTHON, REPO, free_port, mlagents_forward, plots_off, save_mlagents_checkpoint,
                      start_server, stop_server, subprocess_env)

sys.path.insert(0, str(REPO))
import run  # noqa: E402  (run.py: the command line, called in-process)

from huggy_exp import tracking  # noqa: E402
from huggy_exp.results import Result  # noqa: E402


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    record: dict | None


def cli(args: list[str], jobdir: Path | None) -> Outcome:
    """run.py's cli() in this process: exit code, captured output, and result.json when the job wrote one.
    `plots=false` unless the arguments set `plots`, as compose_config does (conftest.plots_off)."""
    sets_dir = any(a.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) for a in args)
    argv = plots_off(args) + ([f"hydra.run.dir={jobdir}"] if jobdir is not None and not sets_dir else [])
    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv[:]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run.cli(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.argv[:] = saved
    path = jobdir / "result.json" if jobdir is not None else None
    record = json.loads(path.read_text()) if path is not None and path.is_file() else None
    return Outcome(code, out.getvalue(), err.getvalue(), record)


# --- files for the matrix (this suite's own, in ML-Agents' layout)


@pytest.fixture(scope="module")
def files(tmp_path_factory, huggy_actor, huggy_pt) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trust")
    f: dict[str, Path] = {"pt": huggy_pt}
    state = huggy_actor.state_dict()
    nan = dict(state)
    nan[f"{BODY}2.weight"] = nan[f"{BODY}2.weight"].clone()
    nan[f"{BODY}2.weight"][3, 7] = float("nan")
    f["nan_pt"] = save_mlagents_checkpoint(root / "nan" / "Huggy-1.pt", nan, 1)
    neg = dict(state)
    for prefix in NORM_PREFIXES:
        neg[prefix + "running_variance"] = neg[prefix + "running_variance"].clone()
        neg[prefix + "running_variance"][5] = -1.0
    f["negvar_pt"] = save_mlagents_checkpoint(root / "neg" / "Huggy-1.pt", neg, 1)
    # weights that overflow float16 (|x| > 65504) in the second layer: fp32 is fine, fp16 gives inf then NaN
    big = dict(state)
    big[f"{BODY}2.weight"] = big[f"{BODY}2.weight"] * 1e5
    f["fp16_overflow_pt"] = save_mlagents_checkpoint(root / "big" / "Huggy-1.pt", big, 1)
    # seeded, not os.urandom: about one random file in 256 starts with pickle's STOP opcode and is a (tiny) pickle stream
    (root / "bytes.pt").write_bytes(np.random.default_rng(84).bytes(256))
    f["bytes_pt"] = root / "bytes.pt"
    marker = root / "PWNED"
    f["marker"] = marker
    f["evil_pt"] = _evil_pt(root / "evil.pt", marker)
    (root / "garbage.onnx").write_bytes(b"\x08\x07garbage" * 10)
    f["garbage_onnx"] = root / "garbage.onnx"
    good = huggy_actor.in_distribution_obs(8)
    np.save(root / "good.npy", good)
    f["good_npy"] = root / "good.npy"
    bad = good.copy()
    bad[2, 4] = np.nan
    np.save(root / "nan.npy", bad)
    f["nan_npy"] = root / "nan.npy"
    np.save(root / "narrow.npy", good[:, :10])
    f["narrow_npy"] = root / "narrow.npy"
    np.save(root / "object.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    f["object_npy"] = root / "object.npy"
    with open(root / "huge.npy", "wb") as fh:  # a real header that claims 1e12 rows, then 64 bytes
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 59)})
        fh.write(b"\0" * 64)
    f["huge_npy"] = root / "huge.npy"
    results = root / "results"
    huggy_actor.save(results / "Huggy" / "Huggy-100.pt", 100)
    f["results"] = results
    bad_status = root / "bad_status"
    huggy_actor.save(bad_status / "Huggy" / "Huggy-100.pt", 100)
    (bad_status / "run_logs").mkdir()
    (bad_status / "run_logs" / "training_status.json").write_text("[1, 2]")
    f["bad_status"] = bad_status
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "other",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)]), root / "other.onnx")
    f["other_onnx"] = root / "other.onnx"
    from dataclasses import replace

    from huggy_exp.mlagents import write_onnx

    w = huggy_actor.policy_weights()  # the same policy with its mu bias moved: an .onnx that really disagrees
    write_onnx(replace(w, mu=(w.mu[0], w.mu[1] + np.float32(0.3))), root / "shifted.onnx")
    f["shifted_onnx"] = root / "shifted.onnx"
    return f


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _evil_pt(path: Path, marker: Path) -> Path:
    torch.save({"Policy": _Payload(marker), "global_step": {"_GlobalSteps__global_step": torch.tensor([1])}}, path)
    return path


# --- the matrix: arguments, exit code, a fragment of the one line, what result.json must say (None: absent)

USER = 2
MATRIX = [
    # the config: refused before any job starts (no job directory, no result.json)
    ("key typo", ["dtyp=fp32"], USER, "unknown key dtyp", None),
    ("added key typo", ["+dtyp=fp16"], USER, "unknown key dtyp", None),
    ("nested key typo", ["model.chekpoint=x"], USER, "unknown key model.chekpoint", None),
    ("unknown dtype", ["dtype=fp8"], USER, "'fp8'", None),
    ("unknown device", ["device=tpu"], USER, "unknown device 'tpu'", None),
    ("cpu has no index 1", ["device=cpu:1"], USER, "cpu has no device 1", None),
    ("unknown mode", ["mode=nope"], USER, "unknown mode 'nope'", None),
    ("unknown case", ["case=nope"], USER, "unknown case 'nope'", None),
    ("unknown obs preset", ["obs=nope"], USER, "unknown obs 'nope'", None),
    ("batch size zero", ["batch_size=0"], USER, "batch_size=0", None),
    ("batch size float", ["batch_size=1e9"], USER, "batch_size=1e9", None),
    ("batch size text", ["batch_size=abc"], USER, "batch_size=abc", None),
    ("negative seed", ["seed=-1"], USER, "seed=-1", None),
    ("seed above 2^62", ["seed=99999999999999999999"], USER, "seed=", None),
    ("zero rows", ["obs.rows=0"], USER, "obs.rows=0", None),
    ("rows text", ["obs.rows=x"], USER, "obs.rows=x", None),
    ("scale nan", ["obs.scale=nan"], USER, "finite", None),
    ("scale negative", ["obs.scale=-1"], USER, "obs.scale=-1", None),
    ("unknown obs source", ["obs.source=bogus"], USER, "unknown obs.source 'bogus'", None),
    ("zero samples", ["mode=onnx-compare", "mode.samples=0"], USER, "mode.samples=0", None),
    ("threshold text", ["mode=precision", "verify.limits.fp32.max_abs=abc"], USER, "verify.limits.fp32.max_abs=abc", None),
    ("unknown threshold key", ["mode=precision", "+verify.limits.bf16.max_rel=0.01"], USER, "max_rel", None),
    ("knob typo", ["+mode.tolerence.fp32=1"], USER, "unknown key mode.tolerence", None),
    ("knob of another mode", ["mode.samples=5"], USER, "unknown key mode.samples", None),
    ("zero steps", ["mode=fingerprint", "mode.steps=0"], USER, "mode.steps=0", None),
    ("unknown loop", ["mode=fingerprint", "mode.loop=sideways"], USER, "unknown mode.loop 'sideways'", None),
    ("zero budget", ["mode=batch", "mode.budget_s=0"], USER, "mode.budget_s=0", None),
    ("unknown backend", ["backend=tensorrt"], USER, "unknown backend 'tensorrt'", None),
    ("unknown benchmark backend", ["mode=benchmark", "mode.backends=[eager,tpu]"], USER, "'tpu'", None),
    ("limit for fp8", ["verify.limits.fp8.max_abs=1"], USER, "unknown key verify.limits.fp8", None),
    ("opset too old", ["mode=export-onnx", "mode.opset=3"], USER, "mode.opset=3", None),
    ("saturation zero", ["mode=stats", "mode.saturation=0"], USER, "mode.saturation=0", None),
    ("require_match fp8", ["mode=fingerprint", "mode.require_match=[fp8]"], USER, "'fp8'", None),
    ("sweep without -m", ["dtype=fp32,fp16"], USER, "add -m", None),
    ("glob on a plain key", ["-m", "dtype=glob(*)"], USER, "glob() selects config files", None),
    ("glob that matches nothing", ["-m", "case=glob(zz*)"], USER, "matches no case", None),
    ("bad expectation", ["expect=maybe"], USER, "unknown expect 'maybe'", None),
    ("negative retries", ["tracking.http_retries=-1"], USER, "tracking.http_retries=-1", None),
    ("folder store", ["tracking=mlflow", "tracking.uri=./mlruns"], USER, "MLflow 3 needs a database", None),
    ("unknown store scheme", ["tracking=mlflow", "tracking.uri=ftp://x"], USER, "unknown scheme 'ftp'", None),
    ("override syntax", ["dtype=[fp32"], USER, "dtype=[fp32", None),
    ("job folder that cannot be created", ["hydra.run.dir=/proc/nope/job"], USER, "hydra.run.dir=/proc/nope/job", None),
    ("sweep folder that cannot be created", ["-m", "seed=0,1", "hydra.sweep.dir=/proc/nope/sweep"], USER,
     "hydra.sweep.dir=/proc/nope/sweep", None),
    # the job starts and ends in error: one line, exit 2, result.json whole with status error
    ("missing checkpoint", ["model.checkpoint=/nonexistent/Huggy.pt"], USER, "not found", "error"),
    ("random bytes checkpoint", ["model.checkpoint={bytes_pt}"], USER, "not a torch file", "error"),
    ("hostile pickle", ["model.checkpoint={evil_pt}"], USER, "refused", "error"),
    ("NaN weight", ["model.checkpoint={nan_pt}"], USER, "NaN", "error"),
    ("negative variance", ["model.checkpoint={negvar_pt}"], USER, "running_variance", "error"),
    ("not an onnx file", ["model.onnx={garbage_onnx}"], USER, "garbage.onnx", "error"),
    ("NaN observation", ["obs.source=file", "obs.path={nan_npy}"], USER, "NaN", "error"),
    ("wrong observation width", ["model.checkpoint={pt}", "obs.source=file", "obs.path={narrow_npy}"], USER,
     "wrong observation width", "error"),
    ("pickled observation file", ["obs.source=file", "obs.path={object_npy}"], USER, "object.npy", "error"),
    ("npy header claims 1e12 rows", ["obs.source=file", "obs.path={huge_npy}"], USER, "limit", "error"),
    ("file source without a path", ["obs.source=file"], USER, "obs.path", "error"),
    ("rows that cannot fit", ["obs.rows=100000000000"], USER, "limit", "error"),
    ("behavior not in folder", ["model.results_dir={results}", "model.behavior=Walker"], USER, "Walker", "error"),
    ("malformed training status", ["mode=checkpoints", "model.results_dir={bad_status}"], USER, "training_status.json",
     "error"),
    ("onnx of another policy", ["mode=onnx-compare", "model.checkpoint={pt}", "model.onnx={other_onnx}"], USER,
     "not an ML-Agents policy", "error"),
    ("replay without trajectory", ["mode=stats", "mode.source=replay"], USER, "mode.trajectory", None),  # the schema, before any job
    # verdicts
    ("fp16 overflow is a failure, not a pass", ["model.checkpoint={fp16_overflow_pt}", "dtype=fp16", "obs.rows=4"], 1,
     "NaN/inf", "failed"),
    ("onnx-compare against a graph that disagrees fails", ["mode=onnx-compare", "model.checkpoint={pt}",
                                                           "model.onnx={shifted_onnx}", "obs.rows=8", "mode.samples=16"],
     1, "max_abs", "failed"),
    ("cuda on a CPU machine is skipped", ["device=cuda"], 0, "", "skipped"),
    ("npu without torch_npu is skipped", ["device=npu:1"], 0, "", "skipped"),
    ("a plain run passes", ["obs.rows=4"], 0, "", "passed"),
    ("a missed expectation exits 1", ["obs.rows=4", "expect=failed"], 1, "", "passed"),
    ("a met expectation exits 0", ["model.checkpoint={fp16_overflow_pt}", "dtype=fp16", "obs.rows=4", "expect=failed"], 0,
     "", "failed"),
]


@pytest.mark.parametrize("name, args, code, fragment, status", MATRIX, ids=[m[0] for m in MATRIX])
def test_command_line_matrix(name, args, code, fragment, status, files, tmp_path):
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    if not any(a.startswith("tracking") for a in args):
        args.append("tracking=none")
    job = tmp_path / "job"
    got = cli(args, job)
    assert got.code == code, f"{name}: exit {got.code}\n{got.out}\n{got.err}"
    assert "Traceback" not in got.err and "Traceback" not in got.out, got.err
    if fragment:
        lines = [ln for ln in (got.out + got.err).splitlines() if fragment in ln]
        assert lines, f"{name}: no line names {fragment!r}\n{got.out}\n{got.err}"
    if status is None:
        assert got.record is None and got.err.startswith("error: ") and got.err.count("\n") == 1, got.err
    else:
        assert got.record is not None and got.record["status"] == status, got.record
        assert {"mode", "run_name", "job_id", "status", "reason", "metrics", "model", "tracking"} <= set(got.record)
        if status == "error":
            assert fragment in got.record["reason"] and "\n" not in got.record["reason"]
            assert "internal error" not in got.record["reason"]
    assert not files["marker"].exists()
    assert len(MATRIX) >= 40


@pytest.mark.parametrize("batch_size", [64, 1])
def test_fp32_cpu_actions_are_bit_identical_to_mlagents_ops_on_our_own_fixture(huggy_actor, batch_size, tmp_path):
    from huggy_exp.mlagents import load_checkpoint
    from huggy_exp.placement import resolve
    from huggy_exp.runners import ACTIONS, TorchRunner

    obs = huggy_actor.in_distribution_obs(32, seed=3)
    obs[:2] = 1e4  # the clamp at +-5 too
    state = huggy_actor.state_dict()
    path = huggy_actor.save(tmp_path / "Huggy" / "Huggy-5.pt", 5)
    got = TorchRunner(load_checkpoint(path).weights, resolve("cpu", "fp32"), batch_size).infer({"obs_0": obs})[ACTIONS]
    expected = np.concatenate([mlagents_forward(state, obs[i:i + batch_size]) for i in range(0, len(obs), batch_size)])
    np.testing.assert_array_equal(got, expected)  # not allclose: F.silu for x*sigmoid(x) is 8e-7 off and must fail


def test_nan_inf_in_any_output_array_fails_with_count_and_place():
    result = Result(arrays={"actions": np.array([[0.1, np.nan], [np.inf, 0.2]], np.float32), "ids": np.arange(3)})
    result.check_finite()
    assert result.status == "failed" and "actions: 2 NaN/inf values (first at [0, 1])" in result.reason


# --- tracking: pending, sync exactly once, statuses


def _client(uri: str):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def _runs(uri: str):
    from mlflow.entities import ViewType

    client = _client(uri)
    experiment = client.get_experiment_by_name("huggy_exp")
    return [] if experiment is None else client.search_runs([experiment.experiment_id], run_view_type=ViewType.ACTIVE_ONLY,
                                                            max_results=500)


def test_error_jobs_are_failed_in_mlflow_and_verdicts_are_tags(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    bad = cli(["model.checkpoint=/nonexistent.pt", "tracking=mlflow", f"tracking.uri={uri}"], tmp_path / "bad")
    good = cli(["obs.rows=4", "tracking=mlflow", f"tracking.uri={uri}"], tmp_path / "good")
    assert (bad.code, good.code) == (2, 0)
    status = {r.data.tags["status"]: r.info.status for r in _runs(uri)}
    assert status == {"error": "FAILED", "passed": "FINISHED"}
    assert good.record["tracking"]["status"] == "logged" and good.record["tracking"]["run_id"]


def test_a_broken_store_is_one_line_naming_the_file_and_the_fix_then_sync_logs_everything(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    db.write_bytes(np.random.default_rng(305).bytes(4096))
    uri = f"sqlite:///{db}"
    got = cli(["obs.rows=4", "tracking=mlflow", f"tracking.uri={uri}"], tmp_path / "job")
    assert got.code == 3, got.err
    reason = got.record["tracking"]["reason"]
    assert got.record["status"] == "passed" and got.record["tracking"]["status"] == "pending"
    assert str(db) in reason and "mv " in reason and "mode=sync" in reason
    db.rename(db.with_name("mlflow.db.broken"))
    counts = tracking.sync({"uri": uri}, [tmp_path])
    assert counts == {"seen": 1, "logged": 1, "pending": 0, "skipped": 0, "closed": 0}
    assert len(_runs(uri)) == 1
    assert tracking.sync({"uri": uri}, [tmp_path])["seen"] == 0  # exactly once


def test_no_environment_variable_reaches_result_json_or_mlflow(tmp_path, monkeypatch):
    monkeypatch.setenv("HUGGY_TEST_API_TOKEN", "s3cr3t-value-4711")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    got = cli(["mode=info", "tracking=mlflow", f"tracking.uri={uri}"], tmp_path / "job")
    assert got.code == 0, got.err
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "job").rglob("*") if p.is_file())
    run_ = _runs(uri)[0]
    assert "s3cr3t-value-4711" not in written + json.dumps(run_.data.tags) + json.dumps(run_.data.params)


def test_a_hung_server_costs_one_probe_per_sweep_not_minutes_per_point(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "PROBE_TIMEOUT_S", 1.0)  # the bound (3 s) only sets how long the one probe waits
    with socket.socket() as hung:  # accepts connections into its backlog and never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        started = time.monotonic()
        got = cli(["-m", "seed=0,1,2", "obs.rows=4", "tracking=mlflow", f"tracking.uri={uri}",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}"], None)
        elapsed = time.monotonic() - started
    assert got.code == 3, got.err
    assert elapsed < 30, elapsed  # one probe of a few seconds, then every point goes straight to pending
    records = [json.loads(p.read_text()) for p in (tmp_path / "sweep").glob("*/result.json")]
    assert len(records) == 3 and {r["tracking"]["status"] for r in records} == {"pending"}
    assert "3 not in MLflow yet" in got.out


def test_sync_replaces_a_partial_copy_and_never_duplicates(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    got = cli(["obs.rows=4", "tracking=none"], tmp_path / "job")
    record = got.record
    # a copy left half-written by a crash: same job_id, no `huggy.complete` tag, still RUNNING
    store = tracking.Store.open({"uri": uri})
    store.client.create_run(store.experiment_id, run_name="partial", tags={"huggy.job_id": record["job_id"]})
    from huggy_exp.results import update_result

    update_result(tmp_path / "job", tracking={"status": "pending", "reason": "crashed while logging"})
    assert tracking.sync({"uri": uri}, [tmp_path]) == {"seen": 1, "logged": 1, "pending": 0, "skipped": 0, "closed": 0}
    runs = _runs(uri)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED" and runs[0].data.tags["huggy.complete"] == "true"
    assert runs[0].data.metrics["answer/passed"] == 1.0


def test_result_json_is_replaced_atomically_never_rewritten_in_place(tmp_path):
    """A reader that opened result.json before the job rewrote it (the tracking outcome) still reads the whole old
    record: the new one is a new file moved over it, never a truncate-and-write a crash could leave half done."""
    from huggy_exp.results import update_result, write_result

    write_result(tmp_path, {"mode": "action"}, Result(metrics={"rows": 4.0}))
    with open(tmp_path / "result.json") as before:
        update_result(tmp_path, tracking={"status": "logged", "run_id": "r1"})
        old = json.loads(before.read())
    assert "tracking" not in old and old["metrics"] == {"rows": 4.0}
    assert json.loads((tmp_path / "result.json").read_text())["tracking"]["run_id"] == "r1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]  # no temp file left behind


def test_the_sqlite_store_lock_excludes_every_other_writer(tmp_path):
    """While one writer holds mlruns/mlflow.db.lock, another (a process, or another open of the file) cannot take it:
    the in-process check of what the concurrent sweeps of the slow run exercise."""
    import fcntl

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    lock = tmp_path / "store" / "mlflow.db.lock"
    with tracking.store_lock(uri):
        with open(lock, "a") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    with tracking.store_lock("http://127.0.0.1:9"):  # servers serialise themselves: no lock, no file
        pass


def _schema(db: Path) -> list:
    """Each table and index with the clauses of its SQL as a set: MLflow's own migrations order a table's CHECK
    constraints differently from one run to the next (two fresh databases differ that way), the schema does not."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(db)) as con:
        rows = con.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    return sorted((kind, name, frozenset(ln.strip().rstrip(",") for ln in (sql or "").splitlines())) for kind, name, sql in rows)


def test_a_new_sqlite_store_starts_as_a_copy_of_an_empty_one_mlflow_migrated(tmp_path, monkeypatch):
    """The schema migrations run once per MLflow version (into the cache dir); each new store is a copy of that
    empty store, with the schema MLflow itself gives a new database, and MLflow's Default experiment at its own root."""
    import sqlite3

    import mlflow

    monkeypatch.setenv("HUGGY_EXP_CACHE", str(tmp_path / "cache"))
    first = tracking.Store.open({"uri": f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "experiment": "x"})
    [template] = (tmp_path / "cache").glob("mlflow-*-empty.db")
    assert template.name == f"mlflow-{mlflow.__version__}-empty.db"
    with contextlib.closing(sqlite3.connect(template)) as con:
        assert con.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)  # no artifact root of its own
    built = template.stat().st_mtime_ns
    second = tracking.Store.open({"uri": f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "experiment": "x"})
    assert template.stat().st_mtime_ns == built  # not rebuilt
    migrated = tmp_path / "migrated.db"
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{migrated}").search_experiments()
    assert _schema(tmp_path / "a" / "mlflow.db") == _schema(tmp_path / "b" / "mlflow.db") == _schema(migrated)
    for store, folder in ((first, "a"), (second, "b")):
        assert store.client.get_experiment("0").name == "Default"
        assert store.client.get_experiment(store.experiment_id).artifact_location == (tmp_path / folder).as_uri()
    run_id = second.client.create_run(second.experiment_id).info.run_id
    again = tracking.Store.open({"uri": f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "experiment": "x"})
    assert again.client.get_run(run_id).info.run_id == run_id  # an existing store is opened, never replaced
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["mlflow.db", "mlflow.db.lock"]  # no seed left


def test_a_store_whose_writer_was_killed_mid_transaction_is_recovered_not_refused(tmp_path):
    """kill -9 in the middle of a write leaves a hot journal beside the database; the probe must let SQLite roll it
    back (a read-only look fails with "attempt to write a readonly database"), and the store opens with its runs."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    store = tracking.Store.open({"uri": uri, "experiment": "x"})
    run_id = store.client.create_run(store.experiment_id).info.run_id
    tracking._forget_stores()
    db = tmp_path / "store" / "mlflow.db"
    writer = ("import os, sqlite3\n"
              f"con = sqlite3.connect({str(db)!r}, isolation_level=None)\n"
              "con.execute('PRAGMA cache_size=1'); con.execute('BEGIN')\n"
              "for i in range(3000):\n"
              "    con.execute('INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)', (f'k{i}', 'v' * 500, %r))\n"
              "os._exit(9)\n" % run_id)
    subprocess.run([sys.executable, "-c", writer], check=False, timeout=60)
    assert (tmp_path / "store" / "mlflow.db-journal").is_file()  # the hot journal the killed writer left
    tracking.probe(uri)
    again = tracking.Store.open({"uri": uri, "experiment": "x"})
    assert "k0" not in again.client.get_run(run_id).data.tags  # the killed writer's transaction was rolled back


def test_without_a_writable_cache_dir_mlflow_migrates_the_new_store_itself(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the cache dir would be")
    monkeypatch.setenv("HUGGY_EXP_CACHE", str(tmp_path / "cache"))
    store = tracking.Store.open({"uri": f"sqlite:///{tmp_path / 's' / 'mlflow.db'}", "experiment": "x"})
    assert store.client.get_experiment(store.experiment_id).name == "x"


# --- processes: concurrent first runs, an outage, an interrupt


def _default_sigint() -> None:
    """A shell without job control starts background jobs with SIGINT ignored, and Python then never raises
    KeyboardInterrupt: a suite started with `&` would see Ctrl-C do nothing. The job gets a terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _spawn(args: list[str], cwd: Path, cache: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, str(REPO / "run.py"), *args], cwd=cwd, env=subprocess_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint, **kw)


@pytest.mark.slow
def test_four_first_runs_at_once_on_a_fresh_store_lose_nothing_and_share_no_directory(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    procs = [_spawn(["obs.rows=4", f"seed={i}", f"tracking.uri={uri}"], tmp_path, huggy_exp_cache) for i in range(4)]
    outputs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [o[1][-2000:] for o in outputs]
    dirs = sorted(p.parent for p in (tmp_path / "outputs").rglob("result.json"))
    assert len(dirs) == 4 == len(set(dirs))
    runs = _runs(uri)
    assert len(runs) == 4 and {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.data.tags["huggy.job_id"] for r in runs) == sorted(json.loads((d / "result.json").read_text())["job_id"]
                                                                       for d in dirs)
    assert all("alembic" not in o[1] for o in outputs)


@pytest.mark.slow
def test_two_sweeps_at_once_into_one_store_give_two_parents_and_every_child(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    procs = [_spawn(["-m", "seed=0,1,2,3", "obs.rows=4", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / f's{k}'}"],
                    tmp_path, huggy_exp_cache) for k in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    runs = _runs(uri)
    parents = {r.info.run_id for r in runs if r.data.tags.get("huggy.parent") == "true"}
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in parents]
    assert len(parents) == 2 and len(children) == 8 and len(runs) == 10
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert "4/4 passed" in outputs[0][0] and "4/4 passed" in outputs[1][0]


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the sweep ended first (exit {proc.returncode}): {proc.stderr.read()[-2000:]}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _logged(path: Path) -> bool:
    try:
        return json.loads(path.read_text())["tracking"]["status"] == "logged"
    except (OSError, ValueError, KeyError):
        return False


@pytest.mark.slow
def test_a_server_killed_mid_sweep_leaves_pending_points_that_sync_logs_exactly_once(tmp_path, huggy_exp_cache):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(tmp_path, port)
    sweep = tmp_path / "sweep"
    try:
        proc = _spawn(["-m", "mode=batch", "seed=0,1,2,3", "obs.rows=32", "mode.budget_s=0.2", f"tracking.uri={uri}",
                       f"hydra.sweep.dir={sweep}"], tmp_path, huggy_exp_cache)
        _wait_for(lambda: _logged(sweep / "0" / "result.json") and (sweep / "1").exists(), proc)  # point 1 under way
        stop_server(server)
        started = time.monotonic()
        out, err = proc.communicate(timeout=300)
        assert time.monotonic() - started < 120  # seconds per sweep, not ~33 s per point
        assert proc.returncode == 3, err[-3000:]
        summary = json.loads((sweep / "summary.json").read_text())
        pending = summary["tally"]["pending"]
        assert 1 <= pending <= 3 and summary["tally"]["passed"] == 4
        assert "not in MLflow yet" in out and "Traceback" not in err
        server = start_server(tmp_path, port)
        sync = subprocess.run([PYTHON, str(REPO / "run.py"), "mode=sync", f"tracking.uri={uri}", f"mode.paths=[{sweep}]"],
                              cwd=tmp_path, env=subprocess_env(huggy_exp_cache), capture_output=True, text=True, timeout=180)
        assert sync.returncode == 0, sync.stderr[-2000:]
        assert f"{pending} logged, 0 still pending" in sync.stdout
        again = subprocess.run([PYTHON, str(REPO / "run.py"), "mode=sync", f"tracking.uri={uri}", f"mode.paths=[{sweep}]"],
                               cwd=tmp_path, env=subprocess_env(huggy_exp_cache), capture_output=True, text=True, timeout=180)
        assert "0 pending result(s)" in again.stdout
        runs = _runs(uri)
        parent = [r for r in runs if r.data.tags.get("huggy.parent") == "true"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
        assert len(parent) == 1 and len(children) == 4 == len({r.data.tags["huggy.job_id"] for r in children})
        assert "RUNNING" not in {r.info.status for r in children}
        assert parent[0].info.status == "FINISHED"  # its sweep could not close it; sync did, all four jobs being in
    finally:
        stop_server(server)


@pytest.mark.slow
def test_ctrl_c_mid_sweep_prints_the_summary_and_leaves_nothing_running(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    proc = _spawn(["-m", "mode=batch", "seed=0,1,2,3,4,5", "obs.rows=64", "mode.budget_s=1.0", f"tracking.uri={uri}",
                   f"hydra.sweep.dir={sweep}"], tmp_path, huggy_exp_cache)
    _wait_for(lambda: _logged(sweep / "0" / "result.json"), proc)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "interrupted" in err
    summary = json.loads((sweep / "summary.json").read_text())
    assert 1 <= len(summary["rows"]) < 6
    runs = _runs(uri)
    assert "RUNNING" not in {r.info.status for r in runs}
    parent = [r for r in runs if r.data.tags.get("huggy.parent") == "true"]
    assert len(parent) == 1 and parent[0].info.status == "KILLED"
    stopped = [json.loads(p.read_text()) for p in sweep.glob("*/result.json")]
    cut = [r for r in stopped if r["interrupted"]]
    if cut:  # the signal landed inside a job: recorded, pending, and sync logs it as KILLED
        assert cut[0]["status"] == "error" and cut[0]["tracking"]["status"] == "pending"
        assert tracking.sync({"uri": uri}, [sweep])["logged"] == 1
        killed = [r for r in _runs(uri) if r.data.tags.get("huggy.job_id") == cut[0]["job_id"]]
        assert len(killed) == 1 and killed[0].info.status == "KILLED"
