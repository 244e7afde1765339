"""mode=rejudge (issue 35): stored results judged again by the limits as composed now, without running the policy;
every verdict that changed listed; a figure the new limits need and the record lacks refused by name; the originals
never written; MLflow gets a new parent whose children name the runs they re-judge."""

from __future__ import annotations

import copy
import shutil
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import compose_config, run_job

from huggy_exp import app, bundle
from huggy_exp.errors import UserError
from huggy_exp.rejudge import rejudge

LIMITS = {"fp32": {"max_abs": 1e-5, "cosine_min": 0.99999, "margin": 1e-5, "rtol": 0.0, "kl_max": 0.01,
                   "mean_shift_max": 0.1, "batch_max_abs": 1e-5, "layer_rel_rmse": 1e-5}}


def record(status="passed", reason="", **metrics) -> dict:
    base = {"actions/vs_fp64/max_abs": 5e-6, "actions/vs_fp64/max_abs_limit": 1e-5,
            "actions/vs_fp64/cosine_min_row": 0.999999, "actions/vs_fp64/cosine_min_row_limit": 0.99999,
            "actions/vs_fp64/kl_max": 1e-9, "actions/vs_fp64/kl_max_limit": 0.01}
    return {"run_name": "p", "dtype": "fp32", "device": "cpu", "status": status, "reason": reason,
            "metrics": {**base, **metrics}}


def limits(**row) -> dict:
    return {"fp32": {**LIMITS["fp32"], **row}}


def test_a_tightened_limit_fails_a_point_that_passed_and_names_the_check():
    got = rejudge(record(), limits(max_abs=1e-6), {}, "p")
    assert got["status"] == "failed" and got["reason"] == "actions/vs_fp64/max_abs 5e-06 > 1e-06 (re-judged)"
    assert got["changed"][0] == {"check": "actions/vs_fp64/max_abs", "value": 5e-6, "op": "<=", "was": 1e-5, "now": 1e-6,
                                 "held_before": True, "holds_now": False}
    assert rejudge(record(), limits(cosine_min=0.9999999), {}, "p")["status"] == "failed"  # held at least, not at most


def test_a_loosened_limit_passes_a_point_that_failed_only_by_it():
    failed = record("failed", "vs cpu fp64: actions: max_abs 5e-05 > atol 1e-05 (3 elements)",
                    **{"actions/vs_fp64/max_abs": 5e-5})
    assert rejudge(failed, limits(max_abs=1e-4), {}, "p")["status"] == "passed"


def test_a_failure_no_limit_decided_stands_whatever_the_limits():
    nan = record("failed", "vs cpu fp64: actions: 3 NaN/Inf values (first at [0, 1])")  # no judged figure failed
    assert rejudge(nan, limits(max_abs=1.0), {}, "p") | {"changed": []} == {
        "status": "failed", "reason": nan["reason"], "checks": 3, "changed": [], "rejudged": True,
        "limits": {"actions/vs_fp64/max_abs_limit": 1.0, "actions/vs_fp64/cosine_min_row_limit": 0.99999,
                   "actions/vs_fp64/kl_max_limit": 0.01}}
    both = record("failed", "vs cpu fp64: actions: max_abs 5e-05 > atol 1e-05 (3 elements); backend compile: failed",
                  **{"actions/vs_fp64/max_abs": 5e-5})
    got = rejudge(both, limits(max_abs=1e-4), {}, "p")
    assert got["status"] == "failed" and got["reason"] == "backend compile: failed"


def test_a_device_exception_of_the_table_applies_as_when_the_point_ran():
    on_npu = {**record(), "device": "npu:0"}
    assert rejudge(on_npu, limits(), {"npu_fp32": {"max_abs": 1e-6}}, "p")["status"] == "failed"
    assert rejudge(record(), limits(), {"npu_fp32": {"max_abs": 1e-6}}, "p")["status"] == "passed"


def test_a_layer_limit_is_re_judged_on_precision_points():
    layered = record(**{"layer/hidden_0/rel_rmse": 3e-6, "layer/hidden_0/rel_rmse_limit": 1e-5})
    got = rejudge(layered, limits(layer_rel_rmse=1e-6), {}, "p")
    assert got["status"] == "failed" and "layer/hidden_0/rel_rmse 3e-06 > 1e-06" in got["reason"]


@pytest.mark.parametrize("change, metrics, needs", [
    ({"max_abs": 1e-6}, {"actions/vs_fp64/max_abs": None}, "actions/vs_fp64/max_abs is missing"),
    ({"max_abs": 1e-6, "rtol": 1e-3}, {}, "rtol=0.001 needs every element's error"),
    ({"margin": 1e-3}, {"discrete_actions/vs_fp64/flips": 2.0, "discrete_actions/vs_fp64/margin_limit": 1e-5},
     "needs its masked-logit margin"),
    ({"max_abs": 1e-6}, {"memories/vs_fp64/max_abs": 1e-6, "memories/vs_fp64/max_abs_limit": 2e-5},
     "memories/vs_fp64/max_abs_scale is missing"),
])
def test_what_the_stored_figures_cannot_decide_is_refused_by_name(change, metrics, needs):
    stored = record(**metrics)
    stored["metrics"] = {k: v for k, v in stored["metrics"].items() if v is not None}
    with pytest.raises(UserError, match=needs):
        rejudge(stored, limits(**change), {}, "p")


def test_a_memory_limit_is_re_judged_at_its_own_scale():
    stored = record(**{"memories/vs_fp64/max_abs": 3e-5, "memories/vs_fp64/max_abs_limit": 4e-5,
                       "memories/vs_fp64/max_abs_scale": 4.0})
    assert rejudge(stored, limits(max_abs=5e-6), {}, "p")["status"] == "failed"  # 3e-5 > 5e-6 x 4
    assert rejudge(stored, limits(max_abs=1e-5), {}, "p")["status"] == "passed"


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_rejudge_of_a_stored_precision_sweep_flips_fp16_and_keeps_the_originals(tmp_path, small):
    sweep = tmp_path / "multirun" / "sweep"
    for num, dtype in enumerate(("fp32", "fp16")):
        run_job(sweep / str(num), "precision", small.model, f"dtype={dtype}", "obs.rows=16", "plots=false")
    before = digest(sweep)
    cfg = compose_config(["mode=rejudge", f"mode.path={sweep}", "verify.limits.fp16.max_abs=1e-4", "tracking=none",
                          "plots=false", "model.checkpoint=/nonexistent/never-loaded.pt"])  # the policy is never loaded
    out = tmp_path / "rejudged"
    assert app.rejudge(cfg, out) == 1  # the worst re-judged verdict: failed
    assert digest(sweep) == before  # the originals: read, never written
    summary = json.loads((out / "summary.json").read_text())
    assert [c["run_name"] for c in summary["changed"]] == ["precision-cpu-fp16-b64"]
    assert summary["changed"][0]["was"] == "passed" and summary["changed"][0]["now"] == "failed"
    assert "precision-cpu-fp16-b64 passed → failed" in summary["line"] and (out / "report.html").is_file()
    points = {json.loads(p.read_text())["dtype"]: json.loads(p.read_text()) for p in out.glob("*/result.json")}
    assert points["fp16"]["status"] == "failed" and points["fp32"]["status"] == "passed"
    assert points["fp16"]["metrics"]["actions/vs_fp64/max_abs_limit"] == 1e-4  # shown beside the limit it now misses
    assert points["fp16"]["tags"]["rejudged_from"] == str(sweep / "1") and (out / "1" / "actions.npy").is_file()


def test_rejudge_refuses_a_folder_without_results_and_one_whose_figures_are_missing(tmp_path, small, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = compose_config(["mode=rejudge", f"mode.path={empty}", "tracking=none"])
    assert app.rejudge(cfg, tmp_path / "out") == 2
    assert "no result.json under it" in capsys.readouterr().err
    job = run_job(tmp_path / "job", "precision", small.model, "obs.rows=8", "plots=false")
    stored = copy.deepcopy(job.record)
    del stored["metrics"]["actions/vs_fp64/max_abs"]
    (job.workdir / "result.json").write_text(json.dumps(stored))
    cfg = compose_config(["mode=rejudge", f"mode.path={job.workdir}", "tracking=none"])
    assert app.rejudge(cfg, tmp_path / "out2") == 2
    assert "actions/vs_fp64/max_abs is missing beside actions/vs_fp64/max_abs_limit" in capsys.readouterr().err


def test_rejudge_logs_a_new_parent_whose_children_name_the_runs_they_re_judge(tmp_path, small):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").mkdir()
    job = run_job(tmp_path / "jobs" / "0", "precision", small.model, "dtype=fp16", "obs.rows=8", "plots=false",
                  tracking=uri)
    original = job.record["tracking"]["run_id"]
    cfg = compose_config(["mode=rejudge", f"mode.path={tmp_path / 'jobs'}", "verify.limits.fp16.max_abs=1e-4",
                          "tracking=mlflow", f"tracking.uri={uri}", "plots=false"])
    assert app.rejudge(cfg, tmp_path / "out") == 1
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    children = [r for r in runs if r.data.tags.get("rejudged_from_run_id") == original]
    assert len(children) == 1 and children[0].data.tags["status"] == "failed"
    parent = client.get_run(children[0].data.tags["mlflow.parentRunId"])
    assert "precision-cpu-fp16-b64 passed → failed" in parent.data.tags["mlflow.note.content"]
    assert client.get_run(original).data.tags["status"] == "passed"  # the original run is not touched


def test_a_plan_point_is_re_judged_by_its_plans_limits_dtype():
    planned = {**record(**{"actions/vs_fp64/max_abs": 5e-3}), "plan": {"name": "p", "hash": "h", "limits": "bf16"}}
    table = {**limits(), "bf16": {**LIMITS["fp32"], "max_abs": 5e-2}}
    assert rejudge(planned, table, {}, "p")["status"] == "passed"  # bf16's 5e-2, not the point's fp32 1e-5
    with pytest.raises(UserError, match="records no limits dtype"):
        rejudge({**planned, "plan": {"name": "p", "hash": None}}, table, {}, "p")


# --- a port bundle (mode=record's folder): its points judged again from their own arrays


FAST = ["mode.latency.budget_s=0.03", "mode.latency.warmup_s=0.005", "mode.latency.max_samples=40"]


@pytest.fixture(scope="module")
def small_bundle(small, tmp_path_factory) -> Path:
    """The small policy recorded in fp32 and fp16 (16 rows) into one bundle."""
    root = tmp_path_factory.mktemp("rejudge_bundle")
    for dtype in ("fp32", "fp16"):
        job = run_job(root / dtype, "record", f"mode.out={root / 'bundle'}", small.model, f"dtype={dtype}",
                      "obs.rows=16", "batch_size=16", *FAST)
        assert job.record["status"] == "passed", job.record["reason"]
    return root / "bundle"


def rejudge_bundle(path: Path, out: Path, *overrides: str) -> int:
    cfg = compose_config(["mode=rejudge", f"mode.path={path}", "tracking=none", "plots=false", *overrides,
                          "model.checkpoint=/nonexistent/never-loaded.pt"])
    return app.rejudge(cfg, out)


def never_built(monkeypatch) -> None:
    from huggy_exp.policy import Policy

    def refuse(*args, **kwargs):
        raise AssertionError("mode=rejudge built the policy")

    monkeypatch.setattr(Policy, "__init__", refuse)


def test_a_bundle_is_re_judged_from_its_arrays_and_a_tightened_fp16_limit_flips_its_point(small_bundle, tmp_path,
                                                                                           monkeypatch):
    from mlflow.tracking import MlflowClient

    never_built(monkeypatch)
    before = digest(small_bundle)
    assert rejudge_bundle(small_bundle, tmp_path / "as_recorded") == 0  # the limits it was recorded under: no change
    summary = json.loads((tmp_path / "as_recorded" / "summary.json").read_text())
    assert summary["changed"] == [] and summary["tally"]["passed"] == 2
    points = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "as_recorded").glob("*/result.json")}
    fp16 = next(p for p in points.values() if p["dtype"] == "fp16")
    recorded = json.loads((small_bundle / "points" / "cpu-fp16-eager-b16" / "comparison.json").read_text())
    assert fp16["metrics"]["actions/vs_fp64/max_abs"] == recorded["outputs"]["actions"]["max_abs"]  # the one engine
    assert fp16["metrics"]["actions/vs_fp64/kl_max_limit"] == 0.01  # judged in the policy's units too (σ recorded)
    b = bundle.read(small_bundle)  # replay and diff read the outputs alone, as before
    assert set(b.outputs("cpu/fp16/eager/b16")) == {"actions"} and set(b.reference()) == {"actions"}
    assert set(b.outputs("cpu/fp16/eager/b16", distributions=True)) == {"actions", "mu", "log_sigma"}
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    (tmp_path / "mlruns").mkdir()
    out = tmp_path / "tight"
    assert rejudge_bundle(small_bundle, out, "verify.limits.fp16.max_abs=1e-4", "tracking=mlflow",
                          f"tracking.uri={uri}") == 1
    changed = (out / "changed.csv").read_text().splitlines()
    assert len(changed) == 2 and changed[1].startswith("cpu/fp16/eager/b16,record-cpu-fp16-eager-b16,passed,failed,"
                                                       "vs cpu fp64: actions: max_abs ")
    assert "actions/vs_fp64/max_abs" in changed[1] and "limit 0.01 → 0.0001" in changed[1]
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    child = next(r for r in runs if r.data.tags.get("rejudged_point") == "cpu/fp16/eager/b16")
    assert child.data.tags["rejudged_from"] == str(small_bundle) and child.data.tags["status"] == "failed"
    assert "mlflow.parentRunId" in child.data.tags
    assert rejudge_bundle(small_bundle, tmp_path / "special", "+verify.specialize.cpu_fp16.max_abs=1e-4") == 1
    assert digest(small_bundle) == before  # the bundle: read, never written


def rehashed(bundle_dir: Path, name: str, change) -> None:
    """`name` rewritten by change(arrays) -> arrays, and the manifest made to list it again (a consistent bundle)."""
    path = bundle_dir / name
    with np.load(path, allow_pickle=False) as data:
        arrays = change({k: data[k] for k in data.files})
    path.write_bytes(bundle.npz_bytes(arrays))
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": bundle.sha256_file(path), "bytes": path.stat().st_size}
    (bundle_dir / "manifest.json").write_text(json.dumps(manifest))


def test_a_damaged_bundle_and_one_recorded_before_this_mode_are_refused_in_one_line(small_bundle, tmp_path, capsys):
    damaged = Path(shutil.copytree(small_bundle, tmp_path / "damaged"))
    (damaged / "points" / "cpu-fp16-eager-b16" / "outputs.npz").write_bytes(b"PK" + bytes(40))
    assert rejudge_bundle(damaged, tmp_path / "out1") == 2
    err = capsys.readouterr().err
    assert "points/cpu-fp16-eager-b16/outputs.npz" in err and len(err.strip().splitlines()) == 1
    older = Path(shutil.copytree(small_bundle, tmp_path / "older"))
    rehashed(older, "reference_fp64.npz", lambda a: {k: v for k, v in a.items() if k not in ("mu", "log_sigma")})
    assert rejudge_bundle(older, tmp_path / "out2") == 2
    err = capsys.readouterr().err
    assert "KL and |Δμ|/σ (fp64's mu and log_sigma) not in the bundle" in err and "re-record it" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out2" / "summary.json").exists()


def test_a_nan_in_a_bundle_point_fails_it_whatever_the_limits(small_bundle, tmp_path):
    poisoned = Path(shutil.copytree(small_bundle, tmp_path / "poisoned"))
    rehashed(poisoned, "points/cpu-fp32-eager-b16/outputs.npz",
             lambda a: {**a, "actions": np.where(np.arange(a["actions"].size).reshape(a["actions"].shape) == 3, np.nan,
                                                 a["actions"]).astype(np.float32)})
    assert rejudge_bundle(poisoned, tmp_path / "out", "verify.limits.fp32.max_abs=1.0") == 1
    point = next(json.loads(p.read_text()) for p in (tmp_path / "out").glob("*/result.json")
                 if json.loads(p.read_text())["dtype"] == "fp32")
    assert point["status"] == "failed" and "1 NaN/Inf values" in point["reason"]


def test_a_new_discrete_margin_is_decided_from_the_bundles_logits():
    """A flip where fp64's best masked logit leads by 0.05: excused by a margin of 0.1, not by 0.01 (result.json could
    not decide it: it keeps no flip's margin)."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from huggy_exp.rejudge import bundle_points
    from huggy_exp.verify import Limits

    logits = np.array([[1.0, 1.05, -1.0], [2.0, 0.0, 0.0]])  # row 0: a near tie, row 1: a clear lead
    reference = {"discrete_actions": np.array([[1], [0]]), "masked_logits": logits}
    point = {"device": "cpu", "dtype": "bf16", "backend": "eager", "batch": 2, "fingerprints": {}, "latency": {},
             "judged": {"dtype": "bf16", "row": "bf16", "limits": asdict(Limits.of({**LIMITS["fp32"], "margin": 0.1}))}}
    flipped = {"discrete_actions": np.array([[0], [0]]), "masked_logits": logits}
    b = SimpleNamespace(root=Path("b"), points={"cpu/bf16/eager/b2": point}, reference=lambda distributions: reference,
                        outputs=lambda key, distributions: flipped,
                        manifest={"model": {"dims": {"branch_sizes": [3]}}, "observations": {}, "format_version": 3})
    table = {"bf16": {**LIMITS["fp32"], "margin": 0.1}}  # as recorded
    [(key, was, now)] = bundle_points(b, table, {}, 1e-3)
    assert was["status"] == "passed" and now["status"] == "passed" and now["changed"] == []
    table["bf16"]["margin"] = 0.01
    [(key, was, now)] = bundle_points(b, table, {}, 1e-3)
    assert now["status"] == "failed" and "1 of 2 actions differ" in now["reason"]
