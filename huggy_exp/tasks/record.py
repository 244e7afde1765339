"""`record`: one point's behaviour into a port-certificate bundle (huggy_exp/bundle.py).
Described in docs/modes.md#record and docs/port-certificate.md."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from huggy_exp import bundle, environment, timing
from huggy_exp.certify import errors, named_outputs
from huggy_exp.config import LatencySamples, RecordMode, cpu_note, limit_row
from huggy_exp.context import Context
from huggy_exp.results import Result, first_nonfinite
from huggy_exp.runners import Runner, build, reference, run_feeds
from huggy_exp.tasks import Task, batch_of, distributions
from huggy_exp.verify import fingerprints


def time_calls(runner: Runner, ctx: Context, feeds: dict[str, np.ndarray], settings: LatencySamples) -> timing.Timing:
    """Per-call latency of the runner on the job's batch of the feeds (a sequence: its first step), at the job's threads."""
    batch = batch_of(feeds, ctx.batch_size)
    with timing.threads(ctx.threads):
        return timing.measure(lambda: runner.infer(batch), runner.target.device, ctx.batch_size,
                              budget_s=settings.budget_s, warmup_s=settings.warmup_s, max_samples=settings.max_samples,
                              min_samples=5)


class RecordTask(Task):
    mode: RecordMode

    def run(self, ctx: Context) -> Result:
        if self.mode.out:
            bundle.check_out(Path(self.mode.out))  # before any inference: a folder of the user's files is refused now
        root = Path(self.mode.out).expanduser() if self.mode.out else ctx.workdir / "bundle"
        feeds = {k: np.ascontiguousarray(v, np.float32) for k, v in ctx.feeds.items()}
        # --- run the point and the CPU fp64 reference on the same feeds
        runner, cpu64 = build(ctx), reference(ctx, "fp64")
        outputs = named_outputs(run_feeds(runner, feeds))
        fp64 = {**named_outputs(run_feeds(cpu64, feeds), np.float64), **distributions(cpu64, feeds)}  # μ, σ, logits too
        comparison = {name: errors(outputs[name], fp64[name], ctx.judged_dtype) for name in outputs}
        bad = {name: where for name, a in outputs.items() if (where := first_nonfinite(a)) is not None}
        if bad:  # a certificate of NaN outputs would hold every replay to them: the job fails, the bundle is untouched
            result = Result(arrays=dict(outputs))
            result.fail(f"not recorded: {', '.join(f'{n} has {c} NaN/inf values (first at {list(i)})' for n, (c, i) in bad.items())}")
            return result
        timed = time_calls(runner, ctx, feeds, self.mode.latency)
        # --- into the bundle
        key = bundle.point_key(ctx.device, ctx.dtype_label, ctx.backend, ctx.batch_size)
        prints = fingerprints(outputs, self.mode.decimals)
        manifest, replaced = self.into_bundle(ctx, root, key, runner, feeds, fp64, outputs, comparison, prints,
                                              self.mode.decimals, timed)
        # --- the job's own result
        stats = timed.stats()
        result = Result(arrays=dict(outputs), tags=dict(prints))
        result.metrics.update({f"{name}/vs_fp64/{k}": v for name, errs in comparison.items() for k, v in errs.items()})
        result.metrics.update({f"latency/{k}": float(stats[k]) for k in ("p50_us", "p90_us", "p99_us", "samples", "noisy")})
        result.metrics["bundle/points"] = float(len(manifest["points"]))
        result.latency = {k: float(stats[k]) for k in ("p50_us", "p99_us", "obs_per_s", "noisy", "samples", "threads")}
        errs = ", ".join(f"{n} max_abs {m['max_abs']:.2e}" if "max_abs" in m else f"{n} {m['mismatch_share']:.2%} differ"
                         for n, m in comparison.items())
        headline = (f"recorded {key} into {root} ({len(manifest['points'])} point(s)); vs fp64: {errs}; "
                    f"p50 {stats['p50_us']:,.0f} µs; fingerprint {prints['fingerprint'][:12]}")
        result.summary = [headline, f"latency: {len(timed.samples)} samples, p50 {stats['p50_us']:,.1f} µs, p99 {stats['p99_us']:,.1f} µs "
                                    f"at {timed.threads} thread(s)" + (" (noisy)" if stats["noisy"] else ""),
                          *([f"replaced the earlier recording of {key}"] if replaced else [])]
        if note := cpu_note(ctx.dtype, runner.target.kind):
            result.summary.append(note)
        result.headline = headline
        result.details.update({"headline": headline, "bundle": str(root.resolve()), "point": key})
        return result

    @staticmethod
    def into_bundle(ctx: Context, root: Path, key: str, runner, feeds: dict, fp64: dict, outputs: dict, comparison: dict,
                    prints: dict, decimals: int, timed) -> tuple[dict, bool]:
        """The point (where it ran, its fingerprints with the quantized one's `decimals`, outputs with the distributions
        they come from, latency, the limits it is judged by now) and the inputs it ran on, recorded into the bundle at
        `root`: (the manifest, whether an earlier recording of the point was replaced)."""
        observations = {"source": ctx.obs.source, "rows": ctx.obs.rows, "scale": ctx.obs.scale, "path": ctx.obs.path,
                        "seed": ctx.seed, "inputs_sha256": bundle.arrays_sha256(feeds),
                        "inputs": {k: list(v.shape) for k, v in feeds.items()}}
        w, m, stats, rules = ctx.weights, ctx.model, timed.stats(), ctx.rules()
        model = {"sha256": bundle.weights_sha256(w), "file_sha256": m.sha256, "path": str(m.path),  # sha256: replay's
                 "synthetic": m.synthetic, "step": m.step, "shape": w.describe_shape(),
                 "dims": {"inputs": list(w.obs_sizes), "continuous_actions": w.act_dim,
                          "branch_sizes": list(w.branch_sizes), "memory_size": w.memory, "hidden_units": w.hidden_units,
                          "num_layers": w.num_layers, "parameters": w.parameter_count}}
        point = {"device": ctx.device, "dtype": ctx.dtype_label, "backend": ctx.backend, "batch": ctx.batch_size,
                 "threads": timed.threads, "runner": runner.name, "environment": environment.capture(),
                 "fingerprints": prints, "decimals": decimals,
                 "outputs": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in outputs.items()},
                 "judged": {"dtype": rules.dtype, "row": limit_row(rules.dtype, ctx.precision_mode),
                            "limits": asdict(rules.limits)},
                 "latency": {k: stats[k] for k in ("p50_us", "p90_us", "p99_us", "mean_us", "iqr_us", "samples", "noisy")}}
        drawn_from = distributions(runner, feeds)  # μ, σ, masked logits (a torch runner's): KL, |Δμ|/σ, margins
        return bundle.record_point(root, model, observations, feeds, fp64, key, point, {**outputs, **drawn_from},
                                   np.asarray(timed.samples), {"against": "cpu fp64 eager", "outputs": comparison})
