"""`stats`: a closed-loop rollout, action statistics and drift vs CPU fp32. Described in docs/modes.md#stats."""

from __future__ import annotations

import numpy as np

from huggy_exp import plots, rollout
from huggy_exp.config import StatsMode
from huggy_exp.context import Context
from huggy_exp.dynamics import Dynamics
from huggy_exp.mlagents import NORMALIZER_CLAMP
from huggy_exp.numerics import discrete_histogram
from huggy_exp.observations import load_feeds, load_observations
from huggy_exp.results import Result
from huggy_exp.runners import Runner, build, reference
from huggy_exp.tasks import Task, first_step, latency, verify_rollout


class StatsTask(Task):
    mode: StatsMode

    def _rollout(self, runner: Runner, ctx: Context) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The inputs the policy saw [T, envs, d] by ML-Agents name and every output [T, envs, *] (actions,
        discrete_actions, memories)."""
        w, m = ctx.weights, self.mode
        if m.source == "replay":
            if str(m.trajectory).endswith(".npz"):
                feeds = {k: (v[:, None] if v.ndim == 2 else v) for k, v in load_feeds(m.trajectory, w).items()}  # [T, d] is one env
            else:
                feeds = rollout.split(load_observations(m.trajectory, w.obs_dim)[:, None, :], w)
            return feeds, rollout.open_loop(runner, feeds)
        start = first_step(ctx.make_feeds(m.envs))  # a file: its rows (a sequence: step 0)
        observations, outputs = rollout.closed_loop(runner, w, start, m.steps, Dynamics(seed=ctx.seed, **vars(m.dynamics)))
        return rollout.seen(observations, start, w), outputs

    def run(self, ctx: Context) -> Result:
        w, m = ctx.weights, self.mode
        # --- build runners, roll out on the device and on the CPU fp32 reference
        runner = build(ctx)
        seen, out = self._rollout(runner, ctx)
        ref_seen, ref = self._rollout(reference(ctx, "fp32", ctx.batch_size), ctx)
        obs, ref_obs = rollout.side_by_side(seen, w), rollout.side_by_side(ref_seen, w)
        steps, envs = obs.shape[:2]
        # --- compare: each output's drift against the reference, step by step
        metrics = {"steps": float(steps), "envs": float(envs)}
        tables, parts, rows = {}, [], [{"step": t} for t in range(steps)]
        drift, first = self.continuous(out, ref, metrics, tables, rows) if "actions" in out else (None, -1)
        clamp_rate = self.normalizers(w, obs, ref_obs, drift, first, metrics)
        discrete_drift = discrete(w, out, ref, metrics, tables, rows, parts) if "discrete_actions" in out else None
        if "memories" in out:
            memories(out, ref, metrics, rows, parts)
        tables["drift"] = rows
        result = Result(metrics=metrics, tables=tables, arrays={**out, "observations": obs})
        if drift is not None:
            passed = "never" if first < 0 else f"first at step {first}"
            parts.insert(0, f"drift_max {metrics['drift_max']:.3g} vs CPU fp32 (threshold {m.drift_threshold:g}: {passed}); "
                            f"saturation {metrics['saturation_rate']:.1%}, smoothness {metrics['smoothness']:.3f}")
        headline = "; ".join(parts) + (", " if drift is not None else "; ") + f"normalizer clamp {clamp_rate:.1%}"
        # --- judge: the engine's verdict on the rollout, then the drift limit
        latency(runner, ctx, ctx.feeds, result)
        verify_rollout(ctx, result, runner, seen, out)
        result.headline += f"; {headline}"
        result.summary[1:1] = [f"{m.source} rollout: {steps} steps x {envs} env(s) on {ctx.device} {ctx.dtype}"
                               + (", memory carried from zeros" if "memories" in out else ""), headline]
        if "discrete_actions" in out:
            for b in range(len(w.branch_sizes)):
                result.summary.append(f"branch {b} action shares: "
                                      + ", ".join(f"{r['share']:.1%}" for r in tables["discrete_histogram"] if r["branch"] == b))
        self.judge_drift(result, drift, discrete_drift)
        self.plot(ctx, result, out, ref, drift, discrete_drift)
        return result

    def continuous(self, out: dict, ref: dict, metrics: dict, tables: dict, rows: list[dict]) -> tuple[np.ndarray, int]:
        """Continuous actions per dimension over time and environments, and their drift against the CPU fp32 rollout:
        (drift per step, the first step over the threshold or -1)."""
        a, saturation = out["actions"].astype(np.float64), self.mode.saturation
        flat = a.reshape(-1, a.shape[-1])
        delta = np.abs(np.diff(a, axis=0)).reshape(-1, a.shape[-1]) if len(a) > 1 else np.zeros((1, a.shape[-1]))
        tables["action_stats"] = [{"dim": j, "mean": flat[:, j].mean(), "std": flat[:, j].std(), "min": flat[:, j].min(), "max": flat[:, j].max(),
                                   "saturation_rate": np.mean(np.abs(flat[:, j]) >= saturation), "smoothness": delta[:, j].mean()}
                                  for j in range(flat.shape[1])]
        drift = np.abs(a - ref["actions"].astype(np.float64)).max(axis=(1, 2))
        over = np.nonzero(drift > self.mode.drift_threshold)[0]
        metrics.update({"action_mean": float(flat.mean()), "action_std": float(flat.std()),
                        "saturation_rate": float(np.mean(np.abs(flat) >= saturation)), "smoothness": float(delta.mean())})
        for row, d in zip(rows, drift):
            row["drift"] = d
        return drift, int(over[0]) if over.size else -1

    @staticmethod
    def normalizers(w, obs: np.ndarray, ref_obs: np.ndarray, drift: np.ndarray | None, first: int, metrics: dict) -> float:
        """How often each input's ±5 normalizer clamp is hit (returned), the action drift's figures, and how far the
        observations drifted (in the normalizer's standard deviations)."""
        scale, normalized, clamp_rate = rollout.input_scale(w), rollout.normalized_dims(w), 0.0
        if scale is not None and normalized.any():
            z = np.clip((obs.astype(np.float32) - scale.running_mean) / scale.std, -NORMALIZER_CLAMP, NORMALIZER_CLAMP)
            clamp_rate = float(np.mean(np.abs(z[..., normalized]) >= NORMALIZER_CLAMP))
        metrics["normalizer_clamp_rate"] = clamp_rate
        if drift is not None:
            metrics.update({"drift_max": float(drift.max()), "drift_first_step": float(first), "drift_final": float(drift[-1])})
        obs_drift = np.abs(obs.astype(np.float64) - ref_obs) / (scale.std.astype(np.float64) if scale is not None else 1.0)
        metrics["obs_drift_max"] = float(obs_drift.max())
        return clamp_rate

    def judge_drift(self, result: Result, drift: np.ndarray | None, discrete_drift: np.ndarray | None) -> None:
        """`mode.drift_fail`: the closed-loop drift (continuous, and the share of discrete decisions) fails over it."""
        limit, m = self.mode.drift_fail, result.metrics
        if limit is None:
            return
        if drift is not None and m["drift_max"] > limit:
            result.fail(f"closed-loop drift {m['drift_max']:.3g} > {limit:g}")
        if discrete_drift is not None and m["discrete_drift_max"] > limit:
            result.fail(f"closed-loop discrete drift: {m['discrete_drift_max']:.1%} of a step's decisions differ from CPU fp32 "
                        f"(> {limit:g})")

    def plot(self, ctx: Context, result: Result, out: dict, ref: dict, drift: np.ndarray | None,
             discrete_drift: np.ndarray | None) -> None:
        """drift.png (per step, against CPU fp32) and actions.png (env 0's first actions or branches, both runs)."""
        if not ctx.plots:
            return
        curves = {name: d for name, d in ((f"{ctx.device} {ctx.dtype} vs cpu fp32", drift),
                                          ("discrete decisions differing (share)", discrete_drift)) if d is not None}
        result.files.append(plots.lines(ctx.workdir / "drift.png", curves, "step",
                                        "max |action difference|" if drift is not None else "share",
                                        "closed-loop drift", self.mode.drift_threshold, log=drift is not None))
        name, label = ("actions", "a{}") if "actions" in out else ("discrete_actions", "branch {}")  # env 0's first 4
        traces = {f"{label.format(j)} {who}": run[name][:, 0, j] for who, run in ((ctx.dtype, out), ("cpu fp32", ref))
                  for j in range(min(4, out[name].shape[-1]))}
        result.files.append(plots.lines(ctx.workdir / "actions.png", traces, "step", "action", "action traces, env 0"))


def discrete(w, out: dict, ref: dict, metrics: dict, tables: dict, rows: list[dict], parts: list[str]) -> np.ndarray:
    """The share of each action per branch, and the decisions that differ from the CPU fp32 rollout (per step)."""
    shares, tables["discrete_histogram"] = discrete_histogram(out["discrete_actions"], w.branch_sizes)
    metrics.update(shares)
    differ = out["discrete_actions"] != ref["discrete_actions"]
    discrete_drift = differ.reshape(len(differ), -1).mean(axis=1)
    flipped = np.nonzero(discrete_drift > 0)[0]
    metrics.update({"discrete_agreement": float(1.0 - differ.mean()), "discrete_drift_max": float(discrete_drift.max()),
                    "discrete_first_flip_step": float(flipped[0]) if flipped.size else -1.0})
    for row, d in zip(rows, discrete_drift):
        row["discrete_disagreement"] = float(d)
    parts.append(f"discrete agreement {metrics['discrete_agreement']:.2%} vs CPU fp32 "
                 f"({'no flip' if not flipped.size else f'first flip at step {int(flipped[0])}'})")
    return discrete_drift


def memories(out: dict, ref: dict, metrics: dict, rows: list[dict], parts: list[str]) -> None:
    """The memories, carried from zeros: their size and their drift from the CPU fp32 rollout's."""
    memory_drift = np.abs(out["memories"].astype(np.float64) - ref["memories"]).max(axis=(1, 2))
    metrics.update({"memory_abs_max": float(np.abs(out["memories"]).max()), "memory_drift_max": float(memory_drift.max())})
    for row, d in zip(rows, memory_drift):
        row["memory_drift"] = float(d)
    parts.append(f"memory drift {metrics['memory_drift_max']:.3g} (|memory| up to {metrics['memory_abs_max']:.3g})")
