"""Reliability: nothing destroyed, nothing lost, no host taken down (issue 19's failure classes, each with variants).

Default tests run in-process (run.py's cli, the tracking API); `slow` ones start real processes: a tmpfs that is full,
a child bounded by RLIMIT_AS, `mlflow server` on 127.0.0.1 (with basic auth), kill -9 mid-sweep. docs/reliability.md
is the user's page of what each class now does.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import re
import shlex
import subprocess
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import (CONF, PYTHON, REPO, free_port, start_server, stop_server,
                      subprocess_env)
from test_trust import _runs, _spawn, _wait_for, cli

from huggy_exp import files, foreign, host, memory, preflight, tracking
from huggy_exp.errors import UserError


def one_line(got, fragment: str) -> str:
    """The single line of the output naming `fragment`, with no traceback anywhere."""
    text = got.out + got.err
    lines = [ln for ln in text.splitlines() if fragment in ln]
    assert lines, f"no line names {fragment!r}:\n{text[-3000:]}"
    assert "Traceback" not in text, text[-3000:]
    return lines[0]


# --- 1. outputs never replace a file unasked, the model's own files never


def test_export_refuses_an_existing_file_and_the_models_own_files(tmp_path, huggy_pt):
    model = [f"model.checkpoint={huggy_pt}", "mode=export-onnx", "tracking=none"]
    existing = tmp_path / "mine.onnx"
    existing.write_bytes(b"precious")
    got = cli([*model, f"mode.path={existing}"], tmp_path / "a")
    assert got.code == 2 and "mode.overwrite=true" in one_line(got, "already exists")
    assert existing.read_bytes() == b"precious"
    got = cli([*model, f"mode.path={existing}", "mode.overwrite=true"], tmp_path / "b")
    assert got.code == 0, got.err[-2000:]
    assert existing.read_bytes()[:4] != b"prec" and not list(tmp_path.glob(".mine.onnx.*"))  # replaced in one step
    before = huggy_pt.read_bytes()
    for i, target in enumerate((huggy_pt, huggy_pt.parent / "." / huggy_pt.name)):  # the checkpoint, spelt two ways
        got = cli([*model, f"mode.path={target}", "mode.overwrite=true"], tmp_path / f"c{i}")
        assert got.code == 2 and "model's own file" in one_line(got, "refused even with mode.overwrite=true")
    assert huggy_pt.read_bytes() == before


def test_claim_output_protects_a_results_folder_and_follows_links(tmp_path):
    results = tmp_path / "results"
    (results / "Huggy").mkdir(parents=True)
    status = results / "Huggy" / "training_status.json"
    status.write_text("{}")
    with pytest.raises(UserError, match="model's own file"):
        files.claim_output(status, True, [results], "mode.path")
    assert files.claim_output(results / "Huggy" / "new.onnx", False, [results], "mode.path").name == "new.onnx"
    link = tmp_path / "link.onnx"
    link.symlink_to(status)
    with pytest.raises(UserError, match="model's own file"):
        files.claim_output(link, True, [status], "mode.path")
    with pytest.raises(UserError, match="already exists"):
        files.claim_output(link, False, [], "mode.path")
    with pytest.raises(UserError, match="already exists"):
        files.atomic_write_text(status, "x", overwrite=False)
    assert status.read_text() == "{}"


# --- 2. a job folder that holds a result is refused; a pending result is never destroyed


def test_a_reused_job_dir_is_refused_and_its_pending_result_survives(tmp_path):
    down = tmp_path / "not-a-db"
    down.mkdir()
    job = tmp_path / "job"
    first = cli(["obs.rows=4", f"tracking.uri=sqlite:///{down}"], job)
    assert first.code == 3 and first.record["tracking"]["status"] == "pending"
    kept = {p.name: p.read_bytes() for p in [job / "result.json", *sorted((job / ".hydra").iterdir())]}
    for again in (["obs.rows=8", "tracking=none"], ["mode=info", "tracking=none"]):
        got = cli(again, job)
        assert got.code == 2 and "pending: not in MLflow yet" in one_line(got, "already holds a job's result")
    assert {p.name: p.read_bytes() for p in [job / "result.json", *sorted((job / ".hydra").iterdir())]} == kept
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    assert tracking.sync({"uri": uri}, [tmp_path])["logged"] == 1  # the pending result is still there to sync


def test_a_reused_sweep_dir_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    first = cli(["-m", "mode=info", "seed=0,1", "tracking=none", f"hydra.sweep.dir={sweep}"], None)
    assert first.code == 0, first.err[-2000:]
    got = cli(["-m", "mode=info", "seed=2,3", "tracking=none", f"hydra.sweep.dir={sweep}"], None)
    assert got.code == 2 and "0/result.json" in one_line(got, "hydra.sweep.dir")


def test_execute_never_writes_over_a_result_even_past_the_command_line_check(tmp_path):
    from huggy_exp.app import execute
    from conftest import compose_config

    job = tmp_path / "job"
    job.mkdir()
    (job / "result.json").write_text('{"tracking": {"status": "pending"}}')
    result = execute(compose_config(["mode=info", "tracking=none"]), job, "info")
    assert result.status == "error" and "left as it was" in result.reason
    assert (job / "result.json").read_text() == '{"tracking": {"status": "pending"}}'


# --- 6. one bad file never stops sync


def test_sync_names_and_skips_bad_results_and_logs_the_rest(tmp_path):
    down = tmp_path / "down"
    down.mkdir()
    good = cli(["obs.rows=4", f"tracking.uri=sqlite:///{down}"], tmp_path / "runs" / "good")
    assert good.code == 3
    (tmp_path / "runs" / "torn").mkdir()
    (tmp_path / "runs" / "torn" / "result.json").write_text('{"status": "passed", "tracking": {"status": "pend')
    (tmp_path / "runs" / "list").mkdir()
    (tmp_path / "runs" / "list" / "result.json").write_text("[1, 2, 3]")
    (tmp_path / "runs" / "shape").mkdir()
    (tmp_path / "runs" / "shape" / "result.json").write_text('{"tracking": {"status": "pending"}}')  # no job_id
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    got = cli(["mode=sync", f"tracking.uri={uri}", f"mode.paths=[{tmp_path / 'runs'}]"], None)
    assert got.code == 2
    skipped = [ln for ln in got.err.splitlines() if ln.startswith("sync: skipped")]
    assert sorted(Path(ln.split()[2].rstrip(":")).parent.name for ln in skipped) == ["list", "shape", "torn"]
    assert "1 logged, 0 still pending, 3 file(s) skipped" in got.out and "Traceback" not in got.err
    assert len(_runs(uri)) == 1


# --- 7. a store that is not a database: a probe of seconds, one line


@pytest.mark.parametrize("kind", ["folder", "text file", "under a file"])
def test_a_store_that_is_no_database_is_found_in_seconds(tmp_path, kind):
    target = {"folder": tmp_path, "text file": tmp_path / "notes.db", "under a file": tmp_path / "f" / "x.db"}[kind]
    if kind == "text file":
        target.write_text("hello\n" * 100)
    if kind == "under a file":
        (tmp_path / "f").write_text("a file")
    started = time.monotonic()
    with pytest.raises(tracking.StoreDown) as exc:
        tracking.Store.open({"uri": f"sqlite:///{target}"})
    assert time.monotonic() - started < 5
    assert "\n" not in str(exc.value) and str(target) in str(exc.value)


def test_a_folder_store_costs_one_warning_line(tmp_path):
    got = cli(["obs.rows=4", f"tracking.uri=sqlite:///{tmp_path}"], tmp_path / "job")
    assert got.code == 3
    assert [ln for ln in got.err.splitlines() if ln.strip()] == [one_line(got, "not in MLflow yet")]


# --- 8. memory: user-driven allocations estimated first, refused in one line naming the user's keys


@pytest.mark.parametrize("args, keys", [
    (["batch_size=10000000"], "batch_size=10000000"),
    (["mode=stats", "mode.steps=1000000", "mode.envs=1000000"], "mode.steps=1000000 × mode.envs=1000000"),
    (["mode=fingerprint", "mode.steps=1000000", "mode.envs=100000"], "mode.steps=1000000 × mode.envs=100000"),
    (["mode=onnx-compare", "mode.sample_rows=100000", "mode.samples=1000000"], "mode.sample_rows=100000 × mode.samples"),
    (["mode=benchmark", "mode.batch_sizes=[1,16777216]"], "mode.batch_sizes"),
])
def test_allocations_too_large_for_memory_are_refused_naming_the_users_keys(tmp_path, args, keys):
    got = cli([*args, "tracking=none"], tmp_path / "job")
    line = one_line(got, keys)
    assert got.code == 2 and "obs.rows" not in line and ("available" in line or "limit" in line)
    assert got.record["status"] == "error"


def test_the_estimate_is_checked_against_the_memory_left(monkeypatch, default_model):
    weights = default_model.weights
    cfg = config_plain(["mode=stats", "mode.steps=2000", "mode.envs=100"])
    monkeypatch.setattr(host, "available_memory", lambda: (8 << 30, "left under a test limit"))
    memory.check_job_memory("stats", cfg, weights)  # 200,000 rows fit in 8 GiB
    monkeypatch.setattr(host, "available_memory", lambda: (64 << 20, "left under a test limit"))
    with pytest.raises(UserError, match=r"mode.steps=2000 × mode.envs=100: .* only 64.0 MiB is left under a test limit"):
        memory.check_job_memory("stats", cfg, weights)


def config_plain(overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    from conftest import compose_config

    return OmegaConf.to_container(compose_config(overrides), resolve=True)


# --- 9. size bombs: declared and inflated sizes checked before reading


def test_a_checkpoint_whose_storages_inflate_past_the_cap_is_refused_before_loading(tmp_path, huggy_pt, monkeypatch):
    bomb = tmp_path / "bomb.pt"
    extra = zipfile.ZipInfo("archive/data/999")
    extra.compress_type = zipfile.ZIP_DEFLATED  # 300 MiB of zeros in ~300 KB
    with zipfile.ZipFile(huggy_pt) as src, zipfile.ZipFile(bomb, "w", compresslevel=1) as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        with dst.open(extra, "w", force_zip64=True) as fh:
            for _ in range(300):
                fh.write(bytes(1 << 20))
    from huggy_exp.mlagents import load_checkpoint

    with pytest.raises(UserError, match="inflated, over the 256.0 MiB limit"):
        load_checkpoint(bomb)
    monkeypatch.setattr("huggy_exp.mlagents.checkpoint.MAX_CHECKPOINT_BYTES", 1 << 10)  # the cap, whatever it is
    with pytest.raises(UserError, match="over the 1.0 KiB limit"):
        load_checkpoint(huggy_pt)


def test_a_deflated_archive_over_the_cap_is_refused(tmp_path):
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("archive/data/0", "w", force_zip64=True) as fh:
            for _ in range(8):
                fh.write(bytes(1 << 20))
    with pytest.raises(UserError, match="inflate"):
        foreign.check_zip(bomb, 4 << 20, "checkpoint")
    foreign.check_zip(bomb, 16 << 20, "checkpoint")


def _onnx_with_external(tmp_path: Path, length: int | None, data_bytes: int, dims=(4, 4)) -> Path:
    import onnx
    from onnx import TensorProto, helper

    tensor = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=list(dims), data_location=TensorProto.EXTERNAL)
    entries = {"location": "w.bin", **({"length": str(length)} if length is not None else {})}
    for k, v in entries.items():
        tensor.external_data.add(key=k, value=v)
    node = helper.make_node("MatMul", ["obs_0", "w"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("obs_0", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [tensor])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with open(tmp_path / "w.bin", "wb") as fh:
        fh.truncate(data_bytes)  # sparse: no disk, no memory
    return path


@pytest.mark.parametrize("length, data, match", [
    (None, 1536 << 20, "over the 256.0 MiB limit"),  # no length declared: the whole 1.5 GiB file would be read
    (1536 << 20, 1536 << 20, "declares 1.5 GiB"),  # a length its shape cannot hold
])
def test_onnx_external_data_is_sized_before_it_is_read(tmp_path, length, data, match):
    import resource

    from huggy_exp.mlagents.onnx_read import read_onnx

    path = _onnx_with_external(tmp_path, length, data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(UserError, match=match):
        read_onnx(path)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing was read


# --- 10. a fully masked branch is drawn uniformly (ML-Agents), never "a masked draw"


def test_draws_of_a_fully_masked_branch_are_not_masked_draws():
    from huggy_exp.numerics import categorical_check

    rng = np.random.default_rng(0)
    sizes = (3, 2)
    masks = np.ones((2, 5), np.float32)
    masks[0, :3] = 0  # row 0: branch 0 has no action allowed
    masks[1, 1] = 0  # row 1: action 1 of branch 0 masked, the branch alive
    logits = np.where(masks > 0, 0.0, -1e8)
    draws = np.stack([rng.integers(0, 3, (4000, 2)), rng.integers(0, 2, (4000, 2))], axis=-1)
    draws[:, 1, 0] = rng.choice([0, 2], 4000)
    stats = categorical_check(draws, logits, sizes, masks)
    assert stats["masked_draws"] == 0 and stats["p_min"] >= stats["p_crit"]
    draws[:10, 1, 0] = 1  # a draw of a masked action in a live branch still counts
    assert categorical_check(draws, logits, sizes, masks)["masked_draws"] == 10


@pytest.mark.parametrize("mode", ["onnx-compare", "export-onnx"])
def test_onnx_compare_and_export_pass_with_fully_masked_branches(tmp_path, shaped_actors, shaped_files, mode):
    actor = shaped_actors["branches"]
    feeds = actor.random_feeds(64, seed=3)
    feeds["action_masks"][::4, :3] = 0  # every 4th row: branch 0 fully masked
    feeds["action_masks"][1::4, 3:5] = 0  # and branch 1 on others
    np.savez(tmp_path / "obs.npz", **feeds)
    got = cli([f"model.checkpoint={shaped_files['branches'][0]}", f"mode={mode}", "obs=file",
               f"obs.path={tmp_path / 'obs.npz'}", "mode.masks=feeds", "tracking=none"], tmp_path / "job")
    assert got.code == 0 and got.record["status"] == "passed", (got.record or {}).get("reason", got.err[-2000:])
    metrics = got.record["metrics"]
    assert metrics.get("sampled_discrete/masked_draws", 0) == 0


# --- 11. non-finite rewards are marked, never stored as "nan"


def test_nonfinite_rewards_are_marked_and_left_out(tmp_path, results_folder):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(results_folder, folder)
    status = folder / "run_logs" / "training_status.json"
    text = status.read_text()
    rewards = re.findall(r'"reward": ([-0-9.e]+)', text)
    text = text.replace(f'"reward": {rewards[0]}', '"reward": NaN', 1).replace(f'"reward": {rewards[1]}', '"reward": -Infinity', 1)
    status.write_text(text)
    got = cli(["mode=checkpoints", f"model.results_dir={folder}", "tracking=none"], tmp_path / "job")
    assert got.code == 0, got.err[-2000:]
    assert "not finite (-Infinity, NaN)" in one_line(got, "reward(s) in training_status.json")
    rows = {r["step"]: r for r in got.record["details"]["checkpoints"]}
    assert {s: r.get("reward_nonfinite") for s, r in rows.items()} == {100: "NaN", 200: None, 300: "-Infinity"}
    assert rows[100]["reward"] is None and rows[300]["reward"] is None
    assert not re.search(r'"reward": "', (tmp_path / "job" / "result.json").read_text())  # a number or null, never a string
    assert got.record["metrics"]["nonfinite_rewards"] == 2
    status.write_text(text.replace('"creation_time": ', '"creation_time": Infinity, "x": ', 1))
    got = cli(["mode=checkpoints", f"model.results_dir={folder}", "tracking=none"], tmp_path / "job2")
    assert got.code == 2 and "a finite number or null" in one_line(got, "creation_time")


# --- 12. credentials: redacted everywhere, used by the probe


@pytest.mark.parametrize("uri, shown", [
    ("http://alice:s3cr%40t@host:5000", "http://alice:***@host:5000"),
    ("https://bob:pw@[::1]:443/mlflow", "https://bob:***@[::1]:443/mlflow"),
    ("postgresql://u:pw@db/mlflow", "postgresql://u:***@db/mlflow"),
    ("http://host:5000", "http://host:5000"),
])
def test_credentials_are_redacted(uri, shown):
    assert tracking.redact(f"reason: {uri} did not answer") == f"reason: {shown} did not answer"


def test_the_probe_sends_the_uris_credentials(monkeypatch):
    seen = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Basic " + base64.b64encode(b"alice:s3cr@t").decode()
            self.send_response(200 if ok else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    port = server.server_address[1]
    try:
        tracking.probe(tracking.store_uri(f"http://alice:s3cr%40t@127.0.0.1:{port}"))
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
        with pytest.raises(tracking.StoreDown) as exc:
            tracking.probe(f"http://127.0.0.1:{port}")
        assert "wrong" not in str(exc.value)
    finally:
        server.shutdown()
    assert seen[0].startswith("Basic ")


def test_a_uri_password_never_reaches_files_or_output(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)  # restored (unset) after the test
    port = free_port()  # nothing listens: the job stays pending, and says where in one line
    got = cli(["obs.rows=4", f"tracking.uri=http://alice:hunter2@127.0.0.1:{port}"], tmp_path / "job")
    assert got.code == 3
    everything = got.out + got.err + "".join(p.read_text() for p in (tmp_path / "job").rglob("*") if p.is_file()
                                             and p.suffix in (".json", ".log", ".yaml"))
    assert "hunter2" not in everything and f"127.0.0.1:{port}" in got.record["tracking"]["reason"]
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "hunter2"  # where MLflow's client reads it


def test_a_password_in_a_case_file_is_masked_in_the_runs_artifacts(tmp_path, monkeypatch):
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    job = tmp_path / "job"
    got = cli(["obs.rows=4", f"tracking.uri={uri}"], job)
    assert got.code == 0
    (job / ".hydra" / "config.yaml").write_text("tracking:\n  uri: http://alice:hunter2@tracking:5000\n")
    record = json.loads((job / "result.json").read_text())
    record["tracking"] = {"status": "pending"}
    (job / "result.json").write_text(json.dumps(record))
    for old in _runs(uri):
        tracking.Store.open({"uri": uri}).client.delete_run(old.info.run_id)
    assert tracking.sync({"uri": uri}, [job])["logged"] == 1
    run = _runs(uri)[0]
    local = tracking.Store.open({"uri": uri}).client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    assert "hunter2" not in Path(local).read_text() and "alice:***@tracking" in Path(local).read_text()


# --- 13. mlflow.user is a config key, never the environment


def test_mlflow_user_comes_from_the_config_and_nothing_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "env-sentinel-user")
    monkeypatch.setenv("LOGNAME", "env-sentinel-user")
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    plain = cli(["obs.rows=4", f"tracking.uri={uri}"], tmp_path / "a")
    named = cli(["obs.rows=4", f"tracking.uri={uri}", "tracking.user=ci-bot"], tmp_path / "b")
    assert (plain.code, named.code) == (0, 0)
    users = {r.data.tags.get("huggy.job_id"): r.data.tags.get("mlflow.user") for r in _runs(uri)}
    assert users == {plain.record["job_id"]: None, named.record["job_id"]: "ci-bot"}
    for job in ("a", "b"):
        assert "env-sentinel-user" not in (tmp_path / job / "result.json").read_text()
    assert all("env-sentinel-user" not in json.dumps(r.data.tags) + json.dumps(r.data.params) for r in _runs(uri))


# --- 14. the docs' examples run as written


def test_the_readmes_specialize_form_works_on_the_command_line(tmp_path, huggy_pt, shaped_files):
    base = [f"model.checkpoint={huggy_pt}", "tracking=none", "obs.rows=8"]
    for i, (form, table) in enumerate([("verify.specialize={npu_fp16: {max_abs: 0.02}}", "verify"),
                                       ("verify.specialize.cpu_fp32={max_abs: 1.0e-3}", "verify"),
                                       ("verify.specialize={npu_fp16: {layer_rel_rmse: 0.005}}", "verify")]):
        got = cli([*base, "mode=precision", form], tmp_path / f"p{i}")
        assert got.code == 0, got.err[-2000:]
        params = got.record["params"]
        assert params[table]["specialize"]
    got = cli([f"model.checkpoint={shaped_files['multi_input'][0]}", "tracking=none", "obs.rows=8", "mode=onnx-compare",
               "verify.specialize={npu_fp16: {max_abs: 2.0e-02}}"], tmp_path / "o")
    assert got.code == 0, got.err[-2000:]


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]


FIRST_DOCS = [REPO / "README.md", REPO / "docs" / "getting-started.md"]  # a newcomer's first commands: the default run


def doc_commands(docs=DOCS) -> list[tuple[str, list[str]]]:
    """Every `python run.py ...` of the docs (code blocks and inline code), as argv; placeholders are left out."""
    found = []
    for doc in docs:
        text = doc.read_text()
        spans = re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]*python run\.py[^`\n]*)`", text)
        for span in spans:
            for line in span.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().lstrip("$ ")
                # placeholders, a synopsis (`key=value [-m]`), or a case the reader writes first (`conf/case/mine.yaml`)
                if "python run.py" not in line or re.search(r"<[^>]*>|…|\.\.\.|\||\[-|key=value|conf/case/", line):
                    continue
                try:
                    argv = shlex.split(line.split("python run.py", 1)[1].split("&&")[0].split(";")[0])
                except ValueError:
                    continue
                found.append((f"{doc.name}: {line}", argv))
    return found


def compose_examples(tmp_path: Path, globbed: bool, docs=DOCS) -> None:
    preflight.setup()  # the schemas in Hydra's ConfigStore, as run.py's cli does first
    commands = doc_commands(docs)
    assert len(commands) >= 10, commands
    failures, seen = [], set()
    for where, argv in commands:
        if any(a.startswith(("--help", "--hydra-help", "--cfg", "--info")) for a in argv):
            continue
        argv = [a for a in argv if not a.startswith(("hydra.run.dir=", "hydra.sweep.dir="))]
        if tuple(argv) in seen or any("glob(" in a for a in argv) != globbed:
            continue
        seen.add(tuple(argv))
        try:
            preflight.check(preflight.normalize_argv(argv + [f"hydra.run.dir={tmp_path / 'r'}",
                                                           f"hydra.sweep.dir={tmp_path / 's'}"]), CONF)
        except UserError as exc:
            if "needs" in str(exc) or "not found" in str(exc):  # a file the reader has (fixtures, their own model)
                continue
            failures.append(f"{where}\n    -> {exc}")
    assert seen and not failures, "\n".join(failures)


def test_every_example_command_of_the_readme_and_getting_started_composes(tmp_path):
    compose_examples(tmp_path, globbed=False, docs=FIRST_DOCS)


@pytest.mark.slow  # about 90 commands, each composed and validated (20 s of Hydra)
def test_every_example_command_of_the_docs_composes(tmp_path):
    compose_examples(tmp_path, globbed=False)


@pytest.mark.slow
def test_every_globbed_example_command_of_the_docs_composes(tmp_path):
    compose_examples(tmp_path, globbed=True)  # each `case=glob(...)` composes every case it matches


# --- 15. messages: one line


@pytest.mark.parametrize("args, fragment", [
    (["-x"], "unknown option: -x"),
    (["--frobnicate", "mode=info"], "unknown option: --frobnicate"),
    (["model.checkpoint=/data/chiens/médor.pt"], "model.checkpoint='/data/chiens/médor.pt'"),
    (["obs=file", "obs.path=/tmp/観測.npy"], "obs.path='/tmp/観測.npy'"),
])
def test_bad_command_lines_get_one_line(tmp_path, args, fragment):
    got = cli(args, tmp_path / "job")
    assert got.code == 2
    assert [ln for ln in (got.out + got.err).splitlines() if ln.strip()] == [one_line(got, fragment)]


def test_a_quoted_non_ascii_path_is_read(tmp_path, huggy_pt):
    import shutil

    odd = tmp_path / "chiens été" / "médor.pt"
    odd.parent.mkdir()
    shutil.copy(huggy_pt, odd)
    got = cli([f"model.checkpoint='{odd}'", "tracking=none", "obs.rows=4"], tmp_path / "job")
    assert got.code == 0, got.err[-2000:]


# --- 4. sync leaves nothing RUNNING that no live process owns (the fast variant; kill -9 below)


def dead_owner() -> str:
    """An owner tag of a process of this host that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return tracking.owner().rsplit(":", 2)[0] + f":{child.pid}:1"


def test_sync_ends_orphaned_runs_with_their_reason(tmp_path):
    from mlflow.entities import RunTag

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    store = tracking.Store.open({"uri": uri})
    dead = dead_owner()
    client = store.client

    def parent(jobs: int, done: int) -> str:
        run = client.create_run(store.experiment_id, tags={"huggy.parent": "true", "huggy.owner": dead, "huggy.jobs": str(jobs)})
        for _ in range(done):
            child = client.create_run(store.experiment_id, tags={"mlflow.parentRunId": run.info.run_id, "huggy.complete": "true"})
            client.set_terminated(child.info.run_id, "FINISHED")
        return run.info.run_id

    killed, finished = parent(3, 1), parent(2, 2)
    partial = client.create_run(store.experiment_id, tags={"huggy.owner": dead, "huggy.job_id": "j1"}).info.run_id
    deleted = client.create_run(store.experiment_id, tags={"huggy.owner": dead, "huggy.job_id": "j2"}).info.run_id
    client.delete_run(deleted)
    alive = client.create_run(store.experiment_id, tags={"huggy.owner": tracking.owner()}).info.run_id
    elsewhere = client.create_run(store.experiment_id, tags={"huggy.owner": "other-host:x:1:1"}).info.run_id
    client.log_batch(alive, tags=[RunTag("note", "this process: still running")])
    counts = tracking.sync({"uri": uri}, [tmp_path / "none"])
    assert counts["closed"] == 4
    status = {rid: client.get_run(rid) for rid in (killed, finished, partial, deleted, alive, elsewhere)}
    assert status[killed].info.status == "KILLED" and "1 of 3 jobs" in status[killed].data.tags["huggy.end_reason"]
    assert status[finished].info.status == "FINISHED"
    assert status[partial].info.status == "FAILED" and status[partial].info.lifecycle_stage == "deleted"
    assert status[deleted].info.status == "FAILED" and status[deleted].info.lifecycle_stage == "deleted"
    assert status[alive].info.status == "RUNNING" and status[elsewhere].info.status == "RUNNING"
    assert tracking.sync({"uri": uri}, [tmp_path / "none"])["closed"] == 0


# --- slow: real processes


def mount_tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    mounted = []

    def make(name: str, size: str) -> Path:
        path = tmp_path / name
        mount_tmpfs(path, size)
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill a tmpfs, leaving about `leave` bytes."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        try:
            while host.free_bytes(disk) > leave:
                fh.write(bytes(min(1 << 20, max(host.free_bytes(disk) - leave, 4096))))
                fh.flush()
        except OSError:
            pass
    return filler


def run_py(args: list[str], cwd: Path, cache: Path, timeout: int = 240, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, str(REPO / "run.py"), *args], cwd=cwd, env=subprocess_env(cache), capture_output=True,
                          text=True, timeout=timeout, **kw)


@pytest.mark.slow
def test_a_full_disk_at_start_is_one_line_naming_the_path_and_free_space(tmp_path, tmpfs, huggy_exp_cache):
    disk = tmpfs("full", "2m")
    fill(disk, leave=64 << 10)
    for args in (["mode=info", f"hydra.run.dir={disk / 'job'}"], ["-m", "mode=info", "seed=0,1", f"hydra.sweep.dir={disk / 'sw'}"]):
        got = run_py([*args, "tracking=none"], tmp_path, huggy_exp_cache)
        assert got.returncode == 2 and "Traceback" not in got.stderr, got.stderr[-2000:]
        line = [ln for ln in got.stderr.splitlines() if ln.strip()]
        assert len(line) == 1 and str(disk) in line[0] and "free on its disk" in line[0], got.stderr


@pytest.mark.slow
def test_a_disk_full_during_the_job_ends_the_run_failed_and_keeps_the_result_consistent(tmp_path, tmpfs, huggy_exp_cache, huggy_pt):
    disk = tmpfs("out", "1m")
    fill(disk)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    got = run_py([f"model.checkpoint={huggy_pt}", "mode=export-onnx", f"mode.path={disk / 'Huggy.onnx'}",
                  f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'job'}"], tmp_path, huggy_exp_cache)
    assert got.returncode == 2 and "Traceback" not in got.stdout + got.stderr, got.stderr[-3000:]
    assert f"no space left writing {disk / 'Huggy.onnx'}" in got.stderr and "free on its disk" in got.stderr
    record = json.loads((tmp_path / "job" / "result.json").read_text())
    assert record["status"] == "error" and record["tracking"]["status"] == "logged"
    assert [r.info.status for r in _runs(uri)] == ["FAILED"]
    assert not [p for p in disk.iterdir() if p.name != "filler"]  # no half-written file left


@pytest.mark.slow
def test_a_store_disk_filling_mid_copy_leaves_nothing_running_after_sync(tmp_path, tmpfs, huggy_exp_cache):
    disk = tmpfs("store", "8m")
    uri = f"sqlite:///{disk / 'mlflow.db'}"
    first = run_py(["obs.rows=4", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path, huggy_exp_cache)
    assert first.returncode == 0, first.stderr[-2000:]
    filler = fill(disk, leave=16 << 10)
    got = run_py(["obs.rows=4096", f"tracking.uri={uri}", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path, huggy_exp_cache)
    assert got.returncode == 3 and "Traceback" not in got.stdout + got.stderr, got.stderr[-3000:]
    record = json.loads((tmp_path / "b" / "result.json").read_text())
    assert record["status"] == "passed" and record["tracking"]["status"] == "pending"
    filler.unlink()
    sync = run_py(["mode=sync", f"tracking.uri={uri}", f"mode.paths=[{tmp_path}]"], tmp_path, huggy_exp_cache)
    assert sync.returncode == 0, sync.stdout + sync.stderr[-2000:]
    from mlflow.entities import ViewType

    client = tracking.Store.open({"uri": uri}).client
    every = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id], run_view_type=ViewType.ALL)
    assert "RUNNING" not in {r.info.status for r in every}
    copies = [r for r in _runs(uri) if r.data.tags.get("huggy.job_id") == record["job_id"]]
    assert len(copies) == 1 and copies[0].info.status == "FINISHED"


def _limited(limit: int):
    def apply():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


@pytest.mark.slow
@pytest.mark.parametrize("args, keys", [
    (["batch_size=200000"], "batch_size=200000"),
    (["obs.rows=3000000"], "obs.rows=3000000"),
    (["mode=stats", "mode.steps=20000", "mode.envs=100"], "mode.steps=20000 × mode.envs=100"),
])
def test_a_memory_bounded_process_refuses_what_does_not_fit_in_one_line(tmp_path, huggy_exp_cache, args, keys):
    got = run_py([*args, "tracking=none", f"hydra.run.dir={tmp_path / 'job'}"], tmp_path, huggy_exp_cache,
                 preexec_fn=_limited(3 << 30))
    assert got.returncode == 2, got.stderr[-3000:]
    line = [ln for ln in got.stderr.splitlines() if keys in ln]
    assert line and "RLIMIT_AS" in line[0] and "Traceback" not in got.stdout + got.stderr, got.stderr[-3000:]
    assert json.loads((tmp_path / "job" / "result.json").read_text())["status"] == "error"


@pytest.mark.slow
def test_a_memory_bounded_process_still_runs_an_ordinary_job(tmp_path, huggy_exp_cache):
    got = run_py(["tracking=none", "mode=precision", f"hydra.run.dir={tmp_path / 'job'}"], tmp_path, huggy_exp_cache,
                 preexec_fn=_limited(3 << 30))
    assert got.returncode == 0, got.stderr[-3000:]


@pytest.mark.slow
def test_kill_9_mid_sweep_then_sync_leaves_nothing_running(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    sweep = tmp_path / "sweep"
    proc = _spawn(["-m", "mode=batch", "seed=0,1,2,3,4,5", "obs.rows=64", "mode.budget_s=1.0", f"tracking.uri={uri}",
                   f"hydra.sweep.dir={sweep}"], tmp_path, huggy_exp_cache, start_new_session=True)
    _wait_for(lambda: (sweep / "1" / "result.json").is_file(), proc)
    os.killpg(proc.pid, 9)
    proc.communicate(timeout=60)
    from mlflow.entities import ViewType

    def every():
        client = tracking.Store.open({"uri": uri}).client
        return client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id], run_view_type=ViewType.ALL)

    assert "RUNNING" in {r.info.status for r in every()}  # the parent, at least: what sync must repair
    sync = run_py(["mode=sync", f"tracking.uri={uri}", f"mode.paths=[{sweep}]"], tmp_path, huggy_exp_cache)
    assert sync.returncode == 0, sync.stdout + sync.stderr[-2000:]
    assert "orphaned RUNNING run(s) ended" in sync.stdout
    runs = every()
    assert "RUNNING" not in {r.info.status for r in runs}
    parent = [r for r in runs if r.data.tags.get("huggy.parent") == "true"]
    assert len(parent) == 1 and parent[0].info.status == "KILLED"
    assert "of 6 jobs are in MLflow" in parent[0].data.tags["huggy.end_reason"]
    results = [json.loads(p.read_text()) for p in sweep.glob("*/result.json")]
    live = [r for r in runs if r.info.lifecycle_stage == "active" and r.data.tags.get("huggy.job_id")]
    assert sorted(r.data.tags["huggy.job_id"] for r in live) == sorted(r["job_id"] for r in results)


@pytest.mark.slow
def test_concurrent_syncs_against_a_server_log_each_job_once_under_one_parent(tmp_path, huggy_exp_cache):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    sweep = tmp_path / "sweep"
    down = run_py(["-m", "mode=info", "seed=0,1,2,3", f"tracking.uri={uri}", f"hydra.sweep.dir={sweep}"], tmp_path,
                  huggy_exp_cache)
    assert down.returncode == 3, down.stderr[-2000:]  # the server is not up yet: every point pending, no parent
    server = start_server(tmp_path, port)
    try:
        syncs = [_spawn(["mode=sync", f"tracking.uri={uri}", f"mode.paths=[{sweep}]"], tmp_path, huggy_exp_cache)
                 for _ in range(3)]
        outs = [p.communicate(timeout=300) for p in syncs]
        assert [p.returncode for p in syncs] == [0, 0, 0], [o[1][-1500:] for o in outs]
        runs = _runs(uri)
        parents = [r for r in runs if r.data.tags.get("huggy.parent") == "true"]
        children = [r for r in runs if r.data.tags.get("huggy.job_id")]
        assert len(parents) == 1 and len(children) == 4 == len({r.data.tags["huggy.job_id"] for r in children})
        assert {r.data.tags["mlflow.parentRunId"] for r in children} == {parents[0].info.run_id}
    finally:
        stop_server(server)


@pytest.mark.slow
def test_a_password_protected_server_is_probed_and_logged_with_the_uris_credentials(tmp_path, huggy_exp_cache):
    pytest.importorskip("flask_wtf", reason="MLflow's basic-auth server needs mlflow[auth] (Flask-WTF)")
    port = free_port()
    password = "s3cret-Pw_42"
    server = start_server(tmp_path, port, auth_password=password)
    try:
        job = tmp_path / "job"
        got = run_py(["obs.rows=4", f"tracking.uri=http://admin:{password}@127.0.0.1:{port}", f"hydra.run.dir={job}"],
                     tmp_path, huggy_exp_cache)
        assert got.returncode == 0, got.stderr[-3000:]
        wrong = run_py(["obs.rows=4", f"tracking.uri=http://admin:not-{password[::-1]}@127.0.0.1:{port}",
                        f"hydra.run.dir={tmp_path / 'wrong'}"], tmp_path, huggy_exp_cache)
        assert wrong.returncode == 3 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
        seen = got.stdout + got.stderr + wrong.stdout + wrong.stderr
        seen += "".join(p.read_text() for d in (job, tmp_path / "wrong") for p in d.rglob("*")
                        if p.is_file() and p.suffix in (".json", ".log", ".yaml"))
        assert password not in seen and password[::-1] not in seen
        env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": password}
        check = subprocess.run([PYTHON, "-c", "import json, mlflow; c = mlflow.MlflowClient(tracking_uri='http://127.0.0.1:"
                                f"{port}'); r = c.search_runs([c.get_experiment_by_name('huggy_exp').experiment_id])[0]; "
                                "print(json.dumps([r.data.params, r.data.tags]))"], env=env, capture_output=True, text=True,
                               timeout=120)
        assert check.returncode == 0 and password not in check.stdout, check.stderr[-2000:]
    finally:
        stop_server(server)


def test_the_tracking_helper_gets_the_credentials_moved_out_of_the_uri_after_it_started(monkeypatch, tmp_path):
    """run.py starts the MLflow helper before preflight moves a URI's `user:password@` (or a config file's secret) into
    this process's environment: the request hands them over, or the helper logs unauthenticated (401)."""
    from huggy_exp.tracking_worker import ANSWER, Helper

    sent = {}

    class Proc:  # the helper process, as Helper drives it
        returncode = 0

        def communicate(self, text, timeout):
            sent.update(json.loads(text))
            return ANSWER + json.dumps({"status": "logged"}) + "\n", None

    for key in tracking.CREDENTIAL_ENV:
        monkeypatch.setenv(key, "")  # restored after the test: use_credentials writes the process's environment
    helper = Helper(Proc())
    clean = tracking.use_credentials("http://admin:s3cret@127.0.0.1:5000")  # what preflight does, after the spawn
    assert helper.log_job({"enabled": True, "uri": clean}, tmp_path) == {"status": "logged"}
    assert sent["env"]["MLFLOW_TRACKING_USERNAME"] == "admin" and sent["env"]["MLFLOW_TRACKING_PASSWORD"] == "s3cret"
    assert "s3cret" not in json.dumps(sent["settings"])


# --- issue 27, classes 1-6: folders claimed, the user's files never written into, the tool's own files never replaced,
# a full disk anywhere in one line, and every ending signal keeps the result and ends the run


def test_a_job_folder_is_claimed_once_and_the_second_claimant_is_refused(tmp_path):
    for key, folder in (("hydra.run.dir", tmp_path / "fresh" / "job"), ("hydra.sweep.dir", tmp_path / "empty")):
        folder.parent.mkdir(exist_ok=True)
        assert files.claim_folder(folder, key) == folder
        with pytest.raises(UserError, match=rf"{key}=.* is already claimed by another run \(pid {os.getpid()} on "):
            files.claim_folder(folder, key)
        assert [p.name for p in folder.iterdir()] == [files.CLAIM]
    claimed = tmp_path / "fresh" / "job"
    for args in (["mode=info"], ["-m", "mode=info", "seed=0,1", f"hydra.sweep.dir={claimed}"]):
        got = cli([*args, "tracking=none"], claimed if args[0] != "-m" else None)
        assert got.code == 2 and "is already claimed by another run" in one_line(got, str(claimed))
    assert [p.name for p in claimed.iterdir()] == [files.CLAIM]  # the loser wrote nothing


@pytest.mark.parametrize("key, users", [
    ("hydra.run.dir", {"obs.npy": b"reference"}),
    ("hydra.run.dir", {".env": b"TOKEN=x"}),  # a hidden file is the user's too
    ("hydra.sweep.dir", {"notes/today.md": b"# mine"}),
    ("mode.out", {"obs.npy": b"reference"}),
    ("mode.out", {"points/mine.txt": b"not a bundle's"}),
])
def test_an_output_folder_holding_the_users_files_is_refused_and_left_as_it_was(tmp_path, key, users):
    folder = tmp_path / "mine"
    for name, data in users.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    if key == "mode.out" and "points/mine.txt" in users:
        (folder / "manifest.json").write_text("{}")  # looks like a bundle, holds the user's file
        users = {**users, "manifest.json": b"{}"}
    args = {"hydra.run.dir": ["mode=info"], "hydra.sweep.dir": ["-m", "mode=info", "seed=0,1"],
            "mode.out": ["mode=record", "obs.rows=4", "mode.latency.budget_s=0.01", "mode.latency.warmup_s=0"]}[key]
    got = cli([*args, "tracking=none", f"{key}={folder}"], tmp_path / "job" if key == "mode.out" else None)
    assert got.code == 2 and "refused" in one_line(got, f"{key}={folder}")
    assert {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()} == users


def test_mode_out_set_to_an_existing_file_is_one_line(tmp_path):
    out = tmp_path / "bundle.npz"
    out.write_bytes(b"mine")
    got = cli(["mode=record", "obs.rows=4", "tracking=none", f"mode.out={out}"], tmp_path / "job")
    assert got.code == 2 and "is a file, not a folder" in one_line(got, f"mode.out={out}")
    assert out.read_bytes() == b"mine"


def _owned_targets(tmp_path: Path, results_folder: Path, huggy_exp_cache: Path) -> dict[str, tuple[list[str], Path]]:
    """(arguments, a file the tool reads or owns) for export-onnx's mode.path, each spelt differently."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(results_folder, run)
    (run / "run_logs").rename(run / "logs-elsewhere")  # not recognised as a results folder by its run_logs
    (run / "configuration.yaml").unlink()
    ckpt = sorted((run / "Huggy").glob("Huggy-*.pt"))[0]
    store = tmp_path / "store" / "mlflow.db"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    return {
        "final onnx beside the checkpoint's folder": ([f"model.checkpoint={ckpt}"], run / "Huggy" / ".." / "Huggy.onnx"),
        "embedded default's Huggy.onnx": ([], huggy_exp_cache / "default-v2" / "Huggy.onnx"),
        "another checkpoint's .onnx in a results folder": ([f"model.results_dir={results_folder}"],
                                                           sorted(results_folder.glob("Huggy/Huggy-*.onnx"))[-1]),
        "the job's tracking store": ([f"tracking.uri=sqlite:///{store}"], store),
        "a device node": ([], Path("/dev/null")),
        "a FIFO": ([], fifo),
    }


def test_export_with_overwrite_never_replaces_a_file_the_tool_owns_or_reads(tmp_path, results_folder, huggy_exp_cache):
    store_job = cli(["mode=info", f"tracking.uri=sqlite:///{tmp_path / 'store' / 'mlflow.db'}"], tmp_path / "first")
    assert store_job.code == 0, store_job.err[-2000:]
    targets = _owned_targets(tmp_path, results_folder, huggy_exp_cache)
    for i, (what, (args, target)) in enumerate(targets.items()):
        before = os.stat(target)
        data = target.read_bytes() if target.is_file() else None
        got = cli(["mode=export-onnx", *args, "tracking=none" if "tracking" not in " ".join(args) else "obs.rows=4",
                   f"mode.path={target}", "mode.overwrite=true"], tmp_path / f"job{i}")
        assert got.code == 2, (what, got.err[-2000:])
        assert "refused even with mode.overwrite=true" in one_line(got, f"mode.path={target}"), what
        after = os.stat(target)
        assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode), what
        if what != "the job's tracking store":  # the store took the refused job's run: same file, more rows
            assert data is None or target.read_bytes() == data, what


def test_a_write_that_loses_its_errno_on_a_full_disk_is_a_full_disk(tmp_path, monkeypatch):
    target = tmp_path / "out" / "actions.npy"

    def numpy_short_write(tmp):  # what ndarray.tofile raises on a full disk: no errno
        raise OSError("8388608 requested and 0 written")

    with pytest.raises(OSError) as exc:
        files.atomic_write(target, numpy_short_write)
    assert files.is_disk_full(exc.value) and exc.value.filename == str(target)
    monkeypatch.setattr(host, "free_bytes", lambda path: 0)

    def torch_failed(tmp):
        raise RuntimeError("[enforce fail at inline_container.cc:595] . PytorchStreamWriter failed writing file data/0")

    with pytest.raises(OSError) as exc:
        files.atomic_write(tmp_path / "model.pt", torch_failed)
    assert files.is_disk_full(exc.value) and not list(tmp_path.rglob(".model.pt.*"))
    message = files.disk_full_message(exc.value)
    assert str(tmp_path / "model.pt") in message and f"({host.mount_point(tmp_path)})" in message
    assert "writing ." not in files.disk_full_message(OSError(28, "No space left on device"))


def test_a_full_disk_while_writing_arrays_keeps_the_result_as_an_error(tmp_path, monkeypatch):
    from huggy_exp import results

    def full(tmp, array):
        raise OSError("8388608 requested and 0 written")

    monkeypatch.setattr(results, "_save_npy", full)
    got = cli(["obs.rows=4", "tracking=none"], tmp_path / "job")
    assert got.code == 2 and "Traceback" not in got.out + got.err, got.err[-2000:]
    assert got.record["status"] == "error" and got.record["reason"].startswith(f"no space left writing {tmp_path / 'job'}/")
    assert got.record["reason"].endswith(f"({host.mount_point(tmp_path)})") and got.record["arrays"] == {}


def test_a_sweep_whose_summary_cannot_be_written_is_one_line_and_ends_its_parent(tmp_path, monkeypatch):
    import errno

    from huggy_exp import sweep as sweep_module

    def full(sweep_dir, summary, plot):
        raise OSError(errno.ENOSPC, "No space left on device", str(sweep_dir / "summary.csv"))

    monkeypatch.setattr(sweep_module, "write_summary", full)
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    got = cli(["-m", "mode=info", "seed=0,1", f"tracking.uri={uri}", f"hydra.sweep.dir={tmp_path / 'sweep'}"], None)
    assert got.code == 2 and "summary was not written: no space left writing" in one_line(got, "summary.csv")
    runs = _runs(uri)
    assert len(runs) == 3 and "RUNNING" not in {r.info.status for r in runs}
    assert [r.info.status for r in runs if r.data.tags.get("huggy.parent") == "true"] == ["FAILED"]
    assert len(list((tmp_path / "sweep").glob("*/result.json"))) == 2


def test_an_interrupted_records_leftovers_are_cleared_by_the_next_record(tmp_path):
    from huggy_exp import bundle

    out = tmp_path / "bundle"
    record = ["mode=record", "obs.rows=4", "mode.latency.budget_s=0.01", "mode.latency.warmup_s=0", "tracking=none",
              f"mode.out={out}"]
    out.mkdir()
    (out / bundle.LOCK).touch()  # a first record killed after its first file: no manifest yet
    (out / "points" / "cpu-fp16-eager-b64").mkdir(parents=True)
    (out / "points" / "cpu-fp16-eager-b64" / "outputs.npz").write_bytes(b"half")
    (out / ".inputs.npz.x1y2z3").write_bytes(b"tmp")
    assert cli(record, tmp_path / "a").code == 0
    bundle.read(out)
    (out / "points" / "cpu-bf16-eager-b64").mkdir()  # a later record interrupted before its manifest
    (out / "points" / "cpu-bf16-eager-b64" / "latency.npz").write_bytes(b"orphan")
    (out / ".manifest.json.abc_12").write_bytes(b"{")
    got = cli([*record, "batch_size=8"], tmp_path / "b")
    assert got.code == 0, got.err[-2000:]
    assert sorted(bundle.read(out).points) == ["cpu/fp32/eager/b64", "cpu/fp32/eager/b8"]


def test_a_signal_inside_a_deferred_section_is_raised_once_it_is_over():
    import signal

    from huggy_exp import terminal

    done, cut = [], []
    before = {s: signal.getsignal(s) for s in terminal.ENDING}  # whatever the process started with (SIG_IGN under nohup)
    with pytest.raises(terminal.Interrupted) as exc:
        with terminal.deferred(on_signal=lambda: cut.append(True)):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("the files and their manifest")
    assert done and cut and terminal.exit_code(exc.value) == 143
    assert {s: signal.getsignal(s) for s in terminal.ENDING} == before  # the handlers it found, back


def test_output_survives_a_closed_pipe_and_an_ascii_terminal(monkeypatch):
    import io
    import signal

    from huggy_exp import terminal

    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr("sys.stdout", ascii_out)
    terminal.guard_output()
    import sys

    print("[info] cpu fp32 batch 64 · model: médor")
    sys.stdout.flush()
    assert ascii_out.buffer.getvalue() == b"[info] cpu fp32 batch 64 \\xb7 model: m\\xe9dor\n"
    read, write = os.pipe()
    os.close(read)
    closed = terminal.Output(open(write, "w"))
    monkeypatch.setattr(terminal, "PIPE_CLOSED", __import__("threading").Event())
    closed.write("x" * 100_000)
    closed.flush()
    with pytest.raises(terminal.Interrupted) as exc:
        terminal.check_pipe()
    assert exc.value.signum == signal.SIGPIPE and terminal.exit_code(exc.value) == 141


@pytest.mark.slow
def test_two_processes_in_one_fresh_folder_one_runs_the_other_is_refused(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    for args, folder in ((["mode=info"], "hydra.run.dir"), (["-m", "mode=info", "seed=5,6"], "hydra.sweep.dir")):
        target = tmp_path / folder / "shared"
        procs = [_spawn([*args, f"seed={10 + i}" if args[0] != "-m" else f"obs.rows={4 + i}", f"tracking.uri={uri}",
                         f"{folder}={target}"], tmp_path, huggy_exp_cache) for i in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 2], [o[1][-1500:] for o in outs]
        loser = outs[[p.returncode for p in procs].index(2)]
        assert "is already claimed by another run" in loser[1] and "Traceback" not in loser[1]
    runs = _runs(uri)
    assert "RUNNING" not in {r.info.status for r in runs}
    assert len([r for r in runs if r.data.tags.get("huggy.parent") == "true"]) == 1 and len(runs) == 1 + 1 + 2


@pytest.mark.slow
def test_a_closed_pipe_and_sigterm_end_a_sweep_with_its_results_kept_and_its_parent_ended(tmp_path, huggy_exp_cache):
    import signal

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    piped = subprocess.run(f"{shlex.quote(PYTHON)} {shlex.quote(str(REPO / 'run.py'))} -m mode=info seed=0,1,2 "
                           f"tracking.uri={uri} hydra.sweep.dir={tmp_path / 'piped'} | head -2", shell=True, cwd=tmp_path,
                           env={**subprocess_env(huggy_exp_cache), "PYTHONIOENCODING": "ascii"}, capture_output=True,
                           text=True, timeout=300)
    assert "Traceback" not in piped.stderr and "its output pipe closed" in piped.stderr, piped.stderr[-2000:]
    assert len(list((tmp_path / "piped").glob("*/result.json"))) >= 1
    sweep = tmp_path / "termed"
    proc = _spawn(["-m", "mode=batch", "seed=0,1,2,3,4,5", "obs.rows=64", "mode.budget_s=1.0", f"tracking.uri={uri}",
                   f"hydra.sweep.dir={sweep}"], tmp_path, huggy_exp_cache)
    _wait_for(lambda: (sweep / "0" / "result.json").is_file(), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err and "interrupted (SIGTERM)" in err, err[-3000:]
    assert (sweep / "summary.json").is_file()
    assert tracking.sync({"uri": uri}, [tmp_path])["pending"] == 0
    runs = _runs(uri)
    assert "RUNNING" not in {r.info.status for r in runs}
    assert sorted(r.info.status for r in runs if r.data.tags.get("huggy.parent") == "true") == ["KILLED", "KILLED"]


@pytest.mark.slow
def test_ctrl_c_during_loadgens_server_scenario_ends_130_with_the_result_kept(tmp_path, huggy_exp_cache):
    import signal

    job = tmp_path / "job"
    proc = _spawn(["mode=benchmark", "tracking=none", "mode.scenarios=[server]", "mode.min_duration_ms=4000",
                   "mode.search_steps=0", "mode.budget_s=0.05", "mode.rounds=1", "obs.rows=8", f"hydra.run.dir={job}"],
                  tmp_path, huggy_exp_cache)
    _wait_for(lambda: (job / "loadgen" / "server").is_dir(), proc)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    record = json.loads((job / "result.json").read_text())
    assert record["status"] == "error" and record["interrupted"] and "interrupted (Ctrl-C)" in record["reason"]


# --- issue 27, class 15: every size a user drives is estimated before it is allocated


@pytest.fixture
def sixteen_gib(monkeypatch):
    monkeypatch.setattr(host, "available_memory", lambda: (16 << 30, "left under a test limit"))


def _header_only_npy(path: Path, shape: tuple[int, ...]) -> Path:
    """A .npy whose header declares `shape` (float32) and holds no data: only its header may be read."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return path


@pytest.mark.parametrize("args, keys", [
    (["mode=benchmark", "mode.scenarios=[control_loop]", "mode.rate_hz=100000", "mode.duration_s=3600"],
     "mode.rate_hz=100000.0 × mode.duration_s=3600.0: the control loop's record of 360,000,000 ticks"),
    (["mode=benchmark", "mode.scenarios=[single_stream,server]", "mode.target_qps=10000000", "mode.min_duration_ms=3600000"],
     "mode.target_qps=10000000.0 × mode.min_duration_ms=3600000: LoadGen's server schedule"),
    (["mode=benchmark", "mode.scenarios=[server]", "mode.target_qps=1000000", "mode.budget_s=3600"],
     "mode.target_qps=1000000.0 × mode.budget_s=3600.0"),  # min_duration_ms null: LoadGen runs budget_s
    (["mode=precision", "obs=file", "obs.path={npy}"], "the 4,500,000 observation rows of the file"),
    (["mode=action", "obs=file", "obs.path={npy3}"], "the 3,000,000 observation rows of the file"),  # [T, N, d]
])
def test_sizes_a_user_drives_are_estimated_before_allocation(tmp_path, sixteen_gib, args, keys):
    npy = _header_only_npy(tmp_path / "rows.npy", (4_500_000, 59))
    npy3 = _header_only_npy(tmp_path / "seq.npy", (3, 1_000_000, 59))
    got = cli([a.format(npy=npy, npy3=npy3) for a in args] + ["tracking=none"], tmp_path / "job")
    line = one_line(got, keys)
    assert got.code == 2 and "but only 16.0 GiB is left under a test limit" in line, line
    assert got.record["status"] == "error"


def test_a_sweep_is_counted_before_any_point_is_listed_or_composed(tmp_path):
    from huggy_exp import preflight

    preflight.setup()
    started = time.monotonic()
    for sweep, points in ((["seed=range(0,1000000)"], "1,000,000 points"),
                          (["seed=range(0,200)", "obs.rows=range(1,101)"], "20,000 points"),
                          (["obs.scale=range(0.0,1000.0,0.01)"], "100,000 points")):
        with pytest.raises(UserError, match=f"{points}, over the 10,000 one sweep may launch"):
            preflight.check(["-m", "mode=info", *sweep], CONF)
    assert time.monotonic() - started < 30  # counted, not listed: Hydra's 0.2 s per composed point would be hours
    got = cli(["-m", "seed=range(0,1000000)", "mode=info", "tracking=none", f"hydra.sweep.dir={tmp_path / 's'}"], None)
    assert got.code == 2 and "(1,000,000 values)" in one_line(got, "seed=range(0,1000000)")
    assert not (tmp_path / "s").exists()


def test_every_value_of_a_long_sweep_is_still_validated(tmp_path):
    from huggy_exp import preflight

    preflight.setup()
    keep: list = []
    assert preflight.check(["-m", "mode=info", "seed=range(0,300)", "obs.rows=1,2"], CONF, keep=keep) == 600
    assert len(keep) == 1  # the first point's config (run.py claims its sweep dir); not 302 configs in memory
    for bad, fragment in (("obs.rows=1,2,-3", "obs.rows=-3 is out of range"), ("obs.rows=4,x", "obs.rows=x"),
                          ("seed=range(4611686018427387900,4611686018427387910)", "out of range")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            preflight.check(["-m", "mode=info", "seed=range(0,300)", bad], CONF)


# --- issue 27, class 17: one clear line, never a traceback


@pytest.mark.parametrize("args, fragment", [
    (["mode=precision", "verify.specialize={gpu_fp16: {max_abs: 0.02}}"], "unknown key verify.specialize.gpu_fp16"),
    (["mode=precision", "verify.specialize={npu_fp8: {max_abs: 0.02}}"], "unknown key verify.specialize.npu_fp8"),
    (["mode=precision", "verify.specialize={npu_fp16: {max_abss: 0.02}}"], "unknown key verify.specialize.npu_fp16.max_abss"),
    (["mode=precision", "verify.specialize={cpu_fp32: {max_abs: .nan}}"], "verify.specialize.cpu_fp32.max_abs='.nan' must be a finite number"),
    (["mode=precision", "verify.specialize={cpu_fp32: {max_abs: nan}}"], "verify.specialize.cpu_fp32.max_abs=nan must be a finite number"),
    (["mode=precision", "verify.specialize={cuda_bf16: {layer_rel_rmse: -inf}}"], "verify.specialize.cuda_bf16.layer_rel_rmse=-inf"),
    (["mode=onnx-compare", "verify.specialize={tpu_fp16: {max_abs: 0.1}}"], "unknown key verify.specialize.tpu_fp16"),
    (["mode=batch", "mode.tolerance.fp32=0.1"], "unknown key mode.tolerance; valid keys of mode (batch): budget_s"),
    (["~dtype"], "missing key dtype"),
    (["~seed"], "missing key seed"),
    (["~obs.rows"], "obs.rows cannot be removed"),
    (["-m", "--cfg", "job", "mode=info", "seed=1,2"], "-m and --cfg cannot be used together"),
    (["--info", "--cfg", "job"], "--cfg and --info cannot be used together"),
    (["-m", "hydra/launcher=nonexistent", "mode=info", "seed=1,2"], "unknown hydra/launcher 'nonexistent'; valid: basic, joblib"),
    (["mode=ui", "tracking.uri=sqlite:///{tmp}/typo/mlflow.db"], "no store at"),
])
def test_bad_values_of_the_new_surface_get_one_line(tmp_path, args, fragment):
    got = cli([a.replace("{tmp}", str(tmp_path)) for a in args] + ["tracking=none"] * ("tracking" not in " ".join(args)),
              tmp_path / "job")
    assert got.code == 2, got.err[-2000:]
    assert [ln for ln in (got.out + got.err).splitlines() if ln.strip()] == [one_line(got, fragment)]
    assert not (tmp_path / "job").exists() and not list(tmp_path.glob("*.json"))


def test_an_onnx_is_read_and_written_as_protobuf_whatever_its_name(tmp_path, default_model):
    from huggy_exp.mlagents import load_onnx, write_onnx

    odd = tmp_path / "policy.json"  # onnx would pick its JSON reader and writer by this suffix
    write_onnx(default_model.weights, odd)
    assert odd.read_bytes()[:1] != b"{" and load_onnx(odd).weights.obs_dim == default_model.weights.obs_dim
    got = cli(["mode=export-onnx", f"mode.path={tmp_path / 'out.json'}", "tracking=none", "obs.rows=4"], tmp_path / "job")
    assert got.code == 0 and "Traceback" not in got.err, got.err[-2000:]
    assert load_onnx(tmp_path / "out.json").weights.obs_dim == default_model.weights.obs_dim


def test_a_new_store_is_announced_and_a_read_only_home_is_one_line(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'typo' / 'mlflow.db'}"
    got = cli(["mode=info", f"tracking.uri={uri}"], tmp_path / "a")
    assert got.code == 0 and "names no store yet: a new one is created at" in one_line(got, "(its folder")
    again = cli(["mode=info", f"tracking.uri={uri}"], tmp_path / "b")
    assert again.code == 0 and "no store yet" not in again.err
    cache = tmp_path / "file-not-folder"
    cache.write_text("")
    monkeypatch.setenv("HUGGY_EXP_CACHE", str(cache / "cache"))  # as a read-only HOME: the cache cannot be made
    got = cli(["mode=action", "tracking=none"], tmp_path / "c")
    assert got.code == 2 and "set HUGGY_EXP_CACHE to a writable folder" in one_line(got, "cannot be written")
