"""`batch`: inference in chunks of batch_size, and batch invariance: every row against single-row inference."""

from __future__ import annotations

import numpy as np

from huggy_exp.context import Context
from huggy_exp.placement import memory_stats
from huggy_exp.results import Result
from huggy_exp import timing
from huggy_exp.runners import ACTIONS, build
from huggy_exp.tasks import latency, runner_device


class BatchTask:
    name = "batch"

    def __init__(self, tolerance: dict[str, float] | None = None, budget_s: float = 0.3):
        self.tolerance = dict(tolerance or {"fp64": 1e-12, "fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2})
        self.budget_s = float(budget_s)

    def run(self, ctx: Context) -> Result:
        target, obs = ctx.target(), ctx.observations
        batched, single = build(ctx), build(ctx, batch_size=1)
        a_batched, a_single = batched.infer(obs)[ACTIONS], single.infer(obs)[ACTIONS]
        diff = np.abs(a_batched.astype(np.float64) - a_single.astype(np.float64))
        row_max = diff.max(axis=1)
        tol = self.tolerance.get(ctx.dtype, 0.0)
        # --- throughput of the same runners, through the one measurement policy (fixed threads, warm-up until stable)
        with timing.threads(ctx.threads):
            t_batched = timing.measure(lambda: batched.infer(obs), runner_device(batched), len(obs), self.budget_s, self.budget_s / 2)
            t_single = timing.measure(lambda: single.infer(obs), runner_device(single), len(obs), self.budget_s, self.budget_s / 2)
        metrics = {
            "rows": float(len(obs)),
            "batch_invariance_max_abs": float(diff.max()),
            "rows_bit_identical": float(np.mean(row_max == 0.0)),
            "worst_row": float(np.argmax(row_max)),
            "batched_rows_per_s": len(obs) / (t_batched.stats()["p50_us"] / 1e6),
            "single_rows_per_s": len(obs) / (t_single.stats()["p50_us"] / 1e6),
            **{f"device.{k}": v for k, v in memory_stats(target.device).items()},
        }
        result = Result(metrics=metrics, arrays={"actions": a_batched.astype(np.float32)},
                        tables={"batch_invariance": [{"row": i, "max_abs_diff": float(d)} for i, d in enumerate(row_max)]})
        result.summary = [
            f"{len(obs)} rows in chunks of {ctx.batch_size}: max |batched - single-row| = {metrics['batch_invariance_max_abs']:.3g} "
            f"(tolerance {tol:g} for {ctx.dtype}); {metrics['rows_bit_identical']:.0%} rows bit-identical",
            f"throughput: {metrics['batched_rows_per_s']:,.0f} rows/s batched vs {metrics['single_rows_per_s']:,.0f} rows/s one by one",
        ]
        result.details["headline"] = (f"max |batched - single-row| {metrics['batch_invariance_max_abs']:.3g} (tolerance {tol:g}), "
                                      f"{metrics['rows_bit_identical']:.0%} rows bit-identical")
        latency(batched, ctx, obs, result)
        if metrics["batch_invariance_max_abs"] > tol:
            result.fail(f"batch invariance: max diff {metrics['batch_invariance_max_abs']:.3g} > {tol:g} at row {int(metrics['worst_row'])}")
        return result
