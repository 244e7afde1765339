"""Every backend behind one contract (Polygraphy's): infer(feeds) -> {output name: ndarray}. References are runners.

Feeds are keyed by ML-Agents' ONNX input names (`obs_0`: float32 [N, obs_dim]); a bare array is taken as `obs_0`.
`build()` is the one factory: backend `eager` (the policy in inference mode), `compile` (torch.compile with
inductor freezing), `graphs` (CUDA / NPU graph replay through the device module) or `onnxruntime` (the
ML-Agents .onnx on the provider that matches the device). Torch runners share one forward path
(Policy._run): trace() records the intermediates of that path, and its actions come from infer(), the timed call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from huggy_exp.errors import Unsupported, UserError
from huggy_exp.mlagents import ONNX_INPUT, PolicyWeights
from huggy_exp.placement import Target, device_module, resolve, synchronize
from huggy_exp.policy import Policy, cpu_noise

if TYPE_CHECKING:
    from huggy_exp.context import Context

ACTIONS = "deterministic_continuous_actions"
SAMPLED = "continuous_actions"
OBS = ONNX_INPUT
BACKENDS = ("eager", "compile", "graphs", "onnxruntime")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "npu": "CANNExecutionProvider"}

Feeds = Mapping[str, np.ndarray] | np.ndarray
_F32 = np.dtype(np.float32)


class Runner(Protocol):
    name: str

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]: ...


def obs_of(feeds: Feeds) -> np.ndarray:
    """The observation array of a feed dict (or a bare array)."""
    if type(feeds) is not np.ndarray:
        try:
            feeds = feeds[OBS]
        except KeyError:
            raise UserError(f"feeds {sorted(feeds)} lack {OBS!r}") from None
    return feeds if type(feeds) is np.ndarray else np.asarray(feeds)


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    return name


class TorchRunner:
    """The rebuilt policy on one (device, dtype), fed in chunks of `batch_size` rows, run by one torch backend."""

    def __init__(self, weights: PolicyWeights, target: Target, batch_size: int = 0, backend: str = "eager"):
        self.target = target
        self.batch_size = batch_size
        self.backend = check_backend(backend)
        if backend == "onnxruntime":
            raise UserError("TorchRunner runs torch backends; build onnxruntime with runners.build()")
        self.policy = Policy(weights).place(target.device, target.dtype)
        self.name = f"torch-{backend}-{target.device_name}-{target.dtype_name}"
        self._forward: Callable = self.policy
        self._sample: Callable = self.policy.sample
        if backend == "compile":
            self._forward, self._sample = _compiled(self.policy.forward), _compiled(self.policy.sample)
        elif backend == "graphs":
            graphs = _graph_api(target.device)
            self._forward, self._sample = GraphReplay(self.policy.forward, graphs), GraphReplay(self.policy.sample, graphs)

    @property
    def fixed_shape(self) -> bool:
        """Compiled code and captured graphs run one chunk shape: the last chunk is padded to it."""
        return self.backend in ("compile", "graphs")

    def _chunks(self, *arrays: np.ndarray, pad: bool | None = None):
        pad = self.fixed_shape if pad is None else pad
        rows = len(arrays[0])
        step = min(self.batch_size, rows) if self.batch_size and self.batch_size > 0 else rows
        for start in range(0, rows, max(step, 1)):
            parts = [np.ascontiguousarray(a[start : start + step]) for a in arrays]
            n = len(parts[0])
            if pad and n < step:
                parts = [np.concatenate([p, np.repeat(p[-1:], step - n, axis=0)]) for p in parts]
            yield start, n, [torch.from_numpy(p).to(self.target.device) for p in parts]

    def _collect(self, parts: list[dict[str, torch.Tensor]]) -> dict[str, np.ndarray]:
        synchronize(self.target.device)
        if len(parts) == 1:
            return {k: _numpy(v) for k, v in parts[0].items()}
        return {k: np.concatenate([_numpy(p[k]) for p in parts]) for k in parts[0]}

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        obs = obs_of(feeds)
        with torch.inference_mode():
            if self.batch_size <= 0 or len(obs) <= self.batch_size and not self.fixed_shape:  # one chunk, kept lean
                x = torch.from_numpy(np.ascontiguousarray(obs))
                return {ACTIONS: _numpy(self._forward(x if self.target.kind == "cpu" else x.to(self.target.device)))}
            return self._collect([{ACTIONS: self._forward(x)[:n]} for _, n, (x,) in self._chunks(obs)])

    @torch.inference_mode()
    def trace(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """The intermediates of the policy's one forward path (eager), with the actions of infer(), the timed path."""
        obs = obs_of(feeds)
        parts = [self.policy.trace(x) for _, _, (x,) in self._chunks(obs, pad=False)]
        out = self._collect(parts)
        out.pop("actions")
        out[ACTIONS] = self.infer(obs)[ACTIONS]
        return out

    @torch.inference_mode()
    def sample(self, feeds: Feeds, seed: int) -> dict[str, np.ndarray]:
        """Sampled actions; the noise is one CPU draw for all rows, so chunking and device do not change it."""
        obs = obs_of(feeds)
        noise = cpu_noise(len(obs), self.policy.act_dim, seed).numpy()
        parts = [{SAMPLED: self._sample(x, z)[:n]} for _, n, (x, z) in self._chunks(obs, noise)]
        return self._collect(parts)


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.float32 and t.device.type == "cpu":
        return t.numpy()
    t = t.detach().cpu()
    return (t.double() if t.dtype == torch.float64 else t.float()).numpy()


def _compiled(fn: Callable) -> Callable:
    """torch.compile with inductor freezing (weights folded as constants). `options={"freezing": True}` is ignored on
    the CPU in torch 2.13, so the inductor config is set (process-wide: it only affects compiled graphs)."""
    import os
    import shutil

    compilers = [c for c in (os.environ.get("CXX"), "g++", "c++", "clang++") if c and shutil.which(c)]
    if not compilers:
        raise Unsupported("backend compile: inductor needs a C++ compiler and none is on PATH (g++, c++, clang++, $CXX)")
    try:
        import torch._inductor.config as inductor_config
    except ImportError as exc:
        raise Unsupported(f"backend compile: torch inductor is unavailable ({exc})") from None
    inductor_config.freezing = True
    return torch.compile(fn, dynamic=False)


def _graph_api(device: torch.device):
    """The device module's graph class and capture context (torch.cuda.CUDAGraph, torch_npu's NPUGraph)."""
    if device.type == "cpu":
        raise Unsupported("backend graphs: the CPU has no graph replay (CUDA graphs / NPU graphs need cuda or npu)")
    mod = device_module(device)
    cls = getattr(mod, "CUDAGraph", None) or getattr(mod, "NPUGraph", None)
    if cls is None or not hasattr(mod, "graph"):
        raise Unsupported(f"backend graphs: torch.{device.type} offers no graph capture here")
    return mod, cls


class GraphReplay:
    """Capture `fn` once per input shape on static buffers, then replay: copy inputs in, replay, clone outputs."""

    def __init__(self, fn: Callable, graphs):
        self.fn, (self.mod, self.cls) = fn, graphs
        self.captured: dict[tuple, tuple] = {}

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in self.captured:
            static = [t.clone() for t in inputs]
            side = self.mod.Stream()
            side.wait_stream(self.mod.current_stream())
            with self.mod.stream(side):
                for _ in range(3):
                    self.fn(*static)
            self.mod.current_stream().wait_stream(side)
            graph = self.cls()
            with self.mod.graph(graph):
                out = self.fn(*static)
            self.captured[key] = (graph, static, out)
        graph, static, out = self.captured[key]
        for s, t in zip(static, inputs):
            s.copy_(t)
        graph.replay()
        return out.clone()


def check_provider(session, provider: str) -> None:
    """onnxruntime silently falls back to the CPU when a provider cannot start: refuse that."""
    active = session.get_providers()
    if not active or active[0] != provider:
        raise Unsupported(f"onnxruntime session runs on {active}, not on the requested {provider} (no silent fallback)")


class OnnxRunner:
    """onnxruntime on one execution provider; a missing provider fails with the list of available ones."""

    def __init__(self, path: Path, provider: str = "CPUExecutionProvider", threads: int = 0, seed: int | None = None,
                 batch_size: int = 0, device_id: int | None = None):
        import onnxruntime as ort

        if seed is not None:
            ort.set_seed(int(seed))  # RandomNormalLike draws become repeatable run to run (not equal to torch's)

        available = ort.get_available_providers()
        if provider not in available:
            raise UserError(f"onnxruntime provider {provider!r} is not available; available: {', '.join(available)}")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        providers = [(provider, {"device_id": device_id})] if device_id is not None else [provider]
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:
            raise UserError(f"onnxruntime could not load {path}: {str(exc).splitlines()[0]}") from None
        check_provider(self.session, provider)
        self.input = self.session.get_inputs()[0].name
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.batch_size = batch_size
        self.name = f"onnxruntime-{provider}"

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        obs = obs_of(feeds)
        if obs.dtype is not _F32 and obs.dtype != _F32 or not obs.flags.c_contiguous:
            obs = np.ascontiguousarray(obs, np.float32)
        if not self.batch_size or len(obs) <= self.batch_size:  # one call: the common case, kept lean for timing
            return dict(zip(self.outputs, self.session.run(self.outputs, {self.input: obs})))
        step = self.batch_size
        parts = [self.session.run(self.outputs, {self.input: obs[s : s + step]}) for s in range(0, len(obs), step)]
        batched = {i for i, o in enumerate(self.session.get_outputs()) if o.shape and not isinstance(o.shape[0], int)}
        return {name: (np.concatenate([p[i] for p in parts]) if i in batched else parts[0][i])
                for i, name in enumerate(self.outputs)}


def build(ctx: Context, backend: str | None = None, *, device: str | None = None, dtype: str | None = None,
          batch_size: int | None = None, threads: int | None = None, provider: str | None = None,
          onnx: Path | None = None) -> Runner:
    """The one factory: a runner for the context's (backend, device, dtype, batch size) or the overrides given."""
    backend = check_backend(backend or ctx.backend)
    batch = ctx.batch_size if batch_size is None else batch_size
    if backend == "onnxruntime":
        target = ctx.target(device, dtype)
        if target.dtype_name != "fp32":
            raise Unsupported(f"backend onnxruntime runs the float32 .onnx graph; dtype {target.dtype_name} does not apply")
        provider = provider or PROVIDERS.get(target.kind)
        if provider is None:
            raise Unsupported(f"backend onnxruntime: no execution provider for device {target.device_name}")
        index = target.device.index if target.kind != "cpu" else None
        return OnnxRunner(onnx or ctx.onnx_path(), provider, ctx.threads if threads is None else threads, ctx.seed, batch, index)
    return TorchRunner(ctx.weights, ctx.target(device, dtype), batch, backend)


def reference(ctx: Context, dtype: str = "fp64", batch_size: int = 0) -> TorchRunner:
    """The CPU eager reference used by the comparing modes (fp64 by default)."""
    return TorchRunner(ctx.weights, resolve("cpu", dtype), batch_size, "eager")
