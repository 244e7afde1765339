"""Reliability, issue 27's false verdicts, foreign reads and injection: nothing that is not finite passes, diff says "not
applicable" where points cannot be compared, a sweep never recommends across different weights, sync reads foreign
results under caps and uploads only the job's own files, and every human-readable output escapes what users wrote.

docs/reliability.md ("Hostile probes") lists each class with the test that holds it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import test_certificate
from test_certificate import copy_bundle, record, replay, rewrite_npz, run_job
from test_reliability import one_line
from test_trust import _runs, cli

from huggy_exp import bundle, tracking, verify
from huggy_exp.errors import UserError

small_bundle = test_certificate.small_bundle  # the fixture: the small policy recorded in fp32


def rehash(root: Path, name: str) -> None:
    """A bundle file edited and its manifest entry updated to match: only the content checks stand in the way."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": bundle.sha256_file(root / name), "bytes": (root / name).stat().st_size}
    (root / "manifest.json").write_text(json.dumps(manifest))


def poison(root: Path, name: str, value: float = np.nan) -> Path:
    """Every float array of a bundle .npz set to `value` (NaN, inf), the manifest re-hashed."""
    rewrite_npz(root / name, lambda k, v: np.full_like(v, value) if v.dtype.kind == "f" else v)
    rehash(root, name)
    return root


# --- 7. nothing that is not finite ever passes: references, candidates and limits


@pytest.mark.parametrize("rule", ["continuous", "memory"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_reference_never_passes_the_engine(rule, bad):
    out = verify.Output("x", None, "x", rule)
    got = np.ones((4, 3), np.float32)
    ref = got.astype(np.float64)
    ref[1, 2] = bad
    c = verify.compare({"x": got}, {"x": ref}, verify.Rules(verify.Limits(atol=1e9, rtol=1.0), outputs=(out,)))
    assert not c.passed and any("reference holds 1 NaN/Inf" in f for f in c.failures)
    every = verify.compare({"x": np.full_like(got, bad)}, {"x": np.full_like(ref, bad)}, verify.Rules(outputs=(out,)))
    assert not every.passed  # the same NaN on both sides is no agreement


def test_elementwise_metrics_of_non_finite_values_are_never_perfect():
    m = verify.elementwise(np.full((3, 2), np.nan), np.full((3, 2), np.nan))
    assert m["max_abs"] == np.inf and m["rmse"] == np.inf and np.isnan(m["cosine"]) and m["nonfinite_expected"] == 6
    assert not verify.within(m["max_abs"], 1.0) and not verify.within(0.0, float("nan")) and not verify.within(0, np.inf)
    assert verify.within(0.5, 1.0) and not verify.within("0.5", None)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "x", None, True])
def test_a_limit_that_is_not_a_finite_number_is_an_error(value):
    with pytest.raises(UserError, match=r"verify.limits.fp32.max_abs=.*finite number"):
        verify.finite_limits({"max_abs": value}, "verify.limits.fp32")


def test_replay_of_a_bundle_whose_fp64_reference_is_nan_fails(small_bundle, small, tmp_path):
    b = poison(copy_bundle(small_bundle, tmp_path / "b"), bundle.REFERENCE)
    r = replay(tmp_path / "job", b, small.model).record
    assert r["status"] == "failed" and "the bundle's fp64 reference actions holds" in r["reason"], r["reason"]
    assert r["metrics"].get("actions/vs_fp64/cosine") != 1.0


def test_replay_of_a_recording_with_an_inf_fails_even_without_a_match(small_bundle, small, tmp_path):
    """Variant: one +inf in the recorded point; the replay is held to it through mode.reference_point=fp32 in bf16."""
    b = copy_bundle(small_bundle, tmp_path / "b")
    name = "points/cpu-fp32-eager-b64/outputs.npz"
    rewrite_npz(b / name, lambda k, v: np.where(np.arange(v.size).reshape(v.shape) == 0, np.inf, v).astype(v.dtype)
                if v.dtype.kind == "f" else v)
    rehash(b, name)
    r = replay(tmp_path / "job", b, small.model, "dtype=bf16", "mode.reference_point=fp32").record
    assert r["status"] == "failed" and "the recording cpu/fp32/eager/b64 actions holds 1 NaN/Inf" in r["reason"], r["reason"]


def test_diff_against_a_nan_reference_or_nan_candidate_fails(small_bundle, tmp_path):
    nan_ref = poison(copy_bundle(small_bundle, tmp_path / "nan_ref"), bundle.REFERENCE)
    r = run_job(tmp_path / "d1", "diff", f"mode.baseline={small_bundle}", f"mode.candidate={nan_ref}").record
    assert r["status"] == "failed" and "fp64 reference actions holds" in r["reason"], r["reason"]
    r = run_job(tmp_path / "d2", "diff", f"mode.baseline={nan_ref}", f"mode.candidate={small_bundle}").record
    assert r["status"] == "failed" and "baseline cpu/fp32/eager/b64: fp64 reference" in r["reason"], r["reason"]
    nan_out = poison(copy_bundle(small_bundle, tmp_path / "nan_out"), "points/cpu-fp32-eager-b64/outputs.npz")
    r = run_job(tmp_path / "d3", "diff", f"mode.baseline={small_bundle}", f"mode.candidate={nan_out}").record
    assert r["status"] == "failed" and "candidate cpu/fp32/eager/b64: actions holds" in r["reason"], r["reason"]


@pytest.mark.parametrize("override, key", [
    ("verify.specialize={cpu_fp16: {layer_rel_rmse: nan}}", "specialize.cpu_fp16.layer_rel_rmse"),
    ("verify.limits.fp16.layer_rel_rmse=inf", "verify.limits.fp16.layer_rel_rmse"),
    ("verify.specialize={cpu_fp16: {max_abs: .nan}}", "specialize.cpu_fp16.max_abs"),
])
def test_a_non_finite_limit_never_switches_a_check_off(override, key, small, tmp_path):
    got = cli(["mode=precision", small.model, "dtype=fp16", "obs.rows=8", "tracking=none", override], tmp_path / "job")
    line = one_line(got, "finite number")
    assert got.code == 2 and key in line and (got.record is None or got.record["status"] == "error"), got.err[-2000:]


def test_a_nan_tolerance_in_replay_is_an_error(small_bundle, small, tmp_path):
    r = replay(tmp_path / "job", small_bundle, small.model, "verify.limits.fp32.max_abs=nan").record
    assert r["status"] == "error" and "verify.limits.fp32.max_abs" in r["reason"], r["reason"]


# --- 8. diff of points on other inputs: not applicable, never an error


@pytest.mark.parametrize("other", ["obs.rows=12", "obs.scale=2.0"])
def test_diff_of_two_sweeps_on_other_inputs_says_not_applicable(other, small, tmp_path):
    for side, obs in (("base", "obs.rows=8"), ("cand", other)):
        for n, dtype in enumerate(("fp32", "bf16")):
            job = run_job(tmp_path / side / str(n), "precision", small.model, f"dtype={dtype}", "obs.rows=8", obs)
            assert job.record["status"] in ("passed", "failed"), job.record["reason"]
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={tmp_path / 'base'}", f"mode.candidate={tmp_path / 'cand'}").record
    assert r["status"] == "passed", r["reason"]
    both = [p for p in r["points"] if p["side"] == "both"]
    assert both and all("not applicable" in " ".join(p["changes"]) and p["dual"] is None for p in both), both


# --- tracking: a pending job to sync, and a store


def pending_job(tmp_path: Path, name: str = "job") -> Path:
    """A finished job whose store was down: its result.json is pending, for sync."""
    down = tmp_path / "down"
    down.mkdir(exist_ok=True)
    got = cli(["mode=info", f"tracking.uri=sqlite:///{down}"], tmp_path / "runs" / name)
    assert got.code == 3, got.err[-2000:]
    return tmp_path / "runs" / name


def edit_result(job: Path, **fields) -> None:
    record = json.loads((job / "result.json").read_text())
    (job / "result.json").write_text(json.dumps({**record, **fields}))


def store(tmp_path: Path, name: str = "store") -> str:
    return f"sqlite:///{tmp_path / name / 'mlflow.db'}"


def uploaded(uri: str) -> dict[str, set[str]]:
    """Every run's artifact paths (recursively), by run name."""
    client = tracking.Store.open({"uri": uri}).client

    def walk(run_id: str, path: str | None = None) -> set[str]:
        found = set()
        for a in client.list_artifacts(run_id, path):
            found |= walk(run_id, a.path) if a.is_dir else {a.path}
        return found

    return {r.info.run_name: walk(r.info.run_id) for r in _runs(uri)}


# --- 10. sync uploads only files inside the job's own folder


def test_sync_uploads_only_files_inside_the_jobs_folder(tmp_path):
    job = pending_job(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own file")
    (job / "inside.txt").write_text("the job's own file")
    (job / "link.txt").symlink_to(secret)  # a link out of the folder, named as if inside
    (job / "sub").mkdir()
    (job / "sub" / "up.txt").symlink_to(Path("..") / ".." / ".." / "secret.txt")
    edit_result(job, files=[str(secret), "../../secret.txt", "link.txt", "sub/up.txt", "inside.txt", str(job / "inside.txt"),
                            "/etc/hostname"], arrays={"x": str(secret)})
    uri = store(tmp_path)
    assert tracking.sync({"uri": uri}, [tmp_path / "runs"])["logged"] == 1
    (names,) = uploaded(uri).values()
    assert "inside.txt" in names and "result.json" in names
    assert not {"secret.txt", "link.txt", "up.txt", "sub/up.txt", "hostname"} & names, names


# --- 11. a sweep synced into another store gets a parent there


def test_a_sweep_synced_into_another_store_points_its_children_at_a_parent_in_that_store(tmp_path):
    first, second = store(tmp_path, "first"), store(tmp_path, "second")
    sweep = tmp_path / "sweep"
    got = cli(["-m", "mode=info", "seed=0,1", f"tracking.uri={first}", f"hydra.sweep.dir={sweep}"], None)
    assert got.code == 0, got.err[-2000:]
    for job in (sweep / "0", sweep / "1"):
        edit_result(job, tracking={"status": "pending", "reason": "moved to another store"})
    assert tracking.sync({"uri": second}, [sweep])["logged"] == 2
    runs = _runs(second)
    ids = {r.info.run_id for r in runs}
    children = [r for r in runs if r.data.tags.get("huggy.parent") != "true"]
    assert len(children) == 2 and all(r.data.tags["mlflow.parentRunId"] in ids for r in children)
    assert len(ids - {r.info.run_id for r in children}) == 1  # one parent, in this store
    assert json.loads((sweep / "0" / "result.json").read_text())["tracking"]["parent_run_id"] in ids


# --- 12. credentials never in plain text: database passwords and tokens, before Hydra writes .hydra/


@pytest.mark.parametrize("uri, secret", [
    ("postgresql://alice:pg-hunter2@127.0.0.1:{port}/mlflow", "pg-hunter2"),
    ("http://127.0.0.1:{port}/?token=tok-hunter2", "tok-hunter2"),
    ("mysql://bob:my-hunter2@127.0.0.1:{port}/db?ssl_key=key-hunter3", "hunter"),
])
def test_a_store_secret_never_reaches_hydras_files_or_the_result(uri, secret, tmp_path, monkeypatch):
    from conftest import free_port

    monkeypatch.delenv(tracking.SECRETS_ENV, raising=False)
    uri = uri.format(port=free_port())
    got = cli(["mode=info", f"tracking.uri='{uri}'"], tmp_path / "job")
    assert got.code in (0, 3), got.err[-2000:]
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert (tmp_path / "job" / ".hydra" / "overrides.yaml").is_file()
    assert secret not in written + got.out + got.err, [ln for ln in written.splitlines() if secret in ln]
    assert tracking.store_uri(tracking.redact(uri)) == uri  # MLflow's client still gets the whole URI


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_store_secret_in_a_config_file_never_reaches_hydras_files(sweep, tmp_path, monkeypatch):
    """The URI comes from the user's own tracking file (`--config-dir mine tracking=prod`), not the command line:
    masked before Hydra writes .hydra/ (and a sweep's multirun.yaml), and MLflow's client still gets the whole URI."""
    from conftest import free_port

    monkeypatch.delenv(tracking.SECRETS_ENV, raising=False)
    uri = f"postgresql://carol:file-hunter4@127.0.0.1:{free_port()}/mlflow?sslpassword=ssl-hunter5"
    (tmp_path / "mine" / "tracking").mkdir(parents=True)
    (tmp_path / "mine" / "tracking" / "prod.yaml").write_text(f"enabled: true\nuri: '{uri}'\nexperiment: e\n"
                                                              "http_retries: 0\nhttp_timeout_s: 1\nui_port: 5000\n")
    args = ["--config-dir", str(tmp_path / "mine"), "mode=info", "tracking=prod"]
    if sweep:
        got = cli(["-m", *args, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'job'}"], None)
    else:
        got = cli(args, tmp_path / "job")
    assert got.code in (0, 3), got.err[-2000:]
    files = [p for p in (tmp_path / "job").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and (not sweep or (tmp_path / "job" / "multirun.yaml").is_file())
    written = "".join(p.read_text(errors="replace") for p in files)
    assert "hunter" not in written + got.out + got.err, [ln for ln in written.splitlines() if "hunter" in ln]
    assert "carol:***@" in written
    assert tracking.store_uri(tracking.redact(uri)) == uri


def test_ray_points_carry_the_stores_kept_aside_secret_to_workers_on_other_hosts(monkeypatch):
    pytest.importorskip("ray")
    from hydra_plugins.huggy_ray_launcher import _core

    monkeypatch.delenv(tracking.SECRETS_ENV, raising=False)
    shown = tracking.hide_secrets("postgresql://dan:ray-hunter6@10.0.0.9/mlflow")
    nodes = [{"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8.0}}]
    options, _ = _core.point_options({"cpus_per_point": 1, "ray": {"remote": {"runtime_env": {"env_vars": {"A": "1"}}}}},
                                     "cpu", "info", nodes)
    env = options["runtime_env"]["env_vars"]
    assert env["A"] == "1" and json.loads(env[tracking.SECRETS_ENV])[shown].endswith(":ray-hunter6@10.0.0.9/mlflow")


def test_secret_query_values_are_redacted_wherever_they_sit():
    text = "store http://h:5000/api?x=1&access_token=abc&sig=zz#f and s3://b/k?X-Amz-Signature=deadbeef&y=2"
    shown = tracking.redact(text)
    assert all(s not in shown for s in ("abc", "zz#", "deadbeef")) and "x=1" in shown and "y=2" in shown


# --- 13. odd stores are refused


def test_another_applications_sqlite_file_is_refused_and_left_as_it_was(tmp_path):
    import sqlite3

    db = tmp_path / "app.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
        con.execute("INSERT INTO customers VALUES (1, 'ann')")
    con.close()
    before = db.read_bytes()
    got = cli(["mode=info", f"tracking.uri=sqlite:///{db}"], tmp_path / "job")
    assert got.code == 3 and "another application's SQLite database" in one_line(got, "customers")
    assert db.read_bytes() == before


@pytest.mark.parametrize("uri, fragment", [
    ("sqlite:///{d}/x.db?mode=ro", "takes no query"),
    ("sqlite:///{d}/x.db?cache=shared&mode=rwc", "takes no query"),
    ("sqlite://", "in-memory"),
    ("sqlite:///:memory:", "in-memory"),
    ("sqlite:///file:mem1?mode=memory&cache=shared", "in-memory"),
])
def test_a_sqlite_uri_with_a_query_or_in_memory_is_refused(uri, fragment, tmp_path):
    got = cli(["mode=info", f"tracking.uri='{uri.format(d=tmp_path)}'"], tmp_path / "job")
    assert got.code == 2 and "tracking.uri=" in one_line(got, fragment)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("x.db")]


# --- 14. sync: one reader for foreign results; a bad one is one line, the good ones are still logged


def foreign(tmp_path: Path, name: str, text: str | bytes) -> Path:
    folder = tmp_path / "runs" / name
    folder.mkdir(parents=True)
    path = folder / "result.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_sync_skips_wrongly_typed_deep_and_special_results_in_one_line_each_and_logs_the_good_ones(tmp_path):
    good = pending_job(tmp_path, "zz-good")  # sorted last: every bad file is met before it
    record = json.loads((good / "result.json").read_text())
    typed = {"metrics": [1, 2], "status": "maybe", "job_id": 7, "files": "x.txt", "sweep": {"id": 1}, "series": {"a": [1]}}
    for key, value in typed.items():
        foreign(tmp_path, f"typed-{key}", json.dumps({**record, key: value}))
    foreign(tmp_path, "deep", '{"tracking": {"status": "pending"}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    (tmp_path / "runs" / "fifo").mkdir()
    os.mkfifo(tmp_path / "runs" / "fifo" / "result.json")
    (tmp_path / "runs" / "zero").mkdir()
    (tmp_path / "runs" / "zero" / "result.json").symlink_to("/dev/zero")
    lines = []
    counts = tracking.sync({"uri": store(tmp_path)}, [tmp_path / "runs", tmp_path / "missing"], say=lines.append)
    skipped = [ln for ln in lines if ln.startswith("sync: skipped")]
    assert counts["logged"] == 1 and counts["pending"] == 0 and counts["skipped"] == len(typed) + 4, lines
    assert len(skipped) == len(typed) + 4 and all("\n" not in ln for ln in skipped)
    assert any("missing: no such folder" in ln for ln in skipped)
    assert any("fifo/result.json is not a regular file (a FIFO)" in ln for ln in skipped)
    assert any("zero/result.json is not a regular file (a character device)" in ln for ln in skipped)
    assert any("deep/result.json nests 100,001 levels" in ln for ln in skipped), skipped


def test_sync_passes_over_a_result_whose_tracking_is_not_an_object(tmp_path):
    """Not a pending result (its `tracking` is no object): not sync's to log, and no traceback either."""
    foreign(tmp_path, "odd", json.dumps({"tracking": "pending"}))
    counts = tracking.sync({"uri": store(tmp_path)}, [tmp_path / "runs"], say=print)
    assert counts == {"logged": 0, "pending": 0, "seen": 0, "skipped": 0, "closed": 0}


def test_sync_mode_exits_2_naming_a_missing_folder(tmp_path):
    got = cli(["mode=sync", f"tracking.uri={store(tmp_path)}", f"mode.paths=[{tmp_path / 'nope'}]"], None)
    assert got.code == 2 and str(tmp_path / "nope") in one_line(got, "no such folder")


# --- 16 (foreign reads): every foreign file read under a cap


def test_sync_reads_a_result_json_under_a_cap(tmp_path, monkeypatch):
    from huggy_exp import foreign

    job = pending_job(tmp_path)
    monkeypatch.setattr(foreign, "MAX_JSON_BYTES", 512)
    lines = []
    counts = tracking.sync({"uri": store(tmp_path)}, [tmp_path / "runs"], say=lines.append)
    assert counts["skipped"] == 1 and f"{job / 'result.json'} is over the 512 B limit" in lines[0], lines


def test_a_bundle_npz_member_that_declares_a_huge_array_is_refused_unread(tmp_path):
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (412_316_860_416,)})
    with zipfile.ZipFile(tmp_path / "x.npz", "w") as zf:
        zf.writestr("seconds.npy", header.getvalue() + b"\0" * 64)  # 1.5 TiB declared, 64 bytes given
    with pytest.raises(UserError, match=r"seconds.npy declares 1,536.0 GiB .*not loaded"):
        bundle.load_npz(tmp_path, "x.npz")


def test_a_bundle_npz_that_inflates_past_the_cap_is_refused(tmp_path, monkeypatch):
    from huggy_exp import foreign

    buffer = io.BytesIO()
    np.savez_compressed(buffer, a=np.zeros(1 << 20), b=np.zeros(1 << 20))  # 16 MiB of zeros in a few KiB
    (tmp_path / "x.npz").write_bytes(buffer.getvalue())
    assert (tmp_path / "x.npz").stat().st_size < 100_000
    monkeypatch.setattr(foreign, "MAX_ARRAY_BYTES", 4 << 20)
    with pytest.raises(UserError, match="declares 8.0 MiB"):
        bundle.load_npz(tmp_path, "x.npz")
    monkeypatch.setattr(foreign, "MAX_ARRAY_BYTES", 8 << 20)
    monkeypatch.setattr(foreign, "MAX_NPZ_BYTES", 12 << 20)
    with pytest.raises(UserError, match="16.0 MiB together"):
        bundle.load_npz(tmp_path, "x.npz")


def test_a_bundle_with_too_many_latency_samples_is_refused(small_bundle, small, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "MAX_LATENCY_SAMPLES", 10)
    r = replay(tmp_path / "job", small_bundle, small.model).record
    assert r["status"] == "error" and "at most 10 timed calls" in r["reason"], r["reason"]


def test_the_latency_bootstrap_stays_small_whatever_the_sample_count():
    import tracemalloc

    from huggy_exp import certify

    rng = np.random.default_rng(0)
    recorded, here = rng.gamma(4, 1e-5, 400_000), rng.gamma(4, 1.1e-5, 300)
    tracemalloc.start()
    change = certify.latency_change(recorded, here)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 256 << 20, peak  # unchunked: 2,000 x 400,000 int64 indices = 6.4 GB
    assert change["verdict"] in ("slower", "not significant", "within tolerance") and change["ci95_low"] < change["ci95_high"]


def test_a_deeply_nested_bundle_manifest_is_one_line(small_bundle, small, tmp_path):
    b = copy_bundle(small_bundle, tmp_path / "b")
    manifest = json.loads((b / "manifest.json").read_text())
    (b / "manifest.json").write_text(json.dumps(manifest)[:-1] + ', "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    r = replay(tmp_path / "job", b, small.model).record
    assert r["status"] == "error" and "nests 50,001 levels deep" in r["reason"], r["reason"]


# --- 9. a checkpoint replaced between sweep points: no recommendation across different weights


def test_a_checkpoint_replaced_mid_sweep_is_named_and_never_recommended_across(small, tmp_path):
    from conftest import small_weights

    from huggy_exp import compare, mlagents
    from huggy_exp.sweep import summarize

    pt = tmp_path / "Small" / "Small-100.pt"
    shutil.copytree(small.pt.parent, pt.parent)
    sweep = tmp_path / "sweep"
    first = run_job(sweep / "0", "precision", f"model.checkpoint={pt}", "dtype=fp32", "obs.rows=8").record
    w = small_weights()
    w.layers[0][0][...] *= 1.5  # other numbers, the same file name: a retrained or swapped checkpoint
    mlagents.save_checkpoint(w, pt, 100)
    second = run_job(sweep / "1", "precision", f"model.checkpoint={pt}", "dtype=bf16", "obs.rows=8").record
    assert first["model"]["weights_sha256"] != second["model"]["weights_sha256"]
    summary = summarize(sweep)
    (rec,) = summary["comparison"]["recommended"].values()
    assert rec["dtype"] is None and "no recommendation across different weights" in rec["why"]
    assert "job 0 ran weights" in rec["why"] and "job 1 ran weights" in rec["why"]
    assert any("no recommendation across different weights" in ln for ln in summary["comparison"]["lines"])
    rows = [{**r, "weights_sha256": first["model"]["weights_sha256"]} for r in summary["rows"]]  # variant: one model
    assert all(rec.get("mixed_weights") is None for rec in compare.recommend(rows).values())


# --- 18. one escaping function for every human-readable output


HOSTILE = '<img src=x onerror=alert(5)>|[x](javascript:alert(1))'


def test_escape_leaves_no_markup_in_html_or_markdown():
    from huggy_exp.report import escape

    shown = escape(HOSTILE + "\nnext")
    assert not set("<>|[]\n") & set(shown) and "&lt;img" in shown


def test_run_names_and_user_text_are_escaped_in_every_report(small, tmp_path, monkeypatch):
    """A case name in report.html's noisy paragraph and summary.md; a reason in the parent's MLflow description; a
    bundle's environment field in replay's report.md."""
    from huggy_exp import report, sweep
    from huggy_exp.headline import noisy

    row = {"job": "0", "run_name": HOSTILE, "status": "failed", "metrics": {"p50_us": 5.0}, "noisy": True, "note": HOSTILE,
           "limits": {}, "mode": "info", "device": "cpu", "dtype": "fp32", "batch_size": 1, "obs": "random/8", "seed": 0,
           "case": HOSTILE, "line": HOSTILE, "dir": str(tmp_path), "model_sha256": None, "expect": None, "tracking": "off"}
    summary = {"rows": [row], "line": HOSTILE, "title": HOSTILE, "tally": {},
               "comparison": {"recommended": {}, "lines": [HOSTILE], "table": [], "agreement": []}}
    page = report.write_sweep_report(tmp_path, HOSTILE, summary, [], {"host": HOSTILE}).read_text()
    assert "<img" not in page and "&lt;img src=x onerror=alert(5)&gt;" in page
    monkeypatch.setattr(sweep, "draw", lambda *a: [])
    (tmp_path / "result.json").write_text(json.dumps({"environment": {}}))
    sweep.write_summary(tmp_path, summary, False)
    md = (tmp_path / "summary.md").read_text()
    assert "<img" not in md and "](javascript" not in md and "&lt;img" in md
    b = copy_bundle(small_bundle_path(small, tmp_path), tmp_path / "b")
    manifest = json.loads((b / "manifest.json").read_text())
    for point in manifest["points"].values():
        point["environment"]["versions"]["torch"] = HOSTILE
    (b / "manifest.json").write_text(json.dumps(manifest))
    replay(tmp_path / "job", b, small.model)
    text = (tmp_path / "job" / "report.md").read_text()
    assert "<img" not in text and "&lt;img src=x" in text
    assert noisy  # the headline module the reports read


def small_bundle_path(small, tmp_path: Path) -> Path:
    out = tmp_path / "rec-bundle"
    assert record(tmp_path / "rec", out, small.model, "obs.rows=8").record["status"] == "passed"
    return out


def test_the_mlflow_descriptions_are_escaped(tmp_path):
    uri, folder = store(tmp_path), tmp_path / "sweep"
    info = tracking.start_sweep({"uri": uri}, folder, "sid", ["mode=info", f"obs.path='{HOSTILE}.npy'"], 1)
    summary = {"rows": [], "line": HOSTILE, "tally": {"passed": 1},
               "comparison": {"recommended": {"cpu": {"dtype": None, "why": HOSTILE}}, "lines": [HOSTILE], "table": []}}
    assert tracking.end_sweep({"uri": uri}, folder, summary, []) is not None
    parent = tracking.Store.open({"uri": uri}).client.get_run(info["parent_run_id"])
    note = parent.data.tags["mlflow.note.content"]
    assert "<img" not in note and "](javascript" not in note and "&lt;img" in note, note
    record = {"job_id": "j", "mode": "info", "run_name": HOSTILE, "status": "passed", "device": "cpu", "dtype": "fp32",
              "headline": HOSTILE}
    assert "<img" not in tracking.run_tags(record, None)["mlflow.note.content"]


@pytest.mark.slow
def test_the_logging_helper_of_a_killed_job_ends_quietly_and_records_the_outcome(tmp_path, huggy_exp_cache):
    """kill -9 of a job closes the pipe its helper answers on: no BrokenPipeError traceback, the outcome still kept."""
    import subprocess

    from conftest import PYTHON, REPO, subprocess_env

    job = pending_job(tmp_path)
    proc = subprocess.Popen([PYTHON, "-m", "huggy_exp.tracking_worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=subprocess_env(huggy_exp_cache), cwd=REPO)
    proc.stdout.close()  # the job is gone: nobody reads the answer
    proc.stdin.write(json.dumps({"settings": {"uri": store(tmp_path)}, "workdir": str(job)}) + "\n")
    proc.stdin.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert json.loads((job / "result.json").read_text())["tracking"]["status"] == "logged"


def test_a_foreign_npy_that_declares_more_than_it_holds_is_refused_unread(small, tmp_path):
    """Variant: mode=diff reads a job dir's actions.npy, whose header claims 4 GiB in a file of 200 bytes."""
    for side in ("base", "cand"):
        job = run_job(tmp_path / side / "0", "precision", small.model, "dtype=fp32", "obs.rows=8")
        assert job.record["status"] == "passed", job.record["reason"]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1 << 30,)})
    (tmp_path / "cand" / "0" / "actions.npy").write_bytes(b"\x93NUMPY\x01\x00" + header.getvalue()[8:] + b"\0" * 64)
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={tmp_path / 'base'}", f"mode.candidate={tmp_path / 'cand'}").record
    assert r["status"] == "error" and "actions.npy declares 4.0 GiB" in r["reason"] and "\n" not in r["reason"], r["reason"]


def test_a_nan_latency_is_never_within_tolerance(small_bundle, small, tmp_path):
    from huggy_exp import certify

    change = certify.latency_change(np.array([1e-3, np.nan, 1e-3]), np.array([1e-3, 1e-3]))
    assert change["verdict"] == "not measured" and "not finite" in change["why"]
    b = poison(copy_bundle(small_bundle, tmp_path / "b"), "points/cpu-fp32-eager-b64/latency.npz")
    r = replay(tmp_path / "job", b, small.model).record
    assert r["status"] == "error" and "samples that are not finite seconds" in r["reason"], r["reason"]


def test_an_observation_npz_whose_member_declares_terabytes_is_refused_unread(tmp_path):
    """Variant on another reader: an obs.path .npz of 200 bytes whose obs_0.npy declares 1.5 TiB (numpy would allocate
    what the header declares before it finds the data missing)."""
    import zipfile

    from huggy_exp.observations import _read_npz

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (6, 68_719_476_736)})
    with zipfile.ZipFile(tmp_path / "obs.npz", "w") as zf:
        zf.writestr("obs_0.npy", header.getvalue() + b"\0" * 64)
    with pytest.raises(UserError, match=r"obs_0.npy declares 1,536.0 GiB"):
        _read_npz(tmp_path / "obs.npz")


def test_an_mlagents_status_file_that_is_a_fifo_is_one_line_not_a_hang(tmp_path):
    import signal

    from huggy_exp.mlagents.results import read_training_status

    def hung(*_):
        raise TimeoutError("the reader opened the FIFO and waits for a writer")

    os.mkfifo(tmp_path / "training_status.json")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        with pytest.raises(UserError, match="is not a regular file .a FIFO."):
            read_training_status(tmp_path / "training_status.json")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
