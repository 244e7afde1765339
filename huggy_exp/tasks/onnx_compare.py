"""`onnx-compare`: the policy against onnxruntime running the ML-Agents .onnx.
Described in docs/modes.md#onnx-compare."""

from __future__ import annotations

import numpy as np

from huggy_exp import plots
from huggy_exp.config import OnnxCompareMode
from huggy_exp.context import Context
from huggy_exp.mlagents import ACTION_CLAMP, ACTION_MASKS, RECURRENT_IN, RECURRENT_OUT, check_onnx_pairing
from huggy_exp.numerics import categorical_check, sampling_check
from huggy_exp.results import Result, first_nonfinite
from huggy_exp.runners import ACTIONS, DISCRETE, DISCRETE_SAMPLED, SAMPLED, build, over_steps, reference, run_feeds
from huggy_exp.tasks import Task, is_sequence, latency, verify_point
from huggy_exp.tasks.compare import expected_constants, feeds_with_masks, first_divergence, judge_outputs
from huggy_exp.verify import DECLARED

VERSUS = "onnxruntime"  # metrics <output>/vs_onnxruntime/<metric>, as the engine names them


class OnnxCompareTask(Task):
    mode: OnnxCompareMode

    def run(self, ctx: Context) -> Result:
        w = ctx.weights
        feeds = feeds_with_masks(ctx, self.mode.masks)
        sequence = is_sequence(feeds)
        onnx_path = ctx.onnx_path()
        check_onnx_pairing(onnx_path, w)
        # --- build runners, run the feeds
        ort = build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0,
                    provider=self.mode.provider)
        under_test = build(ctx)
        mine, theirs = run_feeds(under_test, feeds), run_feeds(ort, feeds)
        # what the sampled outputs draw from, and the discrete margins: the fp32 CPU policy, its own memory carried
        dist = over_steps(reference(ctx, "fp32").distributions, feeds, w.memory)
        result = Result()
        # --- compare: deterministic outputs element-wise (discrete exactly), constants exactly, draws statistically
        atol = ctx.atol(ctx.judged_dtype, "fp32")  # the .onnx runs fp32: an fp64 policy is held to fp32's limit
        rows, constants = judge_outputs(result, "", w, mine, theirs, VERSUS, atol, self.mode.rel_floor,
                                        dist.get("masked_logits"), theirs, expected_constants(w), sequence)
        sampled = self.sampled(ort, w, feeds, dist, sequence, result)
        first_divergence(ctx, onnx_path, feeds, result)
        # --- judge, Result
        versus = "vs onnxruntime: " + "; ".join(_deterministic_lines(result.metrics, mine, atol, constants) + sampled)
        result.details.update({"onnx": str(onnx_path), "provider": self.mode.provider, "atol": atol,
                               "constants": constants, "sequence": sequence})
        lead = f"{len(feeds['obs_0'])} steps x {feeds['obs_0'].shape[1]} agents, memory carried on both sides; " if sequence else ""
        result.summary[:0] = [f"{ort.name} on {onnx_path.name} vs {under_test.name} ({ctx.device} {ctx.dtype}): {lead}{w.describe_shape()}",
                              versus]
        result.tables["outputs"] = [*rows, *({"output": k, **v} for k, v in constants.items())]
        _keep_outputs(ctx, result, mine, theirs, ort.name)
        latency(under_test, ctx, feeds, result)
        verify_point(ctx, result, under_test, feeds, mine)
        result.headline += f"; {versus}"
        return result

    def sampled(self, ort, w, feeds: dict, dist: dict, sequence: bool, result: Result) -> list[str]:
        """Many onnxruntime draws of the same rows (the last step of a sequence, fed the reference's memory) against the
        reference's distributions: continuous by their moments, discrete by chi-square. Their headline phrases."""
        samples, confidence = self.mode.samples, self.mode.confidence
        step = {k: v[-1] for k, v in feeds.items()} if sequence else feeds
        last = {k: v[-1] for k, v in dist.items()} if sequence else dist
        n = min(self.mode.sample_rows, len(step["obs_0"]))
        rows_feeds = {k: v[:n] for k, v in step.items()}
        if w.memory:  # the reference's memory at the step before the last, else zeros
            rows_feeds[RECURRENT_IN] = (dist[RECURRENT_OUT][-2][:n] if sequence and len(dist[RECURRENT_OUT]) > 1
                                        else np.zeros((n, 1, w.memory), np.float32))
        tiled = {k: np.tile(v, (samples,) + (1,) * (v.ndim - 1)) for k, v in rows_feeds.items()}
        draws = ort.infer(tiled)
        for name in (SAMPLED, DISCRETE_SAMPLED):
            if name in draws and (bad := first_nonfinite(draws[name])) is not None:
                result.fail(f"{name}: {bad[0]} NaN/inf values in onnxruntime's draws (first at {list(bad[1])})")
        headline = []
        if w.mu is not None:
            stats = self._continuous(draws[SAMPLED].reshape(samples, n, -1), last, n, w.tanh_squash, result)
            headline.append(f"sampled max|z| {stats['mean_z_max']:.2f}/{stats['mean_z_crit']:.2f}, spread {stats['spread_ratio']:.3f}")
            result.summary.append(f"sampled continuous: {int(stats['cells'])} cells x {samples} draws; mean test at "
                                  f"{confidence:.1%} (Bonferroni), spread on {int(stats['spread_cells'])} unclipped cells")
        if w.branches:
            picks = np.asarray(draws[DISCRETE_SAMPLED]).reshape(samples, n, -1)
            headline.append(self._discrete(picks, last["masked_logits"][:n], w.branch_sizes, rows_feeds.get(ACTION_MASKS), result))
        return headline

    def _discrete(self, picks: np.ndarray, masked_logits: np.ndarray, sizes: tuple[int, ...], masks, result: Result) -> str:
        """Draws [samples, rows, branches] against the masked softmax: never a masked action, frequencies by chi-square."""
        samples, confidence = self.mode.samples, self.mode.confidence
        stats = categorical_check(picks, masked_logits, sizes, masks, confidence)
        result.metrics.update({f"sampled_discrete/{k}": v for k, v in stats.items()})
        if stats["masked_draws"] or stats["out_of_range"]:
            result.fail(f"discrete_actions: {int(stats['masked_draws'])} draws of a masked action, "
                        f"{int(stats['out_of_range'])} outside their branch")
        if not stats["p_min"] >= stats["p_crit"]:  # written so that NaN never passes
            result.fail(f"discrete_actions do not follow the masked softmax: chi-square p {stats['p_min']:.2g} < "
                        f"{stats['p_crit']:.2g} ({confidence:.1%} confidence, Bonferroni over {int(stats['cells'])} cells)")
        result.summary.append(f"sampled discrete: {int(stats['cells'])} (row, branch) cells x {samples} draws; chi-square "
                              f"at {confidence:.1%} (Bonferroni); max |frequency - p| {stats['freq_max_abs']:.3f}")
        return f"sampled discrete p_min {stats['p_min']:.2g}/{stats['p_crit']:.2g}, {int(stats['masked_draws'])} masked draws"

    def _continuous(self, draws: np.ndarray, dist: dict, n: int, tanh_squash: bool, result: Result) -> dict:
        """Draws [samples, rows, act] against mu and exp(log_sigma): the clipped normal (PPO) or the normal before tanh (SAC)."""
        confidence = self.mode.confidence
        mu, sigma = dist["mu"][:n].astype(np.float64), np.exp(dist["log_sigma"][:n].astype(np.float64))
        if tanh_squash:
            stats = sampling_check(np.arctanh(np.clip(draws, -1 + 1e-7, 1 - 1e-7)), mu, sigma, None, None, confidence)
        else:
            stats = sampling_check(draws * ACTION_CLAMP, mu, sigma, -ACTION_CLAMP, ACTION_CLAMP, confidence)
        result.metrics.update({f"sampled/{k}": v for k, v in stats.items()})
        if not stats["mean_z_max"] <= stats["mean_z_crit"]:  # written so that NaN never passes
            result.fail(f"sampled means off: max |z| {stats['mean_z_max']:.2f} > {stats['mean_z_crit']:.2f} ({confidence:.1%} confidence)")
        if stats["spread_cells"] > 0 and not abs(stats["spread_ratio"] - 1) <= stats["spread_tolerance"]:
            result.fail(f"sampled spread {stats['spread_ratio']:.3f} x exp(log_sigma), outside 1 +- {stats['spread_tolerance']:.3f}")
        return stats


def _deterministic_lines(m: dict, mine: dict, atol: float, constants: dict) -> list[str]:
    """The deterministic outputs' figures against onnxruntime, in words, and whether the constants are equal."""
    parts = []
    if ACTIONS in mine:
        parts.append(f"deterministic max_abs {m.get(f'actions/vs_{VERSUS}/max_abs', float('nan')):.2e} (atol {atol:g})")
    if DISCRETE in mine:
        d = f"discrete_actions/vs_{VERSUS}/"
        excused = int(m.get(d + "flips", 0) - m.get(d + "flips_beyond_margin", 0))
        parts.append(f"discrete agreement {m.get(d + 'agreement', float('nan')):.2%} ({excused} excused near-ties)")
    if RECURRENT_OUT in mine:
        parts.append(f"recurrent_out max_abs {m.get(f'memories/vs_{VERSUS}/max_abs', float('nan')):.2e}")
    parts.append(f"constants {'equal' if all(c['equal'] for c in constants.values()) else 'DIFFER'}")
    return parts


def _keep_outputs(ctx: Context, result: Result, mine: dict, theirs: dict, ort_name: str) -> None:
    """Both sides' deterministic outputs as arrays, and a histogram of their differences."""
    for out in (o for o in DECLARED if o.name in mine and o.name in theirs):
        result.arrays.update({f"torch_{out.stem}": mine[out.name], f"onnx_{out.stem}": np.asarray(theirs[out.name])})
    diffs = {f"{name}: torch {ctx.dtype} - onnxruntime": mine[name] - theirs[name] for name in (ACTIONS, RECURRENT_OUT)
             if name in mine and np.shape(theirs.get(name)) == np.shape(mine[name])}
    if diffs and ctx.plots:
        result.files.append(plots.error_histogram(ctx.workdir / "error_histogram.png", diffs,
                                                  f"deterministic outputs, {ctx.device} {ctx.dtype} vs {ort_name}"))
