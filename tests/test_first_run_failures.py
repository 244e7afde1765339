"""The predicted first-run failures of issue 24 that a CPU shows without a card, one test (or two) each, named after its
number in the issue's table. Those that need a card run on the emulated npu: tests/test_emulated_npu.py."""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from conftest import job_context, run_job
from huggy_exp import environment, placement, runners
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.placement import resolve
from huggy_exp.policy import Policy

SHORT = ("mode.budget_s=0.05", "mode.rounds=1", "mode.warmup_s=0.01", "mode.settle_s=0", "obs.rows=8", "batch_size=4",
         "mode.scenarios=[offline]")


@pytest.fixture()
def cheap_compile(monkeypatch):
    """torch.compile through dynamo's `eager` backend (dynamo's guards and limits, no inductor build), recompile_limit 1."""
    import torch._dynamo

    monkeypatch.setattr(runners, "COMPILE_BACKENDS", {**runners.COMPILE_BACKENDS, "cpu": "eager"}, raising=False)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        yield
    torch._dynamo.reset()


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


# --- 2: compile silently becomes eager past dynamo's recompile_limit


def test_failure_2_compile_resets_dynamo_per_runner_so_each_new_policy_compiles(small, cheap_compile):
    obs = np.zeros((4, small.weights.obs_dim), np.float32)
    for scale in (1.0, 2.0):  # two policies in one process (a sweep's points): the second must compile too
        weights = replace(small.weights, mu=(small.weights.mu[0] * scale, small.weights.mu[1]))
        runner = runners.TorchRunner(weights, resolve("cpu", "fp32"), batch_size=4, backend="compile")
        before = compiled_graphs()
        got = runner.infer({runners.OBS: obs})[runners.ACTIONS]
        assert compiled_graphs() > before, "ran without compiling: dynamo fell back to eager"
        np.testing.assert_array_equal(got, runners.TorchRunner(weights, resolve("cpu", "fp32")).infer({runners.OBS: obs})[runners.ACTIONS])


def test_failure_2_past_the_recompile_limit_compile_is_an_error_not_eager(small, cheap_compile):
    runner = runners.TorchRunner(small.weights, resolve("cpu", "fp32"), batch_size=4, backend="compile")
    with torch.inference_mode():
        runner._forward(torch.zeros(4, small.weights.obs_dim))
        with pytest.raises(Exception, match="recompile_limit|RecompileLimit|recompile limit"):
            runner._forward(torch.zeros(8, small.weights.obs_dim))  # a second shape: past the limit of 1


# --- 3: a backend that fails to build or capture ends the whole point


def test_failure_3_a_compilers_reason_names_its_error_not_dynamos_announcement():
    from huggy_exp.errors import first_line

    wrapped = RuntimeError("backend='npu' raised:\nRuntimeError: graph capture failed\n\nmore of the compiler's text")
    assert first_line(wrapped) == "backend='npu' raised: RuntimeError: graph capture failed"
    assert first_line(RuntimeError("one line: with a colon\nsecond")) == "one line: with a colon"
    assert first_line(RuntimeError()) == "RuntimeError"


def test_failure_3_a_backend_that_fails_to_compile_fails_alone_and_the_others_run(small, tmp_path, monkeypatch):
    def broken(fn, backend):
        def call(*args):
            raise RuntimeError("capture failed: the graph could not be built\nsecond line of the compiler's text")
        return call

    monkeypatch.setattr(runners, "_compiled", broken)
    job = run_job(tmp_path, "benchmark", small.model, *SHORT, "mode.backends=[eager,compile,onnxruntime]")
    backends = job.record["details"]["backends"]
    assert job.record["status"] == "failed"
    assert backends["compile"]["status"] == "failed"
    assert backends["compile"]["reason"] == "RuntimeError: capture failed: the graph could not be built"
    assert backends["eager"]["status"] == backends["onnxruntime"]["status"] == "passed"
    assert "eager/b4/p50_us" in job.record["metrics"] and "onnxruntime/b4/p50_us" in job.record["metrics"]


def test_failure_3_the_compile_backend_follows_the_device_kind():
    assert runners.COMPILE_BACKENDS == {"cpu": "inductor", "cuda": "inductor", "mps": "inductor", "npu": "npu"}
    with pytest.raises(Unsupported, match="'npu' is not registered here.*torch_npu registers it"):
        runners._compiler("npu")


def test_row_5_a_torchair_without_the_aclgraph_mode_skips_compile_on_npu_saying_why(monkeypatch):
    """torchair before 2025-03 has no reduce-overhead mode (CompilerConfig refuses the value): compile on npu would
    build GE graphs, whose fp32 math precision_mode cannot set, so it is skipped with the reason, never run."""
    import types

    class Config:
        def __setattr__(self, key, value):
            raise ValueError(f"Value {value!r} (type: <class 'str'>) not in optional list ['max-autotune']")

    monkeypatch.setitem(sys.modules, "torchair", types.SimpleNamespace(CompilerConfig=Config))
    with pytest.raises(Unsupported, match="torchair cannot run mode reduce-overhead here .*not in optional list"):
        runners._torchair()


# --- 5: cuDNN repacks an LSTM's weights on every call


def test_failure_5_the_lstm_weights_are_flattened_once_placed(shaped_actors, monkeypatch):
    from huggy_exp import mlagents

    actor = shaped_actors["memory_discrete"]
    weights = mlagents.weights_from_state_dict(actor.state_dict(), "memory_discrete", actor.spec.inputs)
    flattened = []
    monkeypatch.setattr(torch.nn.LSTM, "flatten_parameters",
                        lambda self: flattened.append((self.weight_ih_l0.device, self.weight_ih_l0.dtype)))
    Policy(weights).place(torch.device("cpu"), torch.float16)
    assert flattened[-1:] == [(torch.device("cpu"), torch.float16)]  # after the weights took their place and dtype


# --- 8: a missing onnxruntime provider is an error, and the docs call those rows CPU figures


def test_failure_8_a_provider_missing_from_this_onnxruntime_is_skipped_naming_those_found(small, tmp_path):
    ctx = job_context(tmp_path, f"model.checkpoint={small.pt}")
    with pytest.raises(Unsupported, match="'CUDAExecutionProvider' is not in this onnxruntime build; it has: .*CPUExecutionProvider"):
        runners.build(ctx, "onnxruntime", provider="CUDAExecutionProvider")
    with pytest.raises(UserError, match="unknown onnxruntime provider 'CUDAExecutionProvder'"):
        runners.build(ctx, "onnxruntime", provider="CUDAExecutionProvder")  # a typo stays an error


# --- 9: an op without an NPU kernel runs on the CPU with one warning


def test_failure_9_the_npu_cpu_fallback_switch_is_set_before_the_first_npu_op(monkeypatch):
    monkeypatch.delenv(placement.NPU_FALLBACK_ENV, raising=False)
    monkeypatch.setattr(placement, "_import_backend", lambda kind: (_ for _ in ()).throw(Unsupported("no torch_npu")))
    with pytest.raises(Unsupported):
        placement.resolve_device("npu:0")
    assert placement.NPU_FALLBACK_ENV == "TORCH_NPU_FALLBACK_CPU_DISABLE"  # torch_npu's name (OptionsManager)
    assert environment.device_switches()["npu_fallback_cpu_disable"] == "1"
    monkeypatch.setenv(placement.NPU_FALLBACK_ENV, "0")  # a value of one's own is kept, and recorded as it is
    with pytest.raises(Unsupported):
        placement.resolve_device("npu:0")
    assert environment.device_switches()["npu_fallback_cpu_disable"] == "0"


# --- 11: peak memory once for all backends, none in batch, MPS process memory as device memory


def test_failure_11_mps_and_cpu_peaks_say_they_are_process_memory():
    for kind in ("cpu", "mps"):
        mb, source = placement.peak_memory(torch.device(kind))
        assert mb > 0 and source == "process peak RSS since start (not device memory)"


# --- 12: the visible-devices remap under SLURM and Ray's NOSET variables


@pytest.fixture()
def two_cuda_cards(monkeypatch):
    for name in (placement.ASSIGNED_CARD_ENV, "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    return monkeypatch


def test_failure_12_under_slurm_one_visible_card_is_the_points_card(two_cuda_cards):
    two_cuda_cards.setenv("CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(Unsupported, match="only 1 cuda device"):  # outside SLURM the index means what it says
        placement.resolve_device("cuda:1")
    two_cuda_cards.setenv("SLURM_JOB_ID", "4242")
    assert placement.resolve_device("cuda:1") == torch.device("cuda", 0)
    two_cuda_cards.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # two visible: the runtime's own numbering
    with pytest.raises(Unsupported, match="only 1 cuda device"):
        placement.resolve_device("cuda:1")


def test_failure_12_rays_noset_variables_are_refused_in_one_line(two_cuda_cards):
    two_cuda_cards.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    with pytest.raises(UserError, match="^RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES is set: .*; unset it$"):
        placement.resolve_device("cuda:0")


# --- 13: the switches that decide device numerics are not in the record


def test_failure_13_every_device_switch_is_in_result_json(tmp_path, default_model):
    record = run_job(tmp_path, "action", "obs.rows=2").record
    assert set(record["switches"]) == {"npu_fallback_cpu_disable", "npu_acl_op_init_mode", "npu_jit_compile",
                                       "npu_allow_internal_format", "visible_cuda", "visible_npu"}
    assert set(environment.capture()["switches"]) == set(record["switches"])
