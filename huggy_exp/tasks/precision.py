"""`precision`: the policy on (device, dtype) against CPU fp64 and fp32 references.

Described in docs/modes.md#precision.
"""

from __future__ import annotations

import numpy as np

from huggy_exp import plots
from huggy_exp.context import Context
from huggy_exp.errors import Unsupported
from huggy_exp.mlagents import ACTION_MASKS, MASK_PENALTY, RECURRENT_OUT
from huggy_exp.numerics import (compare, discrete_agreement, error_ratio, limits_for, logit_scale, margins, masked_logits, ratio_verdict,
                                rel_rmse)
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, DISCRETE, DISCRETE_SAMPLED, SAMPLED, build, reference, run_feeds
from huggy_exp.tasks import is_sequence, latency

LAYER_ORDER = ("lstm", RECURRENT_OUT, "mu", "logits")  # after normalized_obs* and hidden_*


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
        target, feeds, w = ctx.target(), ctx.feeds, ctx.weights
        # --- run the policy under test and the CPU references on the same feeds (a sequence: step by step, memory carried)
        device = build(ctx)
        if not hasattr(device, "trace"):
            raise Unsupported(f"backend {ctx.backend}: precision's per-layer attribution needs a torch backend "
                              "(eager, compile, graphs); compare onnxruntime with mode=onnx-compare")
        got = {**run_feeds(device, feeds, ctx.seed), **run_feeds(device, feeds, trace=True)}
        ref64 = reference(ctx, "fp64")
        want = {**run_feeds(ref64, feeds, ctx.seed), **run_feeds(ref64, feeds, trace=True)}
        cpu_eager = target.kind == "cpu" and ctx.backend == "eager"
        cpu32 = got if (cpu_eager and ctx.dtype == "fp32") else run_feeds(reference(ctx, "fp32"), feeds, trace=True)
        cpu_same = got if cpu_eager else run_feeds(reference(ctx, ctx.dtype, ctx.batch_size), feeds, trace=True)
        continuous, discrete, memory = ACTIONS in got, DISCRETE in got, RECURRENT_OUT in got
        limits = limits_for(self.thresholds, ctx.dtype, ctx.device, self.specialize)

        # --- element-wise metrics per float output
        metrics: dict[str, float] = {}
        rows = []
        pairs = []
        if continuous:
            pairs += [("actions", ACTIONS, want, "fp64"), ("actions", ACTIONS, cpu32, "fp32"),
                      ("mu", "mu", want, "fp64"), ("sampled_actions", SAMPLED, want, "fp64")]
        if discrete:
            pairs += [("logits", "logits", want, "fp64")]
        if memory:
            pairs += [("memories", RECURRENT_OUT, want, "fp64"), ("memories", RECURRENT_OUT, cpu32, "fp32")]
        for label, key, ref, ref_name in pairs:
            m = compare(got[key], ref[key], self.rel_floor)
            metrics.update({f"{label}.vs_{ref_name}.{k}": v for k, v in m.items()})
            rows.append({"output": label, "reference": f"cpu-{ref_name}", **m})

        # --- discrete actions: agreement, and flips weighed by the fp64 reference's masked-logit margin
        tables: dict[str, list[dict]] = {}
        if discrete:
            bound = float(limits.get("margin", 0.0))
            margin = margins(masked_logits(want["logits"], feeds.get(ACTION_MASKS), MASK_PENALTY), w.branch_sizes)
            scale = logit_scale(want["logits"], w.branch_sizes)
            d = discrete_agreement(got[DISCRETE], want[DISCRETE], margin, bound, scale)
            metrics.update({f"discrete_actions.vs_fp64.{k}": v for k, v in d.items()})
            sampled_same = got[DISCRETE_SAMPLED] == want[DISCRETE_SAMPLED]
            metrics["sampled_discrete_actions.vs_fp64.agreement"] = float(np.mean(sampled_same))
            tables["discrete"] = [{"branch": b, "size": size, **discrete_agreement(got[DISCRETE][..., b], want[DISCRETE][..., b], margin[..., b], bound, scale[..., b])}
                                  for b, size in enumerate(w.branch_sizes)]

        # --- relative verdict: device error / CPU error in the same dtype (both against fp64)
        primary = ACTIONS if continuous else "logits"
        dev_err = float(np.sqrt(np.mean((got[primary] - want[primary]) ** 2)))
        cpu_err = float(np.sqrt(np.mean((cpu_same[primary] - want[primary]) ** 2)))
        ratio = error_ratio(dev_err, cpu_err)
        verdict = ratio_verdict(ratio, self.relative["warn"], self.relative["fail"])
        metrics.update({"relative.device_rmse": dev_err, "relative.cpu_rmse": cpu_err, "relative.ratio": ratio})

        # --- per-layer attribution against fp64: every input's normalizer, the MLP, the LSTM and memory, the heads
        layer_limit = limits_for(self.layer_thresholds, ctx.dtype, ctx.device, self.specialize.get("layers")).get("rel_rmse", np.inf)
        layers = [k for k in got if k.startswith(("normalized_obs", "hidden_"))] + [k for k in LAYER_ORDER if k in got]
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

        # --- sequences: the error of every output at every step
        sequence = is_sequence(feeds)
        if sequence:
            metrics["steps"] = float(len(feeds["obs_0"]))
            tables["step_errors"] = _step_errors(got, want, [(label, key) for label, key, _, ref_name in pairs if ref_name == "fp64"])

        # --- absolute verdict from the dtype's thresholds
        tables.update({"outputs": rows, "layer_errors": layer_rows})
        result = Result(metrics=metrics, tables=tables)
        checks = []
        if continuous:
            checks += [
                ("actions max_abs vs fp64", metrics["actions.vs_fp64.max_abs"], limits.get("max_abs", np.inf), "<="),
                ("actions worst-row cosine vs fp64", metrics["actions.vs_fp64.cosine_min_row"], limits.get("cosine_min", -1.0), ">="),
            ]
        for what, value, limit, op in checks:
            if (value > limit) if op == "<=" else (value < limit):
                result.fail(f"{what} {value:.3g} (limit {limit:g})")
        for label in dict.fromkeys(label for label, *_ in pairs):
            nan_inf = metrics[f"{label}.vs_fp64.nan_mismatch"] + metrics[f"{label}.vs_fp64.inf_mismatch"]
            if nan_inf:
                result.fail(f"{int(nan_inf)} NaN/Inf mismatches in {label}")
        if discrete and metrics["discrete_actions.vs_fp64.flips_beyond_margin"]:
            result.fail(f"{int(metrics['discrete_actions.vs_fp64.flips_beyond_margin'])} discrete action flips vs fp64 where fp64's "
                        f"best masked logit leads by more than {bound:g} x max(1, |logit|) (largest margin {metrics['discrete_actions.vs_fp64.flip_margin_max']:.3g})")
        if first_bad is not None:
            result.fail(f"layer {first_bad} rel_rmse {metrics[f'layer.{first_bad}.rel_rmse']:.3g} > {layer_limit:g}")
        if verdict == "fail":
            result.fail(f"device error is {ratio:.2f}x the CPU's in {ctx.dtype} (fail above {self.relative['fail']:g})")

        parts = []
        if continuous:
            parts.append(f"actions max_abs {metrics['actions.vs_fp64.max_abs']:.2e} vs fp64 (limit {limits.get('max_abs', np.inf):g})")
        if discrete:
            parts.append(f"discrete agreement {metrics['discrete_actions.vs_fp64.agreement']:.2%} vs fp64 "
                         f"({int(metrics['discrete_actions.vs_fp64.flips'])} flips, "
                         f"{int(metrics['discrete_actions.vs_fp64.flips_beyond_margin'])} beyond margin {bound:g} x max(1, |logit|))")
        if memory:
            parts.append(f"memories max_abs {metrics['memories.vs_fp64.max_abs']:.2e} vs fp64")
        parts += [f"worst layer {worst} (rel_rmse {metrics[f'layer.{worst}.rel_rmse']:.2e})",
                  f"first failing layer {first_bad or 'none'}", f"relative {ratio:.2f} -> {verdict}"]
        headline = ", ".join(parts)
        result.tags.update({"verdict_relative": verdict, "worst_layer": worst, "first_failing_layer": first_bad or "none"})
        result.details.update({"headline": headline, "limits": limits, "layer_threshold": layer_limit,
                               "relative_verdict": verdict, "worst_layer": worst, "first_failing_layer": first_bad})
        result.summary = [headline]
        if continuous:
            result.summary.append(
                f"actions vs fp64: cosine {metrics['actions.vs_fp64.cosine']:.6f}, within 0.1% {metrics['actions.vs_fp64.within_0.1pct']:.1%}, "
                f"min atol {metrics['actions.vs_fp64.min_atol']:.2e}, min rtol {metrics['actions.vs_fp64.min_rtol']:.2e}")
        if discrete:
            result.summary.append(
                f"discrete actions vs fp64: {metrics['discrete_actions.vs_fp64.decisions']:.0f} decisions, smallest fp64 margin "
                f"{metrics['discrete_actions.vs_fp64.margin_min']:.3g}, largest margin flipped {metrics['discrete_actions.vs_fp64.flip_margin_max']:.3g}; "
                f"sampled agreement {metrics['sampled_discrete_actions.vs_fp64.agreement']:.2%}")
        if sequence:
            result.summary.append(f"sequence of {int(metrics['steps'])} steps, each run carrying its own memory from zeros (step_errors.csv)")
        result.summary.append("layers rel_rmse: " + ", ".join(f"{r['layer']} {r['rel_rmse']:.1e}" for r in layer_rows))
        # --- plots
        wd = ctx.workdir
        what = "action" if continuous else "logit"
        result.files.append(plots.error_histogram(
            wd / "error_histogram.png",
            {f"{ctx.dtype} vs fp64": got[primary] - want[primary], "cpu fp32 vs fp64": cpu32[primary] - want[primary]},
            f"{what} error, {ctx.device} {ctx.dtype}"))
        result.files.append(plots.bars(wd / "layer_errors.png", [r["layer"] for r in layer_rows], [r["rel_rmse"] for r in layer_rows],
                                       [layer_limit] * len(layer_rows), "rel_rmse vs fp64", f"per-layer error, {ctx.device} {ctx.dtype}"))
        if continuous:
            result.arrays["actions"] = got[ACTIONS].astype(np.float32)
        if discrete:
            result.arrays["discrete_actions"] = got[DISCRETE].astype(np.int64)
        if memory:
            result.arrays["memories"] = got[RECURRENT_OUT].astype(np.float32).squeeze(-2)
        latency(device, ctx, feeds, result)
        return result


def _step_errors(got: dict, want: dict, outputs: list[tuple[str, str]]) -> list[dict]:
    """Per step of a sequence: max |device - fp64| of every float output, and the discrete actions that differ."""
    steps = []
    for t in range(len(got[outputs[0][1]]) if outputs else 0):
        row = {"step": t}
        for label, key in outputs:
            row[f"{label}_max_abs"] = float(np.max(np.abs(got[key][t].astype(np.float64) - want[key][t])))
        if DISCRETE in got:
            row["discrete_flips"] = int(np.sum(got[DISCRETE][t] != want[DISCRETE][t]))
        steps.append(row)
    return steps
