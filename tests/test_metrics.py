"""Metric names have one owner (config.py's `Metric` and each mode's `Headline`s): every metric a headline names is
produced by a real job, so a misspelt or renamed path fails here, not silently in a user's headline and MLflow."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import run_job
from huggy_exp import config, headline
from huggy_exp.config import Headline, Metric

FAST_LATENCY = ["mode.latency.budget_s=0.03", "mode.latency.warmup_s=0.005", "mode.latency.max_samples=40"]
SHORT_BENCHMARK = ["mode.budget_s=0.05", "mode.rounds=1", "mode.warmup_s=0.01", "mode.settle_s=0", "mode.min_duration_ms=50",
                   "mode.min_query_count=64", "mode.qsl_samples=64", "mode.check_samples=16", "mode.search_steps=2",
                   "mode.search_ms=50", "mode.duration_s=0.2", "mode.loop_search_s=0.1", "mode.rate_hz=100",
                   "mode.latency_bound_ms=1000", "mode.scenarios=[single_stream,server,control_loop]"]
ROWS = ["obs.rows=8", "batch_size=8"]


@pytest.fixture(scope="module")
def produced(tmp_path_factory, small, results_folder, shaped_files) -> dict[str, set[str]]:
    """Every metric path each mode's jobs wrote: every task mode on the small policy, benchmark with LoadGen's server
    and the control loop, a results folder with rewards, a discrete and a memory policy, an int8 point (onnxruntime's int8 beside it), a replay and a
    diff of a recording (fp32 and bf16, replayed in bf16: agreement, dual benchmark, latency)."""
    root = tmp_path_factory.mktemp("metrics")
    bundle = root / "bundle"
    jobs = [(m, [small.model, *ROWS]) for m in config.modes() if config.modes()[m].is_task()
            and m not in ("benchmark", "checkpoints", "record", "replay", "diff")]
    jobs += [("benchmark", [small.model, *SHORT_BENCHMARK, "obs.rows=8", "batch_size=4"]),
             ("checkpoints", [f"model.results_dir={results_folder}"]),
             ("record", [small.model, f"mode.out={bundle}", *FAST_LATENCY, *ROWS]),
             ("record", [small.model, f"mode.out={bundle}", *FAST_LATENCY, *ROWS, "dtype=bf16"]),
             ("replay", [small.model, f"mode.bundle={bundle}", *FAST_LATENCY, *ROWS, "dtype=bf16"]),
             ("diff", [f"mode.baseline={bundle}", f"mode.candidate={bundle}"]),
             ("action", [f"model.checkpoint={shaped_files['branches'][0]}", *ROWS]),
             ("sample", [f"model.checkpoint={shaped_files['memory_discrete'][0]}", *ROWS]),
             ("action", [small.model, "dtype=int8", *ROWS])]
    out: dict[str, set[str]] = {}
    for i, (mode, overrides) in enumerate(jobs):
        job = run_job(root / f"{i}-{mode}", mode, *overrides)
        assert job.record["status"] in ("passed", "failed"), (mode, job.record["reason"])
        out.setdefault(mode, set()).update(job.record["metrics"])
    return out


def pattern(metric: Metric) -> re.Pattern:
    """The paths a metric with open fields names (`{stem}/vs_fp64/max_abs` matches `actions/vs_fp64/max_abs`)."""
    return re.compile("[^/]+".join(re.escape(part) for part in re.split(r"\{\w+\}", metric.path)))


def unproduced(heads: dict[str, Headline], paths: set[str]) -> list[str]:
    """The headline names none of whose metrics (nor, for a ratio, its divisor's) matches a produced path."""
    def found(of) -> bool:
        return any(pattern(m).fullmatch(p) for m in of for p in paths)

    return [name for name, head in heads.items() if not found(head.of) or head.over and not found(head.over)]


def test_every_headline_metric_is_produced_by_its_mode(produced):
    missing = {mode: unproduced(schema.headline, produced[mode]) for mode, schema in config.modes().items()
               if schema.is_task()}
    assert not any(missing.values()), missing


def test_what_mlflow_does_not_get_is_a_headline_of_the_mode():
    assert all(set(schema.not_logged) <= set(schema.headline) for schema in config.modes().values())


def test_every_headline_of_every_inference_point_is_produced_by_some_job(produced):
    everything = set().union(*produced.values())
    assert not unproduced(headline.ANY_MODE, everything)


def test_a_misspelt_headline_metric_fails_the_check(produced, monkeypatch):
    heads = dict(config.BatchMode.headline)
    heads["invariance_max"] = config.own("batch_invariance_maxabs", "output units", "a typo")
    monkeypatch.setattr(config.BatchMode, "headline", heads)
    assert unproduced(config.BatchMode.headline, produced["batch"]) == ["invariance_max"]
    any_mode = {**headline.ANY_MODE, "kl_vs_fp64": Headline((config.KL_MAX.at(ref="fp46"),))}
    assert unproduced(any_mode, set().union(*produced.values())) == ["kl_vs_fp64"]


def test_a_metric_field_it_lacks_is_an_error():
    assert config.MAX_ABS.at(ref="fp64").path == "{stem}/vs_fp64/max_abs"
    with pytest.raises(KeyError, match="no field backend"):
        config.MAX_ABS.at(backend="eager")


# --- SQNR: in every comparison and result.json; in MLflow only in the room the answer leaves


def _precision_record(sqnr: float, extra: int = 0) -> dict:
    metrics = {"actions/vs_fp64/max_abs": 1e-7, "actions/vs_fp64/max_abs_limit": 1e-5, "actions/vs_fp64/sqnr_db": sqnr,
               "actions/vs_fp64/cosine_min_row": 0.9999999, "actions/vs_fp64/cosine_min_row_limit": 0.99999,
               **{"eager/b64/p50_us": 10.0, "eager/b64/obs_per_s": 1e5}, **{f"x{i}/b64/p50_us": 20.0 + i for i in range(extra)},
               **{f"x{i}/b64/obs_per_s": 1e3 for i in range(extra)}}
    return {"mode": "precision", "status": "passed", "batch_size": 64, "metrics": metrics}


def test_sqnr_goes_to_mlflow_only_where_it_replaces_nothing():
    logged = headline.logged_metrics(_precision_record(42.123456))
    assert logged["vs_fp64/actions/sqnr_db"] == 42.1 and list(logged)[-1] == "vs_fp64/actions/sqnr_db"
    assert "vs_fp64/actions/sqnr_db" not in headline.logged_metrics(_precision_record(float("inf")))  # identical: not logged
    crowded = headline.logged_metrics(_precision_record(42.0, extra=8))
    assert len(crowded) == headline.MAX_LOGGED and "vs_fp64/actions/sqnr_db" not in crowded
    assert {"answer/passed", "answer/max_abs", "answer/cosine"} <= set(crowded)  # the answer keeps its place


def test_identical_outputs_have_infinite_sqnr_in_result_json_and_pass(tmp_path, small):
    job = run_job(tmp_path, "precision", small.model, *ROWS)  # cpu fp32 eager: its own fp32 reference, bit for bit
    m = job.record["metrics"]
    assert job.record["status"] == "passed" and m["actions/vs_fp32/max_abs"] == 0.0
    assert m["actions/vs_fp32/sqnr_db"] == "inf" and 60 < m["actions/vs_fp64/sqnr_db"] < 400  # JSON has no inf: "inf"
    assert json.loads((tmp_path / "result.json").read_text(), parse_constant=_refuse)  # strict JSON, no Infinity token
    rows = job.result.tables["layer_errors"]
    assert all(r["sqnr_db"] > 60 for r in rows) and all(m[f"layer/{r['layer']}/sqnr_db"] == r["sqnr_db"] for r in rows)


def _refuse(token: str):
    raise AssertionError(f"result.json holds {token}, which JSON has not")


def test_one_ulp_a_replay_and_the_engine_count_alike():
    """One definition (verify.ulp): |a - e| in units of e's last place; below a power of two both say half a ULP."""
    from huggy_exp import certify, verify

    e = np.array([1.0, 3.0, -2.0, 0.0], np.float32)
    a = np.array([np.nextafter(np.float32(1), np.float32(0)), np.nextafter(np.float32(3), np.float32(4)), -2.0, -0.0],
                 np.float32)
    assert certify.bitwise(a, e)["ulp_max"] == verify.elementwise(a, e, dtype="fp32")["ulp_max"] == 1.0
    assert certify.bitwise(a[:1], e[:1])["ulp_max"] == 0.5
