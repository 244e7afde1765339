"""`precision_mode` (ieee | tf32 | hf32): the fp32 math switches as a sweep axis, set by placement.set_precision.

The CUDA switches are torch's own per-op `fp32_precision` attributes, which a CPU build sets and reads back like a CUDA
build: these tests set the real switches. The Ascend switches are exercised here through a stand-in with torch_npu's
surface (`matmul.allow_hf32`, `conv.allow_hf32`, `matmul.cube_math_type`, `CubeMathType`); the emulated `npu`
(tests/emulated_npu.py) runs the axis end to end, its matmul rounding the inputs' mantissa to 10 bits under HF32.
"""

from __future__ import annotations

import enum
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import compose_config, job_context, run_job

from huggy_exp import environment, placement
from huggy_exp.app import run_name
from huggy_exp.compare import compare
from huggy_exp.errors import Unsupported


@pytest.fixture(autouse=True)
def restore_switches():
    """The switches are process-wide: put back what the process had before each test, torch's legacy ones first (their
    setters move the per-op ones), then the per-op ones."""
    holders = [torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn,
               *(getattr(torch.backends.mkldnn, op) for op in placement.TORCH_OPS)]
    before = [h.fp32_precision for h in holders]
    try:
        legacy = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    except RuntimeError:  # a mix of legacy and per-op settings: torch's own defaults
        legacy = True, "highest"
    yield
    torch.backends.cudnn.allow_tf32 = legacy[0]
    torch.set_float32_matmul_precision(legacy[1])
    for holder, value in zip(holders, before):
        holder.fp32_precision = value


class CubeMathType(enum.Enum):  # torch_npu.npu.CubeMathType's names and values (CANN >= 8.5)
    KEEP_DTYPE = 0
    USE_HF32 = 3


def ascend_surface(cube: bool = True) -> SimpleNamespace:
    """torch_npu's precision switches as torch_npu ships them: matmul HF32 off, conv HF32 on, cube math type unset."""
    matmul = SimpleNamespace(allow_hf32=False, **({"cube_math_type": None} if cube else {}))
    return SimpleNamespace(matmul=matmul, conv=SimpleNamespace(allow_hf32=True),
                           **({"CubeMathType": CubeMathType} if cube else {}))


def test_tf32_sets_every_cuda_per_op_switch_and_ieee_puts_them_back():
    found = placement.set_precision("cuda:0", "fp32", "tf32")
    assert (found["cuda_matmul"], found["cudnn_conv"], found["cudnn_rnn"]) == ("tf32", "tf32", "tf32")
    assert torch.backends.cudnn.rnn.fp32_precision == "tf32"
    found = placement.set_precision("cuda:1", "fp32", "ieee")
    assert (found["cuda_matmul"], found["cudnn_conv"], found["cudnn_rnn"]) == ("ieee", "ieee", "ieee")


def test_an_fp32_cuda_point_runs_cudnn_rnns_in_ieee_although_torch_defaults_them_to_tf32():
    # torch's default, fp32 LSTMs in TF32 on a GPU, set again: an earlier test in this process may have moved it
    torch.backends.cudnn.rnn.fp32_precision = "tf32"
    placement.set_precision("cuda:0", "fp32", "ieee")
    assert torch.backends.cudnn.rnn.fp32_precision == "ieee" and torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_row_6_torchs_legacy_tf32_getters_read_the_mode_after_set_precision():
    """inductor reads torch's legacy switches (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
    torch.get_float32_matmul_precision()); after set_precision they read the point's mode instead of raising."""
    for mode, tf32, matmul in (("tf32", True, "high"), ("ieee", False, "highest"), ("tf32", True, "high")):
        found = placement.set_precision("cuda:0", "fp32", mode)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
        assert torch.get_float32_matmul_precision() == matmul
        assert (found["cuda_matmul_allow_tf32"], found["cudnn_allow_tf32"]) == (str(tf32).lower(),) * 2
        assert found["cuda_matmul"] == found["cudnn_conv"] == found["cudnn_rnn"] == mode
        assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"  # the CPU references stay IEEE


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_row_7_a_cuda_torch_without_per_op_switches_runs_ieee_through_its_legacy_ones(monkeypatch, dtype):
    """A CUDA torch before 2.9 has no fp32_precision switches (pyproject allows torch >= 2.4): an ieee point (every dtype)
    runs there with cuBLAS's and cuDNN's allow_tf32 off, and records the per-op switches as not present."""
    legacy = SimpleNamespace(matmul=SimpleNamespace(allow_tf32=True), cudnn=SimpleNamespace(allow_tf32=True))
    monkeypatch.setattr(torch.backends.cuda, "matmul", legacy.matmul)
    monkeypatch.setattr(torch.backends, "cudnn", legacy.cudnn)
    found = placement.set_precision("cuda:0", dtype, "ieee")
    assert legacy.matmul.allow_tf32 is False and legacy.cudnn.allow_tf32 is False
    assert (found["cuda_matmul_allow_tf32"], found["cudnn_allow_tf32"]) == ("false", "false")
    assert found["cuda_matmul"] == found["cudnn_conv"] == found["cudnn_rnn"] == "not present"
    if dtype == "fp32":  # and TF32 through the same switches
        assert placement.set_precision("cuda:0", dtype, "tf32")["cuda_matmul_allow_tf32"] == "true"

def test_the_cpu_references_stay_ieee_whatever_the_point_asks():
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"  # what a user's earlier setting could leave behind
    found = placement.set_precision("cuda:0", "fp32", "tf32")
    assert {found[f"cpu_{op}"] for op in placement.TORCH_OPS} == {"ieee"}


@pytest.mark.parametrize("device, dtype, mode, why", [
    ("cpu", "fp32", "tf32", "precision_mode=tf32 cannot be honoured on cpu: it has ieee"),
    ("cpu", "fp32", "hf32", "precision_mode=hf32 cannot be honoured on cpu: it has ieee"),
    ("cuda:0", "fp32", "hf32", "precision_mode=hf32 cannot be honoured on cuda: it has ieee, tf32"),
    ("npu:0", "fp32", "tf32", "precision_mode=tf32 cannot be honoured on npu: it has ieee, hf32"),
    ("mps", "fp32", "tf32", "precision_mode=tf32 cannot be honoured on mps: it has ieee"),
    ("cuda:0", "bf16", "tf32", "precision_mode=tf32 changes fp32 math only; dtype=bf16 computes in bf16"),
])
def test_a_mode_the_device_cannot_honour_is_skipped_with_the_reason(device, dtype, mode, why):
    with pytest.raises(Unsupported, match=why.replace("(", r"\(")):
        placement.set_precision(device, dtype, mode)


def test_hf32_sets_ascends_switches_and_cube_math_type_and_ieee_turns_conv_hf32_off(monkeypatch):
    npu = ascend_surface()
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    found = placement.set_precision("npu:0", "fp32", "hf32")
    assert (found["npu_matmul_allow_hf32"], found["npu_conv_allow_hf32"], found["npu_cube_math_type"]) == ("true", "true", "USE_HF32")
    found = placement.set_precision("npu:1", "fp32", "ieee")
    assert (found["npu_matmul_allow_hf32"], found["npu_conv_allow_hf32"], found["npu_cube_math_type"]) == ("false", "false", "KEEP_DTYPE")
    assert npu.conv.allow_hf32 is False  # torch_npu's default is True: ieee must say no to it


def test_without_cube_math_type_hf32_rests_on_allow_hf32_and_records_its_absence(monkeypatch):
    monkeypatch.setattr(torch, "npu", ascend_surface(cube=False), raising=False)
    found = placement.set_precision("npu:0", "fp32", "hf32")
    assert found["npu_matmul_allow_hf32"] == "true" and found["npu_cube_math_type"] == "not present"


def test_hf32_on_a_build_without_its_switch_is_skipped_not_run_in_ieee(monkeypatch):
    npu = ascend_surface()
    del npu.matmul.allow_hf32  # a torch_npu without the matmul HF32 switch
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    with pytest.raises(Unsupported, match=r"^precision_mode=hf32: this build has no npu.matmul.allow_hf32 switch"):
        placement.set_precision("npu:0", "fp32", "hf32")
    assert placement.set_precision("npu:0", "fp32", "ieee")["npu_matmul_allow_hf32"] == "not present"


def test_a_switch_that_does_not_take_is_skipped_naming_what_it_read(monkeypatch):
    class Stuck(SimpleNamespace):
        def __setattr__(self, name, value):  # a build whose switch ignores the setting
            pass

    npu = SimpleNamespace(matmul=Stuck(allow_hf32=False), conv=SimpleNamespace(allow_hf32=False))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    with pytest.raises(Unsupported, match="npu_matmul_allow_hf32"):
        placement.set_precision("npu:0", "fp32", "hf32")


def test_the_environment_reads_the_switches_after_tf32_was_set():
    placement.set_precision("cuda:0", "fp32", "tf32")  # torch's legacy allow_tf32 reads raise from here on
    flags = environment.runtime_flags()
    assert flags["fp32_precision_cuda_matmul"] == "tf32" and flags["fp32_precision_cudnn_rnn"] == "tf32"


def test_a_point_records_the_switches_in_effect_in_result_json(tmp_path):
    job = run_job(tmp_path, "action", "obs.rows=4")
    assert job.record["precision_mode"] == "ieee" and job.record["tags"]["fp32_precision/cpu_matmul"] == "ieee"
    assert job.record["tags"]["fp32_precision/cudnn_rnn"] in ("ieee", "tf32")  # a cpu point leaves CUDA's alone


def test_tf32_on_the_cpu_is_a_skipped_point_named_for_its_mode(tmp_path):
    job = run_job(tmp_path, "action", "precision_mode=tf32", "obs.rows=4")
    assert job.record["status"] == "skipped" and "precision_mode=tf32 cannot be honoured on cpu" in job.record["reason"]
    assert job.record["run_name"] == "action-cpu-fp32-tf32-b64"


def test_run_names_carry_the_mode_off_ieee_only():
    assert run_name("precision", compose_config(["device=cuda:0", "precision_mode=tf32"])) == "precision-cuda:0-fp32-tf32-b64"
    assert run_name("precision", compose_config(["device=cuda:0"])) == "precision-cuda:0-fp32-b64"


def test_an_unknown_mode_is_refused_naming_the_choices():
    from huggy_exp.config import validate
    from huggy_exp.errors import UserError

    with pytest.raises(UserError, match="unknown precision_mode 'fp8'; valid: ieee, tf32, hf32"):
        validate(compose_config(["precision_mode=fp8"]), "action")


def row(job: str, device: str, dtype: str, mode: str, status: str, p50: float) -> dict:
    return {"job": job, "mode": "precision", "device": device, "dtype": dtype, "precision_mode": mode, "status": status,
            "batch_size": 64, "knobs": {}, "obs": "random/64/x1.0", "seed": 0, "model_sha256": "m", "dir": "/nonexistent",
            "metrics": {"p50_us": p50}, "latency": {}, "model_name": "m", "latency_points": [["eager", 64, p50]]}


def test_the_comparison_weighs_fp32_and_fp32_tf32_as_two_choices_of_one_device():
    rows = [row("0", "cuda:0", "fp32", "ieee", "passed", 50.0), row("1", "cuda:0", "fp32", "tf32", "failed", 20.0),
            row("2", "cuda:0", "bf16", "ieee", "passed", 30.0)]
    pick = compare(rows)["recommended"]["cuda:0 at batch 64"]
    assert pick["dtype"] == "bf16" and pick["failing"] == ["fp32-tf32"] and pick["passing"] == ["fp32", "bf16"]
    assert any("cuda:0 at batch 64: bf16" in line and "failing: fp32-tf32" in line for line in compare(rows)["lines"])
    assert [r["precision_mode"] for r in compare(rows)["table"]] == ["ieee", "tf32", "ieee"]


@pytest.mark.slow
def test_a_sweep_over_the_mode_reads_naturally(tmp_path):
    """`-m precision_mode=ieee,tf32` on the CPU: the ieee point passes, the tf32 one is skipped and named for its mode."""
    import subprocess
    import sys

    from conftest import REPO, subprocess_env

    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "run.py", "-m", "tracking=none", "plots=false", "obs.rows=4",
                           "precision_mode=ieee,tf32", f"hydra.sweep.dir={out}"], cwd=REPO, capture_output=True,
                          text=True, timeout=240, env=subprocess_env(tmp_path / "cache"))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["run_name"], r["precision_mode"], r["status"]) for r in summary["rows"]] == [
        ("action-cpu-fp32-b64", "ieee", "passed"), ("action-cpu-fp32-tf32-b64", "tf32", "skipped")]
    assert "precision_mode" in (out / "summary.csv").read_text().splitlines()[0].split(",")


def test_hf32_on_the_emulated_npu_rounds_its_matmuls_and_the_sweep_names_it(tmp_path, huggy_exp_cache):
    """End to end on the emulated `npu` (its matmuls round fp32 inputs to 10 mantissa bits while HF32 is on):
    `-m device=cpu,npu:0 precision_mode=ieee,hf32`. The ieee card gives the CPU's bytes; the hf32 card moves the actions
    by HF32's error, passes hf32's own limit row (not fp32's 1e-5) and records the switches it ran with; the CPU's
    hf32 point is skipped."""
    from test_emulated_npu import sweep

    done, folder = sweep(tmp_path, huggy_exp_cache, "device=cpu,npu:0", "precision_mode=ieee,hf32", "obs.rows=16")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    points = {r["run_name"]: r for r in (json.loads(p.read_text()) for p in folder.glob("*/result.json"))}
    assert {name: r["status"] for name, r in points.items()} == {
        "action-cpu-fp32-b64": "passed", "action-cpu-fp32-hf32-b64": "skipped",
        "action-npu:0-fp32-b64": "passed", "action-npu:0-fp32-hf32-b64": "passed"}
    hf32, ieee = points["action-npu:0-fp32-hf32-b64"], points["action-npu:0-fp32-b64"]
    assert hf32["tags"]["fp32_precision/npu_matmul_allow_hf32"] == "true"
    assert ieee["tags"]["fp32_precision/npu_matmul_allow_hf32"] == "false"
    assert ieee["tags"]["fp32_precision/npu_conv_allow_hf32"] == "false"
    assert 1e-4 < hf32["headline_metrics"]["max_abs_vs_fp64"] < 1e-2  # 10 mantissa bits: ~5e-4 relative per input
    assert "npu:0 fp32-hf32 b64" in done.stdout


def test_a_torch_whose_switch_refuses_the_value_skips_the_point_saying_so(monkeypatch):
    class Older:  # a torch whose per-op switch knows other names ("default" in 2.4-2.8)
        fp32_precision = "default"

        def __setattr__(self, name, value):
            raise RuntimeError(f"Invalid precision {value}")

    monkeypatch.setattr(torch.backends.cudnn, "rnn", Older())
    with pytest.raises(Unsupported, match="refused fp32_precision='tf32' \\(Invalid precision tf32\\)"):
        placement.set_precision("cuda:0", "fp32", "tf32")


def test_onnxruntime_cuda_runs_fp32_in_tf32_only_when_precision_mode_says_so(monkeypatch, tmp_path):
    """onnxruntime's CUDA provider runs fp32 matmuls and convolutions in TF32 unless told `use_tf32=0`: an `ieee` point
    tells it, a `tf32` point asks for it, the point records what its sessions are given, and build() hands it over."""
    import onnxruntime as ort

    from huggy_exp import runners
    from huggy_exp.context import Context
    from huggy_exp.errors import UserError

    assert placement.onnxruntime_options("CUDAExecutionProvider", 1, "ieee") == {"device_id": "1", "use_tf32": "0"}
    assert placement.onnxruntime_options("CUDAExecutionProvider", None, "tf32") == {"use_tf32": "1"}
    assert placement.onnxruntime_options("CANNExecutionProvider", 0, "ieee")["device_id"] == "0"
    assert placement.onnxruntime_options("CPUExecutionProvider", None, "ieee") == {}
    assert placement.set_precision("cuda:0", "fp32", "ieee")["onnxruntime_cuda_use_tf32"] == "0"
    assert placement.set_precision("cuda:0", "fp32", "tf32")["onnxruntime_cuda_use_tf32"] == "1"
    assert "onnxruntime_cuda_use_tf32" not in placement.set_precision("cpu", "fp32", "ieee")

    given = []

    def session(path, options, providers):  # no CUDA here: what the session is asked for, then a refusal
        given.append(providers)
        raise RuntimeError("no CUDA on this host")

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    card = placement.Target(torch.device("cuda:1"), torch.float32, "cuda:1", "fp32")
    monkeypatch.setattr(Context, "target", lambda self, device=None, dtype=None: card)
    monkeypatch.setattr(Context, "onnx_path", lambda self: tmp_path / "policy.onnx")
    for mode, tf32 in (("ieee", "0"), ("tf32", "1")):
        with pytest.raises(UserError, match="no CUDA on this host"):
            runners.build(job_context(tmp_path, "device=cuda:1", f"precision_mode={mode}"), "onnxruntime")
        assert given.pop() == [("CUDAExecutionProvider", {"device_id": "1", "use_tf32": tf32})]


def test_row_9_torch_npus_switch_objects_answer_every_name_and_are_not_taken_for_switches(monkeypatch):
    """torch_npu's torch.npu.matmul answers every attribute name (None for one it lacks) and ignores setting it, so
    hasattr says nothing: a switch is present when it reads a value. torch.npu.aclnn.allow_hf32 is set and recorded."""
    from emulated_npu import AscendOptions, ConvSwitches, MatmulSwitches, switches

    old = SimpleNamespace(**switches("old"))  # a torch_npu without the cube math type and torch.npu.aclnn
    assert hasattr(old.matmul, "cube_math_type") and old.matmul.cube_math_type is None
    monkeypatch.setattr(torch, "npu", old, raising=False)
    found = placement.set_precision("npu:0", "fp32", "hf32")
    assert (found["npu_matmul_allow_hf32"], found["npu_conv_allow_hf32"]) == ("true", "true")
    assert found["npu_cube_math_type"] == found["npu_aclnn_allow_hf32"] == "not present"
    current = SimpleNamespace(**switches("current"))
    monkeypatch.setattr(torch, "npu", current, raising=False)
    found = placement.set_precision("npu:0", "fp32", "ieee")
    assert (found["npu_aclnn_allow_hf32"], found["npu_cube_math_type"]) == ("false", "KEEP_DTYPE")
    assert current.aclnn.allow_hf32 is False and current.conv.allow_hf32 is False

    class WithoutHF32(MatmulSwitches):  # a build whose matmul object lacks allow_hf32: it answers None, ignores a set
        def __setattr__(self, name, value):
            pass

        def __getattr__(self, name):
            return None

    bare = AscendOptions()
    monkeypatch.setattr(torch, "npu", SimpleNamespace(matmul=WithoutHF32(bare), conv=ConvSwitches(bare)), raising=False)
    with pytest.raises(Unsupported, match=r"^precision_mode=hf32: this build has no npu.matmul.allow_hf32 switch"):
        placement.set_precision("npu:0", "fp32", "hf32")
    assert placement.set_precision("npu:0", "fp32", "ieee")["npu_matmul_allow_hf32"] == "not present"


def test_row_9_an_older_torch_npu_that_resets_hf32_when_the_card_starts_still_runs_hf32(tmp_path, huggy_exp_cache):
    """torch_npu builds before 2025-09 set ACL's HF32 option to "10" when the card starts, after set_precision ran,
    while their getters read what was set (the emulated `old` build does the same): the point sets the switches again
    after the card's first op, so an hf32 point computes in HF32 and says so."""
    from test_emulated_npu import emulated

    done = emulated(["run.py", "device=npu:0", "precision_mode=hf32", "obs.rows=16", "plots=false", "tracking=none",
                     f"hydra.run.dir={tmp_path / 'job'}"], huggy_exp_cache, HUGGY_EXP_EMULATED_NPU_BUILD="old")
    record = json.loads((tmp_path / "job" / "result.json").read_text())
    assert record["tags"]["fp32_precision/npu_matmul_allow_hf32"] == "true", done.stderr[-2000:]
    assert 1e-4 < record["headline_metrics"]["max_abs_vs_fp64"] < 1e-2  # HF32's rounding, not IEEE's 1e-7
    assert record["tags"]["fp32_precision/npu_cube_math_type"] == "not present"


@pytest.mark.parametrize("device, mode", [("cuda:0", "tf32"), ("npu:0", "hf32")])
def test_row_8_tf32_and_hf32_points_are_judged_by_their_own_limit_rows(tmp_path, device, mode):
    """fp32 computed in TF32 or HF32 (10 explicit mantissa bits in the matmul inputs) is judged by its mode's row of
    verify.limits, not IEEE fp32's 1e-5 that it fails by construction; `<kind>_<mode>` specializes it like a dtype."""
    ctx = job_context(tmp_path, f"device={device}", f"precision_mode={mode}")
    assert ctx.limits().atol == 1.0e-02 == getattr(ctx.verify.limits, mode).max_abs  # fp16's figure, not fp32's 1e-5
    assert ctx.limits().layer_rel_rmse == 3.0e-03 and ctx.limits("bf16").atol == 5.0e-02
    assert job_context(tmp_path, f"device={device}").limits().atol == 1.0e-05  # ieee: fp32's row
    kind = device.split(":")[0]
    special = job_context(tmp_path, f"device={device}", f"precision_mode={mode}",
                          f"++verify.specialize={{{kind}_{mode}: {{max_abs: 2.0e-02}}}}")
    assert special.limits().atol == 2.0e-02


def test_row_3_onnxruntime_cann_keeps_fp32_as_precision_mode_says(monkeypatch, tmp_path):
    """CANN's graph engine runs a whole graph in fp16 by default (precision_mode force_fp16): an ieee point's CANN
    sessions are given precision_mode=must_keep_origin_dtype (precision_mode_v2=origin on onnxruntime builds that
    renamed it), the point records it, and hf32, which CANN's provider has no option for, is skipped."""
    import onnxruntime as ort

    from huggy_exp import runners
    from huggy_exp.context import Context
    from huggy_exp.errors import UserError

    assert placement.onnxruntime_options("CANNExecutionProvider", 0, "ieee") == {
        "device_id": "0", "precision_mode": "must_keep_origin_dtype"}
    with pytest.raises(Unsupported, match="precision_mode=hf32 has no CANNExecutionProvider option"):
        placement.onnxruntime_options("CANNExecutionProvider", 1, "hf32")
    monkeypatch.setattr(torch, "npu", ascend_surface(), raising=False)
    assert placement.set_precision("npu:0", "fp32", "ieee")["onnxruntime_cann_precision_mode"] == "must_keep_origin_dtype"

    given = []

    def session(path, options, providers):  # an onnxruntime that knows only the renamed option, then no CANN here
        given.append(providers)
        name = next(iter(set(providers[0][1]) - {"device_id"}))
        raise RuntimeError(f'Unknown provider option: "{name}".' if name == "precision_mode" else "no CANN on this host")

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CANNExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(ort, "InferenceSession", session)
    card = placement.Target(torch.device("cpu"), torch.float32, "npu:1", "fp32")  # the card's name; no card here
    monkeypatch.setattr(Context, "target", lambda self, device=None, dtype=None: card)
    monkeypatch.setattr(Context, "onnx_path", lambda self: tmp_path / "policy.onnx")
    monkeypatch.setattr(placement.Target, "kind", property(lambda self: "npu"))
    with pytest.raises(UserError, match="no CANN on this host"):
        runners.build(job_context(tmp_path, "device=npu:1"), "onnxruntime")
    assert given == [[("CANNExecutionProvider", {"precision_mode": "must_keep_origin_dtype"})],
                     [("CANNExecutionProvider", {"precision_mode_v2": "origin"})]]
