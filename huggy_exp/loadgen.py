"""MLPerf LoadGen drives the benchmark's scenarios (single_stream, multi_stream, offline, server and the server's QPS
search; docs/loadgen-and-control-loop.md): the runner is its system under test (SUT), the benchmark's feeds its query
sample library (QSL). VALID/INVALID, the early-stopping estimates and the percentiles are read from LoadGen's detail
log. Accuracy is checked on what was timed (LoadGen's TEST01): every performance run logs a sample of its responses,
an AccuracyOnly run one per QSL sample; the caller compares them with the reference."""

from __future__ import annotations

import json
import math
import queue
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from huggy_exp import terminal
from huggy_exp.config import LOADGEN_INSTALL as INSTALL
from huggy_exp.config import LOADGEN_QUERY_BYTES, MULTI_STREAM_MIN_QUERIES, loadgen_schedule
from huggy_exp.config import SCENARIOS as CHOICES
from huggy_exp.errors import UserError
from huggy_exp.memory import require_memory
from huggy_exp.report import fmt
from huggy_exp.verify import DECLARED

SCENARIOS = tuple(s for s in CHOICES if s != "control_loop")  # the control loop is LoadGen-free (control_loop.py)
LOGS = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")
PERCENTILES = {"p50_us": "50.00", "p90_us": "90.00", "p99_us": "99.00", "p999_us": "99.90"}

Infer = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def answer(metrics: Mapping[str, float]) -> str:
    """A point's LoadGen scenarios and control loop in one line, from its metrics ('' where none ran): `server INVALID
    (highest QPS with p99 in bound 212), offline VALID; control loop: miss rate 97.9% at 500 Hz (...)`."""
    said = [f"{s} {'VALID' if metrics[f'loadgen/{s}/valid'] else 'INVALID'}" for s in SCENARIOS if f"loadgen/{s}/valid" in metrics]
    if "loadgen/server/max_qps" in metrics:
        said = [f"{x} (highest QPS with p99 in bound {fmt(metrics['loadgen/server/max_qps'])})" if x.startswith("server ")
                else x for x in said]
    if "control_loop/miss_rate" in metrics:
        said.append(f"control loop: miss rate {metrics['control_loop/miss_rate']:.1%} at {fmt(metrics['control_loop/rate_hz'])} Hz"
                    + (f" (highest rate within the miss budget {fmt(metrics['control_loop/max_rate_hz'])} Hz)"
                       if "control_loop/max_rate_hz" in metrics else ""))
    return "; ".join(said)


def require():
    """The mlperf_loadgen module, or a UserError that says how to install it."""
    try:
        import mlperf_loadgen
    except ImportError:
        raise UserError(f"the scenarios {', '.join(SCENARIOS)} run on MLPerf LoadGen, which is not installed here: "
                        f"{INSTALL}") from None
    return mlperf_loadgen


@dataclass(frozen=True)
class Settings:
    """How long LoadGen runs and what it aims at (TestSettings): mode=benchmark's keys of the same names and units."""

    min_duration_ms: int
    max_duration_ms: int
    min_query_count: int
    samples_per_query: int
    target_qps: float
    latency_bound_ms: float
    check_samples: int

    def test_settings(self, lg, scenario: str, accuracy: bool, expected_latency_s: float, expected_qps: float):
        s = lg.TestSettings()
        s.scenario = getattr(lg.TestScenario, scenario.title().replace("_", ""))  # single_stream -> SingleStream
        s.mode = lg.TestMode.AccuracyOnly if accuracy else lg.TestMode.PerformanceOnly
        s.min_duration_ms = int(self.min_duration_ms)
        s.max_duration_ms = int(max(self.max_duration_ms, self.min_duration_ms))
        s.min_query_count = int(max(self.min_query_count, MULTI_STREAM_MIN_QUERIES if scenario == "multi_stream" else 0))
        latency_ns = max(int(expected_latency_s * 1e9), 1000)
        s.single_stream_expected_latency_ns = latency_ns
        s.multi_stream_expected_latency_ns = latency_ns * self.samples_per_query
        s.multi_stream_samples_per_query = int(self.samples_per_query)
        s.offline_expected_qps = float(max(expected_qps, 1.0))
        s.server_target_qps = float(self.target_qps)
        s.server_target_latency_ns = int(self.latency_bound_ms * 1e6)
        s.accuracy_log_sampling_target = int(self.check_samples)  # TEST01's spirit: a sample of the timed responses
        return s

    def check_schedule(self, scenario: str, accuracy: bool, expected_latency_s: float, expected_qps: float,
                       samples: int) -> None:
        """Refuse in one line, before LoadGen generates it, a schedule this host cannot hold (LoadGen's std::bad_alloc,
        then a crash): config.loadgen_schedule at the rates test_settings gives LoadGen (timing.py's measured ones)."""
        if accuracy:  # one offline query of every QSL sample
            need, what, keys = samples * LOADGEN_QUERY_BYTES, f"LoadGen's accuracy run of {samples:,} samples", "mode.qsl_samples"
        else:
            call_s = max(int(expected_latency_s * 1e9), 1000) / 1e9
            per_query = self.samples_per_query if scenario == "multi_stream" else 1
            rate = {"single_stream": 1 / call_s, "multi_stream": 1 / (call_s * per_query),
                    "offline": max(expected_qps, 1.0), "server": self.target_qps}[scenario]
            queries, count, need = loadgen_schedule(scenario, self.min_duration_ms / 1e3, self.min_query_count, per_query,
                                                    rate)
            what = f"LoadGen's {scenario} schedule of {queries:,} queries ({count:,} samples) at the measured rate"
            keys = f"mode.min_duration_ms={self.min_duration_ms} (else mode.budget_s) × mode.min_query_count={self.min_query_count}"
        require_memory(need, what, keys)


class Layout:
    """A sample's outputs as one LoadGen response: their values as float64 (exact for every dtype), back to back."""

    def __init__(self, outputs: Mapping[str, np.ndarray], names: tuple[str, ...]):
        rows = len(next(iter(outputs.values())))
        self.parts = [(n, tuple(np.shape(outputs[n])[1:]), np.asarray(outputs[n]).dtype) for n in names
                      if n in outputs and np.ndim(outputs[n]) >= 1 and len(outputs[n]) == rows]
        self.width = sum(int(np.prod(shape)) for _, shape, _ in self.parts)

    def pack(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """float64 [rows, width], C-contiguous: row i is sample i's response."""
        rows = len(outputs[self.parts[0][0]])
        return np.ascontiguousarray(np.concatenate(
            [np.asarray(outputs[n], np.float64).reshape(rows, -1) for n, _, _ in self.parts], axis=1))

    def unpack(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        columns = np.split(rows, np.cumsum([int(np.prod(shape)) for _, shape, _ in self.parts])[:-1], axis=1)
        return {n: c.reshape(len(rows), *shape).astype(dtype) for (n, shape, dtype), c in zip(self.parts, columns)}


class System:
    """The SUT and QSL LoadGen calls: samples are rows of `feeds`, answered by `infer` on the rows a query names. A
    Python exception inside a LoadGen callback would leave LoadGen waiting for answers that never come, so every query
    is answered (empty, on failure) and the first error is re-raised once the test has ended."""

    def __init__(self, lg, infer: Infer, feeds: Mapping[str, np.ndarray], layout: Layout, batch_size: int,
                 buckets: list[int] | None = None):
        self.lg, self.infer, self.feeds, self.layout = lg, infer, feeds, layout
        self.batch_size = max(int(batch_size), 1)
        self.buckets = sorted(buckets or [])
        self.count = len(next(iter(feeds.values())))
        self.error: BaseException | None = None
        self.samples = 0
        self.waiting: queue.SimpleQueue | None = None  # server: what LoadGen's issue thread queued for serve()

    def answer(self, samples: list) -> None:
        """Run the rows of these query samples as one call (the packing counts: it is part of serving them)."""
        try:
            if self.error is None:
                index = np.fromiter((q.index for q in samples), np.int64, len(samples))
                rows = self.layout.pack(self.infer({k: v[self.padded(index)] for k, v in self.feeds.items()}))
                size, base = rows.strides[0], rows.ctypes.data
                self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(q.id, base + i * size, size)
                                              for i, q in enumerate(samples)])
                self.samples += len(samples)
                return
        except BaseException as exc:  # noqa: BLE001 - re-raised by run() after LoadGen has finished
            self.error = self.error or exc
        self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(q.id, 0, 0) for q in samples])

    def padded(self, index: np.ndarray) -> np.ndarray:
        """A fixed-shape runner (compile, graphs) runs the shapes it was built for: the rows padded up to the smallest
        bucket that holds them (its last row repeated; the extra answers are dropped), as a serving engine's profiles."""
        fits = [b for b in self.buckets if b >= len(index)]
        return np.concatenate([index, np.repeat(index[-1:], fits[0] - len(index))]) if fits else index

    def issue(self, samples: list) -> None:
        if self.waiting is not None:  # server: LoadGen's issue thread only queues
            for q in samples:
                self.waiting.put(q)
            return
        for start in range(0, len(samples), self.batch_size):  # offline hands over every sample at once
            self.answer(samples[start : start + self.batch_size])

    def serve(self) -> None:
        """Server: one worker answers what has queued, up to batch_size rows a call, until a None is queued."""
        while True:
            batch = [self.waiting.get()]
            while batch[-1] is not None and len(batch) < self.batch_size and not self.waiting.empty():
                batch.append(self.waiting.get())
            samples = [q for q in batch if q is not None]
            if samples:
                self.answer(samples)
            if len(samples) < len(batch):
                return

    def run(self, settings, outdir: Path, server: bool = False) -> None:
        lg = self.lg
        outdir.mkdir(parents=True, exist_ok=True)
        log = lg.LogOutputSettings()
        log.outdir, log.copy_summary_to_stdout = str(outdir), False
        log_settings = lg.LogSettings()
        log_settings.log_output, log_settings.enable_trace = log, False
        self.waiting = queue.SimpleQueue() if server else None
        worker = threading.Thread(target=self.serve, name="loadgen-server", daemon=True)
        if server:
            worker.start()
        sut = lg.ConstructSUT(self.issue, lambda: None)
        qsl = lg.ConstructQSL(self.count, self.count, lambda _: None, lambda _: None)
        # Ctrl-C or SIGTERM raised inside a callback LoadGen's thread makes would unwind its C++ while the worker still
        # answers (a crash, no result.json): the signal is noted, the rest answered empty, and raised once LoadGen ends
        cut = lambda: setattr(self, "error", self.error or KeyboardInterrupt())  # noqa: E731
        try:
            with terminal.deferred(on_signal=cut):
                lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
        finally:
            if server:
                self.waiting.put(None)
                worker.join()
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
            (outdir / "mlperf_log_trace.json").unlink(missing_ok=True)  # empty: tracing is off
        if self.error is not None:
            raise self.error


# --- what LoadGen logged


def read_detail(path: Path) -> dict:
    """The last value of every key in mlperf_log_detail.txt's `:::MLLOG {json}` records."""
    values = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        if line.startswith(":::MLLOG "):
            try:
                record = json.loads(line[len(":::MLLOG "):])
            except json.JSONDecodeError:
                continue
            values[record.get("key")] = record.get("value")
    return values


def metrics_of(detail: dict, scenario: str) -> dict[str, float]:
    """VALID/INVALID, the constraints LoadGen checked, its percentiles (µs), throughput and early-stopping figures."""
    m = {"valid": float(detail.get("result_validity") == "VALID")}
    for key, name in (("result_min_duration_met", "min_duration_met"), ("result_min_queries_met", "min_queries_met"),
                      ("early_stopping_met", "early_stopping_met"), ("result_perf_constraints_met", "constraints_met")):
        if key in detail:
            m[name] = float(bool(detail[key]))
    per_query = "per_query_" if scenario == "multi_stream" else ""
    qps = {"single_stream": "result_qps_with_loadgen_overhead", "multi_stream": "result_qps_with_loadgen_overhead",
           "offline": "result_samples_per_second", "server": "result_completed_samples_per_sec"}[scenario]
    numbers = {**{f"result_{pct}_percentile_{per_query}latency_ns": (name, 1e3) for name, pct in PERCENTILES.items()},
               "result_mean_latency_ns": ("mean_us", 1e3), "result_min_latency_ns": ("min_us", 1e3),
               "result_max_latency_ns": ("max_us", 1e3), qps: ("samples_per_s", 1.0),
               **({"result_scheduled_samples_per_sec": ("scheduled_qps", 1.0)} if scenario == "server" else {}),
               "result_query_count": ("queries", 1.0), "result_overlatency_query_count": ("overlatency_queries", 1.0)}
    m.update({name: float(detail[key]) / unit for key, (name, unit) in numbers.items()
              if isinstance(detail.get(key), (int, float))})
    m.update(early_stopping(str(detail.get("early_stopping_result") or "")))
    return m


def early_stopping(text: str) -> dict[str, float]:
    """LoadGen's early-stopping estimates (`Early stopping 90.0th percentile estimate: <ns>`) in µs, and the further
    queries it says a conclusive run needs."""
    m = {}
    for pct, ns in re.findall(r"Early stopping (\d+(?:\.\d+)?)th percentile estimate: (\d+)", text):
        m[f"early_stopping_p{pct.rstrip('0').rstrip('.').replace('.', '')}_us"] = int(ns) / 1e3
    more = re.search(r"(?:run at least|process at least) (\d+) (?:more )?queries", text)
    if more:
        m["early_stopping_needs_queries"] = float(more.group(1))
    return m


def read_accuracy(path: Path, layout: Layout) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The responses LoadGen logged (mlperf_log_accuracy.json): their QSL indices and the decoded outputs."""
    entries = json.loads(Path(path).read_text() or "[]")
    index = np.array([e["qsl_idx"] for e in entries], np.int64)
    size = layout.width * 8
    raw = b"".join(bytes.fromhex(e["data"]) for e in entries)
    if len(raw) != size * len(entries):
        raise UserError(f"{path}: {len(raw)} bytes of responses for {len(entries)} samples of {size} bytes")
    rows = np.frombuffer(raw, "<f8").reshape(len(entries), layout.width)
    return index, layout.unpack(rows)


# --- every scenario asked for, end to end


Check = Callable[[np.ndarray, Mapping[str, np.ndarray]], tuple[dict[str, float], list[str]]]


@dataclass
class Outcome:
    """What the scenarios measured, flat `loadgen/<scenario>/<metric>` metrics, and LoadGen's files (job-dir relative)."""

    metrics: dict[str, float]
    lines: list[str]
    files: list[str]
    search: list[dict[str, float]]
    failures: list[str]
    error: str = ""


def run_scenarios(scenarios: list[str], infer: Infer, feeds: Mapping[str, np.ndarray], batch_size: int,
                  settings: Settings, workdir: Path, expected_latency_s: float, expected_qps: float, check: Check,
                  search_steps: int = 6, search_ms: int = 500, min_latency_s: float = 0.0,
                  buckets: list[int] | None = None) -> Outcome:
    """Each LoadGen scenario in performance mode (its logged responses checked), one AccuracyOnly run over every QSL
    sample, and the server's QPS search. `check(qsl_index, outputs)` -> (metrics `<output>/vs_<reference>/<metric>`,
    failures). `buckets`: the row counts a fixed-shape runner was built for."""
    lg = require()
    layout = Layout(infer({k: v[:1] for k, v in feeds.items()}), CHECKED)
    system = System(lg, infer, feeds, layout, batch_size, buckets)
    out = Outcome({}, [], [], [], [])
    root = Path(workdir) / "loadgen"

    def one(scenario: str, folder: str, accuracy: bool = False, qps: float | None = None,
            run_settings: Settings = settings) -> dict[str, float]:
        chosen = run_settings if qps is None else replace(run_settings, target_qps=qps)
        chosen.check_schedule(scenario, accuracy, expected_latency_s, expected_qps, system.count)
        where = root / folder
        system.run(chosen.test_settings(lg, scenario, accuracy, expected_latency_s, expected_qps), where,
                   server=scenario == "server")
        m = metrics_of(read_detail(where / "mlperf_log_detail.txt"), scenario)
        index, got = read_accuracy(where / "mlperf_log_accuracy.json", layout)
        checked, failures = check(index, got) if len(index) else ({}, [])
        m.update({"checked": float(len(index)), **checked})
        out.failures.extend(f"loadgen {folder}: {f}" for f in failures)
        return m

    for scenario in [s for s in SCENARIOS if s in scenarios]:
        m = one(scenario, scenario)
        out.metrics.update({f"loadgen/{scenario}/{k}": v for k, v in m.items()})
        out.files += [f"loadgen/{scenario}/{name}" for name in LOGS]
        out.lines.append(_line(scenario, m, settings))
    if scenarios:
        m = one("offline", "accuracy", accuracy=True)
        out.metrics.update({f"loadgen/accuracy/{k}": v for k, v in m.items() if k == "checked" or "/vs_" in k})
        out.lines.append(f"loadgen accuracy: {int(m['checked'])} responses (every QSL sample) checked against the reference"
                         f", {len(out.failures)} failure(s)")
    if "server" in scenarios:
        _server_search(one, out, settings, min_latency_s, search_steps, search_ms)
    return out


def _server_search(one: Callable[..., dict[str, float]], out: Outcome, settings: Settings, min_latency_s: float,
                   search_steps: int, search_ms: int) -> None:
    """The highest server QPS the runner sustains with its p99 under the bound (`one` runs a scenario into a folder): a
    probe holds when LoadGen's p99 meets the bound and the samples completed per second reach SUSTAINED of those it
    scheduled (a short probe on a slow runner meets its p99 before the queue grows). A bound below the fastest call
    ever timed is said at once, with no search."""
    bound, m = settings.latency_bound_ms, out.metrics
    if min_latency_s * 1e3 > bound:
        out.error = (f"mode.latency_bound_ms={bound:g} can never be met: one call alone takes {min_latency_s * 1e3:.3g} ms "
                     f"at the fastest; LoadGen server at {settings.target_qps:g} QPS: "
                     f"{'VALID' if m.get('loadgen/server/valid') else 'INVALID'}, "
                     f"p99 {m.get('loadgen/server/p99_us', math.nan) / 1e3:.3g} ms")
        out.metrics["loadgen/server/max_qps"] = 0.0
        out.lines.append(f"server: {out.error}")
        return
    if not search_steps:
        return
    probe_settings = replace(settings, min_duration_ms=search_ms, max_duration_ms=max(search_ms, settings.max_duration_ms))

    def probe(qps: float) -> bool:
        m = one("server", f"server-search/qps{qps:.0f}", qps=qps, run_settings=probe_settings)
        kept = m["samples_per_s"] / m["scheduled_qps"] if m.get("scheduled_qps") and "samples_per_s" in m else 0.0
        out.search.append({"qps": qps, **{k: m[k] for k in SEARCH_KEYS if k in m}, "sustained": kept})
        return bool(m.get("constraints_met")) and kept >= SUSTAINED

    from huggy_exp.timing import highest_rate  # torch: a sweep's summary reads loadgen.answer without it

    best, _ = highest_rate(probe, settings.target_qps, search_steps, lo=1.0, hi=1e7)
    out.metrics["loadgen/server/max_qps"] = best
    lowest = min(out.search, key=lambda t: t["qps"])
    held = f"p99 <= {bound:g} ms and >= {SUSTAINED:.0%} of the offered samples/s completed"
    out.lines.append(f"server search: highest QPS with {held}: {best:,.0f} ({len(out.search)} probes)" if best else
                     f"server search: {held} at no rate tried, down to {lowest['qps']:,.1f} QPS (p99 "
                     f"{lowest.get('p99_us', math.nan) / 1e3:.3g} ms, {lowest['sustained']:.0%} completed)")


SEARCH_KEYS = ("constraints_met", "valid", "p99_us", "samples_per_s", "scheduled_qps", "queries")
SUSTAINED = 0.9  # a server probe holds its rate when it completes this share of the samples/s LoadGen scheduled
CHECKED = tuple(o.name for o in DECLARED)


def _line(scenario: str, m: dict[str, float], settings: Settings) -> str:
    verdict = "VALID" if m.get("valid") else "INVALID"
    es = ", ".join(f"p{k.split('_p')[1].split('_')[0]} {v:,.1f} µs" for k, v in m.items()
                   if k.startswith("early_stopping_p"))
    head = {"single_stream": f"p50 {m.get('p50_us', math.nan):,.1f} µs, p90 {m.get('p90_us', math.nan):,.1f} µs",
            "multi_stream": f"{settings.samples_per_query} samples/query: p50 {m.get('p50_us', math.nan):,.1f} µs, "
                            f"p99 {m.get('p99_us', math.nan):,.1f} µs",
            "offline": f"{m.get('samples_per_s', math.nan):,.0f} samples/s",
            "server": f"{settings.target_qps:g} QPS Poisson: p99 {m.get('p99_us', math.nan) / 1e3:,.3g} ms "
                      f"(bound {settings.latency_bound_ms:g} ms), {m.get('samples_per_s', math.nan):,.0f} samples/s"}[scenario]
    extra = f"; early stopping {es}" if es else ""
    if not m.get("early_stopping_met", 1.0) and "early_stopping_needs_queries" in m:
        extra += f"; early stopping needs {int(m['early_stopping_needs_queries'])} more queries"
    return f"loadgen {scenario}: {verdict}, {head}{extra}, {int(m.get('queries', 0))} queries"
