"""`benchmark` on every ML-Agents shape: every input fed per batch point, every deterministic output gated against eager,
compile/graphs skipped per backend with the reason; a broken graph fails the gate (no timing is asserted)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import SHAPES, run_job
from onnx import numpy_helper

FAST = ("mode.budget_s=0.05", "mode.rounds=1", "mode.warmup_s=0.01", "mode.settle_s=0", "mode.batch_sizes=[1,8]")
FIXTURES = Path("/work/shared/fixtures/mlagents")


def bench(workdir, model: str, *extra: str):
    return run_job(workdir, "benchmark", model, "obs.rows=6", *FAST, *extra)


def assert_timed(record: dict, backends=("eager", "onnxruntime"), points=(1, 8)) -> None:
    m = record["metrics"]
    for name in backends:
        assert record["details"]["backends"][name]["status"] == "passed", record["details"]["backends"][name]
        for b in points:
            assert m[f"{name}/b{b}/p50_us"] > 0 and m[f"{name}/b{b}/obs_per_s"] > 0, (name, b)


def backends_of(job) -> dict:
    return job.record["details"]["backends"]


@pytest.mark.parametrize("name", list(SHAPES))
def test_benchmark_times_eager_and_onnxruntime_on_every_shape_and_gates_every_output(name, shaped_files, tmp_path):
    spec = SHAPES[name]
    job = bench(tmp_path, f"model.checkpoint={shaped_files[name][0]}", "mode.backends=[eager,onnxruntime,compile,graphs]")
    r = job.record
    assert r["status"] == "passed", r["reason"]
    m, backends = r["metrics"], backends_of(job)
    for backend in ("eager", "onnxruntime"):
        assert backends[backend]["status"] == "passed", backends[backend]
        for b in (1, 8):
            assert m[f"{backend}/b{b}/p50_us"] > 0 and m[f"{backend}/b{b}/obs_per_s"] > 0
    # onnxruntime agrees with eager on every output the policy has
    assert (m["onnxruntime/max_abs_vs_eager"] <= 1e-5) if spec.continuous else "onnxruntime/max_abs_vs_eager" not in m
    if spec.branches:
        assert m["onnxruntime/discrete_flips_beyond_margin"] == 0 and m["onnxruntime/discrete_flips"] == 0
    assert (m["onnxruntime/recurrent_out_max_abs_vs_eager"] <= 1e-5) if spec.memory else "onnxruntime/recurrent_out_max_abs_vs_eager" not in m
    gate = backends["onnxruntime"]["vs_eager"]
    assert ("discrete actions: 0 differ" in gate) == bool(spec.branches) and ("recurrent_out" in gate) == bool(spec.memory), gate
    # compile and graphs: skipped per backend with the reason, not a job error; never timed
    for backend in ("compile", "graphs"):
        assert backends[backend]["status"] == "skipped"
        assert f"backend {backend} runs Huggy's shape only" in backends[backend]["reason"], backends[backend]["reason"]
        assert not any(k.startswith(f"{backend}/b") for k in m)
    text = "\n".join(job.result.summary)
    assert "one step per call" in text and spec_words(spec) <= set(re.findall(r"\w+", text)), text


def spec_words(spec) -> set[str]:
    words = {f"obs_{i}" for i in range(len(spec.inputs))}
    if spec.branches:
        words.add("action_masks")
    if spec.memory:
        words.add("recurrent_in")
    return words


def test_benchmark_feeds_masks_from_the_file_and_times_a_sequence_on_its_first_step(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["memory_discrete"]
    steps = [actor.random_feeds(3, seed=60 + t) for t in range(4)]
    np.savez(tmp_path / "seq.npz", obs_0=np.stack([s["obs_0"] for s in steps]), action_masks=np.stack([s["action_masks"] for s in steps]))
    job = run_job(tmp_path / "job", "benchmark", f"model.onnx={shaped_files['memory_discrete'][1]}", "obs=file",
                  f"obs.path={tmp_path / 'seq.npz'}", *FAST)
    assert job.record["status"] == "passed", job.record["reason"]
    text = "\n".join(job.result.summary)
    assert "action_masks from the observation file" in text and "4-step x 3-agent sequence is timed on its first step" in text


def negate_branch_0(graph):
    for init in graph.initializer:
        if init.name.startswith("action_model._discrete_distribution.branches.0."):
            init.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(init), init.name))


def scale_lstm(graph):
    init = next(i for i in graph.initializer if i.name == "lstm_B")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) + np.float32(0.05), init.name))


def nan_mu(graph):
    init = next(i for i in graph.initializer if i.name == "action_model._continuous_distribution.mu.bias")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(np.nan), init.name))


@pytest.mark.parametrize("name, edit, expect", [
    ("branches", negate_branch_0, ": discrete_actions: "),  # outputs named by stem, as the PASS line names them
    ("memory_discrete", scale_lstm, ": memories: "),
    ("sac_inputs", nan_mu, "NaN/Inf"),
])
def test_a_broken_onnxruntime_graph_fails_the_gate_and_is_not_timed(name, edit, expect, shaped_files, tmp_path):
    model = onnx.load(str(shaped_files[name][1]))
    edit(model.graph)
    onnx.save(model, str(tmp_path / "bad.onnx"))
    job = bench(tmp_path / "job", f"model.checkpoint={shaped_files[name][0]}", f"model.onnx={tmp_path / 'bad.onnx'}")
    r = job.record
    assert r["status"] == "failed", r["reason"]
    assert "backend onnxruntime" in r["reason"] and expect in r["reason"] and "not timed" in r["reason"], r["reason"]
    assert backends_of(job)["onnxruntime"]["status"] == "failed"
    assert not any(k.startswith("onnxruntime/b") for k in r["metrics"]) and r["metrics"]["eager/b1/p50_us"] > 0


@pytest.mark.parametrize("fixture, shape", [("pyramids", "discrete"), ("huggy_lstm", "memory")])
def test_benchmark_on_mlagents_own_fixtures(fixture, shape, tmp_path):
    onnx_files = sorted((FIXTURES / fixture).glob("*/*.onnx"))
    pts = sorted((FIXTURES / fixture).glob("*/*.pt"))
    if not pts or not onnx_files:
        pytest.skip(f"{FIXTURES / fixture} is absent")
    job = bench(tmp_path, f"model.checkpoint={pts[-1]}", f"model.onnx={onnx_files[-1]}")
    assert job.record["status"] == "passed", job.record["reason"]
    m = job.record["metrics"]
    if shape == "discrete":  # Pyramids: one branch of 5, no continuous actions
        assert m["onnxruntime/discrete_flips_beyond_margin"] == 0 and m["onnxruntime/discrete_flips"] == 0
    else:  # Huggy-LSTM: 21 continuous actions and a memory of 128
        assert m["onnxruntime/max_abs_vs_eager"] <= 1e-5 and m["onnxruntime/recurrent_out_max_abs_vs_eager"] <= 1e-4
    for backend in ("eager", "onnxruntime"):
        print(fixture, backend, f"b1 p50 {m[f'{backend}/b1/p50_us']:.1f} us, b8 {m[f'{backend}/b8/obs_per_s']:,.0f} obs/s")
