"""Every backend behind one contract (Polygraphy's): infer(feeds) -> {output name: ndarray}, feeds and outputs under
ML-Agents' ONNX names (docs/architecture.md, the runner contract). References are runners; `build()` is the one factory.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from huggy_exp.config import BACKENDS, ONNX_DTYPE, REFERENCE_BACKEND
from huggy_exp.errors import Unsupported, UserError, first_line
from huggy_exp.fused import FusedMLP, need_compiler
from huggy_exp.mlagents import (ACTION_MASKS, ONNX_INPUT, RECURRENT_IN, RECURRENT_OUT, PolicyWeights, obs_name, read_onnx,
                                with_distributions, with_parts)
from huggy_exp.placement import (
    DTYPES, QUANTIZED, TORCHAIR_MODE, Target, check_backend, onnxruntime_options, option_spellings, quantize, quantize_onnx, resolve,
    synchronize, use_device,
)
from huggy_exp.policy import Policy, cpu_noise, cpu_uniform, has_linear
from huggy_exp.verify import CONTINUOUS_ACTIONS, DISCRETE_ACTIONS

if TYPE_CHECKING:
    from huggy_exp.context import Context

ACTIONS, SAMPLED = CONTINUOUS_ACTIONS.name, CONTINUOUS_ACTIONS.sampled  # ML-Agents' output names (verify.DECLARED)
DISCRETE, DISCRETE_SAMPLED = DISCRETE_ACTIONS.name, DISCRETE_ACTIONS.sampled
OBS = ONNX_INPUT
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "npu": "CANNExecutionProvider"}
# torch.compile's backend per device kind: inductor on the CPU and CUDA; on Ascend torch_npu's own dynamo backend
# "npu" (torchair, built in placement.TORCHAIR_MODE): inductor there needs triton-ascend and only warns when it is missing
COMPILE_BACKENDS = {"cpu": "inductor", "cuda": "inductor", "mps": "inductor", "npu": "npu"}

Feeds = Mapping[str, np.ndarray]
_F32 = np.dtype(np.float32)


# --- the contract every backend keeps


class Runner(Protocol):
    """All that callers use; `target` is where its work runs (timing synchronises on it). A backend that cannot
    sample, trace or give distributions raises Unsupported saying so."""

    name: str
    target: Target
    memory_size: int
    fixed_shape: bool

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]: ...

    def sample(self, feeds: Feeds, seed: int) -> dict[str, np.ndarray]: ...

    def trace(self, feeds: Feeds) -> dict[str, np.ndarray]: ...

    def distributions(self, feeds: Feeds) -> dict[str, np.ndarray]: ...


# --- torch: one runner for eager and the backends that wrap the policy's forward


class TorchRunner:
    """The rebuilt policy on one (device, dtype), fed in chunks of `batch_size` rows, run by one torch backend."""

    def __init__(self, weights: PolicyWeights, target: Target, batch_size: int = 0, backend: str = REFERENCE_BACKEND):
        self.target, self.batch_size, self._on_cpu = target, batch_size, target.kind == "cpu"
        spec = BACKENDS[check_backend(backend)]
        self.backend, self.fixed_shape = backend, spec.fixed_shape  # fixed: the last chunk is padded to the chunk shape
        if spec.runner is not None:
            raise UserError(f"TorchRunner runs torch backends; build {backend} with runners.build()")
        self.policy = Policy(weights)
        if spec.forward is not None:  # a shape it cannot run is the job's error, before what this point can run
            self.policy.check_single(f"backend {backend}")
        check_backend(backend, target)
        use_device(target.device)
        plan = dict(target.plan.parts) if target.plan else None
        self.policy.place(target.device, target.dtype, partial(_quantize, dtype=target.dtype_name, plan=plan),
                          plan and {part: DTYPES[d] for part, d in plan.items()})
        self.name = f"torch-{backend}-{target.device_name}-{target.label}"
        self.memory_size = self.policy.memory_size
        self._act: Callable = self.policy.act
        if spec.forward is None:
            return
        self._act = self._single
        self._forward, self._sample = declared(spec.forward)(self.policy, target)

    def _single(self, obs: list[torch.Tensor], masks: None, memory: None, noise: dict | None = None) -> dict[str, torch.Tensor]:
        """Policy.act's outputs from the backend's single-tensor forward (one input, continuous actions, no memory)."""
        if noise is None:
            return {ACTIONS: self._forward(obs[0])}
        return {SAMPLED: self._sample(obs[0], noise[SAMPLED].to(self.target.device))}

    def _fit(self, feeds: Feeds) -> list[np.ndarray | None]:
        """obs_0 .. obs_<k>, action_masks, recurrent_in (None where absent or not the policy's), checked: one line
        naming what does not fit."""
        p = self.policy
        obs = feeds.get(OBS) if len(feeds) == 1 and len(p.obs_sizes) == 1 else None
        if obs is not None and obs.ndim == 2 and obs.shape[1] == p.obs_dim:
            return [obs, None, None]
        sizes, wanted = p.obs_sizes, [obs_name(i) for i in range(len(p.obs_sizes))]
        # inputs without normalizers meet in one Concat before the first layer, so a policy read as one input of the
        # concatenated width (a .pt without its .onnx) takes obs_0 ... obs_<k> concatenated: the same numbers
        given = [obs_name(i) for i in range(len(feeds)) if obs_name(i) in feeds]
        if len(sizes) == 1 and len(given) > 1 and sum(feeds[n].shape[-1] for n in given) == sizes[0]:
            feeds = {**{k: v for k, v in feeds.items() if k not in given}, OBS: np.concatenate([feeds[n] for n in given], axis=-1)}
        missing = [n for n in wanted if n not in feeds]
        if missing:
            raise UserError(f"feeds {sorted(feeds)} lack {missing} (this policy has {len(sizes)} observation inputs {list(sizes)})")
        wrong = [f"{n} {list(np.shape(feeds[n]))}" for n, size in zip(wanted, sizes) if np.shape(feeds[n])[-1:] != (size,)]
        if wrong:
            raise UserError(f"feeds {', '.join(wrong)} do not fit this policy's inputs {list(sizes)} (obs_i is [N, d_i])")
        arrays = [feeds[n] for n in wanted]
        arrays += [feeds.get(ACTION_MASKS) if p.discrete is not None else None, feeds.get(RECURRENT_IN) if p.memory is not None else None]
        rows = len(arrays[0])
        expected = [(rows, size) for size in sizes] + [(rows, sum(p.branch_sizes)), (rows, 1, p.memory_size)]
        names = [*wanted, ACTION_MASKS, RECURRENT_IN]
        wrong = [f"{name} {list(np.shape(a))} (expected {list(shape)})" for name, a, shape in zip(names, arrays, expected)
                 if a is not None and np.shape(a) != shape]
        if wrong:
            raise UserError(f"feeds do not fit this policy: {'; '.join(wrong)}")
        return arrays

    def _chunks(self, feeds: Feeds, noise: dict[str, torch.Tensor] | None = None, pad: bool | None = None) -> list:
        """(obs list, masks, memory, CPU noise) per chunk of `batch_size` rows; a fixed-shape backend's last one padded."""
        arrays = self._fit(feeds)
        rows = len(arrays[0])
        step = self.batch_size if 0 < self.batch_size < rows else rows
        if step == rows and noise is None:  # one chunk: kept lean for timing
            parts = [a if a is None else self._to(torch.from_numpy(np.ascontiguousarray(a, np.float32))) for a in arrays]
            return [(parts[:-2], parts[-2], parts[-1], None)]
        names = list(noise or ())
        arrays += [noise[k] for k in names]
        inputs = len(arrays) - len(names)
        pad = (self.fixed_shape if pad is None else pad) and rows % step
        chunks = []
        for start in range(0, rows, max(step, 1)):
            n = min(step, rows - start)
            parts = [a if a is None else a.narrow(0, start, n) if isinstance(a, torch.Tensor)
                     else torch.from_numpy(np.ascontiguousarray(a[start : start + step], np.float32)) for a in arrays]
            if pad and n < step:
                parts = [p if p is None else torch.cat([p, p[-1:].expand(step - n, *p.shape[1:])]) for p in parts]
            parts[:inputs] = [p if p is None else self._to(p) for p in parts[:inputs]]
            chunks.append((parts[: inputs - 2], parts[inputs - 2], parts[inputs - 1], dict(zip(names, parts[inputs:])) if names else None))
        return chunks

    def _to(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._on_cpu else t.to(self.target.device)

    def _collect(self, parts: list[dict[str, torch.Tensor]], rows: int | None = None) -> dict[str, np.ndarray]:
        """The chunks' outputs as one array each (`rows` of them: a padded last chunk cut)."""
        if not self._on_cpu:
            synchronize(self.target.device)
        if len(parts) == 1 and rows is None:
            return {k: _numpy(v) for k, v in parts[0].items()}
        return {k: np.concatenate([_numpy(p[k]) for p in parts])[:rows] for k in parts[0]}

    def _run(self, feeds: Feeds, noise: dict[str, torch.Tensor] | None = None) -> dict[str, np.ndarray]:
        use_device(self.target.device)  # whichever thread calls (LoadGen's server worker, its issue thread)
        chunks = self._chunks(feeds, noise)
        with torch.inference_mode():
            parts = [self._act(*chunk) for chunk in chunks]
        return self._collect(parts, len(feeds[OBS]) if self.fixed_shape and len(parts) > 1 else None)

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        return self._run(feeds)

    def sample(self, feeds: Feeds, seed: int) -> dict[str, np.ndarray]:
        """Sampled actions; the noise is one CPU draw for all rows, so chunking and device do not change it."""
        return self._run(feeds, sample_noise(self.policy, len(feeds[obs_name(0)]), seed))

    def trace(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Every intermediate (Policy.trace, eager) with the outputs of infer(): what is verified is what runs."""
        return {**self._eager(self.policy.trace, feeds), **self.infer(feeds)}

    def distributions(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """What the sampled outputs draw from (Policy.distributions): mu, log_sigma, masked_logits, recurrent_out."""
        return self._eager(self.policy.distributions, feeds)

    @torch.inference_mode()
    def _eager(self, fn: Callable, feeds: Feeds) -> dict[str, np.ndarray]:
        use_device(self.target.device)
        return self._collect([fn(obs, masks, memory) for obs, masks, memory, _ in self._chunks(feeds, pad=False)])


def _quantize(policy: Policy, dtype: str, plan: dict[str, str] | None) -> None:
    """placement.quantize for the whole policy, or part by part under a plan."""
    if plan is None:
        return quantize(policy, dtype)
    for part, module in policy.parts().items():
        if plan[part] in QUANTIZED and not has_linear(module):
            raise UserError(f"plan: part {part} cannot be {plan[part]}: torchao quantizes nn.Linear layers and it has none "
                            "(use bf16, fp16 or fp32 for it)")
        quantize(module, plan[part])


# --- noise, recurrent steps and whole feeds through any runner


def sample_noise(policy: Policy, rows: int, seed: int) -> dict[str, torch.Tensor]:
    """CPU noise for every head, keyed by its sampled output: Gaussian z (continuous), uniforms in (0, 1] (discrete)."""
    noise = {}
    if policy.continuous is not None:
        noise[SAMPLED] = cpu_noise(rows, policy.act_dim, seed)
    if policy.discrete is not None:
        noise[DISCRETE_SAMPLED] = cpu_uniform(rows, len(policy.branch_sizes), seed)
    return noise


class Recurrent:
    """Any runner's infer with the memory carried: recurrent_out is the next recurrent_in, from zeros as in Unity."""

    def __init__(self, infer: Callable[[Feeds], dict[str, np.ndarray]], memory_size: int):
        self.infer, self.memory_size = infer, int(memory_size)
        self.memory: np.ndarray | None = None

    def step(self, feeds: Feeds) -> dict[str, np.ndarray]:
        feeds = dict(feeds)
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
        self.memory = None
        steps = len(feeds[obs_name(0)])
        outs = [self.step({k: v[t] for k, v in feeds.items()}) for t in range(steps)]
        return {k: np.stack([o[k] for o in outs]) for k in outs[0]}


def run_feeds(runner: TorchRunner | OnnxRunner, feeds: Mapping[str, np.ndarray], seed: int | None = None,
              trace: bool = False) -> dict[str, np.ndarray]:
    """over_steps of infer (sample with `seed`, step t with seed + t; trace with `trace`)."""
    if seed is None:
        return over_steps(runner.trace if trace else runner.infer, feeds, runner.memory_size)
    seeds = itertools.count(seed)
    return over_steps(lambda f: runner.sample(f, next(seeds)), feeds, runner.memory_size)


def over_steps(infer: Callable[[Feeds], dict[str, np.ndarray]], feeds: Mapping[str, np.ndarray], memory_size: int) -> dict[str, np.ndarray]:
    """`infer` on feeds [N, d], or on a sequence [T, N, d] step by step with the memory carried (outputs lead with T)."""
    if feeds[obs_name(0)].ndim == 2:
        return infer(feeds)
    return Recurrent(infer, memory_size).sequence(feeds)


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.float32 and t.device.type == "cpu":
        return t.numpy()
    t = t.detach().cpu()
    if not t.is_floating_point():
        return t.numpy()  # discrete actions: int64
    return (t.double() if t.dtype == torch.float64 else t.float()).numpy()


# --- the single-tensor forwards a torch backend builds (config.Backend.forward): (policy, target) -> (forward, sample)


def compiled(policy: Policy, target: Target) -> tuple[Callable, Callable]:
    """Backend compile: forward and sample through torch.compile with the device kind's dynamo backend."""
    compiler = _compiler(target.kind)
    return _compiled(policy.forward, compiler), _compiled(policy.sample, compiler)


def fused(policy: Policy, target: Target) -> tuple[Callable, Callable]:
    """Backend fused: the deterministic forward as one C++ kernel (huggy_exp/fused.py); sampled actions run eager."""
    return FusedMLP(policy), policy.sample


def graphs(policy: Policy, target: Target) -> tuple[Callable, Callable]:
    """Backend graphs: forward and sample captured once per shape and replayed (CUDA / NPU graphs)."""
    return GraphReplay(policy.forward, target), GraphReplay(policy.sample, target)


# --- torch.compile and graph capture


def _compiler(kind: str) -> str | Callable:
    """The device kind's dynamo backend (COMPILE_BACKENDS; npu: torchair's), checked, with dynamo reset: one runner's
    compilations never count against the next one's (new weights are new guards; past recompile_limit: eager)."""
    import torch._dynamo

    name = COMPILE_BACKENDS[kind]
    if name == "inductor" and kind == "cpu":
        need_compiler("compile")
    if name not in torch._dynamo.list_backends(exclude_tags=()):
        raise Unsupported(f"backend compile on {kind}: torch.compile backend {name!r} is not registered here (registered: "
                          f"{', '.join(torch._dynamo.list_backends())}){'; torch_npu registers it' if name == 'npu' else ''}")
    if getattr(torch._dynamo.lookup_backend(name), "__name__", "") == "_eager_npu_backend":
        raise Unsupported("backend compile on npu: torch_npu was built without torchair, so its 'npu' dynamo backend runs "
                          "eager (it would time eager as compile)")
    torch._dynamo.reset()
    return _torchair() if name == "npu" else name


def _torchair() -> Callable:
    """torchair's backend in TORCHAIR_MODE (torchair.CompilerConfig().mode; placement.TORCHAIR_MODE says why)."""
    try:
        import torchair

        config = torchair.CompilerConfig()
        config.mode = TORCHAIR_MODE
    except (ImportError, ValueError) as exc:
        raise Unsupported(f"backend compile on npu: torchair cannot run mode {TORCHAIR_MODE} here ({first_line(exc)}): "
                          "its default mode builds GE graphs, whose fp32 math precision_mode cannot set") from None
    return torchair.get_npu_backend(compiler_config=config)


def _compiled(fn: Callable, backend: str | Callable) -> Callable:
    """torch.compile of one graph (fullgraph: a graph break is an error, not a silent eager piece), past dynamo's
    recompile_limit an error too (never a silent eager fallback timed as `compile`). Inductor freezes the weights as
    constants: `options={"freezing": True}` is ignored on the CPU in torch 2.13, so the inductor config is set
    (process-wide: it only affects compiled graphs)."""
    import torch._dynamo

    torch._dynamo.config.fail_on_recompile_limit_hit = True
    if backend == "inductor":
        try:
            import torch._inductor.config as inductor_config
        except ImportError as exc:
            raise Unsupported(f"backend compile: torch inductor is unavailable ({exc})") from None
        inductor_config.freezing = True
    return torch.compile(fn, backend=backend, dynamic=False, fullgraph=True)


class GraphReplay:
    """`fn` captured once per input shape on static buffers (torch.cuda.CUDAGraph, torch_npu's NPUGraph), then replayed.
    Warm-up and capture run on a side stream made on the runner's card and given to `graph(g, stream=...)`: its own
    capture stream is a class attribute (`default_capture_stream`, torch/cuda/graphs.py, torch_npu/npu/graphs.py) made
    once per process on the card current then, so another card's later capture would record none of its work."""

    def __init__(self, fn: Callable, target: Target):
        self.fn, self.device, self.mod = fn, target.device, torch.get_device_module(target.device)
        self.cls = getattr(self.mod, "CUDAGraph", None) or getattr(self.mod, "NPUGraph", None)
        if self.cls is None or not hasattr(self.mod, "graph"):
            raise Unsupported(f"backend graphs: torch.{target.kind} offers no graph capture here")
        self.captured: dict[tuple, tuple] = {}
        self.side = None  # the capture stream, made on the card at the first capture

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        if key not in self.captured:
            use_device(self.device)
            static = [t.clone() for t in inputs]
            side = self.side = self.side or self.mod.Stream(self.device)
            side.wait_stream(self.mod.current_stream(self.device))
            with self.mod.stream(side):
                for _ in range(3):
                    self.fn(*static)
            self.mod.current_stream(self.device).wait_stream(side)
            graph = self.cls()
            with self.mod.graph(graph, stream=side):
                out = self.fn(*static)
            self.captured[key] = (graph, static, out)
        graph, static, out = self.captured[key]
        for s, t in zip(static, inputs):
            s.copy_(t)
        graph.replay()
        return out.clone()


# --- onnxruntime: the ONNX graph on one execution provider, never a silent fallback


def check_provider(session, provider: str) -> None:
    """onnxruntime silently falls back to the CPU when a provider cannot start: refuse that."""
    active = session.get_providers()
    if not active or active[0] != provider:
        raise Unsupported(f"onnxruntime session runs on {active}, not on the requested {provider} (no silent fallback)")


class OnnxRunner:
    fixed_shape = False

    def __init__(self, path: Path, provider: str = "CPUExecutionProvider", threads: int = 0, seed: int | None = None,
                 batch_size: int = 0, provider_options: dict[str, str] | None = None, target: Target | None = None):
        import onnxruntime as ort

        self.target = target or resolve("cpu", ONNX_DTYPE)  # the provider's device: the graph's own dtype, fp32 I/O
        if seed is not None:
            ort.set_seed(int(seed))  # RandomNormalLike draws become repeatable run to run (not equal to torch's)

        available = ort.get_available_providers()
        if provider not in ort.get_all_providers():
            raise UserError(f"unknown onnxruntime provider {provider!r}; this onnxruntime has: {', '.join(available)}")
        if provider not in available:  # an onnxruntime build without it (the CPU wheel on a GPU host): not here
            raise Unsupported(f"onnxruntime provider {provider!r} is not in this onnxruntime build; it has: {', '.join(available)}")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        # placement.onnxruntime_options, in each spelling onnxruntime builds know (placement.option_spellings)
        self.path, self.provider, self._tapped = Path(path), provider, None
        self._spellings = option_spellings(provider_options)
        self.session = self._open(options, str(path))
        self.inputs = {i.name: i.shape for i in self.session.get_inputs()}
        self.input = next(iter(self.inputs))
        shape = self.inputs.get(RECURRENT_IN)
        self.memory_size = int(shape[-1]) if shape and isinstance(shape[-1], int) else 0
        self.outputs = [o.name for o in self.session.get_outputs()]
        self._batched = {i for i, o in enumerate(self.session.get_outputs()) if o.shape and not isinstance(o.shape[0], int)}
        self.batch_size = batch_size
        self.name = f"onnxruntime-{provider}" + (f"-{target.dtype_name}" if target and target.dtype_name != ONNX_DTYPE else "")

    def sample(self, feeds: Feeds, seed: int) -> dict[str, np.ndarray]:
        raise self._torch_only("sampled actions take the seeded CPU noise, which")

    def _open(self, options, model: str | bytes):
        """A session of the model (a path, or a changed graph's bytes) on this runner's provider, never a fallback."""
        import onnxruntime as ort

        for tried, given in enumerate(self._spellings, 1):
            try:
                session = ort.InferenceSession(model, options, providers=[(self.provider, given)] if given else [self.provider])
            except Exception as exc:
                if tried < len(self._spellings) and "Unknown provider option" in str(exc):
                    continue  # an option this onnxruntime names otherwise: its next spelling
                raise UserError(f"onnxruntime could not load {self.path}: {str(exc).splitlines()[0]}") from None
            self._spellings = [given]  # the one this onnxruntime took, for the runner's later sessions
            check_provider(session, self.provider)
            return session

    def trace(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Policy.trace's parts as the graph computes them (mlagents.with_parts), with infer()'s outputs; in a second
        session with graph optimizations off, as onnxruntime's qdq_loss_debug: no fusion folds a part away."""
        if self._tapped is None:
            import onnxruntime as ort

            model = with_parts(read_onnx(self.path), f"onnx file {self.path}")
            self.parts = [o.name for o in model.graph.output][len(self.outputs):]
            plain = ort.SessionOptions()
            plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            self._tapped = self._open(plain, model.SerializeToString())
        given = self._given(feeds)
        rows = len(next(iter(given.values())))
        parts = {k: v.reshape(rows, -1) for k, v in zip(self.parts, self._tapped.run(self.parts, given))}
        return {**parts, **self.infer(feeds)}

    def distributions(self, feeds: Feeds) -> dict[str, np.ndarray]:
        raise self._torch_only("the distributions (mu, log_sigma, masked logits)")

    @staticmethod
    def _torch_only(what: str) -> Unsupported:
        torch_backends = ", ".join(n for n, b in BACKENDS.items() if b.runner is None)
        return Unsupported(f"backend onnxruntime: {what} only the torch backends ({torch_backends}) give; "
                           "onnxruntime runs the graph's outputs (compare it with mode=onnx-compare)")

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """The graph's outputs; absent action_masks are all ones, an absent recurrent_in is zeros (ML-Agents' defaults)."""
        obs = feeds.get(OBS) if len(self.inputs) == 1 else None
        if obs is not None:  # a graph of one input (obs_0): kept lean for timing
            if obs.dtype is not _F32 and obs.dtype != _F32 or not obs.flags.c_contiguous:
                obs = np.ascontiguousarray(obs, np.float32)
            given = {self.input: obs}
        else:
            given = self._given(feeds)
        rows = len(next(iter(given.values())))
        if not self.batch_size or rows <= self.batch_size:  # one call: the common case, kept lean for timing
            return dict(zip(self.outputs, self.session.run(self.outputs, given)))
        step = self.batch_size
        parts = [self.session.run(self.outputs, {k: v[s : s + step] for k, v in given.items()}) for s in range(0, rows, step)]
        return {name: (np.concatenate([p[i] for p in parts]) if i in self._batched else parts[0][i])
                for i, name in enumerate(self.outputs)}

    def _given(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Every graph input from the feeds, float32 and contiguous; masks and memory filled in when absent."""
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
        return given


# --- the one factory, and the references


def build(ctx: Context, backend: str | None = None, *, device: str | None = None, dtype: str | None = None,
          batch_size: int | None = None, threads: int | None = None, provider: str | None = None,
          onnx: Path | None = None) -> Runner:
    """A runner for the context's (backend, device, dtype, batch size) or the overrides given."""
    backend = check_backend(backend or ctx.backend)  # an unknown name: one line listing the backends
    batch, runner = ctx.batch_size if batch_size is None else batch_size, BACKENDS[backend].runner
    if runner is None:
        return TorchRunner(ctx.weights, ctx.target(device, dtype), batch, backend)
    target = ctx.target(device, dtype)
    check_backend(backend, target)
    return declared(runner)(ctx, target, batch, ctx.threads if threads is None else threads, provider, onnx)


def onnxruntime(ctx: Context, target: Target, batch: int, threads: int, provider: str | None, onnx: Path | None) -> OnnxRunner:
    """Backend onnxruntime: the .onnx (or, for a dtype whose peer it is, its own quantization) on the device's provider."""
    provider = provider or PROVIDERS[target.kind]  # config.BACKENDS: its device kinds
    options = onnxruntime_options(provider, target.device.index if target.kind != "cpu" else None, ctx.precision_mode)
    path = onnx or ctx.onnx_path()
    if target.dtype_name in QUANTIZED:
        import onnx

        path = quantize_onnx(with_distributions(onnx.load(path)), ctx.workdir / f"{Path(path).stem}.{target.dtype_name}.onnx")
    return OnnxRunner(path, provider, threads, ctx.seed, batch, options, target)


def declared(path: str) -> Callable:
    """What a backend's declaration names by dotted path (config.Backend.forward, .runner): `module.function`."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def reference(ctx: Context, dtype: str = "fp64", batch_size: int = 0) -> TorchRunner:
    """The CPU eager reference of the comparing modes."""
    return TorchRunner(ctx.weights, resolve("cpu", dtype), batch_size)
