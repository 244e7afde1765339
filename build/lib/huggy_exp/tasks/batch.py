"""`batch`: batched inference and batch invariance. Described in docs/modes.md#batch."""

from __future__ import annotations

import numpy as np

from huggy_exp.context import Context
from huggy_exp.mlagents import RECURRENT_OUT
from huggy_exp.placement import memory_stats
from huggy_exp.results import Result
from huggy_exp import timing
from huggy_exp.runners import ACTIONS, DISCRETE, build, run_feeds
from huggy_exp.tasks import latency, runner_device, verify_point

FLIP_FAILS_UP_TO = 1e-5  # discrete flips fail where the dtype's tolerance is this tight (fp32, fp64); else reported


class BatchTask:
    name = "batch"

    def __init__(self, tolerance: dict[str, float] | None = None, budget_s: float = 0.3):
        self.tolerance = dict(tolerance or {"fp64": 1e-12, "fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2})
        self.budget_s = float(budget_s)

    def run(self, ctx: Context) -> Result:
        target, feeds = ctx.target(), ctx.feeds
        batched, single = build(ctx), build(ctx, batch_size=1)
        out_batched, out_single = run_feeds(batched, feeds), run_feeds(single, feeds)
        lead = feeds["obs_0"].ndim - 1  # [N] or [T, N]
        floats = [k for k in (ACTIONS, RECURRENT_OUT) if k in out_batched]  # deterministic outputs (not the graph's sampled ones)
        diffs = [np.abs(out_batched[k].astype(np.float64) - out_single[k].astype(np.float64)).reshape(*out_batched[k].shape[:lead], -1)
                 for k in floats]
        row_max = np.max(np.concatenate(diffs, axis=-1), axis=-1).reshape(-1) if diffs else np.zeros(0)
        rows = int(np.prod(feeds["obs_0"].shape[:lead]))
        tol = self.tolerance.get(ctx.dtype, 0.0)
        # --- throughput of the same runners, through the one measurement policy (fixed threads, warm-up until stable)
        with timing.threads(ctx.threads):
            t_batched = timing.measure(lambda: run_feeds(batched, feeds), runner_device(batched), rows, self.budget_s, self.budget_s / 2)
            t_single = timing.measure(lambda: run_feeds(single, feeds), runner_device(single), rows, self.budget_s, self.budget_s / 2)
        metrics = {
            "rows": float(rows),
            "batch_invariance_max_abs": float(row_max.max()) if row_max.size else 0.0,
            "rows_bit_identical": float(np.mean(row_max == 0.0)) if row_max.size else 1.0,
            "worst_row": float(np.argmax(row_max)) if row_max.size else 0.0,
            "batched_rows_per_s": rows / (t_batched.stats()["p50_us"] / 1e6),
            "single_rows_per_s": rows / (t_single.stats()["p50_us"] / 1e6),
            **{f"device.{k}": v for k, v in memory_stats(target.device).items()},
        }
        flips = 0
        if DISCRETE in out_batched:
            flips = int(np.sum(out_batched[DISCRETE] != out_single[DISCRETE]))
            metrics["discrete_mismatches"] = float(flips)
            metrics["discrete_agreement"] = float(np.mean(out_batched[DISCRETE] == out_single[DISCRETE]))
        arrays = {"actions": out_batched[ACTIONS].astype(np.float32)} if ACTIONS in out_batched else {}
        if DISCRETE in out_batched:
            arrays["discrete_actions"] = out_batched[DISCRETE]
        result = Result(metrics=metrics, arrays=arrays,
                        tables={"batch_invariance": [{"row": i, "max_abs_diff": float(d)} for i, d in enumerate(row_max)]})
        headline = (f"max |batched - single-row| {metrics['batch_invariance_max_abs']:.3g} (tolerance {tol:g}), "
                    f"{metrics['rows_bit_identical']:.0%} rows bit-identical")
        if DISCRETE in out_batched:
            headline += f", {flips} discrete action{'s' * (flips != 1)} differ"
        result.summary = [
            f"{rows} rows in chunks of {ctx.batch_size}: max |batched - single-row| = {metrics['batch_invariance_max_abs']:.3g} "
            f"(tolerance {tol:g} for {ctx.dtype}); {metrics['rows_bit_identical']:.0%} rows bit-identical"
            + (f"; discrete actions {metrics['discrete_agreement']:.2%} equal" if DISCRETE in out_batched else ""),
            f"throughput: {metrics['batched_rows_per_s']:,.0f} rows/s batched vs {metrics['single_rows_per_s']:,.0f} rows/s one by one",
        ]
        result.details["invariance"] = headline
        latency(batched, ctx, feeds, result)
        verify_point(ctx, result, batched, feeds, out_batched)
        result.headline += f"; {headline}"
        if metrics["batch_invariance_max_abs"] > tol:
            result.fail(f"batch invariance: max diff {metrics['batch_invariance_max_abs']:.3g} > {tol:g} at row {int(metrics['worst_row'])}")
        if flips and tol <= FLIP_FAILS_UP_TO:
            result.fail(f"batch invariance: {flips} discrete actions differ between batched and single-row inference in {ctx.dtype}")
        return result
