"""The design card's first command, `-m dtype=fp32,fp16,bf16` of the default mode, on every kind of policy: each point
carries errors and cosine vs CPU fp64 and fp32, a verdict with its limit, latency and a fingerprint, and the sweep ends
with the tally and a recommendation. The points run in-process (app.execute, as the sweep's jobs do); the summary is the
sweep callback's own (sweep.summarize)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import HUGGY_LSTM_PT, HUGGY_PT, PYRAMIDS_PT, needs_shared, run_job

from huggy_exp.sweep import summarize

DTYPES = ("fp32", "fp16", "bf16")


def sweep(root, model: list[str]) -> dict:
    for i, dtype in enumerate(DTYPES):
        run_job(root / str(i), "action", *model, f"dtype={dtype}", "obs.rows=8", "batch_size=8")
    return summarize(root)


def assert_every_point_answers(summary: dict, outputs: set[str]) -> None:
    assert summary["tally"]["passed"] + summary["tally"]["failed"] == len(DTYPES), summary["line"]
    for row in summary["rows"]:
        record = json.loads((Path(row["dir"]) / "result.json").read_text())
        m = record["metrics"]
        for stem in outputs:
            for ref in ("fp64", "fp32"):
                if stem == "discrete_actions":
                    assert {f"{stem}/vs_{ref}/agreement", f"{stem}/vs_{ref}/flips_beyond_margin", f"{stem}/vs_{ref}/margin_limit"} <= set(m)
                else:
                    assert {f"{stem}/vs_{ref}/max_abs", f"{stem}/vs_{ref}/cosine", f"{stem}/vs_{ref}/cosine_min_row",
                            f"{stem}/vs_{ref}/max_abs_limit", f"{stem}/vs_{ref}/required_rtol", f"{stem}/vs_{ref}/ulp_max"} <= set(m)
        assert {"latency/p50_us", "latency/p99_us", "latency/obs_per_s", "latency/noisy"} <= set(m) and record["latency"]["p50_us"] > 0
        assert len(record["tags"]["fingerprint"]) == 64 and len(record["tags"]["quantized_fingerprint"]) == 64
        assert record["headline"].startswith(("PASS vs cpu fp64", "FAIL vs cpu fp64")) and "limit" in record["headline"]
        assert " p50 " in row["line"] and f" fingerprint {record['tags']['fingerprint'][:12]}" in row["line"]
        assert " max_abs " in row["line"] or " agree " in row["line"]
    (rec,) = summary["comparison"]["recommended"].values()
    assert rec["dtype"] in DTYPES and rec["p50_us"] > 0 and "fastest passing" in rec["why"]
    assert any(line.startswith("recommended on cpu at batch 8: ") for line in summary["comparison"]["lines"])


def test_the_embedded_default(default_model, tmp_path):
    summary = sweep(tmp_path, [])
    assert_every_point_answers(summary, {"actions"})
    assert summary["tally"]["passed"] == 3  # random rows: every dtype within its limits


@pytest.mark.parametrize("name, outputs", [("multi_input", {"actions"}), ("branches", {"discrete_actions"}),
                                           ("memory_hybrid_sac", {"actions", "discrete_actions", "memories"})])
def test_policies_of_other_shapes(name, outputs, shaped_files, tmp_path):
    assert_every_point_answers(sweep(tmp_path, [f"model.checkpoint={shaped_files[name][0]}"]), outputs)


@needs_shared
@pytest.mark.parametrize("path, outputs", [(HUGGY_PT, {"actions"}), (PYRAMIDS_PT, {"discrete_actions"}),
                                           (HUGGY_LSTM_PT, {"actions", "memories"})], ids=["huggy", "pyramids", "huggy_lstm"])
def test_the_shared_mlagents_fixtures(path, outputs, tmp_path):
    assert_every_point_answers(sweep(tmp_path, [f"model.checkpoint={path}"]), outputs)
