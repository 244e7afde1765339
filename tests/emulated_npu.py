"""A test-only `npu` device: PyTorch's PrivateUse1 backend renamed `npu`, as torch_npu attaches, in pure Python.

Two cards. A tensor on `npu:N` is a wrapper (`torch.Tensor._make_wrapper_subclass(..., device=npu:N)`) around a CPU
tensor holding its real values; every op runs on the CPU through `__torch_dispatch__`, and factory calls with
`device="npu:N"` reach a `torch.library` fallback on PrivateUse1. It refuses what a card refuses: float64 on the NPU,
and one op meeting tensors of two cards (or a CPU tensor that is not a scalar). `torch.npu` is the device module with
the surface huggy_exp calls, torch_npu's names: is_available, device_count, set_device / current_device (per thread),
synchronize, Event, Stream / stream / current_stream, memory statistics, NPUGraph / graph (a capture records the
ops it sees on its own card, on its device and stream, and replays them on the current values; `graph`'s own capture
stream is made once per process, on the card current at the first capture, as torch_npu's is), get_device_name,
torch_npu's switch objects matmul / conv / aclnn (allow_hf32, cube_math_type, CubeMathType; like torch_npu's they
answer every attribute name) over ACL's HF32 option, which the card computes with (HF32: fp32 matmul inputs rounded to
10 mantissa bits, as the cube unit does); `HUGGY_EXP_EMULATED_NPU_BUILD=old` is a torch_npu build before 2025-09 (no
cube math type or aclnn, ACL's HF32 option reset to its default when the card starts: AscendOptions).
Like torch_npu it registers the dynamo backend `npu` (torch.compile's backend on this device kind), torchair's backend with
its default config, and puts a `torchair` module in sys.modules (torch_npu/dynamo/__init__.py): CompilerConfig (`mode`:
max-autotune, GE's graph; reduce-overhead, an aclgraph of torch_npu's kernels) and get_npu_backend. The wrapper is
traceable (`__tensor_flatten__`), and a compiled graph runs dynamo's graph of the card's ops on the card: in an aclgraph
with the card's own numerics, in GE's graph with GE's (its HF32 read once per process, fp32 matmuls in fp16: see
_graph_engine).

The rename happens once per process and cannot be undone, so it runs in a child process only:

    python tests/emulated_npu.py run.py mode=precision device=npu:1      # any script and its arguments

Nothing in huggy_exp imports this file: only this launcher turns the device on. `torch.npu.EMULATED` is the marker
huggy_exp.environment reads (every result says `emulated: true`).
`HUGGY_EXP_EMULATED_NPU_PERTURB=<card>[:<rel>]` makes that card's matmuls return results scaled by (1 + rel): a card
that computes wrongly by a known amount (default 1e-7, about one fp32 ulp: inside every fp32 limit, so only the bitwise
agreement of two cards catches it).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import os
import runpy
import sys
import threading
import time
import types
import weakref

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.utils._pytree import tree_map

CARDS = 2
NAME = "Ascend910B-emulated"
PERTURB_ENV = "HUGGY_EXP_EMULATED_NPU_PERTURB"
BUILD_ENV = "HUGGY_EXP_EMULATED_NPU_BUILD"  # "old": a torch_npu build before 2025-09 (AscendOptions)
DEFAULT_PERTURBATION = 1e-7  # about one fp32 ulp: passes every limit, caught only by the cards' bitwise agreement
aten = torch.ops.aten
# ops whose result a perturbed card scales, and whose fp32 inputs HF32 rounds (the cube unit's ops)
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default, aten.mv.default,
           aten.addmv.default, aten.dot.default, aten._addmm_activation.default}
CONVS = {aten.convolution.default}
TRANSFERS = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default}


class _State(threading.local):
    """Per thread, as torch_npu's: the current card, the current stream per card, the capture in progress."""

    def __init__(self):
        self.device: int | None = None  # set_device not called in this thread: card 0 is current, no other card usable
        self.streams: dict[int, Stream] = {}
        self.capture: NPUGraph | None = None
        self.ge: str | None = None  # GE's ge.exec.allow_hf32 ("<conv><matmul>") while one of its graphs runs


_thread = _State()
_allocated = [0] * CARDS
_peak = [0] * CARDS
_live: dict[tuple[int, int], int] = {}  # (card, storage pointer) -> live wrappers sharing it
_lock = threading.Lock()


def _on(card: int) -> int:
    """An op on `card` from a thread that never called set_device is refused unless it is card 0. torch_npu's current
    device is per thread: such a thread has no context (error 107002, "context is empty") or makes a stray one on
    card 0; the emulator refuses, so a missing set_device shows on the first op."""
    _ASCEND.start()
    if _thread.device is None and card != 0:
        raise RuntimeError(f"npu:{card}: an op from a thread that never called torch.npu.set_device (emulated 107002, "
                           f"context is empty: call torch.npu.set_device({card}) in this thread first)")
    return card


def _card(device) -> int:
    """The card index of a device argument (None: the current card)."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        index = device.index if device.index is not None else current_device()
    if not 0 <= index < CARDS:
        raise RuntimeError(f"npu:{index}: invalid device ordinal (this emulator has {CARDS} cards)")
    return index


# --- tensors on a card


class NpuTensor(torch.Tensor):
    """A tensor on an emulated card: its values are a CPU tensor (`value`)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # results keep their own type (a copy to the host is a CPU tensor)

    @staticmethod
    def __new__(cls, value: torch.Tensor, card: int):
        if value.dtype == torch.float64:
            raise RuntimeError(f"npu:{card}: float64 is not supported on the NPU (emulated: the card has no fp64 kernels)")
        with torch.inference_mode(False):  # a view op's autograd layer sets the wrapper's version counter from its base
            return torch.Tensor._make_wrapper_subclass(cls, value.size(), strides=value.stride(), dtype=value.dtype,
                                                       device=torch.device("npu", card), storage_offset=value.storage_offset(),
                                                       requires_grad=value.requires_grad)

    def __init__(self, value: torch.Tensor, card: int):
        self.value = value
        self.card = card
        _track(self)

    def __repr__(self):
        return f"NpuTensor(npu:{self.card}, {self.value!r})"

    # traceable by torch.compile (dynamo and AOTAutograd see through the wrapper to its CPU values, as to a card's
    # tensor): the wrapper is its values and its card
    def __tensor_flatten__(self):
        return ["value"], self.card

    @staticmethod
    def __tensor_unflatten__(inner: dict, card: int, outer_size, outer_stride) -> "NpuTensor":
        return NpuTensor(inner["value"], card)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _track(t: NpuTensor) -> None:
    """Count the storage's bytes on its card once, while any wrapper of it lives (the count is kept on the values the
    wrapper was made with: a module's `to()` swaps a traceable wrapper, which must carry no weak reference itself).
    A compile's fake values hold no memory."""
    if is_fake(t.value):
        return
    t.made_with = t.value  # a graph replay gives the wrapper new values: the count stays with the first until it goes
    storage = t.value.untyped_storage()
    key = (t.card, storage.data_ptr())
    with _lock:
        if _live.get(key, 0) == 0:
            _allocated[t.card] += storage.nbytes()
            _peak[t.card] = max(_peak[t.card], _allocated[t.card])
        _live[key] = _live.get(key, 0) + 1
    weakref.finalize(t.value, _release, key, storage.nbytes())


def _release(key: tuple[int, int], nbytes: int) -> None:
    with _lock:
        _live[key] -= 1
        if _live[key] == 0:
            del _live[key]
            _allocated[key[0]] -= nbytes


def _wrap(value, card: int):
    return NpuTensor(value, card) if isinstance(value, torch.Tensor) and not isinstance(value, NpuTensor) else value


def _cards_of(args, kwargs) -> set[int]:
    """The cards of the NPU tensors an op meets; a non-scalar CPU tensor beside them is refused, as on a card."""
    cards, cpu = set(), []
    for a in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(a, NpuTensor):
            cards.add(a.card)
        elif isinstance(a, torch.Tensor) and a.dim() > 0:
            cpu.append(a)
    if len(cards) > 1:
        a, b = sorted(cards)[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, npu:{a} and npu:{b}!")
    if cards and cpu:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, npu:{min(cards)} and cpu!")
    return cards


def _dispatch(func, args, kwargs):
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        decomposed = func.decompose(*args, **kwargs)  # inference mode skips the autograd layer that would decompose
        if decomposed is not NotImplemented:
            return decomposed
    if func in TRANSFERS:
        return _transfer(func, args, kwargs)
    if func is aten._thnn_fused_lstm_cell.default:  # device-only (CUDA/NPU) decomposition of nn.LSTM
        card = _on(min(_cards_of(args, kwargs)))
        return tree_map(lambda v: _wrap(v, card), _lstm_cell(*tree_map(_unwrap, args)))
    cards = _cards_of(args, kwargs)
    card = _on(min(cards) if cards else _card(kwargs.get("device")))
    cpu_args, cpu_kwargs = tree_map(_unwrap, args), {k: _unwrap(v) for k, v in kwargs.items()}
    if "device" in cpu_kwargs:
        cpu_kwargs["device"] = torch.device("cpu")
    out = _compute(func, card, cpu_args, cpu_kwargs)
    result = _rewrap(func, args, out, card)
    capture = _thread.capture
    if capture is not None and capture.card == card:
        capture.record(func, args, kwargs, result)
    return result


def _compute(func, card: int, args, kwargs):
    """The op on the CPU values, with the card's numerics: HF32 inputs, a perturbed card's matmuls, and in GE's graph
    its precision_mode's fp16 matmuls and its own HF32 option."""
    ge = _thread.ge
    if ge is not None and func in MATMULS:
        args = tree_map(lambda a: a.half().float() if _fp32(a) else a, args)
    elif func in MATMULS and _ASCEND.hf32("matmul", ge) or func in CONVS and _ASCEND.hf32("conv", ge):
        args = tree_map(lambda a: _round_hf32(a) if _fp32(a) else a, args)
    out = func(*args, **kwargs)
    rel = _perturbation(card)
    if rel and func in MATMULS and isinstance(out, torch.Tensor) and out.is_floating_point():
        out = (out.float() * (1.0 + rel)).to(out.dtype)
    return out


def _fp32(a) -> bool:
    return isinstance(a, torch.Tensor) and a.dtype == torch.float32


def _rewrap(func, args, out, card: int):
    """Outputs as NPU tensors; an in-place op returns the very wrapper it was given."""
    if func._schema.is_mutable and isinstance(out, torch.Tensor) and args and isinstance(args[0], NpuTensor):
        return args[0]
    return tree_map(lambda v: _wrap(v, card), out)


def _unwrap(a):
    return a.value if isinstance(a, NpuTensor) else a


def _transfer(func, args, kwargs):
    """Copies between the host and a card, and between cards; a capture refuses a copy back to the host."""
    src = args[0] if func is aten._to_copy.default else args[1]
    if func is aten._to_copy.default:
        target = kwargs.get("device")
        to = torch.device(target) if target is not None else src.device
        cpu_kwargs = {**kwargs, "device": torch.device("cpu")}
        value = aten._to_copy.default(_unwrap(src), **cpu_kwargs)
        if to.type == "cpu":
            _on(src.card)
            _refuse_host_copy_in_capture(src)
            return value
        card = _on(_card(to))
        out = NpuTensor(value, card)
        _record_if_captured(card, func, args, kwargs, out)
        return out
    dst = args[0]
    _on(dst.card if isinstance(dst, NpuTensor) else src.card)
    if not isinstance(dst, NpuTensor):
        _refuse_host_copy_in_capture(src)
    _unwrap(dst).copy_(_unwrap(src), *args[2:])
    if isinstance(dst, NpuTensor):
        _record_if_captured(dst.card, func, args, kwargs, dst)
    return dst


def _refuse_host_copy_in_capture(src) -> None:
    capture = _thread.capture
    if capture is not None and isinstance(src, NpuTensor) and src.card == capture.card:
        raise RuntimeError("operation not permitted when stream is capturing (a copy to the host inside an NPU graph capture)")


def _record_if_captured(card: int, func, args, kwargs, out) -> None:
    capture = _thread.capture
    if capture is not None and capture.card == card:
        capture.record(func, args, kwargs, out)


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """aten::_thnn_fused_lstm_cell (CUDA/NPU only): one LSTM step from the precomputed gates; (hy, cy, workspace)."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def _round_hf32(t: torch.Tensor) -> torch.Tensor:
    """fp32 values rounded (to nearest, ties to even) to HF32's 10 explicit mantissa bits."""
    bits = t.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0xFFF + lsb) >> 13) << 13
    finite = torch.isfinite(t)
    return torch.where(finite, rounded.view(torch.float32), t)


def _perturbation(card: int) -> float:
    spec = os.environ.get(PERTURB_ENV, "")
    if not spec:
        return 0.0
    which, _, rel = spec.partition(":")
    return (float(rel) if rel else DEFAULT_PERTURBATION) if int(which) == card else 0.0


def _fallback(op, *args, **kwargs):
    """Factory calls with device='npu:N' (no NPU tensor among the arguments): computed on the CPU, placed on the card."""
    card = _on(_card(kwargs.get("device")))
    cpu_kwargs = {**kwargs, "device": torch.device("cpu")}
    out = op(*args, **cpu_kwargs)
    return tree_map(lambda v: _wrap(v, card), out)


# --- the device module: torch.npu


class CubeMathType(enum.IntEnum):
    """torch_npu.npu.CubeMathType (npu_config._CubeMathType): the matmul cube unit's math type (CANN >= 8.5)."""

    KEEP_DTYPE = 0
    ALLOW_FP32_DOWN_PRECISION = 1
    USE_FP16 = 2
    USE_HF32 = 3


class AscendOptions:
    """torch_npu's registered options (ALLOW_MATMUL_HF32, ALLOW_CONV_HF32, CUBE_MATH_TYPE: what its getters read) and
    ACL's HF32 compile option that the card's kernels use (`<conv><matmul>`, "10": conv on, matmul off). Setting an
    HF32 option sets ACL's too (torch_npu's option hooks, EnvVariables.cpp). When the card starts, current builds set
    ACL's from the options (LazyInitAclops.cpp, SetHF32DefaultValue); builds before 2025-09 (`build="old"`) set "10"
    whatever was set before, while the getters go on reading the options; old builds have no cube math type either."""

    def __init__(self, build: str = "current"):
        self.build, self.options, self.started = build, {}, False
        self.acl_hf32 = self._from_options()

    def _from_options(self) -> str:
        conv = "0" if self.options.get("ALLOW_CONV_HF32") == "disable" else "1"
        return conv + ("1" if self.options.get("ALLOW_MATMUL_HF32") == "enable" else "0")

    def set(self, name: str, value: str) -> None:
        self.options[name] = value
        if name in ("ALLOW_MATMUL_HF32", "ALLOW_CONV_HF32"):
            self.acl_hf32 = self._from_options()

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.acl_hf32 = "10" if self.build == "old" else self._from_options()

    def hf32(self, op: str, option: str | None = None) -> bool:
        """Whether the card's kernels run `op` ("matmul", "conv") in HF32 now (or under another `<conv><matmul>` option)."""
        return (option or self.acl_hf32)[op == "matmul"] == "1"


class MatmulSwitches:
    """torch.npu.matmul (npu_config._allowHF32Matmul): allow_hf32 and cube_math_type through the options; like
    torch_npu's, it answers every other name with None and ignores setting it."""

    def __init__(self, opts: AscendOptions):
        object.__setattr__(self, "_opts", opts)

    def __setattr__(self, name: str, value) -> None:
        if name == "allow_hf32":
            if not isinstance(value, bool):
                raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}")
            self._opts.set("ALLOW_MATMUL_HF32", "enable" if value else "disable")
        elif name == "cube_math_type" and self._opts.build != "old":
            if not isinstance(value, CubeMathType):
                raise TypeError(f"value should be one of Enum CubeMathType when setting cube_math_type, but got {type(value)}")
            self._opts.set("CUBE_MATH_TYPE", str(int(value)))

    def __getattr__(self, name: str):
        if name == "allow_hf32":
            return self._opts.options.get("ALLOW_MATMUL_HF32") == "enable"
        if name == "cube_math_type" and self._opts.options.get("CUBE_MATH_TYPE"):
            return CubeMathType(int(self._opts.options["CUBE_MATH_TYPE"]))
        return None


class ConvSwitches:
    """torch.npu.conv (npu_config._allowHF32Conv) and, under `name`, torch.npu.aclnn (the same option): allow_hf32,
    on unless disabled; every other name answers None."""

    def __init__(self, opts: AscendOptions):
        object.__setattr__(self, "_opts", opts)

    def __setattr__(self, name: str, value) -> None:
        if name == "allow_hf32":
            if not isinstance(value, bool):
                raise TypeError(f"allow_hf32 must be a bool, but got {type(value).__name__}")
            self._opts.set("ALLOW_CONV_HF32", "enable" if value else "disable")

    def __getattr__(self, name: str):
        if name == "allow_hf32":
            return self._opts.options.get("ALLOW_CONV_HF32", "enable") != "disable"
        return None


def switches(build: str = "current") -> dict:
    """torch_npu's precision surface on torch.npu for a build: matmul, conv and, on current builds, aclnn and
    CubeMathType; `_ascend` holds the options the card computes with."""
    opts = AscendOptions(build)
    found = {"matmul": MatmulSwitches(opts), "conv": ConvSwitches(opts), "_ascend": opts}
    if build != "old":
        found |= {"aclnn": ConvSwitches(opts), "CubeMathType": CubeMathType}
    return found


_ASCEND = AscendOptions()  # the options the cards compute with: device_module() puts its build's here


class Stream:
    """A queue on one card; the emulator runs every op at once, so waits are bookkeeping."""

    def __init__(self, device=None, priority: int = 0):
        self.device = torch.device("npu", _card(device))
        self.priority = priority

    def wait_stream(self, other: "Stream") -> None:
        pass

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __repr__(self):
        return f"<emulated npu Stream on {self.device} at {id(self):#x}>"


class Event:
    """A timing event: recorded now (the emulator's ops are synchronous)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing, self.t = enable_timing, None

    def record(self, stream: Stream | None = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "Event") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.t is None or end.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.t - self.t) * 1000.0

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Stream | None = None) -> None:
        pass

    def query(self) -> bool:
        return True


_default_streams: list[Stream] = []  # one per card, made by install()


def current_stream(device=None) -> Stream:
    card = _card(device)
    return _thread.streams.get(card) or _default_streams[card]


def default_stream(device=None) -> Stream:
    return _default_streams[_card(device)]


@contextlib.contextmanager
def stream(s: Stream | None):
    """Make `s` the current stream of its card (and its card current), as torch.npu.stream does."""
    if s is None:
        yield
        return
    card = s.device.index
    before_device, before_stream = _thread.device, current_stream(card)
    _thread.device, _thread.streams[card] = card, s
    try:
        yield
    finally:
        _thread.streams[card], _thread.device = before_stream, before_device


class NPUGraph:
    """A capture of the ops run on its card while `graph(self)` is open; replay() reruns them on the current values."""

    def __init__(self):
        self.card: int | None = None
        self.stream: Stream | None = None
        self.ops: list[tuple] = []
        self.recorded = False

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        if _thread.capture is not None:
            raise RuntimeError("an NPU graph capture is already in progress in this thread")
        self.card, self.stream = current_device(), current_stream()
        if self.stream is _default_streams[self.card]:
            raise RuntimeError("NPU graphs must be captured on a non-default stream")
        self.ops, _thread.capture = [], self

    def capture_end(self) -> None:
        """End the capture. A card runs nothing while capturing: what the captured ops returned holds no value (NaN
        here) until replay() computes it."""
        _thread.capture, self.recorded = None, True
        for func, _, _, out in self.ops:
            if not func._schema.is_mutable:
                for wrapper in torch.utils._pytree.tree_leaves(out):
                    if isinstance(wrapper, NpuTensor) and wrapper.is_floating_point():
                        wrapper.value = torch.full_like(wrapper.value, float("nan"))

    def record(self, func, args, kwargs, out) -> None:
        self.ops.append((func, args, kwargs, out))

    def replay(self) -> None:
        if not self.recorded:
            raise RuntimeError("replay() of an NPU graph that was never captured")
        for func, args, kwargs, out in self.ops:
            if func in TRANSFERS:
                src = args[0] if func is aten._to_copy.default else args[1]
                value = _unwrap(src).to(out.dtype) if func is aten._to_copy.default else None
                if value is not None:
                    out.value = value
                else:
                    out.value.copy_(_unwrap(src))
                continue
            fresh = _compute(func, self.card, tree_map(_unwrap, args), {k: _unwrap(v) for k, v in kwargs.items()})
            if func._schema.is_mutable:
                continue  # in place: _compute already wrote into the argument's values
            for wrapper, value in zip(torch.utils._pytree.tree_leaves(out), torch.utils._pytree.tree_leaves(fresh)):
                if isinstance(wrapper, NpuTensor):
                    wrapper.value = value

    def reset(self) -> None:
        self.ops, self.recorded = [], False


class graph:
    """torch.npu.graph as torch_npu (torch_npu/npu/graphs.py) and torch.cuda (torch/cuda/graphs.py) write it: the
    capture stream, unless `stream=` is given, is the class attribute `default_capture_stream`, made once per process
    by the first `graph(...)` on the card current then; entering makes the capture stream's card current. So after a
    capture on npu:0, `graph(g)` on npu:1 captures on npu:0's stream and records none of npu:1's ops."""

    default_capture_stream: Stream | None = None

    def __init__(self, npu_graph: NPUGraph, pool=None, stream: Stream | None = None, auto_dispatch_capture: bool = False,
                 capture_error_mode: str = "global"):
        if self.__class__.default_capture_stream is None:  # torch_npu makes it even when `stream` is given
            self.__class__.default_capture_stream = Stream()
        self.capture_stream = stream if stream is not None else self.__class__.default_capture_stream
        self.stream_ctx = globals()["stream"](self.capture_stream)
        self.npu_graph = npu_graph

    def __enter__(self) -> None:
        synchronize()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin()

    def __exit__(self, *exc) -> None:
        self.npu_graph.capture_end()
        self.stream_ctx.__exit__(*exc)


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return CARDS


def current_device() -> int:
    return 0 if _thread.device is None else _thread.device


def set_device(device) -> None:
    _thread.device = _card(device)
    _ASCEND.start()


def synchronize(device=None) -> None:
    _card(device)


def get_device_name(device=None) -> str:
    return f"{NAME} (card {_card(device)})"


def memory_allocated(device=None) -> int:
    return _allocated[_card(device)]


def max_memory_allocated(device=None) -> int:
    return _peak[_card(device)]


memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(device=None) -> None:
    card = _card(device)
    with _lock:
        _peak[card] = _allocated[card]


def memory_stats(device=None) -> dict[str, int]:
    card = _card(device)
    return {"allocated_bytes.all.current": _allocated[card], "allocated_bytes.all.peak": _peak[card]}


def manual_seed_all(seed: int) -> None:
    pass


def is_jit_compile_false() -> bool:
    """torch_npu's default on 910B-class cards: operators run as prebuilt binaries, not compiled at first call."""
    return True


def _is_in_bad_fork() -> bool:
    return False


def device_module() -> types.ModuleType:
    mod = types.ModuleType("torch.npu", __doc__)
    for name in ("is_available", "is_initialized", "device_count", "current_device", "set_device", "synchronize",
                 "get_device_name", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "reset_peak_memory_stats", "memory_stats", "manual_seed_all", "_is_in_bad_fork", "is_jit_compile_false",
                 "Stream", "Event", "current_stream", "default_stream", "stream", "NPUGraph", "graph"):
        setattr(mod, name, globals()[name])
    global _ASCEND
    surface = switches(os.environ.get(BUILD_ENV, "current"))
    _ASCEND = surface.pop("_ascend")
    for name, value in surface.items():
        setattr(mod, name, value)
    mod.EMULATED = True  # the marker huggy_exp.environment reads
    return mod


_LIBRARY: list = []


def install() -> types.ModuleType:
    """Rename PrivateUse1 to `npu`, register torch.npu and the factory fallback; once per process."""
    if getattr(torch, "npu", None) is not None:
        return torch.npu
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    # a card's ops never wait on the host's thread pool: with torch's default pool (a thread per core) every tiny op
    # here waited for it, 49 ms a policy call on a loaded 2-core host instead of 2.7 ms (measured, 8 rows)
    torch.set_num_threads(1)
    mod = device_module()
    _setup_privateuseone_for_python_backend("npu", backend_module=mod)
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_fallback, "PrivateUse1")
    _LIBRARY.append(lib)  # the registration lives as long as the library object
    _default_streams.extend(Stream(card) for card in range(CARDS))
    register_backends()
    return mod


# --- torchair (Ascend/torchair): torch_npu's graph compiler, the dynamo backend `npu`


class OptionValue:
    """torchair's option (configs/_option_base.py): a default, the values it takes (`optional`), and `value` as text."""

    def __init__(self, default: str, optional: list[str]):
        self.optional, self._value = optional, default

    @property
    def value(self) -> str:
        return self._value

    @value.setter
    def value(self, v: str) -> None:
        if v not in self.optional:
            raise ValueError(f"Value {v!r} (type: {type(v)}) not in optional list {self.optional!r} (type: {type(self.optional[0])}).")
        self._value = v


class CompilerConfig:
    """torchair.CompilerConfig (configs/compiler_config.py) as far as huggy_exp reaches: `mode`. As NpuBaseConfig, it
    refuses an option it lacks, and setting an option sets its value (checked against its list)."""

    def __init__(self):
        object.__setattr__(self, "mode", OptionValue("max-autotune", ["max-autotune", "reduce-overhead", "npugraph_ex"]))

    def __setattr__(self, key: str, value) -> None:
        if key not in vars(self):
            raise ValueError(f"CompilerConfig has no option {key}, all options {list(vars(self))}")
        getattr(self, key).value = value


_GE_OPTIONS: list[str] = []  # GE's ge.exec.allow_hf32, read at its one initialisation in the process


def _graph_engine() -> str:
    """GE's HF32 option: read from torch.npu's switches when GE starts, once per process (torchair core/_backend.py
    _get_global_op_compile_config; session.cpp: Session::Initialize returns at once after the first). torchair passes
    GE no ge.exec.precision_mode (CompilerConfig has no such option), so CANN's default applies: force_fp16 and
    allow_fp32_to_fp16 alike run an fp32 matmul in fp16 on the cube unit."""
    if not _GE_OPTIONS:
        _GE_OPTIONS.append(("1" if torch.npu.conv.allow_hf32 else "0") + ("1" if torch.npu.matmul.allow_hf32 else "0"))
    return _GE_OPTIONS[0]


def _npu_backend(gm, example_inputs, compiler_config: CompilerConfig | None = None, **kwargs):
    """torchair's backend (npu_fx_compiler._npu_backend): dynamo's graph of the card's ops, run op by op on the card
    (every compile path of the caller: tracing, guards, recompiles, fullgraph; AOTAutograd would run a wrapper's CPU
    values, past the card's numerics). max-autotune runs it as GE's graph, with GE's numerics; reduce-overhead and
    npugraph_ex as an aclgraph of torch_npu's kernels, with the card's."""
    compiled = gm.forward
    if (compiler_config or CompilerConfig()).mode.value != "max-autotune":
        return compiled
    option = _graph_engine()

    def ge_graph(*args):
        before, _thread.ge = _thread.ge, option
        try:
            return compiled(*args)
        finally:
            _thread.ge = before

    return ge_graph


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions: dict | None = None):
    """torchair.get_npu_backend: the backend with its config bound (a functools.partial, as torchair's)."""
    return functools.partial(_npu_backend, compiler_config=compiler_config or CompilerConfig())


def _lazy_exec(gm, example_inputs, **kwargs):
    """torch_npu's `npu` backend: torchair's with its default config (max-autotune)."""
    return get_npu_backend()(gm, example_inputs, **kwargs)


def register_backends(backend=_lazy_exec) -> None:
    """Register the dynamo backend `npu` as torch_npu does at import (torch_npu/dynamo/__init__.py, _register_backends:
    an earlier `npu` is replaced, and `torchair` put in sys.modules; without torchair torch_npu registers its eager
    stand-in `_eager_npu_backend`, and no `torchair`)."""
    from torch._dynamo.backends import registry

    for table in (registry._BACKENDS, getattr(registry, "_COMPILER_FNS", {})):  # torch 2.13 keeps the functions apart
        table.pop("npu", None)
    registry.register_backend(backend, "npu")
    sys.modules.pop("torchair", None)
    if backend is _lazy_exec:
        sys.modules["torchair"] = types.ModuleType("torchair", "torchair's surface: tests/emulated_npu.py")
        sys.modules["torchair"].CompilerConfig, sys.modules["torchair"].get_npu_backend = CompilerConfig, get_npu_backend


def main(argv: list[str]) -> None:
    """python tests/emulated_npu.py SCRIPT [ARGS...]: run SCRIPT as __main__ with the emulated npu installed."""
    if not argv:
        raise SystemExit("usage: python tests/emulated_npu.py SCRIPT [ARGS...]")
    install()
    script = os.path.abspath(argv[0])  # as `python script` sets __file__ (run.py finds conf/ beside it)
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
