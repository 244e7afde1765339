"""Every backend behind one contract: infer(feeds) -> {output name: ndarray}. References are runners.

Feeds are keyed by ML-Agents' ONNX input names: `obs_0` ... `obs_<k>` (float32 [N, d_i]), `action_masks` (float32
[N, sum of branch sizes], 1 = allowed; all allowed when absent), `recurrent_in` (float32 [N, 1, memory]; zeros when
absent). A bare array is `obs_0`. Outputs carry ML-Agents' output names. `Recurrent` carries the memory between steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch

from huggy_exp.errors import UserError
from huggy_exp.mlagents import ACTION_MASKS, RECURRENT_IN, RECURRENT_OUT, PolicyWeights, obs_name
from huggy_exp.placement import Target, resolve, synchronize
from huggy_exp.policy import Policy, cpu_noise, cpu_uniform

ACTIONS = "deterministic_continuous_actions"
SAMPLED = "continuous_actions"
DISCRETE = "deterministic_discrete_actions"
DISCRETE_SAMPLED = "discrete_actions"

Feeds = Mapping[str, np.ndarray] | np.ndarray


def feeds_of(feeds: Feeds) -> dict[str, np.ndarray]:
    """A feed dict; a bare array is the single observation input `obs_0`."""
    return {obs_name(0): feeds} if isinstance(feeds, np.ndarray) else dict(feeds)


def fit_inputs(feeds: dict[str, np.ndarray], sizes: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Check the observation feeds against the policy's input widths.

    Inputs without normalizers meet in one Concat before the first layer, so a policy read as one input of the
    concatenated width (a .pt without its .onnx) takes obs_0 ... obs_<k> concatenated: the same numbers.
    """
    given = [obs_name(i) for i in range(len(feeds)) if obs_name(i) in feeds]
    if len(sizes) == 1 and len(given) > 1 and sum(feeds[n].shape[-1] for n in given) == sizes[0]:
        feeds = {**{k: v for k, v in feeds.items() if k not in given}, obs_name(0): np.concatenate([feeds[n] for n in given], axis=-1)}
    wanted = [obs_name(i) for i in range(len(sizes))]
    missing = [n for n in wanted if n not in feeds]
    if missing:
        raise UserError(f"feeds {sorted(feeds)} lack {missing} (this policy has {len(sizes)} observation inputs {list(sizes)})")
    wrong = [f"{n} {list(np.shape(feeds[n]))}" for n, size in zip(wanted, sizes) if np.shape(feeds[n])[-1:] != (size,)]
    if wrong:
        raise UserError(f"feeds {', '.join(wrong)} do not fit this policy's inputs {list(sizes)} (obs_i is [N, d_i])")
    return feeds


def feed_rows(feeds: Feeds) -> int:
    return len(feeds_of(feeds)[obs_name(0)])


class TorchRunner:
    """The rebuilt policy on one (device, dtype), fed in chunks of `batch_size` rows."""

    def __init__(self, weights: PolicyWeights, target: Target, batch_size: int = 0):
        self.target = target
        self.batch_size = batch_size
        self.policy = Policy(weights).place(target.device, target.dtype)
        self.name = f"torch-{target.device_name}-{target.dtype_name}"

    def _chunks(self, obs: np.ndarray):
        step = self.batch_size if self.batch_size and self.batch_size > 0 else len(obs)
        for start in range(0, len(obs), step):
            yield start, torch.from_numpy(np.ascontiguousarray(obs[start : start + step])).to(self.target.device)

    def _feed_chunks(self, feeds: Feeds):
        """(start, obs list, masks, memory) per chunk of `batch_size` rows, as tensors on the device."""
        feeds = fit_inputs(feeds_of(feeds), self.policy.obs_sizes)
        arrays = [feeds[obs_name(i)] for i in range(len(self.policy.obs_sizes))]
        rows = len(arrays[0])
        masks = feeds.get(ACTION_MASKS) if self.policy.discrete is not None else None
        memory = feeds.get(RECURRENT_IN) if self.policy.memory is not None else None
        expected = {obs_name(i): (rows, size) for i, size in enumerate(self.policy.obs_sizes)}
        if masks is not None:
            expected[ACTION_MASKS] = (rows, sum(self.policy.branch_sizes))
        if memory is not None:
            expected[RECURRENT_IN] = (rows, 1, self.policy.memory_size)
        wrong = [f"{name} {list(np.shape(feeds[name]))} (expected {list(shape)})" for name, shape in expected.items()
                 if np.shape(feeds[name]) != shape]
        if wrong:
            raise UserError(f"feeds do not fit this policy: {'; '.join(wrong)}")
        step = self.batch_size if self.batch_size and self.batch_size > 0 else rows
        to = lambda a, s: None if a is None else torch.from_numpy(np.ascontiguousarray(a[s : s + step], np.float32)).to(self.target.device)  # noqa: E731
        for start in range(0, rows, max(step, 1)):
            yield start, [to(a, start) for a in arrays], to(masks, start), to(memory, start)

    def _run(self, feeds: Feeds, noise: dict[str, torch.Tensor] | None = None) -> dict[str, np.ndarray]:
        parts = []
        for start, obs, masks, memory in self._feed_chunks(feeds):
            chunk = None if noise is None else {k: v[start : start + len(obs[0])] for k, v in noise.items()}
            parts.append(self.policy.act(obs, masks, memory, chunk))
        return self._collect(parts)

    def _collect(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
        synchronize(self.target.device)
        return {k: np.concatenate([_numpy(p[k]) for p in parts]) for k in parts[0]}

    @torch.inference_mode()
    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Deterministic outputs of every head (and `recurrent_out`) for the feeds."""
        if not self.policy.huggy_shaped:  # several inputs, discrete branches, memory: every head through Policy.act
            return self._run(feeds)
        obs = fit_inputs(feeds_of(feeds), self.policy.obs_sizes)[obs_name(0)]
        return self._collect([{ACTIONS: self.policy(x)} for _, x in self._chunks(obs)])

    @torch.inference_mode()
    def trace(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """Every intermediate plus the action, for per-layer attribution."""
        parts = []
        for _, x in self._chunks(obs):
            t = self.policy.trace(x)
            t[ACTIONS] = self.policy.head(t["mu"])
            parts.append(t)
        return self._collect(parts)

    @torch.inference_mode()
    def sample(self, feeds: Feeds, seed: int) -> dict[str, np.ndarray]:
        """Sampled actions; the noise is one CPU draw for all rows, so chunking and device do not change it."""
        if not self.policy.huggy_shaped:
            return self._run(feeds, sample_noise(self.policy, feed_rows(feeds), seed))
        obs = fit_inputs(feeds_of(feeds), self.policy.obs_sizes)[obs_name(0)]
        noise = cpu_noise(len(obs), self.policy.act_dim, seed)
        return self._collect([{SAMPLED: self.policy.sample(x, noise[s : s + len(x)])} for s, x in self._chunks(obs)])


    @torch.inference_mode()
    def distributions(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """What the sampled outputs draw from (Policy.distributions): mu, log_sigma, masked_logits, recurrent_out."""
        return self._collect([self.policy.distributions(obs, masks, memory) for _, obs, masks, memory in self._feed_chunks(feeds)])


def sample_noise(policy: Policy, rows: int, seed: int) -> dict[str, torch.Tensor]:
    """CPU noise for every head, keyed by its sampled output: Gaussian z (continuous), uniforms in (0, 1] (discrete)."""
    noise = {}
    if policy.continuous is not None:
        noise[SAMPLED] = cpu_noise(rows, policy.act_dim, seed)
    if policy.discrete is not None:
        noise[DISCRETE_SAMPLED] = cpu_uniform(rows, len(policy.branch_sizes), seed)
    return noise


class Recurrent:
    """Any runner's infer (torch or onnxruntime) with the memory carried: recurrent_out of a step is the next recurrent_in.

    The memory starts at zeros, as an agent's does in Unity; reset() starts over.
    """

    def __init__(self, infer: Callable[[Feeds], dict[str, np.ndarray]], memory_size: int):
        self.infer, self.memory_size = infer, int(memory_size)
        self.memory: np.ndarray | None = None

    def reset(self) -> None:
        self.memory = None

    def step(self, feeds: Feeds) -> dict[str, np.ndarray]:
        feeds = feeds_of(feeds)
        if self.memory_size:
            rows = len(feeds[obs_name(0)])
            if self.memory is None or len(self.memory) != rows:
                self.memory = np.zeros((rows, 1, self.memory_size), np.float32)
            feeds[RECURRENT_IN] = self.memory
        out = self.infer(feeds)
        if self.memory_size:
            self.memory = np.asarray(out[RECURRENT_OUT], np.float32)
        return out

    def sequence(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Feeds of [T, N, ...] run step by step from zero memory; every output stacked with a leading T."""
        self.reset()
        steps = len(feeds[obs_name(0)])
        outs = [self.step({k: v[t] for k, v in feeds.items()}) for t in range(steps)]
        return {k: np.stack([o[k] for o in outs]) for k in outs[0]}


def run_feeds(runner: TorchRunner, feeds: Mapping[str, np.ndarray], seed: int | None = None) -> dict[str, np.ndarray]:
    """Deterministic outputs (sampled ones with `seed`) for single-step feeds [N, d], or for a sequence [T, N, d] run
    step by step with the memory carried from zeros (step t sampled with seed + t); sequence outputs lead with T."""
    if seed is None or feeds[obs_name(0)].ndim == 2:
        return over_steps(runner.infer if seed is None else (lambda f: runner.sample(f, seed)), feeds, runner.policy.memory_size)
    steps = iter(range(len(feeds[obs_name(0)])))
    return Recurrent(lambda f: runner.sample(f, seed + next(steps)), runner.policy.memory_size).sequence(feeds)


def over_steps(infer: Callable[[Feeds], dict[str, np.ndarray]], feeds: Mapping[str, np.ndarray], memory_size: int) -> dict[str, np.ndarray]:
    """Any runner's infer (torch, onnxruntime, distributions) on single-step feeds [N, d], or on a sequence [T, N, d] step by
    step with its own memory carried from zeros (outputs lead with T)."""
    if feeds[obs_name(0)].ndim == 2:
        return infer(feeds)
    return Recurrent(infer, memory_size).sequence(feeds)


def reference(weights: PolicyWeights, dtype: str = "fp64", batch_size: int = 0) -> TorchRunner:
    """The CPU reference used by the comparing modes (fp64 by default)."""
    return TorchRunner(weights, resolve("cpu", dtype), batch_size)


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.numpy()  # discrete actions: int64
    return (t.double() if t.dtype == torch.float64 else t.float()).numpy()


class OnnxRunner:
    """onnxruntime on one execution provider; a missing provider fails with the list of available ones."""

    def __init__(self, path: Path, provider: str = "CPUExecutionProvider", threads: int = 0, seed: int | None = None):
        import onnxruntime as ort

        if seed is not None:
            ort.set_seed(int(seed))  # RandomNormalLike draws become repeatable run to run (not equal to torch's)

        available = ort.get_available_providers()
        if provider not in available:
            raise UserError(f"onnxruntime provider {provider!r} is not available; available: {', '.join(available)}")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(path), options, providers=[provider])
        except Exception as exc:
            raise UserError(f"onnxruntime could not load {path}: {str(exc).splitlines()[0]}") from None
        self.inputs = {i.name: i.shape for i in self.session.get_inputs()}
        self.input = next(iter(self.inputs))
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.name = f"onnxruntime-{provider}"

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """The graph's outputs; absent action_masks are all ones, an absent recurrent_in is zeros (ML-Agents' defaults)."""
        feeds = {self.input: feeds} if isinstance(feeds, np.ndarray) else feeds_of(feeds)
        rows = len(next(iter(feeds.values())))
        given = {}
        for name, shape in self.inputs.items():
            if name in feeds:
                given[name] = np.ascontiguousarray(feeds[name], np.float32)
            elif name in (ACTION_MASKS, RECURRENT_IN) and isinstance(shape[-1], int):
                fill = np.ones if name == ACTION_MASKS else np.zeros
                given[name] = fill((rows, *(1 for _ in shape[1:-1]), shape[-1]), np.float32)
            else:
                raise UserError(f"feeds {sorted(feeds)} lack the graph input {name!r}")
        values = self.session.run(None, given)
        return dict(zip(self.outputs, values))
