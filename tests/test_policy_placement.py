"""Placement (device/dtype names -> torch), the torch Policy against the numpy reference, observation sources."""

from __future__ import annotations

import importlib.abc
import sys

import numpy as np
import pytest
import torch
from conftest import SPECS, make_actor

from huggy_exp import mlagents
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.observations import EXTREME, make_observations
from huggy_exp.placement import DTYPES, resolve
from huggy_exp.policy import Policy, cpu_noise
from huggy_exp.runners import ACTIONS, OBS, SAMPLED, TorchRunner

# --- placement


@pytest.mark.parametrize("dtype", ["fp8", "float32", "int4", ""])
def test_unknown_dtype_is_a_user_error_listing_valid_dtypes(dtype):
    with pytest.raises(UserError) as err:
        resolve("cpu", dtype)
    msg = str(err.value)
    assert repr(dtype) in msg
    assert all(name in msg for name in ("fp32", "fp16", "bf16", "fp64"))


@pytest.mark.parametrize("device", ["tpu", "gpu:0", "cuda:x", "npu0", "CPU"])
def test_unknown_device_is_a_user_error_listing_valid_devices(device):
    with pytest.raises(UserError) as err:
        resolve(device, "fp32")
    msg = str(err.value)
    assert repr(device) in msg
    assert all(name in msg for name in ("cpu", "cuda", "npu", "mps"))


@pytest.mark.parametrize(
    "device, present",
    [
        ("cuda", lambda: torch.cuda.is_available()),
        ("cuda:0", lambda: torch.cuda.is_available()),
        ("npu:0", lambda: hasattr(torch, "npu")),
        ("mps", lambda: torch.backends.mps.is_available()),
    ],
)
def test_absent_accelerator_is_unsupported_never_silently_cpu(device, present):
    if present():
        pytest.skip(f"{device} exists on this machine")
    with pytest.raises(Unsupported) as err:
        resolve(device, "fp32")
    assert device.split(":")[0] in str(err.value).lower()


def test_npu_unsupported_reason_mentions_torch_npu():
    if hasattr(torch, "npu"):
        pytest.skip("torch_npu is installed here")
    with pytest.raises(Unsupported, match="torch_npu"):
        resolve("npu:0", "fp32")


class _ImportSpy(importlib.abc.MetaPathFinder):
    """Records attempts to import torch_npu (and lets the normal machinery continue)."""

    def __init__(self):
        self.asked = []

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch_npu":
            self.asked.append(name)
        return None


def test_cpu_placement_never_imports_torch_npu():
    already = "torch_npu" in sys.modules  # only on an Ascend host where something imported it before this test
    spy = _ImportSpy()
    sys.meta_path.insert(0, spy)
    try:
        target = resolve("cpu", "fp32")
        assert target.device == torch.device("cpu") and target.dtype == torch.float32
        assert spy.asked == []
        if not already:
            assert "torch_npu" not in sys.modules
        if not hasattr(torch, "npu"):  # the spy does see an npu request: this test can tell the difference
            with pytest.raises(Unsupported):
                resolve("npu:0", "fp32")
            assert spy.asked, "resolve('npu:0') should have tried to import torch_npu"
    finally:
        sys.meta_path.remove(spy)


@pytest.mark.parametrize("name, dtype", list(DTYPES.items()))
def test_cpu_resolves_every_dtype(name, dtype):
    target = resolve("cpu", name)
    assert (target.device.type, target.dtype, target.dtype_name) == ("cpu", dtype, name)


# --- policy


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_normalizer_buffers_stay_float32_under_low_precision(dtype, huggy_actor):
    policy = Policy(huggy_actor.policy_weights()).place(torch.device("cpu"), dtype)
    assert policy.continuous.mu.weight.dtype == dtype and policy.body[0].weight.dtype == dtype
    stats = policy.normalizers[0]
    assert stats.running_mean.dtype == torch.float32 and stats.std.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_normalizer_statistics_keep_their_exact_float32_values_under_low_precision(dtype, huggy_actor):
    # casting the module to fp16 and the statistics back to fp32 afterwards would round them through fp16
    policy = Policy(huggy_actor.policy_weights()).place(torch.device("cpu"), dtype)
    np.testing.assert_array_equal(policy.normalizers[0].running_mean.numpy(), huggy_actor.mean)
    np.testing.assert_array_equal(policy.normalizers[0].std.numpy(), huggy_actor.std32())
    np.testing.assert_array_equal(policy.continuous.log_sigma_const.numpy(), huggy_actor.log_sigma)


def test_fp16_normalizer_stays_finite(huggy_actor):
    with np.errstate(over="ignore"):
        assert huggy_actor.var.max() >= 6e8 and np.isinf(huggy_actor.var.astype(np.float16)).any()
    policy = Policy(huggy_actor.policy_weights()).place(torch.device("cpu"), torch.float16)
    obs = np.concatenate([huggy_actor.in_distribution_obs(16), np.full((2, 59), EXTREME, np.float32),
                          np.full((2, 59), -EXTREME, np.float32)])
    normalized = policy.normalize(torch.from_numpy(obs))
    assert torch.isfinite(normalized).all()
    np.testing.assert_allclose(normalized.numpy(), huggy_actor.normalized(obs), atol=1e-5)
    actions = policy(torch.from_numpy(obs))
    assert torch.isfinite(actions).all() and actions.dtype == torch.float32


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fp64_policy_matches_numpy_reference_to_1e12(name, actors):
    actor = actors[name]
    obs = np.concatenate([actor.in_distribution_obs(24, seed=1), actor.in_distribution_obs(8, seed=2) * 3])
    got = TorchRunner(actor.policy_weights(), resolve("cpu", "fp64"), batch_size=10).infer({OBS: obs})[ACTIONS]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, actor.actions(obs), atol=1e-12, rtol=0)
    assert np.abs(got).max() > 0.1


@pytest.mark.parametrize("name", sorted(SPECS))
def test_fp32_policy_matches_numpy_reference_to_1e6(name, actors):
    actor = actors[name]
    obs = actor.in_distribution_obs(32, seed=3)
    got = TorchRunner(actor.policy_weights(), resolve("cpu", "fp32"), batch_size=7).infer({OBS: obs})[ACTIONS]
    np.testing.assert_allclose(got, actor.actions(obs), atol=1e-6, rtol=0)


def test_deterministic_action_is_clamped_mu_over_three(huggy_actor):
    obs = huggy_actor.in_distribution_obs(64, seed=4) * 5  # far out: some mu beyond +-3
    mu = huggy_actor.mu(obs)
    assert (np.abs(mu) > 3).any()
    got = TorchRunner(huggy_actor.policy_weights(), resolve("cpu", "fp64")).infer({OBS: obs})[ACTIONS]
    assert np.abs(got).max() == 1.0
    np.testing.assert_allclose(got, np.clip(mu, -3, 3) / 3, atol=1e-12)


def _sampled(actor, obs, seed, batch_size=64, dtype="fp32"):
    return TorchRunner(actor.policy_weights(), resolve("cpu", dtype), batch_size).sample({OBS: obs}, seed)[SAMPLED]


def test_sampled_actions_same_seed_identical_bytes(huggy_actor):
    obs = huggy_actor.in_distribution_obs(40)
    a, b = _sampled(huggy_actor, obs, seed=7), _sampled(huggy_actor, obs, seed=7)
    assert a.tobytes() == b.tobytes()


def test_sampled_actions_different_seed_differ(huggy_actor):
    obs = huggy_actor.in_distribution_obs(40)
    a, b = _sampled(huggy_actor, obs, seed=7), _sampled(huggy_actor, obs, seed=8)
    assert not np.allclose(a, b)


def test_sampled_actions_follow_the_reference_with_cpu_noise(huggy_actor):
    obs = huggy_actor.in_distribution_obs(40)
    noise = cpu_noise(40, 21, 7).numpy()
    np.testing.assert_allclose(_sampled(huggy_actor, obs, 7, dtype="fp64"), huggy_actor.sampled(obs, noise), atol=1e-12)
    deterministic = huggy_actor.actions(obs)
    assert np.abs(_sampled(huggy_actor, obs, 7, dtype="fp64") - deterministic).max() > 0.01  # noise was applied


@pytest.mark.parametrize("batch_size", [1, 7, 16])
def test_batch_size_chunking_does_not_change_sampled_actions(batch_size, huggy_actor):
    obs = huggy_actor.in_distribution_obs(40)
    whole = _sampled(huggy_actor, obs, 7, batch_size=64, dtype="fp64")
    chunked = _sampled(huggy_actor, obs, 7, batch_size=batch_size, dtype="fp64")
    np.testing.assert_allclose(chunked, whole, atol=1e-12, rtol=0)


def test_cpu_noise_is_seeded_and_standard_normal():
    a, b = cpu_noise(500, 21, 3), cpu_noise(500, 21, 3)
    assert a.device.type == "cpu" and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, cpu_noise(500, 21, 4))
    assert abs(float(a.mean())) < 0.05 and abs(float(a.std()) - 1) < 0.05


# --- observation sources


def test_random_observations_are_deterministic_per_seed(huggy_actor):
    n = huggy_actor.policy_weights().normalizer
    a = make_observations("random", 59, 32, seed=5, normalizer=n)
    b = make_observations("random", 59, 32, seed=5, normalizer=n)
    c = make_observations("random", 59, 32, seed=6, normalizer=n)
    assert a.dtype == np.float32 and a.shape == (32, 59)
    assert a.tobytes() == b.tobytes() and not np.array_equal(a, c)


def test_random_observations_are_drawn_around_the_normalizer(huggy_actor):
    n = huggy_actor.policy_weights().normalizer
    obs = make_observations("random", 59, 4000, seed=0, normalizer=n).astype(np.float64)
    z = (obs - huggy_actor.mean) / huggy_actor.std32()
    assert np.abs(z.mean(axis=0)).max() < 0.15
    assert np.abs(z.std(axis=0) - 1).max() < 0.15


def test_zero_observations():
    obs = make_observations("zeros", 8, 5)
    assert obs.shape == (5, 8) and obs.dtype == np.float32 and not obs.any()


def test_extreme_observations_hit_the_normalizer_clamp_exactly(huggy_actor):
    obs = make_observations("extreme", 59, 16, seed=1)
    assert set(np.unique(np.abs(obs))) == {EXTREME}
    assert (obs[0] > 0).all() and (obs[1] < 0).all()
    normalized = Policy(huggy_actor.policy_weights()).normalize(torch.from_numpy(obs)).numpy()
    assert set(np.unique(np.abs(normalized))) == {5.0}
    np.testing.assert_array_equal(np.sign(normalized), np.sign(obs))


def test_unknown_observation_source_is_a_user_error():
    with pytest.raises(UserError, match="'gauss'"):
        make_observations("gauss", 8)


def test_observation_file_loads_float32(tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.arange(24, dtype=np.float64).reshape(3, 8))
    obs = make_observations("file", 8, path=str(path))
    assert obs.dtype == np.float32 and obs.shape == (3, 8) and obs[2, 7] == 23


def test_observation_file_with_wrong_width_names_expected_and_actual(tmp_path):
    path = tmp_path / "obs.npy"
    np.save(path, np.zeros((4, 58), np.float32))
    with pytest.raises(UserError) as err:
        make_observations("file", 59, path=str(path))
    assert "59" in str(err.value) and "58" in str(err.value) and "obs.npy" in str(err.value)


def test_observation_file_with_nan_is_a_user_error_naming_where(tmp_path):
    obs = np.zeros((4, 8), np.float32)
    obs[2, 5] = np.nan
    path = tmp_path / "nan.npy"
    np.save(path, obs)
    with pytest.raises(UserError, match="NaN") as err:
        make_observations("file", 8, path=str(path))
    assert "row 2" in str(err.value) and "column 5" in str(err.value)


def test_pickled_object_observation_file_is_refused(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}, [1, 2]], dtype=object), allow_pickle=True)
    with pytest.raises(UserError, match="pickle"):
        make_observations("file", 8, path=str(path))


def test_missing_observation_file_and_missing_path_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found"):
        make_observations("file", 8, path=str(tmp_path / "absent.npy"))
    with pytest.raises(UserError, match="obs.path"):
        make_observations("file", 8, path=None)


def test_policy_without_normalizer_passes_observations_through():
    actor = make_actor(SPECS["3dball"])
    policy = Policy(actor.policy_weights())
    obs = torch.tensor([[1e4] * 8])
    assert torch.equal(policy.normalize(obs), obs)


def test_embedded_default_fp16_actions_are_finite(default_model):
    obs = make_observations("extreme", 59, 8, seed=0)
    actions = TorchRunner(default_model.weights, resolve("cpu", "fp16")).infer({OBS: obs})[ACTIONS]
    assert np.isfinite(actions).all()
    assert isinstance(default_model, mlagents.LoadedModel)
