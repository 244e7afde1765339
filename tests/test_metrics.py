"""Metric names have one owner (config.py's `Metric` and each mode's `Headline`s): every metric a headline names is
produced by a real job, so a misspelt or renamed path fails here, not silently in a user's headline and MLflow."""

from __future__ import annotations

import re

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
