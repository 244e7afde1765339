"""scripts/accelerator_check.py: the one call on a lent GPU or NPU (issue 24, failures 1 and 4).

Failure 1: one sweep `device=cpu,$DEVICE` ran the cpu jobs first and spent the step's limit on them, so no GPU point
started. Failure 4: the fixture shapes lived in ../shared, which does not travel to the device, and both fixture
steps skipped with exit 0. The fast tests check the plan (device points first, budgets from the configured minimum
durations, the fixture folder required), the first-failure summary and the refusals; the rehearsal (slow) runs the
whole check with its full settings on the emulated `npu` and holds it to 420 s, the device call's limit.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO, SHARED, needs_shared, subprocess_env

SCRIPT = REPO / "scripts" / "accelerator_check.py"
spec = importlib.util.spec_from_file_location("accelerator_check", SCRIPT)
check = sys.modules.setdefault(spec.name, importlib.util.module_from_spec(spec))
spec.loader.exec_module(check)


def fill_fixtures(folder: Path, shapes=check.SHAPES) -> Path:
    """What ../shared/device/prepare.sh puts in .fx/: each genuine policy's ONNX and configuration.yaml."""
    for shape in shapes:
        (folder / shape).mkdir(parents=True, exist_ok=True)
        for f in (SHARED / shape).glob("*.onnx"):
            (folder / shape / f.name).write_bytes(f.read_bytes())
    return folder


def device_values(step) -> list[str]:
    return next(a.split("=", 1)[1].split(",") for a in step.args if a.startswith("device="))


def test_failure_1_device_points_run_before_the_cpu_jobs_in_every_step():
    steps = check.plan("cuda:0", quick=False, onnx=[])
    for step in steps[:-1]:
        assert device_values(step)[0] == "cuda:0", step.args  # Hydra runs a sweep's values in the order given
    assert steps[-1].name == "benchmark-cpu" and device_values(steps[-1]) == ["cpu"]  # the CPU's own timing last
    assert device_values(next(s for s in steps if s.name == "benchmark")) == ["cuda:0"]


def test_each_step_has_its_own_budget_from_the_configured_minimum_durations():
    bench, ladder = dict(check.FULL["bench"]), check.FULL["ladder"]
    low, _ = check.benchmark_minimum(bench, 3, ladder, check.SCENARIOS)
    # per backend: 5 batches x (0.2 warm-up + 0.4 budget + 2 x 0.05 settle), and b65536, whose fewest calls (2 rounds
    # x 3) outlast that; LoadGen: single_stream, offline, server 1 s each, multi_stream's 662 queries, the server search
    # (5 probes halving from 1000 QPS, 0.4 s or 64 queries each); the control loop's 2 s and 5 probes (0.5 s or 50 ticks)
    rows = 2 * 3 * 65536 * check.ROW_S
    search = 0.4 + 0.4 + 0.4 + 64 / 125 + 64 / 62.5
    loop = 2 + 0.5 * 4 + 50 / 62.5
    assert low == pytest.approx(3 * (4 * 0.7 + 2 * 3 * 4096 * check.ROW_S + rows) + 3 + 662 * check.CALL_S + search + loop)
    bench["min_duration_ms"] = 3000
    high, _ = check.benchmark_minimum(bench, 3, ladder, check.SCENARIOS)
    assert high == pytest.approx(low + 4 * 2 - (662 * check.CALL_S - 1))  # each LoadGen run lasts 3 s, multi_stream's too
    steps = {s.name: s for s in check.plan("npu", quick=False, onnx=[])}
    timed = steps["benchmark"]
    # compiled once per chunk shape: 1, 8, 64, 512 and 1024 (4096 and 65536 rows run in chunks of mode.chunk_rows)
    assert timed.compiled == 5 and timed.jobs == 1 and timed.budget_s == round(check.SLACK * (
        check.START_S + check.POINT_S + timed.timed_s + 5 * check.COMPILE_S))
    assert steps["loadgen"].compiled == 3  # batch 64, 1 (single_stream, server) and 8 (multi_stream's samples per query)
    assert "timed" in timed.shown() and f"budget {timed.budget_s:.0f} s" in timed.shown()
    from huggy_exp import control_loop, loadgen  # the floors the script copies (it imports no torch itself)

    assert (check.PROBE_TICKS, check.MULTI_STREAM_QUERIES) == (control_loop.MIN_PROBE_TICKS, loadgen.MULTI_STREAM_MIN_QUERIES)


def test_the_planned_steps_fit_the_device_call_and_time_each_backend_once(tmp_path):
    """The estimates (budget / SLACK) of every step add up to less than the whole run's budget, and the ladder is timed
    once per backend: eager, compile, graphs and onnxruntime together in one job (their ratios from one run)."""
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    for device in ("cuda", "npu:1", "cpu"):
        steps = check.plan(device, quick=False, onnx=onnx)
        assert sum(s.budget_s for s in steps) / check.SLACK <= check.TOTAL_S, [s.shown() for s in steps]
    steps = {s.name: s for s in check.plan("cuda", quick=False, onnx=onnx)}
    ladder = [s for s in steps.values() if "mode.batch_sizes=[1,8,64,512,4096,65536]" in s.args and "device=cuda" in s.args]
    assert [s.name for s in ladder] == ["benchmark"] and "mode.backends=[eager,compile,graphs,onnxruntime]" in ladder[0].args
    assert "backend=compile" in steps["loadgen"].args and "mode.backends=[eager]" in steps["loadgen"].args
    assert steps["modes"].args[:2] == ["mode=action,precision,fingerprint,stats", "device=cuda,cpu"]  # one process
    assert steps["modes"].jobs == 4 * 2 * 3


def test_a_step_reports_its_cpu_seconds_and_the_load_around_it(tmp_path):
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass"
    step = check.Step("burn", [], 1)
    check.run_step(step, [sys.executable, "-c", burn], tmp_path, 30)
    assert step.rc == 0 and step.cpu_s >= 0.25 and step.took_s >= step.cpu_s * 0.5
    low, high = map(float, step.load.split("-"))  # the 1-minute load average before and after
    assert low >= 0 and high >= 0
    assert f"| burn | 0 | {step.took_s:.0f} | {step.cpu_s:.0f} | {step.load} | 0 |" in check.summary(
        "cpu", [step], tmp_path, False, time.monotonic())


def test_the_fixture_shapes_come_from_the_fixture_folder(tmp_path):
    onnx = check.fixtures(fill_fixtures(tmp_path / "fx")) if SHARED.is_dir() else [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    steps = {s.name: s for s in check.plan("npu:0", quick=False, onnx=onnx)}
    models = next(a for a in steps["fixtures-precision"].args if a.startswith("model.onnx="))
    assert models == "model.onnx=" + ",".join(map(str, onnx)) and len(onnx) == 3
    assert steps["fixtures-benchmark"].jobs == 3 and device_values(steps["fixtures-precision"]) == ["npu:0"]


def test_failure_4_a_missing_fixture_folder_is_an_error_unless_a_flag_says_to_skip_it(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "cuda", str(tmp_path / "out"), "--fixtures", str(tmp_path / "none")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no fixture folder" in done.stderr and "prepare.sh" in done.stderr
    assert "--no-fixtures" in done.stderr and not (tmp_path / "out").exists()  # refused before any step
    (tmp_path / "fx" / "huggy").mkdir(parents=True)
    with pytest.raises(SystemExit, match="huggy has no .onnx"):
        check.fixtures(tmp_path / "fx")
    assert check.fixtures(None) == []  # --no-fixtures


def point(job: str, device: str, dtype: str, status: str, note: str = "") -> dict:
    return {"job": job, "run_name": f"precision-{device}-{dtype}-b64", "status": status, "note": note, "mode": "precision",
            "device": device, "dtype": dtype, "precision_mode": "ieee", "line": f"{job} {status}"}


def test_the_summary_puts_the_first_failure_on_top(tmp_path):
    ok = check.Step("points", ["device=cuda:0,cpu"], 2, rc=0, rows=[point("0", "cuda:0", "fp32", "passed"),
                                                                    point("1", "cpu", "fp32", "passed")])
    bad = check.Step("precision", ["mode=precision"], 2, rc=1, rows=[point("0", "cuda:0", "fp16", "failed", "max_abs 0.3 > 0.01"),
                                                                    point("1", "cpu", "fp16", "passed")])
    cut = check.Step("benchmark", ["mode=benchmark"], 1, rc=124)
    (tmp_path / "benchmark.log").write_text("timing ...\n")
    text = check.summary("cuda:0", [ok, bad, cut, check.Step("stats", [], 1)], tmp_path, False, time.monotonic())
    assert text.splitlines()[2] == "**FAILED**: step `precision`: job 0 precision-cuda:0-fp16-b64 FAILED: max_abs 0.3 > 0.01"
    assert "- FIRST: stopped at its budget" in text and "| stats | 0 | not run |" in text


def test_a_point_that_fails_on_the_cpu_alike_is_the_policys_and_listed_apart(tmp_path):
    """stats in bf16 drifts past its limit on the CPU as on the card: a finding about the policy, shown, not the
    device's first failure."""
    both = check.Step("stats", ["mode=stats"], 2, rc=1, rows=[point("0", "npu", "bf16", "failed", "max_abs 0.052 > 0.05"),
                                                              point("1", "cpu", "bf16", "failed", "max_abs 0.052 > 0.05")])
    assert check.failures(both) == []
    text = check.summary("npu", [both], tmp_path, False, time.monotonic())
    assert text.splitlines()[2].startswith("**passed**") and "(1 point(s): listed under their step)" in text
    assert "job 0 precision-npu-bf16-b64 FAILED on the cpu too: max_abs 0.052 > 0.05 (the policy's, not the device's)" in text


def test_an_unknown_device_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(["bash", str(REPO / "scripts" / "accelerator_check.sh"), "tpu", str(tmp_path)],
                          capture_output=True, text=True, timeout=30, env={**subprocess_env(tmp_path / "c"), "PYTHON": sys.executable})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown DEVICE 'tpu'" in done.stderr


@pytest.mark.slow
@needs_shared
def test_the_rehearsal_on_the_emulated_npu_with_full_settings_fits_in_420_s(tmp_path, huggy_exp_cache):
    """The whole check as the lent card runs it (full settings, the three genuine policies from the fixture folder),
    on the emulated `npu`: every device point passes or fails as its CPU twin does, device points first, one tarball
    and SUMMARY.md beside it, in 420 s."""
    out, box = tmp_path / "acc", tmp_path / "OUT"
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), "npu", str(out), "--tar", str(box / "acc.tgz"),
                           "--fixtures", str(fill_fixtures(tmp_path / "fx")),
                           "--python", f"{sys.executable} {REPO / 'tests' / 'emulated_npu.py'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=subprocess_env(huggy_exp_cache))
    took = time.monotonic() - started
    summary = (box / "SUMMARY.md").read_text()
    assert done.returncode == 0, done.stdout[-3000:] + summary[:3000]
    assert took < 420, f"{took:.0f} s: the check must fit the device call's 420 s\n{done.stdout}"
    assert summary.splitlines()[2].startswith("**passed**") and "- FIRST:" not in summary
    printed = done.stdout.splitlines()
    for step in ("modes", "benchmark", "loadgen", "fixtures-precision", "fixtures-benchmark", "benchmark-cpu"):
        budget = next(i for i, line in enumerate(printed) if line.startswith(f"{step}: budget"))
        assert printed[budget + 1].startswith(f"{step}: exit "), printed  # the budget shown before the step ran
        if step != "benchmark-cpu":
            first = json.loads((out / step / "0" / "result.json").read_text())
            assert first["device"] == "npu" and first["emulated"] is True  # device points first
    for line in summary.splitlines():  # a point failing on the card and the CPU alike: the policy's, listed apart
        if "(the policy's, not the device's)" in line:
            assert "-npu-bf16-" in line, line
    bench = json.loads((out / "benchmark" / "0" / "result.json").read_text())
    assert {k: v["status"] for k, v in bench["details"]["backends"].items()} == {
        "eager": "passed", "compile": "passed", "graphs": "passed", "onnxruntime": "skipped"}
    assert bench["metrics"]["loadgen/server/valid"] in (0.0, 1.0) and "control_loop/ticks" in bench["metrics"]
    compiled = json.loads((out / "loadgen" / "0" / "result.json").read_text())  # the scenarios on compile
    assert compiled["details"]["backends"]["compile"]["status"] == "passed" and "control_loop/ticks" in compiled["metrics"]
    with tarfile.open(box / "acc.tgz") as tar:
        names = tar.getnames()
    assert "acc/SUMMARY.md" in names and "acc/fixtures-precision/summary.json" in names


def test_a_step_stopped_at_its_budget_still_reports_the_points_it_finished(tmp_path):
    record = {"run_name": "stats-npu-bf16-b64", "status": "failed", "reason": "max_abs 0.052 > 0.05", "mode": "stats",
              "device": "npu", "dtype": "bf16"}
    (tmp_path / "stats" / "0").mkdir(parents=True)
    (tmp_path / "stats" / "0" / "result.json").write_text(json.dumps(record))  # no summary.json: the sweep was cut
    found = check.rows(tmp_path / "stats")
    assert [(r["job"], r["status"], r["note"], r["precision_mode"]) for r in found] == [
        ("0", "failed", "max_abs 0.052 > 0.05", "ieee")]
