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


def test_the_emulated_card_refuses_and_records_what_a_card_does(huggy_exp_cache):
    done = emulated(["tests/emulated_npu_probe.py"], huggy_exp_cache, timeout=120, **{PERTURB: "0:0.001"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["count"] == 2 and got["emulated"] is True and "emulated" in got["name"]
    assert "float64 is not supported" in got["fp64"]
    assert "npu:0 and npu:1" in got["two_cards"] and "npu:0 and cpu" in got["host_and_card"]
    assert got["scalar_ok"] == [2.0, 2.0]  # a CPU scalar beside a card tensor is allowed, as on a card
    # a capture records the ops of its own card on a side stream and replays them on new values ...
    assert got["graph_same_card"] == {"card": 1, "default_stream": False, "ops": 2, "replayed": 19.0}
    # ... and captures nothing when the current card is another one: the replay returns stale values (failure #7)
    assert got["graph_other_card"] == {"card": 0, "default_stream": False, "ops": 0, "replayed": 7.0}
    assert got["memory"] == {"peak": 2**20, "held_by_view": 2**20, "after": 0, "card0_peak_unchanged": True}
    assert got["threads"] == {"main": 1, "new_thread": 0}  # the current card is per thread, as torch_npu's
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
