"""Port certificates: mode=record writes a bundle, mode=replay holds this host to it, mode=diff says what changed.

Jobs run in-process through the real conf/ tree (conftest.run_job) with a short latency budget; the process-heavy
checks (a fresh copy of the code in another process, a joblib sweep into one bundle, exit codes) are `slow`.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import HUGGY_LSTM, HUGGY_LSTM_PT, PYRAMIDS_PT, PYTHON, REPO, Job, needs_shared, subprocess_env
from conftest import run_job as run_any
from huggy_exp import bundle, certify, environment

FAST = ["mode.latency.budget_s=0.03", "mode.latency.warmup_s=0.005", "mode.latency.max_samples=40"]
SMALL_ROWS = ["obs.rows=8", "batch_size=8"]


def run_job(workdir: Path, mode: str, *overrides: str) -> Job:
    """A job in-process; its free-form details read beside the common keys of result.json (wherever the file nests them)."""
    job = run_any(workdir, mode, *overrides)
    return Job(job.result, {**job.record, **(job.record.get("details") or {})}, job.workdir)


def record(workdir: Path, out: Path, *overrides: str):
    return run_job(workdir, "record", f"mode.out={out}", *FAST, *overrides)


def replay(workdir: Path, source: Path, *overrides: str):
    return run_job(workdir, "replay", f"mode.bundle={source}", *FAST, *overrides)


def copy_bundle(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def _csv(path: Path) -> list[dict]:
    import csv

    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def rewrite_npz(path: Path, change) -> None:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: change(k, data[k]) for k in data.files}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    path.write_bytes(buffer.getvalue())


@pytest.fixture(scope="module")
def default_bundle(tmp_path_factory) -> Path:
    """The embedded default recorded in fp32, fp16 and bf16 (8 rows) into one bundle."""
    root = tmp_path_factory.mktemp("default_bundle")
    for dtype in ("fp32", "fp16", "bf16"):
        job = record(root / f"rec-{dtype}", root / "bundle", f"dtype={dtype}", *SMALL_ROWS)
        assert job.record["status"] == "passed", job.record["reason"]
    return root / "bundle"


@pytest.fixture(scope="module")
def small_bundle(small, tmp_path_factory) -> Path:
    """The small policy recorded in fp32 eager with enough latency samples for the tests."""
    root = tmp_path_factory.mktemp("small_bundle")
    job = run_job(root / "rec", "record", f"mode.out={root / 'bundle'}", small.model, "mode.latency.budget_s=0.1",
                  "mode.latency.max_samples=200", "mode.latency.warmup_s=0.02")
    assert job.record["status"] == "passed", job.record["reason"]
    return root / "bundle"


# --- record


def test_record_writes_every_dtype_into_one_bundle_with_its_manifest(default_bundle):
    manifest = json.loads((default_bundle / "manifest.json").read_text())
    assert manifest["format"] == bundle.FORMAT and manifest["format_version"] == bundle.VERSION
    assert set(manifest["points"]) == {"cpu/fp32/eager/b8", "cpu/fp16/eager/b8", "cpu/bf16/eager/b8"}
    model = manifest["model"]
    assert len(model["sha256"]) == 64 and len(model["file_sha256"]) == 64 and model["synthetic"] is True
    assert model["dims"]["inputs"] == [59] and model["dims"]["continuous_actions"] == 21 and model["dims"]["parameters"] == 566_805
    assert manifest["observations"]["source"] == "random" and manifest["observations"]["seed"] == 0
    point = manifest["points"]["cpu/bf16/eager/b8"]
    assert (point["device"], point["dtype"], point["backend"], point["batch"], point["threads"]) == ("cpu", "bf16", "eager", 8, 1)
    env = point["environment"]
    assert env["cpu"]["model"] and env["cpu"]["flags"] and env["os"]["system"] and env["python"]
    assert {"torch", "onnxruntime", "numpy", "torch_npu", "cann", "cuda", "cuda_driver", "npu_driver"} <= set(env["versions"])
    assert {"fp32_precision_cuda_matmul", "fp32_precision_cudnn_rnn", "fp32_precision_npu_matmul_allow_hf32",
            "fp32_precision_npu_cube_math_type", "deterministic_algorithms"} <= set(env["runtime"])
    assert set(point["fingerprints"]) == {"fingerprint", "quantized_fingerprint"} and point["decimals"] == 3
    on_disk = {p.relative_to(default_bundle).as_posix() for p in default_bundle.rglob("*") if p.is_file()} - {"manifest.json", ".lock"}
    assert on_disk == set(manifest["files"])
    assert all(bundle.sha256_file(default_bundle / n) == f["sha256"] for n, f in manifest["files"].items())
    b = bundle.read(default_bundle)
    assert b.inputs()["obs_0"].shape == (8, 59) and b.reference()["actions"].dtype == np.float64
    fp32 = manifest["points"]["cpu/fp32/eager/b8"]
    assert len(b.latency("cpu/fp32/eager/b8")) == fp32["latency"]["samples"] >= 5
    assert b.comparison("cpu/bf16/eager/b8")["outputs"]["actions"]["max_abs"] > b.comparison("cpu/fp32/eager/b8")["outputs"]["actions"]["max_abs"]


def test_a_bundle_whose_lock_another_writer_just_took_is_not_a_folder_in_use(tmp_path, monkeypatch):
    """The race behind a CI failure of the test below (7 of 8 points): a writer found neither manifest nor lock, then
    another writer took the lock, and the folder check refused `.lock` as a file that was not this job's."""
    real = bundle.check_unused

    def lock_taken_meanwhile(path, key):
        (Path(path) / bundle.LOCK).touch()
        return real(path, key)

    monkeypatch.setattr(bundle, "check_unused", lock_taken_meanwhile)
    bundle.check_out(tmp_path)  # an empty folder: a bundle's first point
    (tmp_path / "points" / "cpu-fp32").mkdir(parents=True)
    bundle.check_out(tmp_path)  # a bundle's own folders
    (tmp_path / "mine").mkdir()
    with pytest.raises(bundle.UserError, match="mine"):
        bundle.check_out(tmp_path)  # the user's folder is theirs, even empty


def test_concurrent_recordings_merge_into_one_manifest(tmp_path):
    """Eight writers at once (separate lock descriptors, as separate processes have): every point kept, every file listed."""
    inputs = {"obs_0": np.ones((4, 3), np.float32)}
    model, obs = {"sha256": "a" * 64}, {"inputs_sha256": bundle.arrays_sha256(inputs), "seed": 0}

    def write(i: int) -> None:
        bundle.record_point(tmp_path, model, obs, inputs, {"actions": np.zeros((4, 2))}, f"cpu/fp32/eager/b{i + 1}",
                            {"device": "cpu", "dtype": "fp32", "backend": "eager", "batch": i + 1, "environment": {}},
                            {"actions": np.full((4, 2), i, np.float32)}, np.arange(5.0), {"outputs": {}})

    workers = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    b = bundle.read(tmp_path)
    assert len(b.points) == 8
    assert all(b.outputs(f"cpu/fp32/eager/b{i + 1}")["actions"][0, 0] == i for i in range(8))


def test_record_never_writes_nan_outputs_into_a_bundle(small, tmp_path, monkeypatch):
    import huggy_exp.tasks.record as record_module

    class NaNRunner:
        def __init__(self, runner):
            self.runner, self.name, self.memory_size, self.target = runner, runner.name, runner.memory_size, runner.target

        def infer(self, feeds):
            out = self.runner.infer(feeds)
            return {k: np.where(np.arange(v.size).reshape(v.shape) == 3, np.float32(np.nan), v) for k, v in out.items()}

    real = record_module.build
    monkeypatch.setattr(record_module, "build", lambda ctx: NaNRunner(real(ctx)))
    r = record(tmp_path / "job", tmp_path / "b", small.model).record
    assert r["status"] == "failed" and "not recorded" in r["reason"] and "NaN" in r["reason"]
    assert not (tmp_path / "b").exists()


def test_record_refuses_a_bundle_of_another_model(default_bundle, small, tmp_path):
    out = copy_bundle(default_bundle, tmp_path / "b")
    job = record(tmp_path / "job", out, small.model)
    assert job.record["status"] == "error" and "another model" in job.record["reason"]


# --- replay: agreement


def test_a_copied_bundle_replays_bitwise_identical_and_passes_in_every_dtype(default_bundle, tmp_path):
    copied = copy_bundle(default_bundle, tmp_path / "elsewhere" / "bundle")
    for dtype in ("fp32", "fp16", "bf16"):
        job = replay(tmp_path / dtype, copied, f"dtype={dtype}", "batch_size=8")
        r = job.record
        assert r["status"] == "passed", r["reason"]
        assert r["metrics"]["agreement/bitwise_share"] == 1.0 and r["metrics"]["agreement/ulp_max"] == 0.0
        assert r["recorded_point"] == f"cpu/{dtype}/eager/b8" and r["tags"]["dual_benchmark"] == "pass"
        assert r["metrics"]["dual/actions/rmse_ratio"] == 1.0 and r["metrics"]["env/changed_fields"] == 0
        assert r["tags"]["fingerprint"] == r["recorded_fingerprints"]["fingerprint"]
        assert (job.workdir / "report.md").is_file() and "bitwise identical" in r["headline"]


@needs_shared
@pytest.mark.parametrize("fixture", ["pyramids", "huggy_lstm"])
def test_genuine_fixtures_record_and_replay_bitwise_in_every_dtype(fixture, tmp_path):
    """Pyramids (4 inputs, discrete) on 16 random rows; Huggy-LSTM on the first 4 steps of its genuine sequence (memory carried)."""
    if fixture == "pyramids":
        pt, obs = PYRAMIDS_PT, ["obs.rows=16"]
    else:
        np.save(tmp_path / "obs_seq4.npy", np.load(HUGGY_LSTM / "reference" / "obs_seq.npy", allow_pickle=False)[:4])
        pt, obs = HUGGY_LSTM_PT, ["obs=file", f"obs.path={tmp_path / 'obs_seq4.npy'}"]
    out = tmp_path / "bundle"
    for dtype in ("fp32", "fp16", "bf16"):
        job = record(tmp_path / f"rec-{dtype}", out, f"model.checkpoint={pt}", f"dtype={dtype}", "batch_size=16", *obs)
        assert job.record["status"] == "passed", job.record["reason"]
    copied = copy_bundle(out, tmp_path / "copy")
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["points"]["cpu/fp32/eager/b16"]["outputs"]) == ({"discrete_actions"} if fixture == "pyramids" else {"actions", "memories"})
    if fixture == "huggy_lstm":
        assert manifest["observations"]["inputs"]["obs_0"][0] == 4  # [T, N, d]: a sequence
    for dtype in ("fp32", "fp16", "bf16"):
        r = replay(tmp_path / f"rep-{dtype}", copied, f"model.checkpoint={pt}", f"dtype={dtype}", "batch_size=16").record
        assert r["status"] == "passed", r["reason"]
        assert r["metrics"]["agreement/bitwise_share"] == 1.0 and r["tags"]["dual_benchmark"] == "pass"


@pytest.mark.parametrize("shape", ["memory_hybrid_sac", "branches"])
def test_built_shapes_record_and_replay_bitwise(shape, shaped_files, tmp_path):
    pt, onnx = shaped_files[shape]
    model = [f"model.checkpoint={pt}", f"model.onnx={onnx}", "obs.rows=12", "batch_size=12"]
    for dtype in ("fp32", "bf16"):
        assert record(tmp_path / f"rec-{dtype}", tmp_path / "b", *model, f"dtype={dtype}").record["status"] == "passed"
    copied = copy_bundle(tmp_path / "b", tmp_path / "copy")
    for dtype in ("fp32", "bf16"):
        r = replay(tmp_path / f"rep-{dtype}", copied, *model, f"dtype={dtype}").record
        assert r["status"] == "passed", r["reason"]
        assert r["metrics"]["agreement/bitwise_share"] == 1.0


def test_a_replay_on_the_recording_stack_that_differs_in_bits_fails(small_bundle, small, tmp_path, monkeypatch):
    """The determinism check: same device, dtype, backend, batch and threads on an unchanged stack must give the same bits."""
    import huggy_exp.tasks.replay as replay_module

    class OneUlpOff:
        def __init__(self, runner):
            self.runner, self.name, self.memory_size, self.target = runner, runner.name, runner.memory_size, runner.target

        def infer(self, feeds):
            out = self.runner.infer(feeds)
            return {k: np.nextafter(v, np.float32(np.inf)) if v.dtype == np.float32 else v for k, v in out.items()}

    real = replay_module.build
    monkeypatch.setattr(replay_module, "build", lambda ctx: OneUlpOff(real(ctx)))
    r = replay(tmp_path, small_bundle, small.model).record
    assert r["status"] == "failed" and "not bitwise identical" in r["reason"]
    assert r["metrics"]["agreement/ulp_max"] == 1.0 and r["metrics"]["agreement/bitwise_share"] == 0.0


# --- replay: dual benchmark


def test_an_fp32_recording_replayed_as_bf16_gives_the_dual_benchmark_ratio_and_verdict(default_bundle, tmp_path):
    r = replay(tmp_path, default_bundle, "dtype=bf16", "batch_size=8", "mode.reference_point=cpu/fp32/eager/b8").record
    ratio = r["metrics"]["dual/actions/rmse_ratio"]
    assert ratio > 2 and r["tags"]["dual_benchmark"] == "fail" and r["status"] == "failed"
    assert "dual benchmark fails" in r["reason"] and "> 2" in r["reason"] and "> 10" in r["reason"]
    rows = {(row["output"], row["metric"]): row for row in _csv(tmp_path / "dual_benchmark.csv")}
    assert float(rows[("actions", "rmse")]["ratio"]) == pytest.approx(ratio) and rows[("actions", "rmse")]["verdict"] == "fail"
    assert rows[("actions", "max_rel")]["verdict"] in ("warn", "fail")
    report = (tmp_path / "report.md").read_text()
    assert "Dual benchmark (msprobe)" in report and "| actions | rmse |" in report


def test_a_dtype_without_a_recording_is_compared_against_fp64_only_and_says_so(small_bundle, small, tmp_path):
    r = replay(tmp_path, small_bundle, small.model, "dtype=bf16").record
    assert r["status"] == "passed", r["reason"]
    assert r["no_recording"] is True and r["recorded_point"] is None and "dual_benchmark" not in r["tags"]
    assert any("compared against the bundle's fp64 reference only" in line for line in r["notes"]) and "vs fp64 only" in r["headline"]
    assert r["metrics"]["actions/vs_fp64/max_abs"] > 0


def test_reference_point_by_dtype_and_unknown_reference_point(small_bundle, small, tmp_path):
    r = replay(tmp_path / "a", small_bundle, small.model, "dtype=bf16", "mode.reference_point=fp32").record
    assert r["reference_point"] == "cpu/fp32/eager/b64" and r["tags"]["dual_benchmark"] in ("warn", "fail")
    bad = replay(tmp_path / "b", small_bundle, small.model, "mode.reference_point=npu:0/fp32/eager/b64").record
    assert bad["status"] == "error" and "recorded: cpu/fp32/eager/b64" in bad["reason"]


def test_dual_benchmark_thresholds_are_msprobes():
    fp64 = {"actions": np.zeros(100)}
    ref = {"actions": np.full(100, 1e-3, np.float32)}
    verdicts = {}
    for scale in (1.0, 1.5, 3.0):
        rows = certify.dual_benchmark({"actions": np.full(100, 1e-3 * scale, np.float32)}, ref, fp64)
        verdicts[scale] = {r["metric"]: r["verdict"] for r in rows}
    assert verdicts[1.0] == {"rmse": "pass", "max_rel": "pass"}
    assert verdicts[1.5] == {"rmse": "warn", "max_rel": "warn"}
    assert verdicts[3.0] == {"rmse": "fail", "max_rel": "warn"}
    assert certify.rule_verdict(10.0, "max_rel") == "warn" and certify.rule_verdict(10.01, "max_rel") == "fail"
    assert certify.rule_verdict(float("nan"), "rmse") == "fail"


def test_ulp_distance_counts_float32_steps_and_signed_zeros_agree():
    a = np.array([1.0, -0.0, 2.0, np.nan], np.float32)
    b = np.array([np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, 2.0, 1.0], np.float32)
    m = certify.bitwise(a, b)
    assert m["ulp_max"] == np.inf and m["bitwise_share"] == 0.25
    m = certify.bitwise(a[:3], b[:3])
    assert m["ulp_max"] == 1.0 and m["ulp_over_1_share"] == 0.0 and m["bitwise_share"] == pytest.approx(1 / 3)


# --- replay: latency


def test_onnxruntime_replay_of_an_eager_recording_reports_the_latency_change(small_bundle, small, tmp_path):
    r = replay(tmp_path, small_bundle, small.model, "backend=onnxruntime", "mode.latency.budget_s=0.1",
               "mode.latency.max_samples=200", "plots=true").record
    assert r["status"] == "passed", r["reason"]
    assert r["recorded_point"] == "cpu/fp32/eager/b64" and r["metrics"]["actions/vs_recorded/max_abs"] <= 1e-5
    change = r["latency_change"]
    assert 0.0 <= change["p_value"] <= 1.0 and change["ci95_low"] <= change["median_ratio"] <= change["ci95_high"]
    assert "Mann-Whitney U" in change["test"] and change["tolerance"] in (0.05, 0.20)
    assert change["verdict"] in ("slower", "faster", "within tolerance", "not significant")
    assert (tmp_path / "latency_cdf.png").is_file() and "![latency](latency_cdf.png)" in (tmp_path / "report.md").read_text()


class SlowRunner:
    """A test-only runner: the real one plus a fixed 3 ms sleep per call (an injected slowdown)."""

    def __init__(self, runner, delay_s: float = 3e-3):
        self.runner, self.delay_s = runner, delay_s
        self.name, self.memory_size, self.target = f"slow-{runner.name}", runner.memory_size, runner.target

    def infer(self, feeds):
        time.sleep(self.delay_s)
        return self.runner.infer(feeds)


def test_an_injected_slowdown_is_reported_slower_with_its_p_value_and_interval(small_bundle, small, tmp_path, monkeypatch):
    import huggy_exp.tasks.replay as replay_module

    real = replay_module.build
    monkeypatch.setattr(replay_module, "build", lambda ctx: SlowRunner(real(ctx)))
    r = replay(tmp_path / "a", small_bundle, small.model).record
    change = r["latency_change"]
    assert change["verdict"] == "slower" and change["p_value"] < 0.01 and change["ci95_low"] > 1.2
    assert r["status"] == "passed" and r["tags"]["latency_change"] == "slower"  # reported, not gated by default
    gated = replay(tmp_path / "b", small_bundle, small.model, "mode.fail_on_latency=true").record
    assert gated["status"] == "failed" and "latency" in gated["reason"] and "p = " in gated["reason"]


def test_latency_change_rules_follow_test05_tolerance():
    rng = np.random.default_rng(1)
    base = 1e-3 * (1 + 0.01 * rng.standard_normal(200))
    same = certify.latency_change(base, 1e-3 * (1 + 0.01 * rng.standard_normal(200)))
    assert same["verdict"] == "within tolerance" and same["tolerance"] == 0.05
    slower = certify.latency_change(base, base * 1.10)
    assert slower["verdict"] == "slower" and slower["p_value"] < 1e-6
    short = certify.latency_change(base * 0.1, base * 0.1 * 1.10)  # 0.1 ms: TEST05's 20% applies
    assert short["tolerance"] == 0.20 and short["verdict"] == "within tolerance"


# --- replay: environment and safety


def test_an_edited_torch_version_shows_in_the_environment_diff(small_bundle, small, tmp_path):
    copied = copy_bundle(small_bundle, tmp_path / "b")
    manifest = json.loads((copied / "manifest.json").read_text())
    manifest["points"]["cpu/fp32/eager/b64"]["environment"]["versions"]["torch"] = "2.0.0+edited"
    (copied / "manifest.json").write_text(json.dumps(manifest))
    r = replay(tmp_path / "job", copied, small.model).record
    assert r["status"] == "passed", r["reason"]
    rows = {row["field"]: row for row in r["environment_diff"]}
    assert rows["versions.torch"]["recorded"] == "2.0.0+edited" and rows["versions.torch"]["here"] == environment.versions()["torch"]
    assert r["metrics"]["env/changed_fields"] == 1.0
    assert "versions.torch" in (tmp_path / "job" / "report.md").read_text()


def _edit_array(b: Path) -> str:
    rewrite_npz(b / "points/cpu-fp32-eager-b64/outputs.npz", lambda k, v: v + np.float32(1e-3))
    return "points/cpu-fp32-eager-b64/outputs.npz was modified"


def _truncate(b: Path) -> str:
    data = (b / "inputs.npz").read_bytes()
    (b / "inputs.npz").write_bytes(data[: len(data) // 2])
    return "inputs.npz is truncated"


def _remove(b: Path) -> str:
    (b / "reference_fp64.npz").unlink()
    return "reference_fp64.npz is missing"


def _unlisted(b: Path) -> str:
    (b / "points" / "notes.txt").write_text("hello")
    return "points/notes.txt is not listed in manifest.json"


def _version(b: Path) -> str:
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["format_version"] = 99
    (b / "manifest.json").write_text(json.dumps(manifest))
    return "format version 99 is not one this huggy_exp reads (reads 2, 3)"


def _not_json(b: Path) -> str:
    text = (b / "manifest.json").read_text()
    (b / "manifest.json").write_text(text[: len(text) // 2])
    return "manifest.json is not valid JSON"


def _pickled(b: Path) -> str:
    """An object array in a listed file whose hash matches: only allow_pickle=False stands between it and unpickling."""
    name = "points/cpu-fp32-eager-b64/outputs.npz"
    buffer = io.BytesIO()
    np.savez(buffer, actions=np.array([{"a": 1}], dtype=object))
    (b / name).write_bytes(buffer.getvalue())
    manifest = json.loads((b / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": bundle.sha256_file(b / name), "bytes": (b / name).stat().st_size}
    (b / "manifest.json").write_text(json.dumps(manifest))
    return "holds objects that need pickle: refused"


@pytest.mark.parametrize("damage", [_edit_array, _truncate, _remove, _unlisted, _version, _not_json, _pickled],
                         ids=["edited_array", "truncated", "missing", "unlisted", "format_version", "not_json", "pickled"])
def test_a_damaged_bundle_is_refused_in_one_line_naming_the_file(damage, small_bundle, small, tmp_path):
    copied = copy_bundle(small_bundle, tmp_path / "b")
    expected = damage(copied)
    r = replay(tmp_path / "job", copied, small.model).record
    assert r["status"] == "error" and expected in r["reason"] and "\n" not in r["reason"]


def test_another_models_bundle_is_refused_naming_both_hashes(default_bundle, small, tmp_path):
    r = replay(tmp_path / "a", default_bundle, small.model).record
    theirs = json.loads((default_bundle / "manifest.json").read_text())["model"]["sha256"]
    mine = json.loads((tmp_path / "a" / "result.json").read_text())["reason"].split("this job's ")[1].split(" ")[0]
    assert r["status"] == "error" and theirs in r["reason"] and len(mine) == 64 and mine != theirs
    assert "mode.allow_other_model=true" in r["reason"]
    allowed = replay(tmp_path / "b", default_bundle, small.model, "mode.allow_other_model=true").record
    assert "another model" not in allowed["reason"]  # past the check: 59-wide inputs do not fit an 8-input policy
    assert allowed["status"] == "error" and "do not fit" in allowed["reason"]


def test_replay_without_a_bundle_says_what_to_set(tmp_path):
    r = run_job(tmp_path, "replay").record
    assert r["status"] == "error" and "mode.bundle=" in r["reason"]


# --- device agreement and diff


def test_the_sweep_comparison_tables_replays_by_thread_count(small_bundle, small, tmp_path):
    from huggy_exp.compare import compare
    from huggy_exp.sweep import summarize

    for job, threads in enumerate((1, 2)):
        assert replay(tmp_path / str(job), small_bundle, small.model, f"threads={threads}").record["status"] == "passed"
    summary = summarize(tmp_path)
    table = compare(summary["rows"])["device_agreement"]
    assert [(t["threads"], t["equal_to_recording"], t["class"]) for t in table] == [(1, True, 0), (2, True, 0)]
    assert any(line.startswith("device agreement fp32") and "all bit-identical" in line for line in summary["comparison"]["lines"])


def test_diff_of_two_sweeps_lists_changed_and_one_sided_points(small, tmp_path):
    base, cand = tmp_path / "base", tmp_path / "cand"
    for n, dtype in enumerate(("fp32", "bf16", "fp16")):
        record(base / str(n), base / str(n) / "bundle", small.model, f"dtype={dtype}", "obs.rows=16")
    record(cand / "0", cand / "0" / "bundle", small.model, "dtype=fp32", "obs.rows=16")
    record(cand / "1", cand / "1" / "bundle", small.model, "dtype=bf16", "obs.rows=16", "obs.scale=1.5")  # other numbers, same point
    record(cand / "2", cand / "2" / "bundle", small.model, "dtype=fp64", "obs.rows=16")
    job = run_job(tmp_path / "diff", "diff", f"mode.baseline={base}", f"mode.candidate={cand}")
    r = job.record
    assert r["status"] == "passed", r["reason"]
    assert r["metrics"]["diff/changed"] == 1 and r["metrics"]["diff/unchanged"] == 1
    assert r["metrics"]["diff/only_baseline"] == 1 and r["metrics"]["diff/only_candidate"] == 1
    points = {p["point"]: p for p in r["points"]}
    bf16 = next(p for k, p in points.items() if "bf16" in k)
    assert bf16["changed"] and bf16["accuracy_changed"] > 0 and bf16["fingerprints_changed"] == 2
    assert "bitwise_share" not in bf16 and any("not applicable, the inputs differ" in c for c in bf16["changes"])  # other inputs
    assert next(p for k, p in points.items() if "fp16" in k)["side"] == "baseline only"
    assert next(p for k, p in points.items() if "fp64" in k)["side"] == "candidate only"
    fp32 = next(p for k, p in points.items() if "-fp32-" in k)
    assert not fp32["changed"] and fp32["bitwise_share"] == 1.0 and fp32["latency_p_value"] is not None
    assert "only in the baseline" in (job.workdir / "report.md").read_text()


def test_diff_reads_any_modes_result_json(small, tmp_path):
    """Jobs of other modes: outputs from their arrays, accuracy and fingerprints from result.json, latency as a p50 ratio."""
    for side, scale in (("base", 1.0), ("cand", 1.5)):
        run_job(tmp_path / side / "0", "precision", small.model, "dtype=bf16", "obs.rows=16", f"obs.scale={scale}")
        run_job(tmp_path / side / "1", "precision", small.model, "dtype=fp16", "obs.rows=16")
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={tmp_path / 'base'}", f"mode.candidate={tmp_path / 'cand'}").record
    points = {p["point"]: p for p in r["points"]}
    bf16, fp16 = (next(p for k, p in points.items() if f"-{d}-" in k) for d in ("bf16", "fp16"))
    assert bf16["changed"] and bf16["accuracy_changed"] > 0 and "bitwise_share" not in bf16 and bf16["dual"] is None
    assert any("inputs differ" in c for c in bf16["changes"])
    assert not fp16["changed"] and fp16["dual"] == "pass" and fp16["dual_worst_ratio"] == 1.0 and fp16["latency"] != "not measured"


def test_diff_of_two_bundles_runs_replays_rules(default_bundle, tmp_path):
    cand = copy_bundle(default_bundle, tmp_path / "cand")
    manifest = json.loads((cand / "manifest.json").read_text())
    manifest["points"]["cpu/fp16/eager/b8"]["environment"]["versions"]["torch"] = "9.9.9"
    (cand / "manifest.json").write_text(json.dumps(manifest))
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={default_bundle}", f"mode.candidate={cand}").record
    assert r["status"] == "passed", r["reason"]
    points = {p["point"]: p for p in r["points"]}
    assert points["cpu/fp16/eager/b8"]["changed"] and points["cpu/fp16/eager/b8"]["env_changed"] == 1
    assert not points["cpu/fp32/eager/b8"]["changed"] and points["cpu/fp32/eager/b8"]["bitwise_share"] == 1.0
    assert points["cpu/fp32/eager/b8"]["dual"] == "pass" and points["cpu/fp32/eager/b8"]["latency_p_value"] is not None


def test_diff_fails_when_a_candidate_point_is_worse_than_the_baselines(default_bundle, tmp_path):
    """The candidate's fp32 point carries bf16-grade outputs: its error vs fp64 is far above the baseline's (dual benchmark)."""
    cand = copy_bundle(default_bundle, tmp_path / "cand")
    name = "points/cpu-fp32-eager-b8/outputs.npz"
    shutil.copy(cand / "points/cpu-bf16-eager-b8/outputs.npz", cand / name)
    manifest = json.loads((cand / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": bundle.sha256_file(cand / name), "bytes": (cand / name).stat().st_size}
    (cand / "manifest.json").write_text(json.dumps(manifest))
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={default_bundle}", f"mode.candidate={cand}").record
    assert r["status"] == "failed" and "cpu/fp32/eager/b8: dual benchmark fails" in r["reason"]


def test_diff_refuses_what_is_not_a_sweep_or_bundle(tmp_path):
    r = run_job(tmp_path / "d", "diff", f"mode.baseline={tmp_path}", f"mode.candidate={tmp_path / 'nope'}").record
    assert r["status"] == "error" and "mode.baseline" in r["reason"] and "\n" not in r["reason"]


# --- slow: other processes


@pytest.mark.slow
def test_replay_from_a_fresh_copy_of_the_code_with_a_fresh_cache_is_bitwise_identical(default_bundle, tmp_path):
    """Another checkout (the tracked sources copied), another cache (the default re-written), the bundle copied."""
    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    for name in [*files, *(p.relative_to(REPO).as_posix() for p in (REPO / "huggy_exp").rglob("*.py")),
                 *(p.relative_to(REPO).as_posix() for p in (REPO / "conf").rglob("*.yaml")), "run.py"]:
        src = REPO / name
        if src.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / name)
    copied = copy_bundle(default_bundle, tmp_path / "elsewhere")
    replays = [(copied, dtype, ["batch_size=8"]) for dtype in ("fp32", "fp16", "bf16")]
    if PYRAMIDS_PT.is_file():  # a genuine fixture too: recorded here, replayed there
        for dtype in ("fp32", "bf16"):
            record(tmp_path / f"rec-pyr-{dtype}", tmp_path / "pyr", f"model.checkpoint={PYRAMIDS_PT}", f"dtype={dtype}", "obs.rows=16")
        pyr = copy_bundle(tmp_path / "pyr", tmp_path / "elsewhere-pyr")
        replays += [(pyr, dtype, [f"model.checkpoint={PYRAMIDS_PT}"]) for dtype in ("fp32", "bf16")]
    env = subprocess_env(tmp_path / "fresh_cache")
    env["PYTHONPATH"] = str(clone)
    for n, (source, dtype, extra) in enumerate(replays):
        done = subprocess.run([PYTHON, str(clone / "run.py"), "mode=replay", f"mode.bundle={source}", f"dtype={dtype}", *extra,
                               "tracking=none", f"hydra.run.dir={tmp_path / str(n)}", *FAST], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        r = json.loads((tmp_path / str(n) / "result.json").read_text())
        assert r["metrics"]["agreement/bitwise_share"] == 1.0 and "bitwise identical" in r["headline"]


@pytest.mark.slow
def test_bad_bundles_exit_2_with_one_line_and_no_traceback(small_bundle, small, tmp_path):
    copied = copy_bundle(small_bundle, tmp_path / "b")
    _edit_array(copied)
    env = subprocess_env(tmp_path / "cache")
    for n, args in enumerate(([f"mode.bundle={copied}", small.model], [f"mode.bundle={small_bundle}"])):  # modified; another model
        done = subprocess.run([PYTHON, str(REPO / "run.py"), "mode=replay", "tracking=none", *args,
                               f"hydra.run.dir={tmp_path / f'job{n}'}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 2, done.stdout + done.stderr
        assert "Traceback" not in done.stdout + done.stderr
        assert sum("ERROR:" in line for line in done.stdout.splitlines() + done.stderr.splitlines()) == 1, done.stdout + done.stderr


@pytest.mark.slow
def test_a_joblib_sweep_records_every_point_into_one_bundle_then_replays_and_diffs(small, tmp_path):
    env = subprocess_env(tmp_path / "cache")
    out = tmp_path / "bundle"

    def sweep(name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, str(REPO / "run.py"), "-m", *args, "tracking=none", small.model, *FAST,
                               f"hydra.sweep.dir={tmp_path / name}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)

    done = sweep("rec", "mode=record", f"mode.out={out}", "dtype=fp32,fp16,bf16", "batch_size=8,64",
                 "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")
    assert done.returncode == 0, done.stdout + done.stderr
    b = bundle.read(out)
    assert len(b.points) == 6
    done = sweep("rep", "mode=replay", f"mode.bundle={out}", "device=cpu", "threads=1,2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "device agreement fp32" in done.stdout and (tmp_path / "rep" / "device_agreement.csv").is_file()
    done = sweep("rec2", "mode=record", f"mode.out={tmp_path / 'bundle2'}", "dtype=fp32,bf16", "batch_size=8,64",
                 "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")  # joblib's workers set OMP/MKL_NUM_THREADS=1: same env
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run([PYTHON, str(REPO / "run.py"), "mode=diff", "tracking=none", f"mode.baseline={tmp_path / 'rec'}",
                           f"mode.candidate={tmp_path / 'rec2'}", f"hydra.run.dir={tmp_path / 'diff'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads((tmp_path / "diff" / "result.json").read_text())
    assert r["metrics"]["diff/unchanged"] == 4 and r["metrics"]["diff/only_baseline"] == 2  # fp16 at two batch sizes
    assert r["metrics"]["diff/only_candidate"] == 0
