"""The measurement policy, the runner contract across backends, and the benchmark mode (no timing is asserted)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import job_context
from test_modes import run_mode

from huggy_exp import timing
from huggy_exp.context import Context
from huggy_exp.errors import Unsupported, UserError
from huggy_exp.runners import ACTIONS, OBS, SAMPLED, TorchRunner, build, check_provider
from huggy_exp.placement import resolve

CPU = torch.device("cpu")


def small_context(small, tmp_path, **kw) -> Context:
    return job_context(tmp_path, f"model.checkpoint={small.pt}", *(f"{k}={v}" for k, v in kw.items()))


# --- timing


def test_harness_measures_a_known_sleep():
    t = timing.measure(lambda: time.sleep(0.002), CPU, rows=1, budget_s=0.05, warmup_s=0.01)
    stats = t.stats()
    assert 1_900 <= stats["p50_us"] < 50_000  # sleep never returns early; the bound above is loose on purpose
    assert stats["samples"] >= 1 and stats["min_us"] <= stats["p50_us"] <= stats["p99_us"] <= stats["max_us"]


def test_percentiles_on_known_samples():
    t = timing.Timing(samples=[i * 1e-6 for i in range(1, 101)], rows=4, threads=1)
    s = t.stats()
    assert s["p50_us"] == pytest.approx(50.5) and s["p90_us"] == pytest.approx(90.1)
    assert s["p95_us"] == pytest.approx(95.05) and s["p99_us"] == pytest.approx(99.01)
    assert (s["min_us"], s["max_us"], s["mean_us"]) == pytest.approx((1, 100, 50.5))
    assert s["iqr_us"] == pytest.approx(49.5) and s["noisy"] == 1.0
    assert s["obs_per_s"] == pytest.approx(4 * 100 / (5050e-6))


def test_a_steady_measurement_is_not_noisy():
    s = timing.Timing(samples=[1e-3] * 20 + [1.05e-3] * 20).stats()
    assert s["noisy"] == 0.0 and s["p50_us"] == pytest.approx(1025)


def test_threads_are_fixed_for_the_block_and_restored():
    before = torch.get_num_threads()
    with timing.threads(1) as n:
        assert n == torch.get_num_threads() == 1
        assert timing.measure(lambda: None, CPU, budget_s=0.001, warmup_s=0.001).threads == 1
    assert torch.get_num_threads() == before


# --- runners


def test_trace_and_infer_are_one_forward_path(small):
    runner = TorchRunner(small.weights, resolve("cpu", "fp32"), batch_size=5)
    obs = np.random.default_rng(0).normal(size=(12, 8)).astype(np.float32)
    traced = runner.trace({OBS: obs})
    np.testing.assert_array_equal(traced[ACTIONS], runner.infer({OBS: obs})[ACTIONS])
    x = torch.from_numpy(obs)
    with torch.inference_mode():
        np.testing.assert_array_equal(runner.policy.trace(x)[ACTIONS].numpy(), runner.policy(x).numpy())
    assert {"normalized_obs", "hidden_0", "hidden_1", "mu", "log_sigma"} <= set(traced)


def test_feeds_are_keyed_by_the_onnx_input_name(small):
    runner = TorchRunner(small.weights, resolve("cpu", "fp32"))
    with pytest.raises(UserError, match="obs_0"):
        runner.infer({"obs": np.zeros((1, 8), np.float32)})


def test_onnxruntime_matches_eager(small, tmp_path):
    ctx = small_context(small, tmp_path, batch_size=3)
    obs = ctx.make_feeds(10)[OBS]
    want = build(ctx, "eager").infer({OBS: obs})[ACTIONS]
    got = build(ctx, "onnxruntime").infer({OBS: obs})
    np.testing.assert_allclose(got[ACTIONS], want, atol=1e-5, rtol=0)
    assert got[ACTIONS].shape == (10, 3) and got["version_number"].shape == (1,)


@pytest.mark.slow
def test_compile_matches_eager_with_a_padded_last_chunk(small, tmp_path, compiles):
    ctx = small_context(small, tmp_path, batch_size=4)
    obs = ctx.make_feeds(6)[OBS]  # chunks of 4 and 2 -> the 2 is padded to 4
    try:
        runner = build(ctx, "compile")
        got = runner.infer({OBS: obs})
    except Exception as exc:  # no C compiler / inductor here: say why instead of failing the suite
        pytest.skip(f"torch.compile unavailable here: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    want = build(ctx, "eager").infer({OBS: obs})
    np.testing.assert_allclose(got[ACTIONS], want[ACTIONS], atol=1e-5, rtol=0)
    sampled = runner.sample({OBS: obs}, seed=3)[SAMPLED]
    np.testing.assert_allclose(sampled, build(ctx, "eager").sample({OBS: obs}, seed=3)[SAMPLED], atol=1e-5, rtol=0)


def test_graphs_on_the_cpu_are_unsupported_with_the_reason(small, tmp_path):
    with pytest.raises(Unsupported, match="graph"):
        build(small_context(small, tmp_path), "graphs")


def test_onnxruntime_in_half_precision_is_unsupported(small, tmp_path):
    with pytest.raises(Unsupported, match="runs the fp32 .onnx graph or its own int8; dtype bf16 does not apply"):
        build(small_context(small, tmp_path, dtype="bf16"), "onnxruntime")


def test_onnxruntime_provider_fallback_is_refused():
    session = SimpleNamespace(get_providers=lambda: ["CPUExecutionProvider"])
    with pytest.raises(Unsupported, match="CUDAExecutionProvider"):
        check_provider(session, "CUDAExecutionProvider")
    check_provider(session, "CPUExecutionProvider")


def test_unknown_backend_is_a_user_error(small, tmp_path):
    ctx = small_context(small, tmp_path, backend="tensorrt")  # the schema refuses it first (test_trust's matrix)
    with pytest.raises(UserError, match="valid: eager, compile, fused, graphs, onnxruntime"):
        build(ctx)


# --- modes


FAST = ["mode.rounds=2", "mode.budget_s=0.02", "mode.warmup_s=0.01", "mode.settle_s=0"]


@pytest.mark.parametrize("mode", ["action", "sample", "batch", "precision", "onnx-compare"])
def test_every_inference_mode_logs_latency(small, tmp_path, mode):
    run = run_mode(tmp_path, mode, small.model, "obs.rows=8", "batch_size=4", "mode.budget_s=0.02" if mode == "batch" else "seed=0")
    assert run.record["status"] == "passed", run.record["reason"]
    for key in ("p50_us", "p99_us", "mean_us", "obs_per_s"):
        assert run.metrics[f"latency/{key}"] > 0
    assert run.metrics["latency/threads"] == 1


def test_action_with_the_onnxruntime_backend(small, tmp_path):
    run = run_mode(tmp_path, "action", small.model, "obs.rows=8", "backend=onnxruntime")
    eager = run_mode(tmp_path / "eager", "action", small.model, "obs.rows=8")
    assert run.record["status"] == "passed"
    np.testing.assert_allclose(np.load(run.workdir / "actions.npy"), np.load(eager.workdir / "actions.npy"), atol=1e-5)


def test_benchmark_writes_point_metrics_series_and_plot(small, tmp_path):
    run = run_mode(tmp_path, "benchmark", small.model, "mode.backends=[eager,onnxruntime,graphs]", "mode.batch_sizes=[2,8]", "plots=true", *FAST)
    assert run.record["status"] == "passed", run.record["reason"]
    m = run.metrics
    for backend in ("eager", "onnxruntime"):
        for b in (1, 2, 8):
            for stat in ("p50_us", "p90_us", "p95_us", "p99_us", "mean_us", "min_us", "max_us", "iqr_us", "obs_per_s", "noisy"):
                assert f"{backend}/b{b}/{stat}" in m
        assert m[f"{backend}/cold_start_ms"] > 0 and m[f"{backend}/load_s"] >= 0
        assert [s for s, _ in run.record["series"][f"{backend}/p50_us"]] == [1, 2, 8]
    assert m["peak_mem_mb"] > 0 and not any(k.startswith("graphs/b") for k in m)
    assert run.record["details"]["backends"]["graphs"]["status"] == "skipped" and "graph" in run.record["details"]["backends"]["graphs"]["reason"]
    assert (run.workdir / "benchmark.png").is_file() and (run.workdir / "benchmark.csv").is_file()


def test_benchmark_does_not_time_a_backend_that_disagrees_with_eager(small, tmp_path):
    """fp64's eager point is exact (it passes its own verification); onnxruntime's fp32 graph is gated at the looser
    of fp64's and fp32's max_abs, here both far below its fp32 rounding."""
    run = run_mode(tmp_path, "benchmark", small.model, "dtype=fp64", "mode.backends=[onnxruntime]",
                   "verify.limits.fp32.max_abs=1e-12", *FAST)
    assert run.record["status"] == "failed" and "onnxruntime" in run.record["reason"]
    assert not any(k.startswith("onnxruntime/b") for k in run.metrics)


def test_benchmark_in_fp64_holds_onnxruntimes_fp32_graph_to_the_fp32_tolerance(small, tmp_path):
    """onnxruntime runs the fp32 .onnx in an fp64 job: the fp64 tolerance (1e-9) would always fail it."""
    run = run_mode(tmp_path, "benchmark", small.model, "dtype=fp64", "mode.backends=[onnxruntime]", *FAST)
    assert run.record["status"] == "passed", run.record["reason"]
    assert 0 < run.metrics["onnxruntime/max_abs_vs_eager"] <= 1e-5 and "onnxruntime/b1/p50_us" in run.metrics


def test_benchmark_fp16_on_the_cpu_is_capped_and_says_so(small, tmp_path):
    run = run_mode(tmp_path, "benchmark", small.model, "dtype=fp16", "mode.backends=[eager]", "mode.batch_sizes=[1024]",
                   "mode.fp16_cpu_max_rows=64", *FAST)
    assert run.record["status"] == "passed"
    assert "fp16" in run.record["details"]["fp16_cpu_note"] and "eager/b1/p50_us" in run.metrics and "eager/b1024/p50_us" not in run.metrics
    assert run.metrics["eager/b1/samples"] <= 2 * 3


def test_a_float16_dtype_under_another_name_is_capped_on_the_cpu_with_its_note(monkeypatch):
    """The cap reads Dtype.emulated_on_cpu (the torch dtype), never the name fp16: `half` is capped and says so."""
    from huggy_exp import config
    from huggy_exp.config import BenchmarkMode
    from huggy_exp.results import Result
    from huggy_exp.tasks.benchmark import BenchmarkTask

    monkeypatch.setitem(config.DTYPES, "half", config.DTYPES["fp16"])
    mode = SimpleNamespace(batch_sizes=[8, 1024], scenarios=["offline"], fp16_cpu_max_rows=64, fp16_cpu_samples=3)
    task = BenchmarkTask(BenchmarkMode.__new__(BenchmarkMode))
    task.mode = mode
    for kind, dtype, capped in (("cpu", "half", [1024]), ("cpu", "bf16", []), ("cuda", "half", [])):
        result = Result()
        points, cut, slow = task.fp16_cap(SimpleNamespace(dtype=dtype, batch_size=8), SimpleNamespace(kind=kind), result)
        assert (cut, slow) == (capped, bool(capped)), (kind, dtype)
        assert ("half on a CPU without float16 matmul kernels" in result.details.get("fp16_cpu_note", "")) == bool(capped)


def test_benchmark_bad_ladder_is_a_user_error(small, tmp_path):
    run = run_mode(tmp_path, "benchmark", small.model, "mode.batch_sizes=[0]")
    assert run.record["status"] == "error" and "mode.batch_sizes" in run.record["reason"]


def test_benchmark_series_reach_mlflows_metrics_table_with_the_batch_size_as_step(small, tmp_path):
    import mlflow

    from huggy_exp.app import execute
    from test_modes import compose

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    cfg = compose(["mode=benchmark", "tracking=mlflow", f"tracking.uri={uri}", small.model, "mode.backends=[eager]",
                   "mode.batch_sizes=[4]", *FAST])
    execute(cfg, workdir=tmp_path / "job", mode="benchmark")
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("huggy_exp").experiment_id])[0]
    table = Path(client.download_artifacts(run.info.run_id, "metrics.csv", str(tmp_path / "dl"))).read_text()
    assert sorted(int(line.split(",")[1]) for line in table.splitlines() if line.startswith("eager/obs_per_s,")) == [1, 4]
    assert run.data.metrics["eager/obs_per_s"] > 0 and run.data.tags["best_backend"] == "eager"  # at the job's batch
    assert json.loads((tmp_path / "job" / "result.json").read_text())["series"]["eager/p50_us"][0][0] == 1


def test_one_row_runs_the_vector_path_with_the_same_shapes_and_values(small):
    runner = TorchRunner(small.weights, resolve("cpu", "fp32"), batch_size=1)
    obs = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    one, many = runner.trace({OBS: obs}), TorchRunner(small.weights, resolve("cpu", "fp32")).trace({OBS: obs})
    for name in ("normalized_obs", "hidden_0", "hidden_1", "mu", "log_sigma", ACTIONS):
        assert one[name].shape == many[name].shape
        np.testing.assert_allclose(one[name], many[name], atol=1e-5, rtol=1e-5)  # gemv vs gemm: fp32 rounding only


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
def test_forward_equals_the_exported_layer_stack_bit_for_bit(small, dtype):
    target = resolve("cpu", dtype)
    policy = TorchRunner(small.weights, target).policy
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(9, 8)).astype(np.float32))
    with torch.inference_mode():
        layers = policy.trace(x)  # normalized_obs, hidden_<i>, mu: the stack the ONNX export writes
        last = layers[f"hidden_{len(small.weights.layers) - 1}"]
        assert torch.equal(policy(x), policy.continuous.head(policy.continuous.mu(last)))


def test_compile_without_a_cxx_compiler_is_unsupported_with_the_reason(small, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    with pytest.raises(Unsupported, match="C\\+\\+ compiler"):
        build(small_context(small, tmp_path), "compile")


@pytest.mark.parametrize("backend", ["eager", "onnxruntime"])
def test_every_runner_declares_the_whole_runner_contract(backend, small, tmp_path):
    """What callers use is declared (runners.Runner), never probed: a backend that cannot do a part says Unsupported."""
    from typing import get_type_hints

    from huggy_exp.runners import Runner

    runner = build(small_context(small, tmp_path), backend)
    declared = set(get_type_hints(Runner)) | {n for n in vars(Runner) if not n.startswith("_")}
    assert all(hasattr(runner, name) for name in declared), sorted(n for n in declared if not hasattr(runner, n))
    assert runner.target.device == torch.device("cpu")
    if backend == "onnxruntime":
        with pytest.raises(Unsupported, match="only the torch backends"):
            runner.sample({OBS: np.zeros((2, small.weights.obs_dim), np.float32)}, 0)


def test_a_runner_without_a_device_is_an_error_not_an_unsynchronised_timing(small, tmp_path):
    from huggy_exp.results import Result
    from huggy_exp.tasks import latency

    ctx = small_context(small, tmp_path)
    eager = build(ctx)
    bare = SimpleNamespace(name="bare", infer=eager.infer, memory_size=0)  # no target: where would timing synchronise?
    with pytest.raises(AttributeError, match="target"):
        latency(bare, ctx, ctx.feeds, Result())


def test_bench_py_judges_with_the_limits_run_py_uses(tmp_path):
    """benchmarks/bench.py builds its contexts from conf/ as run.py does: since limits fail closed, a Context of bare
    defaults has none and bench.py stopped at its first verification (`verify.limits.fp32 is missing`)."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("bench_under_test", REPO / "benchmarks" / "bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for dtype in ("fp32", "bf16"):
        ctx = bench.context(None, dtype, tmp_path)
        assert (ctx.dtype, ctx.threads) == (dtype, 1)
        assert ctx.rules().limits == ctx.limits() and getattr(ctx.verify.limits, dtype).max_abs > 0
