"""Backend `fused` (one C++ kernel for Huggy's forward): it agrees with eager wherever it runs, and says where it cannot."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import job_context, small_weights
from test_modes import run_mode

from huggy_exp.errors import Unsupported, UserError
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, OBS, TorchRunner, build


def fused_or_skip(weights, batch_size: int = 0) -> TorchRunner:
    try:
        return TorchRunner(weights, resolve("cpu", "fp32"), batch_size, "fused")
    except Unsupported as exc:
        if "did not build" in str(exc) or "compiler" in str(exc) or "inductor" in str(exc):
            pytest.skip(str(exc))
        raise


def agree(weights, rows: int, batch_size: int = 0, atol: float = 1e-5) -> None:
    obs = np.random.default_rng(rows).normal(0, 30, (rows, weights.obs_dim)).astype(np.float32)
    got = fused_or_skip(weights, batch_size).infer({OBS: obs})[ACTIONS]
    want = TorchRunner(weights, resolve("cpu", "fp32"), batch_size, "eager").infer({OBS: obs})[ACTIONS]
    assert got.shape == want.shape == (rows, weights.act_dim) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_fused_matches_eager_at_any_row_count(rows):
    agree(small_weights(), rows)  # 8 -> 16 -> 16 -> 3: the vector loop, its tails and the odd output rows


def test_fused_matches_eager_in_chunks():
    agree(small_weights(), 10, batch_size=4)


def test_fused_matches_eager_without_a_normalizer_and_for_sac():
    w = small_weights()
    agree(dataclasses.replace(w, normalizer=None, inputs=()), 5)
    agree(dataclasses.replace(w, tanh_squash=True), 5)  # SAC exports its raw mu: no clamp


def test_fused_saturates_like_eager_on_extreme_observations():
    w = small_weights()
    obs = np.full((2, w.obs_dim), 1e6, np.float32)
    obs[1] = -1e6
    got = fused_or_skip(w).infer({OBS: obs})[ACTIONS]
    np.testing.assert_allclose(got, TorchRunner(w, resolve("cpu", "fp32"), 0, "eager").infer({OBS: obs})[ACTIONS], atol=1e-5)


@pytest.mark.slow
def test_fused_matches_eager_on_the_embedded_default(tmp_path):
    ctx = job_context(tmp_path)  # Huggy's shape: 4-row blocks over 512-wide rows
    agree(ctx.weights, 1)
    agree(ctx.weights, 9)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp64"])
def test_fused_is_fp32_only(dtype):
    with pytest.raises(Unsupported, match="backend fused runs fp32 on cpu only"):
        TorchRunner(small_weights(), resolve("cpu", dtype), 0, "fused")


def test_fused_refuses_other_shapes(shaped_files, tmp_path):
    pt, _ = shaped_files["branches"]
    ctx = job_context(tmp_path, f"model.checkpoint={pt}")
    with pytest.raises(UserError, match="backend fused runs Huggy's shape only"):
        build(ctx, "fused")


def test_benchmark_gates_fused_against_eager_and_times_it(small, tmp_path):
    fused_or_skip(small.weights)
    run = run_mode(tmp_path, "benchmark", small.model, "mode.backends=[eager,fused]", "batch_size=1",
                   "mode.budget_s=0.05", "mode.warmup_s=0.01", "mode.rounds=1")
    m = run.record["metrics"]
    assert run.record["status"] == "passed", run.record["reason"]
    assert m["fused/max_abs_vs_eager"] <= 1e-5 and m["fused/b1/p50_us"] > 0


def test_a_nan_observation_gives_nan_actions_as_eager_does():
    w = small_weights()
    obs = np.zeros((2, w.obs_dim), np.float32)
    obs[1, 2] = np.nan
    got = fused_or_skip(w).infer({OBS: obs})[ACTIONS]
    want = TorchRunner(w, resolve("cpu", "fp32"), 0, "eager").infer({OBS: obs})[ACTIONS]
    assert np.isfinite(got[0]).all() and np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[1]).any()
