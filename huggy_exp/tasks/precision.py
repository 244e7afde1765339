"""`precision`: the policy on (device, dtype) against CPU fp64 and fp32 references, every output through the
verification engine (docs/verification.md). Described in docs/modes.md#precision."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from huggy_exp import plots
from huggy_exp.config import BACKENDS, PrecisionMode, limit_row
from huggy_exp.context import Context
from huggy_exp.numerics import error_ratio, limits_for, ratio_verdict
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, DISCRETE, build, reference, run_feeds
from huggy_exp.tasks import Task, is_sequence, latency, verify_point
from huggy_exp.tasks.compare import layer_names
from huggy_exp.verify import DECLARED, elementwise, outputs_of, within


class PrecisionTask(Task):
    mode: PrecisionMode

    def run(self, ctx: Context) -> Result:
        feeds = ctx.feeds
        # --- build runners, run the feeds (a sequence: step by step, each run carrying its own memory)
        device = build(ctx)
        traced = run_feeds(device, feeds, trace=True)  # onnxruntime: its graph's parts (mlagents.with_parts)
        got = {**run_feeds(device, feeds, ctx.seed), **traced}
        want = run_feeds(reference(ctx, "fp64"), feeds, trace=True)
        cpu_eager = ctx.target().kind == "cpu" and BACKENDS[ctx.backend].reference  # the CPU reference itself
        cpu_same = got if cpu_eager else run_feeds(build(ctx, "eager", device="cpu"), feeds, trace=True)
        result = Result()
        # --- compare and judge: every output (the engine), the layers, the relative verdict
        latency(device, ctx, feeds, result)
        verify_point(ctx, result, device, feeds, got, ctx.seed)
        for name in ("mu", "logits"):
            if name in got:
                m = elementwise(got[name], want[name], ctx.verify.rel_floor, ctx.judged_dtype)
                result.metrics.update({f"{name}/vs_fp64/{k}": v for k, v in m.items()})
        layers = self._layers(ctx, got, want, result)
        verdict = self._relative(ctx, got, want, cpu_same, result)
        if is_sequence(feeds):
            result.metrics["steps"] = float(len(feeds["obs_0"]))
            result.tables["step_errors"] = _step_errors(got, want)
        worst, first_bad = layers["worst_layer"], layers["first_failing_layer"]
        result.tags.update({"verdict_relative": verdict, "worst_layer": worst, "first_failing_layer": first_bad or "none"})
        row = limit_row(ctx.judged_dtype, ctx.precision_mode)
        result.details.update({"limits": limits_for(asdict(ctx.verify.limits), row, ctx.device, ctx.verify.specialize,
                                                    "verify.limits"), "limit_row": row, "relative_verdict": verdict, **layers})
        result.summary.insert(1, f"worst layer {worst} (rel_rmse {result.metrics[f'layer/{worst}/rel_rmse']:.2e}), first failing "
                                 f"layer {first_bad or 'none'}, relative {result.metrics['relative/ratio']:.2f} -> {verdict}")
        if ctx.plots:
            self._plot(ctx, got, want, result)
        result.arrays.update({o.stem: o.stored(got[o.name]) for o in DECLARED if o.name in got})
        return result

    def _layers(self, ctx: Context, got: dict, want: dict, result: Result) -> dict:
        """rel_rmse, max_abs and SQNR of every intermediate against fp64 (the engine's); the first one over the dtype's
        layer threshold fails."""
        limit = ctx.limits().layer_rel_rmse
        rows, first_bad = [], None
        for name in layer_names(got):
            m, finite = elementwise(got[name], want[name], ctx.verify.rel_floor, ctx.dtype), bool(np.all(np.isfinite(got[name])))
            exceeds = not (finite and within(m["rel_rmse"], limit))
            first_bad = first_bad or (name if exceeds else None)
            row = {"layer": name, **{k: m[k] for k in ("rel_rmse", "max_abs", "sqnr_db")}}
            result.metrics.update({f"layer/{name}/{k}": v for k, v in row.items() if k != "layer"})
            result.metrics[f"layer/{name}/rel_rmse_limit"] = limit
            rows.append({**row, "threshold": limit, "finite": finite, "exceeds": exceeds})
        result.tables["layer_errors"] = rows
        if first_bad is not None:
            result.fail(f"layer {first_bad} rel_rmse {result.metrics[f'layer/{first_bad}/rel_rmse']:.3g} > {limit:g}")
        return {"worst_layer": max(rows, key=lambda r: r["rel_rmse"])["layer"], "first_failing_layer": first_bad,
                "layer_threshold": limit}

    def _relative(self, ctx: Context, got: dict, want: dict, cpu_same: dict, result: Result) -> str:
        """Device RMSE over the CPU's in the same dtype (both vs fp64): pass up to warn, warn up to fail, else fail."""
        primary = ACTIONS if ACTIONS in got else "logits"
        dev_err, cpu_err = (elementwise(side[primary], want[primary], dtype=ctx.dtype)["rmse"] for side in (got, cpu_same))
        ratio = error_ratio(dev_err, cpu_err)
        warn, fail = self.mode.relative.warn, self.mode.relative.fail
        verdict = ratio_verdict(ratio, warn, fail)
        result.metrics.update({"relative/device_rmse": dev_err, "relative/cpu_rmse": cpu_err, "relative/ratio": ratio})
        if verdict == "fail":
            result.fail(f"device error is {ratio:.2f}x the CPU's in {ctx.dtype_label} (fail above {fail:g})")
        return verdict

    def _plot(self, ctx: Context, got: dict, want: dict, result: Result) -> None:
        """error_histogram.png (the point's and CPU fp32's error vs fp64) and layer_errors.png (rel_rmse per layer)."""
        primary = ACTIONS if ACTIONS in got else "logits"
        diffs = {f"{ctx.dtype_label} vs fp64": got[primary] - want[primary]}
        if primary == ACTIONS:
            diffs["cpu fp32 vs fp64"] = run_feeds(reference(ctx, "fp32"), ctx.feeds)[ACTIONS] - want[ACTIONS]
        what = "action" if primary == ACTIONS else "logit"
        result.files.append(plots.error_histogram(ctx.workdir / "error_histogram.png", diffs, f"{what} error, {ctx.device} {ctx.dtype_label}"))
        rows = result.tables["layer_errors"]
        result.files.append(plots.bars(ctx.workdir / "layer_errors.png", [r["layer"] for r in rows], [r["rel_rmse"] for r in rows],
                                       [r["threshold"] for r in rows], "rel_rmse vs fp64", f"per-layer error, {ctx.device} {ctx.dtype_label}"))


def _step_errors(got: dict, want: dict) -> list[dict]:
    """Per step of a sequence: max |device - fp64| of every float output, and the discrete actions that differ."""
    steps = []
    outs = [o for o in outputs_of(set(got) & set(want)) if o.rule in ("continuous", "memory")]
    for t in range(len(got["hidden_0"])):
        row = {"step": t}
        for o in outs:
            row[f"{o.stem}_max_abs"] = elementwise(got[o.name][t], want[o.name][t])["max_abs"]
        if DISCRETE in got:
            row["discrete_flips"] = int(np.sum(got[DISCRETE][t] != want[DISCRETE][t]))
        steps.append(row)
    return steps
