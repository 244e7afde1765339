"""Shared fixtures: hand-built ML-Agents checkpoints, a numpy float64 reference actor, results folders, Hydra jobs.

The checkpoints here are written with ML-Agents' own key names spelled out literally (not taken from
huggy_exp.mlagents), so a renamed constant in the package cannot make its loader and these fixtures agree
by accident.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# `-n auto` runs one worker per core. Each worker's OpenMP pool (torch, onnxruntime's default) would take every core
# as well, and the pools' spinning threads oversubscribe them: on 2 cores the default run took 177 s and 328 s of CPU
# that way, 146 s and 269 s with one thread per worker. Set before torch starts its pool; subprocesses inherit it; an
# OMP_NUM_THREADS of your own wins. A serial run (-n 0, the slow run) keeps every core per test.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

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


def mlagents_forward(state: dict, obs: np.ndarray) -> np.ndarray:
    """ML-Agents 1.1.0's SimpleActor deterministic path, op for op (Normalizer, LinearEncoder + Swish, mu, clamp/3)."""
    import torch

    p = "network_body.observation_encoder.processors.0.normalizer."
    x = torch.from_numpy(obs)
    x = torch.clamp((x - state[p + "running_mean"]) / torch.sqrt(state[p + "running_variance"]
                                                                  / state[p + "normalization_steps"]), -5, 5)
    body = "network_body._body_endoder.seq_layers."
    for i in range(0, 2 * len([k for k in state if k.startswith(body) and k.endswith(".weight")]), 2):
        x = torch.nn.functional.linear(x, state[f"{body}{i}.weight"], state[f"{body}{i}.bias"])
        x = torch.mul(x, torch.sigmoid(x))
    mu_w, mu_b = state["action_model._continuous_distribution.mu.weight"], state["action_model._continuous_distribution.mu.bias"]
    return (torch.clamp(torch.nn.functional.linear(x, mu_w, mu_b), -3, 3) / 3).numpy()


# --- fixtures


@pytest.fixture(scope="session", autouse=True)
def huggy_exp_cache(tmp_path_factory) -> Path:
    """The embedded default is written under a session tmp dir, never under ~/.cache. The workers of `-n auto` share
    one, as concurrent runs share ~/.cache: the embedded default and MLflow's empty store are built once, not per worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "huggy_exp_cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("huggy_exp_cache")
    old = os.environ.get("HUGGY_EXP_CACHE")
    os.environ["HUGGY_EXP_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("HUGGY_EXP_CACHE", None)
    else:
        os.environ["HUGGY_EXP_CACHE"] = old


# --- process-wide state: each test leaves it as it found it, or fails naming what it changed

def _attribute(path: str) -> tuple:
    """(getter, setter) of a torch attribute such as `backends.cudnn.rnn.fp32_precision`."""
    holder, name = path.rsplit(".", 1)

    def owner():
        obj = torch
        for part in holder.split("."):
            obj = getattr(obj, part)
        return obj

    return (lambda: getattr(owner(), name)), (lambda value: setattr(owner(), name, value))


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


# torch's global switches, restored in this order (the per-op fp32_precision switches after the global one they follow;
# they are what the legacy allow_tf32 flags read and write, which raise once the per-op API was used)
TORCH_STATE = {
    "torch default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "torch threads": (torch.get_num_threads, torch.set_num_threads),
    "torch flush_denormal": (lambda: (torch.tensor([1e-40]) * 1).item() == 0, torch.set_flush_denormal),
    "torch grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "torch deterministic algorithms": (_deterministic, lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "torch float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    **{f"torch.{path}": _attribute(path) for path in (
        "backends.cudnn.benchmark", "backends.cudnn.deterministic", "backends.cudnn.enabled", "backends.mkldnn.enabled",
        "backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        "backends.cuda.matmul.allow_bf16_reduced_precision_reduction", "backends.fp32_precision",
        *(f"backends.{op}.fp32_precision" for op in ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn",
                                                      "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")))},
}


def _root_logging() -> tuple:
    """The root logger's level and handlers, pytest's own capture handlers (one set per test phase) left out."""
    return logging.root.level, tuple(h for h in logging.root.handlers if type(h).__module__ != "_pytest.logging")


@pytest.fixture
def compiles():
    """A test that compiles (backend compile): dynamo's compiled frames and the recompile switch runners._compiled sets
    process-wide are put back, so the state check below does not fail it for what the backend must do."""
    import torch._dynamo

    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=torch._dynamo.config.fail_on_recompile_limit_hit):
        yield
    torch._dynamo.reset()


# set once per process by a library on first use, the same each time after: the library's state, not a test's change
LIBRARY_ENV = {"TORCHINDUCTOR_CACHE_DIR", "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR", "RAY_CLIENT_MODE"}


def process_state() -> dict[str, object]:
    """Everything a test could change for the later tests of its process, by name: signal handlers, environment
    variables, the working directory, sys.argv, the root logger, torch's global switches and what dynamo keeps (the
    frames it compiled, which torch._dynamo.reset() clears, and its config, read once dynamo is imported)."""
    state: dict[str, object] = {f"signal {s.name}": signal.getsignal(s) for s in signal.Signals
                                if s not in (signal.SIGKILL, signal.SIGSTOP)}
    state.update({f"env {k}": v for k, v in os.environ.items() if k not in LIBRARY_ENV and k != "PYTEST_CURRENT_TEST"})
    state.update({"cwd": os.getcwd(), "sys.argv": tuple(sys.argv), "root logger": _root_logging()})
    state.update({name: get() for name, (get, _) in TORCH_STATE.items()})
    dynamo = sys.modules.get("torch._dynamo")
    state["dynamo compiled frames"] = len(dynamo.convert_frame.output_codes.seen) if dynamo else 0
    if dynamo:
        state.update({f"dynamo config {k}": v for k, v in dynamo.config.get_config_copy().items()})
    return state


def a_commands_own_state() -> set[str]:
    """What a command (run.py, a job) sets for its own process by design, which its process's end would undo: its
    sweep size, a store's credentials, MLflow's HTTP limits, torch_npu's fallback switch, matplotlib's folder, a Ray
    point's card, the fp32 switches every job sets (placement.SWITCHES), Hydra's job logging and run.py's sys.argv."""
    from huggy_exp import app, placement, preflight, tracking

    env = (preflight.JOBS_ENV, *tracking.CREDENTIAL_ENV, placement.NPU_FALLBACK_ENV, placement.ASSIGNED_CARD_ENV,
           app.POINT_ENV, "MPLCONFIGDIR", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
           "MLFLOW_HTTP_REQUEST_TIMEOUT")
    switches = {f"torch.{path}.{name}" for path, name in placement.SWITCHES.values()} & TORCH_STATE.keys()
    return {*(f"env {name}" for name in env), *switches, "root logger", "sys.argv"}


def restore_process_state(before: dict[str, object], after: dict[str, object], changed: list[str]) -> None:
    """Put back every changed entry of `before` (a dynamo cache is cleared) so that one leak fails one test only."""
    for key in changed:
        if key.startswith("env ") and key not in before:
            del os.environ[key[4:]]
        elif key.startswith("env "):
            os.environ[key[4:]] = before[key]
        elif key.startswith("signal ") and before.get(key) is not None:
            signal.signal(signal.Signals[key[7:]], before[key])
        elif key == "cwd":
            os.chdir(before[key])
        elif key == "sys.argv":
            sys.argv[:] = before[key]
        elif key == "root logger":
            logging.root.setLevel(before[key][0])
            for handler in set(after[key][1]) - set(before[key][1]):
                logging.root.removeHandler(handler)
                handler.close()
            for handler in set(before[key][1]) - set(after[key][1]):
                logging.root.addHandler(handler)
        elif key in TORCH_STATE:
            TORCH_STATE[key][1](before[key])
        elif key == "dynamo compiled frames":
            sys.modules["torch._dynamo"].reset()
        elif key.startswith("dynamo config "):
            setattr(sys.modules["torch._dynamo"].config, key[14:], before[key])


def _changed(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The keys whose value differs (a dynamo config read for the first time, on dynamo's import, is no change)."""
    return [k for k in {**before, **after} if before.get(k, "absent") != after.get(k, "absent")
            and not (k.startswith("dynamo config ") and k not in before)]


@pytest.fixture(scope="session")
def process_baseline() -> tuple[dict[str, object], set[str]]:
    """The process state before the first test, and the keys of it a command sets for its own process."""
    return process_state(), a_commands_own_state()


@pytest.fixture(autouse=True)
def leaves_process_state_as_found(process_baseline):
    """Fails the test that changes process-wide state without restoring it (a later test in its worker, in any order,
    would inherit it): a test changes it through monkeypatch or a fixture that undoes it. What a command run in this
    process sets for its own process (a_commands_own_state) is undone here, to the state before the first test, as
    the end of the command's process would. This teardown runs after every other fixture's of the test."""
    baseline, own = process_baseline
    before = process_state()
    yield
    after = process_state()
    changed = _changed(before, after)
    restore_process_state(baseline, after, [k for k in _changed(baseline, after) if k in own])
    restore_process_state(before, after, [k for k in changed if k not in own])
    leaked = [k for k in changed if k not in own]
    if leaked:
        shown = "; ".join(f"{k}: {before.get(k, 'absent')!r} -> {after.get(k, 'absent')!r}" for k in leaked)
        pytest.fail(f"left process-wide state changed (now restored): {shown}", pytrace=False)


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


def plots_off(overrides) -> list[str]:
    """The overrides plus `plots=false` unless they say `plots=...`: drawing the PNGs took about a quarter of the
    default run's CPU, and only the tests that look at plots ask for them (run.py's own default is `plots: true`)."""
    overrides = list(overrides)
    return overrides if any(o.lstrip("+~").startswith("plots=") for o in overrides) else [*overrides, "plots=false"]


def compose_config(overrides: list[str] | tuple[str, ...] = ()):
    """The real conf/ tree composed in-process (no hydra: key), exactly as run.py sees it minus Hydra's own settings;
    with `plots=false` unless the overrides set `plots` (plots_off)."""
    from hydra import compose, initialize_config_dir

    from huggy_exp.preflight import setup

    setup()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=plots_off(overrides), return_hydra_config=False)


def job_context(workdir: Path, *overrides: str):
    """A job's Context as app.execute builds it: the composed conf/ tree as the schema's own objects (its limits
    included), tracking off."""
    from huggy_exp.app import build_context

    return build_context(compose_config(["tracking=none", *overrides]), Path(workdir))


def mode_conf(mode: str, *overrides: str):
    """mode=<mode>'s schema object (config.<Name>Mode) as conf/mode/<mode>.yaml composes, with `mode.<key>=` overrides:
    what app.make_task gives the task."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_config([f"mode={mode}", *overrides]).mode)


def model_conf(**given):
    """config.ModelConf with `given` set and every other key null, as conf/model/default.yaml has them."""
    from dataclasses import fields

    from huggy_exp.config import ModelConf

    return ModelConf(**{**{f.name: None for f in fields(ModelConf)}, **given})


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


# --- other ML-Agents shapes: several inputs, discrete branches, hybrid, LSTM memory, SAC (literal key names again)

BRANCH = "action_model._discrete_distribution.branches."
LSTM = "network_body.lstm.lstm."


@dataclass(frozen=True)
class ShapeSpec:
    name: str
    inputs: tuple[int, ...]
    normalize: bool
    continuous: int = 0
    branches: tuple[int, ...] = ()
    memory: int = 0  # memory_size = 2 x LSTM hidden
    sac: bool = False
    hidden: int = 16
    layers: int = 2
    seed: int = 0


SHAPES = {
    "multi_input": ShapeSpec("multi_input", (6, 4, 3), True, continuous=3, seed=31),
    "branches": ShapeSpec("branches", (5,), False, branches=(3, 2, 4), seed=32),
    "hybrid": ShapeSpec("hybrid", (7, 2), True, continuous=2, branches=(3,), seed=33),
    "memory_discrete": ShapeSpec("memory_discrete", (6,), True, branches=(4, 2), memory=16, seed=34),
    "memory_hybrid_sac": ShapeSpec("memory_hybrid_sac", (5, 3), False, continuous=2, branches=(3,), memory=8, sac=True, seed=35),
    "sac_inputs": ShapeSpec("sac_inputs", (4, 4), True, continuous=3, sac=True, seed=36),
}


@dataclass
class ShapedActor:
    """An ML-Agents actor of any supported shape as float32 arrays, with its own float64 numpy forward."""

    spec: ShapeSpec
    norms: list[tuple[np.ndarray, np.ndarray, int] | None]
    layers: list[tuple[np.ndarray, np.ndarray]]
    lstm: tuple[np.ndarray, ...] | None  # weight_ih, weight_hh, bias_ih, bias_hh (torch gate order i, f, g, o)
    mu: tuple[np.ndarray, np.ndarray] | None
    log_sigma: np.ndarray | tuple[np.ndarray, np.ndarray] | None
    branches: list[tuple[np.ndarray, np.ndarray]]

    def state_dict(self) -> dict[str, torch.Tensor]:
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
        s = self.spec
        sd = {
            "version_number": torch.tensor([3.0]),
            "is_continuous_int_deprecated": torch.tensor([1.0 if not s.branches else 0.0]),
            "continuous_act_size_vector": torch.tensor([float(s.continuous)]),
            "discrete_act_size_vector": torch.tensor([[float(b) for b in s.branches]]).reshape(1, -1),
            "act_size_vector_deprecated": torch.tensor([float(s.continuous + sum(s.branches))]),
            "memory_size_vector": torch.tensor([float(s.memory)]),
        }
        for i, norm in enumerate(self.norms):
            if norm is None:
                continue
            for prefix in (f"network_body.observation_encoder.processors.{i}.normalizer.", f"network_body.processors.{i}.normalizer."):
                sd[prefix + "normalization_steps"] = torch.tensor(norm[2], dtype=torch.int64)
                sd[prefix + "running_mean"] = t(norm[0])
                sd[prefix + "running_variance"] = t(norm[1])
        for i, (w, b) in enumerate(self.layers):
            sd[f"{BODY}{2 * i}.weight"], sd[f"{BODY}{2 * i}.bias"] = t(w), t(b)
        if self.lstm is not None:
            for name, value in zip(("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"), self.lstm):
                sd[LSTM + name] = t(value)
        if self.mu is not None:
            if s.sac:
                sd[LOG_SIGMA + ".weight"], sd[LOG_SIGMA + ".bias"] = t(self.log_sigma[0]), t(self.log_sigma[1])
            else:
                sd[LOG_SIGMA] = t(self.log_sigma)
            sd[MU + "weight"], sd[MU + "bias"] = t(self.mu[0]), t(self.mu[1])
        for b, (w, bias) in enumerate(self.branches):
            sd[f"{BRANCH}{b}.weight"], sd[f"{BRANCH}{b}.bias"] = t(w), t(bias)
        return sd

    def save(self, path: Path, step: int = 5000) -> Path:
        return save_mlagents_checkpoint(path, self.state_dict(), step)

    # --- float64 reference forward, one step
    def std32(self, i: int) -> np.ndarray:
        mean, var, steps = self.norms[i]
        return torch.sqrt(torch.from_numpy(var) / torch.tensor(steps, dtype=torch.int64)).numpy()

    def features(self, obs: list[np.ndarray], memory: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        parts = []
        for i, x in enumerate(obs):
            x = np.asarray(x, np.float64)
            if self.norms[i] is not None:
                x = np.clip((x - self.norms[i][0].astype(np.float64)) / self.std32(i).astype(np.float64), -5.0, 5.0)
            parts.append(x)
        x = np.concatenate(parts, axis=1)
        for w, b in self.layers:
            x = x @ w.astype(np.float64).T + b
            x = x / (1.0 + np.exp(-x))
        if self.lstm is None:
            return x, None
        w_ih, w_hh, b_ih, b_hh = (a.astype(np.float64) for a in self.lstm)
        hidden = self.spec.memory // 2
        mem = np.zeros((len(x), self.spec.memory)) if memory is None else np.asarray(memory, np.float64).reshape(len(x), -1)
        h, c = mem[:, :hidden], mem[:, hidden:]
        gates = x @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i_, f_, g_, o_ = np.split(gates, 4, axis=1)
        sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
        c = sig(f_) * c + sig(i_) * np.tanh(g_)
        h = sig(o_) * np.tanh(c)
        return h, np.concatenate([h, c], axis=1)[:, None, :]

    def logits(self, x: np.ndarray, masks: np.ndarray | None) -> list[np.ndarray]:
        out, start = [], 0
        for w, b in self.branches:
            z = x @ w.astype(np.float64).T + b
            if masks is not None:
                m = masks[:, start:start + len(b)].astype(np.float64)
                z = z * m - 1e8 * (1 - m)
            out.append(z)
            start += len(b)
        return out

    def forward(self, obs: list[np.ndarray], masks: np.ndarray | None = None, memory: np.ndarray | None = None) -> dict:
        """Deterministic outputs by ML-Agents' names, plus 'margins' (top-1 minus top-2 masked logit per branch)."""
        x, memory_out = self.features(obs, memory)
        out = {}
        if self.mu is not None:
            mu = x @ self.mu[0].astype(np.float64).T + self.mu[1]
            out["deterministic_continuous_actions"] = mu if self.spec.sac else np.clip(mu, -3, 3) / 3
        if self.branches:
            logits = self.logits(x, masks)
            out["deterministic_discrete_actions"] = np.stack([np.argmax(z, axis=1) for z in logits], axis=1)
            out["margins"] = np.stack([np.diff(np.sort(z, axis=1)[:, -2:], axis=1)[:, 0] for z in logits], axis=1)
        if memory_out is not None:
            out["recurrent_out"] = memory_out
        return out

    def random_feeds(self, rows: int, seed: int = 0, masked: bool = True) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        feeds = {}
        for i, size in enumerate(self.spec.inputs):
            z = rng.standard_normal((rows, size))
            if self.norms[i] is not None:
                z = self.norms[i][0] + self.std32(i) * z
            feeds[f"obs_{i}"] = z.astype(np.float32)
        if self.branches and masked:
            masks = (rng.random((rows, sum(self.spec.branches))) > 0.3).astype(np.float32)
            start = 0
            for size in self.spec.branches:  # at least one allowed action per branch, as ML-Agents requires
                masks[np.arange(rows), start + rng.integers(0, size, rows)] = 1.0
                start += size
            feeds["action_masks"] = masks
        return feeds


def make_shaped_actor(spec: ShapeSpec) -> ShapedActor:
    rng = np.random.default_rng(spec.seed)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    norms = []
    for size in spec.inputs:
        if not spec.normalize:
            norms.append(None)
            continue
        steps = 50_000
        std = np.exp(rng.uniform(np.log(0.05), np.log(20.0), size))
        var = f32(std**2 * steps)
        var[0] = 1.0  # never varied
        norms.append((f32(rng.uniform(-10, 10, size)), var, steps))
    layers, fan_in = [], sum(spec.inputs)
    for _ in range(spec.layers):
        layers.append((f32(rng.normal(0, 1 / np.sqrt(fan_in), (spec.hidden, fan_in))), f32(rng.normal(0, 0.1, spec.hidden))))
        fan_in = spec.hidden
    lstm = None
    if spec.memory:
        hidden = spec.memory // 2
        lstm = (f32(rng.normal(0, 0.5 / np.sqrt(fan_in), (4 * hidden, fan_in))), f32(rng.normal(0, 0.5 / np.sqrt(hidden), (4 * hidden, hidden))),
                f32(rng.normal(0, 0.1, 4 * hidden)), f32(rng.normal(0, 0.1, 4 * hidden)))
        fan_in = hidden
    mu = log_sigma = None
    if spec.continuous:
        mu = (f32(rng.normal(0, 2 / np.sqrt(fan_in), (spec.continuous, fan_in))), f32(rng.normal(0, 0.2, spec.continuous)))
        log_sigma = ((f32(rng.normal(0, 0.3 / np.sqrt(fan_in), (spec.continuous, fan_in))), f32(rng.normal(-0.5, 0.1, spec.continuous)))
                     if spec.sac else f32(rng.uniform(-0.5, 0.5, (1, spec.continuous))))
    branches = [(f32(rng.normal(0, 3 / np.sqrt(fan_in), (size, fan_in))), f32(rng.normal(0, 0.3, size))) for size in spec.branches]
    return ShapedActor(spec, norms, layers, lstm, mu, log_sigma, branches)


@pytest.fixture(scope="session")
def shaped_actors() -> dict[str, ShapedActor]:
    return {name: make_shaped_actor(spec) for name, spec in SHAPES.items()}


@pytest.fixture(scope="session")
def shaped_files(shaped_actors, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Per shape: the .pt written here in ML-Agents' layout, and beside it the .onnx the package writes for the same weights
    (ML-Agents' graph layout; it also tells the .pt loader how inputs without normalizers split)."""
    from huggy_exp import mlagents

    root = tmp_path_factory.mktemp("shapes")
    files = {}
    for name, actor in shaped_actors.items():
        pt = actor.save(root / name / f"{name}-5000.pt")
        weights = mlagents.weights_from_state_dict(actor.state_dict(), name, actor.spec.inputs)
        mlagents.write_onnx(weights, pt.with_suffix(".onnx"))
        files[name] = (pt, pt.with_suffix(".onnx"))
    return files


# --- a real MLflow tracking server on loopback (trust and sweep tests)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path: Path, port: int, auth_password: str | None = None):
    """`mlflow server` on 127.0.0.1:<port> with a SQLite store in tmp_path; returns once it answers. With
    `auth_password`: MLflow's basic-auth app (mlflow[auth]), user `admin` with that password."""
    import subprocess
    import time

    from huggy_exp import tracking

    mlflow_bin = Path(PYTHON).with_name("mlflow")
    auth = ["--app-name", "basic-auth"] if auth_password else []
    env = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": auth_password,
           "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only"} if auth_password else None
    proc = subprocess.Popen([str(mlflow_bin), "server", *auth, "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
                             "--artifacts-destination", str(tmp_path / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + (240 if auth_password else 90)
    while time.monotonic() < deadline:
        try:
            tracking.probe(f"http://127.0.0.1:{port}")
            return proc
        except tracking.StoreDown:
            time.sleep(0.5)
    stop_server(proc)
    pytest.fail("mlflow server did not come up on 127.0.0.1 within 90 s")


def stop_server(proc) -> None:
    import contextlib
    import os
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


# --- the small Huggy-shaped policy of the mode and benchmark tests


def small_weights():
    """8 obs -> 2 x 16 Swish -> 3 actions; a normalizer whose running_variance overflows float16 in 3 dims."""
    from huggy_exp import mlagents

    rng = np.random.default_rng(5)
    f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
    obs, act, hidden, steps = 8, 3, 16, 100_000
    layers = ((f32(rng.normal(0, 1 / np.sqrt(obs), (hidden, obs))), f32(rng.normal(0, 0.05, hidden))),
              (f32(rng.normal(0, 1 / np.sqrt(hidden), (hidden, hidden))), f32(rng.normal(0, 0.05, hidden))))
    mu = (f32(rng.normal(0, 2 / np.sqrt(hidden), (act, hidden))), f32(rng.normal(0, 0.2, act)))
    log_sigma = f32(rng.uniform(-0.5, 0.5, (1, act)))
    mean = f32(rng.uniform(-20, 40, obs))
    variance = f32(np.exp(rng.uniform(np.log(0.05), np.log(15.0), obs)) ** 2 * steps)
    variance[0] = 6.2e8  # Huggy's largest running_variance
    variance[3] = 1.0  # a dimension that never varied
    return mlagents.PolicyWeights(layers, mu, log_sigma, mlagents.Normalizer(mean, variance, steps))


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """The small policy as an ML-Agents .pt with its .onnx beside it."""
    from types import SimpleNamespace

    from huggy_exp import mlagents

    w = small_weights()
    pt = tmp_path_factory.mktemp("small") / "Small" / "Small-100.pt"
    mlagents.save_checkpoint(w, pt, 100)
    mlagents.write_onnx(w, pt.with_suffix(".onnx"))
    return SimpleNamespace(weights=w, pt=pt, onnx=pt.with_suffix(".onnx"), model=f"model.checkpoint={pt}")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most 8 (each builds the session fixtures anew)."""
    return max(1, min(_cores(), 8))
