"""The only place strings become torch devices and dtypes. Unavailable means Unsupported (skipped), never a fallback."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from huggy_exp import config
from huggy_exp.config import BACKENDS, DEVICE_KINDS, DTYPE_NAMES, PlanConf
from huggy_exp.errors import Unsupported, UserError, first_line

DTYPES = {name: getattr(torch, d.torch) for name, d in config.DTYPES.items()}  # by name, what the layers compute in
# torchao's config per int8 dtype (config.DTYPES): quantized Linear layers run on the CPU only, eager only
QUANTIZED = {name: d.quantized for name, d in config.DTYPES.items() if d.quantized}
_DEVICE_RE = re.compile(rf"^({'|'.join(DEVICE_KINDS)})(?::(\d+))?$")
# set by the Ray launcher's worker to the point's device kind: Ray made exactly the card it assigned visible
# (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES), so `npu:1` runs on that card, index 0 in this process
ASSIGNED_CARD_ENV = "HUGGY_EXP_ASSIGNED_CARD"
VISIBLE_ENV = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}  # the runtime numbers these from 0
# torch_npu: 1 makes an op without an NPU kernel an error instead of a silent run on the CPU (one warning). It is read
# once, at the first fallback, so it is set before the first NPU op; a value of your own (0) is kept and recorded.
NPU_FALLBACK_ENV = "TORCH_NPU_FALLBACK_CPU_DISABLE"


@dataclass(frozen=True)
class Plan:
    """A precision plan resolved for one policy: each part's dtype, the dtype whose limits judge it, a hash of both."""

    name: str
    parts: tuple[tuple[str, str], ...]
    limits: str

    @property
    def hash(self) -> str:
        text = json.dumps({"parts": dict(self.parts), "limits": self.limits}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def describe(self) -> dict:
        return {"name": self.name, "hash": self.hash, "limits": self.limits, "parts": dict(self.parts)}


def plan_for(conf: PlanConf, parts: tuple[str, ...], dtype: str, shape: str) -> Plan | None:
    """The plan a config names (None: none) for a policy with these parts (one left out takes `dtype`); UserError for a
    plan of another policy shape or naming a part this policy lacks."""
    if conf.parts is None:
        return None
    if conf.policy is not None and conf.policy != shape:
        raise UserError(f"plan {conf.name} was made for a policy with {conf.policy}; this policy has {shape}")
    unknown = [p for p in conf.parts if p not in parts]
    if unknown:
        raise UserError(f"plan {conf.name}: unknown part {unknown[0]!r}; this policy's parts: {', '.join(parts)} "
                        "(its normalizers always stay fp32)")
    resolved = {part: conf.parts.get(part, dtype) for part in parts}
    return Plan(conf.name, tuple(resolved.items()), conf.limits or min(resolved.values(), key=DTYPE_NAMES.index))


@dataclass(frozen=True)
class Target:
    """A resolved (device, dtype) pair, checked to run a matmul; with a precision plan, each part's dtype too."""

    device: torch.device
    dtype: torch.dtype
    device_name: str
    dtype_name: str
    plan: Plan | None = None

    @property
    def kind(self) -> str:
        return self.device.type

    @property
    def label(self) -> str:
        """What the layers compute in, as runner names show it: the dtype, or `plan-<name>`."""
        return f"plan-{self.plan.name}" if self.plan else self.dtype_name

    def dtypes(self) -> set[str]:
        """Every dtype the policy's layers run in."""
        return {d for _, d in self.plan.parts} if self.plan else {self.dtype_name}


def check_backend(name: str, target: Target | None = None) -> str:
    """A backend name (config.BACKENDS); with a target, Unsupported where the backend refuses its dtypes (a plan's every
    part's), device kind or plan (Backend.refusal, .planless). Whether it runs on this machine is the runner's to say."""
    if name not in BACKENDS:
        raise UserError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    spec = BACKENDS[name]
    if target is not None and target.plan is not None and spec.planless:
        raise Unsupported(f"backend {name} cannot run precision plan {target.plan.name}: {spec.planless}")
    why = [spec.refusal(d, target.kind) for d in sorted({target.dtype_name, *target.dtypes()})] if target else []
    if any(why):
        raise Unsupported(next(filter(None, why)))
    return name


def check_device(name: str) -> tuple[str, int | None]:
    m = _DEVICE_RE.match(str(name))
    if not m:
        raise UserError(f"unknown device {name!r}; valid: cpu, cuda[:N], npu[:N], mps")
    kind, index = m.group(1), int(m.group(2)) if m.group(2) is not None else None
    if kind in ("cpu", "mps") and index not in (None, 0):
        raise UserError(f"unknown device {name!r}: {kind} has no device {index}; use {kind}")
    return kind, index


def _import_backend(kind: str) -> None:
    """torch_npu registers the 'npu' device: imported when an npu device is asked for, unless torch >= 2.5 auto-loaded
    it at `import torch` (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off; without CANN `import torch` itself fails)."""
    if kind != "npu" or hasattr(torch, "npu"):
        return
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        raise Unsupported(f"npu needs torch_npu, which is not installed here ({exc}); pip install 'huggy-exp[npu]' on an Ascend host") from None


def use_device(device: torch.device) -> None:
    """Make `device` the calling thread's current card, before its first op, any capture, and in every thread that runs
    the policy: CUDA's and torch_npu's current device is per thread, and one that never set it runs on card 0
    (torch_npu: error 107002 "context is empty", or a stray context there)."""
    if device.type in ("cuda", "npu") and device.index is not None:
        mod = torch.get_device_module(device)
        if mod.current_device() != device.index:
            mod.set_device(device.index)


def resolve_device(name: str) -> torch.device:
    kind, index = check_device(name)
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "npu":
        os.environ.setdefault(NPU_FALLBACK_ENV, "1")
    _import_backend(kind)
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise Unsupported(f"device {name}: MPS is not available on this machine")
        return torch.device("mps")
    mod = getattr(torch, kind, None)
    if mod is None or not mod.is_available():
        raise Unsupported(f"device {name}: no {kind.upper()} device is available on this machine (torch {torch.__version__})")
    count = mod.device_count()
    index = card_index(kind, index)
    if index >= count:
        raise Unsupported(f"device {name}: only {count} {kind} device(s) present")
    return torch.device(kind, index)


def card_index(kind: str, index: int | None) -> int:
    """The index in this process of the card `kind:index` names: 0 under Ray (ASSIGNED_CARD_ENV) and under SLURM with one
    visible card (the sweep's index is then a label; result.json records the visible-devices variable), else `index`.
    Ray's RAY_EXPERIMENTAL_NOSET_* variables leave every card visible, so the assigned one cannot be found: refused."""
    variable = VISIBLE_ENV[kind]
    noset = f"RAY_EXPERIMENTAL_NOSET_{variable}"
    if os.environ.get(noset):
        raise UserError(f"{noset} is set: Ray then leaves {variable} alone and the card it assigned cannot be told "
                        f"from the others; unset it")
    visible = [v for v in os.environ.get(variable, "").split(",") if v.strip()]
    if index is None or os.environ.get(ASSIGNED_CARD_ENV) == kind or len(visible) == 1 and os.environ.get("SLURM_JOB_ID"):
        return 0
    return index


def resolve(device: str, dtype: str, plan: Plan | None = None) -> Target:
    """Both names checked, and a small matmul in the dtype (with a plan, in each of its dtypes: one the device cannot run
    is a UserError naming the part and the dtypes that run here)."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPES)}")
    if plan is None:  # an int8 point off the CPU is skipped before its device is looked for
        _cpu_only(device, dtype)
    torch_device = resolve_device(device)
    use_device(torch_device)  # before the first op on the card (the probe)
    if plan is None:
        _probe(torch_device, device, dtype)
        return Target(torch_device, DTYPES[dtype], str(device), dtype)
    for part, wanted in plan.parts:
        try:
            _probe(torch_device, device, wanted)
        except Unsupported as exc:
            runs = [d for d in DTYPES if _runs(torch_device, device, d)]
            raise UserError(f"plan {plan.name}: part {part} in {wanted}: {exc}; dtypes that run on {device}: "
                            f"{', '.join(runs)}") from None
    return Target(torch_device, DTYPES[dtype], str(device), dtype, plan)


def _probe(torch_device: torch.device, device: str, dtype: str) -> None:
    _cpu_only(device, dtype)
    try:
        probe = torch.ones(4, 4, device=torch_device, dtype=DTYPES[dtype])
        (probe @ probe).sum().item()
    except (RuntimeError, TypeError) as exc:
        raise Unsupported(f"dtype {dtype} is not supported on {device}: {first_line(exc)}") from None
    if torch_device.type == "npu":
        set_again("npu")  # after the card's first op: older torch_npu builds reset ACL's HF32 option when it starts


def _cpu_only(device: str, dtype: str) -> None:
    if dtype in QUANTIZED and check_device(device)[0] != "cpu":
        raise Unsupported(f"dtype {dtype} (torchao int8) runs on the CPU here, not on {device}: its kernels there are "
                          "not verified (use device=cpu)")


def _runs(torch_device: torch.device, device: str, dtype: str) -> bool:
    try:
        _probe(torch_device, device, dtype)
    except Unsupported:
        return False
    return True


def quantize_onnx(model, out: Path) -> Path:
    """onnxruntime's dynamic quantization (int8 weights, uint8 activations per call: config.Dtype.peer) into `out`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    _quietly(lambda: quantize_dynamic(model, out, weight_type=QuantType.QInt8))
    return out


def quantize(module: torch.nn.Module, dtype: str) -> None:
    """Every nn.Linear of `module` quantized in place by torchao for a QUANTIZED dtype."""
    if dtype not in QUANTIZED:
        return
    try:
        ao = _quietly(lambda: importlib.import_module("torchao.quantization"))
    except ImportError as exc:
        raise Unsupported(f"dtype {dtype} needs torchao ({exc}); pip install torchao") from None
    ao.quantize_(module, getattr(ao, QUANTIZED[dtype])())


def _quietly(call):
    """`call()` with log records up to WARNING dropped: torchao's import logs that its CUDA extensions do not load on a
    CPU torch, onnxruntime's quantizer advice (pre-processing, the opset it raised to 11) that verification makes moot."""
    import logging

    logging.disable(logging.WARNING)
    try:
        return call()
    finally:
        logging.disable(logging.NOTSET)


# --- fp32 math: the precision_mode axis (docs/hardware/)
# which precision modes each device kind honours: tf32 is CUDA's (cuBLAS, cuDNN), hf32 Ascend's (cube units)
HONOURED = {"cpu": ("ieee",), "cuda": ("ieee", "tf32"), "npu": ("ieee", "hf32"), "mps": ("ieee",)}
TORCH_OPS = ("matmul", "conv", "rnn")  # the ops torch's per-op fp32_precision switches name (mkldnn; cudnn: conv, rnn)
# every fp32 switch by its recorded name: (its holder's path under torch, its attribute), in the order they are set.
# The CPU's oneDNN per op; CUDA's legacy switches (every torch: cuBLAS, and cuDNN's conv and RNN together; inductor reads
# them) before its per-op ones (torch >= 2.9; cuDNN's RNN is tf32 by default), so that both read the mode; torch_npu's
# HF32 (matmul off by default, conv on; torch.npu.aclnn.allow_hf32 is conv's, under its aclnn name) and, where it
# exists (CANN >= 8.5), the matmul cube math type, which outranks allow_hf32 when set
SWITCHES = {**{f"cpu_{op}": (f"backends.mkldnn.{op}", "fp32_precision") for op in TORCH_OPS},
            "cuda_matmul_allow_tf32": ("backends.cuda.matmul", "allow_tf32"),
            "cudnn_allow_tf32": ("backends.cudnn", "allow_tf32"),
            "cuda_matmul": ("backends.cuda.matmul", "fp32_precision"),
            **{f"cudnn_{op}": (f"backends.cudnn.{op}", "fp32_precision") for op in ("conv", "rnn")},
            **{f"npu_{op}_allow_hf32": (f"npu.{op}", "allow_hf32") for op in ("matmul", "conv", "aclnn")},
            "npu_cube_math_type": ("npu.matmul", "cube_math_type")}
# switches a build may lack whatever the mode (recorded `not present`): the CPU's before torch 2.4 (it stays IEEE),
# CUDA's per-op ones before torch 2.9 (the legacy ones carry the mode), torch_npu's aclnn name and the cube math type
OPTIONAL = {"cpu_matmul", "cpu_conv", "cpu_rnn", "cuda_matmul", "cudnn_conv", "cudnn_rnn", "npu_aclnn_allow_hf32",
            "npu_cube_math_type"}
# torch_npu's switch objects answer every attribute name (their __getattr__ returns None for a name they lack), so a
# switch is present when it reads a value; one whose unset value is None is present when this companion exists
PRESENT_WITH = {"npu_cube_math_type": "npu.CubeMathType"}


def set_precision(device: str, dtype: str, mode: str) -> dict[str, str]:
    """The device kind's fp32 switches put in `mode` (the CPU's in ieee: the references run there), by every job, so a
    sweep's earlier point never leaks its mode; returns what each reads back. Unsupported: a mode the device cannot
    honour, tf32/hf32 with another dtype, a switch the mode needs that this build lacks, or one that does not read back."""
    kind, _ = check_device(device)
    if mode not in HONOURED[kind]:
        raise Unsupported(f"precision_mode={mode} cannot be honoured on {kind}: it has {', '.join(HONOURED[kind])} "
                          "(tf32 is CUDA's, hf32 Ascend's)")
    if mode != "ieee" and not config.DTYPES[dtype].fp32_math:
        raise Unsupported(f"precision_mode={mode} changes fp32 math only; dtype={dtype} computes in {dtype} (use ieee)")
    values = {f"cpu_{op}": "ieee" for op in TORCH_OPS} | _device_values(kind, mode)
    asked = {}
    for key, value in values.items():
        holder, name = _holder(key)
        if _present(key):
            _switch(holder, name, value, mode)
            asked[key] = _shown(value)
        elif mode != "ieee" and key not in OPTIONAL:
            raise Unsupported(f"precision_mode={mode}: this build has no {SWITCHES[key][0]}.{name} switch to set")
    found = precision_switches()
    wrong = {k: found.get(k) for k, v in asked.items() if found.get(k) != v}
    if wrong:
        raise Unsupported(f"precision_mode={mode}: the switches read back {wrong}, not {({k: asked[k] for k in wrong})}")
    return found | backend_options(kind, mode)


def _device_values(kind: str, mode: str) -> dict[str, object]:
    if kind == "cuda":
        tf32 = mode == "tf32"
        return {"cuda_matmul_allow_tf32": tf32, "cudnn_allow_tf32": tf32, "cuda_matmul": mode, "cudnn_conv": mode,
                "cudnn_rnn": mode}
    if kind != "npu":
        return {}
    _import_backend("npu")
    hf32, cube = mode == "hf32", getattr(torch.npu, "CubeMathType", None)
    values: dict[str, object] = {f"npu_{op}_allow_hf32": hf32 for op in ("matmul", "conv", "aclnn")}
    if cube is not None:
        values["npu_cube_math_type"] = cube.USE_HF32 if hf32 else cube.KEEP_DTYPE
    return values


def set_again(kind: str) -> None:
    """Set the device kind's fp32 switches again to what they read, after the card's first op: torch_npu builds before
    2025-09 set ACL's HF32 option to its default ("10": conv on, matmul off) when the card starts
    (LazyInitAclops.cpp, SetHF32DefaultValue), over what set_precision set, while the getters still read the value
    set; setting it again puts ACL's option back (torch_npu's option hooks)."""
    for key in SWITCHES:
        if key.startswith(f"{kind}_") and _present(key) and (value := _read(key)) is not None:
            holder, name = _holder(key)
            setattr(holder, name, value)


def backend_options(kind: str, mode: str) -> dict[str, str]:
    """What the point's onnxruntime sessions and torchair are given for `mode`, recorded beside the switches."""
    if kind == "cuda":
        return {"onnxruntime_cuda_use_tf32": onnxruntime_options("CUDAExecutionProvider", None, mode)["use_tf32"]}
    if kind == "npu":
        return {"onnxruntime_cann_precision_mode": CANN_PRECISION.get(mode, f"none ({mode}: onnxruntime is skipped)"),
                "torchair_mode": TORCHAIR_MODE}
    return {}


# torchair (backend compile on npu): CompilerConfig has no precision option (Ascend/torchair python/torchair/configs:
# ge_config.py's options are GE's whole list). In its default mode, max-autotune, GE builds the graph: GE reads HF32 from
# torch.npu.matmul/conv.allow_hf32 once per process, when it starts (core/_backend.py, _get_global_op_compile_config;
# torchair/concrete_graph/session.cpp, Session::Initialize), and gets no ge.exec.precision_mode, so CANN's default
# runs fp32 matmuls in fp16. reduce-overhead (torchair >= 2025-03) captures torch_npu's own kernels as an aclgraph, whose
# fp32 math is the npu_* switches above, set for each point's precision_mode (ieee keeps fp32, hf32 allows HF32)
TORCHAIR_MODE = "reduce-overhead"


# onnxruntime's CANN provider builds whole graphs with CANN's graph engine, whose default precision_mode is force_fp16
# (fp32 operators run in fp16 where both exist): a point asks for its precision_mode's CANN value. onnxruntime builds
# that renamed the option take precision_mode_v2 (ATC's --precision_mode_v2 values: must_keep_origin_dtype is origin)
CANN_PRECISION = {"ieee": "must_keep_origin_dtype"}
CANN_RENAMED = ("precision_mode", "precision_mode_v2", {"must_keep_origin_dtype": "origin"})


def onnxruntime_options(provider: str, index: int | None, mode: str) -> dict[str, str]:
    """A provider's options for a point: its card and fp32 math (CUDA's runs TF32 unless use_tf32=0; CANN's keeps fp32
    only with precision_mode=must_keep_origin_dtype, and has no HF32 option)."""
    options = {} if index is None else {"device_id": str(index)}
    if provider == "CUDAExecutionProvider":
        options["use_tf32"] = "1" if mode == "tf32" else "0"
    elif provider == "CANNExecutionProvider":
        if mode not in CANN_PRECISION:
            raise Unsupported(f"backend onnxruntime: precision_mode={mode} has no CANNExecutionProvider option (its "
                              "precision_mode keeps fp32 or lowers it to fp16); run hf32 with eager, compile or graphs")
        options["precision_mode"] = CANN_PRECISION[mode]
    return options


def option_spellings(options: dict[str, str] | None) -> list[dict[str, str] | None]:
    """The options to try in turn: as given, then with CANN's precision_mode as renamed builds spell it (CANN_RENAMED)."""
    old, new, values = CANN_RENAMED
    if not options or old not in options:
        return [options]
    renamed = {k: v for k, v in options.items() if k != old} | {new: values.get(options[old], options[old])}
    return [options, renamed]


def _at(path: str) -> object:
    """torch's attribute at a dotted path, None where absent (this torch, or no torch_npu imported yet)."""
    return functools.reduce(lambda obj, part: getattr(obj, part, None), path.split("."), torch)


def _holder(key: str) -> tuple[object, str]:
    return _at(SWITCHES[key][0]), SWITCHES[key][1]


def _read(key: str) -> object:
    """A switch's value (None where absent); torch's legacy getters raise on a mix of legacy and per-op settings."""
    holder, name = _holder(key)
    return getattr(holder, name, None)


def _present(key: str) -> bool:
    """Whether this build has the switch: it reads a value, or its companion (PRESENT_WITH) exists."""
    if key in PRESENT_WITH:
        return _holder(key)[0] is not None and _at(PRESENT_WITH[key]) is not None
    try:
        return _read(key) is not None
    except RuntimeError:
        return True


def _switch(holder, name: str, value: object, mode: str) -> None:
    """Set one switch; a torch whose switch refuses the value skips the point, saying so."""
    try:
        setattr(holder, name, value)
    except (RuntimeError, ValueError, AssertionError, TypeError) as exc:
        raise Unsupported(f"precision_mode={mode}: torch {torch.__version__} refused {name}={value!r} ({first_line(exc)})") from None


def _shown(value: object) -> str:
    """A switch's value as recorded: `unset` (None), true/false, an enum's name, else its text."""
    if value is None:
        return "unset"
    return str(value).lower() if isinstance(value, bool) else str(getattr(value, "name", value))


def precision_switches() -> dict[str, str]:
    """Every switch (SWITCHES) as it reads now: `not present` where this build lacks it, `unreadable` where torch refuses
    (a mix of its legacy and per-op settings, made outside set_precision). Never imports torch_npu."""
    out = {}
    for key in SWITCHES:
        try:
            out[key] = _shown(_read(key)) if _present(key) else "not present"
        except RuntimeError as exc:
            out[key] = f"unreadable: {first_line(exc)[:80]}"
    return out


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (torch.mps.synchronize takes no device argument)."""
    if device.type == "mps":
        torch.get_device_module(device).synchronize()
    elif device.type != "cpu":
        torch.get_device_module(device).synchronize(device)


def _card(device: torch.device, name: str):
    """A card's (cuda, npu) device-module function, or None (the CPU's and MPS's memory is the process's)."""
    return getattr(torch.get_device_module(device), name, None) if device.type in ("cuda", "npu") else None


def memory_stats(device: torch.device) -> dict[str, float]:
    """Peak and current allocator bytes where a card's device module tracks them."""
    names = ("max_memory_allocated", "memory_allocated", "max_memory_reserved")
    return {f"{name}_bytes": float(fn(device)) for name in names if (fn := _card(device, name)) is not None}


def reset_peak_memory(device: torch.device) -> None:
    """A fresh allocator peak on a card (cuda, npu)."""
    if (fn := _card(device, "reset_peak_memory_stats")) is not None:
        fn(device)


def peak_memory(device: torch.device) -> tuple[float, str]:
    """(peak MB, what was read): a card's allocator peak since reset_peak_memory (cuda, npu); elsewhere the process's
    peak RSS since it started (on MPS too: torch.mps keeps no peak, and process memory is not the GPU's)."""
    if (fn := _card(device, "max_memory_allocated")) is not None:
        return float(fn(device)) / 2**20, f"{device} allocator (max_memory_allocated since its reset)"
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS since start (not device memory)"


def _visible(kind: str) -> int | str:
    """How many `kind` cards this process sees (its device module's count), or why it cannot look (no torch_npu)."""
    try:
        _import_backend(kind)
    except Unsupported as exc:
        return str(exc)
    mod = getattr(torch, kind, None)
    return mod.device_count() if mod is not None and mod.is_available() else 0


def inventory() -> dict[str, object]:
    """The devices this process can see (torch_npu imported only where installed)."""
    npu = _visible("npu") if importlib.util.find_spec("torch_npu") is not None else "torch_npu not installed"
    return {"cpu": 1, "cuda": _visible("cuda"), "mps": int(torch.backends.mps.is_available()), "npu": npu}


def device_name(kind: str) -> str:
    """The first visible card's name as its device module reports it, or why there is none (never a fallback)."""
    found = "cpu" if kind == "cpu" else _visible(kind)
    if isinstance(found, str):
        return found
    if not found:
        return f"no {kind} device visible here"
    get = getattr(getattr(torch, kind), "get_device_name", None)
    return str(get(0)) if get is not None else kind


def cann_version() -> str:
    """The Ascend CANN toolkit version from its install info, or 'not found'."""
    roots = [os.environ.get(k) for k in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")] + ["/usr/local/Ascend/ascend-toolkit/latest"]
    for root in filter(None, roots):
        for info in [Path(root) / "version.cfg", *sorted(Path(root).glob("*/ascend_toolkit_install.info"))]:
            found = info.is_file() and re.search(r"^\s*[vV]ersion=(.*)$", info.read_text(errors="replace"), re.M)
            if found:
                return found.group(1).strip()
    return "not found"
