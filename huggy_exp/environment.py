"""What a host is, for a port certificate: CPU, OS, Python, the numeric stack's versions and the precision switches.
`capture()` never imports torch_npu; `diff()` lists every field that differs between two captures, dotted.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("torch", "torch_npu", "onnxruntime", "onnx", "numpy", "scipy")
JOB_DISTRIBUTIONS = ("torch", "torch_npu", "onnxruntime", "onnx", "numpy", "hydra-core", "mlflow")  # every result.json
NUMERIC_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE",
               "TORCH_DEVICE_BACKEND_AUTOLOAD", "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
# ISA features that change which kernels run (x86 and Arm); the full flag list is kept too
KEY_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8", "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm")
NOT_PRESENT = "not present"


def capture() -> dict:
    """The host and its numeric stack as plain JSON values."""
    return {"host": platform.node(), "cpu": cpu(), "os": os_info(), "python": platform.python_version(),
            "versions": versions(), "runtime": runtime_flags(), "switches": device_switches(),
            "env": {k: os.environ[k] for k in NUMERIC_ENV if k in os.environ}}


def emulated(device: str) -> bool:
    """Whether `device`'s kind ("npu:1") is emulated: its imported device module carries `EMULATED` (tests/emulated_npu.py)."""
    import sys

    return bool(getattr(getattr(sys.modules.get("torch"), str(device).split(":")[0], None), "EMULATED", False))


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """Model name, logical CPUs, ISA flags (from /proc/cpuinfo on Linux) and torch's CPU kernel level (AVX2, AVX512...)."""
    import torch

    model, flags = platform.processor() or platform.machine(), []
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and value.strip():
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = sorted(set(value.split()))
    return {"model": model, "machine": platform.machine(), "logical_cpus": os.cpu_count(),
            "key_flags": [f for f in KEY_FLAGS if f in flags], "flags": " ".join(flags),
            "torch_capability": str(torch.backends.cpu.get_cpu_capability())}


def os_info() -> dict:
    libc = " ".join(platform.libc_ver()).strip()
    return {"system": platform.system(), "release": platform.release(), "platform": platform.platform(), "libc": libc or NOT_PRESENT}


@functools.cache  # a job asks for each version several times, and each lookup scans sys.path's dist-info
def _version(dist: str, missing: str = NOT_PRESENT) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return missing


def summary() -> dict[str, str]:
    """A job's versions for result.json and `info` (importlib.metadata: nothing heavy imported)."""
    env = {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node()}
    for dist in JOB_DISTRIBUTIONS:
        env[dist.replace("-", "_")] = _version(dist, "not installed")
    return env


def versions() -> dict:
    """Package versions (importlib.metadata), and the toolkits: CUDA (torch's build), cuDNN, CANN, GPU/NPU driver."""
    import torch

    from huggy_exp.placement import cann_version

    cudnn = torch.backends.cudnn
    return {**{dist: _version(dist) for dist in DISTRIBUTIONS}, "cann": cann_version(),
            "cuda": torch.version.cuda or NOT_PRESENT,
            "cudnn": str(cudnn.version()) if cudnn.is_available() else NOT_PRESENT,
            "cuda_driver": _nvidia_driver() if torch.cuda.is_available() else NOT_PRESENT,
            "npu_driver": _ascend_driver()}


def _nvidia_driver() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (nvidia-smi not runnable)"
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"


def _ascend_driver(root: Path = Path("/usr/local/Ascend/driver")) -> str:
    info = root / "version.info"
    if not info.is_file():
        return NOT_PRESENT
    match = re.search(r"^\s*Version\s*=\s*(\S+)", info.read_text(errors="replace"), re.M | re.I)
    return match.group(1) if match else "unknown"


def runtime_flags() -> dict:
    """The process's precision switches: fp32 math (placement.precision_switches), reduced-precision reductions,
    deterministic algorithms."""
    import torch

    from huggy_exp.placement import precision_switches

    return {
        **{f"fp32_precision_{name}": value for name, value in precision_switches().items()},
        "cuda_fp16_reduced_precision_reduction": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
        "cuda_bf16_reduced_precision_reduction": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
        "deterministic_algorithms": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
    }


def device_switches() -> dict[str, str]:
    """The device runtime's switches that decide what runs where: torch_npu's CPU fallback, jit-compile mode, internal
    formats, ACL_OP_INIT_MODE (1: ACL's options start at the first ACL operator, where torch_npu builds before 2025-09
    reset HF32 after placement.set_again), the visible-devices variables. Never imports torch_npu or starts a card."""
    import sys

    from huggy_exp.placement import NPU_FALLBACK_ENV, VISIBLE_ENV

    out = {"npu_fallback_cpu_disable": os.environ.get(NPU_FALLBACK_ENV, "unset"),
           "npu_acl_op_init_mode": os.environ.get("ACL_OP_INIT_MODE", "unset")}
    npu = getattr(sys.modules.get("torch"), "npu", None)
    jit_off = getattr(npu, "is_jit_compile_false", None)
    started = jit_off is not None and bool(getattr(npu, "is_initialized", lambda: False)())
    out["npu_jit_compile"] = str(not jit_off()).lower() if started else NOT_PRESENT
    get = getattr(getattr(sys.modules.get("torch_npu"), "_C", None), "_npu_getOption", None)
    value = get("ALLOW_INTERNAL_FORMAT") if get is not None else None
    out["npu_allow_internal_format"] = NOT_PRESENT if get is None else value.decode() if value else "unset"
    out.update({f"visible_{kind}": os.environ.get(name, "unset") for kind, name in VISIBLE_ENV.items()})
    return out


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out |= flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value}
    return out


def diff(recorded: dict, here: dict) -> list[dict]:
    """Every field that differs: {field, recorded, here} (`absent` on the side that lacks it; `cpu.flags` as the flags
    added and removed)."""
    a, b = flatten(recorded or {}), flatten(here or {})
    rows = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, "absent"), b.get(key, "absent")
        if old == new:
            continue
        if key == "cpu.flags" and isinstance(old, str) and isinstance(new, str):
            gone, added = sorted(set(old.split()) - set(new.split())), sorted(set(new.split()) - set(old.split()))
            old, new = f"{len(gone)} flags only in the recording: {' '.join(gone[:12])}", f"{len(added)} flags only here: {' '.join(added[:12])}"
        rows.append({"field": key, "recorded": old, "here": new})
    return rows


def same_stack(rows: list[dict]) -> bool:
    """No difference that can change the bits: a host name alone (a renamed or cloned machine) does not count."""
    return all(r["field"] == "host" for r in rows)
