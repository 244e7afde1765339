"""scripts/accelerator_check.py: the one call on a lent GPU or NPU (issue 24, failures 1 and 4).

Failure 1: one sweep `device=cpu,$DEVICE` ran the cpu jobs first and spent the step's limit on them, so no GPU point
started. Failure 4: the fixture shapes lived in ../shared, which does not travel to the device, and both fixture
steps skipped with exit 0. The fast tests check the plan (device points first, budgets from the configured minimum
durations, the fixture folder required), the first-failure summary and the refusals; the rehearsal (slow) runs the
whole check with its full settings on the emulated `npu` and holds it to 420 s, the device call's limit.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import REPO, SHARED, needs_shared, subprocess_env

from huggy_exp import files

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
    bench, ladder = {**check.FULL["bench"], "energy": False}, check.FULL["ladder"]
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
    metered, why = check.benchmark_minimum({**bench, "energy": True, **check.ENERGY}, 3, ladder, check.SCENARIOS)
    assert metered == pytest.approx(high + 3 * (5 + 1)) and "energy 18 s" in why  # each backend: 1 s idle, a 5 s window
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
    """When every step takes its estimate (budget / SLACK) and each packing its allowance, every step still gets a cap
    of at least its estimate within the run's budget; and the ladder is timed once per backend: eager, compile, graphs
    and onnxruntime together in one job (their ratios from one run)."""
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    for device, metered in itertools.product(("cuda", "npu:1", "cpu"), (False, True)):  # a meter: energy's windows too
        used = check.PACK_S
        for step in check.plan(device, quick=False, onnx=onnx, metered=metered):
            assert check.cap_s(step, check.TOTAL_S - used) >= step.budget_s / check.SLACK, (device, step.shown(), used)
            used += step.budget_s / check.SLACK + check.PACK_S
    steps = {s.name: s for s in check.plan("cuda", quick=False, onnx=onnx)}
    ladder = [s for s in steps.values() if "mode.batch_sizes=[1,8,64,512,4096,65536]" in s.args and "device=cuda" in s.args]
    assert [s.name for s in ladder] == ["benchmark"] and "mode.backends=[eager,compile,graphs,onnxruntime]" in ladder[0].args
    assert "backend=compile" in steps["loadgen"].args and "mode.backends=[eager]" in steps["loadgen"].args
    assert steps["modes"].args[:2] == ["device=cuda,cpu", "mode=action,precision,fingerprint,stats"]  # one process
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
    late = check.Step("stats", [], 1, note="not run: 3 s left of --total-s 390")
    text = check.summary("cuda:0", [ok, bad, cut, late], tmp_path, False, time.monotonic())
    assert text.splitlines()[2] == "**FAILED**: step `precision`: job 0 precision-cuda:0-fp16-b64 FAILED: max_abs 0.3 > 0.01"
    assert "- FIRST: stopped at its cap" in text and "| stats | 0 | not run |" in text and "- not run: 3 s left" in text


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
    and SUMMARY.md beside it, within its own --total-s (the device call's 420 s less setup and margin)."""
    out, box = tmp_path / "acc", tmp_path / "OUT"
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(SCRIPT), "npu", str(out), "--tar", str(box / "acc.tgz"),
                           "--fixtures", str(fill_fixtures(tmp_path / "fx")),
                           "--python", f"{sys.executable} {REPO / 'tests' / 'emulated_npu.py'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=subprocess_env(huggy_exp_cache))
    took = time.monotonic() - started
    summary = (box / "SUMMARY.md").read_text()
    assert done.returncode == 0, done.stdout[-3000:] + summary[:3000]
    assert took < check.TOTAL_S + 5, f"{took:.0f} s: the check must end within {check.TOTAL_S:g} s\n{done.stdout}"
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


# --- issue 33 rows 2 and 10, issue 36 classes 6 and 13


class Hung:
    """A step's sweep that never ends, even on SIGKILL (a card stuck in the driver): each wait takes its whole timeout
    on the test's clock."""

    def __init__(self, clock: list[float]):
        self.clock, self.pid = clock, -1

    def wait(self, timeout=None):
        self.clock[0] += timeout
        raise subprocess.TimeoutExpired("run.py", timeout)


def every_plan(tmp_path):
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    return [(d, q, o) for d in ("cuda", "npu:1", "cpu") for q in (False, True) for o in ([], onnx)]


def test_row_2_the_plan_with_every_cap_kill_and_packing_stays_under_400_s(tmp_path, monkeypatch):
    """Every step hangs to its cap and needs the whole kill grace, and each packing takes its allowance: the device call
    (setup included) still ends by 400 s, 20 s inside its 420 s; the caps main gives are worst_case()'s."""
    assert check.DEVICE_CALL_S - check.MARGIN_S == 400
    assert f"`timeout_s: {check.DEVICE_CALL_S:.0f}`" in (REPO / "docs" / "hardware" / "cuda.md").read_text()
    clock, caps = [0.0], []
    monkeypatch.setattr(check, "time", type("T", (), {"monotonic": staticmethod(lambda: clock[0]), "gmtime": time.gmtime,
                                                      "strftime": time.strftime}))
    monkeypatch.setattr(check, "subprocess", type("S", (), {"Popen": lambda *a, **k: Hung(clock), "STDOUT": subprocess.STDOUT,
                                                           "TimeoutExpired": subprocess.TimeoutExpired}))
    monkeypatch.setattr(check.os, "killpg", lambda pid, sig: None)
    real_run, real_publish = check.run_step, getattr(check, "publish", None)
    monkeypatch.setattr(check, "run_step", lambda step, python, out, cap: caps.append(cap) or real_run(step, python, out, cap))
    if real_publish:
        monkeypatch.setattr(check, "publish", lambda *a: (real_publish(*a), clock.__setitem__(0, clock[0] + check.PACK_S)))
    for (device, quick, onnx), meter in itertools.product(every_plan(tmp_path), ("", "a meter")):
        clock[0], caps[:] = 0.0, []
        monkeypatch.setattr(check, "fixtures", lambda folder, onnx=onnx: onnx)
        monkeypatch.setattr(check, "energy_meter", lambda device, meter=meter: meter)
        out = tmp_path / f"{device}-{quick}-{len(onnx)}-{bool(meter)}"
        assert check.main([device, str(out), "--tar", f"{out}.d/acc.tgz", *(["--quick"] if quick else [])]) != 0  # all cut
        took = check.SETUP_S + clock[0]
        assert took <= 400, (device, quick, len(onnx), took, caps)
        planned, worst = check.worst_case(check.plan(device, quick, onnx, bool(meter)))
        assert [c for c in planned if c] == caps and took <= worst <= 400, (planned, caps, took, worst)


class Cut(BaseException):
    """The device call's end: the check is killed where it stands."""


def sweep_of(step, out: Path, status: str = "passed", device: str | None = None) -> None:
    """What a step's sweep leaves: a point's result.json and the sweep's summary.json."""
    device = device or device_values(step)[0]
    record = {"run_name": f"{step.name}-{device}", "status": status, "mode": "precision", "device": device,
              "dtype": "fp32", "reason": "no such card" if status == "skipped" else ""}
    (out / step.name / "0").mkdir(parents=True)
    (out / step.name / "0" / "result.json").write_text(json.dumps(record))
    (out / step.name / "summary.json").write_text(json.dumps({"rows": check.rows(out / step.name)}))
    step.rc, step.rows = 0, check.rows(out / step.name)


@pytest.mark.parametrize("cut_at", range(6))
def test_row_2_a_call_cut_at_any_step_returns_every_finished_steps_results(tmp_path, monkeypatch, cut_at):
    """The device call ends while step `cut_at` runs: the archive beside SUMMARY.md already holds every step before it,
    and the summary names them and the step that was running, never a verdict of passed."""
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    monkeypatch.setattr(check, "fixtures", lambda folder: onnx)
    names = [s.name for s in check.plan("cuda", False, onnx)]
    assert len(names) == 6

    def run_step(step, python, out, cap):
        if step.name == names[cut_at]:
            raise Cut
        sweep_of(step, out)

    monkeypatch.setattr(check, "run_step", run_step)
    box = tmp_path / "OUT"
    with pytest.raises(Cut):
        check.main(["cuda", str(tmp_path / "acc"), "--tar", str(box / "acc.tgz")])
    with tarfile.open(box / "acc.tgz") as tar:
        held = {n.split("/")[1] for n in tar.getnames() if n.endswith("/0/result.json")}
        inside = tar.extractfile("acc/SUMMARY.md").read().decode()
    assert held == set(names[:cut_at])
    summary = (box / "SUMMARY.md").read_text()
    assert summary == inside and summary.splitlines()[2].startswith(
        f"**incomplete**: {cut_at} of 6 step(s) finished, `{names[cut_at]}` next")


def sweep_order(step) -> list[dict]:
    """The jobs of a step's sweep in the order Hydra's basic sweeper runs them (its own code, on the step's overrides)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(step.args), None)[0]
    return [dict(o.replace("\\:", ":").split("=", 1) for o in job) for job in jobs]


def test_row_10_every_device_point_of_every_mode_runs_before_the_cpus_twins(tmp_path):
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    for device in ("cuda", "npu:1"):
        for step in check.plan(device, False, onnx):
            order = [job["device"] for job in sweep_order(step)]
            first_cpu = order.index("cpu") if "cpu" in order else len(order)
            assert set(order[:first_cpu]) <= {device} and set(order[first_cpu:]) <= {"cpu"}, (step.name, order)
    modes = sweep_order(check.plan("cuda", False, [])[0])
    assert {job["mode"] for job in modes[:12]} == {"action", "precision", "fingerprint", "stats"}  # all, on the card first


def test_class_6_a_check_that_ran_nothing_or_no_device_point_does_not_pass(tmp_path, monkeypatch):
    """--total-s 0 is refused; a budget too short for any step runs none and fails; a device whose every point is
    skipped (no card) fails the step, and the steps after it are not run (they would skip alike)."""
    for bad in ("0", "-5", "nan", "inf"):
        done = subprocess.run([sys.executable, str(SCRIPT), "cuda", str(tmp_path / f"o{bad}"), "--no-fixtures", "--total-s", bad],
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--total-s" in done.stderr, done.stderr
        assert not (tmp_path / f"o{bad}").exists()
    assert check.main(["cuda", str(tmp_path / "short"), "--no-fixtures", "--total-s", "3"]) == 1
    text = (tmp_path / "short" / "SUMMARY.md").read_text()
    assert text.splitlines()[2].startswith("**FAILED**: step `modes`: not run: 3 s left") and "passed" not in text.splitlines()[2]

    monkeypatch.setattr(check, "run_step", lambda step, python, out, cap: sweep_of(step, out, "skipped"))
    assert check.main(["cuda", str(tmp_path / "nocard"), "--no-fixtures"]) == 1
    text = (tmp_path / "nocard" / "SUMMARY.md").read_text()
    assert text.splitlines()[2] == ("**FAILED**: step `modes`: no cuda point ran: 1 skipped, e.g. job 0: no such card")
    assert "- not run: no cuda point ran: 1 skipped" in text and "| benchmark-cpu | " in text and " not run |" in text

    monkeypatch.setattr(check, "run_step", lambda step, python, out, cap: sweep_of(step, out, "passed", "cpu"))
    assert check.main(["npu", str(tmp_path / "cpu-only"), "--no-fixtures"]) == 1  # a sweep that ran on the cpu alone
    assert "no npu point ran" in (tmp_path / "cpu-only" / "SUMMARY.md").read_text().splitlines()[2]
    monkeypatch.setattr(check, "run_step", lambda step, python, out, cap: sweep_of(step, out))
    assert check.main(["npu", str(tmp_path / "ok"), "--no-fixtures"]) == 0


@pytest.mark.slow
def test_class_6_the_check_on_a_host_without_its_card_fails(tmp_path, huggy_exp_cache):
    """accelerator_check.sh cuda on this machine (no GPU): every cuda point is skipped, so the check fails and runs
    nothing more."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "accelerator_check.sh"), "cuda", str(tmp_path / "acc"), "--quick",
                           "--no-fixtures"], capture_output=True, text=True, timeout=600,
                          env={**subprocess_env(huggy_exp_cache), "PYTHON": sys.executable})
    summary = (tmp_path / "acc" / "SUMMARY.md").read_text()
    assert done.returncode in (1, 124), done.stdout[-3000:] + done.stderr[-3000:]  # 124: the CPU twins cut at a high load
    assert summary.splitlines()[2].startswith("**FAILED**: step `modes`: "), summary
    assert "no cuda point ran: 8 skipped, e.g. job 0: device cuda: no CUDA device" in summary
    assert "| benchmark | " in summary and "- not run: no cuda point ran" in summary


def test_class_13_the_check_replaces_no_file_and_packs_no_archive_into_itself(tmp_path, monkeypatch):
    """OUTDIR follows run.py's folder rules (new or empty: here it holds an earlier SUMMARY.md), --tar never replaces a
    file (the archive, the SUMMARY.md beside it), and an archive inside OUTDIR is refused: one line, exit 2, no step run,
    every file as it was."""
    held = tmp_path / "held"
    held.mkdir()
    (held / "SUMMARY.md").write_text("an earlier check\n")
    old = tmp_path / "old"
    old.mkdir()
    (old / "acc.tgz").write_bytes(b"an earlier archive")
    beside = tmp_path / "beside"
    beside.mkdir()
    (beside / "SUMMARY.md").write_text("the summary of another archive\n")
    (tmp_path / "file").write_text("a file\n")
    cases = {(str(held),): "OUTDIR=", (str(tmp_path / "new"), "--tar", str(old / "acc.tgz")): "already exists",
             (str(tmp_path / "new"), "--tar", str(beside / "acc.tgz")): "already exists",
             (str(tmp_path / "new"), "--tar", str(tmp_path / "new" / "acc.tgz")): "inside OUTDIR",
             (str(tmp_path / "new"), "--tar", str(tmp_path / "new")): "inside OUTDIR",
             (str(tmp_path / "file"),): "is a file"}
    for args, said in cases.items():
        done = subprocess.run([sys.executable, str(SCRIPT), "cuda", *args, "--no-fixtures", "--total-s", "1"], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and not (tmp_path / "new").exists(), args
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / files.CLAIM).write_text("pid 1 on host since now\n")  # a running sweep's folder: its points are its own
    done = subprocess.run([sys.executable, str(SCRIPT), "cuda", str(sweep / "0"), "--no-fixtures", "--total-s", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is inside" in done.stderr and not (sweep / "0").exists(), done.stderr
    out, _ = check.claim_outputs(tmp_path / "mine", None)  # taken; yet each step's sweep inside it is run.py's to claim
    assert files.claim_folder(out / "modes", "hydra.sweep.dir") == out / "modes"
    with monkeypatch.context() as m, pytest.raises(files.UserError, match="taken by another check first"):
        m.setattr(check, "check_unused", lambda path, key: Path(path).absolute())  # a twin that looked before it was taken
        check.claim_outputs(out, None)
    assert (held / "SUMMARY.md").read_text() == "an earlier check\n" and sorted(p.name for p in held.iterdir()) == ["SUMMARY.md"]
    assert (old / "acc.tgz").read_bytes() == b"an earlier archive"
    assert (beside / "SUMMARY.md").read_text() == "the summary of another archive\n"


def test_energy_per_action_is_measured_in_the_benchmark_step_alone_and_budgeted_where_a_meter_answers(tmp_path):
    """energy.py's windows (idle, then at least 5 s of steady inference) cost seconds per timed backend: the check asks
    for them in `benchmark` only (every backend on the device), and budgets them when the device has a meter."""
    onnx = [tmp_path / f"{s}.onnx" for s in check.SHAPES]
    caps = {}
    for metered in (False, True):
        steps = {s.name: s for s in check.plan("npu", False, onnx, metered)}
        assert {"mode.energy=true", "mode.energy_window_s=5.0", "mode.energy_idle_s=1.0"} <= set(steps["benchmark"].args)
        assert ("energy 24 s" in steps["benchmark"].why) is metered  # 4 backends x (1 + 5 s)
        for name in ("loadgen", "fixtures-benchmark", "benchmark-cpu"):
            assert "mode.energy=false" in steps[name].args and "energy" not in steps[name].why, name
        assert check.worst_case(list(steps.values()))[1] <= 400
        caps[metered] = check.worst_case(list(steps.values()))[0][1]
    assert caps[True] - caps[False] == check.SLACK * 24  # worst_case() gives the benchmark step its energy windows
    assert check.energy_meter("npu:0") == "" and check.energy_meter("cuda") == ""  # no npu-smi, no zeus here
