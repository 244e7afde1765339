"""The measurement policy in one place: fixed threads, warm-up until stable, device sync, per-call samples, percentiles.

It follows torch.utils.benchmark (warm-up, fixed thread count, synchronise, median and IQR, `noisy` when IQR / median
> 0.1, its Measurement warning's threshold) and MLPerf LoadGen's single-stream / offline reporting (per-query latency
percentiles; offline throughput = samples / total time). Call sites pass only the callable."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from huggy_exp.placement import synchronize

NOISY_IQR = 0.1  # torch.utils.benchmark's Measurement warns above this IQR / median
PERCENTILES = (50, 90, 95, 99)
QUICK = {"warmup_s": 0.02, "budget_s": 0.06, "max_samples": 100, "min_warmup": 1}  # inference modes: a bounded side measurement


@contextlib.contextmanager
def threads(count: int | None) -> Iterator[int]:
    """Run the block with `count` intra-op threads (None: leave as is); yields the count in force."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(int(count))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


@dataclass
class Timing:
    """Wall-clock samples of one synchronised call each (seconds) and how they were taken."""

    samples: list[float] = field(default_factory=list)
    rows: int = 1
    threads: int = 1
    warmup_calls: int = 0

    def extend(self, other: "Timing") -> None:
        self.samples += other.samples
        self.warmup_calls += other.warmup_calls

    def stats(self) -> dict[str, float]:
        """p50/p90/p95/p99/mean/min/max/IQR in µs, obs/s (rows x calls / total time: report.OBS_PER_S), noisy."""
        if not self.samples:
            return {}
        us = np.asarray(self.samples, np.float64) * 1e6
        out = {f"p{p}_us": float(v) for p, v in zip(PERCENTILES, np.percentile(us, PERCENTILES))}
        q1, q3 = np.percentile(us, [25, 75])
        iqr, median = float(q3 - q1), out["p50_us"]
        return {**out, "mean_us": float(us.mean()), "min_us": float(us.min()), "max_us": float(us.max()), "iqr_us": iqr,
                "obs_per_s": float(self.rows * len(us) / (us.sum() / 1e6)),
                "noisy": float(median <= 0 or iqr / median > NOISY_IQR), "samples": float(len(us)),
                "threads": float(self.threads)}


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    if device.type != "cpu":  # the CPU has no queue; skipping the call keeps the harness's own cost out of µs figures
        synchronize(device)
    return time.perf_counter() - start


def warm_up(fn: Callable[[], object], device: torch.device, budget_s: float, min_calls: int = 2, block: int = 5) -> int:
    """Call until the median of a block of calls is within 5% of the previous block's, or the budget is spent."""
    calls, previous, deadline = 0, None, time.perf_counter() + budget_s
    while True:
        times = []
        for _ in range(block):
            times.append(_timed(fn, device))
            calls += 1
            if calls >= min_calls and time.perf_counter() > deadline:
                return calls
        median = float(np.median(times))
        if previous is not None and abs(median - previous) <= 0.05 * previous and calls >= min_calls:
            return calls
        previous = median


def measure(fn: Callable[[], object], device: torch.device, rows: int = 1, budget_s: float = 1.0,
            warmup_s: float = 0.5, max_samples: int = 10_000, min_samples: int = 1, min_warmup: int = 2) -> Timing:
    """Warm up (at least `min_warmup` calls, 0 for none), then time synchronised calls until the budget or max_samples.
    The thread count in force is recorded; set it with `threads()` around the call (compiled code is built per thread
    count, so warm-up must run under the same count as the timing)."""
    synchronize(device)
    warmups = warm_up(fn, device, warmup_s, min_warmup) if min_warmup else 0
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_samples and (len(samples) < min_samples or time.perf_counter() < deadline):
        samples.append(_timed(fn, device))
    return Timing(samples, rows, torch.get_num_threads(), warmups)


def quick(fn: Callable[[], object], device: torch.device, rows: int, thread_count: int | None = 1) -> Timing:
    """The short, bounded measurement every inference mode logs (≤ 0.1 s and 100 calls, one call at least)."""
    with threads(thread_count):
        return measure(fn, device, rows, **QUICK)


def highest_rate(probe: Callable[[float], bool], start: float, steps: int, lo: float, hi: float) -> tuple[float, list[float]]:
    """The highest rate at which `probe(rate)` holds, in at most `steps` probes: double (or halve) from `start` until the
    verdict changes, then bisect geometrically (rates scale by factors); stops within 5%. 0.0 when no probe held."""
    tried: list[float] = []
    good, bad, rate = 0.0, math.inf, min(max(float(start), lo), hi)
    for _ in range(max(int(steps), 0)):
        tried.append(rate)
        if probe(rate):
            good = max(good, rate)
        else:
            bad = min(bad, rate)
        if math.isinf(bad):
            rate = min(rate * 2, hi)
        elif good == 0.0:
            rate = max(rate / 2, lo)
        else:
            rate = math.sqrt(good * bad)
        if rate in tried or (good and bad / good < 1.05):
            break
    return good, tried
