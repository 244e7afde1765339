"""Every backend behind one contract: infer(obs float32 [N, obs_dim]) -> {output name: ndarray}. References are runners."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from huggy_exp.errors import UserError
from huggy_exp.mlagents import PolicyWeights
from huggy_exp.placement import Target, resolve, synchronize
from huggy_exp.policy import Policy, cpu_noise

ACTIONS = "deterministic_continuous_actions"
SAMPLED = "continuous_actions"


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

    def _collect(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
        synchronize(self.target.device)
        return {k: np.concatenate([_numpy(p[k]) for p in parts]) for k in parts[0]}

    @torch.inference_mode()
    def infer(self, obs: np.ndarray) -> dict[str, np.ndarray]:
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
    def sample(self, obs: np.ndarray, seed: int) -> dict[str, np.ndarray]:
        """Sampled actions; the noise is one CPU draw for all rows, so chunking and device do not change it."""
        noise = cpu_noise(len(obs), self.policy.act_dim, seed)
        return self._collect(
            [{SAMPLED: self.policy.sample(x, noise[s : s + len(x)])} for s, x in self._chunks(obs)]
        )


def reference(weights: PolicyWeights, dtype: str = "fp64", batch_size: int = 0) -> TorchRunner:
    """The CPU reference used by the comparing modes (fp64 by default)."""
    return TorchRunner(weights, resolve("cpu", dtype), batch_size)


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
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
        self.input = self.session.get_inputs()[0].name
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.name = f"onnxruntime-{provider}"

    def infer(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        values = self.session.run(None, {self.input: np.ascontiguousarray(obs, np.float32)})
        return dict(zip(self.outputs, values))
