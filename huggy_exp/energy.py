"""Energy per action above the idle draw (docs/hardware/energy.md): at least 5 s of steady inference (counters update
every ~100 ms; H100-class power sensors sample part of the time), minus the idle power just before, per action; what
ais_bench reports on Ascend. Sources: a counter (NVML, AMD SMI through Zeus; CPU RAPL, wrap-corrected) or a power
reading integrated over the window (Ascend's npu-smi: power, not energy). Where none can be read, the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RAPL = Path("/sys/class/powercap")
NPU_SMI_POWER = re.compile(r"power[^:\n]*\(W\)\s*:\s*([0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)  # "NPU Real-time Power(W) : 71.2"


class NotMeasured(Exception):
    """Energy cannot be measured here, or a reading failed mid-window: the message is the reason shown to users."""


@dataclass
class Meter:
    """`read()`: joules since some origin (`kind` "energy", wrapping to 0 at `wrap_j`) or watts now ("power")."""

    name: str
    kind: str
    read: Callable[[], float]
    wrap_j: float | None = None


def meter_for(device) -> Meter:
    kind, index = device.type, device.index or 0
    if kind == "cuda":
        return _zeus_gpu(index)
    if kind == "npu":
        return _npu_smi(index)
    if kind == "cpu":
        return _rapl()
    raise NotMeasured(f"no energy counter is known for {kind} devices")


def _zeus_gpu(index: int) -> Meter:
    try:
        from zeus.device.gpu import get_gpus
    except ImportError:
        raise NotMeasured("zeus is not installed (pip install 'huggy-exp[energy]'): it reads NVML's and AMD SMI's "
                          "energy counters") from None
    try:
        gpus = get_gpus()
        if not gpus.supportsGetTotalEnergyConsumption(index):
            raise NotMeasured(f"GPU {index} has no total-energy counter (NVML: Volta or newer)")
    except NotMeasured:
        raise
    except Exception as exc:
        raise NotMeasured(f"zeus could not open GPU {index}: {type(exc).__name__}: {exc}") from None
    return Meter(f"zeus: {type(gpus).__name__} total energy, GPU {index}", "energy",
                 lambda: gpus.getTotalEnergyConsumption(index) / 1e3)  # mJ


def _npu_smi(index: int) -> Meter:
    if shutil.which("npu-smi") is None:
        raise NotMeasured("npu-smi is not on PATH (Ascend's driver tools): it reads the card's power")
    command = ["npu-smi", "info", "-t", "power", "-i", str(index)]

    def read() -> float:
        out = subprocess.run(command, capture_output=True, text=True, timeout=5, check=True).stdout
        found = NPU_SMI_POWER.search(out)
        if found is None:
            raise NotMeasured(f"`{' '.join(command)}` printed no power in W: {out.strip()[:120]!r}")
        return float(found.group(1))

    read()  # a card npu-smi does not answer for is said before the window, not in it
    return Meter(f"npu-smi power, NPU {index}", "power", read)


def _rapl() -> Meter:
    """The first package domain of CPU RAPL (intel-rapl:0; AMD's kernels expose theirs under the same name)."""
    domain = RAPL / "intel-rapl:0"
    energy = domain / "energy_uj"
    if not energy.exists():
        raise NotMeasured(f"no CPU RAPL counter here ({energy} absent: a virtual machine or a kernel without powercap)")
    try:
        wrap = int((domain / "max_energy_range_uj").read_text()) / 1e6
        int(energy.read_text())
    except (OSError, ValueError) as exc:
        raise NotMeasured(f"{energy} is not readable ({type(exc).__name__}; root-only on current kernels)") from None
    return Meter(f"RAPL {domain.name} package", "energy", lambda: int(energy.read_text()) / 1e6, wrap)


class Window:
    """Joules over a window: `meter` read every `period_s` in a thread (catching a counter's wraps, integrating power
    by the trapezoid rule); a failed reading ends it as NotMeasured."""

    def __init__(self, meter: Meter, period_s: float):
        self.meter, self.period_s = meter, period_s
        self.joules, self.error = 0.0, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> "Window":
        self._last = (time.perf_counter(), self.meter.read())
        self.started = self._last[0]
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is None:
            self._add()  # the reading at the window's end
        self.seconds = self._last[0] - self.started

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            self._add()
            if self.error is not None:
                return

    def _add(self) -> None:
        try:
            now, value = time.perf_counter(), self.meter.read()
        except Exception as exc:
            self.error = f"{self.meter.name}: reading failed mid-window: {type(exc).__name__}: {exc}"
            return
        then, before = self._last
        if self.meter.kind == "power":
            self.joules += (before + value) / 2 * (now - then)
        else:
            delta = value - before
            if delta < 0:
                if not self.meter.wrap_j:
                    self.error = f"{self.meter.name}: the counter went back by {-delta:.3g} J and has no known wrap"
                    return
                delta += self.meter.wrap_j
            self.joules += delta
        self._last = (now, value)

    def result(self) -> float:
        if self.error is not None:
            raise NotMeasured(self.error)
        return self.joules


def per_action(step: Callable[[], object], rows: int, meter: Meter, window_s: float, idle_s: float,
               period_s: float = 0.1, sync: Callable[[], object] = lambda: None) -> dict[str, float | str]:
    """Joules per action of `step` (`rows` actions a call): (joules over >= `window_s` of calls - the idle power over
    `idle_s` just before x their seconds) / actions. NotMeasured with the reason."""
    sync()
    with Window(meter, period_s) as idle:
        time.sleep(idle_s)
    idle_w = idle.result() / idle.seconds
    calls, deadline = 0, time.perf_counter() + window_s
    with Window(meter, period_s) as busy:
        while calls == 0 or time.perf_counter() < deadline:
            step()
            calls += 1
        sync()
    joules, actions = busy.result(), calls * rows
    return {"j_per_action": (joules - idle_w * busy.seconds) / actions, "j_per_action_total": joules / actions,
            "idle_w": idle_w, "busy_w": joules / busy.seconds, "window_s": busy.seconds, "actions": float(actions),
            "source": meter.name}
