"""Weights and normalizer types, the ML-Agents key names and constants, and the checks every reader shares."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import numpy as np

from huggy_exp.errors import UserError

# --- state_dict keys, exactly as ML-Agents' SimpleActor names them
PROCESSOR_PREFIXES = ("network_body.observation_encoder.processors.", "network_body.processors.")  # + "<i>.normalizer."
NORMALIZER_FIELDS = ("running_mean", "running_variance", "normalization_steps")
BODY_PREFIX = "network_body._body_endoder.seq_layers."
LSTM_PREFIX = "network_body.lstm.lstm."
LSTM_FIELDS = ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0")
MU_PREFIX = "action_model._continuous_distribution.mu."
LOG_SIGMA = "action_model._continuous_distribution.log_sigma"
BRANCH_PREFIX = "action_model._discrete_distribution.branches."
METADATA_KEYS = ("version_number", "is_continuous_int_deprecated", "continuous_act_size_vector",
                 "discrete_act_size_vector", "act_size_vector_deprecated", "memory_size_vector")

# --- ONNX names, exactly as ML-Agents' exporter writes them
ONNX_INPUT = "obs_0"
ACTION_MASKS = "action_masks"
RECURRENT_IN = "recurrent_in"
RECURRENT_OUT = "recurrent_out"
CONTINUOUS_OUTPUTS = ("continuous_actions", "continuous_action_output_shape", "deterministic_continuous_actions")
DISCRETE_OUTPUTS = ("discrete_actions", "discrete_action_output_shape", "deterministic_discrete_actions")
ACTION_CLAMP = 3.0
NORMALIZER_CLAMP = 5.0
LOG_SIGMA_RANGE = (-20.0, 2.0)
MASK_PENALTY = 1e8  # masked logits: logits * mask - 1e8 * (1 - mask)


def obs_name(i: int) -> str:
    return f"obs_{i}"


@dataclass(frozen=True)
class Normalizer:
    """ML-Agents' running observation statistics; float32, as ML-Agents keeps them."""

    running_mean: np.ndarray
    running_variance: np.ndarray | None
    steps: int | None
    folded_std: np.ndarray | None = None

    @property
    def std(self) -> np.ndarray:
        """sqrt(running_variance / steps) by torch, as ML-Agents computes it: numpy's float32 division by the int64
        step count differs from torch's (by one ulp on 22% of Huggy's dimensions)."""
        if self.folded_std is not None:
            return self.folded_std
        import torch

        variance = torch.from_numpy(np.ascontiguousarray(self.running_variance, np.float32))
        return torch.sqrt(variance / torch.tensor(self.steps, dtype=torch.int64)).numpy()

    def fp16_overflow_dims(self) -> int | None:
        """How many running-variance entries become inf when cast to float16; None when only a folded std is known (.onnx)."""
        if self.running_variance is None:
            return None
        with np.errstate(over="ignore"):
            return int(np.sum(~np.isfinite(self.running_variance.astype(np.float16))))


@dataclass(frozen=True)
class ObsInput:
    """One observation tensor of the behavior (`obs_<i>`): its width and, when normalize is on, its own normalizer."""

    size: int
    normalizer: Normalizer | None = None


@dataclass(frozen=True)
class Lstm:
    """ML-Agents' one-layer LSTM in torch's layout (gate blocks i, f, g, o); memory = [h, c], each hidden_size wide."""

    weight_ih: np.ndarray
    weight_hh: np.ndarray
    bias_ih: np.ndarray
    bias_hh: np.ndarray

    @property
    def hidden_size(self) -> int:
        """H, from weight_hh [4H, H] (0 when that is not a matrix: check_shapes names it)."""
        return int(self.weight_hh.shape[1]) if self.weight_hh.ndim == 2 else 0

    @property
    def memory_size(self) -> int:
        return 2 * self.hidden_size


@dataclass(frozen=True)
class PolicyWeights:
    """Everything needed to rebuild an ML-Agents actor, as float32 arrays: `inputs` (one ObsInput per `obs_<i>`; by
    default one as wide as the first layer, with `normalizer`), a continuous head (`mu`, `log_sigma`; `tanh_squash` for
    SAC) and/or a discrete one (`branches`, one Linear each), and `lstm` between the MLP and the heads."""

    layers: tuple[tuple[np.ndarray, np.ndarray], ...]
    mu: tuple[np.ndarray, np.ndarray] | None
    log_sigma: np.ndarray | tuple[np.ndarray, np.ndarray] | None
    normalizer: Normalizer | None
    tanh_squash: bool = False
    version_number: float = 3.0
    memory_size: float = 0.0
    inputs: tuple[ObsInput, ...] = ()
    branches: tuple[tuple[np.ndarray, np.ndarray], ...] = ()
    lstm: Lstm | None = None

    def __post_init__(self) -> None:
        if not self.inputs:
            object.__setattr__(self, "inputs", (ObsInput(int(self.layers[0][0].shape[1]), self.normalizer),))
        elif len(self.inputs) == 1 and self.normalizer is None:
            object.__setattr__(self, "normalizer", self.inputs[0].normalizer)
        if self.lstm is not None:
            object.__setattr__(self, "memory_size", float(self.lstm.memory_size))

    @property
    def obs_dim(self) -> int:
        """Width of all inputs concatenated (the first layer's input)."""
        return int(self.layers[0][0].shape[1])

    @property
    def obs_sizes(self) -> tuple[int, ...]:
        return tuple(i.size for i in self.inputs)

    @property
    def act_dim(self) -> int:
        """Continuous actions (0 for a discrete-only policy)."""
        return 0 if self.mu is None else int(self.mu[0].shape[0])

    @property
    def branch_sizes(self) -> tuple[int, ...]:
        return tuple(int(w.shape[0]) for w, _ in self.branches)

    @property
    def memory(self) -> int:
        return 0 if self.lstm is None else self.lstm.memory_size

    @property
    def hidden_units(self) -> int:
        return int(self.layers[0][0].shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def conditional_sigma(self) -> bool:
        return isinstance(self.log_sigma, tuple)

    def describe_shape(self) -> str:
        """'4 inputs [56, 56, 56, 4], discrete branches [5], memory 128' and the like."""
        parts = [f"{len(self.inputs)} input{'s' if len(self.inputs) > 1 else ''} {list(self.obs_sizes)}"]
        if self.mu is not None:
            parts.append(f"{self.act_dim} continuous actions{' (tanh-squashed)' if self.tanh_squash else ''}")
        if self.branches:
            parts.append(f"discrete branches {list(self.branch_sizes)}")
        if self.lstm is not None:
            parts.append(f"LSTM memory {self.memory}")
        return ", ".join(parts)

    @property
    def parameter_count(self) -> int:
        """Weights and biases of the MLP, LSTM and action heads (566,805 for Huggy); log_sigma not included."""
        linears = (*self.layers, *((self.mu,) if self.mu is not None else ()), *self.branches)
        lstm = (self.lstm.weight_ih, self.lstm.weight_hh, self.lstm.bias_ih, self.lstm.bias_hh) if self.lstm else ()
        return int(sum(w.size + b.size for w, b in linears) + sum(a.size for a in lstm))

    @property
    def log_sigma_count(self) -> int:
        parts = () if self.log_sigma is None else self.log_sigma if self.conditional_sigma else (self.log_sigma,)
        return int(sum(p.size for p in parts))


@dataclass(frozen=True)
class LoadedModel:
    """A policy plus where it came from."""

    weights: PolicyWeights
    source: str
    path: Path
    sha256: str
    step: int | None = None
    synthetic: bool = False
    onnx_path: Path | None = None
    behavior: str | None = None

    def describe(self) -> dict:
        return {"source": self.source, "path": str(self.path), "sha256": self.sha256, "synthetic": self.synthetic,
                "step": self.step, "onnx": str(self.onnx_path) if self.onnx_path else None,
                "weights_sha256": weights_sha256(self.weights)}  # the numbers this job ran, whatever the file holds now


def weights_sha256(weights) -> str:
    """The policy's numbers, whatever file they came from: every array and scalar of PolicyWeights, by field name."""
    digest = hashlib.sha256()

    def walk(value, name: str) -> None:
        if isinstance(value, np.ndarray):
            digest.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        elif is_dataclass(value):
            for f in fields(value):
                walk(getattr(value, f.name), f"{name}.{f.name}")
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, f"{name}[{i}]")
        elif value is None or isinstance(value, (bool, int, float, str)):
            digest.update(f"{name}={value!r}".encode())

    walk(weights, "weights")
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def require_file(path: Path, what: str) -> Path:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    return path


def read_count(a: np.ndarray, key: str, origin: str, minimum: int) -> int:
    """A one-element integer entry (a step count, a size); empty, fractional or too small is refused."""
    flat = a.reshape(-1)
    value = float(flat[0]) if flat.size == 1 else None
    if value is None or not np.isfinite(value) or value != int(value) or value < minimum or value > 2**62:
        shown = flat[:4].tolist() if flat.size else "empty"
        raise UserError(f"{origin}: {key} is {shown}, expected one integer >= {minimum}")
    return int(value)


def nonfinite(a: np.ndarray) -> str | None:
    """'1 NaN (first at [3, 17])' when a float array holds NaN or inf as float32; None when every value is finite."""
    if a.dtype.kind != "f":
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = a.astype(np.float32)
    bad = ~np.isfinite(f32)
    if not bad.any():
        return None
    nan, inf = int(np.isnan(f32).sum()), int(np.isinf(f32).sum())
    what = " and ".join(f"{n} {label}" for n, label in ((nan, "NaN"), (inf, "inf")) if n)
    where = [int(i) for i in np.argwhere(bad)[0]]
    overflow = " once cast to float32" if np.isfinite(a[tuple(where)]) else ""
    return f"{what}{overflow} (first at {where})"


def check_finite(a: np.ndarray, name: str, origin: str) -> None:
    if (bad := nonfinite(a)) is not None:
        raise UserError(f"{origin}: {name} has {bad}")


def check_shapes(w: PolicyWeights, origin: str) -> None:
    """Every tensor must chain: inputs -> [H, sum of inputs] -> [H, H]... (-> LSTM) -> heads [*, H]; normalizers match their inputs."""
    heads = [(MU_PREFIX[:-1], *w.mu, "act")] if w.mu is not None else []
    heads += [(f"{BRANCH_PREFIX}{b}", *branch, "size") for b, branch in enumerate(w.branches)]
    for key, weight, bias, *_ in [(f"{BODY_PREFIX}{2 * i}", *layer) for i, layer in enumerate(w.layers)] + heads:
        if weight.ndim != 2 or bias.ndim != 1 or 0 in weight.shape:
            raise UserError(f"{origin}: shape mismatch: {key}.weight {list(weight.shape)} / .bias {list(bias.shape)} "
                            "(expected a non-empty [out, in] matrix and an [out] vector)")
    if not heads:
        raise UserError(f"{origin}: no action head: neither {MU_PREFIX}weight nor {BRANCH_PREFIX}0.weight")
    problems = []
    width = w.obs_dim
    if sum(w.obs_sizes) != width:
        problems.append(f"observation inputs {list(w.obs_sizes)} sum to {sum(w.obs_sizes)}, the first layer takes {width}")

    def chain(key: str, weight: np.ndarray, bias: np.ndarray, rows: str) -> None:
        if weight.shape[1] != width or bias.shape != (weight.shape[0],):
            problems.append(f"{key}.weight {list(weight.shape)} / .bias {list(bias.shape)} "
                            f"(expected [{rows}, {width}] and [{rows}])")

    for i, (weight, bias) in enumerate(w.layers):
        chain(f"{BODY_PREFIX}{2 * i}", weight, bias, "*")
        width = weight.shape[0]
    if w.lstm is not None:
        m, hidden = w.lstm, w.lstm.hidden_size
        expected = {"weight_ih_l0": (4 * hidden, width), "weight_hh_l0": (4 * hidden, hidden), "bias_ih_l0": (4 * hidden,),
                    "bias_hh_l0": (4 * hidden,)}
        for (name, shape), value in zip(expected.items(), (m.weight_ih, m.weight_hh, m.bias_ih, m.bias_hh)):
            if value.shape != shape or hidden == 0:
                problems.append(f"{LSTM_PREFIX}{name} {list(value.shape)} (expected {list(shape)})")
        width = hidden
    if w.mu is not None:
        chain(*heads[0])
        if w.conditional_sigma:
            if w.log_sigma[0].shape != w.mu[0].shape or w.log_sigma[1].shape != w.mu[1].shape:
                problems.append(f"{LOG_SIGMA}.weight {list(w.log_sigma[0].shape)} does not match {MU_PREFIX}weight {list(w.mu[0].shape)}")
        elif w.log_sigma is None or w.log_sigma.shape != (1, w.act_dim):
            problems.append(f"{LOG_SIGMA} {None if w.log_sigma is None else list(w.log_sigma.shape)} (expected [1, {w.act_dim}])")
    for head in heads[len(heads) - len(w.branches):]:
        chain(*head)
    for i, obs in enumerate(w.inputs):
        n = obs.normalizer
        stats = [] if n is None else [("running_mean", n.running_mean), ("running_variance", n.running_variance)
                                      if n.running_variance is not None else ("folded std", n.std)]
        problems += [f"{PROCESSOR_PREFIXES[0]}{i}.normalizer.{name} {list(value.shape)} (expected [{obs.size}])"
                     for name, value in stats if value.shape != (obs.size,)]
    if problems:
        raise UserError(f"{origin}: shape mismatch: " + "; ".join(problems))
