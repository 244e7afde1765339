"""What onnx-compare and export-onnx share: the feeds they run (every input; action masks that mask something), and every
output of two runs of one policy compared: continuous actions and memories element-wise, discrete actions exactly (a
mismatch excused only where the masked-logit margin is within the dtype's error), constant outputs exactly."""

from __future__ import annotations

import numpy as np

from huggy_exp.context import Context
from huggy_exp.mlagents import ACTION_MASKS, RECURRENT_OUT, PolicyWeights, obs_name
from huggy_exp.numerics import compare, discrete_match
from huggy_exp.observations import random_masks
from huggy_exp.runners import ACTIONS, DISCRETE

COMPARED = (ACTIONS, DISCRETE, RECURRENT_OUT)  # the deterministic outputs, element-wise


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


def check_constants(outputs: dict[str, np.ndarray], expected: dict[str, np.ndarray], sequence: bool, prefix: str = "",
                    origin: str = "onnx") -> tuple[dict[str, float], list[str], dict]:
    """Each constant output exactly equal (shape and values); in a sequence, as output at the first step."""
    metrics, failures, details = {}, [], {}
    for name, value in expected.items():
        got = outputs.get(name)
        got = None if got is None else np.asarray(got[0] if sequence else got)
        same = got is not None and got.shape == value.shape and np.array_equal(got, value)
        details[name] = {origin: None if got is None else got.tolist(), "expected": value.tolist(), "equal": bool(same)}
        metrics[f"{prefix}{name}.equal"] = float(same)
        if not same:
            failures.append(f"{name}: {origin} {details[name][origin]} != {value.tolist()}")
    return metrics, failures, details


def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], stems: dict[str, str], atol: float,
                    rel_floor: float, margins: tuple[np.ndarray, np.ndarray] | None = None,
                    ) -> tuple[dict[str, float], list[str], list[dict]]:
    """Every deterministic output `expected` has, in `actual` too; metrics under stems[output].

    continuous actions: compare()'s metrics, failed above `atol` or on any NaN/inf mismatch; recurrent_out: the same,
    failed above atol * max(1, max |memory|) (memories are activations: the LSTM cell state grows); discrete actions:
    agreement, mismatches, excused (where the masked-logit margin <= atol * max(1, |best logit|); `margins` gives
    (margin, |best|) per branch from the reference), unexcused (a failure).
    """
    metrics, failures, rows = {}, [], []
    for name in (n for n in COMPARED if n in expected):
        stem, got, ref = stems[name], actual.get(name), expected[name]
        if got is None or np.shape(got) != np.shape(ref):
            failures.append(f"{name}: {'missing' if got is None else f'shape {list(np.shape(got))}'}, expected {list(np.shape(ref))}")
            continue
        if name == DISCRETE:
            margin, scale = margins if margins is not None else (np.full(ref.shape, np.inf), np.ones(ref.shape))
            m = discrete_match(got, ref, margin, scale, atol)
            metrics.update({f"{stem}.{k}": v for k, v in m.items()})
            metrics[f"{stem}.margin_tol"] = float(atol)
            if m["unexcused"]:
                failures.append(f"{name}: {int(m['unexcused'])} of {ref.size} actions differ where the masked-logit margin "
                                f"exceeds {atol:g} x max(1, |logit|)")
            rows.append({"output": name, **m})
            continue
        m = compare(got, ref, rel_floor)
        tol = atol if name == ACTIONS else atol * max(1.0, float(np.nanmax(np.abs(ref), initial=0.0)))
        metrics.update({f"{stem}.{k}": v for k, v in m.items()})
        if name == RECURRENT_OUT:
            metrics[f"{stem}.tolerance"] = tol
        bad = int(m["nan_mismatch"] + m["inf_mismatch"])
        if not m["max_abs"] <= tol or bad:
            failures.append(f"{name} max_abs {m['max_abs']:.3g} > atol {tol:g}" if not m["max_abs"] <= tol else f"{name}: {bad} NaN/Inf mismatches")
        rows.append({"output": name, **m})
    return metrics, failures, rows
