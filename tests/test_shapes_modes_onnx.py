"""onnx-compare and export-onnx on every ML-Agents shape: the small fixtures built here (several inputs, several branches,
hybrid, memory, memory + discrete, SAC), from the .pt and from the .onnx alone, single steps and a memory sequence; and
the genuine pyramids / huggy_lstm fixtures when ../shared is there. Broken graphs (masks misplaced, a tempered sampler,
a shifted or NaN weight) must fail."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import (
    HUGGY_LSTM, HUGGY_LSTM_ONNX, HUGGY_LSTM_PT, PYRAMIDS, PYRAMIDS_ONNX, PYRAMIDS_PT, SHAPES, needs_shared, run_job,
)
from onnx import helper, numpy_helper

from huggy_exp import mlagents
from huggy_exp.numerics import categorical_check

NAMES = list(SHAPES)
FAST = ("obs.rows=10", "batch_size=4", "mode.sample_rows=4", "mode.samples=400")


def model_arg(shaped_files, name: str, source: str) -> str:
    pt, path = shaped_files[name]
    return f"model.checkpoint={pt}" if source == "pt" else f"model.onnx={path}"


def expected_io(spec) -> tuple[list[str], list[str]]:
    inputs = [f"obs_{i}" for i in range(len(spec.inputs))] + ["action_masks"] * bool(spec.branches) + ["recurrent_in"] * bool(spec.memory)
    outputs = ["version_number", "memory_size"]
    outputs += ["continuous_actions", "continuous_action_output_shape", "deterministic_continuous_actions"] * bool(spec.continuous)
    outputs += ["discrete_actions", "discrete_action_output_shape", "deterministic_discrete_actions"] * bool(spec.branches)
    return inputs, outputs + ["recurrent_out"] * bool(spec.memory)


@pytest.mark.parametrize("source", ["pt", "onnx"])
@pytest.mark.parametrize("name", NAMES)
def test_onnx_compare_passes_every_shape_and_compares_every_output(name, source, shaped_files, tmp_path):
    spec = SHAPES[name]
    job = run_job(tmp_path, "onnx-compare", model_arg(shaped_files, name, source), *FAST)
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    vs = "vs_onnxruntime"
    assert (f"actions/{vs}/max_abs" in m) == bool(spec.continuous) and ("sampled/mean_z_max" in m) == bool(spec.continuous)
    if spec.continuous:
        assert m[f"actions/{vs}/max_abs"] <= 1e-5 and m["continuous_action_output_shape/vs_expected/equal"] == 1.0
    if spec.branches:
        assert m[f"discrete_actions/{vs}/agreement"] == 1.0 and m[f"discrete_actions/{vs}/flips_beyond_margin"] == 0.0
        assert m["discrete_action_output_shape/vs_expected/equal"] == 1.0
        assert m["sampled_discrete/masked_draws"] == 0.0 and m["sampled_discrete/p_min"] >= m["sampled_discrete/p_crit"]
        assert m["sampled_discrete/cells"] == 4 * len(spec.branches)
    if spec.memory:
        assert m[f"memories/{vs}/max_abs"] <= m[f"memories/{vs}/max_abs_limit"] and m["memory_size/vs_expected/equal"] == 1.0
    assert m["version_number/vs_expected/equal"] == 1.0
    assert not [k for k in m if "." in k]  # every name grouped with /


@pytest.mark.parametrize("source", ["pt", "onnx"])
@pytest.mark.parametrize("name", NAMES)
def test_export_onnx_writes_mlagents_io_for_every_shape_and_reproduces_the_source(name, source, shaped_files, tmp_path):
    spec = SHAPES[name]
    job = run_job(tmp_path, "export-onnx", model_arg(shaped_files, name, source), "obs.rows=9", f"mode.path={tmp_path / 'out.onnx'}")
    assert job.record["status"] == "passed", job.record["reason"]
    inputs, outputs = expected_io(spec)
    model = onnx.load(str(tmp_path / "out.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == inputs and [o.name for o in model.graph.output] == outputs
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 9
    assert job.record["tags"]["onnx_inputs"] == ",".join(inputs) and job.record["tags"]["onnx_outputs"] == ",".join(outputs)
    m = job.record["metrics"]
    assert m["interface/problems"] == 0.0 and m["interface/outputs"] == len(outputs)
    for side in ("vs_torch", "vs_source"):
        assert m.get(f"actions/{side}/max_abs", 0.0) <= 1e-5 and m.get(f"discrete_actions/{side}/agreement", 1.0) == 1.0
        assert m.get(f"memories/{side}/max_abs", 0.0) <= 1e-5
    assert ("actions/vs_torch/max_abs" in m) == bool(spec.continuous) and m["version_number/vs_expected/equal"] == 1.0
    assert not [k for k in m if "." in k]  # every name grouped with /
    back = mlagents.load_onnx(tmp_path / "out.onnx").weights  # the exported graph reads back as the same shape
    assert back.obs_sizes == spec.inputs and back.branch_sizes == spec.branches and back.memory == spec.memory


def sequence_npz(actor, path, steps: int = 5, rows: int = 6):
    frames = [actor.random_feeds(rows, seed=40 + t) for t in range(steps)]
    np.savez(path, **{k: np.stack([f[k] for f in frames]) for k in frames[0]})
    return path


@pytest.mark.parametrize("mode", ["onnx-compare", "export-onnx"])
def test_a_memory_sequence_runs_step_by_step_on_both_sides(mode, shaped_actors, shaped_files, tmp_path):
    npz = sequence_npz(shaped_actors["memory_discrete"], tmp_path / "seq.npz")
    extra = FAST[2:] if mode == "onnx-compare" else ()
    job = run_job(tmp_path / "job", mode, f"model.checkpoint={shaped_files['memory_discrete'][0]}", "obs=file", f"obs.path={npz}", *extra)
    assert job.record["status"] == "passed", job.record["reason"]
    assert job.record["details"]["sequence"] is True
    if mode == "onnx-compare":
        onnx_mem, torch_mem = np.load(job.workdir / "onnx_memories.npy"), np.load(job.workdir / "torch_memories.npy")
        assert onnx_mem.shape == torch_mem.shape == (5, 6, 1, 16)
        np.testing.assert_allclose(onnx_mem, torch_mem, atol=1e-5, rtol=0)
        assert not np.allclose(onnx_mem[-1], onnx_mem[0])  # the memory moved: it was carried
        np.testing.assert_array_equal(np.load(job.workdir / "onnx_discrete_actions.npy"), np.load(job.workdir / "torch_discrete_actions.npy"))


# --- broken graphs must fail


def edited(path, out, edit):
    model = onnx.load(str(path))
    edit(model.graph)
    onnx.save(model, str(out))
    return out


def misplace_masks(graph):
    """Branch 1 reads the first branch's slice of action_masks."""
    slices = [n for n in graph.node if n.op_type == "Slice" and n.input[0] == "action_masks"]
    size = next(a.ints[0] for a in slices[1].attribute if a.name == "ends") - next(a.ints[0] for a in slices[1].attribute if a.name == "starts")
    for a in slices[1].attribute:
        if a.name in ("starts", "ends"):
            a.ints[0] = 0 if a.name == "starts" else size


def temper_sampler(graph):
    """Multinomial draws from Log(p) / 2: the masked actions stay impossible, the rest flatter than the softmax."""
    nodes = list(graph.node)
    for i, node in reversed(list(enumerate(nodes))):
        if node.op_type == "Multinomial":
            graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), f"half_{i}"))
            graph.node.insert(i, helper.make_node("Mul", [node.input[0], f"half_{i}"], [f"tempered_{i}"]))
            node.input[0] = f"tempered_{i}"


def set_initializer(name, change):
    def edit(graph):
        init = next(i for i in graph.initializer if i.name == name)
        init.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(init).copy()), name))
    return edit


@pytest.mark.parametrize("name, edit, expect", [
    ("branches", misplace_masks, "discrete_actions: "),  # outputs named by stem, as the PASS line names them
    ("memory_discrete", misplace_masks, "draws of a masked action"),
    ("branches", temper_sampler, "do not follow the masked softmax"),
    ("hybrid", set_initializer("action_model._continuous_distribution.mu.bias", lambda a: a + np.float32(0.05)), "actions: max_abs"),
    ("multi_input", set_initializer("action_model._continuous_distribution.mu.bias", lambda a: a * np.float32(np.nan)), "NaN"),
    ("memory_hybrid_sac", set_initializer("lstm_B", lambda a: a + np.float32(0.01)), "memories: max_abs"),
])
def test_onnx_compare_fails_on_a_broken_graph(name, edit, expect, shaped_files, tmp_path):
    bad = edited(shaped_files[name][1], tmp_path / "bad.onnx", edit)
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={shaped_files[name][0]}", f"model.onnx={bad}",
                  "obs.rows=32", "mode.sample_rows=8", "mode.samples=1000")
    assert job.record["status"] == "failed"
    assert expect in job.record["reason"], job.record["reason"]


def test_all_allowed_masks_would_hide_misplaced_masks_so_they_are_random_by_default(shaped_files, tmp_path):
    bad = edited(shaped_files["branches"][1], tmp_path / "bad.onnx", misplace_masks)
    args = (f"model.checkpoint={shaped_files['branches'][0]}", f"model.onnx={bad}", *FAST)
    assert run_job(tmp_path / "feeds", "onnx-compare", *args, "mode.masks=feeds").record["status"] == "passed"
    assert run_job(tmp_path / "random", "onnx-compare", *args).record["status"] == "failed"


def test_export_onnx_fails_when_the_source_graph_differs(shaped_files, tmp_path):
    bad = edited(shaped_files["branches"][1], tmp_path / "bad.onnx", misplace_masks)
    job = run_job(tmp_path / "job", "export-onnx", f"model.checkpoint={shaped_files['branches'][0]}", f"model.onnx={bad}", "obs.rows=30")
    assert job.record["status"] == "failed"
    assert "exported vs source .onnx: discrete_actions: " in job.record["reason"]
    assert job.record["metrics"]["discrete_actions/vs_torch/agreement"] == 1.0  # the export itself is right


def test_categorical_check_counts_masked_draws_and_rejects_a_wrong_distribution():
    logits = np.array([[0.0, 1.0, -1e8, 2.0]])
    masks = np.array([[1.0, 1.0, 0.0, 1.0]])
    rng = np.random.default_rng(0)
    p = np.exp(logits[0] - 2.0) / np.exp(logits[0] - 2.0).sum()
    good = rng.choice(4, size=(2000, 1, 1), p=p)
    assert categorical_check(good, logits, (4,), masks)["p_min"] > 1e-3
    flat = rng.choice([0, 1, 3], size=(2000, 1, 1))
    assert categorical_check(flat, logits, (4,), masks)["p_min"] < 1e-6
    with_masked = good.copy()
    with_masked[0] = 2
    stats = categorical_check(with_masked, logits, (4,), masks)
    assert stats["masked_draws"] == 1 and stats["p_min"] == 0.0


# --- the genuine ML-Agents fixtures


@needs_shared
@pytest.mark.parametrize("mode", ["onnx-compare", "export-onnx"])
@pytest.mark.parametrize("model", [f"model.checkpoint={PYRAMIDS_PT}", f"model.onnx={PYRAMIDS_ONNX}"], ids=["pt", "onnx"])
def test_pyramids_reference_feeds_pass_and_onnxruntime_equals_mlagents(mode, model, tmp_path):
    ref = PYRAMIDS / "reference"
    np.savez(tmp_path / "obs.npz", **{f"obs_{i}": np.load(ref / f"obs_{i}.npy") for i in range(4)}, action_masks=np.load(ref / "action_masks.npy"))
    job = run_job(tmp_path / "job", mode, model, "obs=file", f"obs.path={tmp_path / 'obs.npz'}")
    assert job.record["status"] == "passed", job.record["reason"]
    expected = np.load(ref / "discrete_actions_torch.npy")
    if mode == "onnx-compare":
        np.testing.assert_array_equal(np.load(job.workdir / "onnx_discrete_actions.npy"), expected)
        np.testing.assert_array_equal(np.load(job.workdir / "torch_discrete_actions.npy"), expected)
        assert job.record["metrics"]["sampled_discrete/masked_draws"] == 0.0
    else:
        np.testing.assert_array_equal(np.load(job.workdir / "exported_discrete_actions.npy"), expected)
        assert job.record["metrics"]["graph/vs_source/bit_identical"] == 1.0


@needs_shared
@pytest.mark.parametrize("model, mode", [
    pytest.param(f"model.onnx={HUGGY_LSTM_ONNX}", "onnx-compare", id="onnx-onnx-compare"),
    # torch from the .pt against the genuine graph beside it (8 s): the .pt over the sequence is also checked by
    # pt-export-onnx and test_shapes_modes_prec.py::test_huggy_lstm_precision_over_the_mlagents_sequence
    pytest.param(f"model.checkpoint={HUGGY_LSTM_PT}", "onnx-compare", id="pt-onnx-compare", marks=pytest.mark.slow),
    pytest.param(f"model.onnx={HUGGY_LSTM_ONNX}", "export-onnx", id="onnx-export-onnx"),
    pytest.param(f"model.checkpoint={HUGGY_LSTM_PT}", "export-onnx", id="pt-export-onnx"),
])
def test_huggy_lstm_sequence_passes_with_the_memory_carried(mode, model, tmp_path):
    ref = HUGGY_LSTM / "reference"
    job = run_job(tmp_path, mode, model, "obs=file", f"obs.path={ref / 'obs_seq.npy'}")
    assert job.record["status"] == "passed", job.record["reason"]
    m = job.record["metrics"]
    assert m[f"memories/vs_{'onnxruntime' if mode == 'onnx-compare' else 'torch'}/max_abs"] <= 1e-5
    if mode == "onnx-compare":  # onnxruntime here carries its memory as ML-Agents' onnxruntime run did
        np.testing.assert_allclose(np.load(tmp_path / "onnx_actions.npy"), np.load(ref / "seq_actions_onnxruntime.npy"), atol=1e-6, rtol=0)
        np.testing.assert_allclose(np.load(tmp_path / "onnx_memories.npy")[:, :, 0], np.load(ref / "seq_memories_onnxruntime.npy"), atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.load(tmp_path / "torch_actions.npy"), np.load(ref / "seq_actions.npy"), atol=3e-6, rtol=0)


@needs_shared
def test_pyramids_graph_with_misplaced_masks_fails(tmp_path):
    def ignore_masks(graph):  # one branch: feed the slice from a mask of ones instead
        graph.initializer.append(numpy_helper.from_array(np.ones((1, 5), np.float32), "ones"))
        for node in graph.node:
            for k, name in enumerate(node.input):
                if name == "action_masks" and node.op_type == "Slice":
                    node.input[k] = "ones"
    bad = edited(PYRAMIDS_ONNX, tmp_path / "bad.onnx", ignore_masks)
    ref = PYRAMIDS / "reference"
    np.savez(tmp_path / "obs.npz", **{f"obs_{i}": np.load(ref / f"obs_{i}.npy") for i in range(4)}, action_masks=np.load(ref / "action_masks.npy"))
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={PYRAMIDS_PT}", f"model.onnx={bad}", "obs=file",
                  f"obs.path={tmp_path / 'obs.npz'}")
    assert job.record["status"] == "failed"
    assert "discrete_actions: " in job.record["reason"] and "draws of a masked action" in job.record["reason"]


def test_a_graph_without_an_output_the_policy_has_is_a_one_line_error(shaped_files, tmp_path):
    def drop_sampled(graph):
        keep = [o for o in graph.output if o.name != "discrete_actions"]
        del graph.output[:]
        graph.output.extend(keep)
    bad = edited(shaped_files["memory_discrete"][1], tmp_path / "bad.onnx", drop_sampled)
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={shaped_files['memory_discrete'][0]}", f"model.onnx={bad}", *FAST)
    assert job.record["status"] == "error"
    reason = job.record["reason"]
    assert "is not an ML-Agents policy for this checkpoint" in reason and "discrete_actions [N, 2]" in reason and "\n" not in reason
