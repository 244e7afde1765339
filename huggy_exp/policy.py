"""The ML-Agents actor in torch: fp32 normalizer, N x [Linear + Swish], mu head, deterministic and sampled actions."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from huggy_exp.mlagents import ACTION_CLAMP, LOG_SIGMA_RANGE, NORMALIZER_CLAMP, PolicyWeights


class Swish(nn.Module):
    """x * sigmoid(x), spelled as ML-Agents and its ONNX graph spell it (bit-identical to their outputs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def _linear(weight: np.ndarray, bias: np.ndarray) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(weight))
        layer.bias.copy_(torch.from_numpy(bias))
    return layer


class Policy(nn.Module):
    """Observations (float32) in, actions (float32) out; `dtype` applies to the MLP and heads only.

    The normalizer statistics stay float32 (float64 for an fp64 reference): ML-Agents' running variance is a
    cumulative sum up to ~1e9, which is inf in float16.
    """

    def __init__(self, weights: PolicyWeights):
        super().__init__()
        self.obs_dim, self.act_dim = weights.obs_dim, weights.act_dim
        self.tanh_squash = weights.tanh_squash
        n = weights.normalizer
        self.has_normalizer = n is not None
        self.register_buffer("running_mean", torch.from_numpy(n.running_mean) if n else torch.zeros(0))
        self.register_buffer("std", torch.from_numpy(n.std) if n else torch.zeros(0))
        body: list[nn.Module] = []
        for weight, bias in weights.layers:
            body += [_linear(weight, bias), Swish()]
        self.body = nn.Sequential(*body)
        self.mu = _linear(*weights.mu)
        # plain tuples of the same Linear modules and Parameters (.to() converts Parameters in place): no per-call lookups
        self._linears = tuple(m for m in body if isinstance(m, nn.Linear))
        self._gemv = tuple((m.weight, m.bias) for m in (*self._linears, self.mu))
        if weights.conditional_sigma:
            self.log_sigma = _linear(*weights.log_sigma)
        else:
            self.register_buffer("log_sigma_const", torch.from_numpy(weights.log_sigma))
            self.log_sigma = None
        self.requires_grad_(False)
        self.eval()

    def place(self, device: torch.device, dtype: torch.dtype) -> "Policy":
        """Move to the device; the MLP takes `dtype`, the normalizer stays fp32 (fp64 only for an fp64 run)."""
        stat_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        names = ("running_mean", "std", "log_sigma_const")
        stats = {n: getattr(self, n) for n in names if hasattr(self, n)}  # taken before .to(): fp16 would round them
        self.to(device=device, dtype=dtype)
        for name, value in stats.items():
            setattr(self, name, value.to(device=device, dtype=stat_dtype))
        self._gemv = tuple((m.weight, m.bias) for m in (*self._linears, self.mu))  # in case .to() made new Parameters
        return self

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.mu.weight.dtype

    @property
    def stat_dtype(self) -> torch.dtype:
        return torch.float64 if self.compute_dtype == torch.float64 else torch.float32

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        obs = _cast(obs, self.stat_dtype)
        if not self.has_normalizer:
            return obs
        return torch.clamp((obs - self.running_mean) / self.std, -NORMALIZER_CLAMP, NORMALIZER_CLAMP)

    def trace(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every intermediate, for per-layer attribution: normalized_obs, hidden_0.., mu, log_sigma, actions.

        The same code as forward() (one path, recording on the way), so what is verified is what runs.
        """
        out: dict[str, torch.Tensor] = {}
        out["actions"] = self._run(obs, out)
        return out

    def _run(self, obs: torch.Tensor, record: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """normalize (stat dtype) -> [Linear, Swish] x N (compute dtype) -> mu -> head; intermediates into `record`.

        One row on the CPU runs as a vector through addmv (MKL's gemv): addmm's one-row path is ~2x slower there.
        """
        row = obs.dim() == 2 and obs.shape[0] == 1 and obs.device.type == "cpu"
        keep = (lambda t: t.unsqueeze(0)) if row else (lambda t: t)  # noqa: E731
        x = self.normalize(obs[0] if row else obs)
        if record is not None:
            record["normalized_obs"] = keep(x)
        x = _cast(x, self.compute_dtype)
        for i, layer in enumerate(self._linears):
            x = torch.addmv(self._gemv[i][1], self._gemv[i][0], x) if row else layer(x)
            x = torch.sigmoid(x).mul_(x)  # Swish as in self.body, bit for bit; in place: one buffer less per layer
            if record is not None:
                record[f"hidden_{i}"] = keep(x)
        mu = torch.addmv(self._gemv[-1][1], self._gemv[-1][0], x) if row else self.mu(x)
        if record is not None:
            record["mu"] = keep(mu)
            log_sigma = self.log_sigma_of(x, mu)
            record["log_sigma"] = log_sigma.reshape(1, -1) if row else log_sigma
        return keep(self.head(mu))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The last hidden layer: normalize (stat dtype), then the MLP in the compute dtype (as in _run)."""
        return self.body(_cast(self.normalize(obs), self.compute_dtype))

    def log_sigma_of(self, x: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
        """clamp(Linear(x), -20, 2) for conditional sigma (SAC); else mu * 0 + log_sigma, ML-Agents' broadcast."""
        if self.log_sigma is None:
            return mu * 0 + self.log_sigma_const
        return torch.clamp(self.log_sigma(x), *LOG_SIGMA_RANGE)

    def squash(self, raw: torch.Tensor) -> torch.Tensor:
        """tanh for tanh-squashed (SAC) policies, else clamp(raw, -3, 3) / 3."""
        return torch.tanh(raw) if self.tanh_squash else torch.clamp(raw, -ACTION_CLAMP, ACTION_CLAMP) / ACTION_CLAMP

    def head(self, mu: torch.Tensor) -> torch.Tensor:
        """ML-Agents' deterministic action: clamp(mu, -3, 3) / 3, or raw mu for tanh-squashed (SAC) policies."""
        mu = _cast(mu, self.stat_dtype)
        return mu if self.tanh_squash else self.squash(mu)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self._run(obs)

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """clamp(mu + exp(log_sigma) * z, -3, 3) / 3 (tanh(...) for SAC), with z given: drawn on the CPU by the caller."""
        t = self.trace(obs)
        mu, log_sigma = _cast(t["mu"], self.stat_dtype), _cast(t["log_sigma"], self.stat_dtype)
        return self.squash(mu + torch.exp(log_sigma) * noise.to(mu.device, self.stat_dtype))


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast only when needed: a no-op .to() would still be traced into an exported graph as a Cast node."""
    return t if t.dtype == dtype else t.to(dtype)


def cpu_noise(rows: int, act_dim: int, seed: int) -> torch.Tensor:
    """Standard normal noise from a seeded CPU generator: the same bytes whatever device consumes it."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn(rows, act_dim, generator=gen, dtype=torch.float32)
