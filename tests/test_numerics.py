"""huggy_exp.numerics: comparison metrics, clipped-normal moments, the sampling test, verdicts and thresholds.

Every expected number here is worked out by hand (or by a seeded Monte Carlo), never by calling the function
under test a second time.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pytest

from huggy_exp.numerics import (
    action_stats,
    clipped_normal_moments,
    error_ratio,
    limits_for,
    ratio_verdict,
    sampling_check,
)
from huggy_exp.errors import UserError
from huggy_exp import verify
from huggy_exp.verify import CONTINUOUS_ACTIONS, REL_FLOOR, cosine, elementwise
from huggy_exp.verify import elementwise as compare  # the one element-wise engine

# --- compare()

ACTUAL = np.array([[1.0, 2.0], [3.0, 4.0]])
EXPECTED = np.array([[1.0, 2.5], [3.0, 3.0]])
# |diff| = [0, 0.5, 0, 1]; |diff| / |expected| = [0, 0.2, 0, 1/3]


def test_compare_max_mean_abs_and_rmse_match_hand_computation():
    m = compare(ACTUAL, EXPECTED)
    assert m["max_abs"] == pytest.approx(1.0)
    assert m["mean_abs"] == pytest.approx(1.5 / 4)
    assert m["rmse"] == pytest.approx(math.sqrt((0.25 + 1.0) / 4))
    assert m["nan_mismatch"] == 0.0 and m["inf_mismatch"] == 0.0


def test_compare_relative_errors_and_min_tolerances_match_hand_computation():
    m = compare(ACTUAL, EXPECTED)
    assert m["max_rel"] == pytest.approx(1 / 3)
    # the smallest atol / rtol that would make np.allclose-style checks pass element-wise
    assert m["required_atol"] == pytest.approx(1.0)
    assert m["required_rtol"] == pytest.approx(1 / 3)


def test_compare_cosine_over_everything_and_worst_row():
    m = compare(ACTUAL, EXPECTED)
    dot = 1 * 1 + 2 * 2.5 + 3 * 3 + 4 * 3
    assert m["cosine"] == pytest.approx(dot / (math.sqrt(1 + 4 + 9 + 16) * math.sqrt(1 + 6.25 + 9 + 9)))
    row0 = (1 + 5) / (math.sqrt(5) * math.sqrt(1 + 6.25))
    row1 = (9 + 12) / (math.sqrt(9 + 16) * math.sqrt(9 + 9))
    assert m["cosine_min_row"] == pytest.approx(min(row0, row1))


def test_compare_relative_error_divides_by_the_floor_near_zero():
    m = compare(np.array([1e-4, 0.0]), np.array([0.0, 0.0]))
    assert REL_FLOOR == 1e-3
    assert m["max_rel"] == pytest.approx(1e-4 / REL_FLOOR)
    assert compare(np.array([1e-4]), np.array([0.0]), rel_floor=1e-2)["max_rel"] == pytest.approx(1e-2)


def test_compare_identical_arrays_are_exact():
    x = np.linspace(-1, 1, 12).reshape(3, 4)
    m = compare(x, x.copy())
    assert m["max_abs"] == 0.0 and m["rmse"] == 0.0 and m["max_rel"] == 0.0
    assert m["cosine"] == pytest.approx(1.0) and m["cosine_min_row"] == pytest.approx(1.0)


def test_nan_in_actual_where_expected_is_finite_is_a_nan_mismatch_not_hidden():
    actual = np.array([[np.nan, 1.0], [2.0, 3.0]])
    expected = np.array([[1.0, 1.0], [2.0, 3.5]])
    m = compare(actual, expected)
    assert m["nan_mismatch"] == 1.0 and m["nonfinite_actual"] == 1.0
    assert m["max_abs"] == np.inf and np.isnan(m["cosine"])  # a NaN is no agreement: nothing reads as close


def test_nan_in_both_at_the_same_place_is_not_a_mismatch():
    m = compare(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))
    assert m["nan_mismatch"] == 0.0
    assert m["nonfinite_expected"] == 1.0 and m["max_abs"] == np.inf  # ... and still no agreement


def test_inf_against_finite_and_inf_of_opposite_sign_are_inf_mismatches():
    assert compare(np.array([np.inf, 1.0]), np.array([1.0, 1.0]))["inf_mismatch"] == 1.0
    assert compare(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))["inf_mismatch"] == 1.0
    assert compare(np.array([np.inf, 1.0]), np.array([np.inf, 1.0]))["inf_mismatch"] == 0.0


def test_cosine_of_zero_vectors():
    z = np.zeros(5)
    assert cosine(z, z) == 1.0
    assert cosine(z, np.ones(5)) == 0.0
    assert cosine(np.ones(5), z) == 0.0
    assert cosine(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(0.0)
    assert cosine(np.array([1.0, 2.0]), np.array([-1.0, -2.0])) == pytest.approx(-1.0)
    m = compare(np.zeros((2, 3)), np.zeros((2, 3)))
    assert m["cosine"] == 1.0 and m["cosine_min_row"] == 1.0


def test_rel_rmse_is_rmse_over_rms_of_expected():
    expected = np.array([3.0, 4.0])  # rms = sqrt(12.5)
    actual = np.array([3.0, 5.0])  # rmse = sqrt(0.5)
    assert elementwise(actual, expected)["rel_rmse"] == pytest.approx(math.sqrt(0.5) / math.sqrt(12.5))
    assert elementwise(np.array([0.1, 0.0]), np.zeros(2))["rel_rmse"] == pytest.approx(math.sqrt(0.005))  # zero scale: rmse


def test_sqnr_is_signal_over_noise_in_db_and_identical_outputs_are_plus_infinity():
    expected = np.array([[3.0, 4.0], [0.0, 5.0]])  # signal 50
    actual = expected + np.array([[0.0, 0.5], [0.5, 0.0]])  # noise 0.5
    assert elementwise(actual, expected)["sqnr_db"] == pytest.approx(20.0)  # 10 log10(100)
    assert elementwise(expected, expected)["sqnr_db"] == math.inf  # no noise: identical, not a failure
    assert elementwise(np.ones(2), np.zeros(2))["sqnr_db"] == -math.inf  # noise on a zero signal
    assert math.isnan(elementwise(np.array([np.nan, 1.0]), np.ones(2))["sqnr_db"])  # undefined, like the cosine
    assert verify.compare({CONTINUOUS_ACTIONS.name: actual}, {CONTINUOUS_ACTIONS.name: expected}).metrics("fp64")[
        "actions/vs_fp64/sqnr_db"] == pytest.approx(20.0)  # every comparison of the engine


def test_action_stats_by_hand():
    s = action_stats(np.array([[-1.0, 0.0], [0.5, 1.0]]))
    assert s["action_mean"] == pytest.approx(0.125)
    assert s["action_min"] == -1.0 and s["action_max"] == 1.0
    assert s["saturated_share"] == pytest.approx(0.5)
    assert s["action_std"] == pytest.approx(np.std([-1.0, 0.0, 0.5, 1.0]))


# --- clipped_normal_moments vs Monte Carlo

MUS = np.array([0.0, 1.5, 2.9, -2.5, 3.5, 6.0, -4.5])  # 3.5, 6.0, -4.5 lie beyond the clip bound
SIGMAS = np.array([1.0, 2.0, 0.3, 0.8, 1.0, 1.0, 0.7])


@pytest.fixture(scope="module")
def clipped_draws():
    rng = np.random.default_rng(1234)
    z = rng.standard_normal((1_000_000, len(MUS)))
    return np.clip(MUS + SIGMAS * z, -3.0, 3.0)


def test_clipped_normal_mean_matches_monte_carlo(clipped_draws):
    mean, _ = clipped_normal_moments(MUS, SIGMAS, -3.0, 3.0)
    n = len(clipped_draws)
    mc_mean = clipped_draws.mean(axis=0)
    se = clipped_draws.std(axis=0) / math.sqrt(n)
    assert np.all(np.abs(mean - mc_mean) <= 5 * se + 1e-12), (mean, mc_mean, se)


def test_clipped_normal_variance_matches_monte_carlo(clipped_draws):
    _, var = clipped_normal_moments(MUS, SIGMAS, -3.0, 3.0)
    n = len(clipped_draws)
    dev2 = (clipped_draws - clipped_draws.mean(axis=0)) ** 2
    mc_var = dev2.mean(axis=0)
    se = dev2.std(axis=0) / math.sqrt(n)
    assert np.all(np.abs(var - mc_var) <= 5 * se + 1e-12), (var, mc_var, se)


def test_clipped_normal_moments_limits():
    # unclipped when the bounds are far away: N(mu, sigma^2)
    mean, var = clipped_normal_moments(np.array([0.3]), np.array([0.5]), -50.0, 50.0)
    assert mean[0] == pytest.approx(0.3) and var[0] == pytest.approx(0.25)
    # mu far beyond the bound: almost surely the bound, almost no spread
    mean, var = clipped_normal_moments(np.array([10.0, -10.0]), np.array([1.0, 1.0]), -3.0, 3.0)
    assert mean == pytest.approx([3.0, -3.0], abs=1e-9)
    assert np.all(var >= 0) and np.all(var < 1e-9)
    # mu exactly at the bound: half the mass sits on it; mean = 3 - sigma * phi(0)
    mean, _ = clipped_normal_moments(np.array([3.0]), np.array([1.0]), -3.0, 3.0)
    assert mean[0] == pytest.approx(3.0 - 1.0 / math.sqrt(2 * math.pi), abs=1e-9)


# --- sampling_check

ROWS_MU = np.array([[0.0, 1.0, -2.0], [2.5, -0.5, 3.4], [0.2, -3.5, 1.1], [-1.0, 0.7, 2.0]])
ROWS_SIGMA = np.array([[1.0, 0.6, 0.8], [0.5, 1.2, 1.0], [0.9, 0.7, 1.5], [0.4, 1.0, 0.3]])


def _draws(mu, sigma, reps=4000, seed=7, clip=True):
    z = np.random.default_rng(seed).standard_normal((reps, *np.shape(mu)))
    x = mu + sigma * z
    return np.clip(x, -3.0, 3.0) if clip else x


def test_sampling_check_passes_on_draws_from_the_right_distribution():
    s = sampling_check(_draws(ROWS_MU, ROWS_SIGMA), ROWS_MU, ROWS_SIGMA, -3.0, 3.0)
    assert s["cells"] == 12.0 and s["samples_per_cell"] == 4000.0
    assert s["mean_z_max"] <= s["mean_z_crit"]
    assert 0 < s["spread_cells"] < 12  # cells likely to be clipped are left out of the spread test
    assert abs(s["spread_ratio"] - 1.0) <= s["spread_tolerance"]


def test_sampling_check_critical_value_is_bonferroni_corrected():
    from statistics import NormalDist

    s = sampling_check(_draws(ROWS_MU, ROWS_SIGMA), ROWS_MU, ROWS_SIGMA, -3.0, 3.0, confidence=0.999)
    assert s["mean_z_crit"] == pytest.approx(NormalDist().inv_cdf(1 - 0.001 / (2 * 12)))


def test_sampling_check_fails_when_mu_is_shifted_by_0_2():
    shifted = _draws(ROWS_MU + 0.2, ROWS_SIGMA)
    s = sampling_check(shifted, ROWS_MU, ROWS_SIGMA, -3.0, 3.0)
    assert s["mean_z_max"] > s["mean_z_crit"]


def test_sampling_check_flags_a_wrong_spread():
    wide = _draws(ROWS_MU, ROWS_SIGMA * 1.2)
    s = sampling_check(wide, ROWS_MU, ROWS_SIGMA, -3.0, 3.0)
    assert abs(s["spread_ratio"] - 1.0) > s["spread_tolerance"]


def test_sampling_check_without_clipping_uses_the_plain_normal():
    mu, sigma = ROWS_MU, ROWS_SIGMA
    good = sampling_check(_draws(mu, sigma, clip=False), mu, sigma, None, None)
    assert good["mean_z_max"] <= good["mean_z_crit"]
    assert good["spread_cells"] == 12.0
    bad = sampling_check(_draws(mu + 0.2, sigma, clip=False), mu, sigma, None, None)
    assert bad["mean_z_max"] > bad["mean_z_crit"]


# --- relative verdicts


@pytest.mark.parametrize(
    "ratio, verdict",
    [(0.0, "pass"), (0.5, "pass"), (1.0, "pass"), (1.0001, "warn"), (1.5, "warn"), (2.0, "warn"), (2.0001, "fail"),
     (10.0, "fail"), (float("inf"), "fail"), (float("nan"), "fail")],
)
def test_ratio_verdict_thresholds(ratio, verdict):
    assert ratio_verdict(ratio) == verdict


def test_ratio_verdict_custom_thresholds():
    assert ratio_verdict(1.2, warn=1.5, fail=3.0) == "pass"
    assert ratio_verdict(2.0, warn=1.5, fail=3.0) == "warn"
    assert ratio_verdict(3.5, warn=1.5, fail=3.0) == "fail"


def test_error_ratio_treats_both_exact_as_equal_and_exact_cpu_as_infinitely_better():
    assert error_ratio(0.0, 0.0) == 1.0
    assert error_ratio(1e-3, 0.0) == float("inf")
    assert error_ratio(2e-3, 1e-3) == pytest.approx(2.0)
    assert ratio_verdict(error_ratio(1e-3, 0.0)) == "fail"


# --- limits_for

TABLE = {"fp16": {"max_abs": 1e-2, "cosine_min": 0.999}, "bf16": {"max_abs": 5e-2, "cosine_min": 0.99}}
SPECIALIZE = {"npu_fp16": {"max_abs": 2e-2}}


def test_limits_for_npu_fp16_overrides_only_what_it_names():
    assert limits_for(TABLE, "fp16", "npu", SPECIALIZE, "verify.limits") == {"max_abs": 2e-2, "cosine_min": 0.999}
    assert limits_for(TABLE, "fp16", "npu:3", SPECIALIZE, "verify.limits") == {"max_abs": 2e-2, "cosine_min": 0.999}


@pytest.mark.parametrize("dtype, device", [("fp16", "cpu"), ("fp16", "cuda:0"), ("bf16", "npu"), ("bf16", "npu:1")])
def test_limits_for_specialisation_does_not_leak_to_other_devices_or_dtypes(dtype, device):
    assert limits_for(TABLE, dtype, device, SPECIALIZE, "verify.limits") == TABLE[dtype]


def test_limits_for_does_not_modify_the_table():
    limits_for(TABLE, "fp16", "npu", SPECIALIZE, "verify.limits")
    assert TABLE["fp16"]["max_abs"] == 1e-2
    assert limits_for(TABLE, "fp16", "npu", None, "verify.limits") == TABLE["fp16"]


@pytest.mark.parametrize("table", [TABLE, {}])
def test_a_dtype_missing_from_a_limit_table_is_an_error_naming_the_key_never_a_default(table):
    with pytest.raises(UserError, match=r"^verify.limits.fp64 is missing: a dtype without a limit cannot be judged"):
        limits_for(table, "fp64", "cpu", None, "verify.limits")
    with pytest.raises(UserError, match=r"^verify.limits.fp16 is missing") if not table else nullcontext():
        limits_for(table, "fp16", "npu", SPECIALIZE, "verify.limits")  # a device exception is no limit on its own
