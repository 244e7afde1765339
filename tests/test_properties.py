"""Property tests (hypothesis): whatever the loaders and metrics are handed, they give a result or a UserError, nothing else.

Deterministic (derandomize) and small: each property runs a modest number of examples.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BODY, LOG_SIGMA, Spec, make_actor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from huggy_exp import mlagents, numerics, verify
from huggy_exp.errors import UserError
from huggy_exp.observations import load_observations
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, TorchRunner

SMALL = make_actor(Spec("small", 5, 3, 4, 2, True, 21, steps=1000))
PROPERTY = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

KEYS = [*SMALL.state_dict(), f"{LOG_SIGMA}.weight", f"{LOG_SIGMA}.bias", f"{BODY}1.weight", "network_body.lstm.lstm.weight_ih_l0",
        "action_model._discrete_distribution.branches.0.weight", "extra"]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool, torch.complex64]
SPECIALS = st.sampled_from([0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e30, -1e-30, 3.4e38, 1e300])


@st.composite
def tensors(draw) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 6), max_size=3))
    values = draw(st.lists(st.one_of(st.floats(-1e6, 1e6), SPECIALS), min_size=1, max_size=8))
    flat = np.resize(np.array(values, np.float64), int(np.prod(shape)))
    t = torch.from_numpy(flat.reshape(shape))
    dtype = draw(st.sampled_from(DTYPES))
    if not dtype.is_floating_point and not dtype.is_complex:
        t = torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0).clamp(-100, 100)
    return t.to(dtype)


ODD_VALUES = st.one_of(st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=4), st.none(),
                       st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@st.composite
def state_dicts(draw) -> dict:
    """A valid small actor with random edits, or an arbitrary dict of keys and values."""
    if draw(st.booleans()):
        return draw(st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers()),
                                    st.one_of(tensors(), ODD_VALUES), max_size=12))
    state = SMALL.state_dict()
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(KEYS))
        action = draw(st.sampled_from(["replace", "delete", "poke", "odd"]))
        if action == "delete":
            state.pop(key, None)
        elif action == "replace":
            state[key] = draw(tensors())
        elif action == "odd":
            state[key] = draw(ODD_VALUES)
        elif key in state and isinstance(state[key], torch.Tensor) and state[key].numel():
            t = state[key].clone().double()
            t.view(-1)[draw(st.integers(0, t.numel() - 1))] = draw(SPECIALS)
            state[key] = t.to(state[key].dtype) if state[key].is_floating_point() else t
    return state


def _loaded_weights_are_sane(w: mlagents.PolicyWeights) -> None:
    """What a loader hands on is finite and runnable; a normalizer has variance > 0 and steps >= 1."""
    arrays = [a for layer in (*w.layers, *w.branches) for a in layer] + list(w.mu or ())
    arrays += list(w.log_sigma) if w.conditional_sigma else [w.log_sigma] if w.log_sigma is not None else []
    for n in (i.normalizer for i in w.inputs if i.normalizer is not None):
        arrays += [n.running_mean, n.std]
        if n.running_variance is not None:
            assert (n.running_variance > 0).all() and n.steps >= 1
    assert all(np.isfinite(a).all() for a in arrays)
    feeds = {f"obs_{i}": np.zeros((2, size), np.float32) for i, size in enumerate(w.obs_sizes)}
    out = TorchRunner(w, resolve("cpu", "fp32")).infer(feeds)
    assert out[ACTIONS].shape == (2, w.act_dim) if w.mu is not None else out["deterministic_discrete_actions"].shape == (2, len(w.branches))


@PROPERTY
@given(state_dicts())
def test_any_state_dict_gives_sane_weights_or_a_user_error(state):
    try:
        w = mlagents.weights_from_state_dict(state, "prop")
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    _loaded_weights_are_sane(w)


@settings(PROPERTY, max_examples=25)
@given(state_dicts(), st.one_of(st.none(), st.integers(-5, 2**40), st.floats(allow_nan=True)))
def test_any_checkpoint_file_gives_sane_weights_or_a_user_error(state, step):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.pt"
        torch.save({"Policy": state, "global_step": {"_GlobalSteps__global_step": torch.tensor([step]) if step is not None else "x"}}, path)
        try:
            loaded = mlagents.load_checkpoint(path)
        except UserError:
            return
        _loaded_weights_are_sane(loaded.weights)


PREFIXES = {".pt": [b"", b"PK\x03\x04", b"\x80\x02", b"\x80\x04\x95", b"(dp0\n"],
            ".onnx": [b"", b"\x08\x07\x12\x04test:", b"\x08\x04:\x0c\n\x05\n\x01x\x12\x01y"],
            ".npy": [b"", b"\x93NUMPY\x01\x00", b"\x93NUMPY\x02\x00", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 59), }"],
            ".json": [b"", b"{", b"[", b'{"Huggy": {"checkpoints": ['],
            ".yaml": [b"", b"behaviors:\n  Huggy:\n    ", b"behaviors:\n  Huggy:\n    network_settings:\n      ", b"- "]}


def _load_bytes(suffix: str, data: bytes):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if suffix == ".yaml":
            (root / "configuration.yaml").write_bytes(data)
            return mlagents.read_configuration(root)
        if suffix == ".json":
            (root / "run_logs").mkdir()
            (root / "run_logs" / "training_status.json").write_bytes(data)
            return mlagents.list_checkpoints(root)
        path = root / f"input{suffix}"
        path.write_bytes(data)
        if suffix == ".pt":
            return mlagents.load_checkpoint(path)
        if suffix == ".onnx":
            return mlagents.load_onnx(path)
        return load_observations(str(path), 59)


@pytest.mark.parametrize("suffix", sorted(PREFIXES))
def test_any_bytes_give_a_result_or_a_user_error(suffix):
    @settings(PROPERTY, max_examples=50)
    @given(st.sampled_from(PREFIXES[suffix]), st.binary(max_size=300))
    def check(prefix, data):
        try:
            _load_bytes(suffix, prefix + data)
        except UserError as exc:
            assert "\n" not in str(exc)

    check()


JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10, 2**70), st.floats(allow_nan=True), st.text(max_size=5)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                    max_leaves=12)
ENTRY_KEYS = ["steps", "reward", "file_path", "creation_time", "auxillary_file_paths"]
ENTRIES = st.dictionaries(st.sampled_from(ENTRY_KEYS), JSON, max_size=5)


@PROPERTY
@given(st.one_of(JSON, st.dictionaries(st.sampled_from(["Huggy", "metadata", "Walker"]),
                                       st.one_of(JSON, st.fixed_dictionaries({"checkpoints": st.lists(ENTRIES, max_size=3)},
                                                                             optional={"final_checkpoint": st.one_of(ENTRIES, JSON)})),
                                       max_size=3)))
def test_any_training_status_gives_rows_or_a_user_error(doc):
    try:
        rows = _load_bytes(".json", json.dumps(doc).encode())
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    for r in rows:
        assert isinstance(r["step"], int) and (r["reward"] is None or isinstance(r["reward"], (int, float)))


@PROPERTY
@given(st.lists(st.integers(0, 2**40), max_size=3), st.sampled_from(["<f4", "<f8", "<i4", "|b1", "<c8", "|O", "<U3", "<f2"]),
       st.integers(0, 2000))
def test_any_npy_header_gives_observations_or_a_user_error(shape, descr, data_bytes):
    header = {"descr": descr, "fortran_order": False, "shape": tuple(shape)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "obs.npy"
        with open(path, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            fh.write(bytes(data_bytes))
        try:
            obs = load_observations(str(path), 59)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
        assert obs.dtype == np.float32 and obs.shape[1] == 59 and np.isfinite(obs).all()


FLOATS = st.sampled_from([np.float16, np.float32, np.float64])
ARRAYS = hnp.arrays(FLOATS, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
                    elements={"allow_nan": True, "allow_infinity": True, "allow_subnormal": True})


@PROPERTY
@given(ARRAYS, st.one_of(ARRAYS, st.just(None)), st.floats(1e-9, 1.0))
def test_compare_gives_metrics_or_a_user_error(actual, expected, rel_floor):
    expected = actual[::-1].copy() if expected is None and actual.ndim else (actual if expected is None else expected)
    with np.errstate(all="ignore"):
        try:
            m = verify.elementwise(actual, expected, rel_floor)
        except UserError as exc:
            assert "\n" not in str(exc)
            return
    assert all(isinstance(v, float) for v in m.values())
    assert m["nan_mismatch"] >= 0 and m["inf_mismatch"] >= 0 and m["max_abs"] >= 0


@PROPERTY
@given(ARRAYS, ARRAYS)
def test_other_metrics_give_numbers_or_a_user_error(a, b):
    with np.errstate(all="ignore"):
        for call in (lambda: verify.cosine(a.ravel(), b.ravel()), lambda: numerics.action_stats(a),
                     lambda: numerics.ratio_verdict(numerics.error_ratio(float(np.nan_to_num(a).sum()), float(np.nan_to_num(b).sum())))):
            try:
                value = call()
            except UserError:
                continue
            assert isinstance(value, (float, str, dict))


def _small_onnx():
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        mlagents.write_onnx(SMALL.policy_weights(), Path(tmp) / "small.onnx")
        return onnx.load(str(Path(tmp) / "small.onnx"))


SMALL_ONNX = _small_onnx()
ONNX_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.bool_, np.uint8]


@st.composite
def onnx_graphs(draw):
    """The small actor's ML-Agents graph with random edits: initializers replaced, nodes dropped or rewired, inputs renamed."""
    from onnx import numpy_helper

    model = SMALL_ONNX.__class__()
    model.CopyFrom(SMALL_ONNX)
    graph = model.graph
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["initializer", "drop node", "rewire", "rename input", "op type"]))
        if action == "initializer" and len(graph.initializer):
            i = draw(st.integers(0, len(graph.initializer) - 1))
            t = draw(tensors()) if draw(st.booleans()) else None
            t = None if t is None else (t.real if t.is_complex() else t).to(torch.float64).numpy()
            if t is None:
                old = numpy_helper.to_array(graph.initializer[i]).copy()
                if old.size:
                    with np.errstate(all="ignore"):
                        old.reshape(-1)[draw(st.integers(0, old.size - 1))] = draw(SPECIALS)
                t = old
            dtype = draw(st.sampled_from(ONNX_DTYPES))
            with np.errstate(all="ignore"):
                t = np.nan_to_num(t) if np.dtype(dtype).kind != "f" else t
                graph.initializer[i].CopyFrom(numpy_helper.from_array(np.asarray(t).astype(dtype), graph.initializer[i].name))
        elif action == "drop node" and len(graph.node):
            del graph.node[draw(st.integers(0, len(graph.node) - 1))]
        elif action == "rewire" and len(graph.node):
            node = graph.node[draw(st.integers(0, len(graph.node) - 1))]
            names = [o for n in graph.node for o in n.output] + [i.name for i in graph.initializer] + ["obs_0"]
            if len(node.input):
                node.input[draw(st.integers(0, len(node.input) - 1))] = draw(st.sampled_from(names))
        elif action == "rename input":
            graph.input[0].name = draw(st.sampled_from(["x", "obs_1", "obs_0"]))
        elif action == "op type" and len(graph.node):
            graph.node[draw(st.integers(0, len(graph.node) - 1))].op_type = draw(st.sampled_from(["Gemm", "Mul", "Identity", "Clip", "Exp", "Relu"]))
    return model


@PROPERTY
@given(onnx_graphs())
def test_any_edited_onnx_graph_gives_sane_weights_or_a_user_error(model):
    try:
        w = mlagents.weights_from_onnx(model, "prop.onnx")
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    _loaded_weights_are_sane(w)
