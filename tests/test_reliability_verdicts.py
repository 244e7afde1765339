"""Reliability, issue 27's false verdicts, foreign reads and injection: nothing that is not finite passes, diff says "not
applicable" where points cannot be compared, a sweep never recommends across different weights, sync reads foreign
results under caps and uploads only the job's own files, and every human-readable output escapes what users wrote.

docs/reliability.md ("Hostile probes") lists each class with the test that holds it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_certificate import copy_bundle, record, replay, rewrite_npz, run_job, small_bundle  # noqa: F401 (fixture)

from test_reliability import one_line
from test_trust import cli

from huggy_exp import bundle, verify
from huggy_exp.errors import UserError


def rehash(root: Path, name: str) -> None:
    """A bundle file edited and its manifest entry updated to match: only the content checks stand in the way."""
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": bundle.sha256_of(root / name), "bytes": (root / name).stat().st_size}
    (root / "manifest.json").write_text(json.dumps(manifest))


def poison(root: Path, name: str, value: float = np.nan) -> Path:
    """Every float array of a bundle .npz set to `value` (NaN, inf), the manifest re-hashed."""
    rewrite_npz(root / name, lambda k, v: np.full_like(v, value) if v.dtype.kind == "f" else v)
    rehash(root, name)
    return root


# --- 7. nothing that is not finite ever passes: references, candidates and limits


@pytest.mark.parametrize("rule", ["continuous", "memory"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_reference_never_passes_the_engine(rule, bad):
    out = verify.Output("x", None, "x", rule)
    got = np.ones((4, 3), np.float32)
    ref = got.astype(np.float64)
    ref[1, 2] = bad
    c = verify.compare({"x": got}, {"x": ref}, verify.Rules(verify.Limits(atol=1e9, rtol=1.0), outputs=(out,)))
    assert not c.passed and any("reference holds 1 NaN/Inf" in f for f in c.failures)
    every = verify.compare({"x": np.full_like(got, bad)}, {"x": np.full_like(ref, bad)}, verify.Rules(outputs=(out,)))
    assert not every.passed  # the same NaN on both sides is no agreement


def test_elementwise_metrics_of_non_finite_values_are_never_perfect():
    m = verify.elementwise(np.full((3, 2), np.nan), np.full((3, 2), np.nan))
    assert m["max_abs"] == np.inf and m["rmse"] == np.inf and np.isnan(m["cosine"]) and m["nonfinite_expected"] == 6
    assert not verify.within(m["max_abs"], 1.0) and not verify.within(0.0, float("nan")) and not verify.within(0, np.inf)
    assert verify.within(0.5, 1.0) and not verify.within("0.5", None)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "x", None, True])
def test_a_limit_that_is_not_a_finite_number_is_an_error(value):
    with pytest.raises(UserError, match=r"mode.tolerance.fp32=.*finite number"):
        verify.finite_limits({"fp32": value}, "mode.tolerance")
    with pytest.raises(UserError, match="missing limit is an error"):
        verify.limit({"fp16": 1.0}, "fp32", "mode.tolerance")


def test_replay_of_a_bundle_whose_fp64_reference_is_nan_fails(small_bundle, small, tmp_path):
    b = poison(copy_bundle(small_bundle, tmp_path / "b"), bundle.REFERENCE)
    r = replay(tmp_path / "job", b, small.model).record
    assert r["status"] == "failed" and "the bundle's fp64 reference actions holds" in r["reason"], r["reason"]
    assert r["metrics"].get("actions/vs_fp64/cosine") != 1.0


def test_replay_of_a_recording_with_an_inf_fails_even_without_a_match(small_bundle, small, tmp_path):
    """Variant: one +inf in the recorded point; the replay is held to it through mode.reference_point=fp32 in bf16."""
    b = copy_bundle(small_bundle, tmp_path / "b")
    name = "points/cpu-fp32-eager-b64/outputs.npz"
    rewrite_npz(b / name, lambda k, v: np.where(np.arange(v.size).reshape(v.shape) == 0, np.inf, v).astype(v.dtype)
                if v.dtype.kind == "f" else v)
    rehash(b, name)
    r = replay(tmp_path / "job", b, small.model, "dtype=bf16", "mode.reference_point=fp32").record
    assert r["status"] == "failed" and "the recording cpu/fp32/eager/b64 actions holds 1 NaN/Inf" in r["reason"], r["reason"]


def test_diff_against_a_nan_reference_or_nan_candidate_fails(small_bundle, tmp_path):
    nan_ref = poison(copy_bundle(small_bundle, tmp_path / "nan_ref"), bundle.REFERENCE)
    r = run_job(tmp_path / "d1", "diff", f"mode.baseline={small_bundle}", f"mode.candidate={nan_ref}").record
    assert r["status"] == "failed" and "fp64 reference actions holds" in r["reason"], r["reason"]
    r = run_job(tmp_path / "d2", "diff", f"mode.baseline={nan_ref}", f"mode.candidate={small_bundle}").record
    assert r["status"] == "failed" and "baseline cpu/fp32/eager/b64: fp64 reference" in r["reason"], r["reason"]
    nan_out = poison(copy_bundle(small_bundle, tmp_path / "nan_out"), "points/cpu-fp32-eager-b64/outputs.npz")
    r = run_job(tmp_path / "d3", "diff", f"mode.baseline={small_bundle}", f"mode.candidate={nan_out}").record
    assert r["status"] == "failed" and "candidate cpu/fp32/eager/b64: actions holds" in r["reason"], r["reason"]


@pytest.mark.parametrize("override, key", [
    ("mode.layer_specialize={cpu_fp16: {rel_rmse: nan}}", "specialize.cpu_fp16.rel_rmse"),
    ("mode.layer_thresholds.fp16.rel_rmse=inf", "mode.layer_thresholds.fp16.rel_rmse"),
    ("verify.specialize={cpu_fp16: {max_abs: .nan}}", "specialize.cpu_fp16.max_abs"),
])
def test_a_non_finite_limit_never_switches_a_check_off(override, key, small, tmp_path):
    got = cli(["mode=precision", small.model, "dtype=fp16", "obs.rows=8", "tracking=none", override], tmp_path / "job")
    line = one_line(got, "finite number")
    assert got.code == 2 and key in line and (got.record is None or got.record["status"] == "error"), got.err[-2000:]


def test_a_nan_tolerance_in_replay_is_an_error(small_bundle, small, tmp_path):
    r = replay(tmp_path / "job", small_bundle, small.model, "mode.tolerance.fp32=nan").record
    assert r["status"] == "error" and "mode.tolerance.fp32" in r["reason"], r["reason"]


# --- 8. diff of points on other inputs: not applicable, never an error


@pytest.mark.parametrize("other", ["obs.rows=12", "obs.scale=2.0"])
def test_diff_of_two_sweeps_on_other_inputs_says_not_applicable(other, small, tmp_path):
    for side, obs in (("base", "obs.rows=8"), ("cand", other)):
        for n, dtype in enumerate(("fp32", "bf16")):
            job = run_job(tmp_path / side / str(n), "precision", small.model, f"dtype={dtype}", "obs.rows=8", obs)
            assert job.record["status"] in ("passed", "failed"), job.record["reason"]
    r = run_job(tmp_path / "diff", "diff", f"mode.baseline={tmp_path / 'base'}", f"mode.candidate={tmp_path / 'cand'}").record
    assert r["status"] == "passed", r["reason"]
    both = [p for p in r["points"] if p["side"] == "both"]
    assert both and all("not applicable" in " ".join(p["changes"]) and p["dual"] is None for p in both), both
