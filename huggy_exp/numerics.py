"""Pure comparison functions on numpy arrays (computed in float64); no torch state."""

from __future__ import annotations

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.verify import finite_limits, log_softmax


def action_stats(actions: np.ndarray, saturation: float = 0.999) -> dict[str, float]:
    """Mean, spread, range and the share of saturated values of some actions (NaN for none)."""
    stats = {"action_mean": np.mean, "action_std": np.std, "action_min": np.min, "action_max": np.max,
             "saturated_share": lambda a: np.mean(np.abs(a) >= saturation)}
    a = np.asarray(actions, np.float64)
    return {name: float(stat(a)) if a.size else float("nan") for name, stat in stats.items()}


def discrete_histogram(actions: np.ndarray, sizes: tuple[int, ...] | None = None) -> tuple[dict[str, float], list[dict]]:
    """Share of each action per branch of int [..., branches] actions: metrics `discrete.branch_<b>.action_<k>_share`
    and table rows (branch, action, count, share); every action of a known-size branch, else up to the largest taken."""
    flat = np.asarray(actions).reshape(-1, np.shape(actions)[-1])
    table = []
    for b in range(flat.shape[1]):
        counts = np.bincount(flat[:, b], minlength=sizes[b] if sizes else int(flat[:, b].max(initial=0)) + 1)
        table += [{"branch": b, "action": k, "count": int(c), "share": float(c / len(flat))} for k, c in enumerate(counts)]
    return {f"discrete.branch_{t['branch']}.action_{t['action']}_share": t["share"] for t in table}, table


def limits_for(table: dict, dtype: str, device: str, specialize: dict | None, where: str) -> dict:
    """Thresholds for a dtype, overridden by `specialize`'s `<device kind>_<dtype>` entry (e.g. npu_fp16); a dtype
    without an entry is an error naming the key (tables fail closed); every value finite (a NaN limit is no check)."""
    if dtype not in table:
        raise UserError(f"{where}.{dtype} is missing: a dtype without a limit cannot be judged; set it "
                        f"(the table has {', '.join(sorted(table)) or 'nothing'})")
    special = f"{device.split(':')[0]}_{dtype}"
    limits = finite_limits(dict(table[dtype]), f"{where}.{dtype}")
    limits.update(finite_limits(dict((specialize or {}).get(special) or {}), f"{where} specialize.{special}"))
    return limits


def error_ratio(device_error: float, cpu_error: float) -> float:
    """Device error over CPU error at the same dtype; both exact counts as 1 (no worse than the CPU)."""
    if cpu_error == 0.0:
        return 1.0 if device_error == 0.0 else float("inf")
    return device_error / cpu_error


def ratio_verdict(ratio: float, warn: float = 1.0, fail: float = 2.0) -> str:
    """pass when the accelerator is no worse than the CPU in the same dtype, warn up to `fail`, else fail."""
    if not np.isfinite(ratio) or ratio > fail:
        return "fail"
    return "pass" if ratio <= warn else "warn"


def clipped_normal_moments(mu: np.ndarray, sigma: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of clip(X, lo, hi) for X ~ N(mu, sigma^2), element-wise."""
    from scipy.stats import norm

    mu, sigma = np.asarray(mu, np.float64), np.asarray(sigma, np.float64)
    a, b = (lo - mu) / sigma, (hi - mu) / sigma
    pa, pb, fa, fb = norm.cdf(a), norm.cdf(b), norm.pdf(a), norm.pdf(b)
    inside = pb - pa
    m1 = lo * pa + hi * (1 - pb) + mu * inside + sigma * (fa - fb)
    m2 = (lo**2 * pa + hi**2 * (1 - pb) + (mu**2 + sigma**2) * inside
          + 2 * mu * sigma * (fa - fb) + sigma**2 * (a * fa - b * fb))
    return m1, np.maximum(m2 - m1**2, 0.0)


def sampling_check(samples: np.ndarray, mu: np.ndarray, sigma: np.ndarray, lo: float | None, hi: float | None,
                   confidence: float = 0.999) -> dict[str, float]:
    """Do draws [R, rows, act] follow clip(N(mu, sigma^2), lo, hi)? Means: z = (empirical mean - exact clipped-normal
    mean) / sqrt(var / R) per cell, max |z| under the two-sided Bonferroni-corrected critical value at `confidence`.
    Spread: on cells clipped with probability < 1e-3, the standardized residuals (x - mu) / sigma have a standard
    deviation within z * sqrt(1 / 2n) of 1."""
    from scipy.stats import norm

    x = np.asarray(samples, np.float64)
    reps = x.shape[0]
    if lo is None:  # the plain normal: no cell is ever clipped
        lo, hi, mean, var = -np.inf, np.inf, np.asarray(mu, np.float64), np.asarray(sigma, np.float64) ** 2
    else:
        mean, var = clipped_normal_moments(mu, sigma, lo, hi)
    se = np.sqrt(var / reps) + 1e-6  # + float32 resolution: fully clipped cells have var 0 and mean exactly at the bound
    z = (x.mean(axis=0) - mean) / se
    cells, alpha = z.size, 1.0 - confidence
    z_crit = norm.ppf(1 - alpha / (2 * cells))
    free = np.broadcast_to(norm.cdf((lo - mu) / sigma) + norm.sf((hi - mu) / sigma) < 1e-3, z.shape)  # rarely clipped
    resid = ((x - mu) / sigma)[:, free]
    n = resid.size
    spread = float(resid.std()) if n > 1 else float("nan")
    spread_tol = norm.ppf(1 - alpha / 2) * np.sqrt(1.0 / (2 * n)) if n > 1 else float("nan")
    return {"mean_z_max": float(np.max(np.abs(z))), "mean_z_rms": float(np.sqrt(np.mean(z**2))),
            "mean_z_crit": float(z_crit), "spread_ratio": spread, "spread_tolerance": float(spread_tol),
            "spread_cells": float(np.sum(free)), "cells": float(cells), "samples_per_cell": float(reps),
            "confidence": float(confidence)}


# --- discrete actions: sampled draws against the masked softmax


def _chi2_pvalue(counts: np.ndarray, expected: np.ndarray) -> float:
    """Goodness of fit of counts to expected counts; bins expected under 5 are pooled; a draw of probability 0 gives 0."""
    from scipy.stats import chi2

    if counts[expected <= 0].sum() > 0:
        return 0.0
    keep = expected >= 5
    o, e = counts[keep].astype(np.float64), expected[keep].astype(np.float64)
    rest_o, rest_e = float(counts[~keep].sum()), float(expected[~keep].sum())
    if rest_e >= 5 or rest_e > 0 and not e.size:  # the small bins pooled into one
        o, e = np.append(o, rest_o), np.append(e, rest_e)
    elif rest_e > 0:  # too small to stand alone: pooled with the smallest bin
        i = np.argmin(e)
        o[i] += rest_o
        e[i] += rest_e
    if len(e) < 2:
        return 1.0
    return float(chi2.sf(np.sum((o - e) ** 2 / e), len(e) - 1))


def allowed_branches(masks: np.ndarray, branch_sizes: tuple[int, ...]) -> np.ndarray:
    """bool [..., n_branches]: whether each branch of each row has an action allowed. A branch with none is drawn
    uniformly, as ML-Agents does (its masked logits are all equal), so none of its draws counts as a masked one."""
    m = np.asarray(masks)
    starts = np.cumsum([0, *branch_sizes])
    return np.stack([m[..., a:b].any(axis=-1) for a, b in zip(starts[:-1], starts[1:])], axis=-1)


def categorical_check(draws: np.ndarray, masked_logits: np.ndarray, branch_sizes: tuple[int, ...], masks: np.ndarray | None,
                      confidence: float = 0.999) -> dict[str, float]:
    """Do discrete draws [S, rows, n_branches] follow softmax(masked logits [rows, sum of sizes]) per (row, branch)? A
    chi-square test per cell (bins expected under 5 pooled), Bonferroni over the cells: the smallest p-value at least
    (1 - confidence) / cells. A draw of a masked action or outside the branch is counted apart (`masked_draws`,
    `out_of_range`), always a failure; a branch with every action masked is drawn uniformly (ML-Agents), so its draws
    are checked against the uniform softmax, not counted as masked."""
    d, bounds = np.asarray(draws), np.cumsum(branch_sizes)[:-1]
    reps = d.shape[0]
    logits = np.split(np.asarray(masked_logits, np.float64), bounds, axis=-1)
    allowed = np.split(np.asarray(masks), bounds, axis=-1) if masks is not None else [None] * len(branch_sizes)
    pvalues, masked, out_of_range, freq_max = [], 0, 0, 0.0
    for b, (size, z, mask) in enumerate(zip(branch_sizes, logits, allowed)):
        p, picks = np.exp(log_softmax(z)), d[..., b]
        bad = (picks < 0) | (picks >= size)
        out_of_range += int(bad.sum())
        for r in range(p.shape[0]):
            counts = np.bincount(picks[:, r][~bad[:, r]].astype(np.int64), minlength=size)
            if mask is not None and mask[r].any():  # a branch with no action allowed is drawn uniformly
                masked += int(counts[mask[r] == 0].sum())
            freq_max = max(freq_max, float(np.max(np.abs(counts / reps - p[r]))))
            pvalues.append(_chi2_pvalue(counts, reps * p[r]))
    cells = len(pvalues)
    return {"p_min": float(min(pvalues, default=1.0)), "p_crit": float((1.0 - confidence) / max(cells, 1)),
            "cells": float(cells), "samples_per_cell": float(reps), "masked_draws": float(masked),
            "out_of_range": float(out_of_range), "freq_max_abs": freq_max, "confidence": float(confidence)}
