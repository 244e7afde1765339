"""What a task gets: the run's settings, the model (loaded on first use), observations and placement."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from huggy_exp import mlagents
from huggy_exp.errors import UserError
from huggy_exp.numerics import limits_for
from huggy_exp.observations import make_feeds, make_observations
from huggy_exp.verify import Limits, Rules
from huggy_exp.placement import Target, resolve, set_precision



@dataclass(frozen=True)
class ModelSpec:
    """Where the policy comes from; all unset means the embedded synthetic default."""

    checkpoint: str | None = None
    onnx: str | None = None
    results_dir: str | None = None
    hub_repo: str | None = None
    behavior: str | None = None
    step: int | None = None

    def open(self) -> mlagents.LoadedModel:
        if self.checkpoint:
            loaded = mlagents.load_checkpoint(self.checkpoint, self.onnx)
            if self.onnx:
                loaded = _with_onnx(loaded, self.onnx)
            return loaded
        if self.onnx:
            return mlagents.load_onnx(self.onnx)
        if self.results_dir or self.hub_repo:
            root = Path(self.results_dir).expanduser() if self.results_dir else mlagents.fetch_hub(self.hub_repo)
            return _open_results(root, self.behavior, self.step)
        return mlagents.load_default()

    def results_folder(self) -> Path:
        """The folder the `checkpoints` mode lists."""
        if self.results_dir:
            return Path(self.results_dir).expanduser()
        if self.hub_repo:
            return mlagents.fetch_hub(self.hub_repo)
        if self.checkpoint or self.onnx:
            return mlagents.run_folder(Path(self.checkpoint or self.onnx).expanduser().resolve())
        return mlagents.default_results_dir()


def _with_onnx(loaded: mlagents.LoadedModel, onnx: str) -> mlagents.LoadedModel:
    path = Path(onnx).expanduser()
    if not path.is_file():
        raise UserError(f"onnx file not found: {path}")
    return replace(loaded, onnx_path=path)


def _open_results(root: Path, behavior: str | None, step: int | None) -> mlagents.LoadedModel:
    path = mlagents.results_model(root, behavior, step)
    return mlagents.load_checkpoint(path) if path.suffix == ".pt" else mlagents.load_onnx(path)


@dataclass(frozen=True)
class ObsSpec:
    source: str = "random"
    rows: int = 64
    scale: float = 1.0
    path: str | None = None


@dataclass(frozen=True)
class VerifySpec:
    """`verify`: the limits every inference point is judged by, per dtype (exceptions per device kind x dtype)."""

    limits: dict = field(default_factory=dict)
    specialize: dict = field(default_factory=dict)
    rel_floor: float = 1e-3
    decimals: int = 3


@dataclass
class Context:
    """Settings of one job, as the schema validated them (config.validate: not checked again here); whether the device
    and dtype are available here is target()'s to say."""

    device: str = "cpu"
    dtype: str = "fp32"
    precision_mode: str = "ieee"  # fp32 math on the device (placement.set_precision)
    batch_size: int = 64
    seed: int = 0
    backend: str = "eager"
    threads: int = 1
    plots: bool = True  # draw the mode's PNG plots
    model_spec: ModelSpec = field(default_factory=ModelSpec)
    obs: ObsSpec = field(default_factory=ObsSpec)
    verify: VerifySpec = field(default_factory=VerifySpec)
    workdir: Path = Path(".")
    owned: tuple[Path, ...] = ()  # what the tool owns besides the model (job folder, tracking store, cache): never an output

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir)

    @cached_property
    def model(self) -> mlagents.LoadedModel:
        return self.model_spec.open()

    @property
    def loaded_model(self) -> mlagents.LoadedModel | None:
        """The model if a task has loaded it (modes like `checkpoints` never do)."""
        return self.__dict__.get("model")

    @property
    def weights(self) -> mlagents.PolicyWeights:
        return self.model.weights

    def target(self, device: str | None = None, dtype: str | None = None) -> Target:
        """Raises Unsupported when the device or dtype is not available here."""
        return resolve(device or self.device, dtype or self.dtype)

    def set_precision(self) -> dict[str, str]:
        """Put the device's fp32 switches in `precision_mode`; every switch as it reads back (Unsupported: skipped)."""
        return set_precision(self.device, self.dtype, self.precision_mode)

    def limits(self, dtype: str | None = None) -> Limits:
        """The dtype's output limits on this device kind (`verify.limits`, `verify.specialize`)."""
        return Limits.of(limits_for(self.verify.limits, dtype or self.dtype, self.device, self.verify.specialize, "verify.limits"))

    def atol(self, *dtypes: str) -> float:
        """The loosest max_abs of these dtypes here: two sides computing in different dtypes (an fp32 .onnx beside an
        fp64 policy) are held to the looser one's limit."""
        return max(self.limits(d).atol for d in dtypes or (self.dtype,))

    def rules(self, dtype: str | None = None) -> Rules:
        """How an output of this job is compared with a reference: the dtype's limits, its ULPs, the branch sizes."""
        return Rules(self.limits(dtype), dtype or self.dtype, self.verify.rel_floor, branch_sizes=self.weights.branch_sizes)

    def make_observations(self, rows: int) -> np.ndarray:
        """The configured source with another row count (a file gives what it holds)."""
        w = self.weights
        if self.obs.source == "file" and str(self.obs.path or "").endswith(".npz"):
            obs = self.feeds[mlagents.obs_name(0)]
            if obs.ndim != 2:
                raise UserError(f"obs.path={self.obs.path}: obs_0 is a sequence {list(obs.shape)}; this mode takes [N, {w.obs_dim}]")
            return obs
        return make_observations(self.obs.source, w.obs_dim, rows, self.seed, self.obs.scale, self.obs.path, w.normalizer)

    @cached_property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every input of the policy by ML-Agents' ONNX name (obs_0.., action_masks from a file); [T, N, d] is a sequence."""
        w = self.weights
        return make_feeds(self.obs.source, w, self.obs.rows, self.seed, self.obs.scale, self.obs.path)

    def make_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """`feeds` with another row count (a file gives what it holds)."""
        if self.obs.source == "file":
            return self.feeds
        w = self.weights
        return make_feeds(self.obs.source, w, rows, self.seed, self.obs.scale, self.obs.path)

    def onnx_path(self) -> Path:
        """The ML-Agents .onnx that goes with the model (configured, beside the .pt, or the embedded default's)."""
        if self.model.onnx_path is None:
            raise UserError(
                f"this mode needs the policy's .onnx; none beside {self.model.path}: set model.onnx=<file.onnx>"
            )
        return self.model.onnx_path
