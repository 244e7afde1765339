"""The one comparison engine: compare(actual, expected, rules) -> Comparison, pure numpy (computed in float64).

Outputs are objects (`Output`): each head and the memory declares its ML-Agents name, its sampled twin, the file stem
its arrays are written under and the rule that compares it (docs/verification.md's rules). `compare` takes two dicts of
outputs by ML-Agents name (and, when both sides have them, the distributions `mu`, `log_sigma`, `masked_logits` behind
them) and returns per output the metrics, the limits beside them and the checks that failed. Nothing here knows a task
or a mode, and nothing that is not finite passes: neither an output, nor its reference, nor a limit.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, fields
from functools import partial

import numpy as np

from huggy_exp.config import DTYPES
from huggy_exp.errors import UserError

REL_FLOOR = 1e-3  # relative errors divide by max(|expected|, REL_FLOOR): actions are O(1), zeros must not explode
DECIMALS = 3  # the quantized fingerprint rounds float outputs to this many decimals


@dataclass(frozen=True)
class Output:
    """One output a head (or the memory) declares: ML-Agents' name, its sampled twin, file stem, comparison rule."""

    name: str
    sampled: str | None
    stem: str
    rule: str

    def stored(self, value: np.ndarray, float_dtype=np.float32) -> np.ndarray:
        """The array as its file (`<stem>.npy`) holds it: discrete actions int64, floats `float_dtype`, the memory
        [..., N, m] (ML-Agents' [..., N, 1, m] without its middle axis)."""
        a = np.asarray(value)
        if self.rule in ("discrete", "sampled_discrete"):
            return a.astype(np.int64)
        a = a.astype(float_dtype)
        return a.squeeze(-2) if self.rule == "memory" and a.ndim >= 3 and a.shape[-2] == 1 else a

    def twin(self) -> "Output | None":
        """The sampled output, compared like this one (a sampled discrete action has no margin: reported only)."""
        rule = "sampled_discrete" if self.rule == "discrete" else self.rule
        return None if self.sampled is None else Output(self.sampled, None, f"sampled_{self.stem}", rule)


CONTINUOUS_ACTIONS = Output("deterministic_continuous_actions", "continuous_actions", "actions", "continuous")
DISCRETE_ACTIONS = Output("deterministic_discrete_actions", "discrete_actions", "discrete_actions", "discrete")
MEMORY = Output("recurrent_out", None, "memories", "memory")
DECLARED = (CONTINUOUS_ACTIONS, DISCRETE_ACTIONS, MEMORY)  # ML-Agents' output order


def constant(name: str) -> Output:
    """A constant graph output (version_number, memory_size, *_output_shape): exactly equal."""
    return Output(name, None, name, "constant")


@dataclass(frozen=True)
class Limits:
    """One dtype's limits: atol/rtol element-wise, the worst row's cosine, the discrete margin factor, and in the
    policy's units the worst KL and |Δμ|/σ (judged where both sides give their distributions)."""

    atol: float = np.inf
    rtol: float = 0.0
    cosine_min: float = -1.0
    margin: float = 0.0
    kl_max: float = np.inf
    mean_shift_max: float = np.inf
    batch_max_abs: float = np.inf  # mode=batch: |batched - single-row|
    layer_rel_rmse: float = np.inf  # mode=precision: each layer's RMSE / RMS of fp64's

    @classmethod
    def of(cls, table: dict) -> "Limits":
        """From a validated `verify.limits` entry (config.Threshold's keys; max_abs is the atol)."""
        table = finite_limits(table, "verify.limits")
        return cls(atol=table["max_abs"], **{k: table[k] for k in (f.name for f in fields(cls)) if k != "atol"})


@dataclass(frozen=True)
class Rules:
    """How to compare: limits, the dtype whose ULPs count, relative-error floor, outputs (None: all both sides have)."""

    limits: Limits = Limits()
    dtype: str = "fp32"
    rel_floor: float = REL_FLOOR
    outputs: tuple[Output, ...] | None = None
    branch_sizes: tuple[int, ...] = ()


@dataclass
class OutputComparison:
    """One output against its reference: metrics (limits beside the values, `<metric>_limit`) and what failed."""

    output: Output
    metrics: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    """Every compared output by file stem; `metrics(ref)` names them `<stem>/vs_<ref>/<metric>`."""

    outputs: dict[str, OutputComparison] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(o.failures for o in self.outputs.values())

    @property
    def failures(self) -> list[str]:
        return [f"{stem}: {f}" for stem, o in self.outputs.items() for f in o.failures]  # named as the PASS line names them

    def metrics(self, reference: str) -> dict[str, float]:
        return {f"{stem}/vs_{reference}/{k}": v for stem, o in self.outputs.items() for k, v in o.metrics.items()}

    def get(self, stem: str, metric: str, default: float = float("nan")) -> float:
        return self.outputs[stem].metrics.get(metric, default) if stem in self.outputs else default


def outputs_of(names) -> tuple[Output, ...]:
    """The declared outputs (deterministic ones and their sampled twins) whose ML-Agents names are in `names`."""
    return tuple(o for out in DECLARED for o in (out, out.twin()) if o is not None and o.name in names)


def compare(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray], rules: Rules = Rules()) -> Comparison:
    """Every output of `rules.outputs` (default: the declared outputs both sides have) under its rule."""
    wanted = rules.outputs if rules.outputs is not None else outputs_of(set(actual) & set(expected))
    result = Comparison()
    for out in wanted:
        got, ref = actual.get(out.name), expected.get(out.name)
        oc = OutputComparison(out)
        if got is None or ref is None or np.shape(got) != np.shape(ref) and out.rule != "constant":
            oc.failures.append(f"{'missing' if got is None else f'shape {list(np.shape(got))}'}"
                               f", expected {'nothing' if ref is None else list(np.shape(ref))}")
        else:
            _RULE[out.rule](oc, np.asarray(got), np.asarray(ref), actual, expected, rules)
        result.outputs[out.stem] = oc
    return result


# --- the rules


def _continuous(oc: OutputComparison, got: np.ndarray, ref: np.ndarray, actual: dict, expected: dict, rules: Rules) -> None:
    lim, bad = rules.limits, _measure(oc, got, ref, rules)
    a, e = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        over = int(np.sum(~(np.abs(a - e) <= lim.atol + lim.rtol * np.abs(e))))
    oc.metrics.update({"max_abs_limit": lim.atol, "rtol_limit": lim.rtol, "cosine_min_row_limit": lim.cosine_min,
                       "over_tolerance": float(over)})
    if not bad and over:
        oc.failures.append(f"max_abs {oc.metrics['max_abs']:.3g} > atol {lim.atol:g}"
                           + (f" + rtol {lim.rtol:g} x |expected|" if lim.rtol else "") + f" ({over} elements)")
    if not bad and not oc.metrics["cosine_min_row"] >= lim.cosine_min:
        oc.failures.append(f"worst-row cosine {oc.metrics['cosine_min_row']:.6f} < {lim.cosine_min:g}")
    if oc.output.stem in ("actions", "sampled_actions") and all(k in d for d in (actual, expected) for k in ("mu", "log_sigma")):
        oc.metrics.update(gaussian_divergence(actual["mu"], actual["log_sigma"], expected["mu"], expected["log_sigma"]))
        if oc.output.sampled is not None or CONTINUOUS_ACTIONS.name not in actual:  # one distribution: judged once
            _policy_units(oc, lim, bad)


def _policy_units(oc: OutputComparison, lim: Limits, bad: int) -> None:
    """The divergence in the policy's own units against its limits: KL, and |Δμ|/σ for a Gaussian head."""
    checks = (("kl_max", lim.kl_max, "KL"), ("mean_shift_sigma_max", lim.mean_shift_max, "|Δμ|/σ"))
    for metric, bound, what in (c for c in checks if c[0] in oc.metrics):
        oc.metrics[f"{metric}_limit"] = bound
        if not bad and not oc.metrics[metric] <= bound:  # a NaN divergence never passes
            oc.failures.append(f"{what} {oc.metrics[metric]:.3g} > {bound:g} (policy units)")


def _memory(oc: OutputComparison, got: np.ndarray, ref: np.ndarray, actual: dict, expected: dict, rules: Rules) -> None:
    bad = _measure(oc, got, ref, rules)
    tol = rules.limits.atol * max(1.0, float(np.nanmax(np.abs(np.asarray(ref, np.float64)), initial=0.0)))
    oc.metrics.update({"max_abs_limit": tol, "max_abs_scale": tol / rules.limits.atol})  # scale: for mode=rejudge
    if not bad and not oc.metrics["max_abs"] <= tol:
        oc.failures.append(f"max_abs {oc.metrics['max_abs']:.3g} > atol x max(1, max |memory|) = {tol:.3g}")


def _discrete(oc: OutputComparison, got: np.ndarray, ref: np.ndarray, actual: dict, expected: dict, rules: Rules,
              judge: bool = True) -> None:
    sizes = rules.branch_sizes if rules.branch_sizes and len(rules.branch_sizes) == got.shape[-1] else None
    if "masked_logits" in expected and sizes is not None:
        margin, best = discrete_margins(expected["masked_logits"], sizes)
    else:  # no reference logits: no flip can be excused
        margin, best = np.full(ref.shape, np.inf), np.ones(ref.shape)
    d = discrete_agreement(got, ref, margin, rules.limits.margin, np.maximum(1.0, best))
    oc.metrics.update({**d, "margin_limit": rules.limits.margin})
    if sizes is not None and "masked_logits" in actual and "masked_logits" in expected:
        oc.metrics.update(softmax_divergence(actual["masked_logits"], expected["masked_logits"], sizes))
        if judge:
            _policy_units(oc, rules.limits, 0)
    if judge and d["flips_beyond_margin"]:
        oc.failures.append(f"{int(d['flips_beyond_margin'])} of {int(d['decisions'])} actions differ where the reference's "
                           f"best masked logit leads by more than {rules.limits.margin:g} x max(1, |best|) "
                           f"(largest flipped margin {d['flip_margin_max']:.3g})")


def _constant(oc: OutputComparison, got: np.ndarray, ref: np.ndarray, actual: dict, expected: dict, rules: Rules) -> None:
    same = got.shape == ref.shape and np.array_equal(got, ref)
    oc.metrics["equal"] = float(same)
    if not same:
        oc.failures.append(f"{got.tolist()} != {ref.tolist()}")


# a sampled discrete action: an inverse-CDF draw can cross a boundary the rounding moved; reported, not judged
_RULE = {"continuous": _continuous, "memory": _memory, "discrete": _discrete,
         "sampled_discrete": partial(_discrete, judge=False), "constant": _constant}


def _measure(oc: OutputComparison, got: np.ndarray, ref: np.ndarray, rules: Rules) -> int:
    """The element-wise metrics of a float output; any NaN/inf in it or its reference fails it: how many there are."""
    oc.metrics.update(elementwise(got, ref, rules.rel_floor, rules.dtype))
    count, ref_count = nonfinite_count(got), nonfinite_count(ref)
    oc.metrics.update({"nonfinite": float(count), "nonfinite_reference": float(ref_count)})
    if count:
        oc.failures.append(f"{count} NaN/Inf values (first at {np.argwhere(~np.isfinite(got))[0].tolist()})")
    if ref_count:
        oc.failures.append(f"the reference holds {ref_count} NaN/Inf values: nothing can be held to it")
    return count + ref_count


# --- nothing that is not finite passes


def nonfinite_count(array) -> int:
    """NaN/inf values of a float array (0 for integers)."""
    a = np.asarray(array)
    return int(np.sum(~np.isfinite(a))) if a.dtype.kind in "fc" else 0


def nonfinite_failures(arrays: dict, what: str) -> list[str]:
    """One failure per array of `arrays` holding NaN/inf (`what`: whose arrays: "the bundle's fp64 reference")."""
    return [f"{what} {name} holds {n} NaN/Inf values" for name, a in arrays.items() if (n := nonfinite_count(a))]


def within(value, limit) -> bool:
    """value <= limit, both finite numbers: a NaN error, a NaN limit or an infinite one never passes."""
    v, lim = _number(value), _number(limit)
    return math.isfinite(v) and math.isfinite(lim) and v <= lim


def finite_limits(table: dict, where: str) -> dict[str, float]:
    """A limit table as floats; a value that is not a finite number is an error, never a pass (NaN compares false, so
    a NaN limit would switch its check off)."""
    out = {}
    for key, value in (table or {}).items():
        out[key] = math.nan if isinstance(value, bool) else _number(value)
        if not math.isfinite(out[key]):
            raise UserError(f"{where}.{key}={value!r}: a limit must be a finite number (NaN or inf would pass every value)")
    return out


def _number(value) -> float:
    """`value` as a float; NaN where it is none (NaN fails every check)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


# --- element-wise metrics


def elementwise(actual: np.ndarray, expected: np.ndarray, rel_floor: float = REL_FLOOR, dtype: str = "fp32") -> dict[str, float]:
    """max_abs, mean_abs, rmse, rel_rmse, SQNR, guarded max_rel, cosine (overall, worst row), required atol/rtol (Polygraphy),
    the error in ULPs of `dtype` (max, and the share above msprobe's standard), and NaN/inf mismatches."""
    a, e = as_rows(actual, expected)
    both = np.isfinite(a) & np.isfinite(e)
    af, ef = np.where(both, a, 0.0), np.where(both, e, 0.0)
    with np.errstate(over="ignore"):
        diff = np.abs(af - ef)
    rel = diff / np.maximum(np.abs(ef), rel_floor)
    ulps = diff / ulp(ef, dtype)
    n = max(int(both.sum()), 1)
    row_cos = [cosine(x, y) for x, y in zip(af, ef)]
    signal, noise = float((ef**2).sum()), float((diff**2).sum())
    max_abs, max_rel, standard = float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), DTYPES[dtype].ulp_standard
    out = {
        "max_abs": max_abs, "mean_abs": float(diff.sum() / n), "rmse": float(np.sqrt(noise / n)),
        "rel_rmse": float(np.sqrt(noise / (signal if signal > 0 else n))),  # over the RMS of expected (zero: the rmse)
        "sqnr_db": sqnr_db(signal, noise), "max_rel": max_rel, "cosine": cosine(af, ef),
        "cosine_min_row": float(min(row_cos, default=1.0)), "worst_row": float(np.argmin(row_cos)) if row_cos else 0.0,
        "required_atol": max_abs, "required_rtol": max_rel, "ulp_max": float(ulps.max(initial=0.0)),
        "ulp_share_over": float(np.mean(ulps > standard)) if ulps.size else 0.0, "ulp_standard": standard,
        "nan_mismatch": float(np.sum(np.isnan(a) != np.isnan(e))),
        "inf_mismatch": float(np.sum(np.isinf(a) != np.isinf(e)) + np.sum(np.isinf(a) & np.isinf(e) & (np.sign(a) != np.sign(e)))),
        "nonfinite_actual": float(np.sum(~np.isfinite(a))), "nonfinite_expected": float(np.sum(~np.isfinite(e))),
    }
    if not both.all():  # a NaN/inf on either side is no agreement: the errors are infinite, the cosines undefined
        out.update({k: np.inf for k in POISONED_ERRORS})
        out.update({"cosine": np.nan, "cosine_min_row": np.nan, "sqnr_db": np.nan})
    return out


POISONED_ERRORS = ("max_abs", "mean_abs", "rmse", "rel_rmse", "max_rel", "required_atol", "required_rtol", "ulp_max")


def sqnr_db(signal: float, noise: float) -> float:
    """Signal-to-quantization-noise ratio, 10·log10(Σref² / Σ(ref - x)²) in dB (PyTorch's quantization tests gate at
    30 dB): +inf for identical outputs (no noise: result.json writes it "inf", MLflow never gets it), -inf for noise on
    an all-zero reference. Reported, never judged."""
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0.0 else -math.inf


def as_rows(actual: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as float64 [rows, values per row] (the last axis is a row's values; one row for a vector)."""
    a, e = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    if a.size != e.size:
        raise UserError(f"cannot compare arrays of shapes {list(a.shape)} and {list(e.shape)} element-wise")
    width = a.shape[-1] if a.ndim > 1 and a.shape[-1] else max(a.size, 1)
    return a.reshape(-1, width) if a.size else a.reshape(0, 1), e.reshape(-1, width) if e.size else e.reshape(0, 1)


def ulp(values: np.ndarray, dtype: str) -> np.ndarray:
    """The unit in the last place of `dtype` at each value (subnormals: the smallest normal's ULP): the one ULP, msprobe's
    (an error in ULPs is |actual - expected| / ulp(expected); certify.bitwise's distances too)."""
    mantissa, emin = DTYPES[dtype].mantissa, DTYPES[dtype].emin
    x = np.abs(np.asarray(values, np.float64))
    exp = np.where(x > 0, np.frexp(x)[1] - 1, emin)
    return np.ldexp(1.0, np.maximum(exp, emin) - mantissa)


def cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Cosine similarity; two all-zero vectors are identical (1.0), one zero vector against another is 0.0."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    if x.size != y.size:
        raise UserError(f"cannot compare vectors of {x.size} and {y.size} values")
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return float(nx == ny)  # both zero: identical
    return float(np.dot(x, y) / (nx * ny))


# --- errors in the policy's own units


def gaussian_divergence(mu_a, log_sigma_a, mu_e, log_sigma_e) -> dict[str, float]:
    """KL(N(mu_a, sigma_a) || N(mu_e, sigma_e)) per row (summed over action dimensions), and |Δmu| / sigma_e: how many
    of the reference's standard deviations the device moved the mean."""
    ma, la, me, le = (np.asarray(v, np.float64) for v in (mu_a, log_sigma_a, mu_e, log_sigma_e))
    la, le = np.broadcast_to(la, ma.shape), np.broadcast_to(le, me.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        kl = (le - la) + (np.exp(2 * la) + (ma - me) ** 2) / (2 * np.exp(2 * le)) - 0.5
        shift = np.abs(ma - me) / np.exp(le)
    kl_rows = kl.reshape(-1, kl.shape[-1]).sum(axis=-1) if kl.size else np.zeros(0)
    return {**_max_mean("kl", kl_rows), **_max_mean("mean_shift_sigma", shift)}


def _max_mean(name: str, values: np.ndarray) -> dict[str, float]:
    return {f"{name}_max": float(np.max(values, initial=0.0)),
            f"{name}_mean": float(values.mean()) if values.size else 0.0}


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def softmax_divergence(masked_a: np.ndarray, masked_e: np.ndarray, sizes: tuple[int, ...]) -> dict[str, float]:
    """KL(softmax(masked logits of the device) || the reference's) per (row, branch): max and mean."""
    branches = [[log_softmax(z) for z in np.split(np.asarray(m, np.float64), np.cumsum(sizes)[:-1], axis=-1)]
                for m in (masked_a, masked_e)]
    return _max_mean("kl", np.array([np.sum(np.exp(la) * (la - le), axis=-1) for la, le in zip(*branches)]))


def discrete_margins(masked_logits: np.ndarray, sizes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per branch [..., branches]: the best minus the second-best masked logit (inf for one action), |best logit|."""
    z = np.asarray(masked_logits, np.float64)
    tops = [np.sort(part, axis=-1) for part in np.split(z, np.cumsum(sizes)[:-1], axis=-1)]
    gaps = [t[..., -1] - t[..., -2] if t.shape[-1] > 1 else np.full(t.shape[:-1], np.inf) for t in tops]
    return np.stack(gaps, axis=-1), np.stack([np.abs(t[..., -1]) for t in tops], axis=-1)


FLIP_BANDS = (1.0, 10.0)  # flip rate by margin: within the bound, up to 10x it, beyond


def discrete_agreement(actual: np.ndarray, expected: np.ndarray, margin: np.ndarray, bound: float,
                       scale: np.ndarray | float = 1.0) -> dict[str, float]:
    """Discrete actions [..., branches] against a reference whose top-1 minus top-2 masked logit is `margin`.

    A flip is within the dtype's error where margin <= bound * scale (scale = max(1, |best masked logit|)): the rounding
    can swap two actions that close. A flip where the margin is larger, or NaN, is beyond the margin. The flip rate by
    margin splits the decisions into bands of margin / (bound * scale): <= 1, <= 10, > 10.
    """
    a, e, m = np.asarray(actual), np.asarray(expected), np.asarray(margin, np.float64)
    if a.shape != e.shape or m.shape != e.shape:
        raise UserError(f"cannot compare discrete actions of shapes {list(a.shape)}, {list(e.shape)} (margins {list(m.shape)})")
    flips = a != e
    allowed = bound * np.asarray(scale, np.float64)
    near = m <= allowed  # NaN is never near: a NaN margin never excuses a flip
    ratio = np.divide(m, allowed, out=np.where(m > 0, np.inf, 0.0), where=allowed > 0)  # over a bound of 0: inf
    bands = {"within": ratio <= FLIP_BANDS[0], "to_10x": (ratio > FLIP_BANDS[0]) & (ratio <= FLIP_BANDS[1]),
             "beyond_10x": ~(ratio <= FLIP_BANDS[1])}
    rates = {f"flip_rate_margin_{band}": float(np.sum(flips & b) / max(np.sum(b), 1)) for band, b in bands.items()}
    return {"decisions": float(e.size), "agreement": float(np.mean(~flips)) if e.size else 1.0,
            "flips": float(flips.sum()), "flips_beyond_margin": float(np.sum(flips & ~near)),
            "near_ties": float(near.sum()), "flip_margin_max": float(m[flips].max(initial=0.0)),
            "margin_min": float(m.min(initial=np.inf)), "margin_limit": float(bound), **rates}


# --- fingerprints


QUANT_LIMIT = 2**62  # |round(a * 10^decimals)| beyond this saturates (exact in float64 and int64)
QUANT_NAN, QUANT_NEG_INF, QUANT_POS_INF = -(2**63), -(2**63) + 1, 2**63 - 1  # outside the finite range, so distinct


def quantize(values: np.ndarray, decimals: int = DECIMALS) -> np.ndarray:
    """round(a * 10^decimals) as int64: -0.0 and +0.0 agree, as do values equal to `decimals` places. Integers stay.

    NaN, -inf and +inf get codes of their own, and huge values saturate, so the quantized hash is the same on every
    host (a plain cast of NaN or of an out-of-range float to int64 is undefined and differs between CPUs)."""
    if np.asarray(values).dtype.kind in "iub":
        return np.asarray(values, np.int64)
    a = np.asarray(values, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        out = np.clip(np.rint(np.nan_to_num(a * 10**decimals, nan=0.0, posinf=0.0, neginf=0.0)),
                      -QUANT_LIMIT, QUANT_LIMIT).astype(np.int64)
    out[np.isnan(a)] = QUANT_NAN
    out[np.isneginf(a)] = QUANT_NEG_INF
    out[np.isposinf(a)] = QUANT_POS_INF
    return out


FINGERPRINT = "fingerprint"  # the one name of the exact hash, wherever it is shown (docs/verification.md#fingerprints)
QUANTIZED = "quantized_fingerprint"  # the hash of the rounded outputs: its own name, never under the first


def fingerprint(arrays: dict[str, np.ndarray], decimals: int = DECIMALS) -> dict[str, str]:
    """`fingerprint`: the SHA-256 of every output's bytes in order (float32 floats, int64 discrete), and
    `quantized_fingerprint`: the same over the outputs rounded to `decimals` places (as integers)."""
    exact = [np.asarray(a, np.int64 if np.asarray(a).dtype.kind in "iub" else np.float32) for a in arrays.values()]
    return {name: hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in parts)).hexdigest()
            for name, parts in ((FINGERPRINT, exact), (QUANTIZED, [quantize(a, decimals) for a in exact]))}


def fingerprints(arrays: dict[str, np.ndarray], decimals: int = DECIMALS) -> dict[str, str]:
    """The point's `fingerprint` and `quantized_fingerprint` over every output, and with several outputs each one's
    own (`<stem>_fingerprint`, `<stem>_quantized_fingerprint`): the tags, result.json's and a bundle's, one dict."""
    out = fingerprint(arrays, decimals)
    if len(arrays) > 1:
        for stem, a in arrays.items():
            out.update({f"{stem}_{k}": v for k, v in fingerprint({stem: a}, decimals).items()})
    return out


def is_fingerprint(key: str) -> bool:
    """Whether a tag or field holds a fingerprint (either kind, of all outputs or of one)."""
    return key == FINGERPRINT or key.endswith(("_" + FINGERPRINT, QUANTIZED))
