"""huggy_exp.verify, the one comparison engine: rules per declared output, the limits beside the values, required
tolerances, ULPs, errors in the policy's units, the one margin rule, NaN/inf always failing, fingerprints."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from huggy_exp.verify import (CONTINUOUS_ACTIONS, DISCRETE_ACTIONS, MEMORY, Limits, Rules, compare, constant, discrete_agreement,
                              elementwise, fingerprint, gaussian_divergence, outputs_of, softmax_divergence, ulp)

ACT, DISC, MEM = CONTINUOUS_ACTIONS.name, DISCRETE_ACTIONS.name, MEMORY.name
FP32 = Rules(Limits(atol=1e-5, cosine_min=0.99999, margin=1e-5), "fp32", branch_sizes=(3, 2))


def actions(rows: int = 8, width: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (rows, width)).astype(np.float32)


def test_identical_outputs_pass_with_zero_errors_and_the_limits_beside_them():
    a = actions()
    c = compare({ACT: a}, {ACT: a.astype(np.float64)}, FP32)
    m = c.metrics("fp64")
    assert c.passed and m["actions/vs_fp64/max_abs"] == 0.0 and m["actions/vs_fp64/cosine_min_row"] == pytest.approx(1.0)
    assert m["actions/vs_fp64/max_abs_limit"] == 1e-5 and m["actions/vs_fp64/cosine_min_row_limit"] == 0.99999


def test_an_error_over_atol_fails_naming_the_output_value_and_limit():
    a = actions()
    b = a.copy()
    b[2, 1] += 3e-5
    c = compare({ACT: b}, {ACT: a}, FP32)
    assert not c.passed and c.failures == ["actions: max_abs 3e-05 > atol 1e-05 (1 elements)"]
    assert c.get("actions", "required_atol") == pytest.approx(3e-5, rel=1e-3)
    assert c.get("actions", "worst_row") == 2.0
    loose = Rules(Limits(atol=c.get("actions", "required_atol") * 1.0001), "fp32")
    assert compare({ACT: b}, {ACT: a}, loose).passed  # the required atol is the one that would have passed


def test_rtol_adds_to_atol_element_wise():
    e = np.array([[10.0, 0.1]])
    a = e + np.array([[5e-4, 5e-4]])
    rules = Rules(Limits(atol=1e-4, rtol=1e-4), "fp32")
    c = compare({ACT: a}, {ACT: e}, rules)
    assert c.get("actions", "over_tolerance") == 1.0  # 5e-4 <= 1e-4 + 1e-3 at 10, > 1e-4 + 1e-5 at 0.1


def test_worst_row_cosine_below_the_limit_fails():
    e = np.array([[1.0, 0.0], [0.0, 1.0]])
    a = np.array([[1.0, 0.0], [0.1, 1.0]])
    c = compare({ACT: a}, {ACT: e}, Rules(Limits(atol=1.0, cosine_min=0.999), "fp32"))
    assert not c.passed and "worst-row cosine" in c.failures[0] and c.get("actions", "worst_row") == 1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_fails_whatever_the_limits(bad):
    a = actions()
    b = a.copy()
    b[0, 0] = bad
    c = compare({ACT: b, MEM: b[:, None, :]}, {ACT: a, MEM: a[:, None, :]}, Rules(Limits(), "fp32"))  # no limit at all
    assert not c.passed and len(c.failures) == 2 and all("1 NaN/Inf values (first at [0, 0" in f for f in c.failures)
    assert c.get("actions", "nonfinite") == 1.0


def test_memory_tolerance_scales_with_the_largest_memory():
    e = np.full((4, 1, 6), 8.0)
    a = e + 5e-5
    c = compare({MEM: a}, {MEM: e}, FP32)
    assert c.passed and c.get("memories", "max_abs_limit") == pytest.approx(8e-5)
    assert not compare({MEM: e + 9e-5}, {MEM: e}, FP32).passed


def test_a_discrete_flip_is_excused_only_within_the_one_margin_rule():
    masked = np.array([[2.0, 2.0 + 1e-6, -1e8, 0.0, 5.0], [3.0, 0.0, -1.0, 1.0, 0.0]])  # branches (3, 2)
    expected = np.array([[1, 1], [0, 0]])
    near = np.array([[0, 1], [0, 0]])  # branch 0 of row 0: margin 1e-6 <= 1e-5 x max(1, 2)
    far = np.array([[1, 1], [1, 0]])  # branch 0 of row 1: margin 2 > 1e-5 x 3
    ok = compare({DISC: near}, {DISC: expected, "masked_logits": masked}, FP32)
    assert ok.passed and ok.get("discrete_actions", "flips") == 1 and ok.get("discrete_actions", "near_ties") >= 1
    bad = compare({DISC: far}, {DISC: expected, "masked_logits": masked}, FP32)
    assert not bad.passed and bad.get("discrete_actions", "flips_beyond_margin") == 1
    assert "1 of 4 actions differ" in bad.failures[0]
    assert bad.get("discrete_actions", "flip_rate_margin_beyond_10x") > 0 and bad.get("discrete_actions", "flip_rate_margin_within") == 0


def test_without_reference_logits_no_flip_is_excused():
    c = compare({DISC: np.array([[1]])}, {DISC: np.array([[0]])}, Rules(Limits(margin=1e9), "fp32"))
    assert not c.passed


def test_a_nan_margin_never_excuses_a_flip():
    d = discrete_agreement(np.array([[1]]), np.array([[0]]), np.array([[np.nan]]), bound=1e9)
    assert d["flips_beyond_margin"] == 1 and d["near_ties"] == 0


def test_sampled_discrete_actions_are_reported_not_judged():
    twin = DISCRETE_ACTIONS.twin()
    assert twin.name == "discrete_actions" and twin.stem == "sampled_discrete_actions"
    c = compare({twin.name: np.array([[1, 0]])}, {twin.name: np.array([[0, 0]])}, FP32)
    assert c.passed and c.get("sampled_discrete_actions", "flips") == 1


def test_constant_outputs_must_be_exactly_equal():
    out = constant("version_number")
    rules = Rules(outputs=(out,))
    assert compare({"version_number": np.array([3.0])}, {"version_number": np.array([3.0])}, rules).passed
    c = compare({"version_number": np.array([2.0])}, {"version_number": np.array([3.0])}, rules)
    assert not c.passed and c.get("version_number", "equal") == 0.0


def test_a_missing_output_fails():
    c = compare({}, {ACT: actions()}, Rules(outputs=(CONTINUOUS_ACTIONS,)))
    assert not c.passed and "missing" in c.failures[0]


def test_outputs_are_declared_objects_with_sampled_twins_and_stems():
    found = outputs_of({ACT, "continuous_actions", DISC, MEM})
    assert [o.stem for o in found] == ["actions", "sampled_actions", "discrete_actions", "memories"]
    assert [o.rule for o in found] == ["continuous", "continuous", "discrete", "memory"]


def test_ulps_count_in_the_compared_dtype():
    assert ulp(np.array([1.0]), "fp16")[0] == 2.0**-10
    assert ulp(np.array([1.0]), "bf16")[0] == 2.0**-7
    assert ulp(np.array([1.0]), "fp32")[0] == 2.0**-23
    assert ulp(np.array([0.0]), "fp16")[0] == 2.0**-24  # subnormals: the smallest normal's ULP
    e = np.ones((1, 4))
    m = elementwise(e + np.array([[0, 2.0**-10, 2 * 2.0**-10, 0]]), e, dtype="fp16")
    assert m["ulp_max"] == 2.0 and m["ulp_share_over"] == 0.25 and m["ulp_standard"] == 1.0
    assert elementwise(e, e, dtype="fp32")["ulp_standard"] == 32.0


def test_guarded_max_rel_does_not_explode_on_zeros():
    m = elementwise(np.array([[1e-4, 1.0]]), np.array([[0.0, 1.0]]), rel_floor=1e-3)
    assert m["max_rel"] == pytest.approx(0.1)


def test_gaussian_errors_in_the_policys_units():
    mu, ls = np.zeros((2, 3)), np.log(np.full((1, 3), 0.5))
    same = gaussian_divergence(mu, ls, mu, ls)
    assert same["kl_max"] == pytest.approx(0.0, abs=1e-15) and same["mean_shift_sigma_max"] == 0.0
    moved = gaussian_divergence(mu + 0.25, ls, mu, ls)  # a quarter unit is half a sigma of 0.5
    assert moved["mean_shift_sigma_max"] == pytest.approx(0.5)
    assert moved["kl_max"] == pytest.approx(3 * 0.5**2 / 2)  # KL of equal sigmas: (Δμ/σ)² / 2 per dimension


def test_the_masked_softmax_kl_is_zero_when_equal_and_ignores_masked_actions():
    z = np.array([[1.0, 2.0, -1e8]])
    assert softmax_divergence(z, z, (3,))["kl_max"] == pytest.approx(0.0, abs=1e-12)
    assert softmax_divergence(z + np.array([[0.0, 0.1, 0.0]]), z, (3,))["kl_max"] > 0


def test_policy_unit_metrics_appear_when_both_sides_give_distributions():
    a = actions()
    dist = {"mu": a * 3, "log_sigma": np.zeros((1, 4))}
    c = compare({ACT: a, **dist}, {ACT: a, **dist}, FP32)
    assert c.get("actions", "kl_max") == pytest.approx(0.0, abs=1e-12)


def test_fingerprint_exact_and_quantized():
    a = actions()
    b = a.copy()
    b[0, 0] = np.nextafter(b[0, 0], np.float32(2))
    fa, fb = fingerprint({"actions": a}), fingerprint({"actions": b})
    assert fa["fingerprint"] != fb["fingerprint"] and fa["quantized_fingerprint"] == fb["quantized_fingerprint"] and len(fa["fingerprint"]) == 64


def test_the_engine_is_pure_numpy():
    code = "import sys, huggy_exp.verify; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
