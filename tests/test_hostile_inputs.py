"""Every loader input a hostile or careless user can hand over, and the one line each must get (issue #8).

Each row builds its bad input in tmp_path and calls the loader directly; the end-to-end CLI matrix lives elsewhere.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import BODY, LOG_SIGMA, NORM_PREFIXES, SPECS, make_actor, model_conf, run_job
from onnx import helper, numpy_helper

from huggy_exp import mlagents
from huggy_exp.context import open_model
from huggy_exp.errors import UserError
from huggy_exp.observations import load_observations, make_observations

ACTOR = make_actor(SPECS["huggy"])  # 59 obs, 21 actions, 2 x 32
MARKER = "huggy_exp_pickle_ran"


class _Hostile:
    """Unpickling this would create a marker file: proof that pickled code ran."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return (Path.touch, (Path(self.target),))


# --- builders: each returns a zero-argument call of the loader under test


def _pt_with(tmp: Path, **changes):
    """A Huggy-shaped .pt with some Policy entries replaced (both normalizer spellings when the key starts with 'norm:')."""
    state = ACTOR.state_dict()
    for key, value in changes.items():
        for k in ([p + key[5:] for p in NORM_PREFIXES] if key.startswith("norm:") else [key]):
            state[k] = value(state[k].clone()) if callable(value) else value
    path = ACTOR.save(tmp / "policy.pt", state=state)
    return lambda: mlagents.load_checkpoint(path)


def _poke(index, value):
    def change(t: torch.Tensor) -> torch.Tensor:
        t[index] = value
        return t
    return change


def pt_bytes(data: bytes):
    def build(tmp: Path):
        (tmp / "policy.pt").write_bytes(data)
        return lambda: mlagents.load_checkpoint(tmp / "policy.pt")
    return build


def pt_hostile_torch_save(tmp: Path):
    torch.save({"Policy": _Hostile(tmp / MARKER)}, tmp / "policy.pt")
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def pt_hostile_raw_pickle(tmp: Path):
    (tmp / "policy.pt").write_bytes(pickle.dumps(_Hostile(tmp / MARKER), protocol=0))
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def pt_truncated(tmp: Path):
    good = ACTOR.save(tmp / "good.pt").read_bytes()
    (tmp / "policy.pt").write_bytes(good[: len(good) // 2])
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def pt_top_level_list(tmp: Path):
    torch.save([torch.zeros(3)], tmp / "policy.pt")
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def pt_non_string_key(tmp: Path):
    torch.save({"Policy": {**ACTOR.state_dict(), 7: torch.zeros(1)}}, tmp / "policy.pt")
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def pt_empty_global_step(tmp: Path):
    torch.save({"Policy": ACTOR.state_dict(), "global_step": {"_GlobalSteps__global_step": torch.zeros(0)}}, tmp / "policy.pt")
    return lambda: mlagents.load_checkpoint(tmp / "policy.pt")


def _onnx(tmp: Path, edit=None, name: str = "policy.onnx") -> Path:
    path = tmp / name
    mlagents.write_onnx(ACTOR.policy_weights(), path)
    if edit is not None:
        model = onnx.load(str(path))
        edit(model)
        onnx.save(model, str(path))
    return path


def _set_initializer(name: str, change):
    def edit(model):
        for i, t in enumerate(model.graph.initializer):
            if t.name == name:
                model.graph.initializer[i].CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(t).copy()), name))
    return edit


def onnx_initializer(name: str, change):
    def build(tmp: Path):
        path = _onnx(tmp, _set_initializer(name, change))
        return lambda: mlagents.load_onnx(path)
    return build


def _set(index, value):
    def change(a: np.ndarray) -> np.ndarray:
        a[index] = value
        return a
    return change


def onnx_external(location: str):
    """The policy saved with external data, then its data location rewritten to `location`."""
    def build(tmp: Path):
        folder = tmp / "model"
        folder.mkdir()
        onnx.save(onnx.load(str(_onnx(tmp))), str(folder / "policy.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
        model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)
        for t in model.graph.initializer:
            for entry in t.external_data:
                if entry.key == "location":
                    entry.value = location
        onnx.save(model, str(folder / "policy.onnx"))
        return lambda: mlagents.load_onnx(folder / "policy.onnx")
    return build


def onnx_bytes(tmp: Path):
    (tmp / "policy.onnx").write_bytes(np.random.default_rng(147).bytes(256) + b"\xff" * 64)  # seeded: every run the same file
    return lambda: mlagents.load_onnx(tmp / "policy.onnx")


def onnx_pairing_other_graph(tmp: Path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "not ml-agents",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 10])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 10])])
    onnx.save(helper.make_model(graph), str(tmp / "other.onnx"))
    return lambda: mlagents.check_onnx_pairing(tmp / "other.onnx", ACTOR.policy_weights())


def onnx_pairing_other_size(tmp: Path):
    path = tmp / "walker.onnx"
    mlagents.write_onnx(make_actor(SPECS["walker"]).policy_weights(), path)
    return lambda: mlagents.check_onnx_pairing(path, ACTOR.policy_weights())


def status(content: bytes | object):
    def build(tmp: Path):
        (tmp / "run_logs").mkdir()
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (tmp / "run_logs" / "training_status.json").write_bytes(data)
        return lambda: mlagents.list_checkpoints(tmp)
    return build


def npy_header(shape, descr: str = "<f4", data: bytes = b"\0" * 64):
    def build(tmp: Path):
        with open(tmp / "obs.npy", "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": descr, "fortran_order": False, "shape": shape})
            fh.write(data)
        return lambda: load_observations(str(tmp / "obs.npy"), 59)
    return build


def npy_array(array: np.ndarray):
    def build(tmp: Path):
        np.save(tmp / "obs.npy", array, allow_pickle=array.dtype.hasobject)
        return lambda: load_observations(str(tmp / "obs.npy"), 59)
    return build


def npy_bytes(tmp: Path):
    (tmp / "obs.npy").write_bytes(b"PK\x03\x04" + np.random.default_rng(191).bytes(200))
    return lambda: load_observations(str(tmp / "obs.npy"), 59)


def _results(tmp: Path, *behaviors: str) -> Path:
    root = tmp / "results"
    for b in behaviors:
        ACTOR.save(root / b / f"{b}-100.pt", step=100)
    return root


def results_behavior(asked: str | None, *present: str):
    def build(tmp: Path):
        root = _results(tmp, *present)
        return lambda: open_model(model_conf(results_dir=str(root), behavior=asked))
    return build


NAN_WEIGHT = "network_body._body_endoder.seq_layers.2.weight"
ENTRY = {"steps": 100, "file_path": "a.onnx", "reward": 1.0, "creation_time": 1.0, "auxillary_file_paths": []}

ROWS = [
    # --- .pt: the file itself
    ("pt random bytes", pt_bytes(b"\x13\x37 not torch" + bytes(range(256))), "is not a torch file: neither a zip archive"),
    ("pt empty", pt_bytes(b""), "is empty (0 bytes)"),
    ("pt hostile pickle via torch.save", pt_hostile_torch_save, "holds pickled objects other than tensors; refused to unpickle"),
    ("pt hostile bare pickle", pt_hostile_raw_pickle, "holds pickled objects other than tensors; refused to unpickle"),
    ("pt truncated zip", pt_truncated, "not a readable torch checkpoint (truncated or corrupt?)"),
    ("pt top level list", pt_top_level_list, "top level is list, not a dict"),
    # --- .pt: what the weights hold
    ("pt NaN weight", lambda t: _pt_with(t, **{NAN_WEIGHT: _poke((3, 17), float("nan"))}),
     f"Policy key {NAN_WEIGHT} has 1 NaN (first at [3, 17])"),
    ("pt inf log_sigma", lambda t: _pt_with(t, **{LOG_SIGMA: _poke((0, 4), float("inf"))}), f"Policy key {LOG_SIGMA} has 1 inf (first at [0, 4])"),
    ("pt NaN mu bias", lambda t: _pt_with(t, **{"action_model._continuous_distribution.mu.bias": _poke(0, float("nan"))}), "mu.bias has 1 NaN"),
    ("pt NaN running_variance is not 'disagree'", lambda t: _pt_with(t, **{"norm:running_variance": _poke(4, float("nan"))}),
     f"Policy key {NORM_PREFIXES[0]}running_variance has 1 NaN (first at [4])"),
    ("pt inf running_mean", lambda t: _pt_with(t, **{"norm:running_mean": _poke(0, float("-inf"))}), "running_mean has 1 inf"),
    ("pt negative running_variance", lambda t: _pt_with(t, **{"norm:running_variance": _poke(7, -3.0)}),
     f"{NORM_PREFIXES[0]}running_variance has 1 values <= 0 (first at [7]: -3)"),
    ("pt zero normalization_steps", lambda t: _pt_with(t, **{"norm:normalization_steps": torch.tensor(0)}),
     "normalization_steps is [0], expected one integer >= 1"),
    ("pt negative normalization_steps", lambda t: _pt_with(t, **{"norm:normalization_steps": torch.tensor(-5)}),
     "normalization_steps is [-5], expected one integer >= 1"),
    ("pt float64 weight overflowing float32", lambda t: _pt_with(t, **{NAN_WEIGHT: lambda w: w.double() * 1e300}),
     "inf once cast to float32"),
    ("pt string entry", lambda t: _pt_with(t, **{NAN_WEIGHT: "weights"}), f"key {NAN_WEIGHT} is a str, not a real-valued tensor"),
    ("pt complex entry", lambda t: _pt_with(t, **{NAN_WEIGHT: lambda w: w.to(torch.complex64)}), "complex64 array, not a real-valued tensor"),
    ("pt non-string key", pt_non_string_key, "Policy key 7 is a int, not a string"),
    ("pt empty global_step", pt_empty_global_step, "key global_step._GlobalSteps__global_step is empty, expected one integer >= 0"),
    ("pt 1-D layer weight", lambda t: _pt_with(t, **{f"{BODY}0.weight": torch.zeros(32)}), "shape mismatch"),
    ("pt normalizer spellings really disagree", lambda t: _pt_with(t, **{NORM_PREFIXES[1] + "running_mean": lambda m: m + 1}), "disagree"),
    # --- .onnx
    ("onnx random bytes", onnx_bytes, "could not be parsed (truncated or not ONNX?)"),
    ("onnx external data outside its folder", onnx_external("../policy.onnx"), "external data refused: Data of TensorProto"),
    ("onnx external data at an absolute path", onnx_external("/etc/passwd"), "external data refused"),
    ("onnx external data missing", onnx_external("gone.bin"), "external data missing"),
    ("onnx NaN initializer", onnx_initializer(NAN_WEIGHT, _set((1, 2), np.nan)), f"initializer {NAN_WEIGHT} has 1 NaN (first at [1, 2])"),
    ("onnx inf log_sigma", onnx_initializer(LOG_SIGMA, _set((0, 0), np.inf)), f"initializer {LOG_SIGMA} has 1 inf"),
    ("onnx folded std <= 0", onnx_initializer("normalizer_folded_std", _set(3, 0.0)), "normalizer std (the Div constant) has 1 values <= 0"),
    ("onnx-compare: not an ML-Agents graph", onnx_pairing_other_graph,
     "expected inputs obs_0 [N, 59] and outputs continuous_actions [N, 21], deterministic_continuous_actions [N, 21]; "
     "found inputs x [N, 10]; outputs y [N, 10]"),
    ("onnx-compare: another policy's sizes", onnx_pairing_other_size, "found inputs obs_0 [N, 243]"),
    # --- run_logs/training_status.json
    ("status top level list", status([1, 2]), "top level is a JSON list, expected an object of behaviors"),
    ("status steps not a number", status({"Huggy": {"checkpoints": [{**ENTRY, "steps": "abc"}]}}),
     'Huggy.checkpoints[0].steps is "abc", expected a non-negative integer'),
    ("status steps fractional", status({"Huggy": {"checkpoints": [{**ENTRY, "steps": 1.5}]}}), "steps is 1.5"),
    ("status bad UTF-8", status(b'{"Huggy": "\xff\xfe"}'), "is not UTF-8 text (bad byte at offset 11)"),
    ("status entry without steps", status({"Huggy": {"checkpoints": [{"reward": 1.0}]}}), 'Huggy.checkpoints[0] has no "steps" (keys: reward)'),
    ("status checkpoints not a list", status({"Huggy": {"checkpoints": {"steps": 1}}}), "Huggy.checkpoints is a JSON object, expected a list"),
    ("status reward not a number", status({"Huggy": {"checkpoints": [{**ENTRY, "reward": "high"}]}}), "reward is \"high\", expected a number or null"),
    ("status final without steps", status({"Huggy": {"checkpoints": [ENTRY], "final_checkpoint": {}}}), 'Huggy.final_checkpoint has no "steps"'),
    ("status behavior not an object", status({"Huggy": 3}), 'Huggy is 3, expected an object with "checkpoints"'),
    ("status nested too deeply", status(b"[" * 100_000), "is not valid JSON"),
    # --- observations (.npy, obs.rows, obs.scale)
    ("npy header claims 1e12 rows", npy_header((10**12, 59)), "its header claims float32 [1000000000000, 59]"),
    ("npy truncated", npy_header((100, 59)), "is truncated: its header says float32 [100, 59] (23,600 bytes) but it holds 64 bytes"),
    ("npy object array", npy_array(np.array([{"a": 1}], dtype=object)), "must hold a numeric array (float32 [N, 59]), found dtype object"),
    ("npy not numpy at all", npy_bytes, "is not a .npy array (save it with numpy.save)"),
    ("npy NaN", npy_array(np.full((2, 59), np.nan, np.float32)), "118 NaN/inf values (first at row 0, column 0)"),
    ("npy wrong width", npy_array(np.zeros((4, 58), np.float32)), "wrong observation width: expected [N, 59], got [4, 58]"),
    ("obs.rows 1e11", lambda t: lambda: make_observations("random", 59, 100_000_000_000),
     "obs.rows=100000000000: [100000000000, 59] float32 observations need 21,979.2 GiB, over the 1 GiB limit"),
    ("obs.scale nan", lambda t: lambda: make_observations("random", 59, 4, scale=float("nan")), "obs.scale must be a finite number"),
    # --- results folders
    ("behavior not in the folder", results_behavior("Walker", "Huggy"), "has no behavior 'Walker'; behaviors found: Huggy"),
    ("several behaviors, none chosen", results_behavior(None, "Huggy", "Walker"), "holds several behaviors (Huggy, Walker); choose one with model.behavior"),
]


@pytest.mark.parametrize("build, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_hostile_input_gets_one_clear_line(build, fragment, tmp_path):
    call = build(tmp_path)
    with pytest.raises(UserError) as err:
        call()
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message and "Traceback" not in message
    assert not (tmp_path / MARKER).exists(), "pickled code ran"


def test_the_matrix_is_large_enough():
    assert len(ROWS) >= 40


def test_onnx_external_data_inside_the_folder_still_loads(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(onnx.load(str(_onnx(tmp_path))), str(folder / "policy.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    assert mlagents.load_onnx(folder / "policy.onnx").weights.obs_dim == 59


def test_a_chosen_behavior_loads_from_a_folder_with_several(tmp_path):
    root = _results(tmp_path, "Huggy", "Walker")
    assert open_model(model_conf(results_dir=str(root), behavior="Walker")).path == root / "Walker" / "Walker-100.pt"


def test_onnx_compare_with_a_foreign_onnx_is_an_error_job(tmp_path):
    onnx_pairing_other_graph(tmp_path)
    pt = ACTOR.save(tmp_path / "policy.pt")
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={pt}", f"model.onnx={tmp_path / 'other.onnx'}", "obs.rows=4")
    assert job.record["status"] == "error"
    assert "not an ML-Agents policy for this checkpoint" in job.record["reason"]


def configuration(text: bytes):
    def build(tmp: Path):
        (tmp / "configuration.yaml").write_bytes(text)
        return lambda: mlagents.read_configuration(tmp)
    return build


CONFIGURATION_ROWS = [
    ("configuration top level list", configuration(b"- a\n- b\n"), "expected a mapping 'behaviors: {<Behavior>: {trainer_type"),
    ("configuration behaviors list", configuration(b"behaviors: [1]\n"), "found behaviors: a list"),
    ("configuration behavior not a mapping", configuration(b"behaviors:\n  Huggy: 3\n"), "behaviors.Huggy is a int, expected a mapping"),
    ("configuration network_settings list", configuration(b"behaviors:\n  Huggy:\n    network_settings: [1]\n"),
     "behaviors.Huggy.network_settings is a list, expected a mapping"),
    ("configuration bad UTF-8", configuration(b"behaviors:\n  \xff\xfe: 1\n"), "configuration.yaml is not UTF-8 text"),
    ("configuration nested too deeply", configuration(b"[" * 5000), "configuration.yaml is not valid YAML"),
]


@pytest.mark.parametrize("build, fragment", [r[1:] for r in CONFIGURATION_ROWS], ids=[r[0] for r in CONFIGURATION_ROWS])
def test_hostile_configuration_yaml_gets_one_clear_line(build, fragment, tmp_path):
    test_hostile_input_gets_one_clear_line(build, fragment, tmp_path)
