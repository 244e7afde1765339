"""A documented, deterministic surrogate environment so a policy can be run closed-loop without Unity.

In normalized units z = (obs - mean) / std (mean 0, std 1 without a normalizer), one step is

    z[t+1] = decay * z[t] + gain * B @ a[t] + noise * e[t]

with B a fixed [obs_dim, act_dim] matrix of unit-norm columns and e[t] standard normal; B and e come from
numpy's PCG64 seeded by `seed`, so every device sees the same world. The dynamics run in float64 numpy on
the CPU: only the policy differs between the runs being compared. Actions feed back into what the policy
sees next, so error that accumulates in a loop shows up as drift.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from huggy_exp.mlagents import Normalizer


@dataclass(frozen=True)
class Dynamics:
    decay: float = 0.9
    gain: float = 0.5
    noise: float = 0.3
    seed: int = 0

    def rollout(self, policy: Callable[[np.ndarray], np.ndarray], start: np.ndarray, steps: int,
                normalizer: Normalizer | None, act_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """Observations [steps, envs, obs_dim] (float32, what the policy saw) and actions [steps, envs, act_dim]."""
        envs, obs_dim = start.shape
        mean = normalizer.running_mean.astype(np.float64) if normalizer is not None else np.zeros(obs_dim)
        std = normalizer.std.astype(np.float64) if normalizer is not None else np.ones(obs_dim)
        rng = np.random.Generator(np.random.PCG64(self.seed))
        b = rng.standard_normal((obs_dim, act_dim))
        b /= np.linalg.norm(b, axis=0, keepdims=True)
        noise = rng.standard_normal((steps, envs, obs_dim))
        z = (start.astype(np.float64) - mean) / std
        observations = np.empty((steps, envs, obs_dim), np.float32)
        actions = np.empty((steps, envs, act_dim), np.float32)
        for t in range(steps):
            observations[t] = (mean + std * z).astype(np.float32)
            actions[t] = policy(observations[t])
            z = self.decay * z + self.gain * actions[t].astype(np.float64) @ b.T + self.noise * noise[t]
        return observations, actions
