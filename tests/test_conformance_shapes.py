"""Conformance on ML-Agents' other policy shapes (../shared/fixtures/mlagents): Pyramids (four observation inputs, one
discrete branch of 5, action masks) and Huggy with an LSTM memory (single steps and a 32-step x 8-agent sequence)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import HUGGY_LSTM, HUGGY_LSTM_ONNX, HUGGY_LSTM_PT, PYRAMIDS, PYRAMIDS_ONNX, PYRAMIDS_PT, needs_shared
from test_conformance import CROSS_CPU_ATOL

from huggy_exp import mlagents
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, DISCRETE, OnnxRunner, Recurrent, TorchRunner

pytestmark = needs_shared

# Memories hold the LSTM cell state too (|c| up to 8.8 here, an fp32 ulp of 9.5e-7 there), carried over 32 steps:
# ML-Agents' own torch and onnxruntime runs of these files differ by 5.72e-6 on seq_memories (manifest.json).
MEMORY_ATOL = 1e-5


def load(path):
    return mlagents.load_checkpoint(path) if path.suffix == ".pt" else mlagents.load_onnx(path)


def cpu32(model, batch_size: int = 64) -> TorchRunner:
    return TorchRunner(model.weights, resolve("cpu", "fp32"), batch_size)


@pytest.fixture(scope="module")
def pyramids_feeds() -> dict[str, np.ndarray]:
    ref = PYRAMIDS / "reference"
    return {**{f"obs_{i}": np.load(ref / f"obs_{i}.npy") for i in range(4)}, "action_masks": np.load(ref / "action_masks.npy")}


@pytest.mark.parametrize("path", [PYRAMIDS_PT, PYRAMIDS_ONNX], ids=["pt", "onnx"])
def test_pyramids_loads_with_four_inputs_and_one_branch_of_five(path):
    w = load(path).weights
    assert w.obs_sizes == (56, 56, 56, 4) and w.branch_sizes == (5,) and w.act_dim == 0 and w.lstm is None
    assert all(i.normalizer is None for i in w.inputs) and (w.num_layers, w.hidden_units) == (2, 512)


@pytest.mark.parametrize("path", [PYRAMIDS_PT, PYRAMIDS_ONNX], ids=["pt", "onnx"])
def test_pyramids_deterministic_discrete_actions_equal_mlagents_exactly(path, pyramids_feeds):
    expected = np.load(PYRAMIDS / "reference" / "discrete_actions_torch.npy")
    for batch in (64, 5, 1):
        got = cpu32(load(path), batch).infer(pyramids_feeds)[DISCRETE]
        assert got.dtype == np.int64 and got.shape == (64, 1)
        np.testing.assert_array_equal(got, expected)


def test_pyramids_masked_probabilities_match_mlagents(pyramids_feeds):
    policy = cpu32(load(PYRAMIDS_PT)).policy
    obs = [torch.from_numpy(pyramids_feeds[f"obs_{i}"]) for i in range(4)]
    x, _ = policy.encode(obs)
    probs = policy.discrete.probs(x, torch.from_numpy(pyramids_feeds["action_masks"]))[0].numpy()
    expected = np.load(PYRAMIDS / "reference" / "torch_outputs.npz")["probs"]
    np.testing.assert_allclose(probs, expected, atol=CROSS_CPU_ATOL, rtol=0)
    assert (probs[pyramids_feeds["action_masks"] == 0] == 0).all()


def test_pyramids_onnx_runner_matches_mlagents_onnxruntime_outputs(pyramids_feeds):
    expected = np.load(PYRAMIDS / "reference" / "onnxruntime_outputs.npz")
    got = OnnxRunner(PYRAMIDS_ONNX).infer(pyramids_feeds)
    for name in ("deterministic_discrete_actions", "discrete_action_output_shape", "version_number", "memory_size"):
        np.testing.assert_array_equal(got[name], expected[name])


@pytest.mark.parametrize("path", [HUGGY_LSTM_PT, HUGGY_LSTM_ONNX], ids=["pt", "onnx"])
def test_huggy_lstm_single_step_actions_and_memory_match_mlagents(path):
    ref = HUGGY_LSTM / "reference"
    out = cpu32(load(path)).infer({"obs_0": np.load(ref / "obs.npy")})
    torch_out = np.load(ref / "torch_outputs.npz")
    np.testing.assert_allclose(out[ACTIONS], np.load(ref / "actions_torch.npy"), atol=CROSS_CPU_ATOL, rtol=0)
    assert out["recurrent_out"].shape == (64, 1, 128)
    np.testing.assert_allclose(out["recurrent_out"], torch_out["recurrent_out"], atol=MEMORY_ATOL, rtol=0)


@pytest.mark.parametrize("path", [HUGGY_LSTM_PT, HUGGY_LSTM_ONNX], ids=["pt", "onnx"])
def test_huggy_lstm_sequence_with_carried_memory_matches_mlagents(path):
    ref = HUGGY_LSTM / "reference"
    seq = Recurrent(cpu32(load(path)).infer, 128).sequence({"obs_0": np.load(ref / "obs_seq.npy")})
    assert seq[ACTIONS].shape == (32, 8, 21) and seq["recurrent_out"].shape == (32, 8, 1, 128)
    np.testing.assert_allclose(seq[ACTIONS], np.load(ref / "seq_actions.npy"), atol=CROSS_CPU_ATOL, rtol=0)
    np.testing.assert_allclose(seq["recurrent_out"][:, :, 0], np.load(ref / "seq_memories.npy"), atol=MEMORY_ATOL, rtol=0)


def mlagents_lstm_step(state: dict, obs: np.ndarray, memories: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """ML-Agents 1.1.0's SimpleActor with memory, op for op: Normalizer, LinearEncoder + Swish, LSTM (batch_first, h/c split
    of [1, N, m] memories), mu, clamp / 3."""
    p = "network_body.observation_encoder.processors.0.normalizer."
    x = torch.from_numpy(obs)
    x = torch.clamp((x - state[p + "running_mean"]) / torch.sqrt(state[p + "running_variance"] / state[p + "normalization_steps"]), -5, 5)
    for i in (0, 2, 4):
        x = torch.nn.functional.linear(x, state[f"network_body._body_endoder.seq_layers.{i}.weight"],
                                       state[f"network_body._body_endoder.seq_layers.{i}.bias"])
        x = torch.mul(x, torch.sigmoid(x))
    lstm = torch.nn.LSTM(512, 64, batch_first=True)
    lstm.load_state_dict({k[len("network_body.lstm.lstm."):]: v for k, v in state.items() if k.startswith("network_body.lstm.lstm.")})
    h0, c0 = torch.split(memories, 64, dim=-1)
    with torch.no_grad():
        out, hidden = lstm(x.reshape(-1, 1, 512), (h0.contiguous(), c0.contiguous()))
    x = out.reshape(-1, 64)
    mu = torch.nn.functional.linear(x, state["action_model._continuous_distribution.mu.weight"],
                                    state["action_model._continuous_distribution.mu.bias"])
    return (torch.clamp(mu, -3, 3) / 3).numpy(), torch.cat(hidden, dim=-1)


def test_huggy_lstm_sequence_is_bit_identical_to_mlagents_ops_on_this_machine():
    state = torch.load(HUGGY_LSTM_PT, map_location="cpu", weights_only=True)["Policy"]
    obs_seq = np.load(HUGGY_LSTM / "reference" / "obs_seq.npy")
    memories, actions, mems = torch.zeros(1, 8, 128), [], []
    for obs in obs_seq:
        a, memories = mlagents_lstm_step(state, obs, memories)
        actions.append(a)
        mems.append(memories[0].numpy())
    seq = Recurrent(cpu32(load(HUGGY_LSTM_PT)).infer, 128).sequence({"obs_0": obs_seq})
    np.testing.assert_array_equal(seq[ACTIONS], np.stack(actions))
    np.testing.assert_array_equal(seq["recurrent_out"][:, :, 0], np.stack(mems))


def test_huggy_lstm_onnx_weights_equal_the_pt_weights_after_gate_reordering():
    a, b = load(HUGGY_LSTM_PT).weights.lstm, load(HUGGY_LSTM_ONNX).weights.lstm
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_huggy_lstm_onnxruntime_sequence_matches_mlagents_onnxruntime_sequence():
    ref = HUGGY_LSTM / "reference"
    seq = Recurrent(OnnxRunner(HUGGY_LSTM / "Huggy" / "Huggy-2000049.onnx").infer, 128).sequence({"obs_0": np.load(ref / "obs_seq.npy")})
    np.testing.assert_allclose(seq[ACTIONS], np.load(ref / "seq_actions_onnxruntime.npy"), atol=CROSS_CPU_ATOL, rtol=0)
    np.testing.assert_allclose(seq["recurrent_out"][:, :, 0], np.load(ref / "seq_memories_onnxruntime.npy"), atol=MEMORY_ATOL, rtol=0)
