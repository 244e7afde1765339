"""The verification modes end to end: precision, onnx-compare, export-onnx, fingerprint, stats (and every mode's result.json).

Modes run in-process through the real Hydra config (conf/) and huggy_exp.app.execute, as run.py runs them. Most
tests use a small hand-built policy (8 obs, 3 actions, 2x16 Swish, a normalizer with ML-Agents magnitudes); the
genuine ML-Agents Huggy files in ../shared/fixtures/mlagents are used for the conformance checks.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import assert_same_weights, compose_config, job_context, mode_conf
from huggy_exp import config, mlagents
from huggy_exp.dynamics import Dynamics
from huggy_exp.placement import resolve
from huggy_exp.runners import ACTIONS, OBS, TorchRunner
from huggy_exp.tasks.fingerprint import first_divergence, quantize
from huggy_exp.tasks.precision import PrecisionTask

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SHARED = REPO.parent / "shared" / "fixtures" / "mlagents"
HUGGY_PT = SHARED / "huggy" / "Huggy" / "Huggy-2000049.pt"
REFERENCE = SHARED / "huggy" / "reference"
MODES = sorted(p.stem for p in (CONF / "mode").glob("*.yaml") if config.modes()[p.stem].is_task())  # sync, ui: not tasks
READS_A_RUN = ("replay", "diff")  # they need a bundle or sweep to read: tests/test_certificate.py runs them

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"genuine ML-Agents fixtures not found at {SHARED}")
HUGGY_OBS = ["obs=file", f"obs.path={REFERENCE / 'obs.npy'}"]


@pytest.fixture(scope="module", autouse=True)
def _cache_under_tmp(request, tmp_path_factory):
    """The embedded default is written under tmp: conftest.py's session fixture when there is one, else here."""
    try:
        request.getfixturevalue("huggy_exp_cache")
        yield
        return
    except pytest.FixtureLookupError:
        pass
    old = os.environ.get("HUGGY_EXP_CACHE")
    os.environ["HUGGY_EXP_CACHE"] = str(tmp_path_factory.mktemp("huggy_exp_cache"))
    yield
    if old is None:
        os.environ.pop("HUGGY_EXP_CACHE", None)
    else:
        os.environ["HUGGY_EXP_CACHE"] = old


# --- helpers


@dataclass
class Run:
    result: object  # huggy_exp.results.Result
    record: dict  # result.json
    workdir: Path

    @property
    def metrics(self) -> dict:
        return self.record["metrics"]


def compose(overrides):
    return compose_config(overrides)


def run_mode(workdir: Path, mode: str, *overrides: str) -> Run:
    from huggy_exp.app import execute

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = execute(compose([f"mode={mode}", "tracking=none", *overrides]), workdir=workdir, mode=mode)
    return Run(result, json.loads((workdir / "result.json").read_text()), workdir)


def test_small_policy_is_a_meaningful_fp16_case(small):
    assert small.weights.normalizer.fp16_overflow_dims() >= 1
    assert (small.weights.obs_dim, small.weights.act_dim, small.weights.num_layers) == (8, 3, 2)


def _is_finite_or_sentinel(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (math.isfinite(value) or value == -1)


# --- every mode


# the time budgets only set how long benchmark times each point; its defaults (1 s per backend and scenario) took 8 s
SHORTER_BUDGETS = {"benchmark": ["mode.budget_s=0.2", "mode.warmup_s=0.05"]}


@pytest.mark.parametrize("mode", [m for m in MODES if m not in READS_A_RUN])
def test_every_mode_writes_finite_metrics_for_the_default_config(mode, tmp_path):
    run = run_mode(tmp_path, mode, *SHORTER_BUDGETS.get(mode, []))
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.record["mode"] == mode and run.record["model"]["synthetic"] is True
    assert run.metrics, "a mode must report at least one metric"
    identical = {k for k, v in run.metrics.items() if k.endswith("sqnr_db") and v == "inf"  # no noise: +inf dB
                 and run.metrics[k.replace("sqnr_db", "max_abs")] == 0}
    bad = {k: v for k, v in run.metrics.items() if not _is_finite_or_sentinel(v) and k not in identical}
    assert not bad, f"non-finite metrics in result.json: {bad}"
    assert not list(tmp_path.rglob("*.png")), "the harness composes with plots=false: every mode must honour it"


TIMED = ("p50_us", "p99_us", "obs_per_s")  # the headline latency figures


def test_modes_cover_the_verification_modes():
    assert {"precision", "onnx-compare", "export-onnx", "fingerprint", "stats"} <= set(MODES)


# --- precision


def test_precision_fp32_cpu_passes_on_the_embedded_default(tmp_path):
    run = run_mode(tmp_path, "precision", "obs.rows=32")
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.record["model"]["synthetic"] is True
    assert 0 < m["actions/vs_fp64/max_abs"] <= 1e-5
    assert m["actions/vs_fp32/max_abs"] == 0.0  # fp32 on the CPU is the fp32 reference
    assert m["actions/vs_fp64/cosine_min_row"] >= 0.99999
    assert m["relative/ratio"] == 1.0
    assert run.record["details"]["relative_verdict"] == "pass"
    assert run.record["details"]["first_failing_layer"] is None


@needs_shared
def test_precision_fp32_cpu_passes_on_the_mlagents_huggy_checkpoint(tmp_path):
    run = run_mode(tmp_path, "precision", f"model.checkpoint={HUGGY_PT}", *HUGGY_OBS)
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.record["model"]["synthetic"] is False and run.record["model"]["step"] == 2_000_049
    assert m["actions/vs_fp64/max_abs"] <= 1e-5
    assert m["actions/vs_fp64/nan_mismatch"] == 0 and m["actions/vs_fp64/inf_mismatch"] == 0
    assert m["relative/ratio"] == 1.0
    # the actions it measured are ML-Agents' own SimpleActor.forward outputs
    ours = np.load(run.workdir / "actions.npy")
    np.testing.assert_allclose(ours, np.load(REFERENCE / "actions_torch.npy"), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype, max_abs_limit", [("fp16", 1e-2), ("bf16", 5e-2)])
def test_precision_half_dtypes_give_finite_metrics_and_verdicts(small, tmp_path, dtype, max_abs_limit):
    run = run_mode(tmp_path, "precision", small.model, f"dtype={dtype}", "obs.rows=32")
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    bad = {k: v for k, v in m.items() if not _is_finite_or_sentinel(v)}
    assert not bad, bad
    # the normalizer stays fp32: no inf/NaN from a running_variance beyond float16's range
    assert m["layer/normalized_obs/rel_rmse"] < 1e-6
    assert 0 < m["actions/vs_fp64/max_abs"] <= max_abs_limit  # reduced precision is really in use
    assert m["layer/hidden_0/rel_rmse"] > 1e-5
    layers = {"normalized_obs", "hidden_0", "hidden_1", "mu"}
    assert run.result.details["worst_layer"] in layers
    assert run.record["details"]["worst_layer"] == run.result.details["worst_layer"]
    worst = max(layers, key=lambda name: m[f"layer/{name}/rel_rmse"])
    assert run.record["details"]["worst_layer"] == worst
    assert run.result.details["relative_verdict"] == "pass" and run.result.tags["verdict_relative"] == "pass"
    assert m["relative/ratio"] == 1.0  # on the CPU, the device is the CPU in the same dtype


def test_precision_fp16_on_the_embedded_default_keeps_the_normalizer_exact(tmp_path):
    run = run_mode(tmp_path, "precision", "dtype=fp16", "obs.rows=16")
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert m["layer/normalized_obs/rel_rmse"] < 1e-6
    assert all(_is_finite_or_sentinel(v) for v in m.values())
    assert m["actions/vs_fp64/nan_mismatch"] == 0 and m["actions/vs_fp64/inf_mismatch"] == 0


def test_precision_too_tight_action_threshold_fails_naming_max_abs(small, tmp_path):
    run = run_mode(tmp_path, "precision", small.model, "dtype=bf16", "obs.rows=32", "verify.limits.bf16.max_abs=1e-6")
    assert run.record["status"] == "failed"
    assert "max_abs" in run.record["reason"]
    assert run.record["details"]["limits"]["max_abs"] == 1e-6
    assert run.result.status == "failed"


def test_precision_too_tight_layer_threshold_names_the_first_failing_layer(small, tmp_path):
    run = run_mode(tmp_path, "precision", small.model, "dtype=bf16", "obs.rows=32", "verify.limits.bf16.layer_rel_rmse=1e-6")
    assert run.record["status"] == "failed"
    assert run.record["details"]["first_failing_layer"] == "hidden_0"
    assert "layer hidden_0" in run.record["reason"]
    assert run.record["details"]["layer_threshold"] == 1e-6


def test_precision_writes_plots_and_the_layer_table(small, tmp_path):
    run = run_mode(tmp_path, "precision", small.model, "obs.rows=16", "plots=true")
    for name in ("error_histogram.png", "layer_errors.png"):
        png = tmp_path / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in run.record["files"]
    with open(tmp_path / "layer_errors.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["layer"] for r in rows] == ["normalized_obs", "hidden_0", "hidden_1", "mu"]
    assert {"rel_rmse", "max_abs", "sqnr_db", "threshold", "finite", "exceeds"} <= set(rows[0])
    assert all(r["exceeds"] == "False" for r in rows)


def test_precision_task_run_directly_on_a_context(small, tmp_path):
    ctx = job_context(tmp_path, "device=cpu", "dtype=bf16", "batch_size=8", "seed=3", f"model.checkpoint={small.pt}",
                      "obs=random", "obs.rows=24", "plots=true")  # the limits are the config's
    result = PrecisionTask(mode_conf("precision")).run(ctx)
    assert result.status == "passed", result.reason
    assert result.metrics["relative/ratio"] == 1.0
    assert result.arrays["actions"].shape == (24, 3)
    # chunking (batch_size 8) changes nothing on the CPU: the bf16 actions equal an unchunked run's
    whole = TorchRunner(small.weights, resolve("cpu", "bf16"), 0).infer(ctx.feeds)[ACTIONS]
    np.testing.assert_array_equal(result.arrays["actions"], whole.astype(np.float32))


def test_precision_relative_verdict_fails_when_configured_below_one(small, tmp_path):
    # ratio is 1.0 on the CPU; relative.fail=0.5 must turn that into a failure naming the relative verdict
    run = run_mode(tmp_path, "precision", small.model, "obs.rows=16", "mode.relative.warn=0.25", "mode.relative.fail=0.5")
    assert run.record["status"] == "failed"
    assert run.record["details"]["relative_verdict"] == "fail"
    assert "1.00x the CPU" in run.record["reason"]


# --- onnx-compare


@pytest.fixture(scope="module")
def huggy_onnx_runs(tmp_path_factory):
    """onnx-compare on the genuine Huggy checkpoint (its sibling .onnx), run twice with the same config."""
    if not SHARED.is_dir():
        pytest.skip(f"genuine ML-Agents fixtures not found at {SHARED}")
    root = tmp_path_factory.mktemp("onnx_compare")
    return [run_mode(root / f"run{i}", "onnx-compare", f"model.checkpoint={HUGGY_PT}", *HUGGY_OBS, "plots=true") for i in range(2)]


@needs_shared
def test_onnx_compare_huggy_fp32_cpu_matches_mlagents_graph(huggy_onnx_runs):
    run = huggy_onnx_runs[0]
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.record["details"]["onnx"] == str(HUGGY_PT.with_suffix(".onnx"))
    assert m["actions/vs_onnxruntime/max_abs"] <= 1e-5
    assert m["actions/vs_onnxruntime/nan_mismatch"] == 0
    for name in ("version_number", "memory_size", "continuous_action_output_shape"):
        assert m[f"{name}/vs_expected/equal"] == 1.0
        assert run.record["details"]["constants"][name]["equal"] is True
    assert m["sampled/mean_z_max"] <= m["sampled/mean_z_crit"]
    # onnxruntime's deterministic output is ML-Agents' recorded one
    ort_ref = np.load(REFERENCE / "onnxruntime_outputs.npz")["deterministic_continuous_actions"]
    np.testing.assert_allclose(np.load(run.workdir / "onnx_actions.npy"), ort_ref, atol=1e-6, rtol=0)
    assert (run.workdir / "error_histogram.png").is_file()


@needs_shared
def test_onnx_compare_is_repeatable_run_to_run(huggy_onnx_runs):
    a, b = huggy_onnx_runs
    numeric = lambda m: {k: v for k, v in m.items() if not k.startswith("latency/") and k not in TIMED}  # noqa: E731 (timings vary)
    assert numeric(a.metrics) == numeric(b.metrics)  # includes the sampled-action statistics (onnxruntime seeded)
    np.testing.assert_array_equal(np.load(a.workdir / "onnx_actions.npy"), np.load(b.workdir / "onnx_actions.npy"))


@needs_shared
def test_onnx_compare_unknown_provider_is_an_error_listing_available_ones(tmp_path):
    run = run_mode(tmp_path, "onnx-compare", f"model.checkpoint={HUGGY_PT}", "mode.provider=NopeExecutionProvider")
    assert run.record["status"] == "error"
    assert "NopeExecutionProvider" in run.record["reason"]
    assert "CPUExecutionProvider" in run.record["reason"]
    assert not run.record["reason"].startswith("internal error")


@needs_shared
def test_onnx_compare_tampered_graph_fails(tmp_path):
    w = mlagents.load_checkpoint(HUGGY_PT).weights
    tampered = replace(w, mu=(w.mu[0], w.mu[1] + np.float32(0.5)))
    bad = tmp_path / "tampered.onnx"
    mlagents.write_onnx(tampered, bad)
    run = run_mode(tmp_path / "job", "onnx-compare", f"model.checkpoint={HUGGY_PT}", f"model.onnx={bad}", "mode.samples=64")
    assert run.record["status"] == "failed"
    assert run.record["details"]["onnx"] == str(bad)
    assert "actions: max_abs" in run.record["reason"] and "continuous_actions" not in run.record["reason"]
    assert run.metrics["actions/vs_onnxruntime/max_abs"] > 1e-2


def test_onnx_compare_small_policy_against_its_written_graph(small, tmp_path):
    run = run_mode(tmp_path, "onnx-compare", small.model, "mode.samples=128")
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.metrics["actions/vs_onnxruntime/max_abs"] <= 1e-5
    assert run.metrics["sampled/cells"] == 16 * 3


# --- export-onnx


@pytest.fixture(scope="module")
def huggy_export(tmp_path_factory):
    if not SHARED.is_dir():
        pytest.skip(f"genuine ML-Agents fixtures not found at {SHARED}")
    root = tmp_path_factory.mktemp("export")
    target = root / "out" / "x.onnx"
    run = run_mode(root / "job", "export-onnx", f"model.checkpoint={HUGGY_PT}", f"mode.path={target}", *HUGGY_OBS)
    return SimpleNamespace(run=run, path=target)


@needs_shared
def test_export_onnx_writes_to_mode_path_and_passes(huggy_export):
    run = huggy_export.run
    assert run.record["status"] == "passed", run.record["reason"]
    assert huggy_export.path.is_file()
    assert run.record["details"]["exported"] == str(huggy_export.path)
    assert run.record["files"] == [str(huggy_export.path)]  # written where asked, still an artifact
    assert not list(run.workdir.glob("*.onnx"))
    assert not (run.workdir / "Huggy.onnx").exists()
    assert run.metrics["actions/vs_torch/max_abs"] <= 1e-5
    assert run.metrics["actions/vs_source/max_abs"] <= 1e-5


@needs_shared
def test_exported_huggy_reproduces_mlagents_onnxruntime_outputs(huggy_export):
    import onnxruntime as ort

    session = ort.InferenceSession(str(huggy_export.path), providers=["CPUExecutionProvider"])
    obs = np.load(REFERENCE / "obs.npy")
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"obs_0": obs})))
    ref = np.load(REFERENCE / "onnxruntime_outputs.npz")
    np.testing.assert_allclose(outputs[ACTIONS], ref[ACTIONS], atol=1e-5, rtol=0)
    for name in ("version_number", "memory_size", "continuous_action_output_shape"):
        np.testing.assert_array_equal(outputs[name], ref[name])


@needs_shared
def test_exported_huggy_has_mlagents_interface_and_passes_the_checker(huggy_export):
    import onnx

    model = onnx.load(str(huggy_export.path))
    onnx.checker.check_model(model, full_check=True)
    dims = lambda vi: [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]  # noqa: E731
    assert [i.name for i in model.graph.input] == ["obs_0"]
    assert dims(model.graph.input[0])[1] == 59 and isinstance(dims(model.graph.input[0])[0], str)
    assert [o.name for o in model.graph.output] == [
        "version_number", "memory_size", "continuous_actions", "continuous_action_output_shape", "deterministic_continuous_actions"]
    outputs = {o.name: dims(o) for o in model.graph.output}
    for name in ("continuous_actions", "deterministic_continuous_actions"):
        batch, width = outputs[name]
        assert isinstance(batch, str) and batch, f"{name} batch dimension is not dynamic: {outputs[name]}"
        assert width == 21
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 9


@needs_shared
def test_exported_huggy_loads_back_with_the_source_weights(huggy_export):
    src = mlagents.load_checkpoint(HUGGY_PT).weights
    back = mlagents.load_onnx(huggy_export.path).weights
    assert (back.obs_dim, back.act_dim, back.num_layers, back.hidden_units) == (59, 21, 3, 512)
    assert_same_weights(back, src)
    assert back.tanh_squash is False and back.version_number == 3.0 and back.memory_size == 0.0


def test_export_onnx_default_path_is_the_behavior_name_in_the_job_dir(small, tmp_path):
    run = run_mode(tmp_path, "export-onnx", small.model)
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.record["files"] == ["Small.onnx"]
    assert (tmp_path / "Small.onnx").is_file()
    assert run.metrics["graph/vs_source/bit_identical"] == 1.0 or run.metrics["actions/vs_source/max_abs"] <= 1e-6


# --- fingerprint

HEX64 = set("0123456789abcdef")


def _fingerprint(small, workdir, *overrides):
    return run_mode(workdir, "fingerprint", small.model, "mode.steps=48", *overrides)


def test_fingerprint_is_identical_for_the_same_config(small, tmp_path):
    a, b = _fingerprint(small, tmp_path / "a"), _fingerprint(small, tmp_path / "b")
    for key in ("fingerprint", "quantized_fingerprint"):
        for run in (a, b):
            value = run.record["details"][key]
            assert isinstance(value, str) and len(value) == 64 and set(value) <= HEX64
            assert run.record["tags"][key] == value
        assert a.record["details"][key] == b.record["details"][key]


def test_fingerprint_is_the_sha256_of_the_action_bytes(small, tmp_path):
    run = _fingerprint(small, tmp_path)
    actions = np.load(tmp_path / "actions.npy")
    assert actions.dtype == np.float32 and actions.shape == (48, 3)
    assert run.record["details"]["fingerprint"] == hashlib.sha256(actions.tobytes()).hexdigest()
    q = np.rint(actions.astype(np.float64) * 1000).astype(np.int64)
    assert run.record["details"]["quantized_fingerprint"] == hashlib.sha256(q.tobytes()).hexdigest()


def test_fingerprint_changes_with_the_seed(small, tmp_path):
    a, b = _fingerprint(small, tmp_path / "a"), _fingerprint(small, tmp_path / "b", "seed=1")
    assert a.record["details"]["fingerprint"] != b.record["details"]["fingerprint"]
    assert a.record["details"]["quantized_fingerprint"] != b.record["details"]["quantized_fingerprint"]


def test_fingerprint_fp32_cpu_equals_the_cpu_fp32_fingerprint(small, tmp_path):
    run = _fingerprint(small, tmp_path)
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert m["matches_cpu_fp32"] == 1.0 and m["quantized_matches_cpu_fp32"] == 1.0
    assert m["first_divergence_step"] == -1 and m["first_divergence_dim"] == -1
    assert m["max_abs_vs_cpu_fp32"] == 0.0
    assert run.record["details"]["fingerprint"] == run.record["details"]["cpu_fp32_fingerprint"]
    assert run.record["details"]["first_divergence"] is None


def test_fingerprint_bf16_reports_where_it_diverges_but_does_not_fail(small, tmp_path):
    fp32 = _fingerprint(small, tmp_path / "fp32")
    bf16 = _fingerprint(small, tmp_path / "bf16", "dtype=bf16")
    m = bf16.metrics
    assert bf16.record["status"] == "passed", bf16.record["reason"]  # require_match is [fp32] by default
    assert m["matches_cpu_fp32"] == 0.0 and m["quantized_matches_cpu_fp32"] == 0.0
    assert bf16.record["details"]["first_quantized_divergence"] is not None
    assert bf16.record["details"]["fingerprint"] != bf16.record["details"]["cpu_fp32_fingerprint"]
    assert bf16.record["details"]["cpu_fp32_fingerprint"] == fp32.record["details"]["fingerprint"]
    # the reported first divergence is the first differing element of the two action sequences
    a, b = np.load(tmp_path / "bf16" / "actions.npy"), np.load(tmp_path / "fp32" / "actions.npy")
    step, dim = map(int, np.argwhere(a != b)[0])
    assert bf16.record["details"]["first_divergence"]["step"] == step == m["first_divergence_step"]
    assert bf16.record["details"]["first_divergence"]["dim"] == dim == m["first_divergence_dim"]
    assert bf16.record["details"]["first_divergence"]["abs"] == pytest.approx(abs(float(a[step, dim]) - float(b[step, dim])))


def test_fingerprint_fails_when_bf16_is_required_to_match(small, tmp_path):
    run = _fingerprint(small, tmp_path, "dtype=bf16", "mode.require_match=[bf16]")
    assert run.record["status"] == "failed"
    assert "quantized fingerprint differs" in run.record["reason"]


def test_fingerprint_closed_loop(small, tmp_path):
    closed = _fingerprint(small, tmp_path / "closed", "mode.loop=closed", "mode.envs=2")
    open_ = _fingerprint(small, tmp_path / "open")
    assert closed.record["status"] == "passed", closed.record["reason"]
    assert closed.record["details"]["loop"] == "closed"
    assert closed.metrics["steps"] == 48 and closed.metrics["matches_cpu_fp32"] == 1.0
    assert np.load(tmp_path / "closed" / "actions.npy").shape == (48, 2, 3)
    assert closed.record["details"]["fingerprint"] != open_.record["details"]["fingerprint"]
    again = _fingerprint(small, tmp_path / "again", "mode.loop=closed", "mode.envs=2")
    assert again.record["details"]["fingerprint"] == closed.record["details"]["fingerprint"]


def test_quantize_maps_signed_zeros_to_the_same_ints():
    q = quantize(np.array([-0.0, 0.0, -0.0001, 0.0001], np.float32), 3)
    assert q.dtype == np.int64
    assert q.tolist() == [0, 0, 0, 0]
    assert quantize(np.array([-0.0]), 3).tobytes() == quantize(np.array([0.0]), 3).tobytes()
    assert quantize(np.array([0.0014, 0.0016, -0.9996, 1.0]), 3).tolist() == [1, 2, -1000, 1000]


def test_quantize_gives_non_finite_and_huge_values_codes_of_their_own_without_an_undefined_cast():
    import warnings

    from huggy_exp.verify import QUANT_LIMIT, QUANT_NAN, QUANT_NEG_INF, QUANT_POS_INF

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy warns on the undefined float -> int64 cast of NaN or of 1e300
        q = quantize(np.array([np.nan, -np.inf, np.inf, 1e300, -1e300, 2.5e-6], np.float64), 6)
    assert q.tolist() == [QUANT_NAN, QUANT_NEG_INF, QUANT_POS_INF, QUANT_LIMIT, -QUANT_LIMIT, 2]
    assert len(set(q[:5].tolist())) == 5  # NaN, -inf, +inf and the saturated ends are told apart


def test_first_divergence_on_hand_made_sequences():
    a = np.zeros((4, 2, 3), np.float32)
    assert first_divergence(a, a.copy()) is None
    b = a.copy()
    b[2, 0, 0] = 1.0
    b[1, 1, 2] = -0.25  # earlier step, second env, third action
    assert first_divergence(a, b) == (1, 2, 0.25)
    c = a.copy()
    c[3, 0, 1] = 0.5
    assert first_divergence(a, c) == (3, 1, 0.5)


# --- stats


def _stats(small, workdir, *overrides):
    return run_mode(workdir, "stats", small.model, "mode.steps=40", "mode.envs=4", *overrides)


def test_stats_fp32_cpu_has_no_drift(small, tmp_path):
    run = _stats(small, tmp_path, "plots=true")
    m = run.metrics
    assert run.record["status"] == "passed", run.record["reason"]
    assert m["drift_max"] == 0.0 and m["drift_first_step"] == -1 and m["obs_drift_max"] == 0.0
    assert m["steps"] == 40 and m["envs"] == 4
    assert (tmp_path / "drift.png").is_file() and (tmp_path / "actions.png").is_file()


def test_stats_bf16_drifts_from_cpu_fp32(small, tmp_path):
    run = _stats(small, tmp_path, "dtype=bf16")
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.metrics["drift_max"] > 0
    assert run.metrics["obs_drift_max"] > 0  # the error feeds back into what the policy sees


def test_stats_per_dimension_table(small, tmp_path):
    _stats(small, tmp_path)
    with open(tmp_path / "action_stats.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == small.weights.act_dim
    assert set(rows[0]) == {"dim", "mean", "std", "min", "max", "saturation_rate", "smoothness"}
    actions = np.load(tmp_path / "actions.npy").astype(np.float64)  # [T, envs, act]
    assert actions.shape == (40, 4, 3)
    for j, row in enumerate(rows):
        a = actions[..., j]
        assert int(row["dim"]) == j
        assert float(row["mean"]) == pytest.approx(a.mean())
        assert float(row["std"]) == pytest.approx(a.std())
        assert float(row["min"]) == pytest.approx(a.min()) and float(row["max"]) == pytest.approx(a.max())
        assert float(row["smoothness"]) == pytest.approx(np.abs(np.diff(a, axis=0)).mean())
        assert 0.0 <= float(row["saturation_rate"]) <= 1.0


def test_stats_extreme_observations_hit_the_normalizer_clamp(small, tmp_path):
    run = _stats(small, tmp_path, "obs=extreme")
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.metrics["normalizer_clamp_rate"] > 0


def test_stats_replay_of_a_trajectory(small, tmp_path):
    trajectory = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32) * 50
    path = tmp_path / "traj.npy"
    np.save(path, trajectory)
    run = run_mode(tmp_path / "job", "stats", small.model, "mode.source=replay", f"mode.trajectory={path}")
    assert run.record["status"] == "passed", run.record["reason"]
    assert run.metrics["steps"] == 20 and run.metrics["envs"] == 1
    expected = TorchRunner(small.weights, resolve("cpu", "fp32")).infer({OBS: trajectory})[ACTIONS]
    np.testing.assert_array_equal(np.load(tmp_path / "job" / "actions.npy")[:, 0, :], expected.astype(np.float32))


def test_stats_replay_of_the_wrong_width_is_an_error_naming_the_expected_width(small, tmp_path):
    path = tmp_path / "traj.npy"
    np.save(path, np.zeros((20, 7), np.float32))
    run = run_mode(tmp_path / "job", "stats", small.model, "mode.source=replay", f"mode.trajectory={path}")
    assert run.record["status"] == "error"
    assert "expected [N, 8]" in run.record["reason"]


def test_stats_drift_fail_zero_fails_bf16(small, tmp_path):
    run = _stats(small, tmp_path, "dtype=bf16", "mode.drift_fail=0.0")
    assert run.record["status"] == "failed"
    assert "drift" in run.record["reason"]


def test_dynamics_rollout_is_deterministic(small):
    w = small.weights
    start = np.random.default_rng(1).standard_normal((3, w.obs_dim)).astype(np.float32) * w.normalizer.std + w.normalizer.running_mean
    policy = lambda obs: TorchRunner(w, resolve("cpu", "fp32")).infer({OBS: obs})[ACTIONS].astype(np.float32)  # noqa: E731
    o1, a1 = Dynamics(seed=4).rollout(policy, start, 25, w.normalizer, w.act_dim)
    o2, a2 = Dynamics(seed=4).rollout(policy, start, 25, w.normalizer, w.act_dim)
    assert o1.shape == (25, 3, 8) and a1.shape == (25, 3, 3) and o1.dtype == np.float32
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(a1, a2)
    o3, _ = Dynamics(seed=5).rollout(policy, start, 25, w.normalizer, w.act_dim)
    assert not np.array_equal(o1[1:], o3[1:])  # another seed, another world


def test_dynamics_actions_change_the_next_observations(small):
    w = small.weights
    n = w.normalizer
    start = np.tile(n.running_mean, (2, 1)).astype(np.float32)
    dyn = Dynamics(decay=0.9, gain=0.5, noise=0.3, seed=0)
    zeros = lambda obs: np.zeros((len(obs), w.act_dim), np.float32)  # noqa: E731
    ones = lambda obs: np.ones((len(obs), w.act_dim), np.float32)  # noqa: E731
    o0, _ = dyn.rollout(zeros, start, 5, n, w.act_dim)
    o1, _ = dyn.rollout(ones, start, 5, n, w.act_dim)
    np.testing.assert_array_equal(o0[0], o1[0])  # same start
    assert np.all(np.any(o0[1:] != o1[1:], axis=-1))  # every later step, every env differs
    # one step: the difference is gain * B @ (1 - 0) in normalized units, B's columns unit-norm from PCG64(seed)
    b = np.random.Generator(np.random.PCG64(0)).standard_normal((w.obs_dim, w.act_dim))
    b /= np.linalg.norm(b, axis=0, keepdims=True)
    dz = (o1[1].astype(np.float64) - o0[1].astype(np.float64)) / n.std.astype(np.float64)
    np.testing.assert_allclose(dz, np.tile(0.5 * b.sum(axis=1), (2, 1)), rtol=1e-3, atol=1e-3)


# --- knob errors are user errors (one line), not internal errors


@pytest.mark.parametrize(
    "mode, overrides, expected",
    [
        ("stats", ["mode.source=replay"], "mode.trajectory"),
        ("stats", ["mode.source=sideways"], "mode.source"),
        ("fingerprint", ["mode.loop=sideways"], "mode.loop"),
    ],
)
def test_invalid_mode_knobs_are_user_errors_not_internal_errors(small, tmp_path, mode, overrides, expected):
    run = run_mode(tmp_path, mode, small.model, *overrides)
    assert run.record["status"] == "error"
    assert expected in run.record["reason"]
    assert not run.record["reason"].startswith("internal error"), run.record["reason"]


def test_plotting_modes_work_in_a_job_dir_that_does_not_exist_yet(small, tmp_path):
    """execute() creates the job dir for result.json; the plots must not need it to exist beforehand."""
    from huggy_exp.app import execute

    workdir = tmp_path / "fresh" / "job"
    result = execute(compose(["mode=precision", "tracking=none", small.model, "obs.rows=8", "plots=true"]), workdir=workdir, mode="precision")
    assert result.status == "passed", result.reason
    assert (workdir / "error_histogram.png").is_file()


def test_plots_false_draws_no_png_and_changes_no_verdict_or_metric(small, tmp_path):
    """`plots=false` (big sweeps; the test harness's default) skips the PNGs and nothing else."""
    drawn = run_mode(tmp_path / "on", "precision", small.model, "obs.rows=16", "plots=true")
    plain = run_mode(tmp_path / "off", "precision", small.model, "obs.rows=16", "plots=false")
    assert {p.name for p in (tmp_path / "on").glob("*.png")} == {"error_histogram.png", "layer_errors.png"}
    assert not list((tmp_path / "off").glob("*.png"))
    assert plain.record["status"] == drawn.record["status"] == "passed"
    timing = ("latency/", "p50_us", "p90_us", "p95_us", "p99_us", "obs_per_s", "noisy", "mean_us", "min_us", "max_us", "iqr_us")
    untimed = [{k: v for k, v in r.record["metrics"].items() if not k.startswith(timing)} for r in (plain, drawn)]
    assert untimed[0] == untimed[1] and len(untimed[0]) > 20
