"""Energy per action (huggy_exp/energy.py) on emulated counters that integrate a known power: a cumulative counter,
one that wraps, a power reading integrated over the window (Ascend's kind), a reader that fails mid-window; and the
reason a point gives where no counter exists (this machine's CPU)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from huggy_exp import energy
from huggy_exp.energy import Meter, NotMeasured

IDLE_W, BUSY_W = 40.0, 250.0  # a card's idle draw, and its draw while it computes
ROWS, CALL_S = 8, 0.002


class Card:
    """An emulated device: its power is BUSY_W while a call runs, IDLE_W otherwise; `joules()` is the exact integral."""

    def __init__(self):
        self.lock = threading.Lock()
        self.busy, self.since, self.total = False, time.perf_counter(), 0.0
        self.busy_s = 0.0

    def _advance(self) -> float:
        now = time.perf_counter()
        self.total += (BUSY_W if self.busy else IDLE_W) * (now - self.since)
        self.since = now
        return now

    def joules(self) -> float:
        with self.lock:
            self._advance()
            return self.total

    def watts(self) -> float:
        with self.lock:
            return BUSY_W if self.busy else IDLE_W

    def step(self) -> None:
        """One call: the card draws BUSY_W for CALL_S (the host waits on it, as a synchronised call does)."""
        with self.lock:
            started = self._advance()
            self.busy = True
        time.sleep(CALL_S)
        with self.lock:
            self.busy_s += self._advance() - started
            self.busy = False


def known_j_per_action(card: Card, result: dict) -> float:
    """What the card really spent above idle per action: (BUSY_W - IDLE_W) x its busy seconds / actions."""
    return (BUSY_W - IDLE_W) * card.busy_s / result["actions"]


def test_a_counter_gives_the_known_joules_per_action_above_idle():
    card = Card()
    result = energy.per_action(card.step, ROWS, Meter("emulated counter", "energy", card.joules), window_s=0.5,
                               idle_s=0.2, period_s=0.01)
    assert result["j_per_action"] == pytest.approx(known_j_per_action(card, result), rel=0.02)
    assert result["idle_w"] == pytest.approx(IDLE_W, rel=0.02)
    assert result["window_s"] >= 0.5 and result["source"] == "emulated counter"


def test_a_counter_that_wraps_is_corrected_between_reads():
    card, wrap = Card(), 20.0  # RAPL wraps at max_energy_range_uj; here every 80 ms at 250 W: a 5 ms poll sees each wrap
    wrapped = Meter("wrapping counter", "energy", lambda: card.joules() % wrap, wrap_j=wrap)
    result = energy.per_action(card.step, ROWS, wrapped, window_s=0.6, idle_s=0.3, period_s=0.005)
    assert result["j_per_action"] == pytest.approx(known_j_per_action(card, result), rel=0.02)


def test_a_counter_that_goes_back_without_a_known_wrap_is_not_measured():
    card, wrap = Card(), 5.0
    with pytest.raises(NotMeasured, match="went back"):
        energy.per_action(card.step, ROWS, Meter("bad counter", "energy", lambda: card.joules() % wrap), window_s=0.2,
                          idle_s=0.2, period_s=0.005)


def test_a_power_reading_is_integrated_over_the_window():
    card = Card()  # Ascend exposes power, not energy: npu-smi's watts, integrated between reads
    result = energy.per_action(card.step, ROWS, Meter("emulated npu-smi", "power", card.watts), window_s=1.0,
                               idle_s=0.3, period_s=0.005)
    assert result["idle_w"] == pytest.approx(IDLE_W, rel=0.02)
    assert result["j_per_action"] == pytest.approx(known_j_per_action(card, result), rel=0.02)


def test_a_reader_that_fails_mid_window_gives_the_reason_never_a_figure():
    card, reads = Card(), []

    def flaky() -> float:
        reads.append(1)
        if len(reads) > 30:
            raise OSError("device lost")
        return card.joules()

    with pytest.raises(NotMeasured, match="failed mid-window: OSError: device lost"):
        energy.per_action(card.step, ROWS, Meter("flaky", "energy", flaky), window_s=0.5, idle_s=0.1, period_s=0.01)


def test_rapl_is_read_where_it_is_readable_and_said_where_it_is_not(tmp_path, monkeypatch):
    monkeypatch.setattr(energy, "RAPL", tmp_path / "absent")
    with pytest.raises(NotMeasured, match="no CPU RAPL counter here"):
        energy.meter_for(torch.device("cpu"))
    domain = tmp_path / "powercap" / "intel-rapl:0"
    domain.mkdir(parents=True)
    (domain / "energy_uj").write_text("262143000000\n")
    (domain / "max_energy_range_uj").write_text("262143328850\n")
    monkeypatch.setattr(energy, "RAPL", tmp_path / "powercap")
    meter = energy.meter_for(torch.device("cpu"))
    assert meter.kind == "energy" and meter.wrap_j == pytest.approx(262143.32885) and meter.read() == 262143.0
    (domain / "energy_uj").write_text("not a number\n")
    with pytest.raises(NotMeasured, match="not readable"):
        energy.meter_for(torch.device("cpu"))


def test_npu_smi_power_lines_of_either_release_are_read():
    old = "NPU ID : 0\nPower Dissipation(W)           : 70.3\n"
    new = "NPU Real-time Power(W)         : 95.1\n"
    assert [float(energy.NPU_SMI_POWER.search(t).group(1)) for t in (old, new)] == [70.3, 95.1]


def test_devices_without_a_known_source_say_why(monkeypatch):
    monkeypatch.setattr(energy.shutil, "which", lambda name: None)
    with pytest.raises(NotMeasured, match="npu-smi is not on PATH"):
        energy.meter_for(SimpleNamespace(type="npu", index=1))  # torch names npu only once torch_npu (or the emulator) renamed PrivateUse1
    with pytest.raises(NotMeasured, match="no energy counter is known for mps"):
        energy.meter_for(torch.device("mps"))


def test_a_benchmark_point_on_this_cpu_says_why_energy_is_not_measured(tmp_path, monkeypatch):
    from conftest import run_job

    monkeypatch.setattr(energy, "RAPL", tmp_path / "no-powercap")  # this machine's CPU, whatever host runs the suite
    job = run_job(tmp_path / "job", "benchmark", "mode.backends=[eager]", "mode.scenarios=[]", "mode.budget_s=0.05",
                  "mode.warmup_s=0.01", "mode.rounds=1")
    assert job.record["details"]["energy"].startswith("not measured: no CPU RAPL counter here")
    assert any(line.startswith("energy: not measured: no CPU RAPL counter") for line in job.result.summary)
    assert not any(k.endswith("j_per_action") for k in job.record["metrics"])  # never a zero


def test_a_benchmark_point_on_an_emulated_counter_reports_joules_per_action(tmp_path, monkeypatch):
    from conftest import run_job

    card, measured = Card(), energy.per_action
    monkeypatch.setattr(energy, "meter_for", lambda device: Meter("emulated counter", "energy", card.joules))
    # the schema holds the window to >= 5 s; the emulated counter is exact, so the suite shortens it to 0.3 s
    monkeypatch.setattr(energy, "per_action", lambda step, rows, meter, window_s, idle_s, **kw:
                        measured(step, rows, meter, 0.3, 0.1, **kw))
    job = run_job(tmp_path / "job", "benchmark", "mode.backends=[eager]", "mode.scenarios=[]", "mode.budget_s=0.05",
                  "mode.warmup_s=0.01", "mode.rounds=1", "batch_size=4")
    info = job.record["details"]["backends"]["eager"]["energy"]
    assert info["source"] == "emulated counter" and info["actions"] > 0 and info["idle_w"] == pytest.approx(IDLE_W, rel=0.02)
    assert job.record["metrics"]["eager/b4/j_per_action"] == info["j_per_action"]
    assert job.record["details"]["energy"] == "measured: emulated counter"
