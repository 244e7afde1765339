"""`fingerprint`: SHA-256 of the exact action bytes over T deterministic steps, plus a quantized one for cross-device use."""

from __future__ import annotations

import hashlib

import numpy as np

from huggy_exp.context import Context
from huggy_exp.dynamics import Dynamics
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, SAMPLED, Runner, build, reference

LOOPS = ("open", "closed")
KINDS = ("deterministic", "sampled")


def action_sequence(runner: Runner, ctx: Context, loop: str, kind: str, steps: int, envs: int,
                    dynamics: Dynamics) -> np.ndarray:
    """Actions [T, envs, act] float32: open-loop over the observation source, or closed-loop through `dynamics`."""
    if kind == "sampled" and not hasattr(runner, "sample"):
        raise Unsupported(f"backend {ctx.backend}: sampled actions take the seeded CPU noise, which only the torch backends accept")

    def act(obs: np.ndarray, t: int) -> np.ndarray:
        if kind == "sampled":
            return runner.sample(obs, ctx.seed + t)[SAMPLED].astype(np.float32)
        return runner.infer(obs)[ACTIONS].astype(np.float32)

    if loop == "open":
        obs = ctx.make_observations(steps * envs)
        return act(obs, 0).reshape(-1, envs, ctx.weights.act_dim)
    start = ctx.make_observations(envs)
    counter = iter(range(steps))
    _, actions = dynamics.rollout(lambda o: act(o, next(counter)), start, steps, ctx.weights.normalizer, ctx.weights.act_dim)
    return actions


def quantize(actions: np.ndarray, decimals: int) -> np.ndarray:
    """round(a * 10^decimals) as int64: -0.0 and +0.0 agree, as do values equal to `decimals` places."""
    return np.rint(np.asarray(actions, np.float64) * 10**decimals).astype(np.int64)


def first_divergence(a: np.ndarray, b: np.ndarray) -> tuple[int, int, float] | None:
    """(step, action dimension, |difference|) of the first element where two [T, envs, act] sequences part."""
    differ = a != b
    if not differ.any():
        return None
    t, env, dim = map(int, np.argwhere(differ)[0])
    return t, dim, float(abs(np.float64(a[t, env, dim]) - np.float64(b[t, env, dim])))


class FingerprintTask:
    name = "fingerprint"

    def __init__(self, steps: int = 256, loop: str = "open", actions: str = "deterministic", envs: int = 1,
                 decimals: int = 3, require_match: list[str] | None = None, dynamics: dict | None = None):
        if loop not in LOOPS:
            raise UserError(f"unknown mode.loop {loop!r}; valid: {', '.join(LOOPS)}")
        if actions not in KINDS:
            raise UserError(f"unknown mode.actions {actions!r}; valid: {', '.join(KINDS)}")
        self.steps, self.loop, self.kind, self.envs, self.decimals = int(steps), loop, actions, int(envs), int(decimals)
        self.require_match = list(require_match if require_match is not None else ["fp32"])
        self.dynamics = dict(dynamics or {})

    def run(self, ctx: Context) -> Result:
        ctx.require_huggy_shape(self.name)
        dynamics = Dynamics(seed=ctx.seed, **self.dynamics)
        mine = action_sequence(build(ctx), ctx, self.loop, self.kind, self.steps, self.envs, dynamics)
        ref = action_sequence(reference(ctx, "fp32", ctx.batch_size), ctx, self.loop, self.kind, self.steps, self.envs, dynamics)
        digest = hashlib.sha256(mine.tobytes()).hexdigest()
        qdigest = hashlib.sha256(quantize(mine, self.decimals).tobytes()).hexdigest()
        ref_digest = hashlib.sha256(ref.tobytes()).hexdigest()
        ref_qdigest = hashlib.sha256(quantize(ref, self.decimals).tobytes()).hexdigest()
        exact = first_divergence(mine, ref)
        quant = first_divergence(quantize(mine, self.decimals), quantize(ref, self.decimals))
        result = Result(arrays={"actions": mine.reshape(len(mine), -1) if self.envs == 1 else mine})
        result.metrics = {
            "steps": float(len(mine)),
            "matches_cpu_fp32": float(exact is None),
            "quantized_matches_cpu_fp32": float(quant is None),
            "first_divergence_step": float(exact[0]) if exact else -1.0,
            "first_divergence_dim": float(exact[1]) if exact else -1.0,
            "first_divergence_abs": exact[2] if exact else 0.0,
            "max_abs_vs_cpu_fp32": float(np.max(np.abs(mine.astype(np.float64) - ref))),
        }
        fp = {"fingerprint_sha256": digest, "fingerprint_quantized": qdigest,
              "cpu_fp32_sha256": ref_digest, "cpu_fp32_quantized": ref_qdigest}
        result.tags.update(fp)
        where = "equals the CPU fp32 fingerprint" if exact is None else (
            f"parts from CPU fp32 at step {exact[0]}, action {exact[1]} by {exact[2]:.3g}")
        qwhere = "quantized equal" if quant is None else f"quantized parts at step {quant[0]}, action {quant[1]}"
        headline = f"sha256 {digest[:16]}.. quantized({self.decimals}) {qdigest[:16]}..: {where}; {qwhere}"
        result.details.update({**fp, "loop": self.loop, "actions": self.kind, "decimals": self.decimals, "headline": headline,
                               "first_divergence": None if exact is None else dict(zip(("step", "dim", "abs"), exact)),
                               "first_quantized_divergence": None if quant is None else dict(zip(("step", "dim", "abs"), quant))})
        result.summary = [f"{self.loop}-loop, {self.kind} actions, {len(mine)} steps x {self.envs} env(s) on {ctx.device} {ctx.dtype}", headline]
        if ctx.dtype in self.require_match and quant is not None:
            result.fail(f"quantized fingerprint differs from CPU fp32 ({qwhere}, by {quant[2] / 10**self.decimals:.3g})")
        return result
