"""`control_loop`: the policy as a robot or a game calls it, at a fixed rate, the next observation depending on the last
action, and an action that comes late is a missed deadline.

Tick k is scheduled at t0 + k / rate. At its time the surrogate world (huggy_exp/dynamics.py, the dynamics of `stats`)
is read, the policy runs (packing the observation into its inputs, host -> device, forward, device -> host, the
action vector back out), and the world steps with that action. The tick's latency runs from its scheduled time to the
action in hand, so a late wake-up or a previous overrun counts, as it does for the robot; it misses when the latency
exceeds the period (the next tick is due). A tick whose deadline has passed before it could start is skipped and
counted as missed; the world then steps with the last action held (an actuator keeps its last command), so an
overloaded loop ends on time instead of falling ever further behind. An LSTM's memory is carried from tick to tick
(from zeros); discrete branches act as one-hots, hybrid policies as both (rollout.action_vector).

The miss rate comes with a one-sided Clopper-Pearson (exact binomial) upper bound at `confidence`. The sustainable
rate is the highest whose observed miss rate stays at or under `max_miss_rate`."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import numpy as np

from huggy_exp import timing
from huggy_exp.config import BenchmarkMode
from huggy_exp.dynamics import World

SPIN_S = 2e-4  # sleep until this close to a tick, then spin: time.sleep alone wakes 50-100 µs late
MIN_PROBE_TICKS = 50
MAX_RATE_HZ = 100_000.0  # 10 µs a tick: more than a Python loop around a policy call keeps (the config's bound too)


def miss_upper_bound(misses: int, ticks: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound on the miss probability after `misses` of `ticks`."""
    if misses >= ticks:  # no tick, or every tick missed
        return 1.0
    from scipy.stats import beta

    return float(beta.ppf(confidence, misses + 1, ticks - misses))


def longest_run(flags: np.ndarray) -> int:
    """The longest stretch of consecutive True values."""
    return max((len(list(run)) for flag, run in itertools.groupby(flags) if flag), default=0)


def run(tick: Callable[[np.ndarray], np.ndarray], world: World, rate_hz: float, ticks: int, act_width: int,
        confidence: float) -> dict[str, float]:
    """Run `ticks` ticks at `rate_hz`; the figures of the run (µs, rates as shares)."""
    period = 1.0 / rate_hz
    latency, compute, wake = np.full((3, ticks), np.nan)
    action = np.zeros((world.z.shape[0], act_width), np.float32)
    t0 = time.perf_counter() + period
    for k in range(ticks):
        due = t0 + k * period
        if time.perf_counter() > due + period:  # its deadline passed before it could start: skipped, the action held
            world.step(action)
            continue
        if (left := due - time.perf_counter()) > SPIN_S:
            time.sleep(left - SPIN_S)
        while time.perf_counter() < due:
            pass
        started = time.perf_counter()
        action = tick(world.observe())
        done = time.perf_counter()
        latency[k], compute[k], wake[k] = done - due, done - started, started - due
        world.step(action)
    ran = ~np.isnan(latency)
    late = ~(latency <= period)  # a skipped tick (NaN) is late too
    misses = int(late.sum())
    us = latency[ran] * 1e6
    p50, p99 = (np.percentile(us, [50, 99]) if us.size else (math.nan, math.nan))
    return {"rate_hz": float(rate_hz), "period_us": period * 1e6, "ticks": float(ticks), "misses": float(misses),
            "skipped": float((~ran).sum()), "miss_rate": misses / ticks,
            "miss_rate_upper": miss_upper_bound(misses, ticks, confidence), "confidence": float(confidence),
            "p50_us": float(p50), "p99_us": float(p99), "max_us": float(us.max()) if us.size else math.nan,
            "jitter_us": float(p99 - p50), "late_run_max": float(longest_run(late)),
            "compute_p50_us": float(np.median(compute[ran]) * 1e6) if us.size else math.nan,
            "wake_p99_us": float(np.percentile(wake[ran], 99) * 1e6) if us.size else math.nan}


def measure(make_tick: Callable[[], Callable[[np.ndarray], np.ndarray]], make_world: Callable[[], World],
            act_width: int, loop: BenchmarkMode) -> tuple[dict[str, float], list[dict[str, float]]]:
    """The loop at `loop.rate_hz` for `loop.duration_s`, then the search for the highest sustainable rate; make_tick()
    gives a fresh policy tick (the memory from zeros), make_world() a fresh world (from the same start)."""
    ticks = max(int(round(loop.rate_hz * loop.duration_s)), 1)
    m = run(make_tick(), make_world(), loop.rate_hz, ticks, act_width, loop.confidence)
    m["sustainable"] = float(m["miss_rate"] <= loop.max_miss_rate)
    m["bound_met"] = float(m["miss_rate_upper"] <= loop.max_miss_rate)
    tried: list[dict[str, float]] = []

    def probe(rate: float) -> bool:
        n = max(int(round(rate * loop.loop_search_s)), MIN_PROBE_TICKS)
        p = run(make_tick(), make_world(), rate, n, act_width, loop.confidence)
        tried.append({k: p[k] for k in ("rate_hz", "ticks", "miss_rate", "miss_rate_upper", "p50_us", "p99_us", "late_run_max")})
        return p["miss_rate"] <= loop.max_miss_rate

    if loop.search_steps:
        best, _ = timing.highest_rate(probe, loop.rate_hz, loop.search_steps, lo=1.0, hi=MAX_RATE_HZ)
        m["max_rate_hz"] = best
    return m, tried
