"""Pure comparison functions on numpy arrays (computed in float64); no torch state."""

from __future__ import annotations

import numpy as np

REL_FLOOR = 1e-3  # relative errors divide by max(|expected|, REL_FLOOR): actions are O(1), zeros must not explode


def compare(actual: np.ndarray, expected: np.ndarray, rel_floor: float = REL_FLOOR) -> dict[str, float]:
    """Polygraphy/msprobe-style metrics; NaN/Inf that differ between the two are counted, never hidden."""
    a = np.asarray(actual, np.float64).reshape(len(actual), -1) if np.ndim(actual) > 1 else np.asarray(actual, np.float64).reshape(1, -1)
    e = np.asarray(expected, np.float64).reshape(a.shape)
    nan_mismatch = int(np.sum(np.isnan(a) != np.isnan(e)))
    inf_mismatch = int(np.sum(np.isinf(a) != np.isinf(e)) + np.sum(np.isinf(a) & np.isinf(e) & (np.sign(a) != np.sign(e))))
    both = np.isfinite(a) & np.isfinite(e)
    diff = np.where(both, np.abs(a - e), 0.0)
    rel = diff / np.maximum(np.abs(e), rel_floor)
    n = max(int(both.sum()), 1)
    af, ef = np.where(both, a, 0.0), np.where(both, e, 0.0)
    return {
        "max_abs": float(diff.max(initial=0.0)),
        "mean_abs": float(diff.sum() / n),
        "max_rel": float(rel.max(initial=0.0)),
        "rmse": float(np.sqrt((diff**2).sum() / n)),
        "cosine": cosine(af.ravel(), ef.ravel()),
        "cosine_min_row": float(min(cosine(x, y) for x, y in zip(af, ef))),
        "within_0.1pct": float(np.sum((rel <= 1e-3) & both) / a.size),
        "within_0.5pct": float(np.sum((rel <= 5e-3) & both) / a.size),
        "nan_mismatch": float(nan_mismatch),
        "inf_mismatch": float(inf_mismatch),
        "min_atol": float(diff.max(initial=0.0)),
        "min_rtol": float(rel.max(initial=0.0)),
    }


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Cosine similarity; two all-zero vectors are identical (1.0), one zero vector against another is 0.0."""
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 and ny == 0.0:
        return 1.0
    if nx == 0.0 or ny == 0.0:
        return 0.0
    return float(np.dot(x, y) / (nx * ny))


def action_stats(actions: np.ndarray, saturation: float = 0.999) -> dict[str, float]:
    a = np.asarray(actions, np.float64)
    return {
        "action_mean": float(a.mean()),
        "action_std": float(a.std()),
        "action_min": float(a.min()),
        "action_max": float(a.max()),
        "saturated_share": float(np.mean(np.abs(a) >= saturation)),
    }
