"""Measure issue #6's targets in one run and print a table: `python benchmarks/bench.py [--model file.pt] [--rows 1024]`.

Everything runs in this process with 1 thread (the project's timing default) except the start-up comparison, which
starts fresh interpreters. The backend figures come from the `benchmark` mode's own task (the harness), so the
table quotes what `python run.py mode=benchmark` measures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_exp import timing  # noqa: E402
from huggy_exp.context import Context, ModelSpec  # noqa: E402
from huggy_exp.runners import OBS, build  # noqa: E402
from huggy_exp.tasks.benchmark import BenchmarkTask  # noqa: E402

HUGGY = REPO.parent / "shared" / "fixtures" / "mlagents" / "huggy" / "Huggy" / "Huggy-2000049.pt"


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


def startup_s(args: list[str], runs: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            cmd = [a.replace("{tmp}", f"{tmp}/{i}") for a in args]
            start = time.perf_counter()
            subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=str(HUGGY) if HUGGY.is_file() else None, help="ML-Agents .pt (.onnx beside it)")
    parser.add_argument("--rows", type=int, default=1024, help="offline batch size (>= 512)")
    parser.add_argument("--budget", type=float, default=2.0, help="timed seconds per (backend, batch)")
    parser.add_argument("--startup-runs", type=int, default=5)
    a = parser.parse_args()
    started = time.time()
    ctx = Context(model_spec=ModelSpec(checkpoint=a.model), workdir=Path(tempfile.mkdtemp()), threads=1)
    flop = flops_per_obs(ctx)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {platform.processor() or platform.machine()} · "
          f"{os.cpu_count()} cores · torch {torch.__version__} · model {a.model or 'embedded synthetic default'} · "
          f"{flop / 1e6:.2f} MFLOP/obs · 1 thread", flush=True)

    knobs = dict(rounds=3, budget_s=a.budget, warmup_s=0.5, settle_s=0.05)
    fp32 = BenchmarkTask(["eager", "compile", "onnxruntime"], [a.rows], **knobs).run(ctx)
    bf16_ctx = Context(model_spec=ctx.model_spec, dtype="bf16", workdir=ctx.workdir, threads=1)
    bf16 = BenchmarkTask(["eager", "compile"], [a.rows], ["offline"], **knobs).run(bf16_ctx)
    m32, m16 = fp32.metrics, bf16.metrics
    for r in (fp32, bf16):
        print("\n".join("  " + line for line in r.summary), flush=True)

    # --- harness vs a bare loop on the same onnxruntime session, interleaved
    ort = build(ctx, "onnxruntime", batch_size=1, threads=1)
    feeds = {OBS: ctx.make_observations(1)}
    harness, bare = [], []
    for _ in range(3):
        harness.append(timing.measure(lambda: ort.infer(feeds), torch.device("cpu"), 1, a.budget / 2, 0.3).stats()["p50_us"])
        bare.append(bare_loop_us(ort.session, {ort.input: feeds[OBS]}, a.budget / 2))
    harness_us, bare_us = statistics.median(harness), statistics.median(bare)

    with timing.threads(1):
        peak = gemm_gflops(a.rows, 512, 512)  # the policy's hidden layer shape: the peak its GEMMs can reach
        square = gemm_gflops(a.rows, 1024, 1024)
    cold_import = startup_s([sys.executable, "-c", "import torch"], a.startup_runs)
    cold_run = startup_s([sys.executable, "run.py", "mode=action", "tracking=none", "hydra.run.dir={tmp}"], a.startup_runs)

    # --- the table
    ort1, eager1, comp1 = (m32.get(f"{b}/b1/p50_us", float("nan")) for b in ("onnxruntime", "eager", "compile"))
    best1 = min(eager1, comp1)
    rate = lambda m, b: m.get(f"{b}/b{a.rows}/obs_per_s", float("nan"))  # noqa: E731
    ort_t, best32 = rate(m32, "onnxruntime"), max(rate(m32, "eager"), rate(m32, "compile"))
    best16 = max(rate(m16, "eager"), rate(m16, "compile"))
    gflops = lambda obs_s: obs_s * flop / 1e9  # noqa: E731
    rows = [
        ("onnxruntime b1 p50 (1 thread)", f"{ort1:.1f} µs", "reference", None),
        ("eager b1 p50", f"{eager1:.1f} µs = {eager1 / ort1:.2f}x ort", "", None),
        ("compile (freezing) b1 p50", f"{comp1:.1f} µs = {comp1 / ort1:.2f}x ort", "", None),
        ("fastest torch b1 p50 / ort", f"{best1 / ort1:.2f}x", "<= 1.2x (stretch 1.0x)", best1 / ort1 <= 1.2),
        (f"onnxruntime b{a.rows} fp32", f"{ort_t:,.0f} obs/s = {gflops(ort_t):.1f} GFLOP/s", "reference", None),
        (f"eager b{a.rows} fp32", f"{rate(m32, 'eager'):,.0f} obs/s", "", None),
        (f"compile b{a.rows} fp32", f"{rate(m32, 'compile'):,.0f} obs/s", "", None),
        ("measured fp32 GEMM peak (1 thread)", f"{peak:.1f} GFLOP/s at [{a.rows},512]x[512,512] ({square:.1f} at 1024x1024)", "", None),
        (f"fastest torch b{a.rows} fp32 / ort", f"{best32 / ort_t:.2f}x", ">= 1.0x", best32 / ort_t >= 1.0),
        (f"fastest torch b{a.rows} fp32 / GEMM peak", f"{gflops(best32) / peak:.0%}", ">= 85%", gflops(best32) / peak >= 0.85),
        (f"fastest torch b{a.rows} bf16 / ort fp32", f"{best16 / ort_t:.2f}x ({best16:,.0f} obs/s)", ">= 1.7x", best16 / ort_t >= 1.7),
        ("harness ort b1 p50 vs bare loop", f"{harness_us:.1f} vs {bare_us:.1f} µs = {harness_us / bare_us - 1:+.1%}", "within 5%",
         abs(harness_us / bare_us - 1) <= 0.05),
        ("run.py mode=action tracking=none / import torch", f"{cold_run:.2f} s / {cold_import:.2f} s = {cold_run / cold_import:.2f}x",
         "<= 1.2x", cold_run / cold_import <= 1.2),
        ("compile first call (b1, compilation)", f"{m32.get('compile/cold_start_ms', float('nan')):,.0f} ms", "", None),
        ("peak memory (process RSS)", f"{max(m32['peak_mem_mb'], m16['peak_mem_mb']):,.0f} MB", "", None),
    ]
    noisy = [k.rsplit("/", 1)[0] for k, v in {**m32, **m16}.items() if k.endswith("/noisy") and v]
    print("\n| quantity | measured | target | met |\n| --- | --- | --- | --- |")
    for name, value, target, met in rows:
        print(f"| {name} | {value} | {target} | {'' if met is None else ('yes' if met else 'NO')} |")
    print(f"\nnoisy points (IQR/median > 0.1): {', '.join(noisy) or 'none'}; whole run {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
