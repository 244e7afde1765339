"""`stats`: a closed-loop rollout (surrogate dynamics or a replayed trajectory): action statistics and drift vs CPU fp32."""

from __future__ import annotations

import numpy as np

from huggy_exp import plots
from huggy_exp.context import Context
from huggy_exp.dynamics import Dynamics
from huggy_exp.errors import UserError
from huggy_exp.mlagents import NORMALIZER_CLAMP
from huggy_exp.observations import load_observations
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, Runner, build, reference

SOURCES = ("dynamics", "replay")


class StatsTask:
    name = "stats"

    def __init__(self, steps: int = 200, envs: int = 8, source: str = "dynamics", trajectory: str | None = None,
                 drift_threshold: float = 0.05, drift_fail: float | None = None, saturation: float = 0.999,
                 dynamics: dict | None = None):
        if source not in SOURCES:
            raise UserError(f"unknown mode.source {source!r}; valid: {', '.join(SOURCES)}")
        if source == "replay" and not trajectory:
            raise UserError("mode.source=replay needs mode.trajectory=<file.npy> (float32 [T, obs_dim])")
        self.steps, self.envs, self.source, self.trajectory = int(steps), int(envs), source, trajectory
        self.drift_threshold, self.drift_fail, self.saturation = drift_threshold, drift_fail, saturation
        self.dynamics = dict(dynamics or {})

    def _rollout(self, runner: Runner, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
        """Observations and actions, both [T, envs, *]."""
        policy = lambda obs: runner.infer(obs)[ACTIONS].astype(np.float32)  # noqa: E731
        if self.source == "replay":
            obs = load_observations(self.trajectory, ctx.weights.obs_dim)[:, None, :]
            return obs, policy(obs[:, 0]).reshape(len(obs), 1, -1)
        start = ctx.make_observations(self.envs)
        return Dynamics(seed=ctx.seed, **self.dynamics).rollout(policy, start, self.steps, ctx.weights.normalizer, ctx.weights.act_dim)

    def run(self, ctx: Context) -> Result:
        ctx.require_huggy_shape(self.name)
        obs, actions = self._rollout(build(ctx), ctx)
        ref_obs, ref_actions = self._rollout(reference(ctx, "fp32", ctx.batch_size), ctx)
        a = actions.astype(np.float64)

        # --- per action dimension, over time and environments
        flat = a.reshape(-1, a.shape[-1])
        delta = np.abs(np.diff(a, axis=0)).reshape(-1, a.shape[-1]) if len(a) > 1 else np.zeros((1, a.shape[-1]))
        rows = [{"dim": j, "mean": flat[:, j].mean(), "std": flat[:, j].std(), "min": flat[:, j].min(), "max": flat[:, j].max(),
                 "saturation_rate": np.mean(np.abs(flat[:, j]) >= self.saturation), "smoothness": delta[:, j].mean()}
                for j in range(flat.shape[1])]
        n = ctx.weights.normalizer
        if n is not None:
            z = np.clip((obs.astype(np.float32) - n.running_mean) / n.std, -NORMALIZER_CLAMP, NORMALIZER_CLAMP)
            clamp_rate = float(np.mean(np.abs(z) >= NORMALIZER_CLAMP))
        else:
            clamp_rate = 0.0

        # --- closed-loop drift against the CPU fp32 rollout from the same start
        drift = np.abs(a - ref_actions.astype(np.float64)).max(axis=(1, 2))
        over = np.nonzero(drift > self.drift_threshold)[0]
        first = int(over[0]) if over.size else -1
        obs_drift = np.abs(obs.astype(np.float64) - ref_obs) / (n.std.astype(np.float64) if n is not None else 1.0)
        metrics = {
            "steps": float(len(a)), "envs": float(a.shape[1]),
            "action_mean": float(flat.mean()), "action_std": float(flat.std()),
            "saturation_rate": float(np.mean(np.abs(flat) >= self.saturation)), "smoothness": float(delta.mean()),
            "normalizer_clamp_rate": clamp_rate,
            "drift_max": float(drift.max()), "drift_first_step": float(first), "drift_final": float(drift[-1]),
            "obs_drift_max": float(obs_drift.max()),
        }
        result = Result(metrics=metrics, tables={"action_stats": rows, "drift": [{"step": t, "drift": d} for t, d in enumerate(drift)]},
                        arrays={"actions": actions, "observations": obs})
        passed = "never" if first < 0 else f"first at step {first}"
        headline = (f"drift_max {metrics['drift_max']:.3g} vs CPU fp32 (threshold {self.drift_threshold:g}: {passed}); "
                    f"saturation {metrics['saturation_rate']:.1%}, smoothness {metrics['smoothness']:.3f}, "
                    f"normalizer clamp {clamp_rate:.1%}")
        result.details["headline"] = headline
        result.summary = [f"{self.source} rollout: {len(a)} steps x {a.shape[1]} env(s) on {ctx.device} {ctx.dtype}", headline]
        if self.drift_fail is not None and metrics["drift_max"] > self.drift_fail:
            result.fail(f"closed-loop drift {metrics['drift_max']:.3g} > {self.drift_fail:g}")

        # --- plots
        wd = ctx.workdir
        result.files.append(plots.lines(wd / "drift.png", {f"{ctx.device} {ctx.dtype} vs cpu fp32": drift}, "step",
                                        "max |action difference|", "closed-loop drift", self.drift_threshold, log=True))
        dims = range(min(4, a.shape[-1]))
        traces = {**{f"a{j} {ctx.dtype}": a[:, 0, j] for j in dims}, **{f"a{j} cpu fp32": ref_actions[:, 0, j] for j in dims}}
        result.files.append(plots.lines(wd / "actions.png", traces, "step", "action", "action traces, env 0"))
        return result
