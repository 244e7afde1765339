"""`action` and `sample`: deterministic and sampled outputs of every head. Described in docs/modes.md#action."""

from __future__ import annotations

import numpy as np

from huggy_exp.config import SampleMode
from huggy_exp.context import Context
from huggy_exp.mlagents import RECURRENT_OUT
from huggy_exp.numerics import action_stats, discrete_histogram
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, DISCRETE, DISCRETE_SAMPLED, SAMPLED, build, run_feeds
from huggy_exp.tasks import Task, is_sequence, latency, verify_point
from huggy_exp.verify import DECLARED


class ActionTask(Task):
    """`action` (deterministic outputs) and `sample` (sampled, with the job's seed: its mode is a SampleMode)."""

    def run(self, ctx: Context) -> Result:
        seed = ctx.seed if isinstance(self.mode, SampleMode) else None
        runner = build(ctx)
        out = run_feeds(runner, ctx.feeds, seed)
        actions, discrete = (ACTIONS, DISCRETE) if seed is None else (SAMPLED, DISCRETE_SAMPLED)
        result = _actions_result(ctx.feeds, out.get(actions), out.get(discrete), out.get(RECURRENT_OUT),
                                 "deterministic" if seed is None else f"sampled (seed {seed})")
        latency(runner, ctx, ctx.feeds, result)
        verify_point(ctx, result, runner, ctx.feeds, out, seed)
        return result


def _actions_result(feeds: dict, actions: np.ndarray | None, discrete: np.ndarray | None, memory: np.ndarray | None,
                    kind: str) -> Result:
    arrays = {o.stem: o.stored(v) for o, v in zip(DECLARED, (actions, discrete, memory)) if v is not None}
    first = next(iter(arrays.values()))
    sequence = is_sequence(feeds)
    rows = first.shape[1] if sequence else first.shape[0]
    metrics, summary, table = {"rows": float(rows)}, [], []
    if sequence:
        metrics["steps"] = float(first.shape[0])
        summary.append(f"sequence of {first.shape[0]} steps x {rows} agents, memory carried from zeros")
    if actions is not None:
        stats = action_stats(actions)
        metrics.update(stats)
        summary.append(f"{kind} actions {'x'.join(map(str, actions.shape))}: mean {stats['action_mean']:+.4f}, std {stats['action_std']:.4f}, "
                       f"range [{stats['action_min']:+.4f}, {stats['action_max']:+.4f}], saturated {stats['saturated_share']:.1%}")
    if discrete is not None:
        shares, table = discrete_histogram(discrete)
        metrics.update(shares)
        for b in range(discrete.shape[-1]):
            summary.append(f"{kind} discrete actions, branch {b}: counts {[r['count'] for r in table if r['branch'] == b]}")
    if memory is not None:
        metrics["memory_abs_max"] = float(np.abs(memory).max())
        summary.append(f"memories {'x'.join(map(str, arrays['memories'].shape))}: max |memory| {metrics['memory_abs_max']:.3g}")
    inputs = {"obs": feeds["obs_0"]} if list(feeds) == ["obs_0"] else dict(feeds)
    return Result(metrics=metrics, arrays={**arrays, **inputs}, summary=summary,  # its fingerprint: verify_point's
                  tables={"discrete_histogram": table} if table else {})
