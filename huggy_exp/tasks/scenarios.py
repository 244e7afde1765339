"""`benchmark`'s scenarios beyond the per-point ladder: MLPerf LoadGen's four (huggy_exp/loadgen.py) and the control
loop (huggy_exp/control_loop.py), run on the job's backend (`backend`, gated against eager like every timed backend).

LoadGen's query sample library is `qsl_samples` rows of the benchmark's feeds (every input; masks all allowed unless
the observation file gives them; zero memory: one decision step per sample), and its responses are checked against
eager's outputs on the same rows, with the gate's tolerance and comparison.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields

import numpy as np

from huggy_exp import control_loop, loadgen, rollout, timing
from huggy_exp.config import SCENARIOS, BenchmarkMode
from huggy_exp.context import Context
from huggy_exp.dynamics import Dynamics
from huggy_exp.mlagents import ACTION_MASKS, PolicyWeights
from huggy_exp.results import Result
from huggy_exp.runners import Runner
from huggy_exp.tasks import first_step
from huggy_exp.tasks.compare import compare_outputs
from huggy_exp.verify import REL_FLOOR

LOADGEN = loadgen.SCENARIOS
CONTROL_LOOP = "control_loop"
NAMES = SCENARIOS


def reference_check(w: PolicyWeights, eager: Runner, feeds: Mapping[str, np.ndarray], tol: float) -> Callable[[np.ndarray, Mapping[str, np.ndarray]], tuple[dict[str, float], list[str]]]:
    """check(qsl_index, responses): the responses LoadGen collected against eager's outputs on those QSL rows, through
    the verification engine with eager's masked logits and the branch sizes (a near-tie flip is excused as anywhere)."""
    expected = eager.infer(feeds)
    logits = eager.distributions(feeds)["masked_logits"] if w.branches else None

    def check(index: np.ndarray, got: Mapping[str, np.ndarray]) -> tuple[dict[str, float], list[str]]:
        want = {k: np.asarray(expected[k])[index] for k in loadgen.CHECKED if k in expected}
        return compare_outputs(dict(got), want, "eager", tol, REL_FLOOR, None if logits is None else logits[index],
                               w.branch_sizes)[:2]

    return check


def run_loadgen(ctx: Context, runner: Runner, eager: Runner, feeds: Mapping[str, np.ndarray], mode: BenchmarkMode,
                tol: float, point: dict[str, float], result: Result, points: list[int]) -> None:
    """LoadGen's scenarios of `mode.scenarios` on the runner; metrics, LoadGen's files, the server search table,
    failures into `result` (a LoadGen run lasts mode.min_duration_ms, else mode.budget_s).

    `point` is timing.py's figures of this runner at the job's batch size (LoadGen's expected latency and QPS); a
    fixed-shape runner (compile, graphs) answers in the batch sizes it was timed at (`points`)."""
    check = reference_check(ctx.weights, eager, feeds, tol)
    scenarios = [s for s in mode.scenarios if s in LOADGEN]
    settings = loadgen.Settings(**{**{f.name: getattr(mode, f.name) for f in fields(loadgen.Settings)},
                                   "min_duration_ms": mode.min_duration_ms or int(mode.budget_s * 1e3)})
    single = point.get("b1_p50_us", point["p50_us"] / ctx.batch_size) * 1e-6
    out = loadgen.run_scenarios(scenarios, runner.infer, feeds, ctx.batch_size, settings, ctx.workdir, single,
                                point["obs_per_s"], check, mode.search_steps, mode.search_ms,
                                point.get("b1_min_us", 0.0) * 1e-6, points if runner.fixed_shape else None)
    result.metrics.update(out.metrics)
    result.files += out.files
    result.summary += out.lines
    if out.search:
        result.tables["server_search"] = out.search
    for failure in out.failures:
        result.fail(failure)
    if out.error:
        result.status, result.reason = "error", "; ".join(filter(None, [result.reason, out.error]))
    if "single_stream" in scenarios and "b1_p50_us" in point:
        lg_p50 = out.metrics["loadgen/single_stream/p50_us"]
        agree = lg_p50 / point["b1_p50_us"]
        result.metrics["loadgen/single_stream/p50_vs_timing"] = agree
        result.metrics["loadgen/single_stream/p50_over_timing_us"] = lg_p50 - point["b1_p50_us"]
        result.summary.append(f"loadgen single_stream p50 vs timing.py b1 p50 on {runner.name}: "
                              f"{lg_p50:,.1f} vs {point['b1_p50_us']:,.1f} µs = {agree:.2f}x (LoadGen's includes its "
                              f"dispatch, the sample's gather and the response copy)")


def run_control_loop(ctx: Context, runner: Runner, mode: BenchmarkMode, result: Result) -> None:
    """The control loop on the runner for the job's batch of agents: metrics `control_loop/...`, the search table."""
    w = ctx.weights
    start = first_step(ctx.make_feeds(ctx.batch_size))  # an observation file gives its rows (a sequence: step 0)
    masks = start.get(ACTION_MASKS)
    width = rollout.action_width(w)
    side = rollout.side_by_side(start, w)
    dynamics = Dynamics(seed=ctx.seed)  # the surrogate world of `stats`, at its default constants

    def make_tick():
        stepper = rollout.Stepper(runner, "deterministic", ctx.seed, masks)
        return lambda obs: rollout.action_vector(stepper(rollout.split(obs, w)), w)

    warm = make_tick()
    timing.warm_up(lambda: warm(side), runner.target.device, 0.2)
    m, tried = control_loop.measure(make_tick, lambda: dynamics.world(side, rollout.input_scale(w), width), width, mode)
    m["agents"], m["memory"] = float(len(side)), float(bool(w.memory))
    result.metrics.update({f"control_loop/{k}": v for k, v in m.items()})
    result.tables["control_loop_search"] = tried
    kind = "+".join(filter(None, ["continuous" if w.mu is not None else "", "discrete" if w.branches else ""]))
    result.summary.append(
        f"control_loop {m['rate_hz']:g} Hz x {mode.duration_s:g} s, {len(side)} agent(s), {kind} actions"
        + (", memory carried" if w.memory else "") + f": miss rate {m['miss_rate']:.2%} "
        f"(<= {m['miss_rate_upper']:.2%} at {mode.confidence:.0%}, one-sided Clopper-Pearson), tick p50 "
        f"{m['p50_us']:,.0f} µs, jitter p99-p50 {m['jitter_us']:,.0f} µs, {int(m['late_run_max'])} late tick(s) in a row"
        + (f", {int(m['skipped'])} of {int(m['ticks'])} skipped (deadline gone before they could start)" if m["skipped"] else "")
        + (f"; highest rate with miss rate <= {mode.max_miss_rate:.1%}: {m['max_rate_hz']:,.0f} Hz" if "max_rate_hz" in m else ""))
