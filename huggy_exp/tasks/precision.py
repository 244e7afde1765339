"""`precision`: the policy on (device, dtype) against CPU references in fp64 and fp32, with verdicts."""

from __future__ import annotations

import numpy as np

from huggy_exp import plots
from huggy_exp.context import Context
from huggy_exp.numerics import compare, error_ratio, limits_for, ratio_verdict, rel_rmse
from huggy_exp.results import Result
from huggy_exp.errors import Unsupported
from huggy_exp.runners import ACTIONS, SAMPLED, build, reference
from huggy_exp.tasks import latency


class PrecisionTask:
    name = "precision"

    def __init__(self, thresholds: dict, layer_thresholds: dict, specialize: dict | None = None,
                 relative: dict | None = None, rel_floor: float = 1e-3):
        self.thresholds = thresholds
        self.layer_thresholds = layer_thresholds
        self.specialize = specialize or {}
        self.relative = {"warn": 1.0, "fail": 2.0, **(relative or {})}
        self.rel_floor = rel_floor

    def run(self, ctx: Context) -> Result:
        ctx.require_huggy_shape(self.name)
        target, obs, w = ctx.target(), ctx.observations, ctx.weights
        # --- run the policy under test and the CPU references on the same observations
        device = build(ctx)
        if not hasattr(device, "trace"):
            raise Unsupported(f"backend {ctx.backend}: precision's per-layer attribution needs a torch backend "
                              "(eager, compile, graphs); compare onnxruntime with mode=onnx-compare")
        got = {**device.trace(obs), **device.sample(obs, ctx.seed)}
        ref64 = reference(ctx, "fp64")
        want = {**ref64.trace(obs), **ref64.sample(obs, ctx.seed)}
        cpu_eager = target.kind == "cpu" and ctx.backend == "eager"
        cpu32 = got if (cpu_eager and ctx.dtype == "fp32") else reference(ctx, "fp32").trace(obs)
        cpu_same = got if cpu_eager else reference(ctx, ctx.dtype, ctx.batch_size).trace(obs)

        # --- element-wise metrics per output
        metrics: dict[str, float] = {}
        rows = []
        pairs = [("actions", ACTIONS, want, "fp64"), ("actions", ACTIONS, cpu32, "fp32"),
                 ("mu", "mu", want, "fp64"), ("sampled_actions", SAMPLED, want, "fp64")]
        for label, key, ref, ref_name in pairs:
            m = compare(got[key], ref[key], self.rel_floor)
            metrics.update({f"{label}.vs_{ref_name}.{k}": v for k, v in m.items()})
            rows.append({"output": label, "reference": f"cpu-{ref_name}", **m})

        # --- relative verdict: device error / CPU error in the same dtype (both against fp64)
        dev_err = float(np.sqrt(np.mean((got[ACTIONS] - want[ACTIONS]) ** 2)))
        cpu_err = float(np.sqrt(np.mean((cpu_same[ACTIONS] - want[ACTIONS]) ** 2)))
        ratio = error_ratio(dev_err, cpu_err)
        verdict = ratio_verdict(ratio, self.relative["warn"], self.relative["fail"])
        metrics.update({"relative.device_rmse": dev_err, "relative.cpu_rmse": cpu_err, "relative.ratio": ratio})

        # --- per-layer attribution against fp64
        layer_limit = limits_for(self.layer_thresholds, ctx.dtype, ctx.device, self.specialize.get("layers")).get("rel_rmse", np.inf)
        layers = [k for k in got if k == "normalized_obs" or k.startswith("hidden_")] + ["mu"]
        layer_rows, first_bad = [], None
        for name in layers:
            err = rel_rmse(got[name], want[name])
            finite = bool(np.all(np.isfinite(got[name])))
            exceeds = (not finite) or err > layer_limit
            if exceeds and first_bad is None:
                first_bad = name
            metrics[f"layer.{name}.rel_rmse"] = err
            metrics[f"layer.{name}.max_abs"] = float(np.max(np.abs(got[name].astype(np.float64) - want[name])))
            layer_rows.append({"layer": name, "rel_rmse": err, "max_abs": metrics[f"layer.{name}.max_abs"],
                               "threshold": layer_limit, "finite": finite, "exceeds": exceeds})
        worst = max(layer_rows, key=lambda r: r["rel_rmse"])["layer"]

        # --- absolute verdict from the dtype's thresholds
        limits = limits_for(self.thresholds, ctx.dtype, ctx.device, self.specialize)
        result = Result(metrics=metrics, tables={"outputs": rows, "layer_errors": layer_rows})
        checks = [
            ("actions max_abs vs fp64", metrics["actions.vs_fp64.max_abs"], limits.get("max_abs", np.inf), "<="),
            ("actions worst-row cosine vs fp64", metrics["actions.vs_fp64.cosine_min_row"], limits.get("cosine_min", -1.0), ">="),
        ]
        for what, value, limit, op in checks:
            if (value > limit) if op == "<=" else (value < limit):
                result.fail(f"{what} {value:.3g} (limit {limit:g})")
        nan_inf = metrics["actions.vs_fp64.nan_mismatch"] + metrics["actions.vs_fp64.inf_mismatch"]
        if nan_inf:
            result.fail(f"{int(nan_inf)} NaN/Inf mismatches in actions")
        if first_bad is not None:
            result.fail(f"layer {first_bad} rel_rmse {metrics[f'layer.{first_bad}.rel_rmse']:.3g} > {layer_limit:g}")
        if verdict == "fail":
            result.fail(f"device error is {ratio:.2f}x the CPU's in {ctx.dtype} (fail above {self.relative['fail']:g})")

        headline = (f"actions max_abs {metrics['actions.vs_fp64.max_abs']:.2e} vs fp64 (limit {limits.get('max_abs', np.inf):g}), "
                    f"worst layer {worst} (rel_rmse {metrics[f'layer.{worst}.rel_rmse']:.2e}), "
                    f"first failing layer {first_bad or 'none'}, relative {ratio:.2f} -> {verdict}")
        result.tags.update({"verdict_relative": verdict, "worst_layer": worst, "first_failing_layer": first_bad or "none"})
        result.details.update({"headline": headline, "limits": limits, "layer_threshold": layer_limit,
                               "relative_verdict": verdict, "worst_layer": worst, "first_failing_layer": first_bad})
        result.summary = [
            headline,
            f"actions vs fp64: cosine {metrics['actions.vs_fp64.cosine']:.6f}, within 0.1% {metrics['actions.vs_fp64.within_0.1pct']:.1%}, "
            f"min atol {metrics['actions.vs_fp64.min_atol']:.2e}, min rtol {metrics['actions.vs_fp64.min_rtol']:.2e}",
            "layers rel_rmse: " + ", ".join(f"{r['layer']} {r['rel_rmse']:.1e}" for r in layer_rows),
        ]
        # --- plots
        wd = ctx.workdir
        result.files.append(plots.error_histogram(
            wd / "error_histogram.png",
            {f"{ctx.dtype} vs fp64": got[ACTIONS] - want[ACTIONS], "cpu fp32 vs fp64": cpu32[ACTIONS] - want[ACTIONS]},
            f"action error, {ctx.device} {ctx.dtype}"))
        result.files.append(plots.bars(wd / "layer_errors.png", [r["layer"] for r in layer_rows], [r["rel_rmse"] for r in layer_rows],
                                       [layer_limit] * len(layer_rows), "rel_rmse vs fp64", f"per-layer error, {ctx.device} {ctx.dtype}"))
        result.arrays["actions"] = got[ACTIONS].astype(np.float32)
        latency(device, ctx, obs, result)
        return result
