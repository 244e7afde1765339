"""`batch`: batched inference and batch invariance. Described in docs/modes.md#batch."""

from __future__ import annotations

import numpy as np

from huggy_exp.config import BatchMode
from huggy_exp.context import Context
from huggy_exp.mlagents import RECURRENT_OUT
from huggy_exp.placement import memory_stats, peak_memory, reset_peak_memory
from huggy_exp.results import Result
from huggy_exp import timing
from huggy_exp.runners import ACTIONS, DISCRETE, build, run_feeds
from huggy_exp.tasks import Task, latency, verify_point

FLIP_FAILS_UP_TO = 1e-5  # discrete flips fail where the dtype's tolerance is this tight (fp32, fp64); else reported


class BatchTask(Task):
    mode: BatchMode

    def run(self, ctx: Context) -> Result:
        target, feeds = ctx.target(), ctx.feeds
        reset_peak_memory(target.device)  # this job's peak, not an earlier job's in the same process
        # --- build runners (whole chunks and one row at a time), run the feeds
        batched, single = build(ctx), build(ctx, batch_size=1)
        out_batched, out_single = run_feeds(batched, feeds), run_feeds(single, feeds)
        # --- compare them row by row; time both
        row_max, invariance = _row_max(out_batched, out_single, feeds["obs_0"].ndim - 1)
        rows = int(np.prod(feeds["obs_0"].shape[:-1]))
        tol = ctx.limits().batch_max_abs
        metrics = {"rows": float(rows), **invariance, **self.throughput(ctx, batched, single, feeds, rows),
                   **{f"device/{k}": v for k, v in memory_stats(target.device).items()}}
        arrays = {"actions": out_batched[ACTIONS].astype(np.float32)} if ACTIONS in out_batched else {}
        discrete, flips = DISCRETE in out_batched, 0
        if discrete:
            flips = int(np.sum(out_batched[DISCRETE] != out_single[DISCRETE]))
            metrics.update(discrete_flips=float(flips),
                           discrete_agreement=float(np.mean(out_batched[DISCRETE] == out_single[DISCRETE])))
            arrays["discrete_actions"] = out_batched[DISCRETE]
        result = Result(metrics=metrics, arrays=arrays,
                        tables={"batch_invariance": [{"row": i, "max_abs_diff": float(d)} for i, d in enumerate(row_max)]})
        # --- judge: the engine's verdict on the point, then batch invariance
        headline = (f"max |batched - single-row| {metrics['batch_invariance_max_abs']:.3g} (tolerance {tol:g}), "
                    f"{metrics['rows_bit_identical']:.0%} rows bit-identical"
                    + (f", {flips} discrete action{'s' * (flips != 1)} differ" if discrete else ""))
        result.summary = _summary(metrics, rows, ctx.batch_size, tol, ctx.dtype_label, discrete)
        result.details.update(invariance=headline, peak_mem_source=peak_memory(target.device)[1])
        latency(batched, ctx, feeds, result)
        verify_point(ctx, result, batched, feeds, out_batched)
        result.headline += f"; {headline}"
        if metrics["batch_invariance_max_abs"] > tol:
            result.fail(f"batch invariance: max diff {metrics['batch_invariance_max_abs']:.3g} > {tol:g} at row {int(metrics['worst_row'])}")
        if flips and tol <= FLIP_FAILS_UP_TO:
            result.fail(f"batch invariance: {flips} discrete actions differ between batched and single-row inference in {ctx.dtype_label}")
        return result

    def throughput(self, ctx: Context, batched, single, feeds: dict, rows: int) -> dict[str, float]:
        """Rows per second of both runners, through the one measurement policy (fixed threads, warm-up until stable)."""
        with timing.threads(ctx.threads):
            s = self.mode.budget_s
            t_batched = timing.measure(lambda: run_feeds(batched, feeds), batched.target.device, rows, s, s / 2)
            t_single = timing.measure(lambda: run_feeds(single, feeds), single.target.device, rows, s, s / 2)
        return {"batched_rows_per_s": rows / (t_batched.stats()["p50_us"] / 1e6),
                "single_rows_per_s": rows / (t_single.stats()["p50_us"] / 1e6)}


def _row_max(batched: dict, single: dict, lead: int) -> tuple[np.ndarray, dict[str, float]]:
    """Per row ([N] or [T, N] flattened), the largest |batched - single-row| over the deterministic float outputs
    (not the graph's sampled ones), and the invariance metrics of those."""
    floats = [k for k in (ACTIONS, RECURRENT_OUT) if k in batched]
    diffs = [np.abs(batched[k].astype(np.float64) - single[k].astype(np.float64)).reshape(*batched[k].shape[:lead], -1)
             for k in floats]
    row_max = np.max(np.concatenate(diffs, axis=-1), axis=-1).reshape(-1) if diffs else np.zeros(0)
    return row_max, {"batch_invariance_max_abs": float(row_max.max()) if row_max.size else 0.0,
                     "rows_bit_identical": float(np.mean(row_max == 0.0)) if row_max.size else 1.0,
                     "worst_row": float(np.argmax(row_max)) if row_max.size else 0.0}


def _summary(metrics: dict, rows: int, batch_size: int, tol: float, dtype: str, discrete: bool) -> list[str]:
    return [f"{rows} rows in chunks of {batch_size}: max |batched - single-row| = "
            f"{metrics['batch_invariance_max_abs']:.3g} (tolerance {tol:g} for {dtype}); "
            f"{metrics['rows_bit_identical']:.0%} rows bit-identical"
            + (f"; discrete actions {metrics['discrete_agreement']:.2%} equal" if discrete else ""),
            f"throughput: {metrics['batched_rows_per_s']:,.0f} rows/s batched vs "
            f"{metrics['single_rows_per_s']:,.0f} rows/s one by one"]
