"""Device placement proven without a device: the torch runner under torch's FakeTensorMode on `cuda:0`.

Under FakeTensorMode a CPU-only build accepts tensors on `cuda:0` (metadata only, no kernels run), and an op that meets
tensors of two devices raises FakeTensorDeviceMismatchError as a real device would. The runner's own code runs: the
policy built and placed on the device, the feeds moved there, the CPU noise drawn and moved, every head and the memory.
Three checks, each shown to fail on a mutant of the code it guards:
- every random draw happens on the CPU (a dispatch mode records the device of every random op);
- the normalizer statistics stay float32 on the device while the layers take the low dtype;
- no op mixes a CPU tensor with a device tensor (FakeTensorMode refuses it).
The references are CPU runners by construction (`runners.reference`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import SHAPES, job_context
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from huggy_exp import mlagents, policy as policy_module, runners
from huggy_exp.placement import Target
from huggy_exp.policy import Normalization

DEVICE = torch.device("cuda", 0)  # an index: "cuda" alone would ask the (absent) CUDA runtime for its current device
RANDOM_OPS = ("randn", "rand", "normal", "uniform", "bernoulli", "multinomial", "randint", "random", "exponential")


class RandomDraws(TorchDispatchMode):
    """Records the device of every random op's output."""

    def __init__(self):
        super().__init__()
        self.devices: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0].rstrip("_")
        if name in RANDOM_OPS:
            self.devices.append((name, str(out.device)))
        return out


def folded(weights):
    """The same weights with every normalizer's std computed now (the loader computes it with torch, which under
    FakeTensorMode would give no values)."""
    fold = lambda n: None if n is None else replace(n, folded_std=n.std)  # noqa: E731
    return replace(weights, normalizer=fold(weights.normalizer), inputs=tuple(replace(i, normalizer=fold(i.normalizer)) for i in weights.inputs))


def fake_run(weights, dtype: torch.dtype, feeds: dict[str, np.ndarray], monkeypatch) -> tuple[runners.TorchRunner, dict, list]:
    """The runner on fake cuda:0: built, placed, infer and sample run; outputs stay fake tensors (nothing to copy back)."""
    weights = folded(weights)
    monkeypatch.setattr(runners, "_numpy", lambda t: t)
    monkeypatch.setattr(runners, "synchronize", lambda device: None)  # no CUDA runtime to wait for ...
    monkeypatch.setattr(runners, "use_device", lambda device: None)  # ... or to make current
    target = Target(DEVICE, dtype, "cuda:0", {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32"))
    with FakeTensorMode(allow_non_fake_inputs=True), RandomDraws() as draws:
        runner = runners.TorchRunner(weights, target, batch_size=0)
        out = {**runner.infer(feeds), **runner.sample(feeds, seed=3), **runner.trace(feeds)}
    return runner, out, draws.devices


def shaped_weights(name: str, shaped_actors):
    actor = shaped_actors[name]
    return mlagents.weights_from_state_dict(actor.state_dict(), name, actor.spec.inputs), actor.random_feeds(6, seed=1)


# nn.LSTM on a CUDA tensor asks the CUDA runtime (cuDNN) for itself, which FakeTensorMode cannot stand in for: the
# memory shapes are left out here (their LSTM runs on the device's own kernels; its inputs are placed like the others')
CASES = ["default", *(name for name, spec in SHAPES.items() if not spec.memory)]


@pytest.fixture(params=CASES)
def case(request, shaped_actors, default_model):
    if request.param == "default":
        w = mlagents.load_default().weights
        return w, {"obs_0": np.zeros((6, w.obs_dim), np.float32)}
    return shaped_weights(request.param, shaped_actors)


def test_every_shape_runs_on_the_device_with_cpu_noise_and_fp32_statistics(case, monkeypatch):
    check_on_device(*case, torch.float16, monkeypatch)


def test_bf16_places_like_fp16(default_model, monkeypatch):
    w = mlagents.load_default().weights
    check_on_device(w, {"obs_0": np.zeros((3, w.obs_dim), np.float32)}, torch.bfloat16, monkeypatch)


def check_on_device(weights, feeds: dict, dtype: torch.dtype, monkeypatch) -> None:
    runner, out, draws = fake_run(weights, dtype, feeds, monkeypatch)
    p = runner.policy
    assert all(t.device == DEVICE for t in p.parameters()) and p.compute_dtype == dtype
    assert stat_violations(p) == []
    assert draws and all(device == "cpu" for _, device in draws), draws  # the noise: drawn on the CPU, then moved
    assert {v.device for v in out.values() if isinstance(v, torch.Tensor)} == {DEVICE}
    normalized = [v for k, v in out.items() if k.startswith("normalized_obs")]
    assert normalized and all(v.dtype == torch.float32 for v in normalized)


def stat_violations(p) -> list[str]:
    """Normalizer statistics that left float32 (or the device)."""
    bad = []
    for i, n in enumerate(p.normalizers):
        for name in Normalization.stats:
            t = getattr(n, name)
            if n.enabled and (t.dtype != torch.float32 or t.device != DEVICE):
                bad.append(f"normalizer {i} {name}: {t.dtype} on {t.device}")
    return bad


def test_references_run_on_the_cpu(small_context):
    assert runners.reference(small_context, "fp64").target.device.type == "cpu"


@pytest.fixture()
def small_context(default_model, tmp_path):
    return job_context(tmp_path)


# --- each check fails on a mutant of the code it guards


def test_noise_drawn_on_the_device_is_caught(monkeypatch):
    w = mlagents.load_default().weights
    monkeypatch.setattr(runners, "cpu_noise", lambda rows, act, seed: torch.randn(rows, act, device=DEVICE))
    _, _, draws = fake_run(w, torch.float16, {"obs_0": np.zeros((4, w.obs_dim), np.float32)}, monkeypatch)
    assert ("randn", "cuda:0") in draws


def test_a_statistic_that_leaves_fp32_is_caught(monkeypatch):
    w = mlagents.load_default().weights
    monkeypatch.setattr(Normalization, "stats", ())  # place() no longer exempts them from the layers' dtype
    runner, _, _ = fake_run(w, torch.float16, {"obs_0": np.zeros((4, w.obs_dim), np.float32)}, monkeypatch)
    monkeypatch.undo()
    assert stat_violations(runner.policy) == ["normalizer 0 running_mean: torch.float16 on cuda:0", "normalizer 0 std: torch.float16 on cuda:0"]


def test_a_cpu_tensor_meeting_a_device_tensor_is_caught(shaped_actors, monkeypatch):
    weights, feeds = shaped_weights("multi_input", shaped_actors)  # its noise reaches the head on the CPU

    def unmoved(self, x, noise):  # the Gaussian head without moving the CPU noise to mu's device
        mu = self.mu(x)
        return self.squash(mu.float() + torch.exp(self.log_sigma_of(x, mu).float()) * noise)

    fake_run(weights, torch.float16, feeds, monkeypatch)  # the head as it is: no mismatch
    monkeypatch.setattr(policy_module.ContinuousActions, "sample", unmoved)
    with pytest.raises(FakeTensorDeviceMismatchError):
        fake_run(weights, torch.float16, feeds, monkeypatch)
