"""precision, fingerprint and stats on every ML-Agents shape: the fixtures built here (several inputs, several branches,
hybrid, memory, memory + discrete, SAC) checked against conftest's own float64 numpy actor, and ML-Agents' own
pyramids / huggy_lstm files when ../shared is present."""

from __future__ import annotations

import csv
import hashlib

import numpy as np
import pytest
from conftest import HUGGY_LSTM, HUGGY_LSTM_PT, PYRAMIDS, PYRAMIDS_PT, SHAPES, needs_shared, run_job

from huggy_exp.verify import discrete_agreement, discrete_margins
from huggy_exp.runners import ACTIONS, DISCRETE, RECURRENT_OUT, TorchRunner
from huggy_exp.tasks import precision as precision_module

NAMES = list(SHAPES)


def masked_logits(logits: np.ndarray, masks: np.ndarray | None, penalty: float) -> np.ndarray:
    """ML-Agents' masking in float64: logits * mask - penalty * (1 - mask); all allowed without masks."""
    z = np.asarray(logits, np.float64)
    return z if masks is None else z * np.asarray(masks, np.float64) - penalty * (1.0 - np.asarray(masks, np.float64))
ATOL = 1e-5  # fp32 against the float64 reference, small networks
MARGIN = 1e-4  # discrete actions are compared where the best masked logit leads the second by more than fp32 noise


def obs_list(actor, feeds):
    return [feeds[f"obs_{i}"] for i in range(len(actor.spec.inputs))]


def carried(actor, seq: dict) -> dict[str, np.ndarray]:
    """The float64 reference over a [T, N, d] sequence, the memory carried from zeros; every output [T, N, *]."""
    memory, out = None, []
    for t in range(len(seq["obs_0"])):
        step = {k: v[t] for k, v in seq.items()}
        ref = actor.forward(obs_list(actor, step), step.get("action_masks"), memory)
        memory = ref.get(RECURRENT_OUT)
        out.append(ref)
    return {k: np.stack([r[k] for r in out]) for k in out[0]}


def sequence(actor, steps: int, rows: int, seed: int, masked: bool = True) -> dict[str, np.ndarray]:
    parts = [actor.random_feeds(rows, seed=seed + t, masked=masked) for t in range(steps)]
    return {k: np.stack([p[k] for p in parts]) for k in parts[0]}


def table(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def assert_outputs_match(workdir, ref: dict) -> None:
    """The job's arrays against the float64 reference: continuous and memories within ATOL, discrete where clear."""
    if ACTIONS in ref:
        np.testing.assert_allclose(np.load(workdir / "actions.npy"), ref[ACTIONS], atol=ATOL, rtol=0)
    if DISCRETE in ref:
        got, clear = np.load(workdir / "discrete_actions.npy"), ref["margins"] > MARGIN
        assert got.dtype == np.int64 and clear.mean() > 0.9
        np.testing.assert_array_equal(got[clear], ref[DISCRETE][clear])
    if RECURRENT_OUT in ref:
        np.testing.assert_allclose(np.load(workdir / "memories.npy"), ref[RECURRENT_OUT].squeeze(-2), atol=ATOL, rtol=0)


# --- precision


@pytest.mark.parametrize("name", NAMES)
def test_precision_fp32_passes_on_every_shape_and_reports_each_output(name, shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors[name]
    feeds = actor.random_feeds(24, seed=5)
    np.savez(tmp_path / "obs.npz", **feeds)
    job = run_job(tmp_path / "job", "precision", f"model.checkpoint={shaped_files[name][0]}", "obs=file", f"obs.path={tmp_path / 'obs.npz'}",
                  "batch_size=7")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    spec = actor.spec
    assert ("actions/vs_fp64/max_abs" in m) == bool(spec.continuous)
    assert ("memories/vs_fp64/max_abs" in m) == bool(spec.memory)
    assert ("discrete_actions/vs_fp64/agreement" in m) == bool(spec.branches)
    if spec.continuous:
        assert m["actions/vs_fp64/max_abs"] < ATOL and m["sampled_actions/vs_fp64/nan_mismatch"] == 0
    if spec.branches:
        assert m["discrete_actions/vs_fp64/flips_beyond_margin"] == 0 and m["discrete_actions/vs_fp64/agreement"] == 1.0
        assert m["discrete_actions/vs_fp64/decisions"] == 24 * len(spec.branches)
        assert m["discrete_actions/vs_fp64/margin_min"] == pytest.approx(actor.forward(obs_list(actor, feeds), feeds["action_masks"])["margins"].min(), rel=1e-4)
        assert "layer/logits/rel_rmse" in m and m["logits/vs_fp64/max_abs"] < ATOL
    if spec.memory:
        assert m["memories/vs_fp64/max_abs"] < ATOL and "layer/lstm/rel_rmse" in m and "layer/recurrent_out/rel_rmse" in m
    inputs = [f"layer/normalized_obs_{i}/rel_rmse" for i in range(len(spec.inputs))] if len(spec.inputs) > 1 else ["layer/normalized_obs/rel_rmse"]
    assert all(k in m for k in inputs)
    assert_outputs_match(job.workdir, actor.forward(obs_list(actor, feeds), feeds.get("action_masks")))


def sequence_job(mode, name, actor, files, tmp_path, steps, rows, seed):
    """`mode` over an .npz sequence [T, N, d] of the actor's inputs and masks: passed, with the outputs the float64
    reference gives with the memory carried."""
    seq = sequence(actor, steps=steps, rows=rows, seed=seed)
    np.savez(tmp_path / "seq.npz", **seq)
    job = run_job(tmp_path / "job", mode, f"model.checkpoint={files[name][0]}", "obs=file", f"obs.path={tmp_path / 'seq.npz'}")
    assert job.record["status"] == "passed", job.record["reason"]
    assert_outputs_match(job.workdir, carried(actor, seq))
    return job


def test_precision_runs_a_sequence_step_by_step_with_the_memory_carried(shaped_actors, shaped_files, tmp_path):
    job = sequence_job("precision", "memory_discrete", shaped_actors["memory_discrete"], shaped_files, tmp_path, steps=6, rows=5, seed=40)
    assert job.record["metrics"]["steps"] == 6 and job.record["metrics"]["discrete_actions/vs_fp64/decisions"] == 6 * 5 * 2
    steps = table(job.workdir / "step_errors.csv")
    assert [int(r["step"]) for r in steps] == list(range(6)) and all(float(r["memories_max_abs"]) < ATOL for r in steps)


class _Flipping(TorchRunner):
    """The runner under test (what precision's build() returns), with one chosen deterministic discrete decision changed (row, branch) -> action."""

    flip: tuple[int, int, int] = (0, 0, 0)

    def trace(self, feeds):
        out = super().trace(feeds)
        row, branch, action = self.flip
        out[DISCRETE] = out[DISCRETE].copy()
        out[DISCRETE][row, branch] = action
        return out


def best_scale(masked: np.ndarray, sizes) -> np.ndarray:
    """The one margin rule's scale: max(1, |best masked logit|) per branch."""
    return np.maximum(1.0, discrete_margins(masked, tuple(sizes))[1])


def _flip_case(actor, feeds, pick):
    """(row, branch, runner-up action, fp64 margin, logit scale) for the decision `pick` chooses (by margin in units of
    the branch's logit scale) among those with an allowed runner-up."""
    ref = actor.forward(obs_list(actor, feeds), feeds["action_masks"])
    x = actor.features(obs_list(actor, feeds), None)[0]
    logits = actor.logits(x, feeds["action_masks"])
    scale = best_scale(np.concatenate(logits, axis=1), actor.spec.branches)
    cands = [(ref["margins"][r, b] / scale[r, b], r, b, int(np.argsort(logits[b][r])[-2])) for b in range(len(logits))
             for r in range(len(feeds["obs_0"])) if ref["margins"][r, b] < 1e6]  # the runner-up is allowed
    _, row, branch, action = pick(cands)
    return row, branch, action, ref["margins"][row, branch], scale[row, branch]


@pytest.mark.parametrize("case", ["large", "small"])
def test_a_flip_fails_only_where_the_fp64_margin_exceeds_the_bound(case, shaped_actors, shaped_files, tmp_path, monkeypatch):
    actor = shaped_actors["branches"]
    feeds = actor.random_feeds(32, seed=7)
    np.savez(tmp_path / "obs.npz", **feeds)
    row, branch, action, margin, scale = _flip_case(actor, feeds, max if case == "large" else min)
    bound = (0.5 if case == "large" else 1.5) * margin / scale  # relative to the branch's logit scale, as the mode takes it
    assert (margin > 0.5) if case == "large" else (margin < 0.05)
    monkeypatch.setattr(_Flipping, "flip", (row, branch, action))
    monkeypatch.setattr(precision_module, "build", lambda ctx: _Flipping(ctx.weights, ctx.target(), ctx.batch_size))
    job = run_job(tmp_path / "job", "precision", f"model.checkpoint={shaped_files['branches'][0]}", "obs=file", f"obs.path={tmp_path / 'obs.npz'}",
                  f"verify.limits.fp32.margin={bound}")
    m = job.record["metrics"]
    assert m["discrete_actions/vs_fp64/flips"] == 1 and m["discrete_actions/vs_fp64/agreement"] == pytest.approx(1 - 1 / (32 * 3))
    assert m["discrete_actions/vs_fp64/flip_margin_max"] == pytest.approx(margin, rel=1e-6)
    if case == "large":
        assert m["discrete_actions/vs_fp64/flips_beyond_margin"] == 1
        assert job.record["status"] == "failed" and "vs cpu fp64: discrete_actions: 1 of 96 actions differ" in job.record["reason"]
    else:
        assert m["discrete_actions/vs_fp64/flips_beyond_margin"] == 0
        assert job.record["status"] == "passed", job.record["reason"]


def test_a_nan_memory_the_reference_does_not_have_fails(shaped_files, tmp_path, monkeypatch):
    class NanMemory(TorchRunner):
        def trace(self, feeds):
            out = super().trace(feeds)
            out[RECURRENT_OUT] = out[RECURRENT_OUT].copy()
            out[RECURRENT_OUT][1, 0, 3] = np.nan
            return out

    monkeypatch.setattr(precision_module, "build", lambda ctx: NanMemory(ctx.weights, ctx.target(), ctx.batch_size))
    job = run_job(tmp_path, "precision", f"model.checkpoint={shaped_files['memory_hybrid_sac'][0]}", "obs.rows=6")
    assert job.record["status"] == "failed"
    assert "memories: 1 NaN/Inf values" in job.record["reason"] and job.record["metrics"]["memories/vs_fp64/nan_mismatch"] == 1


def test_discrete_agreement_counts_flips_against_the_bound():
    logits = np.array([[3.0, 1.0, 2.9], [0.0, 5.0, -1.0], [1.0, 1.0, 1.0]])
    masks = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]], np.float32)
    m = discrete_margins(masked_logits(logits, masks, 1e8), (3,))[0]
    np.testing.assert_allclose(m[:, 0], [0.1, 5.0, 0.0], atol=1e-9)
    got = discrete_agreement(np.array([[2], [0], [1]]), np.array([[0], [1], [0]]), m, bound=0.2)
    assert got["flips"] == 3 and got["flips_beyond_margin"] == 1 and got["flip_margin_max"] == pytest.approx(5.0)
    assert discrete_agreement(np.array([[0]]), np.array([[0]]), m[:1], 0.0)["agreement"] == 1.0
    nan = discrete_agreement(np.array([[1]]), np.array([[0]]), np.array([[np.nan]]), bound=1e9)
    assert nan["flips_beyond_margin"] == 1 and nan["near_ties"] == 0  # a NaN margin never excuses a flip


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_verdicts_follow_the_fp64_margins(dtype, shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["branches"]
    feeds = actor.random_feeds(256, seed=9)
    np.savez(tmp_path / "obs.npz", **feeds)
    job = run_job(tmp_path / "job", "precision", f"model.checkpoint={shaped_files['branches'][0]}", "obs=file", f"obs.path={tmp_path / 'obs.npz'}",
                  f"dtype={dtype}")
    m, ref = job.record["metrics"], actor.forward(obs_list(actor, feeds), feeds["action_masks"])
    got = np.load(job.workdir / "discrete_actions.npy")
    flips = got != ref[DISCRETE]
    x = actor.features(obs_list(actor, feeds), None)[0]
    bound = job.record["details"]["limits"]["margin"] * best_scale(np.concatenate(actor.logits(x, feeds["action_masks"]), axis=1), actor.spec.branches)
    assert m["discrete_actions/vs_fp64/flips"] == flips.sum()
    assert m["discrete_actions/vs_fp64/flips_beyond_margin"] == np.sum(flips & (ref["margins"] > bound))
    assert m["layer/logits/rel_rmse"] > 1e-4  # really computed in half precision
    assert (job.record["status"] == "failed") == bool(job.record["reason"])
    if m["discrete_actions/vs_fp64/flips_beyond_margin"]:
        assert "actions differ where the reference's best masked logit leads" in job.record["reason"]


# --- fingerprint


@pytest.mark.parametrize("name", ["hybrid", "memory_discrete", "memory_hybrid_sac"])
def test_fingerprint_hashes_every_output_and_matches_cpu_fp32(name, shaped_files, tmp_path):
    job = run_job(tmp_path, "fingerprint", f"model.checkpoint={shaped_files[name][0]}", "mode.steps=12", "mode.envs=3")
    r, spec = job.record, SHAPES[name]
    assert r["status"] == "passed", r["reason"]
    names = [n for n, on in (("actions", spec.continuous), ("discrete_actions", spec.branches), ("memories", spec.memory)) if on]
    arrays = {n: np.load(tmp_path / f"{n}.npy") for n in names}
    assert arrays["discrete_actions"].dtype == np.int64 and arrays["discrete_actions"].shape == (12, 3, len(spec.branches))
    for n in names:
        assert r["tags"][f"{n}_fingerprint"] == hashlib.sha256(arrays[n].tobytes()).hexdigest()
        assert r["metrics"][f"{n}/matches_cpu_fp32"] == 1.0
    assert r["details"]["fingerprint"] == hashlib.sha256(b"".join(arrays[n].tobytes() for n in names)).hexdigest() == r["details"]["cpu_fp32_fingerprint"]
    assert r["tags"]["fingerprint"] == r["details"]["fingerprint"]  # every point's fingerprint is the mode's


def test_fingerprint_carries_the_memory_through_the_sequence(shaped_actors, shaped_files, tmp_path):
    job = sequence_job("fingerprint", "memory_hybrid_sac", shaped_actors["memory_hybrid_sac"], shaped_files, tmp_path, steps=5, rows=4, seed=60)
    assert job.record["metrics"]["steps"] == 5 and job.record["metrics"]["memories/matches_cpu_fp32"] == 1.0


def test_fingerprint_bf16_names_the_diverging_output_and_fails_when_required(shaped_files, tmp_path):
    args = (f"model.checkpoint={shaped_files['memory_discrete'][0]}", "mode.steps=8", "mode.envs=2", "dtype=bf16")
    job = run_job(tmp_path / "a", "fingerprint", *args)
    m = job.record["metrics"]
    assert job.record["status"] == "passed" and m["matches_cpu_fp32"] == 0.0 and m["memories/matches_cpu_fp32"] == 0.0
    assert job.record["details"]["first_divergence"]["output"] == "memories"
    failed = run_job(tmp_path / "b", "fingerprint", *args, "mode.require_match=[bf16]")
    assert failed.record["status"] == "failed" and "quantized fingerprint differs" in failed.record["reason"]


def test_fingerprint_on_onnxruntime_carries_the_memory_and_matches_torch_quantized(shaped_files, tmp_path):
    args = (f"model.checkpoint={shaped_files['memory_hybrid_sac'][0]}", "mode.steps=6", "mode.envs=3")
    onnx = run_job(tmp_path / "onnx", "fingerprint", *args, "backend=onnxruntime")
    torch_ = run_job(tmp_path / "torch", "fingerprint", *args)
    assert onnx.record["status"] == "passed", onnx.record["reason"]
    assert onnx.record["metrics"]["quantized_matches_cpu_fp32"] == 1.0 and onnx.record["metrics"]["max_abs_vs_cpu_fp32"] < ATOL
    np.testing.assert_allclose(np.load(tmp_path / "onnx" / "memories.npy"), np.load(tmp_path / "torch" / "memories.npy"), atol=ATOL, rtol=0)
    assert torch_.record["details"]["quantized_fingerprint"] == onnx.record["details"]["quantized_fingerprint"]


# --- stats


@pytest.mark.parametrize("name", NAMES)
def test_stats_closed_loop_on_every_shape_carries_the_memory(name, shaped_actors, shaped_files, tmp_path):
    actor, spec = shaped_actors[name], SHAPES[name]
    job = run_job(tmp_path, "stats", f"model.checkpoint={shaped_files[name][0]}", "mode.steps=10", "mode.envs=3")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    assert m.get("drift_max", 0.0) == 0.0 and m.get("discrete_agreement", 1.0) == 1.0 and m.get("memory_drift_max", 0.0) == 0.0
    # what the policy saw, replayed through the float64 reference with the memory carried, gives what the rollout recorded
    obs = np.load(tmp_path / "observations.npy")
    bounds = np.cumsum(spec.inputs)[:-1]
    seq = {f"obs_{i}": part for i, part in enumerate(np.split(obs, bounds, axis=-1))}
    assert_outputs_match(tmp_path, carried(actor, seq))
    if spec.branches:
        rows = table(tmp_path / "discrete_histogram.csv")
        for b, size in enumerate(spec.branches):
            shares = [float(r["share"]) for r in rows if int(r["branch"]) == b]
            assert len(shares) == size and sum(shares) == pytest.approx(1.0)
            assert shares == [m[f"discrete.branch_{b}.action_{k}_share"] for k in range(size)]


def test_stats_takes_action_masks_from_the_obs_file(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["hybrid"]
    feeds = actor.random_feeds(4, seed=3, masked=False)
    args = (f"model.checkpoint={shaped_files['hybrid'][0]}", "obs=file", "mode.steps=20")
    np.savez(tmp_path / "free.npz", **feeds)
    free = run_job(tmp_path / "free", "stats", *args, f"obs.path={tmp_path / 'free.npz'}").record["metrics"]
    taken = max(range(3), key=lambda k: free[f"discrete.branch_0.action_{k}_share"])
    masks = np.ones((4, 3), np.float32)
    masks[:, taken] = 0.0
    np.savez(tmp_path / "masked.npz", **feeds, action_masks=masks)
    job = run_job(tmp_path / "masked", "stats", *args, f"obs.path={tmp_path / 'masked.npz'}")
    assert job.record["status"] == "passed", job.record["reason"]
    assert free[f"discrete.branch_0.action_{taken}_share"] > 0 and job.record["metrics"][f"discrete.branch_0.action_{taken}_share"] == 0.0


def test_stats_replays_an_npz_trajectory_with_the_memory_carried(shaped_actors, shaped_files, tmp_path):
    actor = shaped_actors["memory_discrete"]
    seq = sequence(actor, steps=7, rows=1, seed=80)
    np.savez(tmp_path / "traj.npz", **{k: v[:, 0] for k, v in seq.items()})  # [T, d]: one environment
    job = run_job(tmp_path / "job", "stats", f"model.checkpoint={shaped_files['memory_discrete'][0]}", "mode.source=replay",
                  f"mode.trajectory={tmp_path / 'traj.npz'}")
    assert job.record["status"] == "passed", job.record["reason"]
    assert job.record["metrics"]["steps"] == 7
    assert_outputs_match(job.workdir, carried(actor, seq))


def test_stats_drift_fail_catches_discrete_drift_in_bf16(shaped_files, tmp_path):
    job = run_job(tmp_path, "stats", f"model.checkpoint={shaped_files['memory_discrete'][0]}", "mode.steps=30", "dtype=bf16", "mode.drift_fail=0")
    m = job.record["metrics"]
    assert m["memory_drift_max"] > 0
    assert (job.record["status"] == "failed") == (m["discrete_drift_max"] > 0)


@pytest.mark.parametrize("mode, args, message", [
    ("stats", ("mode.source=replay", "mode.trajectory={tmp}/bad.npz"), "missing obs_1"),
    ("fingerprint", ("obs=file", "obs.path={tmp}/five.npz", "mode.envs=2"), "mode.envs=2 does not divide the 5"),
])
def test_shape_errors_are_one_line(mode, args, message, shaped_files, tmp_path):
    np.savez(tmp_path / "bad.npz", obs_0=np.zeros((3, 7), np.float32))
    np.savez(tmp_path / "five.npz", obs_0=np.zeros((5, 7), np.float32), obs_1=np.zeros((5, 2), np.float32))
    job = run_job(tmp_path / "job", mode, f"model.checkpoint={shaped_files['hybrid'][0]}", *(a.format(tmp=tmp_path) for a in args))
    assert job.record["status"] == "error" and message in job.record["reason"] and "\n" not in job.record["reason"]


# --- ML-Agents' own files


@pytest.fixture(scope="module")
def pyramids_npz(tmp_path_factory):
    ref = PYRAMIDS / "reference"
    path = tmp_path_factory.mktemp("pyramids") / "reference.npz"
    np.savez(path, **{f"obs_{i}": np.load(ref / f"obs_{i}.npy") for i in range(4)}, action_masks=np.load(ref / "action_masks.npy"))
    return path


@needs_shared
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_pyramids_precision_on_mlagents_references(dtype, pyramids_npz, tmp_path):
    job = run_job(tmp_path, "precision", f"model.checkpoint={PYRAMIDS_PT}", "obs=file", f"obs.path={pyramids_npz}", f"dtype={dtype}")
    m, ref = job.record["metrics"], PYRAMIDS / "reference"
    expected = np.load(ref / "discrete_actions_torch.npy")
    got = np.load(tmp_path / "discrete_actions.npy")
    assert m["discrete_actions/vs_fp64/margin_min"] == pytest.approx(0.00276, abs=2e-5)  # row 47, as the fixture's README says
    flips = got != expected
    outputs = np.load(ref / "torch_outputs.npz")
    mlagents_margin = discrete_margins(outputs["masked_logits"], (5,))[0]
    scale = best_scale(outputs["masked_logits"], (5,))
    assert m["discrete_actions/vs_fp64/flips_beyond_margin"] == np.sum(flips & (mlagents_margin > job.record["details"]["limits"]["margin"] * scale))
    if dtype == "fp32":
        assert job.record["status"] == "passed", job.record["reason"]
        np.testing.assert_array_equal(got, expected)
        assert m["discrete_actions/vs_fp64/agreement"] == 1.0 and m["layer/logits/rel_rmse"] < 1e-6  # rows of ±1e4 give logits of 2e4
    else:
        assert m["layer/logits/rel_rmse"] > 1e-4
        assert (job.record["status"] == "passed") == (m["discrete_actions/vs_fp64/flips_beyond_margin"] == 0 and not job.record["reason"])


@needs_shared
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_huggy_lstm_precision_over_the_mlagents_sequence(dtype, tmp_path):
    ref = HUGGY_LSTM / "reference"
    job = run_job(tmp_path, "precision", f"model.checkpoint={HUGGY_LSTM_PT}", "obs=file", f"obs.path={ref / 'obs_seq.npy'}", f"dtype={dtype}")
    m = job.record["metrics"]
    assert m["steps"] == 32 and len(table(tmp_path / "step_errors.csv")) == 32
    assert "layer/lstm/rel_rmse" in m and "layer/recurrent_out/rel_rmse" in m
    if dtype == "fp32":
        assert job.record["status"] == "passed", job.record["reason"]
        np.testing.assert_allclose(np.load(tmp_path / "actions.npy"), np.load(ref / "seq_actions.npy"), atol=3e-6, rtol=0)
        np.testing.assert_allclose(np.load(tmp_path / "memories.npy"), np.load(ref / "seq_memories.npy").reshape(32, 8, 128), atol=1e-5, rtol=0)
        assert m["memories/vs_fp64/max_abs"] < 1e-5
    else:
        assert 1e-4 < m["memories/vs_fp64/max_abs"] < 0.5 and 1e-4 < m["layer/recurrent_out/rel_rmse"]
        layer_limit = job.record["details"]["layer_threshold"]
        assert (job.record["details"]["first_failing_layer"] is None) == all(v <= layer_limit for k, v in m.items() if k.startswith("layer/") and k.endswith("/rel_rmse"))


@needs_shared
@pytest.mark.parametrize("mode", ["fingerprint", "stats"])
@pytest.mark.parametrize("model", ["pyramids", "huggy_lstm"])
def test_fingerprint_and_stats_on_mlagents_files(mode, model, tmp_path):
    pt = PYRAMIDS_PT if model == "pyramids" else HUGGY_LSTM_PT
    job = run_job(tmp_path, mode, f"model.checkpoint={pt}", "mode.steps=8", "mode.envs=4")
    m = job.record["metrics"]
    assert job.record["status"] == "passed", job.record["reason"]
    if mode == "fingerprint":
        assert m["matches_cpu_fp32"] == 1.0
        assert np.load(tmp_path / ("discrete_actions.npy" if model == "pyramids" else "memories.npy")).shape[:2] == (8, 4)
    elif model == "pyramids":
        assert sum(m[f"discrete.branch_0.action_{k}_share"] for k in range(5)) == pytest.approx(1.0)
    else:
        assert m["memory_drift_max"] == 0.0 and np.load(tmp_path / "memories.npy").shape == (8, 4, 128)
