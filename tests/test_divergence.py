"""The first divergence across the lowering boundary (issue 32): onnxruntime's intermediates of an ML-Agents .onnx,
tapped where the graph walk that reads the weights finds each part (mlagents.with_parts), against CPU fp64's
Policy.trace; the first part over fp32's layer limit is named. A deliberately corrupted node must be named, on the
suite's own graphs of every shape, and the genuine ML-Agents graphs must show no divergence."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import SHAPES, SHARED, run_job
from onnx import numpy_helper

from huggy_exp.mlagents.onnx_graph import Graph
from huggy_exp.mlagents.onnx_read import read_graph

GENUINE = {"huggy": "huggy/Huggy/Huggy-2000049.pt", "pyramids": "pyramids/Pyramids/Pyramids-1000021.pt",
           "huggy_lstm": "huggy_lstm/Huggy/Huggy-2000049.pt"}


def corrupt(onnx_path, part: str, out):
    """The graph with the constant that computes `part` moved: the Gemm before a layer's Swish or a head, the normalizer's
    Sub (its running mean): found by walking back from the part's tensor through the ops that carry it."""
    model = onnx.load(str(onnx_path))
    g = Graph(model, "test")
    node = g.producer[read_graph(g)[1][part][0]]
    while node.op_type not in ("Gemm", "Sub"):  # Mul <- Gemm (Swish); Clip <- Div <- Sub (normalizer)
        node = g.producer[node.input[0]]
    name = next(i for i in node.input if i in g.const)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    value = numpy_helper.to_array(tensor).copy()
    value.reshape(-1)[: max(1, value.size // 4)] += 0.05
    tensor.CopyFrom(numpy_helper.from_array(value, name))
    onnx.save(model, str(out))
    return out


def parts_of(job) -> dict[str, dict]:
    return {row["part"]: row for row in job.result.tables["divergence"]}


@pytest.mark.parametrize("part", ["normalized_obs", "hidden_1", "mu"])
def test_a_deliberately_corrupted_node_is_named_as_the_first_divergence(small, tmp_path, part):
    bad = corrupt(small.onnx, part, tmp_path / "corrupted.onnx")
    job = run_job(tmp_path / "job", "onnx-compare", small.model, f"model.onnx={bad}", "obs.rows=16", "mode.samples=64")
    assert job.record["status"] == "failed"  # the outputs differ: what onnx-compare already said; now it says where
    assert job.record["details"]["first_divergence"] == part and job.record["tags"]["first_divergence"] == part
    rows = parts_of(job)
    order = list(rows)
    assert all(rows[p]["status"] == "within" for p in order[: order.index(part)])  # everything before it held
    assert rows[part]["status"] == "over the layer limit" and rows[part]["rel_rmse"] > rows[part]["limit"]
    assert rows[part]["sqnr_db"] < 60 and job.record["metrics"][f"graph/{part}/max_abs"] > 1e-3
    assert any(line.startswith(f"first divergence across the lowering boundary (onnxruntime's intermediates vs CPU "
                               f"fp64): {part} (") for line in job.result.summary)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_part_of_an_intact_graph_of_every_shape_is_compared_and_within(shaped_files, tmp_path, shape):
    pt, graph = shaped_files[shape]
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={pt}", "obs.rows=8", "mode.samples=64")
    rows = parts_of(job)
    assert job.record["details"]["first_divergence"] is None and job.record["details"]["unmapped_parts"] == []
    assert all(r["status"] == "within" for r in rows.values()), rows
    spec = SHAPES[shape]
    expected = {f"normalized_obs_{i}" for i in range(len(spec.inputs))} if len(spec.inputs) > 1 else {"normalized_obs"}
    expected |= {"mu"} if spec.continuous else set()
    expected |= {"logits"} if spec.branches else set()
    expected |= {"lstm", "recurrent_out"} if spec.memory else set()
    assert expected <= set(rows) and any(p.startswith("hidden_") for p in rows)


def test_the_corrupted_branch_of_a_discrete_policy_is_named(shaped_files, tmp_path):
    pt, graph = shaped_files["branches"]
    bad = corrupt(graph, "logits", tmp_path / "corrupted.onnx")
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={pt}", f"model.onnx={bad}", "obs.rows=16",
                  "mode.samples=64")
    assert job.record["details"]["first_divergence"] == "logits"
    assert np.isfinite(job.record["metrics"]["graph/logits/sqnr_db"])


@pytest.mark.parametrize("name", sorted(GENUINE))
def test_the_genuine_mlagents_graphs_show_no_divergence(tmp_path, name):
    pt = SHARED / GENUINE[name]
    if not pt.is_file():
        pytest.skip(f"genuine ML-Agents fixtures not found at {SHARED}")
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={pt}", "obs.rows=16", "mode.samples=64")
    assert job.record["details"]["first_divergence"] is None and job.record["details"]["unmapped_parts"] == []
    assert all(r["status"] == "within" for r in parts_of(job).values())


def test_a_graph_the_walk_cannot_read_keeps_its_verdict_and_says_the_divergence_was_not_located(shaped_files, tmp_path):
    from test_shapes_modes_onnx import edited, misplace_masks

    bad = edited(shaped_files["branches"][1], tmp_path / "bad.onnx", misplace_masks)
    job = run_job(tmp_path / "job", "onnx-compare", f"model.checkpoint={shaped_files['branches'][0]}", f"model.onnx={bad}",
                  "obs.rows=16", "mode.samples=64")
    assert job.record["status"] == "failed" and "discrete_actions: " in job.record["reason"]
    assert "read action_masks from" in job.record["details"]["divergence_not_located"]
    assert any(line.startswith("first divergence across the lowering boundary: not located: ") for line in job.result.summary)
