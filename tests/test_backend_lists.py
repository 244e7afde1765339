"""Every place that lists the backends reads config.BACKENDS: the YAML comments and the docs list are generated from it
(scripts/config_reference.py) and checked to be current, the error messages build their lists from it, and a backend
added to it shows up in all of them with nothing else edited."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import CONF, REPO

from huggy_exp import config
from huggy_exp.config import BACKENDS, DTYPES, Backend
from huggy_exp.errors import Unsupported, UserError


def _generator():
    return _load("config_reference", "scripts/config_reference.py")


def _load(name: str, rel: str):
    spec = importlib.util.spec_from_file_location(name, REPO / rel)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_every_generated_part_is_current():
    """The key reference, the YAML comments that list the backends and docs/backends-and-timing.md's table read as
    `python scripts/config_reference.py --write` writes them."""
    stale = [str(path.relative_to(REPO)) for path, text in _generator().expected().items() if path.read_text() != text]
    assert not stale, f"out of date: {stale}; run python scripts/config_reference.py --write"


def test_every_dtype_is_named_in_the_comment_of_dtype():
    """The one hand-written list of dtypes (conf/config.yaml's `dtype` comment, a file a new dtype touches anyway)."""
    comment = " ".join(c for key, _, c in _generator().keys(CONF / "config.yaml") if key == "dtype")
    assert not [d for d in DTYPES if not re.search(rf"\b{d}\b", comment)], comment


def single(policy, target):
    """The toy backend's forward builder: the policy's own single-tensor forward and sample."""
    return policy.forward, policy.sample


TOY = Backend("toy", "a test's backend: the single-tensor forward, eager", forward=f"{__name__}.single",
              devices=("cpu",), dtypes=("fp32",))


@pytest.fixture
def toy_backend(monkeypatch):
    """config.BACKENDS with a `toy` backend declared after the others (restored after the test)."""
    monkeypatch.setitem(config.BACKENDS, "toy", TOY)
    return TOY


def test_a_declared_backend_appears_in_every_yaml_comment_and_docs_table_that_lists_backends(toy_backend):
    texts = {str(path.relative_to(REPO)): text for path, text in _generator().expected().items()}
    assert set(texts) == {"conf/config.yaml", "conf/mode/benchmark.yaml", "docs/configuration.md",
                          "docs/backends-and-timing.md"}
    for rel, text in texts.items():
        assert {n for n in BACKENDS if re.search(rf"\b{n}\b", text)} == set(BACKENDS), rel  # the toy among them
    assert "- `toy`: a test's backend" in texts["docs/backends-and-timing.md"]


def test_a_declared_backend_appears_in_every_error_message_that_lists_backends(toy_backend, small, tmp_path):
    from huggy_exp.mlagents import load_checkpoint
    from huggy_exp.placement import check_backend, resolve
    from huggy_exp.runners import ACTIONS, OBS, OnnxRunner, TorchRunner

    with pytest.raises(UserError, match=r"unknown backend 'nope'; valid: .*\btoy\b"):
        check_backend("nope")
    with pytest.raises(Unsupported, match=r"only the torch backends \(.*\btoy\b.*\) give"):
        OnnxRunner.distributions(OnnxRunner, {})
    with pytest.raises(Unsupported, match=r"runs backend eager only; backend toy does not apply"):
        check_backend("toy", resolve("cpu", "int8"))
    with pytest.raises(Unsupported, match=r"backend toy runs fp32 on cpu only; this job is cpu bf16"):
        check_backend("toy", resolve("cpu", "bf16"))
    weights = load_checkpoint(small.model.split("=", 1)[1]).weights
    toy, eager = TorchRunner(weights, resolve("cpu", "fp32"), 0, "toy"), TorchRunner(weights, resolve("cpu", "fp32"))
    feeds = {OBS: np.ones((3, toy.policy.obs_dim), np.float32)}
    assert toy.name == "torch-toy-cpu-fp32" and np.array_equal(toy.infer(feeds)[ACTIONS], eager.infer(feeds)[ACTIONS])


def test_bench_py_times_the_backends_the_schema_declares_for_the_cpu(toy_backend):
    """benchmarks/bench.py reads the backends it times from config.BACKENDS (issue 34: it kept a literal tuple): a
    declared CPU fp32 backend joins its fp32 benchmark and the torch backends its targets compare, and bf16 runs only
    the backends that declare it."""
    bench = _load("bench_under_test", "benchmarks/bench.py")
    assert bench.cpu_backends("fp32") == ["eager", "compile", "fused", "onnxruntime", "toy"]
    assert bench.cpu_backends("fp32", torch_only=True) == ["eager", "compile", "fused", "toy"]
    assert bench.cpu_backends("bf16") == ["eager", "compile"]
    args = SimpleNamespace(rows=512, budget=2.0)
    assert "mode.backends=[eager,compile,fused,onnxruntime,toy]" in bench.knobs(args, "fp32", "offline")
