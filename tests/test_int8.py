"""int8 and int8w: torchao's int8 Linear layers as dtypes of their own, judged by the one engine in the policy's units
(KL, |Δμ|/σ) as well as in absolute error, with limits of their own; CPU and eager only, anything else skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CONF, PYRAMIDS_PT, run_job, small_weights

from huggy_exp import placement, preflight
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.policy import Policy
from huggy_exp.runners import build
from huggy_exp.verify import CONTINUOUS_ACTIONS, DISCRETE_ACTIONS, Limits, Rules, compare

INT8 = ("int8", "int8w")


@pytest.mark.parametrize("dtype", INT8)
def test_an_int8_point_gets_a_verdict_in_policy_units_beside_absolute_error(dtype, small, tmp_path):
    job = run_job(tmp_path, "action", small.model, f"dtype={dtype}", "obs.rows=16", "batch_size=4")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    assert m["actions/vs_fp64/max_abs"] > 1e-5  # quantized: far from fp32's error, so the layers really are int8
    for key in ("kl_max", "mean_shift_sigma_max", "max_abs"):
        assert 0 <= m[f"actions/vs_fp64/{key}"] <= m[f"actions/vs_fp64/{key}_limit"], key
    assert "KL" in job.result.headline and "|Δμ|/σ" in job.result.headline


def test_an_int8_point_over_its_policy_unit_limit_fails_saying_why(small, tmp_path):
    job = run_job(tmp_path, "action", small.model, "dtype=int8", "obs.rows=16", "verify.limits.int8.mean_shift_max=1e-6")
    assert job.record["status"] == "failed"
    assert "|Δμ|/σ" in job.record["reason"] and "> 1e-06 (policy units)" in job.record["reason"]


def test_the_engine_judges_kl_and_mean_shift_and_a_discrete_branchs_kl():
    mu_e, log_sigma = np.zeros((2, 3)), np.full((2, 3), np.log(0.5))
    mu_a = mu_e + np.array([[0.0, 0.0, 0.2], [0.0, 0.0, 0.0]])  # 0.4 of sigma in one row
    actual = {CONTINUOUS_ACTIONS.name: mu_a / 3, "mu": mu_a, "log_sigma": log_sigma}
    expected = {CONTINUOUS_ACTIONS.name: mu_e / 3, "mu": mu_e, "log_sigma": log_sigma}
    loose = Rules(Limits(atol=1.0, kl_max=1.0, mean_shift_max=0.5), "int8")
    assert compare(actual, expected, loose).passed
    c = compare(actual, expected, Rules(Limits(atol=1.0, kl_max=1.0, mean_shift_max=0.3), "int8"))
    assert c.failures == ["actions: |Δμ|/σ 0.4 > 0.3 (policy units)"]
    c = compare(actual, expected, Rules(Limits(atol=1.0, kl_max=0.05, mean_shift_max=0.5), "int8"))
    assert c.failures == ["actions: KL 0.08 > 0.05 (policy units)"]
    both = {**actual, "continuous_actions": mu_a / 3}, {**expected, "continuous_actions": mu_e / 3}
    c = compare(*both, Rules(Limits(atol=1.0, kl_max=1.0, mean_shift_max=0.3), "int8"))
    assert c.failures == ["actions: |Δμ|/σ 0.4 > 0.3 (policy units)"]  # one distribution behind both: judged once
    logits_e = np.array([[2.0, 0.0, 0.0]])
    discrete = {DISCRETE_ACTIONS.name: np.array([[0]])}
    c = compare({**discrete, "masked_logits": np.array([[0.5, 0.0, 0.0]])}, {**discrete, "masked_logits": logits_e},
                Rules(Limits(kl_max=0.01), "int8", branch_sizes=(3,)))
    assert len(c.failures) == 1 and c.failures[0].startswith("discrete_actions: KL ")


def test_a_policy_unit_limit_left_out_is_an_error_not_a_pass(tmp_path):
    preflight.setup()
    for key in ("verify.limits.int8", "verify.limits.int8w", "verify.limits.int8.kl_max", "verify.limits.fp32.mean_shift_max"):
        with pytest.raises(UserError) as err:
            preflight.check(["tracking=none", f"~{key}", f"hydra.run.dir={tmp_path}"], CONF)
        assert str(err.value).startswith(key)


@pytest.mark.parametrize("device", ["cuda", "cuda:1", "npu", "mps"])
def test_int8_on_a_device_other_than_the_cpu_is_skipped_naming_why(device):
    with pytest.raises(Unsupported, match=f"dtype int8 .*runs on the CPU here, not on {device}"):
        placement.resolve(device, "int8")


def test_an_int8_job_on_another_device_is_a_skipped_point_with_the_reason(small, tmp_path):
    # mps: a job on cuda would set CUDA's process-wide precision switches first (test_precision_mode restores them)
    job = run_job(tmp_path, "action", small.model, "device=mps", "dtype=int8w", "obs.rows=4")
    assert job.record["status"] == "skipped"
    assert job.record["reason"] == "dtype int8w (torchao int8) runs on the CPU here, not on mps: its kernels there are " \
                                   "not verified (use device=cpu)"


@pytest.mark.parametrize("backend", ["compile", "fused"])
def test_int8_with_a_backend_other_than_eager_is_skipped_naming_why(backend, small, tmp_path):
    job = run_job(tmp_path, "action", small.model, "dtype=int8", f"backend={backend}", "obs.rows=4")
    assert job.record["status"] == "skipped" and f"backend {backend} does not apply" in job.record["reason"]


@pytest.mark.parametrize("dtype", INT8)
def test_one_cpu_row_runs_through_the_quantized_layers_not_the_float_gemv_path(dtype):
    w = small_weights()
    fp32 = Policy(w).place(torch.device("cpu"), torch.float32)
    q = Policy(w).place(torch.device("cpu"), torch.float32, lambda m: placement.quantize(m, dtype))
    assert q._gemv == () and type(q.body[0].weight) is not torch.nn.Parameter
    x = torch.randn(5, w.obs_dim)
    with torch.inference_mode():
        rows = torch.cat([q(x[i : i + 1]) for i in range(5)])
        assert not torch.equal(rows, fp32(x))  # int8: not the float weights
        assert torch.allclose(rows, q(x), atol=1e-2)


def test_a_discrete_int8_point_judges_each_branch_in_kl_for_torch_and_onnxruntime(shaped_files, tmp_path):
    """The suite's own three-branch policy (no ../shared needed): the path the genuine Pyramids test below takes,
    torch's int8 and onnxruntime's each judged per branch in KL against its limit."""
    pt, _ = shaped_files["branches"]
    job = run_job(tmp_path, "action", f"model.checkpoint={pt}", "dtype=int8", "obs.rows=16")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    for side in ("", "onnxruntime_int8/"):  # measured 1.1e-4 and 1.8e-4 against 0.01
        assert 0 < m[f"{side}discrete_actions/vs_fp64/kl_max"] <= m[f"{side}discrete_actions/vs_fp64/kl_max_limit"] == 0.01


def test_the_genuine_pyramids_int8_point_judges_each_branch_in_kl(tmp_path):
    if not PYRAMIDS_PT.is_file():
        pytest.skip(f"genuine fixture absent: {PYRAMIDS_PT}")
    job = run_job(tmp_path, "action", f"model.checkpoint={PYRAMIDS_PT}", "dtype=int8", "obs.rows=16")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    for side in ("", "onnxruntime_int8/"):  # torch's int8 and onnxruntime's, each branch's KL against its limit
        assert 0 < m[f"{side}discrete_actions/vs_fp64/kl_max"] <= m[f"{side}discrete_actions/vs_fp64/kl_max_limit"]


def test_an_int8_point_shows_onnxruntimes_int8_beside_it_judged_in_policy_units(small, tmp_path):
    job = run_job(tmp_path, "action", small.model, "dtype=int8", "obs.rows=16")
    m, peer = job.record["metrics"], "onnxruntime_int8/actions/vs_fp64"
    for key in ("kl_max", "mean_shift_sigma_max", "max_abs"):
        assert 0 < m[f"{peer}/{key}"] <= m[f"{peer}/{key}_limit"] == m[f"actions/vs_fp64/{key}_limit"], key
    assert m[f"{peer}/{key}"] != m[f"actions/vs_fp64/{key}"]  # its own quantization, not torch's
    assert m["onnxruntime_int8/passed"] == 1.0 and m["onnxruntime_int8/latency/p50_us"] > 0
    assert "; onnxruntime int8 PASS vs cpu fp64: actions max_abs" in job.result.headline
    assert job.record["details"]["onnxruntime_int8"]["graph"] == "onnxruntime-CPUExecutionProvider-int8"


def test_an_int8_point_without_an_onnx_names_why_it_has_no_onnxruntime_peer(huggy_pt, tmp_path):
    job = run_job(tmp_path, "action", f"model.checkpoint={huggy_pt}", "dtype=int8", "obs.rows=8")
    assert job.record["status"] in ("passed", "failed")  # the torch int8 point is judged all the same
    assert job.record["details"]["onnxruntime_int8"] == {"status": "skipped", "reason": "no .onnx beside the model "
                                                          "(model.onnx=<file.onnx>)"}
    assert "onnxruntime int8 skipped: no .onnx" in job.result.headline


def test_backend_onnxruntime_at_int8_runs_onnxruntimes_quantized_graph_and_int8w_is_skipped(small, tmp_path):
    import onnx

    job = run_job(tmp_path / "q", "action", small.model, "dtype=int8", "backend=onnxruntime", "obs.rows=16")
    graph = onnx.load(tmp_path / "q" / "Small-100.int8.onnx").graph
    assert "MatMulInteger" in {n.op_type for n in graph.node} and {"mu", "log_sigma"} <= {o.name for o in graph.output}
    assert job.record["status"] == "passed" and "actions/vs_fp64/mean_shift_sigma_max_limit" in job.record["metrics"]
    assert "onnxruntime_int8/passed" not in job.record["metrics"]  # the point is the peer: nothing beside it
    job = run_job(tmp_path / "w", "action", small.model, "dtype=int8w", "backend=onnxruntime", "obs.rows=4")
    assert job.record["status"] == "skipped" and "or its own int8; dtype int8w does not apply" in job.record["reason"]


def test_the_distributions_a_graph_exposes_are_the_policys_own(small, tmp_path):
    import onnx

    from huggy_exp.mlagents import with_distributions
    from huggy_exp.runners import OnnxRunner

    onnx.save(with_distributions(onnx.load(small.onnx)), tmp_path / "d.onnx")
    obs = np.random.default_rng(0).normal(size=(6, small.weights.obs_dim)).astype(np.float32)
    out = OnnxRunner(tmp_path / "d.onnx", batch_size=4).infer({"obs_0": obs})
    want = Policy(small.weights).place(torch.device("cpu"), torch.float32).distributions([torch.from_numpy(obs)])
    for name in ("mu", "log_sigma"):
        assert out[name].shape == (6, 3) and np.allclose(out[name], want[name].numpy(), atol=1e-5), name


def test_a_benchmark_at_int8_gates_and_times_onnxruntimes_int8_and_skips_what_cannot_run_int8(small, tmp_path, monkeypatch):
    from huggy_exp.tasks import benchmark

    built = []
    def built_as(ctx, name, **kw):  # what each backend was built to run: its runner's own dtype
        runner = build(ctx, name, **kw)
        return built.append((name, runner.target.dtype_name)) or runner

    monkeypatch.setattr(benchmark, "build", built_as)
    short = ("mode.budget_s=0.05", "mode.rounds=1", "mode.warmup_s=0.01", "mode.settle_s=0", "obs.rows=8", "batch_size=4",
             "mode.scenarios=[offline]", "mode.backends=[eager,fused,onnxruntime]")
    job = run_job(tmp_path, "benchmark", small.model, "dtype=int8", *short)
    backends = job.record["details"]["backends"]
    assert backends["onnxruntime"]["dtype"] == "int8" and backends["onnxruntime"]["status"] == "passed", backends
    assert ("onnxruntime", "int8") in built  # what ran under the label int8: onnxruntime's own int8 graph, not fp32's
    assert backends["fused"]["status"] == "skipped" and "int8" in backends["fused"]["reason"]


def test_a_sweep_with_a_failing_int8_point_shows_policy_units_and_onnxruntimes_int8_on_its_line(small, tmp_path):
    from huggy_exp.sweep import summarize

    for i, dtype in enumerate(("fp32", "int8")):  # int8 held to |Δμ|/σ <= 1e-6: it fails, and so does its peer
        run_job(tmp_path / str(i), "action", small.model, f"dtype={dtype}", "obs.rows=8", "batch_size=8",
                "verify.limits.int8.mean_shift_max=1e-6")
    summary = summarize(tmp_path)
    fp32, int8 = (row["line"] for row in summary["rows"])
    assert " KL " in fp32 and " |Δμ|/σ " in fp32 and "onnxruntime" not in fp32
    assert "FAILED" in int8 and " |Δμ|/σ " in int8 and "| onnxruntime int8 FAILED KL " in int8 and " µs" in int8
    (rec,) = summary["comparison"]["recommended"].values()
    assert rec["failing"] == ["int8"] and rec["dtype"] == "fp32"
