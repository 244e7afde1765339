"""The speed targets, measured in one run and printed as a table: `python benchmarks/bench.py [--model file.pt]`.

Targets (issue 15): batch 1, the fastest torch backend <= 1.2x onnxruntime at 1 thread; `run.py mode=action
tracking=none` <= 1.2x `python -c "import torch"`; MLflow on a single run <= 1.5 s over tracking=none; at batch >= 512
the fastest torch fp32 >= 1.0x onnxruntime and >= 85% of the GEMM peak measured in the same run, bf16 >= 1.7x
onnxruntime fp32 where the CPU has bf16 dot products (avx512_bf16 or AMX), "n/a" elsewhere.

Method: everything in-process runs at 1 thread; the backend figures come from the `benchmark` mode's own task (what
`python run.py mode=benchmark` measures: verified against eager, then timed in interleaved rounds); the batch-1
attempts (each way torch was tried) are timed here in interleaved rounds too, each checked against eager first.
Whole-process figures start fresh interpreters in A B A B pairs and take the median of the per-pair ratios (or
differences), so a drifting machine moves both sides alike. `--markdown FILE` / `--json FILE` write the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_exp import timing  # noqa: E402
from huggy_exp.context import Context  # noqa: E402
from huggy_exp.runners import ACTIONS, OBS, build  # noqa: E402
from huggy_exp.tasks.benchmark import BenchmarkTask  # noqa: E402

HUGGY = REPO.parent / "shared" / "fixtures" / "mlagents" / "huggy" / "Huggy" / "Huggy-2000049.pt"
TORCH_BACKENDS = ("eager", "compile", "fused")
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def context(model: str | None, dtype: str, workdir: Path) -> Context:
    """A job's context as run.py builds it from conf/ (its limits included: a dtype without one cannot be judged), at
    one thread."""
    from hydra import compose, initialize_config_dir

    from huggy_exp.app import build_context
    from huggy_exp.preflight import setup

    setup()
    overrides = [f"dtype={dtype}", "threads=1", "tracking=none"] + ([f"model.checkpoint={model}"] if model else [])
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return build_context(compose(config_name="config", overrides=overrides), workdir)


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_name() -> str:
    try:
        line = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def flops_per_obs(ctx: Context) -> float:
    w = ctx.weights
    return 2.0 * sum(weight.size for weight, _ in [*w.layers, w.mu])


def gemm_gflops(rows: int, k: int, n: int, seconds: float = 1.5) -> float:
    """fp32 torch.mm rate (GFLOP/s, p50) at [rows, k] @ [k, n] on the current thread count."""
    a, b = torch.randn(rows, k), torch.randn(k, n)
    t = timing.measure(lambda: torch.mm(a, b), torch.device("cpu"), budget_s=seconds, warmup_s=0.3)
    return 2 * rows * k * n / (t.stats()["p50_us"] / 1e6) / 1e9


def bare_loop_us(session, feeds: dict, seconds: float) -> float:
    """p50 of session.run in a plain perf_counter loop: no harness, no runner."""
    samples, end = [], time.perf_counter() + seconds
    for _ in range(50):
        session.run(None, feeds)
    while time.perf_counter() < end:
        start = time.perf_counter()
        session.run(None, feeds)
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)) * 1e6


def gemms_only_obs_s(ctx: Context, rows: int, seconds: float = 1.5) -> float:
    """obs/s of the policy's GEMMs alone (torch.addmm per layer at [rows, in]) with nothing between them: the ceiling
    the elementwise work (normalizer, SiLU, clamp) and the runner bring the backends down from."""
    policy = build(ctx, "eager").policy
    xs = [torch.randn(rows, w.shape[1]) for w, _ in policy._gemv]
    call = lambda: [torch.addmm(b, x, w.t()) for (w, b), x in zip(policy._gemv, xs)]  # noqa: E731
    t = timing.measure(call, torch.device("cpu"), budget_s=seconds, warmup_s=0.3)
    return rows / (t.stats()["p50_us"] / 1e6)


# --- batch 1: every way torch was tried, against onnxruntime, in one interleaved loop


def _by_hand(mean, std, layers, mu_w, mu_b) -> dict[str, Callable]:
    """Huggy's forward written out by hand: nn.Linear calls, out= buffers, oneDNN and MKL packed weights, numpy."""
    import torch.nn.functional as F

    out: dict[str, Callable] = {}

    def addmm(o):
        x = torch.clamp((torch.from_numpy(o) - mean) / std, -5, 5)
        for w, b in layers:
            x = F.linear(x, w, b)
            x = x * torch.sigmoid(x)
        return (torch.clamp(F.linear(x, mu_w, mu_b), -3, 3) / 3).numpy()

    out["eager addmm (nn.Linear chain)"] = addmm
    width = max(w.shape[0] for w, _ in layers)
    n0, h, s, mu = torch.empty(mean.shape), torch.empty(2, width), torch.empty(width), torch.empty(mu_b.shape)

    def preallocated(o):  # every op with out= or in place: no allocation in the call
        torch.sub(torch.from_numpy(o[0]), mean, out=n0)
        x = n0.div_(std).clamp_(-5, 5)
        for i, (w, b) in enumerate(layers):
            y = h[i % 2, : w.shape[0]]
            torch.addmv(b, w, x, out=y)
            torch.sigmoid(y, out=s[: w.shape[0]])
            x = y.mul_(s[: w.shape[0]])
        torch.addmv(mu_b, mu_w, x, out=mu)
        return mu.clamp_(-3, 3).div_(3).numpy()[None].copy()

    out["addmv + out= buffers, in place"] = preallocated

    packed = [(torch.ops.mkldnn._reorder_linear_weight(w, 1), b) for w, b in layers]
    packed_mu = torch.ops.mkldnn._reorder_linear_weight(mu_w, 1)

    def onednn(o):  # oneDNN's prepacked linear with SiLU fused (what inductor uses for bf16)
        x = torch.clamp((torch.from_numpy(o) - mean) / std, -5, 5)
        for w, b in packed:
            x = torch.ops.mkldnn._linear_pointwise(x, w, b, "swish", [], "")
        return (torch.clamp(torch.ops.mkldnn._linear_pointwise(x, packed_mu, mu_b, "none", [], ""), -3, 3) / 3).numpy()

    out["oneDNN packed linear + fused swish"] = onednn
    if torch._C.has_mkl:
        mkl = [(torch.ops.mkl._mkl_reorder_linear_weight(w, 1), w, b) for w, b in layers]
        mkl_mu = torch.ops.mkl._mkl_reorder_linear_weight(mu_w, 1)

        def mkl_packed(o):  # MKL's packed sgemm (what inductor freezing uses for fp32 linears)
            x = torch.clamp((torch.from_numpy(o) - mean) / std, -5, 5)
            for p, w, b in mkl:
                x = F.silu(torch.ops.mkl._mkl_linear(x, p, w, b, 1))
            return (torch.clamp(torch.ops.mkl._mkl_linear(x, mkl_mu, mu_w, mu_b, 1), -3, 3) / 3).numpy()

        out["MKL packed sgemm + silu"] = mkl_packed
    out["numpy (OpenBLAS sgemv; not torch)"] = _numpy_forward(mean, std, layers, mu_w, mu_b)
    return out


def _numpy_forward(mean, std, layers, mu_w, mu_b) -> Callable:
    """Not torch: numpy's OpenBLAS sgemv, for scale."""
    np_layers = [(w.numpy(), b.numpy()) for w, b in layers]
    np_mean, np_std, np_mu = mean.numpy(), std.numpy(), (mu_w.numpy(), mu_b.numpy())

    def numpy_forward(o):
        x = np.clip((o[0] - np_mean) / np_std, -5, 5)
        for w, b in np_layers:
            x = w @ x + b
            x = x / (1 + np.exp(-x))
        return (np.clip(np_mu[0] @ x + np_mu[1], -3, 3) / 3)[None]

    return numpy_forward


def attempts(ctx: Context, everything: bool) -> dict[str, Callable[[np.ndarray], np.ndarray] | str]:
    """name -> f(obs [1, d] float32) -> actions [1, act], each Huggy's forward spelled another way (or why it cannot run)."""
    import torch.nn.functional as F

    policy = build(ctx, "eager", batch_size=1).policy
    norm = policy.normalizers[0]
    mean, std = norm.running_mean, norm.std
    layers, (mu_w, mu_b) = policy._gemv[:-1], policy._gemv[-1]
    out: dict[str, Callable] = {}
    runners = {name: build(ctx, name, batch_size=1, threads=1) for name in ("onnxruntime", "eager", "fused")}
    out["onnxruntime (reference)"] = lambda o: runners["onnxruntime"].infer({OBS: o})[ACTIONS]
    out["eager backend: addmv chain (MKL gemv)"] = lambda o: runners["eager"].infer({OBS: o})[ACTIONS]
    out.update(_by_hand(mean, std, layers, mu_w, mu_b))

    def _chain(x):
        x = torch.clamp((x - mean) / std, -5, 5)
        for w, b in layers:
            x = F.linear(x, w, b)
            x = x * torch.sigmoid(x)
        return torch.clamp(F.linear(x, mu_w, mu_b), -3, 3) / 3

    example = torch.from_numpy(ctx.make_feeds(1)[OBS])
    with torch.inference_mode(False), torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(_Wrap(_chain), example).eval())
        optimized = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(_Wrap(_chain), example).eval()))
    out["torch.jit.trace + freeze"] = lambda o: traced(torch.from_numpy(o)).numpy()
    out["jit.trace + freeze + optimize_for_inference"] = lambda o: optimized(torch.from_numpy(o)).numpy()

    out["torch.jit.script + freeze, NNC fuser on (SiLU fused)"] = _scripted(mean, std, layers, mu_w, mu_b, example)

    if everything:
        out.update(_slow_attempts(_chain, example))
    out["fused backend: one C++ kernel (inductor toolchain)"] = lambda o: runners["fused"].infer({OBS: o})[ACTIONS]
    return out


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class _Scriptable(torch.nn.Module):
    def __init__(self, mean, std, layers, mu_w, mu_b):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())
        self.linears = torch.nn.ModuleList()
        for w, b in [*layers, (mu_w, mu_b)]:
            linear = torch.nn.Linear(w.shape[1], w.shape[0])
            linear.weight.data, linear.bias.data = w.clone(), b.clone()
            self.linears.append(linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp((x - self.mean) / self.std, -5.0, 5.0)
        last = len(self.linears) - 1
        for i, linear in enumerate(self.linears):
            x = linear(x)
            if i < last:
                x = x * torch.sigmoid(x)
        return torch.clamp(x, -3.0, 3.0) / 3.0


def _scripted(mean, std, layers, mu_w, mu_b, example) -> Callable | str:
    """TorchScript with the CPU fuser (NNC) allowed: it fuses the elementwise ops around each linear."""
    before = torch._C._jit_can_fuse_on_cpu()
    torch._C._jit_override_can_fuse_on_cpu(True)
    try:
        with torch.inference_mode(False), torch.no_grad():
            scripted = torch.jit.freeze(torch.jit.script(_Scriptable(mean, std, layers, mu_w, mu_b).eval()))
            for _ in range(3):  # the profiling executor specializes, then fuses
                scripted(example)
    except RuntimeError as exc:  # the CPU fuser generates code through LLVM, which CPU wheels may leave out
        return f"not available: {str(exc).splitlines()[0]} (torch {torch.__version__})"
    finally:
        torch._C._jit_override_can_fuse_on_cpu(before)

    def call(o):
        with torch.no_grad():
            return scripted(torch.from_numpy(o)).numpy()

    return call


def _slow_attempts(chain, example) -> dict[str, Callable | str]:
    """Minutes of compilation: inductor's C++ GEMM template (max-autotune) and AOTInductor (no Python wrapper)."""
    import torch._inductor.config as inductor_config

    found: dict[str, Callable | str] = {}
    inductor_config.freezing = True
    try:
        with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="CPP"):
            torch._dynamo.reset()
            templ = torch.compile(_Wrap(chain).eval(), dynamic=False)
            with torch.no_grad():
                templ(example)
        found["inductor C++ GEMM template (max-autotune)"] = lambda o: templ(torch.from_numpy(o)).numpy()
    except Exception as exc:  # noqa: BLE001  (an attempt that cannot run is reported, not fatal)
        found["inductor C++ GEMM template (max-autotune)"] = f"not available: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    try:
        with torch.no_grad():
            exported = torch.export.export(_Wrap(chain).eval(), (example,))
            path = torch._inductor.aoti_compile_and_package(exported, package_path=tempfile.mktemp(suffix=".pt2"))
        aoti = torch._inductor.aoti_load_package(path)
        found["AOTInductor (aoti_compile_and_package)"] = lambda o: aoti(torch.from_numpy(o)).numpy()
    except Exception as exc:  # noqa: BLE001
        found["AOTInductor (aoti_compile_and_package)"] = f"not available: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return found


def time_attempts(ctx: Context, fns: dict[str, Callable | str], rounds: int, budget_s: float) -> dict[str, dict]:
    """Each checked against eager, then p50s over `rounds` interleaved rounds (order rotated); the median round."""
    obs = ctx.make_feeds(1)[OBS]
    want = fns["eager backend: addmv chain (MKL gemv)"](obs)
    rows = {}
    for name, fn in fns.items():
        if isinstance(fn, str):
            rows[name] = {"max_abs_vs_eager": float("nan"), "p50s": [], "ok": False, "unavailable": fn}
            continue
        diff = float(np.max(np.abs(np.asarray(fn(obs), np.float32) - want)))
        rows[name] = {"max_abs_vs_eager": diff, "p50s": [], "ok": diff <= 1e-5}
    names = [n for n in fns if rows[n]["ok"]]
    with torch.inference_mode(), timing.threads(1):
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                t = timing.measure(lambda: fns[name](obs), torch.device("cpu"), 1, budget_s, warmup_s=0.1)
                rows[name]["p50s"].append(t.stats()["p50_us"])
                time.sleep(0.02)
    for row in rows.values():
        row["p50_us"] = statistics.median(row["p50s"]) if row["p50s"] else float("nan")
    return rows


# --- whole processes: A B A B pairs

BREAKDOWN = """
import json, sys, time
t = [time.perf_counter()]
import torch; t.append(time.perf_counter())
import hydra; from hydra import compose, initialize_config_dir; t.append(time.perf_counter())
from huggy_exp import preflight
preflight.setup()
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    compose(config_name="config", overrides=["mode=action", "tracking=none"], return_hydra_config=True)
t.append(time.perf_counter())
import mlflow; t.append(time.perf_counter())
print(json.dumps(dict(zip(["import_torch_s", "import_hydra_s", "compose_s", "import_mlflow_s"],
                          [b - a for a, b in zip(t, t[1:])]))))
"""


def breakdown(runs: int = 3) -> dict[str, float]:
    """Medians over fresh interpreters of what a single run pays: torch, hydra, one compose, mlflow."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    got = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", BREAKDOWN, str(REPO / "conf")], cwd=REPO, env=env, capture_output=True,
                              text=True)
        if proc.returncode:
            print(f"breakdown failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return dict.fromkeys(("import_torch_s", "import_hydra_s", "compose_s", "import_mlflow_s"), float("nan"))
        got.append(json.loads(proc.stdout))
    return {k: statistics.median(g[k] for g in got) for k in got[0]}



def paired(a: list[str], b: list[str], runs: int, env: dict | None = None) -> dict[str, float]:
    """Fresh interpreters A and B in turn; medians of each side, of the per-pair ratio and of the difference (s)."""
    import resource

    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    ta, tb, ca, cb = [], [], [], []
    cpu = lambda: (lambda r: r.ru_utime + r.ru_stime)(resource.getrusage(resource.RUSAGE_CHILDREN))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs + 1):  # the first pair warms the page cache and is dropped
            pair = []
            for side, cmd in (("a", a), ("b", b)):
                cmd = [c.replace("{tmp}", f"{tmp}/{side}{i}") for c in cmd]
                start, used = time.perf_counter(), cpu()
                subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                pair.append((time.perf_counter() - start, cpu() - used))  # CPU: the child and every process it reaped
            if i:
                (wa, xa), (wb, xb) = pair
                ta, tb, ca, cb = ta + [wa], tb + [wb], ca + [xa], cb + [xb]
    return {"a_s": statistics.median(ta), "b_s": statistics.median(tb),
            "ratio": statistics.median(x / y for x, y in zip(ta, tb)),
            "diff_s": statistics.median(x - y for x, y in zip(ta, tb)), "runs": runs,
            "cpu_a_s": statistics.median(ca), "cpu_b_s": statistics.median(cb),
            "cpu_ratio": statistics.median(x / y for x, y in zip(ca, cb)),
            "cpu_diff_s": statistics.median(x - y for x, y in zip(ca, cb))}


def benchmark_mode(**changes):
    """mode=benchmark's schema object (config.BenchmarkMode) with conf/mode/benchmark.yaml's values (the one set of
    defaults), then `changes`."""
    from omegaconf import OmegaConf

    from huggy_exp.config import BenchmarkMode

    knobs = OmegaConf.load(REPO / "conf" / "mode" / "benchmark.yaml")
    knobs.pop("defaults")
    return OmegaConf.to_object(OmegaConf.merge(BenchmarkMode, knobs, changes))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(HUGGY) if HUGGY.is_file() else None, help="ML-Agents .pt (.onnx beside it)")
    parser.add_argument("--rows", type=int, default=1024, help="offline batch size (>= 512)")
    parser.add_argument("--budget", type=float, default=2.0, help="timed seconds per (backend, batch)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the batch-1 attempts")
    parser.add_argument("--startup-runs", type=int, default=7, help="A B pairs per whole-process comparison")
    parser.add_argument("--all-attempts", action="store_true", help="also inductor's GEMM template and AOTInductor (minutes)")
    parser.add_argument("--markdown", type=Path, help="write the table (and the attempts) as markdown here")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    return parser.parse_args()


def main() -> None:
    a = _arguments()
    started = time.time()
    ctx = context(a.model, "fp32", Path(tempfile.mkdtemp()))
    flop = flops_per_obs(ctx)
    flags = cpu_flags()
    header = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {cpu_name()} · {os.cpu_count()} cores "
              f"({', '.join(f for f in ('avx2', 'fma', 'avx512f', *BF16_FLAGS) if f in flags) or 'no avx flags read'}) · "
              f"torch {torch.__version__} · model {a.model or 'embedded synthetic default'} · {flop / 1e6:.2f} MFLOP/obs · 1 thread")
    print(f"# {header}", flush=True)
    m = {**measure_backends(ctx, a), **measure_processes(a.startup_runs)}
    rows = targets(m, a.rows, flop, flags)
    text = report(header, rows, m, a.rounds, started)
    print("\n" + text)
    if a.markdown:
        a.markdown.write_text(text + "\n")
    if a.json:
        a.json.write_text(json.dumps({"header": header, "targets": rows, "attempts": m["tried"], "startup": m["startup"],
                                      "mlflow": {**m["mlflow_cost"], "first_run_s": m["first_s"]}, "breakdown": m["parts"],
                                      "gemm_peak_gflops": m["peak"], "gemms_only_obs_s": m["gemms"],
                                      "gemm_square_gflops": m["square"], "fp32": m["m32"], "bf16": m["m16"]},
                                     indent=2, default=float))


def measure_backends(ctx: Context, a: argparse.Namespace) -> dict:
    """In this process: the backends as run.py mode=benchmark measures them, every batch-1 attempt, the harness against
    a bare loop, the GEMM peak."""
    mode = benchmark_mode(rounds=3, budget_s=a.budget, warmup_s=0.5, settle_s=0.05, batch_sizes=[a.rows],
                            scenarios=["single_stream", "offline"])
    fp32 = BenchmarkTask(replace(mode, backends=[*TORCH_BACKENDS, "onnxruntime"])).run(ctx)
    bf16_ctx = context(ctx.model_spec.checkpoint, "bf16", ctx.workdir)
    bf16 = BenchmarkTask(replace(mode, backends=["eager", "compile"], scenarios=["offline"])).run(bf16_ctx)
    for r in (fp32, bf16):
        print("\n".join("  " + line for line in r.summary), flush=True)
    tried = time_attempts(ctx, attempts(ctx, a.all_attempts), a.rounds, a.budget / a.rounds)
    ort = build(ctx, "onnxruntime", batch_size=1, threads=1)  # harness vs a bare loop on one session, interleaved
    feeds = {OBS: ctx.make_feeds(1)[OBS]}
    harness, bare = [], []
    for _ in range(3):
        harness.append(timing.measure(lambda: ort.infer(feeds), torch.device("cpu"), 1, a.budget / 2, 0.3).stats()["p50_us"])
        bare.append(bare_loop_us(ort.session, {ort.input: feeds[OBS]}, a.budget / 2))
    with timing.threads(1):
        peak = gemm_gflops(a.rows, 512, 512)  # the policy's hidden layer shape: the peak its GEMMs can reach
        square = gemm_gflops(a.rows, 1024, 1024)
        gemms = gemms_only_obs_s(ctx, a.rows)
    return {"m32": fp32.metrics, "m16": bf16.metrics, "tried": tried, "harness_us": statistics.median(harness),
            "bare_us": statistics.median(bare), "peak": peak, "square": square, "gemms": gemms}


def measure_processes(startup_runs: int = 7) -> dict:
    """Whole processes: run.py's start-up over `import torch`, MLflow's cost on a single run, the import breakdown."""
    run = [sys.executable, "run.py", "mode=action", "hydra.run.dir={tmp}"]
    startup = paired([*run, "tracking=none"], [sys.executable, "-c", "import torch"], startup_runs)
    with tempfile.TemporaryDirectory() as store:
        uri = f"tracking.uri=sqlite:///{store}/mlflow.db"
        first = time.perf_counter()
        subprocess.run([*run[:-1], uri, f"hydra.run.dir={store}/first"], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
        first_s = time.perf_counter() - first
        mlflow_cost = paired([*run, uri], [*run, "tracking=none"], startup_runs)
    return {"startup": startup, "first_s": first_s, "mlflow_cost": mlflow_cost, "parts": breakdown()}


def targets(m: dict, rows_n: int, flop: float, flags: set) -> list[dict]:
    """The table's rows: each target with its measurement, ratio, goal, verdict and cause."""
    m32, m16, startup, mlflow_cost, parts = m["m32"], m["m16"], m["startup"], m["mlflow_cost"], m["parts"]
    p50 = lambda b: m32.get(f"{b}/b1/p50_us", float("nan"))  # noqa: E731
    ort1 = p50("onnxruntime")
    best1 = min(TORCH_BACKENDS, key=lambda b: p50(b) if np.isfinite(p50(b)) else float("inf"))
    rate = lambda m, b: m.get(f"{b}/b{rows_n}/obs_per_s", float("nan"))  # noqa: E731
    ort_t = rate(m32, "onnxruntime")
    best32 = max(("eager", "compile"), key=lambda b: np.nan_to_num(rate(m32, b)))
    best16 = max(("eager", "compile"), key=lambda b: np.nan_to_num(rate(m16, b)))
    gflops = lambda obs_s: obs_s * flop / 1e9  # noqa: E731
    has_bf16 = sorted(flags & set(BF16_FLAGS))
    eager_us = m["tried"]["eager backend: addmv chain (MKL gemv)"]["p50_us"]
    ratio1, peak, gemms = p50(best1) / ort1, m["peak"], m["gemms"]
    return [
        target("batch 1: fastest torch / onnxruntime (1 thread)", f"{best1} {p50(best1):.1f} µs vs onnxruntime {ort1:.1f} µs",
               ratio1, "<= 1.2x", ratio1 <= 1.2,
               f"eager spends its time in MKL's sgemv ({eager_us:.0f} µs here); the fused kernel runs the whole "
               f"forward in one call at memory bandwidth" if best1 == "fused" else "see the attempts below"),
        target("start-up: run.py mode=action tracking=none / import torch",
               f"{startup['a_s']:.2f} s / {startup['b_s']:.2f} s (medians of {startup['runs']} pairs; CPU "
               f"{startup['cpu_a_s']:.2f} / {startup['cpu_b_s']:.2f} s = {startup['cpu_ratio']:.2f}x)",
               startup["ratio"], "<= 1.2x", startup["ratio"] <= 1.2,
               f"over torch's import ({parts['import_torch_s']:.2f} s): hydra's import {parts['import_hydra_s']:.2f} s, "
               f"one compose {parts['compose_s']:.2f} s, then the job"),
        target("MLflow on a single run: over tracking=none", f"+{mlflow_cost['diff_s']:.2f} s "
               f"({mlflow_cost['a_s']:.2f} vs {mlflow_cost['b_s']:.2f} s; CPU +{mlflow_cost['cpu_diff_s']:.2f} s; "
               f"first run on a new store {m['first_s']:.2f} s)",
               mlflow_cost["diff_s"], "<= 1.5 s", mlflow_cost["diff_s"] <= 1.5,
               f"import mlflow alone {parts['import_mlflow_s']:.2f} s (after torch and hydra), then the store and the logging"),
        target(f"batch {rows_n}: fastest torch fp32 / onnxruntime", f"{best32} {rate(m32, best32):,.0f} vs "
               f"{ort_t:,.0f} obs/s", rate(m32, best32) / ort_t, ">= 1.0x", rate(m32, best32) / ort_t >= 1.0,
               f"torch's GEMMs alone (4 addmm, nothing between): {gemms:,.0f} obs/s = {gemms / ort_t:.2f}x onnxruntime"),
        target(f"batch {rows_n}: fastest torch fp32 / GEMM peak", f"{gflops(rate(m32, best32)):.1f} GFLOP/s vs peak "
               f"{peak:.1f} at [{rows_n},512]x[512,512] ({m['square']:.1f} at 1024x1024)",
               gflops(rate(m32, best32)) / peak, ">= 0.85", gflops(rate(m32, best32)) / peak >= 0.85,
               f"the GEMMs alone reach {gflops(gemms) / peak:.0%} of that peak; the rest is elementwise work and drift"),
        target(f"batch {rows_n}: fastest torch bf16 / onnxruntime fp32", f"{best16} {rate(m16, best16):,.0f} obs/s",
               rate(m16, best16) / ort_t, ">= 1.7x" if has_bf16 else "n/a",
               (rate(m16, best16) / ort_t >= 1.7) if has_bf16 else None,
               f"CPU flags {', '.join(has_bf16)}" if has_bf16 else
               f"n/a: no bf16 dot products on this CPU (none of {', '.join(BF16_FLAGS)} in /proc/cpuinfo; bf16 is converted to fp32 per op)"),
        target("harness onnxruntime b1 p50 vs a bare loop", f"{m['harness_us']:.1f} vs {m['bare_us']:.1f} µs",
               m["harness_us"] / m["bare_us"], "within 5%", abs(m["harness_us"] / m["bare_us"] - 1) <= 0.05, ""),
    ]


def report(header: str, rows: list[dict], m: dict, rounds: int, started: float) -> str:
    """The markdown: the targets, the batch-1 attempts, and the one-off figures."""
    m32, m16, tried = m["m32"], m["m16"], m["tried"]
    noisy = [k.rsplit("/", 1)[0] for k, v in {**m32, **m16}.items() if k.endswith("/noisy") and v]
    ort_here = tried["onnxruntime (reference)"]["p50_us"]
    lines = [f"_{header}_", "", "| target | measured | ratio | goal | verdict | cause |", "| --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['target']} | {row['measured']} | {row['ratio']:.2f} | {row['goal']} | {row['verdict']} | {row['cause']} |")
    lines += ["", f"Batch-1 attempts ({rounds} interleaved rounds, median p50; ratio to onnxruntime in the same loop):", "",
              "| attempt | p50 µs | / onnxruntime | max abs vs eager |", "| --- | --- | --- | --- |"]
    for name, row in tried.items():
        timed = (f"{row['p50_us']:.1f} | {row['p50_us'] / ort_here:.2f}x" if row["ok"] else
                 f"{row.get('unavailable') or 'not timed: disagrees with eager'} | -")
        lines.append(f"| {name} | {timed} | {row['max_abs_vs_eager']:.1e} |")
    lines += ["", f"compile first call (b1, compilation) {m32.get('compile/cold_start_ms', float('nan')):,.0f} ms; "
              f"fused load (build or cache) {m32.get('fused/load_s', float('nan')):.1f} s; peak RSS "
              f"{max(m32['peak_mem_mb'], m16['peak_mem_mb']):,.0f} MB; noisy points (IQR/median > 0.1): "
              f"{', '.join(noisy) or 'none'}; whole run {time.time() - started:.0f} s"]
    return "\n".join(lines)


def target(name: str, measured: str, ratio: float, goal: str, met: bool | None, cause: str) -> dict:
    verdict = "n/a" if met is None else ("met" if met else "missed")
    return {"target": name, "measured": measured, "ratio": float(ratio), "goal": goal, "verdict": verdict, "cause": cause}


if __name__ == "__main__":
    main()
