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
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_exp import environment, timing  # noqa: E402
from huggy_exp.config import BACKENDS, GRAPH_BACKENDS, MAX_BATCH, REFERENCE_BACKEND, _check_value  # noqa: E402
from huggy_exp.context import Context  # noqa: E402
from huggy_exp.errors import UserError  # noqa: E402
from huggy_exp.files import atomic_write_text, claim_output  # noqa: E402
from huggy_exp.memory import check_job_memory, require_memory  # noqa: E402
from huggy_exp.runners import ACTIONS, OBS, build  # noqa: E402
from huggy_exp.tasks.benchmark import BenchmarkTask  # noqa: E402

HUGGY = REPO.parent / "shared" / "fixtures" / "mlagents" / "huggy" / "Huggy" / "Huggy-2000049.pt"
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ORT, EAGER = "onnxruntime (reference)", "eager backend: addmv chain (MKL gemv)"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
FLAGS = {"--rows": (int, {"lo": 512, "hi": MAX_BATCH}), "--budget": (float, {"lo": 0, "hi": 3600, "lo_open": True}),
         "--rounds": (int, {"lo": 1, "hi": 1000}), "--startup-runs": (int, {"lo": 1, "hi": 1000})}  # config.py's rules


def cpu_backends(dtype: str, torch_only: bool = False) -> list[str]:
    """The backends config.BACKENDS declares for `dtype` on the CPU (Backend.refusal; `torch_only`: not a graph's)."""
    return [n for n, b in BACKENDS.items() if not b.refusal(dtype, "cpu") and not (torch_only and n in GRAPH_BACKENDS)]


def knobs(a: argparse.Namespace, dtype: str, scenarios: str) -> list[str]:
    """mode=benchmark's keys for `dtype` at the flags: every backend the CPU runs it with, one rung of --rows."""
    return [f"mode.backends=[{','.join(cpu_backends(dtype))}]", f"mode.batch_sizes=[{a.rows}]", "mode.rounds=3",
            f"mode.scenarios=[{scenarios}]", f"mode.budget_s={a.budget}", "mode.warmup_s=0.5", "mode.settle_s=0.05"]


def context(model: str | None, dtype: str, workdir: Path, knobs: list[str] = ()):
    """A job's context as run.py builds it from conf/ (its limits included: a dtype without one cannot be judged), at
    one thread; with `knobs` (mode=benchmark's keys): (the context, the composed config)."""
    from hydra import compose, initialize_config_dir

    from huggy_exp.app import build_context
    from huggy_exp.preflight import setup

    setup()
    overrides = [f"dtype={dtype}", "threads=1", "tracking=none"] + ([f"model.checkpoint={model}"] if model else [])
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides + (["mode=benchmark", *knobs] if knobs else []))
        ctx = build_context(cfg, workdir)
        ctx.weights  # the model read now: a missing or broken file is one line before anything is measured
        return (ctx, cfg) if knobs else ctx


def checked_context(a: argparse.Namespace, workdir: Path):
    """The fp32 context and its config, once every flag is in range (config.py's rules) and what --rows sizes fits in
    memory (memory.py's estimate of the benchmark job, plus the GEMM peak's matrices): else a UserError naming it."""
    from omegaconf import OmegaConf

    for flag, (kind, rule) in FLAGS.items():
        _check_value(kind, getattr(a, flag[2:].replace("-", "_")), flag, rule)
    for flag in ("--markdown", "--json"):  # never replaced, never the tool's own file: refused now, not after minutes
        if getattr(a, flag[2:]) is not None:
            claim_output(getattr(a, flag[2:]), False, [], flag)
    ctx, cfg = context(a.model, "fp32", workdir, knobs(a, "fp32", "single_stream,offline"))
    try:
        check_job_memory("benchmark", OmegaConf.to_container(cfg, resolve=True), ctx.weights)
        require_memory(a.rows * 1024 * 4 * 3, "the GEMM peak's [rows, 1024] matrices", f"--rows={a.rows}")
    except UserError as exc:
        raise UserError(str(exc).replace(f"mode.batch_sizes=[{a.rows}]", f"--rows={a.rows}")
                        .replace("mode.batch_sizes", "--rows")) from None
    return ctx, cfg


def p50_us(fn: Callable[[], object], budget_s: float, warmup_s: float) -> float:
    """timing.measure's p50 of one call of fn on the CPU, in µs."""
    return timing.measure(fn, torch.device("cpu"), 1, budget_s, warmup_s).stats()["p50_us"]


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, rotate: bool = True) -> dict[str, list]:
    """`rounds` rounds that call each fn once, the order rotated each round (unless not `rotate`): each one's values, so
    that a machine whose speed drifts moves every side alike."""
    got: dict[str, list] = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        turn = r % len(names) if rotate else 0
        for name in names[turn:] + names[:turn]:
            got[name].append(fns[name]())
    return got


def gemm_gflops(rows: int, k: int, n: int, seconds: float = 1.5) -> float:
    """fp32 torch.mm rate (GFLOP/s, p50) at [rows, k] @ [k, n] on the current thread count."""
    a, b = torch.randn(rows, k), torch.randn(k, n)
    return 2 * rows * k * n / p50_us(lambda: torch.mm(a, b), seconds, 0.3) / 1e3


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
    policy = build(ctx, REFERENCE_BACKEND).policy
    xs = [torch.randn(rows, w.shape[1]) for w, _ in policy._gemv]
    return rows * 1e6 / p50_us(lambda: [torch.addmm(b, x, w.t()) for (w, b), x in zip(policy._gemv, xs)], seconds, 0.3)


# --- batch 1: every way torch was tried, against onnxruntime, in one interleaved loop


def _chain(mean, std, linears: list[Callable], act: Callable) -> Callable:
    """Huggy's forward on obs with its linears (mu last) spelled by the caller: normalize, act(linear), mu squashed."""

    def forward(o):
        x = torch.clamp((torch.from_numpy(o) - mean) / std, -5, 5)
        for linear in linears[:-1]:
            x = act(linear(x))
        return (torch.clamp(linears[-1](x), -3, 3) / 3).numpy()

    return forward


def _on_numpy(fn: Callable) -> Callable:
    return lambda o: fn(torch.from_numpy(o)).numpy()


def _onednn_linear(w, b, attr: str) -> Callable:
    packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, attr, [], "")


def _mkl_linear(w, b) -> Callable:
    packed = torch.ops.mkl._mkl_reorder_linear_weight(w, 1)
    return lambda x: torch.ops.mkl._mkl_linear(x, packed, w, b, 1)


def _by_hand(mean, std, layers, module) -> dict[str, Callable]:
    """Huggy's forward written out by hand (`layers`: each linear's weight and bias, mu last): nn.Linear calls, out=
    buffers, oneDNN and MKL packed weights, numpy."""
    out: dict[str, Callable] = {"eager addmm (nn.Linear chain)": _on_numpy(module)}
    width = max(w.shape[0] for w, _ in layers)
    n0, h, s, mu = torch.empty(mean.shape), torch.empty(2, width), torch.empty(width), torch.empty(layers[-1][1].shape)

    def preallocated(o):  # every op with out= or in place: no allocation in the call
        torch.sub(torch.from_numpy(o[0]), mean, out=n0)
        x = n0.div_(std).clamp_(-5, 5)
        for i, (w, b) in enumerate(layers[:-1]):
            y = h[i % 2, : w.shape[0]]
            torch.addmv(b, w, x, out=y)
            torch.sigmoid(y, out=s[: w.shape[0]])
            x = y.mul_(s[: w.shape[0]])
        torch.addmv(layers[-1][1], layers[-1][0], x, out=mu)
        return mu.clamp_(-3, 3).div_(3).numpy()[None].copy()

    out["addmv + out= buffers, in place"] = preallocated
    # oneDNN's prepacked linear with SiLU fused (what inductor uses for bf16)
    onednn = [_onednn_linear(w, b, "swish" if i < len(layers) - 1 else "none") for i, (w, b) in enumerate(layers)]
    out["oneDNN packed linear + fused swish"] = _chain(mean, std, onednn, act=lambda x: x)
    if torch._C.has_mkl:  # MKL's packed sgemm (what inductor freezing uses for fp32 linears)
        out["MKL packed sgemm + silu"] = _chain(mean, std, [_mkl_linear(w, b) for w, b in layers], F.silu)
    np_layers, np_mean, np_std = [(w.numpy(), b.numpy()) for w, b in layers], mean.numpy(), std.numpy()

    def numpy_forward(o):  # not torch: numpy's OpenBLAS sgemv, for scale
        x = np.clip((o[0] - np_mean) / np_std, -5, 5)
        for w, b in np_layers[:-1]:
            x = w @ x + b
            x = x / (1 + np.exp(-x))
        return (np.clip(np_layers[-1][0] @ x + np_layers[-1][1], -3, 3) / 3)[None]

    out["numpy (OpenBLAS sgemv; not torch)"] = numpy_forward
    return out


def attempts(ctx: Context, everything: bool) -> dict[str, Callable[[np.ndarray], np.ndarray] | str]:
    """name -> f(obs [1, d] float32) -> actions [1, act], each Huggy's forward spelled another way (or why it cannot run)."""
    runners = {name: build(ctx, name, batch_size=1, threads=1) for name in ("onnxruntime", REFERENCE_BACKEND, "fused")}
    policy = runners[REFERENCE_BACKEND].policy
    mean, std, layers = policy.normalizers[0].running_mean, policy.normalizers[0].std, policy._gemv
    backend = lambda name: lambda o: runners[name].infer({OBS: o})[ACTIONS]  # noqa: E731
    example = torch.from_numpy(ctx.make_feeds(1)[OBS])
    with torch.inference_mode(False), torch.no_grad():
        module = _Forward(mean, std, layers).eval().requires_grad_(False)
        traced = torch.jit.freeze(torch.jit.trace(module, example).eval())
        optimized = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(module, example).eval()))
    out = {ORT: backend("onnxruntime"), EAGER: backend(REFERENCE_BACKEND), **_by_hand(mean, std, layers, module)}
    out["torch.jit.trace + freeze"] = _on_numpy(traced)
    out["jit.trace + freeze + optimize_for_inference"] = _on_numpy(optimized)
    out["torch.jit.script + freeze, NNC fuser on (SiLU fused)"] = _scripted(module, example)
    if everything:
        out.update(_slow_attempts(module, example))
    out["fused backend: one C++ kernel (inductor toolchain)"] = backend("fused")
    return out


class _Forward(torch.nn.Module):
    """Huggy's forward as nn.Linear modules: what torch.jit.trace, torch.jit.script and torch.export take."""

    def __init__(self, mean, std, layers):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())
        self.linears = torch.nn.ModuleList()
        for w, b in layers:
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


def _scripted(module: _Forward, example) -> Callable | str:
    """TorchScript with the CPU fuser (NNC) allowed: it fuses the elementwise ops around each linear."""
    before = torch._C._jit_can_fuse_on_cpu()
    torch._C._jit_override_can_fuse_on_cpu(True)
    try:
        with torch.inference_mode(False), torch.no_grad():
            scripted = torch.jit.freeze(torch.jit.script(module))
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


def _tried(make: Callable[[], Callable]) -> Callable | str:
    """make()'s attempt, or why it cannot run: an attempt that cannot run is reported, not fatal."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001
        return f"not available: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def _slow_attempts(module: _Forward, example) -> dict[str, Callable | str]:
    """Minutes of compilation: inductor's C++ GEMM template (max-autotune) and AOTInductor (no Python wrapper)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True

    def template():
        with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="CPP"):
            torch._dynamo.reset()
            templ = torch.compile(module, dynamic=False)
            with torch.no_grad():
                templ(example)
        return _on_numpy(templ)

    def aoti():
        with torch.no_grad():
            exported = torch.export.export(module, (example,))
            path = torch._inductor.aoti_compile_and_package(exported, package_path=tempfile.mktemp(suffix=".pt2"))
        return _on_numpy(torch._inductor.aoti_load_package(path))

    return {"inductor C++ GEMM template (max-autotune)": _tried(template),
            "AOTInductor (aoti_compile_and_package)": _tried(aoti)}


def time_attempts(ctx: Context, fns: dict[str, Callable | str], rounds: int, budget_s: float) -> dict[str, dict]:
    """Each checked against eager, then p50s over `rounds` interleaved rounds (order rotated); the median round."""
    obs = ctx.make_feeds(1)[OBS]
    want = fns[EAGER](obs)
    rows = {}
    for name, fn in fns.items():
        if isinstance(fn, str):
            rows[name] = {"max_abs_vs_eager": float("nan"), "ok": False, "unavailable": fn}
        else:
            diff = float(np.max(np.abs(np.asarray(fn(obs), np.float32) - want)))
            rows[name] = {"max_abs_vs_eager": diff, "ok": diff <= 1e-5}

    def timed(fn: Callable) -> float:
        p50 = p50_us(lambda: fn(obs), budget_s, 0.1)
        time.sleep(0.02)
        return p50

    with torch.inference_mode(), timing.threads(1):
        got = interleaved({name: partial(timed, fns[name]) for name in fns if rows[name]["ok"]}, rounds)
    for name, row in rows.items():
        row["p50s"] = got.get(name, [])
        row["p50_us"] = statistics.median(row["p50s"]) if row["p50s"] else float("nan")
    return rows


# --- whole processes: A B A B pairs

PARTS = ("import_torch_s", "import_hydra_s", "compose_s", "import_mlflow_s")  # what BREAKDOWN times, in its order
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
print(json.dumps([b - a for a, b in zip(t, t[1:])]))
"""


def breakdown(runs: int = 3) -> dict[str, float]:
    """Medians over fresh interpreters of what a single run pays: torch, hydra, one compose, mlflow."""
    got = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", BREAKDOWN, str(REPO / "conf")], cwd=REPO, env=ENV, capture_output=True,
                              text=True)
        if proc.returncode:
            print(f"breakdown failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            return dict.fromkeys(PARTS, float("nan"))
        got.append(json.loads(proc.stdout))
    return {part: statistics.median(times) for part, times in zip(PARTS, zip(*got))}


def run_s(cmd: list[str], tmp: str) -> tuple[float, float]:
    """One fresh process (`{tmp}` in cmd: a new folder under tmp): its wall seconds, and its CPU seconds (the child's
    and every process it reaped)."""
    here, start, used = tempfile.mkdtemp(dir=tmp), time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([c.replace("{tmp}", here) for c in cmd], cwd=REPO, env=ENV, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - start, now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime


def paired(a: list[str], b: list[str], runs: int) -> dict[str, float]:
    """Fresh interpreters A and B in turn; medians of each side, of the per-pair ratio and of the difference (s)."""
    with tempfile.TemporaryDirectory() as tmp:
        got = interleaved({"a": partial(run_s, a, tmp), "b": partial(run_s, b, tmp)}, runs + 1, rotate=False)
    (ta, ca), (tb, cb) = (zip(*got[side][1:]) for side in "ab")  # the first pair warms the page cache and is dropped
    med = statistics.median
    return {"a_s": med(ta), "b_s": med(tb), "ratio": med(x / y for x, y in zip(ta, tb)),
            "diff_s": med(x - y for x, y in zip(ta, tb)), "runs": runs, "cpu_a_s": med(ca), "cpu_b_s": med(cb),
            "cpu_ratio": med(x / y for x, y in zip(ca, cb)), "cpu_diff_s": med(x - y for x, y in zip(ca, cb))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(HUGGY) if HUGGY.is_file() else None, help="ML-Agents .pt (.onnx beside it)")
    parser.add_argument("--rows", type=int, default=1024, help="offline batch size (>= 512)")
    parser.add_argument("--budget", type=float, default=2.0, help="timed seconds per (backend, batch)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the batch-1 attempts")
    parser.add_argument("--startup-runs", type=int, default=7, help="A B pairs per whole-process comparison")
    parser.add_argument("--all-attempts", action="store_true", help="also inductor's GEMM template and AOTInductor (minutes)")
    parser.add_argument("--markdown", type=Path, help="write the table (and the attempts) as markdown here")
    parser.add_argument("--json", type=Path, help="write every figure as JSON here")
    parser.error = refuse  # argparse would print its usage: one line, exit 2, as run.py
    a = parser.parse_args()
    started = time.time()
    try:
        ctx, cfg = checked_context(a, Path(tempfile.mkdtemp()))
    except UserError as exc:
        refuse(str(exc))
    flop = 2.0 * sum(weight.size for weight, _ in [*ctx.weights.layers, ctx.weights.mu])
    cpu = environment.cpu()
    flags = set(cpu["flags"].split())
    header = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {cpu['model']} · {os.cpu_count()} cores "
              f"({', '.join(f for f in ('avx2', 'fma', 'avx512f', *BF16_FLAGS) if f in flags) or 'no avx flags read'}) · "
              f"torch {torch.__version__} · model {a.model or 'embedded synthetic default'} · {flop / 1e6:.2f} MFLOP/obs · 1 thread")
    print(f"# {header}", flush=True)
    m = {**measure_backends(ctx, cfg, a), **measure_processes(a.startup_runs)}
    rows = targets(m, a.rows, flop, flags)
    text = report(header, rows, m, a.rounds, started)
    print("\n" + text)
    if a.markdown:
        atomic_write_text(a.markdown, text + "\n", overwrite=False)
    if a.json:
        figures = {"header": header, "targets": rows, "attempts": m["tried"], "startup": m["startup"],
                   "mlflow": {**m["mlflow_cost"], "first_run_s": m["first_s"]}, "breakdown": m["parts"],
                   "gemm_peak_gflops": m["peak"], "gemms_only_obs_s": m["gemms"], "gemm_square_gflops": m["square"],
                   "fp32": m["m32"], "bf16": m["m16"]}
        atomic_write_text(a.json, json.dumps(figures, indent=2, default=float), overwrite=False)


def refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def measure_backends(ctx: Context, cfg, a: argparse.Namespace) -> dict:
    """In this process: the backends as run.py mode=benchmark measures them, every batch-1 attempt, the harness against
    a bare loop, the GEMM peak."""
    from omegaconf import OmegaConf

    fp32 = BenchmarkTask(OmegaConf.to_object(cfg.mode)).run(ctx)
    bf16_ctx, bf16_cfg = context(ctx.model_spec.checkpoint, "bf16", ctx.workdir, knobs(a, "bf16", "offline"))
    bf16 = BenchmarkTask(OmegaConf.to_object(bf16_cfg.mode)).run(bf16_ctx)
    for r in (fp32, bf16):
        print("\n".join("  " + line for line in r.summary), flush=True)
    tried = time_attempts(ctx, attempts(ctx, a.all_attempts), a.rounds, a.budget / a.rounds)
    ort = build(ctx, "onnxruntime", batch_size=1, threads=1)  # harness vs a bare loop on one session, interleaved
    feeds = {OBS: ctx.make_feeds(1)[OBS]}
    loops = interleaved({"harness": lambda: p50_us(lambda: ort.infer(feeds), a.budget / 2, 0.3),
                         "bare": lambda: bare_loop_us(ort.session, {ort.input: feeds[OBS]}, a.budget / 2)}, 3, rotate=False)
    with timing.threads(1):
        peak = gemm_gflops(a.rows, 512, 512)  # the policy's hidden layer shape: the peak its GEMMs can reach
        square = gemm_gflops(a.rows, 1024, 1024)
        gemms = gemms_only_obs_s(ctx, a.rows)
    return {"m32": fp32.metrics, "m16": bf16.metrics, "tried": tried, "harness_us": statistics.median(loops["harness"]),
            "bare_us": statistics.median(loops["bare"]), "peak": peak, "square": square, "gemms": gemms}


def measure_processes(startup_runs: int = 7) -> dict:
    """Whole processes: run.py's start-up over `import torch`, MLflow's cost on a single run, the import breakdown."""
    run = [sys.executable, "run.py", "mode=action", "hydra.run.dir={tmp}"]
    startup = paired([*run, "tracking=none"], [sys.executable, "-c", "import torch"], startup_runs)
    with tempfile.TemporaryDirectory() as store:
        uri = f"tracking.uri=sqlite:///{store}/mlflow.db"
        first_s, _ = run_s([*run, uri], store)
        mlflow_cost = paired([*run, uri], [*run, "tracking=none"], startup_runs)
    return {"startup": startup, "first_s": first_s, "mlflow_cost": mlflow_cost, "parts": breakdown()}


def targets(m: dict, rows_n: int, flop: float, flags: set) -> list[dict]:
    """The table's rows: each target with its measurement, ratio, goal, verdict and cause."""
    m32, m16, startup, mlflow_cost, parts = m["m32"], m["m16"], m["startup"], m["mlflow_cost"], m["parts"]
    p50 = lambda b: m32.get(f"{b}/b1/p50_us", float("nan"))  # noqa: E731
    ort1 = p50("onnxruntime")
    best1 = min(cpu_backends("fp32", True), key=lambda b: np.nan_to_num(p50(b), nan=np.inf))
    rate = lambda m, b: m.get(f"{b}/b{rows_n}/obs_per_s", float("nan"))  # noqa: E731
    ort_t = rate(m32, "onnxruntime")
    best32 = max(cpu_backends("fp32", True), key=lambda b: np.nan_to_num(rate(m32, b)))
    best16 = max(cpu_backends("bf16", True), key=lambda b: np.nan_to_num(rate(m16, b)))
    gflops = lambda obs_s: obs_s * flop / 1e9  # noqa: E731
    has_bf16 = sorted(flags & set(BF16_FLAGS))
    eager_us = m["tried"][EAGER]["p50_us"]
    ratio1, peak, gemms = p50(best1) / ort1, m["peak"], m["gemms"]
    return [
        target("batch 1: fastest torch / onnxruntime (1 thread)", f"{best1} {p50(best1):.1f} µs vs onnxruntime {ort1:.1f} µs",
               ratio1, "<= 1.2x", ratio1 <= 1.2,
               f"eager spends its time in MKL's sgemv ({eager_us:.0f} µs here); the fastest is {best1}: "
               f"{BACKENDS[best1].help}" if np.isfinite(p50(best1)) else "see the attempts below"),
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
    ort_here = tried[ORT]["p50_us"]
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
