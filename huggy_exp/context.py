"""What a task gets: the job's settings as the schema's own objects (config.py), the model (loaded on first use),
observations and placement."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path

import numpy as np

from huggy_exp import mlagents
from huggy_exp.config import numerics_label, ModelConf, ObsConf, PlanConf, VerifyConf, limit_row
from huggy_exp.errors import UserError
from huggy_exp.numerics import limits_for
from huggy_exp.observations import make_feeds
from huggy_exp.placement import Plan, Target, plan_for, resolve
from huggy_exp.policy import Policy
from huggy_exp.verify import Limits, Rules


def open_model(spec: ModelConf) -> mlagents.LoadedModel:
    """The policy `model` names: a checkpoint (with its .onnx), an .onnx, a results folder or Hub repo (its behavior
    and step); all unset, the embedded synthetic default."""
    if spec.checkpoint:
        loaded = mlagents.load_checkpoint(spec.checkpoint, spec.onnx)
        onnx = Path(spec.onnx).expanduser() if spec.onnx else None
        if onnx is not None and not onnx.is_file():
            raise UserError(f"onnx file not found: {onnx}")
        return replace(loaded, onnx_path=onnx) if onnx else loaded
    if spec.onnx:
        return mlagents.load_onnx(spec.onnx)
    if spec.results_dir or spec.hub_repo:
        path = mlagents.results_model(results_folder(spec), spec.behavior, spec.step)
        return mlagents.load_checkpoint(path) if path.suffix == ".pt" else mlagents.load_onnx(path)
    return mlagents.load_default()


def results_folder(spec: ModelConf) -> Path:
    """The ML-Agents results folder of `model` (what the `checkpoints` mode lists)."""
    if spec.results_dir:
        return Path(spec.results_dir).expanduser()
    if spec.hub_repo:
        return mlagents.fetch_hub(spec.hub_repo)
    if spec.checkpoint or spec.onnx:
        return mlagents.run_folder(Path(spec.checkpoint or spec.onnx).expanduser().resolve())
    return mlagents.default_results_dir()


@dataclass
class Context:
    """One job's settings, config.Config's own values and objects as config.validate checked them (not checked again
    here; app.build_context makes it); whether the device and dtype are available here is target()'s to say."""

    device: str
    dtype: str
    precision_mode: str  # fp32 math on the device (placement.set_precision)
    batch_size: int
    seed: int
    backend: str
    threads: int
    plots: bool  # draw the mode's PNG plots
    model_spec: ModelConf
    obs: ObsConf
    verify: VerifyConf
    workdir: Path
    plan: PlanConf | None = None  # conf/plan/<name>.yaml (parts null: none); resolved for the policy: precision_plan
    owned: tuple[Path, ...] = ()  # what the tool owns besides the model (job folder, tracking store, cache): never an output

    @cached_property
    def model(self) -> mlagents.LoadedModel:
        return open_model(self.model_spec)

    @property
    def loaded_model(self) -> mlagents.LoadedModel | None:
        """The model if a task has loaded it (modes like `checkpoints` never do)."""
        return self.__dict__.get("model")

    @property
    def weights(self) -> mlagents.PolicyWeights:
        return self.model.weights

    @cached_property
    def precision_plan(self) -> Plan | None:
        """The job's precision plan resolved for its policy (None: none); a bad one is UserError (one line)."""
        if self.plan is None or self.plan.parts is None:
            return None
        return plan_for(self.plan, tuple(Policy(self.weights).parts()), self.dtype, self.policy_shape)

    @property
    def policy_shape(self) -> str:
        """The policy's shape as a plan's `policy` key names it: inputs, heads, memory, and the body's widths."""
        return f"{self.weights.describe_shape()}; body {[int(b.shape[0]) for _, b in self.weights.layers]}"

    @property
    def dtype_label(self) -> str:
        """What the layers compute in, as points are named and matched: the dtype, or `plan:<name>`."""
        return numerics_label(self.dtype, None, self.precision_plan and self.precision_plan.name)

    @property
    def judged_dtype(self) -> str:
        """The dtype whose limits judge the point: its dtype, or its plan's limits dtype."""
        return self.precision_plan.limits if self.precision_plan else self.dtype

    def target(self, device: str | None = None, dtype: str | None = None) -> Target:
        """Raises Unsupported when the device or dtype is not available here; the point's own dtype (`dtype` None) runs
        its precision plan."""
        return resolve(device or self.device, dtype or self.dtype, None if dtype else self.precision_plan)

    def limits(self, dtype: str | None = None) -> Limits:
        """The dtype's output limits on this device kind (`verify.limits`, `verify.specialize`): fp32 computed in TF32
        or HF32 (precision_mode) by its mode's row (config.limit_row)."""
        table, row = asdict(self.verify.limits), limit_row(dtype or self.judged_dtype, self.precision_mode)
        return Limits.of(limits_for(table, row, self.device, self.verify.specialize, "verify.limits"))

    def atol(self, *dtypes: str) -> float:
        """The loosest max_abs of these dtypes here: two sides computing in different dtypes (an fp32 .onnx beside an
        fp64 policy) are held to the looser one's limit."""
        return max(self.limits(d).atol for d in dtypes or (self.judged_dtype,))

    def rules(self, dtype: str | None = None) -> Rules:
        """How an output of this job is compared with a reference: the dtype's limits, its ULPs, the branch sizes."""
        dtype = dtype or self.judged_dtype
        return Rules(self.limits(dtype), dtype, self.verify.rel_floor, branch_sizes=self.weights.branch_sizes)

    @cached_property
    def feeds(self) -> dict[str, np.ndarray]:
        """Every input of the policy by ML-Agents' ONNX name (obs_0.., action_masks from a file); [T, N, d] is a sequence."""
        return make_feeds(self.obs.source, self.weights, self.obs.rows, self.seed, self.obs.scale, self.obs.path)

    def make_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """`feeds` with another row count (a file gives what it holds)."""
        if self.obs.source == "file":
            return self.feeds
        return make_feeds(self.obs.source, self.weights, rows, self.seed, self.obs.scale, self.obs.path)

    def onnx_path(self) -> Path:
        """The ML-Agents .onnx that goes with the model (configured, beside the .pt, or the embedded default's)."""
        if self.model.onnx_path is None:
            raise UserError(f"this mode needs the policy's .onnx; none beside {self.model.path}: "
                            "set model.onnx=<file.onnx>")
        return self.model.onnx_path
