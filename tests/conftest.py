"""Shared fixtures: hand-built ML-Agents checkpoints, a numpy float64 reference actor, results folders, Hydra jobs.

The checkpoints here are written with ML-Agents' own key names spelled out literally (not taken from
huggy_exp.mlagents), so a renamed constant in the package cannot make its loader and these fixtures agree
by accident.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
SHARED = REPO.parent / "shared" / "fixtures" / "mlagents"
HUGGY = SHARED / "huggy"
HUGGY_PT = HUGGY / "Huggy" / "Huggy-2000049.pt"
HUGGY_ONNX = HUGGY / "Huggy.onnx"
REFERENCE = HUGGY / "reference"
PUBLIC_RUN_LOGS = SHARED / "public_run_logs"
PYRAMIDS = SHARED / "pyramids"
PYRAMIDS_PT = PYRAMIDS / "Pyramids" / "Pyramids-1000021.pt"
PYRAMIDS_ONNX = PYRAMIDS / "Pyramids.onnx"
HUGGY_LSTM = SHARED / "huggy_lstm"
HUGGY_LSTM_PT = HUGGY_LSTM / "Huggy" / "Huggy-2000049.pt"
HUGGY_LSTM_ONNX = HUGGY_LSTM / "Huggy.onnx"

needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(),
    reason=f"genuine ML-Agents fixtures not found at {SHARED} (expected beside the repo as ../shared/fixtures/mlagents)",
)

# --- ML-Agents SimpleActor state_dict keys, spelled out (the "endoder" typo is ML-Agents' own)
NORM_PREFIXES = (
    "network_body.observation_encoder.processors.0.normalizer.",
    "network_body.processors.0.normalizer.",
)
BODY = "network_body._body_endoder.seq_layers."
MU = "action_model._continuous_distribution.mu."
LOG_SIGMA = "action_model._continuous_distribution.log_sigma"
ACTIONS = "deterministic_continuous_actions"


@dataclass(frozen=True)
class Spec:
    name: str
    obs: int
    act: int
    hidden: int
    layers: int
    normalize: bool
    seed: int
    steps: int = 2_000_050


SPECS = {
    "huggy": Spec("huggy", 59, 21, 32, 2, True, 11),  # Huggy-shaped, narrower MLP to stay fast
    "3dball": Spec("3dball", 8, 2, 128, 2, False, 12),  # network_settings.normalize: false
    "walker": Spec("walker", 243, 39, 64, 3, True, 13),  # Walker-shaped, 3 layers (64 wide instead of 256)
}


@dataclass
class Actor:
    """A continuous-action PPO actor as float32 arrays, with its own float64 numpy forward."""

    spec: Spec
    layers: list[tuple[np.ndarray, np.ndarray]]
    mu_w: np.ndarray
    mu_b: np.ndarray
    log_sigma: np.ndarray  # [1, act]
    mean: np.ndarray | None
    var: np.ndarray | None
    steps: int | None

    # --- serialisation, as ML-Agents' TorchModelSaver lays it out
    def state_dict(self, prefixes: tuple[str, ...] = NORM_PREFIXES) -> dict[str, torch.Tensor]:
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        act = float(self.spec.act)
        sd = {
            "version_number": torch.tensor([3.0]),
            "is_continuous_int_deprecated": torch.tensor([1.0]),
            "continuous_act_size_vector": torch.tensor([act]),
            "discrete_act_size_vector": torch.zeros(1, 0),
            "act_size_vector_deprecated": torch.tensor([act]),
            "memory_size_vector": torch.tensor([0.0]),
        }
        if self.mean is not None:
            for prefix in prefixes:
                sd[prefix + "normalization_steps"] = torch.tensor(self.steps, dtype=torch.int64)
                sd[prefix + "running_mean"] = t(self.mean)
                sd[prefix + "running_variance"] = t(self.var)
        for i, (w, b) in enumerate(self.layers):
            sd[f"{BODY}{2 * i}.weight"] = t(w)
            sd[f"{BODY}{2 * i}.bias"] = t(b)
        sd[LOG_SIGMA] = t(self.log_sigma)
        sd[MU + "weight"] = t(self.mu_w)
        sd[MU + "bias"] = t(self.mu_b)
        return sd

    def save(self, path: Path, step: int = 2_000_049, state: dict | None = None) -> Path:
        return save_mlagents_checkpoint(path, self.state_dict() if state is None else state, step)

    def policy_weights(self):
        """The same actor as the package's PolicyWeights (only to feed huggy_exp.mlagents.write_onnx)."""
        from huggy_exp.mlagents import Normalizer, PolicyWeights

        norm = Normalizer(self.mean, self.var, self.steps) if self.mean is not None else None
        return PolicyWeights(tuple(self.layers), (self.mu_w, self.mu_b), self.log_sigma, norm)

    # --- independent float64 reference forward
    def std32(self) -> np.ndarray:
        """sqrt(running_variance / normalization_steps) as ML-Agents computes it: float32 torch ops.

        torch's float32 sqrt is not correctly rounded on every lane (numpy's is), so the float32 std ML-Agents
        (and any faithful port) uses can differ from numpy's by one ulp; the rest of the reference is float64.
        """
        var = torch.from_numpy(np.ascontiguousarray(self.var, np.float32))
        return torch.sqrt(var / torch.tensor(self.steps, dtype=torch.int64)).numpy()

    def normalized(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float64)
        if self.mean is None:
            return x
        return np.clip((x - self.mean.astype(np.float64)) / self.std32().astype(np.float64), -5.0, 5.0)

    def mu(self, obs: np.ndarray) -> np.ndarray:
        x = self.normalized(obs)
        for w, b in self.layers:
            x = x @ w.astype(np.float64).T + b.astype(np.float64)
            x = x * (1.0 / (1.0 + np.exp(-x)))
        return x @ self.mu_w.astype(np.float64).T + self.mu_b.astype(np.float64)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        return np.clip(self.mu(obs), -3.0, 3.0) / 3.0

    def sampled(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        raw = self.mu(obs) + np.exp(self.log_sigma.astype(np.float64)) * np.asarray(noise, np.float64)
        return np.clip(raw, -3.0, 3.0) / 3.0

    def in_distribution_obs(self, rows: int = 32, seed: int = 0) -> np.ndarray:
        z = np.random.default_rng(seed).standard_normal((rows, self.spec.obs))
        if self.mean is None:
            return z.astype(np.float32)
        return (self.mean + self.std32().astype(np.float64) * z).astype(np.float32)


def make_actor(spec: Spec, huge_variance: float = 6.2e8) -> Actor:
    """Seeded weights; the normalizer has ML-Agents' magnitudes: a cumulative variance up to ~6e8, two never-varied dims."""
    rng = np.random.default_rng(spec.seed)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    layers, fan_in = [], spec.obs
    for _ in range(spec.layers):
        layers.append((f32(rng.normal(0, 1 / np.sqrt(fan_in), (spec.hidden, fan_in))), f32(rng.normal(0, 0.05, spec.hidden))))
        fan_in = spec.hidden
    mu_w = f32(rng.normal(0, 3.0 / np.sqrt(fan_in), (spec.act, fan_in)))
    mu_b = f32(rng.normal(0, 0.2, spec.act))
    log_sigma = f32(rng.uniform(-0.5, 0.5, (1, spec.act)))
    mean = var = steps = None
    if spec.normalize:
        steps = spec.steps
        mean = f32(rng.uniform(-20, 40, spec.obs))
        std = np.exp(rng.uniform(np.log(0.02), np.log(15.0), spec.obs))
        var = f32(std**2 * steps)
        var[0] = huge_variance  # far beyond float16's 65504
        var[[spec.obs // 3, 2 * spec.obs // 3]] = 1.0  # never varied
    return Actor(spec, layers, mu_w, mu_b, log_sigma, mean, var, steps)


def save_mlagents_checkpoint(path: Path, policy_state: dict, step: int) -> Path:
    """torch.save of the dict TorchModelSaver writes: Policy, global_step, optimizer and critic state."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    critic = {"network_body._body_endoder.seq_layers.0.weight": torch.zeros(4, 3), "value_heads.value_heads.extrinsic.bias": torch.zeros(1)}
    blob = {
        "Policy": policy_state,
        "global_step": {"_GlobalSteps__global_step": torch.tensor([step])},
        "Optimizer:value_optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(4, 3), "exp_avg_sq": torch.zeros(4, 3)}},
            "param_groups": [{"lr": 0.0003, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0, "amsgrad": False, "params": [0]}],
        },
        "Optimizer:critic": critic,
    }
    torch.save(blob, path)
    return path


# --- fixtures


@pytest.fixture(scope="session", autouse=True)
def huggy_exp_cache(tmp_path_factory) -> Path:
    """The embedded default is written under a session tmp dir, never under ~/.cache."""
    cache = tmp_path_factory.mktemp("huggy_exp_cache")
    old = os.environ.get("HUGGY_EXP_CACHE")
    os.environ["HUGGY_EXP_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("HUGGY_EXP_CACHE", None)
    else:
        os.environ["HUGGY_EXP_CACHE"] = old


@pytest.fixture(scope="session")
def actors() -> dict[str, Actor]:
    return {name: make_actor(spec) for name, spec in SPECS.items()}


@pytest.fixture(scope="session")
def huggy_actor(actors) -> Actor:
    return actors["huggy"]


@pytest.fixture(scope="session")
def checkpoint_files(actors, tmp_path_factory) -> dict[str, Path]:
    """One ML-Agents .pt per size, written by this file (not by the package)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: actor.save(root / name / f"{name}-1000.pt", step=1000) for name, actor in actors.items()}


@pytest.fixture(scope="session")
def huggy_pt(checkpoint_files) -> Path:
    return checkpoint_files["huggy"]


@pytest.fixture(scope="session")
def default_model(huggy_exp_cache):
    from huggy_exp import mlagents

    return mlagents.load_default()


RESULTS_STEPS = {100: 1.25, 200: None, 300: 2.5}  # 300 is logged in training_status.json but its files are gone


@pytest.fixture(scope="session")
def results_folder(huggy_actor, tmp_path_factory) -> Path:
    """An ML-Agents results folder: <Behavior>/<Behavior>-<step>.pt|.onnx, <Behavior>.onnx, run_logs/, configuration.yaml."""
    from huggy_exp.mlagents import write_onnx

    root = tmp_path_factory.mktemp("results") / "HuggyRun"
    behavior = root / "Huggy"
    entries = []
    for step, reward in RESULTS_STEPS.items():
        onnx_rel, pt_rel = f"results/HuggyRun/Huggy/Huggy-{step}.onnx", f"results/HuggyRun/Huggy/Huggy-{step}.pt"
        if step != 300:
            huggy_actor.save(behavior / f"Huggy-{step}.pt", step=step)
            write_onnx(huggy_actor.policy_weights(), behavior / f"Huggy-{step}.onnx")
        entries.append({"steps": step, "file_path": onnx_rel, "reward": reward, "creation_time": 1711207725.0 + step,
                        "auxillary_file_paths": [pt_rel]})
    write_onnx(huggy_actor.policy_weights(), root / "Huggy.onnx")
    final = {**entries[-1], "file_path": "results/HuggyRun/Huggy.onnx"}
    status = {"Huggy": {"checkpoints": entries, "final_checkpoint": final},
              "metadata": {"stats_format_version": "0.3.0", "mlagents_version": "1.1.0", "torch_version": "2.2.1"}}
    (root / "run_logs").mkdir()
    (root / "run_logs" / "training_status.json").write_text(json.dumps(status, indent=4))
    (root / "configuration.yaml").write_text(
        "behaviors:\n  Huggy:\n    trainer_type: ppo\n    network_settings:\n      normalize: true\n"
        "      hidden_units: 32\n      num_layers: 2\n    checkpoint_interval: 100\n"
    )
    return root


def assert_same_weights(a, b) -> None:
    """Two PolicyWeights hold bit-identical MLP, mu, log_sigma, normalizer mean and (folded) std."""
    assert len(a.layers) == len(b.layers)
    for (w1, b1), (w2, b2) in zip(a.layers, b.layers):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(a.mu[0], b.mu[0])
    np.testing.assert_array_equal(a.mu[1], b.mu[1])
    np.testing.assert_array_equal(a.log_sigma, b.log_sigma)
    assert (a.normalizer is None) == (b.normalizer is None)
    if a.normalizer is not None:
        np.testing.assert_array_equal(a.normalizer.running_mean, b.normalizer.running_mean)
        np.testing.assert_array_equal(a.normalizer.std, b.normalizer.std)


# --- Hydra, in-process


def compose_config(overrides: list[str] | tuple[str, ...] = ()):
    """The real conf/ tree composed in-process (no hydra: key), exactly as run.py sees it minus Hydra's own settings."""
    from hydra import compose, initialize_config_dir

    from huggy_exp.config import setup

    setup()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=False)


@dataclass
class Job:
    result: object  # huggy_exp.results.Result
    record: dict  # result.json
    workdir: Path


def run_job(workdir: Path, mode: str, *overrides: str, tracking: str | None = None) -> Job:
    """Compose `mode=<mode> *overrides` and run it through huggy_exp.app.execute; tracking off unless a uri is given."""
    from huggy_exp.app import execute

    track = ["tracking=none"] if tracking is None else ["tracking=mlflow", f"tracking.uri={tracking}"]
    cfg = compose_config([f"mode={mode}", *track, *overrides])
    workdir = Path(workdir)
    result = execute(cfg, workdir=workdir, mode=mode)
    record = json.loads((workdir / "result.json").read_text())
    return Job(result, record, workdir)


def subprocess_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "MLFLOW_"))}
    env["HUGGY_EXP_CACHE"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


PYTHON = sys.executable


def pytest_configure(config):
    # MLflow's SQLAlchemy store trips a deprecation inside SQLAlchemy itself; nothing this project can change
    config.addinivalue_line("filterwarnings", "ignore:The ``noload`` loader strategy is deprecated:DeprecationWarning")
