"""One small class per mode: __init__(knobs from conf/mode/<name>.yaml) and run(ctx) -> Result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np
import torch

from huggy_exp import timing
from huggy_exp.context import Context
from huggy_exp.results import Result
from huggy_exp.runners import OBS, Runner

LATENCY_KEYS = ("p50_us", "p99_us", "mean_us", "obs_per_s")
SLOW_FP16 = "fp16 on a CPU without fp16 matmul kernels is far slower than fp32 (emulated): its timing is capped and bounded"


class Task(Protocol):
    name: str

    def run(self, ctx: Context) -> Result: ...


def runner_device(runner: Runner) -> torch.device:
    """Where a runner's work is queued (onnxruntime's run() returns when done: nothing to synchronise)."""
    target = getattr(runner, "target", None)
    return target.device if target is not None else torch.device("cpu")


def is_sequence(feeds: Mapping[str, np.ndarray]) -> bool:
    """Feeds of [T, N, d] arrays: a sequence run step by step with the memory carried."""
    return feeds[OBS].ndim == 3


def first_step(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Step 0 of a sequence (every input); single-step feeds as they are."""
    return {k: v[0] for k, v in feeds.items()} if is_sequence(feeds) else dict(feeds)


def batch_of(feeds: np.ndarray | Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Feeds of exactly `rows` rows: every input (a bare array is obs_0) cycled or cut; of a [T, N, d] sequence, step 0."""
    if isinstance(feeds, np.ndarray):
        return {OBS: np.ascontiguousarray(np.resize(feeds, (rows, feeds.shape[1])), np.float32)}
    return {k: np.ascontiguousarray(np.resize(v, (rows, *v.shape[1:])), np.float32) for k, v in first_step(feeds).items()}


def latency(runner: Runner, ctx: Context, feeds: np.ndarray | Mapping[str, np.ndarray], result: Result) -> None:
    """Add latency.p50_us/p99_us/mean_us/obs_per_s of the runner at the job's batch size (bounded: ≤ 0.1 s).

    Every input of the policy (obs_0.. and masks) at that batch size; a sequence is timed as its first step."""
    feeds = batch_of(feeds, ctx.batch_size)
    t = timing.quick(lambda: runner.infer(feeds), runner_device(runner), ctx.batch_size, ctx.threads)
    stats = t.stats()
    result.metrics.update({f"latency.{k}": stats[k] for k in (*LATENCY_KEYS, "noisy", "samples", "threads")})
    line = (f"latency ({getattr(runner, 'name', ctx.backend)}, batch {ctx.batch_size}, {t.threads} thread(s)): "
            f"p50 {stats['p50_us']:,.1f} µs, p99 {stats['p99_us']:,.1f} µs, {stats['obs_per_s']:,.0f} obs/s")
    result.summary.append(line + (" (noisy)" if stats["noisy"] else ""))
    headline = result.details.get("headline") or (result.summary[0] if result.summary else "")
    result.details["headline"] = f"{headline}; latency p50 {stats['p50_us']:,.0f} µs" if headline else line
    if ctx.dtype == "fp16" and runner_device(runner).type == "cpu":
        result.summary.append(SLOW_FP16)
        result.details["latency_note"] = SLOW_FP16
