"""Backend `fused`: Huggy's whole forward as one C++ kernel, built by inductor's C++ toolchain, called without a wrapper.

Why: at batch 1 on the CPU the torch paths spend their time in MKL's gemv (26 µs per 512x512 layer on an AVX2 AMD
EPYC, where OpenBLAS and onnxruntime's MLAS take 16) and in one dispatcher round trip per op (about 3 µs each, a
dozen ops). inductor's own code for this graph keeps one FMA chain per output row (latency-bound) and its GEMM template
blocks 1 x 16 at M = 1, so neither reaches the memory bandwidth. This kernel (kernels/fused_mlp.cpp) runs the whole
network in one call: four weight rows at a time with eight FMA chains in flight, bias, SiLU and the clamps fused, on
inductor's vector library (at::vec, AVX2 or AVX-512 as the CPU allows). It is compiled once per network shape into
inductor's cache (about 20 s the first time, milliseconds after) and verified against eager like every backend.

Scope: CPU, fp32, Huggy's shape (one input, continuous actions: PPO's clamp or SAC's raw mu, no memory); rows run one
at a time: the batch-1 / control-loop backend, not a GEMM (large batches belong to eager or compile). Sampled actions
run eager."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from huggy_exp.errors import Unsupported, first_line
from huggy_exp.mlagents import ACTION_CLAMP, NORMALIZER_CLAMP

SOURCE = Path(__file__).with_name("kernels") / "fused_mlp.cpp"


def need_compiler(backend: str) -> None:
    """Inductor's C++ toolchain builds `backend` (compile on the CPU, fused): without a compiler it is Unsupported."""
    if not any(c and shutil.which(c) for c in (os.environ.get("CXX"), "g++", "c++", "clang++")):
        raise Unsupported(f"backend {backend}: inductor needs a C++ compiler and none is on PATH "
                          "(g++, c++, clang++, $CXX)")


def source(dims: list[int], act: int, normalize: bool, clamp_actions: bool = True) -> str:
    """The kernel's C++ with this network's shapes as constants (inductor caches one build per distinct source)."""
    layers = len(dims) - 1
    consts = (f"constexpr int64_t N_LAYERS = {layers};\nconstexpr int64_t DIMS[] = {{{', '.join(map(str, dims))}}};\n"
              f"constexpr int64_t ACT = {act};\nconstexpr int64_t WIDTH = {max(dims)};\n"
              f"constexpr bool NORMALIZE = {str(normalize).lower()};\nconstexpr bool CLAMP_ACTIONS = {str(clamp_actions).lower()};\n"
              f"constexpr float NORM_CLAMP = {float(NORMALIZER_CLAMP)!r}f;\nconstexpr float ACT_CLAMP = {float(ACTION_CLAMP)!r}f;\n")
    prefix = "#include <torch/csrc/inductor/cpp_prefix.h>\n"
    body = SOURCE.read_text().replace(prefix, prefix + consts, 1)
    params = ", ".join(f"const float* w{i}, const float* b{i}" for i in range(layers))
    return (body.replace("@PARAMS@", params).replace("@WS@", ", ".join(f"w{i}" for i in range(layers)))
            .replace("@BS@", ", ".join(f"b{i}" for i in range(layers))))


class FusedMLP:
    """The policy's deterministic forward as one kernel call: float32 [N, obs] tensor in, [N, act] tensor out (a CPU
    fp32 policy that passed Policy.check_single: config.BACKENDS declares fused's devices and dtypes)."""

    def __init__(self, policy):
        need_compiler("fused")
        try:
            from torch._inductor.codecache import CppPythonBindingsCodeCache
        except ImportError as exc:
            raise Unsupported(f"backend fused: torch inductor is unavailable ({exc})") from None
        norm, layers = policy.normalizers[0], [t for weight_bias in policy._gemv for t in weight_bias]
        dims = [policy.obs_dim] + [w.shape[0] for w, _ in policy._gemv[:-1]]
        self.act = policy.act_dim
        stats = [norm.running_mean, norm.std] if norm.enabled else [torch.zeros(policy.obs_dim)] * 2
        self.args = [t.detach().to(torch.float32).contiguous() for t in (*stats, *layers)]
        argtypes = ["const float*", "float*", *["const float*"] * len(self.args), "int64_t"]
        try:
            self.kernel = CppPythonBindingsCodeCache.load_pybinding(argtypes, source(dims, self.act, norm.enabled, not policy.tanh_squash))
        except Exception as exc:  # the compiler's own message is long: its first line names the cause
            raise Unsupported(f"backend fused: the kernel did not build ({first_line(exc)[:300]})") from None

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.to(torch.float32).contiguous()
        out = torch.empty(obs.shape[0], self.act)
        self.kernel(obs, out, *self.args, obs.shape[0])
        return out
