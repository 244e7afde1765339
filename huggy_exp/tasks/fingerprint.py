"""`fingerprint`: SHA-256 of the exact output bytes over T steps, and a quantized one.
Described in docs/modes.md#fingerprint."""

from __future__ import annotations

import numpy as np

from huggy_exp import rollout
from huggy_exp.config import FingerprintMode
from huggy_exp.context import Context
from huggy_exp.dynamics import Dynamics
from huggy_exp.errors import UserError
from huggy_exp.results import Result
from huggy_exp.runners import Runner, build, reference
from huggy_exp.tasks import Task, first_step, is_sequence, latency, verify_rollout
from huggy_exp import verify
from huggy_exp.verify import quantize


def output_sequences(runner: Runner, ctx: Context, m: FingerprintMode) -> tuple[dict[str, np.ndarray], dict]:
    """The inputs the policy saw [T, envs, d] by ML-Agents name, and every output [T, envs, *] by file name (actions,
    discrete_actions, memories): open-loop over the observation source (steps x envs rows, or a file's [T, N, d]
    sequence), or closed-loop through `mode.dynamics`."""
    w, steps, envs = ctx.weights, m.steps, m.envs
    if m.loop == "open":
        feeds = ctx.make_feeds(steps * envs)
        if not is_sequence(feeds):
            rows = len(feeds["obs_0"])
            if rows % envs:
                raise UserError(f"mode.envs={envs} does not divide the {rows} observation rows of the file")
            feeds = {k: v.reshape(rows // envs, envs, v.shape[-1]) for k, v in feeds.items()}
        return feeds, rollout.open_loop(runner, feeds, m.actions, ctx.seed)
    start = first_step(ctx.make_feeds(envs))
    dynamics = Dynamics(seed=ctx.seed, **vars(m.dynamics))
    observations, outputs = rollout.closed_loop(runner, w, start, steps, dynamics, m.actions, ctx.seed)
    return rollout.seen(observations, start, w), outputs


def first_divergence(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float] | None:
    """(step, dimension, |difference|) of the first element where two [T, envs, dim] sequences part."""
    differ = a != b
    if not differ.any():
        return None
    t, env, dim = map(int, np.argwhere(differ)[0])
    return t, dim, float(abs(np.float64(a[t, env, dim]) - np.float64(b[t, env, dim])))


class FingerprintTask(Task):
    mode: FingerprintMode

    def run(self, ctx: Context) -> Result:
        m, decimals = self.mode, self.mode.decimals
        runner = build(ctx)
        seen, mine = output_sequences(runner, ctx, m)
        _, ref = output_sequences(reference(ctx, "fp32", ctx.batch_size), ctx, m)
        names = list(mine)  # actions, discrete_actions, memories: whichever the policy has, in that order
        exact = {n: first_divergence(mine[n], ref[n]) for n in names}
        quant = {n: first_divergence(quantize(mine[n], decimals), quantize(ref[n], decimals)) for n in names}
        fp = verify.fingerprint(mine, decimals)  # the point's tags are verify_rollout's: the same hashes
        fp.update({f"cpu_fp32_{k}": v for k, v in verify.fingerprint(ref, decimals).items()})
        steps, envs = mine[names[0]].shape[:2]
        first_exact, first_quant = _first(exact), _first(quant)
        result = Result(arrays={n: (a.reshape(len(a), -1) if m.envs == 1 and a.shape[1] == 1 else a) for n, a in mine.items()})
        result.metrics = {"steps": float(steps),
                          **_divergence_metrics(mine, ref, names, exact, quant, first_exact[1] if first_exact else None)}
        for n in names if len(names) > 1 else ():  # each output on its own too
            each = _divergence_metrics(mine, ref, [n], exact, quant, exact[n])
            result.metrics.update({f"{n}/{k}": v for k, v in each.items()})
        result.tags.update({k: v for k, v in fp.items() if k.startswith("cpu_fp32_")})
        where, qwhere = _where(first_exact, first_quant, names)
        headline = (f"fingerprint {fp[verify.FINGERPRINT][:12]}, quantized_fingerprint({decimals}) "
                    f"{fp[verify.QUANTIZED][:12]}: {where}; {qwhere}")
        as_dict = lambda d: None if d is None else dict(zip(("step", "dim", "abs"), d[1]), **({"output": d[0]} if len(names) > 1 else {}))  # noqa: E731
        result.details.update({**fp, "loop": m.loop, "actions": m.actions, "decimals": decimals,
                               "outputs": names, "first_divergence": as_dict(first_exact), "first_quantized_divergence": as_dict(first_quant)})
        latency(runner, ctx, ctx.feeds, result)
        verify_rollout(ctx, result, runner, seen, mine, ctx.seed if m.actions == "sampled" else None, m.loop == "open",
                       decimals)
        result.headline += f"; {headline}"
        result.summary[1:1] = [f"{m.loop}-loop, {m.actions} {'actions' if names == ['actions'] else 'outputs (' + ', '.join(names) + ')'}, {steps} steps x {envs} env(s) on {ctx.device} {ctx.dtype}"
                          + (", memory carried from zeros" if "memories" in names else ""), headline]
        if ctx.dtype in m.require_match and first_quant is not None:
            result.fail(f"quantized fingerprint differs from CPU fp32 ({qwhere}, by {first_quant[1][2] / 10**decimals:.3g})")
        return result


def _where(first_exact, first_quant, names: list[str]) -> tuple[str, str]:
    """Where the fingerprint (exact, then quantized) first parts from CPU fp32's, in words."""
    where = "equals the CPU fp32 fingerprint" if first_exact is None else (
        f"parts from CPU fp32 at step {first_exact[1][0]}, {_what(first_exact[0], names)} {first_exact[1][1]} by {first_exact[1][2]:.3g}")
    qwhere = "quantized equal" if first_quant is None else (
        f"quantized parts at step {first_quant[1][0]}, {_what(first_quant[0], names)} {first_quant[1][1]}")
    return where, qwhere


def _first(found: dict[str, tuple | None]) -> tuple[str, tuple[int, int, float]] | None:
    """The (output, divergence) at the earliest step, the first output in order at a tie."""
    hit = min(((d[0], i, name, d) for i, (name, d) in enumerate(found.items()) if d is not None), default=None)
    return None if hit is None else hit[2:]


def _what(output: str, names: list[str]) -> str:
    return {"actions": "action", "discrete_actions": "branch", "memories": "memory unit"}[output] if len(names) > 1 else "action"


def _divergence_metrics(mine: dict, ref: dict, names: list[str], exact: dict, quant: dict,
                        exact_hit: tuple[int, int, float] | None) -> dict[str, float]:
    """Match flags and the first exact divergence (step, dim, |Δ|) of `names`."""
    return {
        "matches_cpu_fp32": float(all(exact[n] is None for n in names)),
        "quantized_matches_cpu_fp32": float(all(quant[n] is None for n in names)),
        "first_divergence_step": float(exact_hit[0]) if exact_hit else -1.0,
        "first_divergence_dim": float(exact_hit[1]) if exact_hit else -1.0,
        "first_divergence_abs": exact_hit[2] if exact_hit else 0.0,
        "max_abs_vs_cpu_fp32": max(float(np.max(np.abs(mine[n].astype(np.float64) - ref[n]), initial=0.0)) for n in names),
    }
