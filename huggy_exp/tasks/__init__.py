"""One small class per mode: a Task built with its mode's schema object, and run(ctx) -> Result."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from huggy_exp import timing
from huggy_exp.bundle import DISTRIBUTIONS
from huggy_exp.config import DTYPES, ModeConf, cpu_note
from huggy_exp.context import Context
from huggy_exp.errors import Unsupported
from huggy_exp.results import Result
from huggy_exp.runners import OBS, Runner, build, over_steps, reference, run_feeds
from huggy_exp import verify
from huggy_exp.verify import DECLARED, Comparison, outputs_of

LATENCY_KEYS = ("p50_us", "p99_us", "mean_us", "obs_per_s", "noisy", "samples", "threads")  # result.latency's


class Task:
    """A mode's task, built with its mode's schema object (a config.ModeConf subclass, `mode`: read as config.validate
    checked it, never re-cast or checked again); run(ctx) -> Result."""

    def __init__(self, mode: ModeConf):
        self.mode = mode


def is_sequence(feeds: Mapping[str, np.ndarray]) -> bool:
    """Feeds of [T, N, d] arrays: a sequence run step by step with the memory carried."""
    return feeds[OBS].ndim == 3


def first_step(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Step 0 of a sequence (every input); single-step feeds as they are."""
    return {k: v[0] for k, v in feeds.items()} if is_sequence(feeds) else dict(feeds)


def batch_of(feeds: Mapping[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Feeds of exactly `rows` rows: every input cycled or cut; of a [T, N, d] sequence, step 0."""
    return {k: np.ascontiguousarray(np.resize(v, (rows, *v.shape[1:])), np.float32) for k, v in first_step(feeds).items()}


def latency(runner: Runner, ctx: Context, feeds: Mapping[str, np.ndarray], result: Result) -> None:
    """The point's latency at the job's batch size (bounded: <= 0.1 s): result.latency and `latency/<stat>` metrics.

    Every input of the policy (obs_0.. and masks) at that batch size; a sequence is timed as its first step."""
    feeds = batch_of(feeds, ctx.batch_size)
    stats = timing.quick(lambda: runner.infer(feeds), runner.target.device, ctx.batch_size, ctx.threads).stats()
    result.latency = {**{k: stats[k] for k in LATENCY_KEYS}, "batch_size": float(ctx.batch_size)}
    result.metrics.update({f"latency/{k}": v for k, v in result.latency.items()})
    line = (f"latency ({runner.name}, batch {ctx.batch_size}, {stats['threads']:g} thread(s)): "
            f"p50 {stats['p50_us']:,.1f} µs, p99 {stats['p99_us']:,.1f} µs, {stats['obs_per_s']:,.0f} obs/s")
    result.summary.append(line + (" (noisy)" if stats["noisy"] else ""))
    if note := cpu_note(ctx.dtype, runner.target.kind):
        result.summary.append(note)
        result.details["latency_note"] = note


def verify_point(ctx: Context, result: Result, runner: Runner, feeds: Mapping[str, np.ndarray],
                 got: Mapping[str, np.ndarray] | None = None, seed: int | None = None,
                 decimals: int | None = None) -> Comparison:
    """The point's outputs against CPU fp64 (judged by the dtype's limits) and CPU fp32 (reported) on the same feeds,
    and its fingerprint; metrics `<stem>/vs_fp64/<metric>`, tags `fingerprint`, `quantized_fingerprint`; returns the
    fp64 comparison.

    `got`: the runner's outputs on `feeds` by ML-Agents name (run here when None); `seed`: they are sampled ones;
    `decimals`: the quantized fingerprint's rounding (None: verify.decimals)."""
    got = dict(run_feeds(runner, feeds, seed) if got is None else got)
    got.update(distributions(runner, feeds))
    rules = ctx.rules()
    vs, want = {}, {}
    for ref_dtype in ("fp64", "fp32"):
        ref = reference(ctx, ref_dtype)
        want[ref_dtype] = {**run_feeds(ref, feeds), **(run_feeds(ref, feeds, seed) if seed is not None else {}),
                           **distributions(ref, feeds)}
        vs[ref_dtype] = verify.compare(got, want[ref_dtype], rules)
        result.metrics.update(vs[ref_dtype].metrics(ref_dtype))
    for reason in vs["fp64"].failures:
        result.fail(f"vs cpu fp64: {reason}")
    declared = outputs_of(got)
    deterministic = any(o.sampled is not None for o in declared)  # a sampled twin declares no twin of its own
    arrays = {o.stem: got[o.name] for o in declared if not deterministic or o.sampled is not None or o.rule == "memory"}
    result.tags.update(verify.fingerprints(arrays, ctx.verify.decimals if decimals is None else decimals))
    result.headline = point_line(vs["fp64"], result, ctx)
    if DTYPES[ctx.dtype].peer not in (None, ctx.backend) and seed is None:
        result.headline += "; " + onnxruntime_peer(ctx, result, feeds, want["fp64"], rules)
    result.summary.insert(0, result.headline)
    return vs["fp64"]


PEER = "onnxruntime_int8"  # the int8 point's peer: onnxruntime's dynamic quantization of the same .onnx


def onnxruntime_peer(ctx: Context, result: Result, feeds: Mapping[str, np.ndarray], fp64: dict, rules: verify.Rules) -> str:
    """onnxruntime's own int8 beside the torch int8 point, on the same feeds, compared with the same fp64 reference
    under the same limits: metrics `onnxruntime_int8/<stem>/vs_fp64/...` and its latency, reported (the point's verdict
    is torch's); without a .onnx, or where it cannot run, the reason. Returns its part of the headline."""
    if ctx.model.onnx_path is None:
        why = "no .onnx beside the model (model.onnx=<file.onnx>)"
    else:
        try:
            peer = build(ctx, DTYPES[ctx.dtype].peer)
        except Unsupported as exc:
            why = str(exc)
        else:
            side = Result()
            vs = verify.compare(run_feeds(peer, feeds), fp64, rules)
            latency(peer, ctx, feeds, side)
            result.metrics.update({f"{PEER}/{k}": v for k, v in {**vs.metrics("fp64"), **side.metrics}.items()})
            result.metrics[f"{PEER}/passed"] = float(vs.passed)
            line = point_line(vs, side, ctx).split("; fingerprint")[0].replace("vs cpu fp64 (int8 limits)", "vs cpu fp64")
            result.details[PEER] = {"status": "passed" if vs.passed else "failed", "failures": vs.failures, "graph": peer.name}
            return f"onnxruntime int8 {line}"
    result.details[PEER] = {"status": "skipped", "reason": why}
    return f"onnxruntime int8 skipped: {why}"


def verify_rollout(ctx: Context, result: Result, runner: Runner, feeds: Mapping[str, np.ndarray],
                   outputs: Mapping[str, np.ndarray], seed: int | None = None, flat_seed: bool = True,
                   decimals: int | None = None) -> Comparison:
    """`verify_point` for a rollout: its outputs [T, envs, *] by file stem against the references on the inputs it saw
    ([T, envs, d] by ML-Agents name). Without memory the T x envs rows run as one batch (sampled: one draw with `seed`,
    as an open loop draws; `flat_seed=False`: step t draws with seed + t, as a closed loop does), else step by step."""
    sampled, got = seed is not None, {}
    for out in DECLARED:  # the rollout names a sampled output by its deterministic twin's stem
        if out.stem in outputs:
            a = outputs[out.stem]
            got[out.sampled if sampled and out.sampled else out.name] = a[..., None, :] if out.rule == "memory" else a
    if not runner.memory_size and (not sampled or flat_seed):
        lead = feeds["obs_0"].shape[:2]
        feeds = {k: v.reshape(-1, *v.shape[2:]) for k, v in feeds.items()}
        got = {k: v.reshape(int(np.prod(lead)), *v.shape[2:]) for k, v in got.items()}
    return verify_point(ctx, result, runner, feeds, got, seed, decimals)


def distributions(runner: Runner, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """mu, log_sigma, masked_logits of a torch runner on the feeds (a sequence: its own memory carried); none for others."""
    try:
        out = over_steps(runner.distributions, feeds, runner.memory_size)
    except Unsupported:  # onnxruntime: the graph's outputs only
        return {}
    return {k: v for k, v in out.items() if k in DISTRIBUTIONS}


def point_line(vs64: Comparison, result: Result, ctx: Context) -> str:
    """`PASS vs fp64: actions max_abs 3.1e-07 (limit 1e-05), cosine 1.000000 (limit 0.99999); p50 52 µs; fp 1a2b3c4d`."""
    parts = []
    for stem, oc in vs64.outputs.items():
        m = oc.metrics
        if oc.output.rule in ("continuous", "memory"):
            text = f"{stem} max_abs {m.get('max_abs', float('nan')):.2g} (limit {m.get('max_abs_limit', float('nan')):.2g})"
            if oc.output.rule == "continuous":
                text += f", cosine {m.get('cosine_min_row', float('nan')):.6f} (limit {m.get('cosine_min_row_limit', -1):g})"
            parts.append(text + _policy_units(m))
        elif oc.output.rule == "discrete":
            parts.append(f"{stem} agreement {m.get('agreement', float('nan')):.2%} "
                         f"({int(m.get('flips_beyond_margin', 0))} flips beyond margin {m.get('margin_limit', 0):g})" + _policy_units(m))
    verdict = "PASS" if vs64.passed else "FAIL"
    judged = f"plan {ctx.precision_plan.name}, {ctx.judged_dtype}" if ctx.precision_plan else ctx.dtype
    line = f"{verdict} vs cpu fp64 ({judged} limits): " + "; ".join(parts)
    if result.latency:
        line += f"; p50 {result.latency['p50_us']:,.0f} µs" + (" (noisy)" if result.latency.get("noisy") else "")
    return line + f"; fingerprint {result.tags.get(verify.FINGERPRINT, '')[:12]}"


def _policy_units(m: dict) -> str:
    """`, KL 2e-03 (limit 0.01), |Δμ|/σ 0.04 (limit 0.1)`: what the engine judged in the policy's units, if anything."""
    names = (("kl_max", "KL"), ("mean_shift_sigma_max", "|Δμ|/σ"))
    return "".join(f", {what} {m[k]:.2g} (limit {m[k + '_limit']:g})" for k, what in names if k + "_limit" in m)
