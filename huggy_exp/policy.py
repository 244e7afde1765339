"""The ML-Agents actor in torch, as its parts: per-input fp32 normalizers, N x [Linear + Swish], an optional LSTM, and
action heads (continuous PPO, tanh-squashed SAC, discrete branches; a hybrid policy has both) that own their forward."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from huggy_exp.config import BACKENDS
from huggy_exp.errors import UserError
from huggy_exp.mlagents import ACTION_CLAMP, LOG_SIGMA_RANGE, MASK_PENALTY, NORMALIZER_CLAMP, Lstm, Normalizer, PolicyWeights
from huggy_exp.verify import CONTINUOUS_ACTIONS, DISCRETE_ACTIONS, MEMORY

DISCRETE_SEED_OFFSET = 1_000_003  # the discrete draws' CPU stream: seed + this, apart from the Gaussian stream of `seed`


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    layer.load_state_dict({"weight": torch.from_numpy(weight), "bias": torch.from_numpy(bias)})
    return layer


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast only when needed: a no-op .to() would still be traced into an exported graph as a Cast node."""
    return t if t.dtype == dtype else t.to(dtype)


def _in(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`x` in the dtype of `layer`'s weight: under a precision plan, neighbouring parts compute in different dtypes."""
    return _cast(x, layer.weight.dtype)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The statistics', masking's, softmax's and squash's dtype: float64 for an fp64 reference, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Normalization(nn.Module):
    """One input's clamp((obs - running_mean) / std, -5, 5); identity without a normalizer. Stats are placement-exempt."""

    stats = ("running_mean", "std")

    def __init__(self, normalizer: Normalizer | None):
        super().__init__()
        self.enabled = normalizer is not None
        self.register_buffer("running_mean", torch.from_numpy(normalizer.running_mean) if normalizer else torch.zeros(0))
        self.register_buffer("std", torch.from_numpy(normalizer.std) if normalizer else torch.zeros(0))

    def forward(self, obs: torch.Tensor, stat_dtype: torch.dtype) -> torch.Tensor:
        obs = _cast(obs, stat_dtype)
        if not self.enabled:
            return obs
        return torch.clamp((obs - self.running_mean) / self.std, -NORMALIZER_CLAMP, NORMALIZER_CLAMP)


class ContinuousActions(nn.Module):
    """PPO's Gaussian head: deterministic clamp(mu, -3, 3) / 3, sampled clamp(mu + exp(log_sigma) * z, -3, 3) / 3."""

    deterministic_name, sampled_name = CONTINUOUS_ACTIONS.name, CONTINUOUS_ACTIONS.sampled
    stats = ("log_sigma_const",)

    def __init__(self, mu: tuple[np.ndarray, np.ndarray], log_sigma: np.ndarray | tuple[np.ndarray, np.ndarray]):
        super().__init__()
        self.mu = _linear(*mu)
        if isinstance(log_sigma, tuple):
            self.log_sigma = _linear(*log_sigma)
        else:
            self.register_buffer("log_sigma_const", torch.from_numpy(log_sigma))
            self.log_sigma = None

    def log_sigma_of(self, x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """clamp(Linear(x), -20, 2) for conditional sigma (SAC); else mu * 0 + log_sigma, ML-Agents' broadcast."""
        if self.log_sigma is None:
            return mu * 0 + self.log_sigma_const
        return torch.clamp(self.log_sigma(_in(self.log_sigma, x)), *LOG_SIGMA_RANGE)

    def mean(self, x: torch.Tensor) -> torch.Tensor:  # mu, in the head's own dtype
        return self.mu(_in(self.mu, x))

    def squash(self, raw: torch.Tensor) -> torch.Tensor:
        return torch.clamp(raw, -ACTION_CLAMP, ACTION_CLAMP) / ACTION_CLAMP

    def head(self, mu: torch.Tensor) -> torch.Tensor:
        """The deterministic action from mu, in the stat dtype."""
        return self.squash(_cast(mu, _stat_dtype(mu.dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.mean(x))

    def sample(self, x: torch.Tensor, noise: torch.Tensor, mu: torch.Tensor | None = None) -> torch.Tensor:
        """z drawn on the CPU by the caller, so every device sees the same noise; `mu` when already computed."""
        mu = self.mean(x) if mu is None else mu
        log_sigma = self.log_sigma_of(x, mu)
        dtype = _stat_dtype(mu.dtype)
        mu, log_sigma = _cast(mu, dtype), _cast(log_sigma, dtype)
        return self.squash(mu + torch.exp(log_sigma) * noise.to(mu.device, dtype))


class SquashedActions(ContinuousActions):
    """SAC's tanh-squashed Gaussian head: deterministic raw mu (as ML-Agents exports it), sampled tanh(mu + sigma * z)."""

    def squash(self, raw: torch.Tensor) -> torch.Tensor:
        return torch.tanh(raw)

    def head(self, mu: torch.Tensor) -> torch.Tensor:
        return _cast(mu, _stat_dtype(mu.dtype))


class DiscreteActions(nn.Module):
    """One Linear per branch; logits masked as ML-Agents masks them (logits * mask - 1e8 * (1 - mask)) in fp32, softmax;
    deterministic = argmax of the softmax per branch, sampled = a categorical draw from given uniforms. int64 [N, branches]."""

    deterministic_name, sampled_name = DISCRETE_ACTIONS.name, DISCRETE_ACTIONS.sampled

    def __init__(self, branches: tuple[tuple[np.ndarray, np.ndarray], ...]):
        super().__init__()
        self.sizes = tuple(int(w.shape[0]) for w, _ in branches)
        self.branches = nn.ModuleList(_linear(w, b) for w, b in branches)

    def logits(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Per branch, the raw Linear outputs (compute dtype), before masking."""
        return [branch(_in(branch, x)) for branch in self.branches]

    def masked_logits(self, x: torch.Tensor, masks: torch.Tensor | None,
                      logits: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per branch, logits * mask - 1e8 * (1 - mask) (stat dtype), raw without masks; `logits` when computed."""
        out, start = [], 0
        for size, logits in zip(self.sizes, self.logits(x) if logits is None else logits):
            logits = _cast(logits, _stat_dtype(logits.dtype))
            if masks is not None:
                allow = _cast(masks.narrow(1, start, size), logits.dtype)  # narrow, not [..]: no device guard
                logits = logits * allow - MASK_PENALTY * (-1.0 * allow + 1.0)
            out.append(logits)
            start += size
        return out

    def probs(self, x: torch.Tensor, masks: torch.Tensor | None, logits: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Per branch, the softmax of the masked logits (stat dtype)."""
        return [torch.softmax(z, dim=-1) for z in self.masked_logits(x, masks, logits)]

    def forward(self, x: torch.Tensor, masks: torch.Tensor | None = None, logits: list[torch.Tensor] | None = None) -> torch.Tensor:
        return torch.cat([torch.argmax(p, dim=1, keepdim=True) for p in self.probs(x, masks, logits)], dim=1)

    def sample(self, x: torch.Tensor, masks: torch.Tensor | None, uniform: torch.Tensor) -> torch.Tensor:
        """Inverse-CDF draw per branch from uniforms in (0, 1]: a masked action (probability 0) can never be drawn."""
        picks = []
        for b, p in enumerate(self.probs(x, masks)):
            cdf = torch.cumsum(p, dim=-1)
            u = uniform.narrow(1, b, 1).to(cdf.device, cdf.dtype) * cdf.narrow(1, p.shape[-1] - 1, 1)
            picks.append(torch.clamp((cdf < u).sum(dim=-1, keepdim=True), max=p.shape[-1] - 1))
        return torch.cat(picks, dim=1).to(torch.int64)


class Memory(nn.Module):
    """ML-Agents' LSTM step: memory [N, 1, m] holds h (first m/2) and c (second m/2); one step of a length-1 sequence."""

    def __init__(self, weights: Lstm):
        super().__init__()
        self.hidden = weights.hidden_size
        self.lstm = nn.LSTM(weights.weight_ih.shape[1], self.hidden, batch_first=True)
        self.lstm.load_state_dict({f"{name}_l0": torch.from_numpy(getattr(weights, name))
                                   for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = _cast(x, self.lstm.weight_ih_l0.dtype)
        mem = _cast(memory, x.dtype).transpose(0, 1)  # [1, N, m], as ML-Agents holds it
        h0, c0 = torch.split(mem, self.hidden, dim=-1)
        out, (h, c) = self.lstm(x.reshape(-1, 1, x.shape[-1]), (h0.contiguous(), c0.contiguous()))
        return out.reshape(-1, self.hidden), torch.cat([h, c], dim=-1).transpose(0, 1)


class Policy(nn.Module):
    """Named inputs (float32) in, ML-Agents' outputs out; `dtype` applies to the MLP, LSTM and heads only.

    The normalizer statistics stay float32 (float64 for an fp64 reference): ML-Agents' running variance is a
    cumulative sum up to ~1e9, which is inf in float16. So do masking, softmax and the action squash.
    """

    def __init__(self, weights: PolicyWeights):
        super().__init__()
        self.obs_sizes, self.obs_dim, self.act_dim = weights.obs_sizes, weights.obs_dim, weights.act_dim
        self.branch_sizes, self.memory_size = weights.branch_sizes, weights.memory
        self.tanh_squash, self.shape = weights.tanh_squash, weights.describe_shape()
        # Huggy's shape (one input, continuous actions, no memory) runs forward()'s lean path, whoever asks
        self._huggy_shaped = len(weights.inputs) == 1 and weights.mu is not None and not weights.branches and weights.lstm is None
        self.normalizers = nn.ModuleList(Normalization(i.normalizer) for i in weights.inputs)
        self.body = nn.ModuleList(_linear(weight, bias) for weight, bias in weights.layers)  # each followed by Swish
        self.memory = Memory(weights.lstm) if weights.lstm is not None else None
        head = SquashedActions if weights.tanh_squash else ContinuousActions
        self.continuous = head(weights.mu, weights.log_sigma) if weights.mu is not None else None
        self.discrete = DiscreteActions(weights.branches) if weights.branches else None
        # plain tuples of the same Linear modules and Parameters (.to() converts Parameters in place): no per-call lookups
        self._linears = tuple(self.body)
        self.stat_dtype = torch.float32
        self._cache_parameters()
        self.requires_grad_(False)
        self.eval()

    def _cache_parameters(self) -> None:
        """The plain weights of the one-row addmv path (_mu); none for quantized ones, which run through their Linear."""
        layers = (*self._linears, *((self.continuous.mu,) if self.continuous is not None else ()))
        plain = all(type(m.weight) is nn.Parameter for m in layers)
        self._gemv = tuple((m.weight, m.bias) for m in layers) if plain else ()

    def parts(self) -> dict[str, nn.Module]:
        """What a precision plan names, as precision's per-layer table prints it: hidden_<i> (Linear + Swish), lstm, mu
        (the continuous head, its log_sigma layer too), logits (every discrete branch). The normalizers are no part."""
        named = {f"hidden_{i}": layer for i, layer in enumerate(self.body)}
        named.update({k: m for k, m in (("lstm", self.memory), ("mu", self.continuous), ("logits", self.discrete)) if m is not None})
        return named

    def place(self, device: torch.device, dtype: torch.dtype, quantize: Callable[[nn.Module], None] | None = None,
              parts: dict[str, torch.dtype] | None = None) -> "Policy":
        """Move to the device; the layers take `dtype` (each part its own with a plan's `parts`), the statistics stay
        fp32 (fp64 only where every layer is); then `quantize` (placement.quantize) replaces the Linear weights in place.
        Each tensor is converted once from its float32 original (fp16 would round the statistics) and set anew, never
        swapped in place, so FakeTensorMode can place the policy on an absent device (test_placement_fake_device.py)."""
        owner = {m: parts[name] for name, part in self.parts().items() if parts and name in parts for m in part.modules()}
        self.stat_dtype = stat_dtype = _stat_dtype(dtype) if not parts else torch.float64 if all(
            d == torch.float64 for d in parts.values()) else torch.float32
        self._gemv = ()
        for module in self.modules():
            exempt, layer = set(getattr(module, "stats", ())), owner.get(module, dtype)
            for name, param in list(module._parameters.items()):
                if param is not None:
                    setattr(module, name, nn.Parameter(param.detach().to(device=device, dtype=layer), requires_grad=False))
            for name, buffer in list(module._buffers.items()):
                if buffer is not None:
                    kind = stat_dtype if name in exempt else layer if buffer.is_floating_point() else buffer.dtype
                    module._buffers[name] = buffer.to(device=device, dtype=kind)
        if self.memory is not None:  # cuDNN wants the LSTM's weights in one buffer, or it repacks them on every call
            self.memory.lstm.flatten_parameters()
        if quantize is not None:
            quantize(self)
        self._cache_parameters()
        return self

    def check_single(self, what: str) -> None:
        """`what` runs forward() and sample(), the single-tensor path: refused for any other shape, in one line."""
        if not self._huggy_shaped:
            raise UserError(f"{what} runs Huggy's shape only (one input, continuous actions, no memory); this policy has "
                            f"{self.shape}: use backend {' or '.join(n for n, b in BACKENDS.items() if b.forward is None)}")

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.body[0].weight.dtype

    # --- the shared trunk: inputs -> features (and the next memory)

    def normalize(self, obs: torch.Tensor, index: int = 0) -> torch.Tensor:
        return self.normalizers[index](obs, self.stat_dtype)

    def encode(self, obs: list[torch.Tensor], memory: torch.Tensor | None = None,
               record: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Normalize each input (stat dtype), concatenate in input order, MLP (compute dtype), then the LSTM step."""
        parts = [self.normalize(x, i) for i, x in enumerate(obs)]
        if record is not None:
            record.update({"normalized_obs": parts[0]} if len(parts) == 1 else {f"normalized_obs_{i}": p for i, p in enumerate(parts)})
        x = self._hidden(_cast(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1), self.compute_dtype), record)
        if self.memory is None:
            return x, None
        if memory is None:
            memory = torch.zeros(x.shape[0], 1, self.memory_size, device=x.device, dtype=self.stat_dtype)
        x, memory = self.memory(x, memory)
        if record is not None:
            record["lstm"] = x
        return x, memory

    def act(self, obs: list[torch.Tensor], masks: torch.Tensor | None = None, memory: torch.Tensor | None = None,
            noise: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """ML-Agents' outputs by ONNX name: deterministic actions of every head (sampled ones when `noise` is given,
        keyed by head output name: a Gaussian z for continuous, uniforms for discrete) and `recurrent_out`. Huggy's
        shape runs forward() and sample(), its lean path."""
        if self._huggy_shaped:
            if noise is None:
                return {CONTINUOUS_ACTIONS.name: self.forward(obs[0])}
            return {CONTINUOUS_ACTIONS.sampled: self.sample(obs[0], noise[CONTINUOUS_ACTIONS.sampled])}
        x, memory_out = self.encode(obs, memory)
        out = {}
        for head, args in ((self.continuous, (x,)), (self.discrete, (x, masks))):
            if head is None:
                continue
            if noise is None:
                out[head.deterministic_name] = head(*args)
            else:
                out[head.sampled_name] = head.sample(*args, noise[head.sampled_name])
        return self._with_memory(out, memory_out)

    def distributions(self, obs: list[torch.Tensor], masks: torch.Tensor | None = None,
                      memory: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """What the sampled outputs draw from: `mu` and `log_sigma` (continuous), `masked_logits` (discrete, every branch
        side by side, stat dtype), and `recurrent_out`."""
        x, memory_out = self.encode(obs, memory)
        out = {}
        if self.continuous is not None:
            out["mu"] = self.continuous.mean(x)
            out["log_sigma"] = self.continuous.log_sigma_of(x, out["mu"])
        if self.discrete is not None:
            out["masked_logits"] = torch.cat(self.discrete.masked_logits(x, masks), dim=1)
        return self._with_memory(out, memory_out)

    def _with_memory(self, out: dict[str, torch.Tensor], memory: torch.Tensor | None) -> dict[str, torch.Tensor]:
        if memory is not None:
            out[MEMORY.name] = _cast(memory, self.stat_dtype)
        return out

    def _hidden(self, x: torch.Tensor, record: dict | None = None, row: bool = False) -> torch.Tensor:
        """[Linear, Swish] x N in the compute dtype: the one trunk every output (deterministic, sampled, traced, every
        shape) comes from; the hidden layers into `record`. `row`: one CPU row as a vector (forward's fast path)."""
        for i, layer in enumerate(self._linears):
            x = torch.addmv(self._gemv[i][1], self._gemv[i][0], _cast(x, self._gemv[i][0].dtype)) if row else layer(_in(layer, x))
            x = torch.sigmoid(x).mul_(x)  # Swish, as ML-Agents spells it (bit for bit); in place: one buffer less
            if record is not None:
                record[f"hidden_{i}"] = x.unsqueeze(0) if row else x
        return x

    # --- the continuous single-input path (Huggy's shape): the same trunk, kept lean for timing

    def trace(self, obs: torch.Tensor | list[torch.Tensor], masks: torch.Tensor | None = None,
              memory: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Every intermediate, for per-layer attribution: normalized_obs(_<i>), hidden_<i>, lstm, mu, log_sigma, logits
        (every branch's, side by side), and the deterministic outputs and recurrent_out from the same values. Huggy's
        shape runs forward() itself, recording on the way: what is verified is what runs."""
        out: dict[str, torch.Tensor] = {}
        obs = [obs] if isinstance(obs, torch.Tensor) else obs
        if self._huggy_shaped:
            out[self.continuous.deterministic_name] = self.forward(obs[0], out)
            return out
        x, memory_out = self.encode(obs, memory, record=out)
        if self.continuous is not None:
            out["mu"] = self.continuous.mean(x)
            out["log_sigma"] = self.continuous.log_sigma_of(x, out["mu"])
            out[self.continuous.deterministic_name] = self.continuous.head(out["mu"])
        if self.discrete is not None:
            logits = self.discrete.logits(x)
            out["logits"] = torch.cat(logits, dim=1)
            out[self.discrete.deterministic_name] = self.discrete(x, masks, logits)
        return self._with_memory(out, memory_out)

    def _mu(self, obs: torch.Tensor, record: dict[str, torch.Tensor] | None = None):
        """normalize (stat dtype) -> trunk (compute dtype) -> mu for Huggy's shape: (last hidden, mu, keep), the
        intermediates into `record`. One CPU row runs as a vector through addmv (MKL's gemv; addmm's one-row path is
        ~2x slower there); `keep` gives a vector back its row dimension."""
        row = obs.dim() == 2 and obs.shape[0] == 1 and obs.device.type == "cpu" and bool(self._gemv)
        keep = (lambda t: t.unsqueeze(0)) if row else (lambda t: t)  # noqa: E731
        x = self.normalize(obs[0] if row else obs)
        if record is not None:
            record["normalized_obs"] = keep(x)
        x = self._hidden(_cast(x, self.compute_dtype), record, row)
        mu = torch.addmv(self._gemv[-1][1], self._gemv[-1][0], _cast(x, self._gemv[-1][0].dtype)) if row else self.continuous.mean(x)
        return x, mu, keep

    def forward(self, obs: torch.Tensor, record: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Huggy's shape's deterministic actions, from _mu's trunk; mu and log_sigma into `record` too."""
        head = self.continuous
        x, mu, keep = self._mu(obs, record)
        if record is not None:
            record["mu"] = keep(mu)
            log_sigma = head.log_sigma_of(x, mu)
            record["log_sigma"] = log_sigma.reshape(1, -1) if log_sigma.dim() == 1 else log_sigma
        return keep(head.head(mu))

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Huggy's shape's sampled actions: forward()'s mu (same trunk and fast path) plus sigma times CPU noise."""
        x, mu, _ = self._mu(obs)
        return self.continuous.sample(x, noise, mu).reshape(noise.shape)


def has_linear(module: nn.Module) -> bool:
    """Whether `module` holds an nn.Linear: what torchao's int8 quantizes (an LSTM has none)."""
    return any(isinstance(m, nn.Linear) for m in module.modules())


def cpu_noise(rows: int, act_dim: int, seed: int) -> torch.Tensor:
    """Standard normal noise from a seeded CPU generator: the same bytes whatever device consumes it."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn(rows, act_dim, generator=gen, dtype=torch.float32)


def cpu_uniform(rows: int, branches: int, seed: int) -> torch.Tensor:
    """Uniforms in (0, 1] for the discrete draws, from a seeded CPU generator (its own stream, seed + offset)."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed) + DISCRETE_SEED_OFFSET)
    return 1.0 - torch.rand(rows, branches, generator=gen, dtype=torch.float64)
