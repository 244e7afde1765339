"""The accelerator path on an emulated `npu` (tests/emulated_npu.py: PrivateUse1 renamed `npu`, two cards, real values).

Each test starts a child process under the emulator (the rename is once per process; this pytest process never has an
`npu`). The default run keeps to a few child processes (about 20 s of CPU in all); the full sweeps are `slow`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, REPO, subprocess_env

EMULATOR = REPO / "tests" / "emulated_npu.py"
PERTURB = "HUGGY_EXP_EMULATED_NPU_PERTURB"


def emulated(args: list[str], cache: Path, timeout: int = 300, **env: str) -> subprocess.CompletedProcess:
    """`python tests/emulated_npu.py <args>` from the repository root."""
    return subprocess.run([PYTHON, str(EMULATOR), *args], cwd=REPO, env={**subprocess_env(cache), **env},
                          capture_output=True, text=True, timeout=timeout)


def sweep(tmp_path: Path, cache: Path, *overrides: str, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    """A multirun through run.py, Hydra and MLflow (a SQLite store in tmp_path): (the process, the sweep folder)."""
    folder = tmp_path / "sweep"
    done = emulated(["run.py", "-m", *overrides, "plots=false", f"hydra.sweep.dir={folder}",
                     f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"], cache, **env)
    return done, folder


def records(folder: Path) -> dict[str, dict]:
    """result.json of every point, keyed by its device."""
    return {r["device"]: r for r in (json.loads(p.read_text()) for p in sorted(folder.glob("*/result.json")))}


@pytest.fixture(scope="session")
def runs(huggy_exp_cache) -> dict:
    """tests/emulated_npu_runs.py's findings (huggy_exp's device paths on npu:1), run once for every worker: the first
    worker to ask runs it under a file lock, the others read what it wrote."""
    import fcntl

    folder = huggy_exp_cache / "emulated_npu_runs"
    folder.mkdir(exist_ok=True)
    found = folder / "runs.json"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not found.is_file():
            done = emulated(["tests/emulated_npu_runs.py", str(folder)], huggy_exp_cache, timeout=300)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            found.write_text(done.stdout.strip().splitlines()[-1])
    return json.loads(found.read_text())


def test_failure_7_graphs_on_the_second_card_replay_fresh_outputs(runs):
    assert runs["graphs_vs_eager"] == [0.0, 0.0, 0.0]  # three new inputs: each replay computes, none is stale
    assert runs["benchmark"]["backends"]["graphs"] == "passed"


def test_row_1_graphs_on_a_second_card_in_one_process_capture_the_policy(runs):
    """torch_npu's `graph` keeps one capture stream per process, made on the card current at the first capture; graphs
    on npu:0 then npu:1 in one process each record the policy's ops on their own card and replay fresh values."""
    both = runs["graphs_on_both_cards"]
    assert both["npu:0"]["card"] == 0 and both["npu:1"]["card"] == 1
    assert both["npu:0"]["ops"] == both["npu:1"]["ops"] > 5  # the same policy's ops on each card, not an empty capture
    assert both["npu:0"]["max_gap"] == both["npu:1"]["max_gap"] == 0.0  # every replay computes the new inputs


def test_failure_10_a_thread_that_never_set_the_card_runs_the_policy_on_it(runs):
    assert runs["new_thread"] == "equal"  # the runner makes its card current in whichever thread calls it
    bench = runs["benchmark"]  # LoadGen's server worker thread answered on npu:1, checked against eager
    assert bench["status"] == "passed" and bench["server_valid"] in (0.0, 1.0) and bench["server_vs_eager"] <= 1e-5


def test_failure_3_compile_on_the_npu_runs_torch_npus_dynamo_backend_on_the_card(runs):
    """The emulator registers the dynamo backend `npu` as torch_npu does; compile on npu:1 builds through it (fullgraph)
    and gives eager's bytes on new inputs, and the benchmark times it beside eager and graphs."""
    *gaps, graphs = runs["compile"]
    assert gaps == [0.0, 0.0, 0.0] and graphs >= 1
    assert runs["benchmark"]["backends"] == {"eager": "passed", "compile": "passed", "graphs": "passed",
                                             "onnxruntime": "skipped"}


def test_failure_3_a_compile_backend_that_fails_on_the_card_fails_alone_with_its_first_line(runs):
    """torch_npu without torchair registers an eager stand-in as `npu`: refused (never timed as compile). torchair's
    backend raising while it builds: compile fails with the compiler's own first line, eager and graphs are timed."""
    fails = runs["compile_fails"]
    assert fails["stand_in"].startswith("backend compile on npu: torch_npu was built without torchair")
    assert fails["status"] == "failed" and fails["backends"] == {
        "eager": ["passed", ""], "graphs": ["passed", ""],
        "compile": ["failed", "BackendCompilerFailed: backend='broken' raised: RuntimeError: graph capture failed on the card"]}


def test_row_5_compile_on_npu_runs_torchairs_aclgraph_with_each_points_fp32_math_and_records_it(runs):
    """torch_npu's `npu` backend is torchair's default, GE's graph: its HF32 read once per process and no precision_mode
    (CANN's default runs fp32 matmuls in fp16). compile on npu runs torchair's reduce-overhead: torch_npu's kernels, so
    an hf32 point then an ieee point in one process each give eager's bytes under their own switches; it is recorded."""
    found = runs["torchair"]
    assert found == {"hf32": 0.0, "ieee": 0.0, "recorded": "reduce-overhead"}
    assert runs["benchmark"]["switches_recorded"]["fp32_precision/torchair_mode"] == "reduce-overhead"


def test_failure_8_onnxruntime_without_cann_is_skipped_naming_the_providers_found(runs):
    assert runs["onnxruntime"].startswith("onnxruntime provider 'CANNExecutionProvider' is not in this onnxruntime build")
    assert "CPUExecutionProvider" in runs["onnxruntime"]


def test_failure_9_the_npu_cpu_fallback_switch_is_set_and_recorded(runs):
    assert runs["fallback_switch"] == "1" and runs["benchmark"]["switches"]["npu_fallback_cpu_disable"] == "1"


def test_failure_11_peak_memory_is_per_backend_and_batch_reads_its_own(runs):
    bench = runs["benchmark"]
    assert set(bench["peaks"]) == {"peak_mem_mb", "eager/peak_mem_mb", "compile/peak_mem_mb", "graphs/peak_mem_mb"}
    assert bench["peak_source"] == "npu:1 allocator (max_memory_allocated since its reset), per backend"
    assert runs["batch"]["status"] == "passed" and runs["batch"]["peak_mb"] < 64  # not the 64 MiB freed before it
    assert runs["batch"]["source"].startswith("npu:1 allocator")


def test_failure_13_the_npu_switches_are_in_result_json(runs):
    switches = runs["benchmark"]["switches"]
    assert switches["npu_jit_compile"] == "false" and switches["visible_npu"] == "unset"
    assert runs["benchmark"]["emulated"] is True


def test_the_emulated_card_refuses_and_records_what_a_card_does(huggy_exp_cache):
    done = emulated(["tests/emulated_npu_probe.py"], huggy_exp_cache, timeout=120, **{PERTURB: "0:0.001"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["count"] == 2 and got["emulated"] is True and "emulated" in got["name"]
    assert "float64 is not supported" in got["fp64"]
    assert "npu:0 and npu:1" in got["two_cards"] and "npu:0 and cpu" in got["host_and_card"]
    assert got["scalar_ok"] == [2.0, 2.0]  # a CPU scalar beside a card tensor is allowed, as on a card
    # the current card is per thread, as torch_npu's: a thread that never called set_device has no context for card 1
    assert "never called torch.npu.set_device" in got["no_context"]
    assert got["threads"]["main"] == 1 and got["threads"]["new_thread"] == [0, 0]
    assert "never called torch.npu.set_device" in got["threads"]["without_set_device"]
    assert got["threads"]["with_set_device"] == ""
    # a capture records the ops of its current card on a side stream, computes nothing until replayed, then replays
    # them on new values ...
    assert got["graph"] == {"card": 1, "default_stream": False, "ops": 2, "unreplayed_is_nan": True, "replayed": 19.0}
    # ... and, as torch_npu's `graph`, keeps the capture stream of the first capture for the process: a later capture
    # of card 0's ops without `stream=` records nothing and replays stale values; with a card-0 stream it records them
    assert got["graph_wrong_card"] == {"default": {"card": 1, "ops": 0, "replayed": 2.0},
                                       "own_stream": {"card": 0, "ops": 1, "replayed": 4.0}}
    assert got["memory"] == {"peak": 2**20, "held_by_view": 2**20, "after": 0, "card0_peak_unchanged": True}
    assert got["hf32"] == {"exact": 2.0 + 2.0**-11 + 2.0**-9, "hf32": 2.0 + 2.0**-9}  # 10 mantissa bits, ties to even
    assert got["lstm_max_abs"] < 1e-6  # nn.LSTM on the card runs the device-only _thnn_fused_lstm_cell
    assert got["event_ms"] > 0
    card0, card1 = got["perturbed"]  # the switch: card 0's matmuls scaled by exactly (1 + 0.001), card 1 untouched
    assert card0 == pytest.approx(1e-3, rel=1e-3) and card1 == 0.0


def test_a_sweep_on_two_cards_names_the_card_that_differs_by_one_ulp_and_says_emulated(tmp_path, huggy_exp_cache):
    """cpu, npu:0 and a perturbed npu:1 (about one ulp, inside every limit): npu:0 gives the CPU's bytes, npu:1 fails
    the sweep by name; MLflow and result.json say which points ran on the emulated device."""
    done, folder = sweep(tmp_path, huggy_exp_cache, "device=cpu,npu:0,npu:1", "dtype=fp32", "mode=precision", **{PERTURB: "1"})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    points = records(folder)
    assert {d: (r["status"], r["emulated"]) for d, r in points.items()} == {
        "cpu": ("passed", False), "npu:0": ("passed", True), "npu:1": ("passed", True)}
    summary = json.loads((folder / "summary.json").read_text())
    classes = {p["device"]: p["class"] for p in summary["comparison"]["agreement"][0]["points"]}
    assert classes == {"cpu": 0, "npu:0": 0, "npu:1": 1}
    assert "FAILED: npu:1 (job 2) differs bit for bit from cpu (job 0)" not in done.stdout  # cards are judged by cards
    assert "FAILED: npu:1 (job 2) differs bit for bit from npu:0 (job 1)" in done.stdout
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id])
    tags = {r.data.tags["device"]: r.data.tags.get("emulated") for r in runs if "device" in r.data.tags}
    assert tags == {"cpu": None, "npu:0": "true", "npu:1": "true"}


@pytest.mark.slow
def test_the_full_precision_sweep_on_two_emulated_cards(tmp_path, huggy_exp_cache):
    """The issue's sweep: three devices by three dtypes, every point passing, every dtype's cards bit-identical."""
    done, folder = sweep(tmp_path, huggy_exp_cache, "device=cpu,npu:0,npu:1", "dtype=fp32,fp16,bf16", "mode=precision")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for dtype in ("fp32", "fp16", "bf16"):
        assert f"agreement precision {dtype} " in done.stdout
    assert done.stdout.count(": bit-identical") == 3
    perturbed, _ = sweep(tmp_path / "perturbed", huggy_exp_cache, "device=cpu,npu:0,npu:1", "dtype=fp32,fp16,bf16",
                         "mode=precision", **{PERTURB: "1:0.01"})
    assert perturbed.returncode == 1
    for dtype, job in (("fp32", 6), ("fp16", 7), ("bf16", 8)):
        assert f"FAILED: npu:1 (job {job}) differs bit for bit from npu:0 (job {job - 3})" in perturbed.stdout, dtype


def test_cards_of_one_kind_must_agree_and_the_odd_one_is_named():
    from huggy_exp.compare import cards_disagree

    point = lambda job, device, cls, batch=64: {"job": job, "device": device, "class": cls, "batch_size": batch}  # noqa: E731
    assert cards_disagree([point(0, "cpu", 0), point(1, "npu:0", 1), point(2, "npu:1", 1)]) is None  # a CPU may differ
    assert cards_disagree([point(0, "npu:0", 0), point(1, "npu:0", 1)]) is None  # repeats on one card: not two cards
    assert cards_disagree([point(0, "npu:0", 0), point(1, "npu:1", 1, batch=8)]) is None  # other batch sizes
    two = cards_disagree([point(0, "npu:0", 0), point(1, "npu:1", 1)])
    assert two == "npu:1 (job 1) differs bit for bit from npu:0 (job 0)"  # a tie: the first point's bytes stand
    witnessed = cards_disagree([point(0, "cpu", 0), point(1, "npu:0", 1), point(2, "npu:1", 0)])
    assert witnessed == "npu:0 (job 1) differs bit for bit from npu:1 (job 2)"  # the CPU sides with npu:1


# --- the other modes on the card (tests/emulated_npu_runs.py: npu:1, small settings, each job's result.json)


def test_fingerprint_on_the_card_gives_the_cpus_bytes_and_says_emulated(runs):
    fp = runs["modes"]["fingerprint"]
    assert (fp["status"], fp["emulated"]) == ("passed", True)
    assert fp["tags"]["fingerprint"] == fp["tags"]["cpu_fp32_fingerprint"]  # 16 steps, exact bytes equal CPU fp32's
    assert fp["metrics"]["matches_cpu_fp32"] == 1.0 and fp["metrics"]["first_divergence_step"] == -1.0
    assert 0.0 < fp["metrics"]["max_abs_vs_fp64"] < 1e-5


def test_onnx_compare_on_the_card_holds_torch_on_the_card_to_onnxruntime(runs):
    oc = runs["modes"]["onnx-compare"]
    assert (oc["status"], oc["emulated"]) == ("passed", True), oc["reason"]
    assert 0.0 < oc["metrics"]["max_abs_vs_ort"] <= 1e-5  # two engines: close, not the same bytes
    assert oc["metrics"]["max_abs_vs_fp32"] == 0.0  # the card's torch outputs are the CPU fp32's


def test_stats_on_the_card_rolls_out_without_drift_from_the_cpu(runs):
    st = runs["modes"]["stats"]
    assert (st["status"], st["emulated"]) == ("passed", True), st["reason"]
    assert (st["metrics"]["steps"], st["metrics"]["envs"]) == (16.0, 4.0)
    assert st["metrics"]["drift_max"] == 0.0 and st["metrics"]["drift_first_step"] == -1.0  # closed loop, bit for bit
    assert st["metrics"]["action_std"] > 0.0


def test_replay_against_a_recording_fails_on_the_perturbed_card_only(runs):
    """Both cards recorded unperturbed, then card 1 perturbed by about one ulp: its replay fails by the bitwise rule of
    an unchanged point (the difference is inside fp32's tolerance), card 0's replay passes bit for bit."""
    modes = runs["modes"]
    assert modes["record npu:0"] == modes["record npu:1"] == {"status": "passed", "emulated": True}
    same, moved = modes["replay npu:0"], modes["replay npu:1"]
    assert (same["status"], same["bitwise_share"], same["max_abs"], same["emulated"]) == ("passed", 1.0, 0.0, True)
    assert moved["status"] == "failed" and moved["emulated"] is True
    assert moved["reason"].startswith("actions is not bitwise identical to the recording npu:1/fp32/eager/b4")
    assert moved["bitwise_share"] < 0.5 and 0.0 < moved["max_abs"] < 1e-5


def test_the_control_loop_runs_on_the_card(runs):
    loop = runs["benchmark"]["loop"]  # on npu:1's graphs backend: 0.2 s at 100 Hz, 4 agents a tick, then the search
    assert (loop["ticks"], loop["rate_hz"], loop["agents"]) == (20.0, 100.0, 4.0)
    assert loop["compute_p50_us"] > 0 and loop["p50_us"] >= loop["compute_p50_us"] and "max_rate_hz" in loop
