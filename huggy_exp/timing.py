"""The measurement policy in one place: warm-up, device synchronisation, repeated wall-clock samples."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from huggy_exp.placement import synchronize


def measure(fn: Callable[[], object], device: torch.device, repeats: int = 5, warmup: int = 1) -> dict[str, float]:
    """Median and IQR of `repeats` synchronised calls after `warmup` untimed ones (seconds)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - start)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    return {"median_s": float(median), "iqr_s": float(q3 - q1), "min_s": float(min(samples)), "repeats": len(samples)}
