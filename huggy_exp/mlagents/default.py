"""The embedded default: a synthetic Huggy-shaped policy written once in ML-Agents results-folder layout."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from huggy_exp.mlagents.checkpoint import load_checkpoint, save_checkpoint
from huggy_exp.mlagents.onnx_write import write_onnx
from huggy_exp.errors import UserError
from huggy_exp.files import atomic_write_text, is_disk_full
from huggy_exp.mlagents.weights import LoadedModel, Normalizer, PolicyWeights

DEFAULT_NAME = "Huggy"
DEFAULT_STEP = 2_000_050
DEFAULT_SEED = 20_240_601
DEFAULT_VERSION = "v2"  # bump when default_weights changes: the cache is keyed by it


def default_weights(obs_dim: int = 59, act_dim: int = 21, hidden: int = 512, layers: int = 3, seed: int = DEFAULT_SEED) -> PolicyWeights:
    """A deterministic Huggy-shaped PPO actor with a normalizer at realistic magnitudes (numpy PCG64, stable bytes)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    mlp, fan_in = [], obs_dim
    for _ in range(layers):
        mlp.append((f32(rng.normal(0, 1.0 / np.sqrt(fan_in), (hidden, fan_in))), f32(rng.normal(0, 0.05, hidden))))
        fan_in = hidden
    mu = (f32(rng.normal(0, 7.0 / np.sqrt(hidden), (act_dim, hidden))), f32(rng.normal(0, 0.2, act_dim)))
    log_sigma = f32(rng.uniform(-0.5, 0.5, (1, act_dim)))
    mean = f32(rng.uniform(-20, 40, obs_dim))
    std = np.exp(rng.uniform(np.log(0.02), np.log(17.0), obs_dim))
    variance = f32(std**2 * DEFAULT_STEP)
    variance[[obs_dim // 3, 2 * obs_dim // 3]] = 1.0  # two dimensions that never varied, as in real runs
    return PolicyWeights(tuple(mlp), mu, log_sigma, Normalizer(mean, variance, DEFAULT_STEP))


def cache_dir() -> Path:
    return Path(os.environ.get("HUGGY_EXP_CACHE", Path.home() / ".cache" / "huggy_exp")).expanduser()


def default_results_dir() -> Path:
    """The embedded default, written once in ML-Agents results-folder layout (.pt, .onnx, run_logs)."""
    root = cache_dir() / f"default-{DEFAULT_VERSION}"
    behavior = root / DEFAULT_NAME
    pt, onnx_file = behavior / f"{DEFAULT_NAME}-{DEFAULT_STEP}.pt", behavior / f"{DEFAULT_NAME}-{DEFAULT_STEP}.onnx"
    status, config = root / "run_logs" / "training_status.json", root / "configuration.yaml"
    if all(p.is_file() for p in (pt, onnx_file, root / f"{DEFAULT_NAME}.onnx", status, config)):
        return root
    try:
        root.mkdir(parents=True, exist_ok=True)
        os.close(os.open(root / ".writable", os.O_WRONLY | os.O_CREAT, 0o644))  # a read-only HOME fails here, in one line
        os.unlink(root / ".writable")
    except OSError as exc:
        if is_disk_full(exc):
            raise
        raise UserError(f"the embedded default's cache {root} cannot be written ({exc.strerror or exc}); set "
                        "HUGGY_EXP_CACHE to a writable folder, or pass a model (model.checkpoint=...)") from None
    w = default_weights()
    save_checkpoint(w, pt, DEFAULT_STEP)
    write_onnx(w, onnx_file)
    write_onnx(w, root / f"{DEFAULT_NAME}.onnx")
    entry = {"steps": DEFAULT_STEP, "file_path": str(onnx_file), "reward": None, "creation_time": None,
             "auxillary_file_paths": [str(pt)]}
    doc = {DEFAULT_NAME: {"checkpoints": [entry], "final_checkpoint": entry},
           "metadata": {"stats_format_version": "0.3.0", "mlagents_version": "synthetic (huggy_exp embedded default)"}}
    atomic_write_text(status, json.dumps(doc, indent=2))
    import yaml

    settings = {"behaviors": {DEFAULT_NAME: {"trainer_type": "ppo", "max_steps": 2_000_000, "network_settings": {
        "normalize": True, "hidden_units": w.hidden_units, "num_layers": w.num_layers}}}}
    atomic_write_text(config, "# synthetic: huggy_exp's embedded default\n" + yaml.safe_dump(settings))
    return root


def load_default() -> LoadedModel:
    root = default_results_dir()
    loaded = load_checkpoint(root / DEFAULT_NAME / f"{DEFAULT_NAME}-{DEFAULT_STEP}.pt")
    return replace(loaded, source="embedded", synthetic=True, behavior=DEFAULT_NAME)
