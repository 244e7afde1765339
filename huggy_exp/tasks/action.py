"""`action` and `sample`: deterministic / sampled actions for the observations, written as actions.npy (float32)."""

from __future__ import annotations

import hashlib

import numpy as np

from huggy_exp.context import Context
from huggy_exp.numerics import action_stats
from huggy_exp.results import Result
from huggy_exp.errors import Unsupported
from huggy_exp.runners import ACTIONS, SAMPLED, build
from huggy_exp.tasks import latency


class ActionTask:
    name = "action"

    def run(self, ctx: Context) -> Result:
        runner = build(ctx)
        actions = runner.infer(ctx.observations)[ACTIONS].astype(np.float32)
        result = _actions_result(ctx.observations, actions, "deterministic")
        latency(runner, ctx, ctx.observations, result)
        return result


class SampleTask:
    name = "sample"

    def run(self, ctx: Context) -> Result:
        runner = build(ctx)
        if not hasattr(runner, "sample"):
            raise Unsupported(f"backend {ctx.backend}: sampled actions take the seeded CPU noise, which only the torch "
                              "backends accept (onnxruntime samples inside the graph: see mode=onnx-compare)")
        actions = runner.sample(ctx.observations, ctx.seed)[SAMPLED].astype(np.float32)
        result = _actions_result(ctx.observations, actions, f"sampled (seed {ctx.seed})")
        latency(runner, ctx, ctx.observations, result)
        return result


def _actions_result(obs: np.ndarray, actions: np.ndarray, kind: str) -> Result:
    digest = hashlib.sha256(actions.tobytes()).hexdigest()
    stats = action_stats(actions)
    summary = [
        f"{kind} actions {actions.shape[0]}x{actions.shape[1]}: mean {stats['action_mean']:+.4f}, std {stats['action_std']:.4f}, "
        f"range [{stats['action_min']:+.4f}, {stats['action_max']:+.4f}], saturated {stats['saturated_share']:.1%}",
        f"actions sha256 {digest[:16]}...",
    ]
    return Result(metrics={"rows": float(len(actions)), **stats}, arrays={"actions": actions, "obs": obs},
                  tags={"actions_sha256": digest}, details={"actions_sha256": digest}, summary=summary)
