"""huggy_exp.mlagents: .pt and .onnx loaders, results folders, the embedded default."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import (
    BODY,
    LOG_SIGMA,
    MU,
    NORM_PREFIXES,
    PUBLIC_RUN_LOGS,
    RESULTS_STEPS,
    SPECS,
    assert_same_weights,
    make_actor,
    needs_shared,
    save_mlagents_checkpoint,
)

from huggy_exp import mlagents
from huggy_exp.errors import UserError
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, OBS, OnnxRunner, TorchRunner

# --- .pt loader


@pytest.mark.parametrize("name", sorted(SPECS))
def test_pt_loader_infers_sizes_from_tensor_shapes(name, checkpoint_files, actors):
    spec, actor = SPECS[name], actors[name]
    loaded = mlagents.load_checkpoint(checkpoint_files[name])
    w = loaded.weights
    assert (w.obs_dim, w.act_dim, w.hidden_units, w.num_layers) == (spec.obs, spec.act, spec.hidden, spec.layers)
    assert loaded.source == "pt" and loaded.step == 1000 and not loaded.synthetic
    assert loaded.sha256 == hashlib.sha256(checkpoint_files[name].read_bytes()).hexdigest()
    for (w_got, b_got), (w_exp, b_exp) in zip(w.layers, actor.layers):
        np.testing.assert_array_equal(w_got, w_exp)
        np.testing.assert_array_equal(b_got, b_exp)
    np.testing.assert_array_equal(w.mu[0], actor.mu_w)
    np.testing.assert_array_equal(w.log_sigma, actor.log_sigma)
    expected_params = sum(a.size + b.size for a, b in actor.layers) + actor.mu_w.size + actor.mu_b.size
    assert w.parameter_count == expected_params


def test_pt_with_normalizer_reads_its_statistics(huggy_pt, huggy_actor):
    n = mlagents.load_checkpoint(huggy_pt).weights.normalizer
    assert n is not None and n.steps == huggy_actor.steps
    np.testing.assert_array_equal(n.running_mean, huggy_actor.mean)
    np.testing.assert_array_equal(n.running_variance, huggy_actor.var)
    assert n.running_mean.dtype == np.float32 and n.running_variance.dtype == np.float32


def test_pt_without_normalizer_has_none(checkpoint_files):
    assert mlagents.load_checkpoint(checkpoint_files["3dball"]).weights.normalizer is None


@pytest.mark.parametrize("prefix", NORM_PREFIXES)
def test_checkpoint_with_only_one_normalizer_spelling_loads(prefix, huggy_actor, tmp_path):
    path = huggy_actor.save(tmp_path / "one.pt", state=huggy_actor.state_dict(prefixes=(prefix,)))
    n = mlagents.load_checkpoint(path).weights.normalizer
    assert n is not None
    np.testing.assert_array_equal(n.running_variance, huggy_actor.var)
    assert n.steps == huggy_actor.steps


def test_disagreeing_normalizer_spellings_are_a_user_error_naming_both(huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    state[NORM_PREFIXES[1] + "running_mean"] = state[NORM_PREFIXES[1] + "running_mean"] + 1.0
    path = huggy_actor.save(tmp_path / "disagree.pt", state=state)
    with pytest.raises(UserError) as err:
        mlagents.load_checkpoint(path)
    assert NORM_PREFIXES[0] in str(err.value) and NORM_PREFIXES[1] in str(err.value)


@pytest.mark.parametrize(
    "key",
    [f"{BODY}2.weight", MU + "bias", LOG_SIGMA, NORM_PREFIXES[0] + "running_variance"],
)
def test_missing_key_is_a_user_error_naming_it(key, huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    del state[key]
    path = huggy_actor.save(tmp_path / "missing.pt", state=state)
    with pytest.raises(UserError, match="missing") as err:
        mlagents.load_checkpoint(path)
    assert key in str(err.value)


def test_unexpected_key_is_a_user_error_naming_it(huggy_actor, tmp_path):
    state = {**huggy_actor.state_dict(), "network_body.linear_encoder.extra.weight": torch.zeros(3)}
    path = huggy_actor.save(tmp_path / "extra.pt", state=state)
    with pytest.raises(UserError, match="unexpected") as err:
        mlagents.load_checkpoint(path)
    assert "network_body.linear_encoder.extra.weight" in str(err.value)


@pytest.mark.parametrize(
    "key, shape",
    [
        (f"{BODY}2.weight", (32, 31)),  # second Linear no longer chains from the first (32 wide)
        (MU + "weight", (21, 31)),
        (NORM_PREFIXES[0] + "running_mean", (58,)),
    ],
)
def test_shape_mismatch_is_a_user_error_naming_the_key(key, shape, huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    state[key] = torch.zeros(shape)
    if key.startswith(NORM_PREFIXES[0]):  # keep the two spellings in agreement so the shape check is what fires
        state[key.replace(NORM_PREFIXES[0], NORM_PREFIXES[1])] = state[key]
    path = huggy_actor.save(tmp_path / "shape.pt", state=state)
    with pytest.raises(UserError, match="shape") as err:
        mlagents.load_checkpoint(path)
    assert key in str(err.value)


def test_a_discrete_branch_beside_mu_loads_as_a_hybrid_policy(huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    state["discrete_act_size_vector"] = torch.tensor([[3.0]])
    state["action_model._discrete_distribution.branches.0.weight"] = torch.zeros(3, 32)
    state["action_model._discrete_distribution.branches.0.bias"] = torch.zeros(3)
    w = mlagents.load_checkpoint(huggy_actor.save(tmp_path / "hybrid.pt", state=state)).weights
    assert (w.act_dim, w.branch_sizes) == (21, (3,))


def test_declared_branch_sizes_must_match_the_branches(huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    state["discrete_act_size_vector"] = torch.tensor([[4.0]])
    state["action_model._discrete_distribution.branches.0.weight"] = torch.zeros(3, 32)
    state["action_model._discrete_distribution.branches.0.bias"] = torch.zeros(3)
    with pytest.raises(UserError, match=r"discrete_act_size_vector says branches \[4.0\] but the weights have \[3\]"):
        mlagents.load_checkpoint(huggy_actor.save(tmp_path / "declared.pt", state=state))


def test_declared_action_count_must_match_mu_rows(huggy_actor, tmp_path):
    state = huggy_actor.state_dict()
    state["continuous_act_size_vector"] = torch.tensor([20.0])
    with pytest.raises(UserError, match="continuous_act_size_vector"):
        mlagents.load_checkpoint(huggy_actor.save(tmp_path / "declared.pt", state=state))


def test_checkpoint_without_policy_entry_names_its_top_level_keys(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"model": {"fc.weight": torch.zeros(2, 2)}, "epoch": 3}, path)
    with pytest.raises(UserError, match="no 'Policy'") as err:
        mlagents.load_checkpoint(path)
    assert "model" in str(err.value) and "epoch" in str(err.value)


# --- .onnx loader


@pytest.mark.parametrize("name", sorted(SPECS))
def test_onnx_written_by_the_package_loads_back_to_the_pt_weights(name, actors, checkpoint_files, tmp_path):
    actor = actors[name]
    path = tmp_path / f"{name}.onnx"
    mlagents.write_onnx(actor.policy_weights(), path)
    onnx_w = mlagents.load_onnx(path).weights
    pt_w = mlagents.load_checkpoint(checkpoint_files[name]).weights
    assert (onnx_w.obs_dim, onnx_w.act_dim, onnx_w.num_layers) == (pt_w.obs_dim, pt_w.act_dim, pt_w.num_layers)
    assert_same_weights(onnx_w, pt_w)


def test_onnx_parse_failure_is_a_user_error(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x08\x07garbage that is not a protobuf model" * 3)
    with pytest.raises(UserError, match="junk.onnx"):
        mlagents.load_onnx(path)


# --- results folders


def test_results_folder_lists_steps_rewards_sizes_hashes_and_presence(results_folder):
    rows = mlagents.list_checkpoints(results_folder)
    assert [(r["behavior"], r["step"]) for r in rows] == [("Huggy", s) for s in sorted(RESULTS_STEPS)]
    by_step = {r["step"]: r for r in rows}
    for step, reward in RESULTS_STEPS.items():
        assert by_step[step]["reward"] == reward
    assert by_step[100]["present"] and by_step[200]["present"] and not by_step[300]["present"]
    assert by_step[300]["files"] == {}
    assert by_step[300]["final"] and not by_step[100]["final"]
    for step in (100, 200):
        for kind in ("pt", "onnx"):
            entry = by_step[step]["files"][kind]
            f = results_folder / "Huggy" / f"Huggy-{step}.{kind}"
            assert entry["path"] == str(f)
            assert entry["bytes"] == f.stat().st_size > 0
            assert entry["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()


def test_latest_checkpoint_is_the_newest_present_pt(results_folder):
    assert mlagents.latest_checkpoint(results_folder) == results_folder / "Huggy" / "Huggy-200.pt"
    assert mlagents.latest_checkpoint(results_folder, step=100) == results_folder / "Huggy" / "Huggy-100.pt"
    with pytest.raises(UserError, match="step 300"):
        mlagents.latest_checkpoint(results_folder, step=300)


def test_missing_results_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="not found"):
        mlagents.list_checkpoints(tmp_path / "nope")


def test_corrupt_training_status_is_a_user_error(tmp_path):
    (tmp_path / "run_logs").mkdir()
    (tmp_path / "run_logs" / "training_status.json").write_text("{not json")
    with pytest.raises(UserError, match="training_status.json"):
        mlagents.list_checkpoints(tmp_path)


@needs_shared
@pytest.mark.parametrize("layout", ["results folder", "bare run logs"])
def test_public_training_status_is_read_with_rewards_and_missing_files(layout, tmp_path):
    if layout == "bare run logs":  # the shared folder as it is: training_status.json at the top
        root = PUBLIC_RUN_LOGS
    else:  # as mlagents-learn leaves it: results/<run>/run_logs/training_status.json, weights gone
        root = tmp_path / "Huggy2"
        (root / "run_logs").mkdir(parents=True)
        shutil.copy(PUBLIC_RUN_LOGS / "training_status.json", root / "run_logs" / "training_status.json")
        shutil.copy(PUBLIC_RUN_LOGS / "configuration.yaml", root / "configuration.yaml")
    rows = mlagents.list_checkpoints(root)
    steps = [r["step"] for r in rows]
    assert len(rows) == 11 and steps == sorted(steps)
    assert steps[0] == 199_828 and steps[-1] == 2_000_045
    assert all(not r["present"] and r["files"] == {} for r in rows)
    nulls = [r["step"] for r in rows if r["reward"] is None]
    assert nulls == [1_399_974]
    assert rows[0]["reward"] == pytest.approx(3.735918252194514)
    assert [r["step"] for r in rows if r["final"]] == [2_000_045]
    assert rows[0]["logged_files"] == ["results/Huggy2/Huggy/Huggy-199828.onnx", "results/Huggy2/Huggy/Huggy-199828.pt"]
    with pytest.raises(UserError, match="no checkpoint files"):
        mlagents.latest_checkpoint(root)


# --- the embedded default


def _weights_digest(w: mlagents.PolicyWeights) -> str:
    h = hashlib.sha256()
    arrays = [x for layer in w.layers for x in layer] + list(w.mu) + [w.log_sigma]
    arrays += [w.normalizer.running_mean, w.normalizer.running_variance]
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    h.update(str(w.normalizer.steps).encode())
    return h.hexdigest()


# sha256 of default_weights() per DEFAULT_VERSION. The cache is keyed by the version, so changing the weights
# without bumping DEFAULT_VERSION silently leaves old caches serving the old weights: bump it, then add a line.
DEFAULT_DIGESTS = {"v2": "37cb73a37facb4d0e302aab2f72e236df86c51c4d79fda1a338862a2c3c84e1f"}


def test_embedded_default_is_deterministic_bytes():
    a, b = mlagents.default_weights(), mlagents.default_weights()
    assert _weights_digest(a) == _weights_digest(b)


def test_embedded_default_weights_change_only_with_a_new_cache_version():
    digest = _weights_digest(mlagents.default_weights())
    assert DEFAULT_DIGESTS.get(mlagents.DEFAULT_VERSION) == digest, (
        f"default_weights() changed (sha256 {digest}) but DEFAULT_VERSION is still {mlagents.DEFAULT_VERSION!r}: "
        "existing caches would keep serving the old weights"
    )


def test_embedded_default_on_disk_equals_the_generator(default_model, huggy_exp_cache):
    assert default_model.synthetic and default_model.source == "embedded"
    assert str(default_model.path).startswith(str(huggy_exp_cache))
    assert _weights_digest(default_model.weights) == _weights_digest(mlagents.default_weights())


def test_embedded_default_has_huggy_dimensions_and_normalizer_magnitudes(default_model):
    w = default_model.weights
    assert w.parameter_count == 566_805
    assert (w.obs_dim, w.act_dim, w.num_layers, w.hidden_units) == (59, 21, 3, 512)
    n = w.normalizer
    assert 1.5e6 < n.steps < 2.5e6
    assert n.running_variance.max() > 1e8
    assert n.fp16_overflow_dims() > 0
    with np.errstate(over="ignore"):
        assert np.isinf(n.running_variance.astype(np.float16)).sum() == n.fp16_overflow_dims()


def test_embedded_default_onnx_passes_checker_and_runs_in_onnxruntime(default_model):
    import onnx

    model = onnx.load(str(default_model.onnx_path))
    onnx.checker.check_model(model, full_check=True)
    obs = np.random.default_rng(0).standard_normal((32, 59)).astype(np.float32) * 10
    ort = OnnxRunner(default_model.onnx_path)
    first, second = ort.infer({OBS: obs})[ACTIONS], ort.infer({OBS: obs})[ACTIONS]
    np.testing.assert_array_equal(first, second)
    torch_actions = TorchRunner(default_model.weights, resolve("cpu", "fp32")).infer({OBS: obs})[ACTIONS]
    np.testing.assert_allclose(first, torch_actions, atol=1e-5, rtol=0)
    assert np.abs(first).max() > 0.1  # not a degenerate all-zero policy


def test_embedded_default_onnx_graph_has_mlagents_signature(default_model):
    import onnx

    model = onnx.load(str(default_model.onnx_path))
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 9)]
    assert model.ir_version == 4
    assert [i.name for i in model.graph.input] == ["obs_0"]
    assert [o.name for o in model.graph.output] == [
        "version_number",
        "memory_size",
        "continuous_actions",
        "continuous_action_output_shape",
        "deterministic_continuous_actions",
    ]
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims[1] == 59


def test_embedded_default_results_folder_has_mlagents_layout(default_model):
    root = mlagents.default_results_dir()
    assert (root / "Huggy" / f"Huggy-{mlagents.DEFAULT_STEP}.pt").is_file()
    assert (root / "Huggy.onnx").is_file()
    status = json.loads((root / "run_logs" / "training_status.json").read_text())
    assert status["Huggy"]["final_checkpoint"]["steps"] == mlagents.DEFAULT_STEP
    rows = mlagents.list_checkpoints(root)
    assert [(r["step"], r["present"]) for r in rows] == [(mlagents.DEFAULT_STEP, True)]


def test_bare_state_dict_is_accepted_as_a_policy(tmp_path):
    actor = make_actor(SPECS["3dball"])
    path = tmp_path / "bare.pt"
    torch.save(actor.state_dict(), path)
    assert mlagents.load_checkpoint(path).weights.act_dim == 2


def test_checkpoint_writer_round_trips_through_the_loader(huggy_actor, tmp_path):
    w = mlagents.load_checkpoint(huggy_actor.save(tmp_path / "a.pt")).weights
    path = tmp_path / "b.pt"
    mlagents.save_checkpoint(w, path, 5)
    again = mlagents.load_checkpoint(path)
    assert again.step == 5 and _weights_digest(again.weights) == _weights_digest(w)
    # and its layout is what this suite's own writer produces
    assert set(torch.load(path, weights_only=True)["Policy"]) == set(huggy_actor.state_dict())


def test_global_step_is_read_from_mlagents_layout(huggy_actor, tmp_path):
    path = save_mlagents_checkpoint(tmp_path / "s.pt", huggy_actor.state_dict(), 2_000_049)
    assert mlagents.load_checkpoint(path).step == 2_000_049
