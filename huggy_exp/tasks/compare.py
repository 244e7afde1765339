"""What onnx-compare and export-onnx share: the feeds they run (every input; action masks that mask something), and every
output of two runs of one policy compared: continuous actions and memories element-wise, discrete actions exactly (a
mismatch excused only where the masked-logit margin is within the dtype's error), constant outputs exactly."""

from __future__ import annotations

import numpy as np

from huggy_exp.context import Context
from huggy_exp.errors import UserError
from huggy_exp.mlagents import ACTION_MASKS, RECURRENT_OUT, PolicyWeights, obs_name
from huggy_exp.observations import random_masks
from huggy_exp.results import Result
from huggy_exp.runners import build, reference, run_feeds
from huggy_exp.verify import DECLARED, Limits, Rules, compare, elementwise, within

LAYER_ORDER = ("lstm", RECURRENT_OUT, "mu", "logits")  # Policy.trace's parts after normalized_obs* and hidden_*


def feeds_with_masks(ctx: Context, masks: str) -> dict[str, np.ndarray]:
    """The job's feeds; a discrete policy without masks in them gets seeded random masks (`masks=random`), so that the
    graph's masking is exercised: all-allowed masks would hide a graph that ignores or misplaces them."""
    feeds, w = dict(ctx.feeds), ctx.weights
    if w.branches and ACTION_MASKS not in feeds and masks == "random":
        feeds[ACTION_MASKS] = random_masks(w.branch_sizes, feeds[obs_name(0)].shape[:-1], ctx.seed)
    return feeds


def expected_constants(w: PolicyWeights) -> dict[str, np.ndarray]:
    """The constant outputs ML-Agents' graph has for these weights, as it writes them."""
    out = {"version_number": np.array([w.version_number], np.float32), "memory_size": np.array([w.memory_size], np.float32)}
    if w.mu is not None:
        out["continuous_action_output_shape"] = np.array([float(w.act_dim)], np.float32)
    if w.branches:
        out["discrete_action_output_shape"] = np.array([[float(s) for s in w.branch_sizes]], np.float32)
    return out


def judge_outputs(result: Result, say: str, w: PolicyWeights, actual: dict, expected: dict, reference: str, atol: float,
                  rel_floor: float, margins: np.ndarray | None, graph: dict, constants: dict[str, np.ndarray],
                  sequence: bool, constants_ref: str = "expected", origin: str = "onnx") -> tuple[list[dict], dict]:
    """compare_outputs(actual, expected), and each constant output of `graph` exactly equal to `constants` (shape and
    values; in a sequence, as output at the first step: metrics `<constant>/vs_<constants_ref>/equal`, against the
    values ML-Agents writes or another graph's), into `result`, each failure led by `say`: (the rows, the constants)."""
    metrics, failures, rows = compare_outputs(actual, expected, reference, atol, rel_floor, margins, w.branch_sizes)
    details = {}
    for name, value in constants.items():
        got = graph.get(name)
        got = None if got is None else np.asarray(got[0] if sequence else got)
        same = got is not None and got.shape == value.shape and np.array_equal(got, value)
        details[name] = {origin: None if got is None else got.tolist(), "expected": value.tolist(), "equal": bool(same)}
        metrics[f"{name}/vs_{constants_ref}/equal"] = float(same)
        if not same:
            failures.append(f"{name}: {origin} {details[name][origin]} != {value.tolist()}")
    result.metrics.update(metrics)
    for reason in failures:
        result.fail(say + reason)
    return rows, details


def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], reference: str, atol: float,
                    rel_floor: float, masked_logits: np.ndarray | None = None, branch_sizes: tuple[int, ...] = (),
                    ) -> tuple[dict[str, float], list[str], list[dict]]:
    """Every deterministic output `expected` has, in `actual` too, through the verification engine, with the engine's
    metrics under the engine's names, `<stem>/vs_<reference>/<metric>` (stems actions, discrete_actions, memories): continuous
    actions within `atol`, recurrent_out within atol * max(1, max |memory|), discrete actions equal but where the
    reference's masked-logit margin <= atol * max(1, |best|) (`masked_logits`: the reference's)."""
    wanted = tuple(o for o in DECLARED if o.name in expected)
    extra = {"masked_logits": masked_logits} if masked_logits is not None else {}
    c = compare(actual, {**expected, **extra}, Rules(Limits(atol=atol, margin=atol), rel_floor=rel_floor, outputs=wanted,
                                                      branch_sizes=tuple(branch_sizes)))
    rows = [{"output": o.name, **c.outputs[o.stem].metrics} for o in wanted]
    return c.metrics(reference), c.failures, rows


def layer_names(trace: dict) -> list[str]:
    """Policy.trace's parts in the order the policy computes them: normalized_obs*, hidden_*, lstm, recurrent_out, heads."""
    return [k for k in trace if k.startswith(("normalized_obs", "hidden_"))] + [k for k in LAYER_ORDER if k in trace]


def first_divergence(ctx: Context, onnx, feeds: dict, result: Result) -> None:
    """Where an .onnx run by onnxruntime leaves the policy: every part of Policy.trace that the graph computes
    (mlagents.with_parts finds it by the walk that reads the weights) against CPU fp64's, in the order computed; max_abs,
    SQNR and rel_rmse, the last judged by fp32's layer limit (the graph runs fp32), and the first part over it; the
    reference's parts the graph has no tensor for are said, never guessed."""
    ort = build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0, onnx=onnx)
    try:
        got = run_feeds(ort, feeds, trace=True)
    except UserError as exc:  # a graph the walk cannot read part by part (its outputs were still compared)
        result.details.update(first_divergence=None, unmapped_parts=None, divergence_not_located=str(exc))
        result.summary.append(f"first divergence across the lowering boundary: not located: {exc}")
        return
    want = run_feeds(reference(ctx, "fp64"), feeds, trace=True)
    limit, rows, first = ctx.limits("fp32").layer_rel_rmse, [], None
    for part in layer_names(want):
        if part not in got:
            rows.append({"part": part, "status": "no tensor in the graph: not compared"})
            continue
        m, finite = elementwise(got[part], want[part], ctx.verify.rel_floor), bool(np.all(np.isfinite(got[part])))
        exceeds = not (finite and within(m["rel_rmse"], limit))
        first = first or (part if exceeds else None)
        row = {"part": part, **{k: m[k] for k in ("max_abs", "sqnr_db", "rel_rmse")}, "limit": limit,
               "status": "over the layer limit" if exceeds else "within"}
        rows.append(row)
        result.metrics.update({f"graph/{part}/{k}": row[k] for k in ("max_abs", "sqnr_db", "rel_rmse")})
    unmapped = [r["part"] for r in rows if "max_abs" not in r]
    result.tables["divergence"] = rows
    result.tags["first_divergence"] = first or "none"
    result.details.update(first_divergence=first, unmapped_parts=unmapped)
    said = (f"{first} (rel_rmse {result.metrics[f'graph/{first}/rel_rmse']:.3g} > {limit:g}, max_abs "
            f"{result.metrics[f'graph/{first}/max_abs']:.3g}, SQNR {result.metrics[f'graph/{first}/sqnr_db']:.1f} dB)"
            if first else f"none: {len(rows) - len(unmapped)} parts within fp32's layer limit {limit:g}")
    result.summary.append(f"first divergence across the lowering boundary (onnxruntime's intermediates vs CPU fp64): {said}"
                          + (f"; not compared (no tensor in the graph): {', '.join(unmapped)}" if unmapped else ""))
