"""A documented, deterministic surrogate environment so a policy can be run closed-loop without Unity.

In normalized units z = (obs - mean) / std (mean 0, std 1 without a normalizer), one step is

    z[t+1] = decay * z[t] + gain * B @ a[t] + noise * e[t]

with B a fixed [obs_dim, act_dim] matrix of unit-norm columns and e[t] standard normal; B and e come from numpy's PCG64
seeded by `seed`, so every device sees the same world. The dynamics run in float64 numpy on the CPU: only the policy
differs between the runs compared. Actions feed back into what the policy sees next, so accumulated error shows as
drift."""

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
        world = self.world(start, normalizer, act_dim)
        observations = np.empty((steps, *start.shape), np.float32)
        actions = np.empty((steps, start.shape[0], act_dim), np.float32)
        for t in range(steps):
            observations[t] = world.observe()
            actions[t] = policy(observations[t])
            world.step(actions[t])
        return observations, actions

    def world(self, start: np.ndarray, normalizer: Normalizer | None, act_dim: int) -> "World":
        """The dynamics one step at a time (a control loop reads an observation, then acts)."""
        envs, obs_dim = start.shape
        mean = normalizer.running_mean.astype(np.float64) if normalizer is not None else np.zeros(obs_dim)
        std = normalizer.std.astype(np.float64) if normalizer is not None else np.ones(obs_dim)
        rng = np.random.Generator(np.random.PCG64(self.seed))
        b = rng.standard_normal((obs_dim, act_dim))
        b /= np.linalg.norm(b, axis=0, keepdims=True)
        return World(self, mean, std, b, rng, (start.astype(np.float64) - mean) / std)


@dataclass
class World:
    """The state z of `Dynamics` between steps: observe() what the policy sees, step(action) advances one step."""

    dynamics: Dynamics
    mean: np.ndarray
    std: np.ndarray
    b: np.ndarray
    rng: np.random.Generator  # the step noise, drawn step by step: the same numbers as one [steps, envs, obs_dim] draw
    z: np.ndarray

    def observe(self) -> np.ndarray:
        return (self.mean + self.std * self.z).astype(np.float32)

    def step(self, action: np.ndarray) -> None:
        d = self.dynamics
        noise = self.rng.standard_normal(self.z.shape)
        self.z = d.decay * self.z + d.gain * action.astype(np.float64) @ self.b.T + d.noise * noise
