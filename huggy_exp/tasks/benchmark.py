"""`benchmark`: latency and throughput of each backend, gated against eager first.
Described in docs/modes.md#benchmark."""

from __future__ import annotations

import time

import numpy as np

from huggy_exp import energy, loadgen, plots, timing
from huggy_exp.config import P50_RATIO, REFERENCE_BACKEND, BenchmarkMode, cpu_note, ran_dtype
from huggy_exp.context import Context
from huggy_exp.errors import Unsupported, UserError, first_line
from huggy_exp.mlagents import ACTION_MASKS, RECURRENT_IN, RECURRENT_OUT, PolicyWeights, obs_name
from huggy_exp.placement import peak_memory, reset_peak_memory, synchronize
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, TorchRunner, build
from huggy_exp.tasks import LATENCY_KEYS, Task, batch_of, is_sequence, verify_point
from huggy_exp.tasks import scenarios as extra
from huggy_exp.tasks.compare import compare_outputs
from huggy_exp.verify import REL_FLOOR

POINT_STATS = ("p50_us", "p90_us", "p95_us", "p99_us", "mean_us", "min_us", "max_us", "iqr_us", "obs_per_s", "noisy", "samples")
SERIES_STATS = ("p50_us", "p99_us", "obs_per_s")
VERSUS = REFERENCE_BACKEND  # the gate's metrics: <output>/vs_eager/<metric>, as the engine names them


class BenchmarkTask(Task):
    mode: BenchmarkMode

    def points(self, ctx: Context) -> list[int]:
        """Batch sizes timed per point (timing.py): the ladder (default: batch_size), and 1 for single_stream (and for
        server: its fastest single call tells a latency bound that no rate can meet)."""
        ladder = self.mode.batch_sizes or [ctx.batch_size]
        return sorted({*([1] if {"single_stream", "server"} & set(self.mode.scenarios) else []), *ladder})

    def sut(self, ctx: Context) -> list[str]:
        """The backends to build and time: mode.backends, and the job's backend when a scenario runs on it."""
        scenario = set(self.mode.scenarios) & set(extra.NAMES)  # eager, the gate, is always built
        return list(dict.fromkeys([*(self.mode.backends or [VERSUS]), *([ctx.backend] if scenario else [])]))

    def run(self, ctx: Context) -> Result:
        target, w, result = ctx.target(), ctx.weights, Result()
        points, capped, slow = self.fp16_cap(ctx, target, result)
        feeds, timed_as = self.feeds(ctx, points)
        chunk = min(max(points), self.mode.chunk_rows)
        timed_backends = self.sut(ctx)
        with timing.threads(ctx.threads) as threads:
            backends, runners = self.build_gated(ctx, timed_backends, feeds, points, chunk, result)
            timed = [b for b in timed_backends if b in runners]
            timings = self.time_backends(runners, timed, feeds, points, threads, slow, backends)
            self.energy_of(ctx, runners, timed, feeds, job_batch(points, ctx.batch_size), backends, result)
            self.scenarios_on(ctx, runners, timings, feeds, points, result)
        # --- metrics, series, table
        result.tables["benchmark"] = self.tabulate(result, backends, timings, timed_backends, points, capped)
        peak, source = peak_memory(target.device)
        per_backend = [info["peak_mem_mb"] for info in backends.values() if "peak_mem_mb" in info]
        result.metrics["peak_mem_mb"] = max(per_backend) if per_backend else peak
        result.metrics["threads"] = float(threads)
        result.summary.append(f"policy: {w.describe_shape()}; {timed_as}")
        result.details.update({"shape": w.describe_shape(), "feeds": timed_as, "points": points, "chunk_rows": chunk,
                               "scenarios": self.mode.scenarios, "threads": threads, "backends": backends,
                               "peak_mem_source": source + (", per backend" if per_backend else "")})
        if not timed:
            result.status = "skipped" if result.status == "passed" else result.status
            result.reason = result.reason or "; ".join(f"{n}: {backends[n]['reason']}" for n in timed_backends)
        elif ctx.plots:
            curves = {n: {k: result.series[f"{n}/{k}"] for k in SERIES_STATS} for n in timed}
            result.files.append(plots.versus_batch(ctx.workdir / "benchmark.png", curves,
                                                   f"{ctx.device} {ctx.dtype}, {threads} thread(s)"))
        result.summary[:0] = _summary(result, backends, points, timed_backends, ctx.batch_size)
        if VERSUS in runners:
            self.judge_point(ctx, result, runners[VERSUS], timings, feeds, points)
        return result

    def fp16_cap(self, ctx: Context, target, result: Result) -> tuple[list[int], list[int], bool]:
        """The batch points to time, those skipped, and whether a dtype the CPU emulates (fp16: slow) caps them."""
        points, capped = self.points(ctx), []
        note = cpu_note(ctx.dtype, target.kind)
        if note:
            top = self.mode.fp16_cpu_max_rows
            capped, points = [b for b in points if b > top], [b for b in points if b <= top] or [1]
            result.summary.append(f"{note}; points above {top} rows skipped ({capped or 'none'}), "
                                  f"at most {self.mode.fp16_cpu_samples} timed calls per point and round")
            result.details["fp16_cpu_note"] = note
        return points, capped, bool(note)

    def build_gated(self, ctx: Context, timed_backends: list[str], feeds: dict, points: list[int], chunk: int,
                    result: Result) -> tuple[dict[str, dict], dict]:
        """Build each backend (eager first), call it once per shape (compilation included) and gate it against eager:
        each backend's info, and the runners that passed (only those are timed)."""
        backends, runners, expected, margins = {}, {}, {}, {}
        for name in dict.fromkeys([VERSUS, *timed_backends]):  # the dtype it really runs: onnxruntime's fp32 graph
            info = backends[name] = {"status": "passed", "reason": "", "dtype": ran_dtype(name, ctx.dtype)}
            try:
                reset_peak_memory(ctx.target().device)  # each backend's peak alone: its build, capture, first calls
                runner, gate = self.first_calls(ctx, name, info, feeds, points, chunk, expected, margins)
                _note_peak(info, runner)
            except (Unsupported, UserError) as exc:
                info.update(status="skipped", reason=str(exc))
                continue
            except Exception as exc:  # a backend that fails to build, compile or capture: that backend fails, not the point
                if name == VERSUS:
                    raise
                info.update(status="failed", reason=f"{type(exc).__name__}: {first_line(exc)}")
            else:
                if not gate.failures:
                    runners[name] = runner
                    continue
                info.update(status="failed", reason=f"{'; '.join(gate.failures.values())} (vs eager, {ctx.dtype}): "
                                                    "not timed")
            result.fail(f"backend {name}: {info['reason']}")
        return backends, runners

    def first_calls(self, ctx: Context, name: str, info: dict, feeds: dict, points: list[int], chunk: int,
                    expected: dict, margins: dict):
        """One backend built and called once per batch point: load time, first-call time, its gate against eager
        (eager itself fills `expected` and, for discrete branches, the masked-logit `margins`)."""
        w = ctx.weights
        started = time.perf_counter()
        runner = build(ctx, name, batch_size=chunk, dtype=None if info["dtype"] == ctx.dtype else info["dtype"])  # None: its plan
        info["load_s"] = time.perf_counter() - started
        # a backend running another dtype (onnxruntime's fp32 graph in an fp64 job) is held to the looser
        gate = Gate(w, ctx.atol(ctx.judged_dtype, info["dtype"]))
        for i, b in enumerate(points):
            started = time.perf_counter()
            got = runner.infer(feeds[b])
            synchronize(runner.target.device)
            if i == 0:
                info["cold_start_ms"] = (time.perf_counter() - started) * 1e3
            if name == VERSUS:
                expected[b] = got
                if w.branches:  # the masked-logit margins that may excuse a discrete flip
                    margins[b] = runner.distributions(feeds[b])["masked_logits"]
            gate.add(b, got, expected[b], margins.get(b))
        info.update(gate.info())
        return runner, gate

    def time_backends(self, runners: dict, timed: list[str], feeds: dict, points: list[int], threads: int,
                      slow: bool, backends: dict[str, dict]) -> dict[tuple[str, int], timing.Timing]:
        """Rounds x points x backends, the backend order rotated each round (timing.py's measurement policy); each
        block's allocator peak is the backend's own (reset before it)."""
        m, timings = self.mode, {(n, b): timing.Timing(rows=b, threads=threads) for n in timed for b in points}
        cap = m.fp16_cpu_samples if slow else 10_000
        for r in range(m.rounds):
            order = timed[r % len(timed):] + timed[: r % len(timed)] if timed else []
            for b in points:
                for name in order:
                    time.sleep(m.settle_s)  # let thread pools stop spinning between blocks
                    fn = lambda runner=runners[name], f=feeds[b]: runner.infer(f)  # noqa: E731
                    reset_peak_memory(runners[name].target.device)
                    t = timing.measure(fn, runners[name].target.device, b, m.budget_s / m.rounds,
                                       m.warmup_s if r == 0 else m.warmup_s / 5, max_samples=cap,
                                       min_warmup=1 if slow else 2)
                    _note_peak(backends[name], runners[name])
                    timings[(name, b)].extend(t)
        return timings

    def energy_of(self, ctx: Context, runners: dict, timed: list[str], feeds: dict, rows: int, backends: dict[str, dict],
                  result: Result) -> None:
        """Joules per action of each timed backend at the job's batch (energy.py), or the one reason it is not measured."""
        if not (self.mode.energy and timed):
            return
        device = ctx.target().device
        try:
            meter = energy.meter_for(device)
        except energy.NotMeasured as exc:
            result.details["energy"] = f"not measured: {exc}"
            result.summary.append(f"energy: not measured: {exc}")
            return
        said = []
        for name in timed:
            runner = runners[name]
            try:
                got = energy.per_action(lambda: runner.infer(feeds[rows]), rows, meter, self.mode.energy_window_s,
                                        self.mode.energy_idle_s, sync=lambda: synchronize(device))
            except energy.NotMeasured as exc:
                backends[name]["energy"] = f"not measured: {exc}"
                said.append(f"{name} not measured ({exc})")
                continue
            backends[name]["energy"] = got
            result.metrics[f"{name}/b{rows}/j_per_action"] = got["j_per_action"]
            said.append(f"{name} {got['j_per_action']:.3g} J (busy {got['busy_w']:,.1f} W, idle {got['idle_w']:,.1f} W, "
                        f"{got['window_s']:.1f} s)")
        result.details["energy"] = f"measured: {meter.name}"
        result.summary.append(f"energy per action above idle, b{rows} ({meter.name}): " + "; ".join(said))

    def tabulate(self, result: Result, backends: dict, timings: dict, timed_backends: list[str],
                 points: list[int], capped: list[int]) -> list[dict]:
        """Per backend its gate's metrics and per batch point its latency stats (metrics, series); the table's rows."""
        rows = []
        for name in timed_backends:
            info = backends[name]
            for key in ("cold_start_ms", "load_s", "max_abs_vs_eager", "peak_mem_mb", *GATE_METRICS):
                if key in info:
                    result.metrics[f"{name}/{key}"] = float(info[key])
            for b in points + capped:
                row = {"backend": name, "batch": b, "status": info["status"], "reason": info["reason"]}
                if (name, b) in timings:
                    stats = timings[(name, b)].stats()
                    row.update(stats)
                    result.metrics.update({f"{name}/b{b}/{k}": stats[k] for k in POINT_STATS})
                    for k in SERIES_STATS:
                        result.series.setdefault(f"{name}/{k}", []).append((b, stats[k]))
                elif b in capped:
                    row.update(status="skipped", reason=f"fp16 on the CPU capped at {self.mode.fp16_cpu_max_rows} rows")
                rows.append(row)
        return rows

    def judge_point(self, ctx: Context, result: Result, eager, timings: dict, feeds: dict, points: list[int]) -> None:
        """The point's verdict and latency: eager on (device, dtype) at the job's batch size, verified by the engine."""
        ladder = result.summary[0]
        b = job_batch(points, ctx.batch_size)
        if (VERSUS, b) in timings:
            stats = timings[(VERSUS, b)].stats()
            result.latency = {**{k: stats[k] for k in LATENCY_KEYS}, "batch_size": float(b)}
            result.metrics.update({f"latency/{k}": v for k, v in result.latency.items()})
        verify_point(ctx, result, eager, feeds[b])
        said = loadgen.answer(result.metrics)  # LoadGen's and the control loop's own answer, on the first line too
        result.headline += f"; {ladder}" + (f"; {said}" if said else "")

    def scenarios_on(self, ctx: Context, runners: dict, timings: dict, feeds: dict, points: list[int], result: Result) -> None:
        """LoadGen's scenarios and the control loop on the job's backend (skipped, with the reason, if it is not timed)."""
        wanted = [s for s in self.mode.scenarios if s in extra.NAMES]
        if not wanted:
            return
        runner = runners.get(ctx.backend)
        if runner is None:
            result.summary.append(f"scenarios {wanted} not run: backend {ctx.backend} was not timed (see its status)")
            return
        point = timings[(ctx.backend, job_batch(points, ctx.batch_size))].stats()
        if 1 in points:
            one = timings[(ctx.backend, 1)].stats()
            point.update(b1_p50_us=one["p50_us"], b1_min_us=one["min_us"])
        if set(wanted) & set(extra.LOADGEN):
            qsl = self.feeds(ctx, [self.mode.qsl_samples])[0][self.mode.qsl_samples]
            tol = ctx.atol(ctx.judged_dtype, ran_dtype(ctx.backend, ctx.judged_dtype))
            extra.run_loadgen(ctx, runner, runners[VERSUS], qsl, self.mode, tol, point, result, points)
        if extra.CONTROL_LOOP in wanted:
            extra.run_control_loop(ctx, runner, self.mode, result)

    def feeds(self, ctx: Context, points: list[int]) -> tuple[dict[int, dict[str, np.ndarray]], str]:
        """Per batch point, every input of the policy at that many rows, and what is timed (in words)."""
        w, base = ctx.weights, ctx.feeds
        feeds = {b: batch_of(base, b) for b in points}  # a sequence: its first step
        for b, step in feeds.items():  # one decision step of b agents: masks all allowed when not given, zero memory
            if w.branches and ACTION_MASKS not in step:
                step[ACTION_MASKS] = np.ones((b, sum(w.branch_sizes)), np.float32)
            if w.memory:
                step[RECURRENT_IN] = np.zeros((b, 1, w.memory), np.float32)
        said = [f"every input per batch point ({', '.join(obs_name(i) for i in range(len(w.inputs)))}"]
        if w.branches:
            said.append(f"action_masks {'from the observation file' if ACTION_MASKS in base else 'all allowed'}")
        if w.memory:
            said.append(f"recurrent_in zeros [b, 1, {w.memory}]")
        text = ", ".join(said) + "): one step per call, as an agent runs per decision"
        if is_sequence(base):
            steps, agents = base[obs_name(0)].shape[:2]
            text += f"; the {steps}-step x {agents}-agent sequence is timed on its first step (zero memory)"
        return feeds, text


GATE_METRICS = ("discrete_flips", "discrete_flips_beyond_margin", "recurrent_out_max_abs_vs_eager")


class Gate:
    """A backend's deterministic outputs against eager's over the batch points: every output the policy has.

    Continuous actions within `tol`, recurrent_out within tol x max(1, |memory|), discrete actions equal (a flip
    excused only where eager's masked-logit margin is within the tolerance); NaN/inf mismatches and missing outputs fail.
    """

    def __init__(self, w: PolicyWeights, tol: float):
        self.w, self.tol, self.failures = w, tol, {}
        self.worst = {ACTIONS: 0.0, RECURRENT_OUT: 0.0, "max_abs_limit": 0.0}
        self.counts = {"flips": 0.0, "flips_beyond_margin": 0.0}

    def add(self, rows: int, got: dict, expected: dict, masked_logits: np.ndarray | None) -> None:
        metrics, failures, _ = compare_outputs(got, expected, VERSUS, self.tol, REL_FLOOR, masked_logits,
                                               self.w.branch_sizes)
        for name, stem in ((ACTIONS, "actions"), (RECURRENT_OUT, "memories")):
            self.worst[name] = max(self.worst[name], metrics.get(f"{stem}/vs_{VERSUS}/max_abs", 0.0))
        self.worst["max_abs_limit"] = max(self.worst["max_abs_limit"], metrics.get(f"memories/vs_{VERSUS}/max_abs_limit", 0.0))
        for k in self.counts:
            self.counts[k] += metrics.get(f"discrete_actions/vs_{VERSUS}/{k}", 0.0)
        for failure in failures:  # the first failure of each output, with the batch point it came from
            self.failures.setdefault(failure.split(" ")[0].rstrip(":"), f"b{rows}: {failure}")

    def info(self) -> dict:
        """max_abs_vs_eager: continuous actions (absent for a discrete-only policy); the other outputs' figures too."""
        continuous = self.w.mu is not None
        out = {"max_abs_vs_eager": self.worst[ACTIONS]} if continuous else {}
        said = [f"max |Δ| vs eager {self.worst[ACTIONS]:.2e}"] if continuous else []
        if self.w.branches:
            out.update({f"discrete_{k}": v for k, v in self.counts.items()})
            excused = int(self.counts["flips"] - self.counts["flips_beyond_margin"])
            said.append(f"discrete actions: {int(self.counts['flips'])} differ ({excused} excused near-ties)")
        if self.w.memory:
            out["recurrent_out_max_abs_vs_eager"] = self.worst[RECURRENT_OUT]
            said.append(f"recurrent_out max |Δ| {self.worst[RECURRENT_OUT]:.2e} (tolerance {self.worst['max_abs_limit']:.2g})")
        return {**out, "vs_eager": ", ".join(said)}


def _note_peak(info: dict, runner) -> None:
    """A torch backend's allocator peak (MB): the largest of its blocks'; only a card's allocator, whose peak resets
    (onnxruntime's memory is not torch's allocator's)."""
    device = runner.target.device
    if device.type in ("cuda", "npu") and isinstance(runner, TorchRunner):
        info["peak_mem_mb"] = max(info.get("peak_mem_mb", 0.0), peak_memory(device)[0])


def job_batch(points: list[int], batch_size: int) -> int:
    """The batch a point is about: the job's own batch size when it is timed, else the ladder's largest."""
    return batch_size if batch_size in points else max(points)


def _summary(result: Result, backends: dict, points: list[int], order: list[str], batch_size: int) -> list[str]:
    """First line (the headline): p50 at the job's own batch size per backend, and eager over onnxruntime; a backend
    that ran another dtype than the job's is named with it (`onnxruntime (fp32)` in a bf16 job)."""
    m = result.metrics
    b = job_batch(points, batch_size)
    named = {n: n + (f" ({backends[n]['dtype']})" if backends[n]["dtype"] != backends[VERSUS]["dtype"] else "") for n in order}
    p50 = {n: m[f"{n}/b{b}/p50_us"] for n in order if f"{n}/b{b}/p50_us" in m}
    top, bottom = P50_RATIO
    ratio = (f" ({top}/{named[bottom]} {p50[top] / p50[bottom]:.2f}x)" if {top, bottom} <= set(p50) and p50[bottom]
             else "")
    lines = [f"b{b} p50: " + (", ".join(f"{named[n]} {v:,.1f} µs" for n, v in p50.items()) or "nothing timed") + ratio]
    if 1 in points and b != 1:
        lines.append("single_stream b1 p50/p99: " + ", ".join(
            f"{named[n]} {m[f'{n}/b1/p50_us']:,.1f}/{m[f'{n}/b1/p99_us']:,.1f} µs" for n in order if f"{n}/b1/p50_us" in m))
    top = max(points)
    if top != 1:
        lines.append(f"offline b{top}: " + ", ".join(
            f"{named[n]} {m[f'{n}/b{top}/obs_per_s']:,.0f} obs/s" for n in order if f"{n}/b{top}/obs_per_s" in m))
    for n in order:
        info = backends[n]
        if info["status"] != "passed":
            lines.append(f"{named[n]}: {info['status'].upper()}: {info['reason']}")
        else:
            noisy = [f"b{b}" for b in points if m.get(f"{n}/b{b}/noisy")]
            lines.append(f"{n} ({info['dtype']}): load {info['load_s']:.3f} s, first call {info['cold_start_ms']:,.1f} ms, "
                         f"{info['vs_eager']}" + (f", noisy at {', '.join(noisy)}" if noisy else ""))
    lines.append(f"peak memory {m['peak_mem_mb']:,.0f} MB ({result.details['peak_mem_source']})")
    return lines
