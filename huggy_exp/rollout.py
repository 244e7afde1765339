"""Any policy shape over time, for `fingerprint` and `stats`: every input fed, the memory carried step to step
(recurrent_out -> recurrent_in, from zeros), and every output recorded as [T, envs, *] under its file name:
`actions` (continuous, float32), `discrete_actions` (int64 [.., branches]), `memories` (float32 [.., memory_size]).

Closed loop: the surrogate dynamics (huggy_exp/dynamics.py) see all inputs side by side ([envs, sum of widths], each
input in its own normalizer's units, unit scale where it has none) and an action vector of the continuous actions
followed by a one-hot of every branch's discrete action."""

from __future__ import annotations

import itertools

import numpy as np

from huggy_exp.dynamics import Dynamics
from huggy_exp.mlagents import ACTION_MASKS, Normalizer, PolicyWeights, obs_name
from huggy_exp.runners import Recurrent, Runner
from huggy_exp.verify import DECLARED


def input_scale(weights: PolicyWeights) -> Normalizer | None:
    """One normalizer over all inputs side by side (mean 0, std 1 where an input has none); None when none has one."""
    if len(weights.inputs) == 1:
        return weights.normalizer
    if all(i.normalizer is None for i in weights.inputs):
        return None
    mean = np.concatenate([i.normalizer.running_mean if i.normalizer else np.zeros(i.size, np.float32) for i in weights.inputs])
    std = np.concatenate([i.normalizer.std if i.normalizer else np.ones(i.size, np.float32) for i in weights.inputs])
    return Normalizer(mean.astype(np.float32), None, None, folded_std=std.astype(np.float32))


def normalized_dims(weights: PolicyWeights) -> np.ndarray:
    """bool [sum of widths]: which of the side-by-side dimensions pass through a normalizer (and its ±5 clamp)."""
    return np.concatenate([np.full(i.size, i.normalizer is not None) for i in weights.inputs])


def side_by_side(feeds: dict[str, np.ndarray], weights: PolicyWeights) -> np.ndarray:
    return np.concatenate([feeds[obs_name(i)] for i in range(len(weights.inputs))], axis=-1)


def split(obs: np.ndarray, weights: PolicyWeights) -> dict[str, np.ndarray]:
    """[.., sum of widths] back into obs_0 .. obs_<k>."""
    bounds = np.cumsum(weights.obs_sizes)[:-1]
    return {obs_name(i): np.ascontiguousarray(part) for i, part in enumerate(np.split(obs, bounds, axis=-1))}


def seen(observations: np.ndarray, start: dict[str, np.ndarray], weights: PolicyWeights) -> dict[str, np.ndarray]:
    """A closed loop's observations [T, envs, sum of widths] as the feeds the policy saw, with the start feeds' action
    masks at every step."""
    feeds = split(observations, weights)
    if ACTION_MASKS in start:
        feeds[ACTION_MASKS] = np.broadcast_to(start[ACTION_MASKS], (len(observations), *start[ACTION_MASKS].shape)).copy()
    return feeds


def action_width(weights: PolicyWeights) -> int:
    return weights.act_dim + sum(weights.branch_sizes)


def action_vector(outputs: dict[str, np.ndarray], weights: PolicyWeights) -> np.ndarray:
    """float32 [envs, continuous + sum of branches]: the continuous actions, then a one-hot of each branch's action."""
    parts = [outputs["actions"].astype(np.float32)] if "actions" in outputs else []
    if "discrete_actions" in outputs:
        for b, size in enumerate(weights.branch_sizes):
            parts.append(np.eye(size, dtype=np.float32)[outputs["discrete_actions"][:, b]])
    return np.concatenate(parts, axis=-1)


class Stepper(Recurrent):
    """One step of the policy on one (device, dtype): feeds in, named outputs out, the memory carried from zeros
    (`masks` fill in absent action_masks). Step t of a sampled run draws with seed + t (the same CPU noise anywhere)."""

    def __init__(self, runner: Runner, kind: str = "deterministic", seed: int = 0, masks: np.ndarray | None = None):
        seeds = itertools.count(int(seed))
        sample = lambda f: runner.sample(f, next(seeds))  # noqa: E731
        super().__init__(runner.infer if kind == "deterministic" else sample, runner.memory_size)
        self.kind, self.masks = kind, masks

    def step(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.masks is not None and ACTION_MASKS not in feeds:
            feeds = {**feeds, ACTION_MASKS: self.masks}
        return named(super().step(feeds), self.kind)

    __call__ = step


def named(out: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """ML-Agents' output names -> file names; float32 actions and memories ([.., 1, m] -> [.., m]), int64 discrete."""
    keys = {o: o.name if kind == "deterministic" else o.sampled or o.name for o in DECLARED}
    return {o.stem: o.stored(out[key]) for o, key in keys.items() if key in out}


def open_loop(runner: Runner, feeds: dict[str, np.ndarray], kind: str = "deterministic", seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds [T, envs, d] (and action_masks [T, envs, .]): outputs [T, envs, *]. A policy without memory runs all T x envs
    rows as one batch (sampled: one draw with `seed`); with memory, step by step, the memory carried from zeros."""
    stepper = Stepper(runner, kind, seed)
    if runner.memory_size:
        return stepper.sequence(feeds)
    steps, envs = feeds[obs_name(0)].shape[:2]
    out = stepper({k: v.reshape(steps * envs, *v.shape[2:]) for k, v in feeds.items()})
    return {k: v.reshape(steps, envs, *v.shape[1:]) for k, v in out.items()}


def closed_loop(runner: Runner, weights: PolicyWeights, start: dict[str, np.ndarray], steps: int, dynamics: Dynamics,
                kind: str = "deterministic", seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """From the start feeds [envs, d_i] (action_masks, when given, hold for every step): the observations the policy saw
    ([T, envs, sum of widths], float32) and its outputs [T, envs, *], through `dynamics`."""
    stepper = Stepper(runner, kind, seed, start.get(ACTION_MASKS))
    outs: list[dict[str, np.ndarray]] = []

    def policy(obs: np.ndarray) -> np.ndarray:
        outs.append(stepper(split(obs, weights)))
        return action_vector(outs[-1], weights)

    observations, _ = dynamics.rollout(policy, side_by_side(start, weights), steps, input_scale(weights), action_width(weights))
    return observations, {k: np.stack([o[k] for o in outs]) for k in outs[0]}
