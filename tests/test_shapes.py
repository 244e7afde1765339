"""Every supported ML-Agents shape on fixtures built here: several inputs, several branches, hybrid, memory, SAC;
from the .pt (ML-Agents' layout) and from the .onnx alone (ML-Agents' graph layout, run by onnxruntime too)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from conftest import SHAPES, run_job, save_mlagents_checkpoint

from huggy_exp import mlagents
from huggy_exp.errors import UserError
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, DISCRETE, DISCRETE_SAMPLED, OnnxRunner, Recurrent, TorchRunner

NAMES = list(SHAPES)
ATOL = 1e-5  # fp32 against the float64 reference, small networks
MARGIN = 1e-4  # discrete actions are compared where the best masked logit leads the second by more than fp32 noise


def runner(path, batch_size: int = 0) -> TorchRunner:
    model = mlagents.load_checkpoint(path) if path.suffix == ".pt" else mlagents.load_onnx(path)
    return TorchRunner(model.weights, resolve("cpu", "fp32"), batch_size)


def assert_matches_reference(out: dict, ref: dict) -> None:
    if "deterministic_continuous_actions" in ref:
        np.testing.assert_allclose(out[ACTIONS], ref[ACTIONS], atol=ATOL, rtol=0)
    if "deterministic_discrete_actions" in ref:
        clear = ref["margins"] > MARGIN
        assert clear.mean() > 0.9
        np.testing.assert_array_equal(out[DISCRETE][clear], ref[DISCRETE][clear])
    if "recurrent_out" in ref:
        np.testing.assert_allclose(out["recurrent_out"], ref["recurrent_out"], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("source", ["pt", "onnx"])
def test_shape_loads_with_its_inputs_heads_and_memory(name, source, shaped_files):
    spec = SHAPES[name]
    path = shaped_files[name][source == "onnx"]
    w = (mlagents.load_checkpoint(path) if source == "pt" else mlagents.load_onnx(path)).weights
    assert w.obs_sizes == spec.inputs and w.branch_sizes == spec.branches and w.act_dim == spec.continuous
    assert w.memory == spec.memory and w.tanh_squash == spec.sac
    assert all((i.normalizer is not None) == spec.normalize for i in w.inputs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("source", ["pt", "onnx"])
def test_deterministic_outputs_match_the_float64_reference(name, source, shaped_actors, shaped_files):
    actor = shaped_actors[name]
    feeds = actor.random_feeds(48, seed=1)
    obs = [feeds[f"obs_{i}"] for i in range(len(actor.spec.inputs))]
    memory = np.random.default_rng(2).normal(0, 0.5, (48, 1, actor.spec.memory)).astype(np.float32) if actor.spec.memory else None
    if memory is not None:
        feeds["recurrent_in"] = memory
    out = runner(shaped_files[name][source == "onnx"], batch_size=16).infer(feeds)
    assert_matches_reference(out, actor.forward(obs, feeds.get("action_masks"), memory))
    if DISCRETE in out:
        assert out[DISCRETE].dtype == np.int64 and out[DISCRETE].shape == (48, len(actor.spec.branches))


@pytest.mark.parametrize("name", [n for n in NAMES if SHAPES[n].memory])
def test_memory_sequence_carries_the_memory_like_the_reference(name, shaped_actors, shaped_files):
    actor = shaped_actors[name]
    steps = [actor.random_feeds(6, seed=10 + t) for t in range(7)]
    seq = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
    got = Recurrent(runner(shaped_files[name][0]).infer, actor.spec.memory).sequence(seq)
    memory = None
    for t, feeds in enumerate(steps):
        ref = actor.forward([feeds[f"obs_{i}"] for i in range(len(actor.spec.inputs))], feeds.get("action_masks"), memory)
        assert_matches_reference({k: v[t] for k, v in got.items()}, ref)
        memory = ref["recurrent_out"]
    zero_memory = runner(shaped_files[name][0]).infer({k: v[-1] for k, v in seq.items()})
    assert not np.allclose(zero_memory["recurrent_out"], got["recurrent_out"][-1])  # the carried memory matters


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_on_the_mlagents_layout_graph_agrees_with_torch(name, shaped_actors, shaped_files):
    actor = shaped_actors[name]
    feeds = actor.random_feeds(32, seed=3)
    if actor.spec.memory:
        feeds["recurrent_in"] = np.random.default_rng(4).normal(0, 0.5, (32, 1, actor.spec.memory)).astype(np.float32)
    ours, theirs = runner(shaped_files[name][0]).infer(feeds), OnnxRunner(shaped_files[name][1]).infer(feeds)
    for key, value in ours.items():
        if value.dtype == np.int64:
            np.testing.assert_array_equal(value, theirs[key])
        else:
            np.testing.assert_allclose(value, theirs[key], atol=ATOL, rtol=0)
    model = onnx.load(str(shaped_files[name][1]))
    inputs = [i.name for i in model.graph.input]
    expected = [f"obs_{i}" for i in range(len(actor.spec.inputs))]
    expected += ["action_masks"] * bool(actor.spec.branches) + ["recurrent_in"] * bool(actor.spec.memory)
    assert inputs == expected
    outputs = ["version_number", "memory_size"]
    outputs += ["continuous_actions", "continuous_action_output_shape", "deterministic_continuous_actions"] * bool(actor.spec.continuous)
    outputs += ["discrete_actions", "discrete_action_output_shape", "deterministic_discrete_actions"] * bool(actor.spec.branches)
    outputs += ["recurrent_out"] * bool(actor.spec.memory)
    assert [o.name for o in model.graph.output] == outputs


@pytest.mark.parametrize("name", [n for n in NAMES if SHAPES[n].branches])
def test_a_masked_action_is_never_chosen(name, shaped_actors, shaped_files):
    actor = shaped_actors[name]
    feeds = actor.random_feeds(200, seed=5)
    r = runner(shaped_files[name][0], batch_size=64)
    starts = np.cumsum([0, *actor.spec.branches])[:-1]
    for out in (r.infer(feeds)[DISCRETE], *(r.sample(feeds, seed)[DISCRETE_SAMPLED] for seed in range(5))):
        chosen = feeds["action_masks"][np.arange(200)[:, None], starts[None, :] + out]
        assert (chosen == 1.0).all()
    only = np.zeros_like(feeds["action_masks"])  # one allowed action per branch: it is always the one chosen
    picks = np.stack([np.random.default_rng(6).integers(0, s, 200) for s in actor.spec.branches], axis=1)
    only[np.arange(200)[:, None], starts[None, :] + picks] = 1.0
    feeds["action_masks"] = only
    np.testing.assert_array_equal(r.infer(feeds)[DISCRETE], picks)
    np.testing.assert_array_equal(r.sample(feeds, 7)[DISCRETE_SAMPLED], picks)


@pytest.mark.parametrize("name", ["branches", "hybrid"])
def test_sampled_discrete_actions_repeat_with_the_seed_whatever_the_chunking(name, shaped_actors, shaped_files):
    feeds = shaped_actors[name].random_feeds(300, seed=8)
    a = runner(shaped_files[name][0], batch_size=0).sample(feeds, seed=11)
    b = runner(shaped_files[name][0], batch_size=7).sample(feeds, seed=11)
    c = runner(shaped_files[name][1], batch_size=64).sample(feeds, seed=11)
    for other in (b, c):  # continuous samples may move by an ulp with the GEMM kernel of another chunk size
        np.testing.assert_array_equal(a[DISCRETE_SAMPLED], other[DISCRETE_SAMPLED])
        if "continuous_actions" in a:
            np.testing.assert_allclose(a["continuous_actions"], other["continuous_actions"], atol=1e-6, rtol=0)
    np.testing.assert_array_equal(a[DISCRETE_SAMPLED], runner(shaped_files[name][0], batch_size=7).sample(feeds, seed=11)[DISCRETE_SAMPLED])
    assert not np.array_equal(a[DISCRETE_SAMPLED], runner(shaped_files[name][0]).sample(feeds, seed=12)[DISCRETE_SAMPLED])


def test_sampled_discrete_frequencies_follow_the_masked_softmax(shaped_actors, shaped_files):
    actor = shaped_actors["branches"]
    feeds = actor.random_feeds(1, seed=9)
    draws = 4000
    tiled = {k: np.repeat(v, draws, axis=0) for k, v in feeds.items()}
    got = runner(shaped_files["branches"][0]).sample(tiled, seed=3)[DISCRETE_SAMPLED]
    x, _ = actor.features([feeds["obs_0"]], None)
    for b, logits in enumerate(actor.logits(x, feeds["action_masks"])):
        p = np.exp(logits[0] - logits[0].max())
        p /= p.sum()
        freq = np.bincount(got[:, b], minlength=len(p)) / draws
        np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / draws))


@pytest.mark.parametrize("key, what", [
    ("network_body.observation_encoder.processors.0.conv_layers.0.weight", "a visual (CNN) encoder"),
    ("network_body.observation_encoder.processors.1.dense.0.weight", "a visual (CNN) encoder"),
    ("network_body.observation_encoder.rsa.fc_q.weight", "attention over variable-length observations"),
])
def test_unsupported_encoders_are_refused_in_one_line_naming_them(key, what, shaped_actors, tmp_path):
    state = {**shaped_actors["hybrid"].state_dict(), key: torch.zeros(4, 4)}
    with pytest.raises(UserError, match="unsupported policy shape") as err:
        mlagents.load_checkpoint(save_mlagents_checkpoint(tmp_path / "odd.pt", state, 10))
    assert what in str(err.value) and key in str(err.value) and "\n" not in str(err.value)


def test_a_visual_onnx_input_is_refused_in_one_line(shaped_files, tmp_path):
    model = onnx.load(str(shaped_files["multi_input"][1]))
    dims = model.graph.input[1].type.tensor_type.shape.dim
    dims.add().dim_value = 84
    dims.add().dim_value = 3
    onnx.save(model, str(tmp_path / "visual.onnx"))
    with pytest.raises(UserError, match=r"unsupported policy shape: a visual observation \(CNN encoder\) \(found input obs_1"):
        mlagents.load_onnx(tmp_path / "visual.onnx")


def test_lstm_memory_size_must_match_its_declaration(shaped_actors, tmp_path):
    state = {**shaped_actors["memory_discrete"].state_dict(), "memory_size_vector": torch.tensor([32.0])}
    with pytest.raises(UserError, match="memory_size_vector says 32 but the LSTM holds 16"):
        mlagents.load_checkpoint(save_mlagents_checkpoint(tmp_path / "m.pt", state, 10))


def test_inputs_without_normalizers_read_as_one_input_when_nothing_tells_their_split(shaped_actors, tmp_path):
    pt = save_mlagents_checkpoint(tmp_path / "alone" / "x-1.pt", shaped_actors["memory_hybrid_sac"].state_dict(), 1)
    assert mlagents.load_checkpoint(pt).weights.obs_sizes == (8,)


# --- modes on every shape


def test_action_mode_writes_each_output_for_an_npz_of_inputs_and_masks(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["hybrid"]
    feeds = actor.random_feeds(20, seed=12)
    np.savez(tmp_path / "obs.npz", **feeds)
    job = run_job(tmp_path / "job", "action", f"model.checkpoint={shaped_files['hybrid'][0]}", "obs=file", f"obs.path={tmp_path / 'obs.npz'}")
    assert job.record["status"] == "passed", job.record["reason"]
    actions, discrete = np.load(job.workdir / "actions.npy"), np.load(job.workdir / "discrete_actions.npy")
    assert actions.dtype == np.float32 and actions.shape == (20, 2) and discrete.dtype == np.int64 and discrete.shape == (20, 1)
    ref = actor.forward([feeds["obs_0"], feeds["obs_1"]], feeds["action_masks"])
    np.testing.assert_allclose(actions, ref[ACTIONS], atol=ATOL, rtol=0)
    np.testing.assert_array_equal(discrete[ref["margins"] > MARGIN], ref[DISCRETE][ref["margins"] > MARGIN])
    assert sum(v for k, v in job.record["metrics"].items() if k.startswith("discrete.branch_0.")) == pytest.approx(1.0)


def test_action_mode_runs_a_sequence_with_memory_and_writes_memories(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["memory_discrete"]
    steps = [actor.random_feeds(4, seed=20 + t, masked=False) for t in range(5)]
    np.save(tmp_path / "seq.npy", np.stack([s["obs_0"] for s in steps]))
    job = run_job(tmp_path / "job", "action", f"model.onnx={shaped_files['memory_discrete'][1]}", "obs=file", f"obs.path={tmp_path / 'seq.npy'}")
    assert job.record["status"] == "passed", job.record["reason"]
    discrete, memories = np.load(job.workdir / "discrete_actions.npy"), np.load(job.workdir / "memories.npy")
    assert discrete.shape == (5, 4, 2) and memories.shape == (5, 4, 16) and job.record["metrics"]["steps"] == 5
    memory = None
    for t, feeds in enumerate(steps):
        ref = actor.forward([feeds["obs_0"]], None, memory)
        memory = ref["recurrent_out"]
        np.testing.assert_allclose(memories[t], memory[:, 0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["sample", "batch", "info"])
def test_sample_batch_and_info_pass_on_every_shape_from_random_inputs(mode, shaped_files, tmp_path):
    for name in ("memory_hybrid_sac", "branches"):
        job = run_job(tmp_path / name, mode, f"model.checkpoint={shaped_files[name][0]}", "obs.rows=12", "batch_size=5")
        assert job.record["status"] == "passed", job.record["reason"]
    assert (mode != "info") or job.record["details"]["shape"]["branch_sizes"] == [3, 2, 4]


@pytest.mark.parametrize("name", ["memory_discrete", "memory_hybrid_sac", "multi_input"])
def test_benchmark_passes_on_other_shapes_timing_eager_and_onnxruntime(name, shaped_files, tmp_path):
    job = run_job(tmp_path, "benchmark", f"model.checkpoint={shaped_files[name][0]}", "obs.rows=4", "mode.budget_s=0.02",
                  "mode.rounds=1", "mode.warmup_s=0.01", "mode.settle_s=0", "mode.batch_sizes=[1,4]",
                  "mode.backends=[eager,onnxruntime,compile]")
    assert job.record["status"] == "passed", job.record["reason"]
    assert job.record["metrics"]["eager/b1/p50_us"] > 0 and job.record["metrics"]["onnxruntime/b4/obs_per_s"] > 0
    assert job.record["details"]["backends"]["compile"]["status"] == "skipped"
    assert job.record["details"]["backends"]["compile"]["reason"].startswith("backend compile runs Huggy's shape only")


@pytest.mark.parametrize("arrays, message", [
    ({"obs_0": np.zeros((3, 7))}, "missing obs_1"),
    ({"obs_0": np.zeros((3, 7)), "obs_1": np.zeros((3, 5))}, r"obs_1: expected \[N, 2\]"),
    ({"obs_0": np.zeros((3, 7)), "obs_1": np.zeros((4, 2))}, "every input needs the same leading"),
    ({"obs_0": np.zeros((3, 7)), "obs_1": np.zeros((3, 2)), "action_masks": np.full((3, 3), 0.5)}, "1 \\(allowed\\) and 0 \\(masked\\) only"),
    ({"obs_0": np.zeros((3, 7)), "obs_1": np.zeros((3, 2)), "extra": np.zeros(3)}, "unexpected extra"),
])
def test_bad_npz_observations_are_one_line_errors(arrays, message, shaped_files, tmp_path):
    np.savez(tmp_path / "bad.npz", **arrays)
    job = run_job(tmp_path / "job", "action", f"model.checkpoint={shaped_files['hybrid'][0]}", "obs=file", f"obs.path={tmp_path / 'bad.npz'}")
    assert job.record["status"] == "error"
    assert pytest.importorskip("re").search(message, job.record["reason"]), job.record["reason"]


def test_a_pt_read_as_one_concatenated_input_takes_the_inputs_one_by_one(shaped_actors, tmp_path):
    actor = shaped_actors["memory_hybrid_sac"]  # normalize: false, inputs (5, 3)
    pt = save_mlagents_checkpoint(tmp_path / "alone" / "x-1.pt", actor.state_dict(), 1)
    feeds = actor.random_feeds(9, seed=30)
    feeds["recurrent_in"] = np.zeros((9, 1, 8), np.float32)
    out = runner(pt).infer(feeds)
    assert_matches_reference(out, actor.forward([feeds["obs_0"], feeds["obs_1"]], feeds["action_masks"], None))
    with pytest.raises(UserError, match=r"feeds obs_0 \[9, 5\] do not fit this policy's inputs \[8\]"):
        runner(pt).infer({"obs_0": feeds["obs_0"]})


def test_an_unknown_observation_encoder_key_is_refused_as_an_unsupported_shape(shaped_actors, tmp_path):
    key = "network_body.observation_encoder.processors.0.ent_encoder.seq_layers.0.weight"
    state = {**shaped_actors["hybrid"].state_dict(), key: torch.zeros(4, 4)}
    with pytest.raises(UserError, match="attention over variable-length observations"):
        mlagents.load_checkpoint(save_mlagents_checkpoint(tmp_path / "odd.pt", state, 10))


@pytest.fixture(scope="module")
def shaped_states(shaped_actors):
    return [a.state_dict() for a in shaped_actors.values()]


def test_edited_state_dicts_of_every_shape_load_sanely_or_fail_in_one_line(shaped_states):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    keys = sorted({k for s in shaped_states for k in s} | {"network_body.lstm.lstm.weight_ih_l1", "action_model._discrete_distribution.branches.9.weight"})
    shapes = st.sampled_from([(3,), (2, 3), (4, 16), (16,), (1, 2), (), (0,), (32, 8), (8, 4)])

    @settings(max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(0, len(shaped_states) - 1), st.lists(st.tuples(st.sampled_from(keys), st.sampled_from(["del", "shape", "nan"]), shapes),
                                                             min_size=1, max_size=3))
    def check(which, edits):
        state = dict(shaped_states[which])
        for key, action, shape in edits:
            if action == "del":
                state.pop(key, None)
            elif action == "shape":
                state[key] = torch.zeros(shape)
            elif key in state and state[key].is_floating_point() and state[key].numel():
                state[key] = state[key].clone().reshape(-1).index_fill(0, torch.tensor([0]), float("nan")).reshape(state[key].shape)
        try:
            w = mlagents.weights_from_state_dict(state, "edited")
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        out = TorchRunner(w, resolve("cpu", "fp32")).infer({f"obs_{i}": np.zeros((2, s), np.float32) for i, s in enumerate(w.obs_sizes)})
        assert all(np.isfinite(v).all() for v in out.values() if v.dtype.kind == "f")

    check()


def test_an_lstm_weight_that_is_not_a_matrix_is_a_one_line_shape_error(shaped_actors, tmp_path):
    state = {**shaped_actors["memory_discrete"].state_dict(), "network_body.lstm.lstm.weight_hh_l0": torch.zeros(32)}
    with pytest.raises(UserError, match=r"shape mismatch: network_body.lstm.lstm.weight_ih_l0"):
        mlagents.load_checkpoint(save_mlagents_checkpoint(tmp_path / "m.pt", state, 10))


@pytest.mark.parametrize("name, key, shape", [
    ("hybrid", "action_masks", (4, 2)),
    ("hybrid", "obs_1", (5, 2)),
    ("memory_discrete", "recurrent_in", (4, 16)),
])
def test_feeds_that_do_not_fit_the_policy_are_one_line_errors(name, key, shape, shaped_actors, shaped_files):
    feeds = shaped_actors[name].random_feeds(4, seed=40)
    feeds[key] = np.zeros(shape, np.float32)
    with pytest.raises(UserError, match=rf"feeds do not fit this policy: {key} \[{', '.join(map(str, shape))}\]"):
        runner(shaped_files[name][0]).infer(feeds)


def test_a_fully_masked_branch_behaves_as_in_mlagents_uniform_and_argmax_zero(shaped_actors, shaped_files):
    feeds = shaped_actors["branches"].random_feeds(50, seed=41)
    feeds["action_masks"][:, 3:5] = 0.0  # branch 1 (size 2) fully masked
    ours, theirs = runner(shaped_files["branches"][0]).infer(feeds), OnnxRunner(shaped_files["branches"][1]).infer(feeds)
    assert (ours[DISCRETE][:, 1] == 0).all()
    np.testing.assert_array_equal(ours[DISCRETE], theirs[DISCRETE])
    drawn = runner(shaped_files["branches"][0]).sample({k: np.repeat(v[:1], 400, axis=0) for k, v in feeds.items()}, 1)
    assert set(np.unique(drawn[DISCRETE_SAMPLED][:, 1])) == {0, 1}


# --- backends (runners.build) on other shapes


@pytest.mark.parametrize("backend", ["compile", "graphs"])
def test_compile_and_graphs_refuse_other_shapes_in_one_line_naming_the_shape(backend, shaped_files, tmp_path):
    w = mlagents.load_checkpoint(shaped_files["hybrid"][0]).weights
    with pytest.raises(UserError, match=rf"backend {backend} runs Huggy's shape only .*this policy has 2 inputs \[7, 2\], 2 continuous"):
        TorchRunner(w, resolve("cpu", "fp32"), 0, backend)
    job = run_job(tmp_path, "action", f"model.checkpoint={shaped_files['hybrid'][0]}", "obs.rows=4", f"backend={backend}")
    assert job.record["status"] == "error" and job.record["reason"].startswith(f"backend {backend} runs Huggy's shape only")
    assert "\n" not in job.record["reason"]


def test_action_and_batch_on_onnxruntime_agree_with_eager_on_every_output_and_log_latency(shaped_files, tmp_path):
    for name in ("hybrid", "memory_discrete"):
        model = f"model.onnx={shaped_files[name][1]}"
        for mode in ("action", "batch"):
            jobs = {b: run_job(tmp_path / name / mode / b, mode, model, "obs.rows=12", "batch_size=5", f"backend={b}",
                               *(["mode.budget_s=0.02"] if mode == "batch" else []))
                    for b in ("eager", "onnxruntime")}
            for b, job in jobs.items():
                assert job.record["status"] == "passed", (name, mode, b, job.record["reason"])
                assert job.record["metrics"]["latency/p50_us"] > 0
            for file in ("actions.npy", "discrete_actions.npy", "memories.npy"):
                if (jobs["eager"].workdir / file).is_file():
                    ours, theirs = (np.load(jobs[b].workdir / file) for b in ("eager", "onnxruntime"))
                    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
                    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


def test_an_lstm_sequence_on_onnxruntime_carries_the_memory_like_eager(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["memory_discrete"]
    np.save(tmp_path / "seq.npy", np.stack([actor.random_feeds(4, seed=50 + t, masked=False)["obs_0"] for t in range(4)]))
    args = ("action", f"model.onnx={shaped_files['memory_discrete'][1]}", "obs=file", f"obs.path={tmp_path / 'seq.npy'}")
    eager, ort = run_job(tmp_path / "eager", *args), run_job(tmp_path / "ort", *args, "backend=onnxruntime")
    assert ort.record["status"] == "passed", ort.record["reason"]
    np.testing.assert_allclose(np.load(ort.workdir / "memories.npy"), np.load(eager.workdir / "memories.npy"), atol=ATOL, rtol=0)
    np.testing.assert_array_equal(np.load(ort.workdir / "discrete_actions.npy"), np.load(eager.workdir / "discrete_actions.npy"))
