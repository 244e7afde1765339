"""Everything that needs a GPU or NPU, in one call: device points first, each step within a budget computed from its
configured minimum durations and printed before it starts; one tarball and a first-failure SUMMARY.md.

    python scripts/accelerator_check.py DEVICE OUTDIR [--tar FILE] [--fixtures DIR | --no-fixtures] [--quick]

DEVICE: cuda | cuda:N | npu | npu:N (cpu: a dry run of every step on the CPU alone). Each step (plan() below) is one
Hydra sweep (`run.py -m ... tracking=none`) into OUTDIR/<step>/, its log OUTDIR/<step>.log. The steps, their budgets,
the fixture folder (.fx/, filled by ../shared/device/prepare.sh; required unless --no-fixtures) and the summary:
docs/loadgen-and-control-loop.md, "Running on an accelerator". --python "CMD" runs run.py with another interpreter
command (the CI rehearsal: "python tests/emulated_npu.py"). OUTDIR must be new or empty and --tar FILE (and the
SUMMARY.md beside it) must not exist: nothing is replaced. The run ends within --total-s (TOTAL_S: the device call's
420 s less setup and margin), kills and packing included; the archive is rewritten after every step.
Exit: 0 when every step ran, each ran a point on DEVICE, and every device point met its verdict or failed as its CPU
twin did (a dtype's limit the policy misses everywhere: listed apart); else the first failing step's exit status (1
for a step that was not run or ran no device point); 2 for a bad argument or an output that exists.
How to run it on the lent GPU: docs/hardware/cuda.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from huggy_exp import energy  # noqa: E402
from huggy_exp.errors import UserError  # noqa: E402
from huggy_exp.files import CLAIM, REFUSED, atomic_write, atomic_write_text, check_unused, folder_in_use  # noqa: E402

SHAPES = ("huggy", "huggy_lstm", "pyramids")  # what prepare.sh copies into .fx/
# A step's budget is SLACK x its estimate; the constants were measured on the emulated npu (2 shared cores, 2026-12-02:
# docs/measurements/2026-12-02-accelerator-check.md), where a policy call costs more than on a card
START_S = 8.0  # a sweep's own cost: python, torch, Hydra's composition, the sweep's summary and plots
POINT_S = 2.5  # each point's work beyond its timed minimum: model, references, verdict, result.json, plots
CALL_S = 0.003  # each sequential policy call (rollouts of fingerprint and stats: the device's and the CPU reference's)
ROW_S = 3e-5  # each row of a call on the CPU or the emulated card (eager fp32, one thread: 35k rows/s); a card is faster
# each shape a compiled backend builds: bench.py's first compile of a shape (inductor with freezing, Huggy at batch 1)
# took 2.8 s on an idle 2-core CPU (docs/measurements/2026-12-02.md) and 4.5 s at load 4-7 (2026-12-01.md); the check
# runs alone on its host. A card's own build (Triton on CUDA, torchair's aclgraph on npu) is unmeasured: cut at the cap
COMPILE_S = 5.0
SLACK = 1.5  # budget = SLACK x the estimate: a loaded host, a slow first kernel load
# The envelope: whatever happens, the device call ends by DEVICE_CALL_S - MARGIN_S (400 s), setup included (worst_case())
DEVICE_CALL_S = 420.0  # the device call's limit (docs/hardware/cuda.md: timeout_s)
MARGIN_S = 20.0  # kept free of the call's limit
SETUP_S = 5.0  # the device command's work before this script: the wheels' install (0.4 s measured here), Python's start
TERM_S = 5.0  # a step past its cap gets SIGTERM and this long to end (run.py then writes what it finished)...
KILL_S = 2.0  # ...then SIGKILL, and this long for it to take
PACK_S = 2.0  # SUMMARY.md and the archive rewritten once (after each step, and at the end; 4 steps' 11 MB: 0.65 s at load 13)
TOTAL_S = DEVICE_CALL_S - MARGIN_S - SETUP_S  # this script's own run: every step, kill and packing included
PROBE_TICKS = 50  # huggy_exp.control_loop.MIN_PROBE_TICKS: a control-loop search probe runs at least this many ticks
MULTI_STREAM_QUERIES = 662  # huggy_exp.loadgen.MULTI_STREAM_MIN_QUERIES
SCENARIOS = "[single_stream,multi_stream,offline,server,control_loop]"
MODES = "action,precision,fingerprint,stats"  # the verdict modes, one sweep: every point of them in one process
FULL = {"dtypes": "fp32,fp16,bf16", "ladder": [1, 8, 64, 512, 4096, 65536],
        "bench": {"rounds": 2, "budget_s": 0.4, "warmup_s": 0.2, "settle_s": 0.05, "min_duration_ms": 1000,
                  "search_steps": 5, "search_ms": 400, "duration_s": 2.0, "loop_search_s": 0.5, "rate_hz": 1000}}
# energy per action: in the `benchmark` step alone (every backend timed on the device), over energy.py's shortest
# window, budgeted where the device has a meter (energy_meter); the other steps measure none
ENERGY = {"energy_window_s": 5.0, "energy_idle_s": 1.0}
QUICK = {"dtypes": "fp32,bf16", "ladder": [1, 64],
         "bench": {"rounds": 1, "budget_s": 0.05, "warmup_s": 0.01, "settle_s": 0.0, "min_duration_ms": 50,
                   "min_query_count": 64, "qsl_samples": 64, "check_samples": 16, "search_steps": 2, "search_ms": 50,
                   "duration_s": 0.2, "loop_search_s": 0.1, "rate_hz": 100, "latency_bound_ms": 1000}}


@dataclass
class Step:
    name: str
    args: list[str]
    jobs: int
    timed_s: float = 0.0  # the configured minimum timed seconds of all its jobs
    compiled: int = 0  # shapes a compiled backend builds
    why: str = ""  # how timed_s was computed
    budget_s: float = 0.0
    rc: int | None = None
    took_s: float = 0.0
    cpu_s: float = 0.0  # CPU seconds its processes used (user + system)
    load: str = ""  # the host's 1-minute load average before and after it
    rows: list[dict] = field(default_factory=list)
    device: str = ""  # the check's device, when the step runs points on it (then at least one must run)
    note: str = ""  # why it was not run

    def plan(self) -> None:
        self.budget_s = round(SLACK * (START_S + self.jobs * POINT_S + self.timed_s + self.compiled * COMPILE_S))

    def shown(self) -> str:
        parts = [f"{START_S:g} s start", f"{self.jobs} point(s) x {POINT_S:g} s"]
        if self.timed_s:
            parts.append(f"{self.timed_s:.1f} s timed ({self.why})")
        if self.compiled:
            parts.append(f"{self.compiled} compiled shape(s) x {COMPILE_S:g} s")
        return f"{self.name}: budget {self.budget_s:.0f} s = {SLACK:g} x ({' + '.join(parts)})"


def search_s(start: float, steps: int, probe_s: float, least: int) -> float:
    """The longest a rate search can take: every probe misses, so the rate halves from `start`; each probe lasts
    `probe_s` or the `least` queries (ticks) it needs at its rate, whichever is longer."""
    return sum(max(probe_s, least / (start / 2**i)) for i in range(int(steps)))


def benchmark_minimum(bench: dict, backends: int, batches: list[int], scenarios: str) -> tuple[float, str]:
    """The seconds one benchmark job times at least, from its knobs (conf/mode/benchmark.yaml's, overridden by
    `bench`): its points, LoadGen's runs and server search, the control loop and its search, the energy windows."""
    k = {**_mode_knobs("benchmark"), **bench}
    per_point = k["warmup_s"] + k["budget_s"] + k["rounds"] * k["settle_s"]
    # a batch too big to fit its budget still makes, per round, 2 warm-up calls and 1 timed (timing.measure)
    timing = backends * sum(max(per_point, k["rounds"] * 3 * rows * ROW_S) for rows in batches)
    run_s = k["min_duration_ms"] / 1000
    names = scenarios.strip("[]").split(",")
    loadgen = run_s * sum(n in ("single_stream", "offline") for n in names)
    if "multi_stream" in names:  # at least its early-stopping minimum of queries, one policy call each
        loadgen += max(run_s, MULTI_STREAM_QUERIES * CALL_S)
    if "server" in names:
        loadgen += max(run_s, k["min_query_count"] / k["target_qps"])
        loadgen += search_s(k["target_qps"], k["search_steps"], k["search_ms"] / 1000, k["min_query_count"])
    loop = (k["duration_s"] + search_s(k["rate_hz"], k["search_steps"], k["loop_search_s"], PROBE_TICKS)
            if "control_loop" in names else 0.0)
    energy = backends * (k["energy_idle_s"] + k["energy_window_s"]) if k["energy"] else 0.0  # where a meter answers
    why = (f"{backends} backend(s) x {len(batches)} batch(es) at >= {per_point:.2f} s + LoadGen {loadgen:.1f} s"
           + (f" + control loop {loop:.1f} s" if loop else "") + (f" + energy {energy:.0f} s" if energy else ""))
    return timing + loadgen + loop + energy, why


def compiled_shapes(batches: list[int], scenarios: str) -> int:
    """The chunk shapes a compiled backend builds: each batch up to mode.chunk_rows (a bigger one runs in chunks of that
    many), 1 for single_stream and server, multi_stream's samples per query."""
    k, names = _mode_knobs("benchmark"), set(scenarios.strip("[]").split(","))
    shapes = {min(b, k["chunk_rows"]) for b in batches} | ({1} if {"single_stream", "server"} & names else set())
    return len(shapes | ({k["samples_per_query"]} if "multi_stream" in names else set()))


def _mode_knobs(mode: str) -> dict:
    import yaml

    return yaml.safe_load((REPO / "conf" / "mode" / f"{mode}.yaml").read_text())


def energy_meter(device: str) -> str:
    """The energy meter energy.py would read on `device` ('' when none answers: no window is spent then)."""
    kind, _, index = device.partition(":")
    try:
        return energy.meter_for(SimpleNamespace(type=kind, index=int(index or 0))).name
    except energy.NotMeasured:
        return ""


def fixtures(folder: Path | None) -> list[Path]:
    """The genuine policies' ONNX files, one per shape; an absent folder or shape is an error (SystemExit 2)."""
    if folder is None:
        return []
    if not folder.is_dir():
        raise SystemExit(f"error: no fixture folder {folder}: run `bash ../shared/device/prepare.sh` from the project "
                         "root first (it fills .fx/), or pass --no-fixtures to run without the genuine policies")
    found = []
    for shape in SHAPES:
        onnx = sorted((folder / shape).glob("*.onnx"))
        if not onnx:
            raise SystemExit(f"error: {folder / shape} has no .onnx: the fixture folder is incomplete (expected "
                             f"{', '.join(SHAPES)}); rerun prepare.sh or pass --no-fixtures")
        found.append(onnx[0].resolve())
    return found


def plan(device: str, quick: bool, onnx: list[Path], metered: bool = False) -> list[Step]:
    """Every step, device points first, the CPU's benchmark last. `modes`: the verdict modes, device then CPU, every
    dtype, in one process. `benchmark`: one job times every backend over the ladder (their ratios from one run) and
    runs LoadGen and the control loop on graphs; `loadgen` runs them on compile (batch 64 and 1 only). `metered`: the
    device has an energy meter, so `benchmark`'s energy windows are budgeted."""
    from huggy_exp.config import BACKENDS  # the schema: omegaconf, no torch
    cfg = QUICK if quick else FULL
    dtypes, ladder, bench = cfg["dtypes"], cfg["ladder"], cfg["bench"]
    devices = device if device == "cpu" else f"{device},cpu"  # Hydra runs a sweep's values in the order given
    per = len(devices.split(",")) * len(dtypes.split(","))
    calls = 2 * sum(int(_mode_knobs(m)["steps"]) for m in ("fingerprint", "stats"))  # the device's and the reference's
    # the device first: Hydra's product runs the first override's values outermost, so every device point of every mode
    # runs before the CPU's twins
    modes = Step("modes", [f"device={devices}", f"mode={MODES}", f"dtype={dtypes}", *(["obs.rows=16"] if quick else [])],
                 per * len(MODES.split(",")), per * calls * CALL_S, why=f"{per} x {calls} rollout calls x {CALL_S:g} s")

    def benchmark(name: str, where: str, backend: str, timed: list[str], batches: list[int], scenarios: str,
                  models: list[Path] = (), joules: bool | None = None) -> Step:
        """A benchmark sweep of `timed` and `backend` over `batches`, the scenarios on `backend`, one job a model.
        `joules`: None, energy off; False, on but no meter answers (it says why); True, measured and budgeted."""
        names, jobs = set(scenarios.strip("[]").split(",")), max(len(models), 1)
        points = sorted({*batches, *([1] if {"single_stream", "server"} & names else [])})
        k = {**bench, "energy": joules is not None, **(ENERGY if joules is not None else {})}
        knobs = [f"mode.{key}={str(v).lower()}" for key, v in k.items()] + (["obs.rows=16"] if quick else [])
        t, why = benchmark_minimum({**k, "energy": bool(joules)}, len({*timed, backend}), points, scenarios)
        args = ["mode=benchmark", f"device={where}", f"backend={backend}", f"mode.backends=[{','.join(timed)}]",
                f"mode.batch_sizes=[{','.join(map(str, batches))}]", "batch_size=64", f"mode.scenarios={scenarios}",
                *([f"model.onnx={','.join(map(str, models))}"] if models else []), *knobs]
        compiled = compiled_shapes(batches, scenarios) if any(BACKENDS[b].fixed_shape for b in {*timed, backend}) else 0
        return Step(name, args, jobs, t * jobs, compiled, why if jobs == 1 else f"per job: {why}")

    on_card = not quick and device != "cpu"
    steps = [modes, benchmark("benchmark", device, "graphs" if on_card else "eager",
                              ["eager", "compile", "graphs", "onnxruntime"] if on_card else ["eager", "onnxruntime"],
                              ladder, SCENARIOS, joules=metered)]
    if on_card:
        steps.append(benchmark("loadgen", device, "compile", ["eager"], [64], SCENARIOS))
    if onnx:
        steps.append(Step("fixtures-precision", ["mode=precision", f"device={device}", f"dtype={dtypes}",
                                                 f"model.onnx={','.join(map(str, onnx))}"], len(onnx) * len(dtypes.split(","))))
        steps.append(benchmark("fixtures-benchmark", device, "eager", ["eager", "onnxruntime"], [1, 64],
                               "[single_stream,offline,control_loop]", onnx))
    if device != "cpu":  # the same host's CPU beside the card: its ladder, single-stream latency and offline throughput;
        # the ladder up to 4 chunks of mode.chunk_rows: a bigger batch runs in chunks of that many, at the same cost a row
        cpu = [b for b in ladder if b <= 4 * _mode_knobs("benchmark")["chunk_rows"]]
        steps.append(benchmark("benchmark-cpu", "cpu", "eager", ["eager", "onnxruntime"], cpu, "[single_stream,offline]"))
    for step in steps:
        step.plan()
        step.device = device if device in device_values(step) else ""
    return steps


def device_values(step: Step) -> list[str]:
    return next(a.split("=", 1)[1].split(",") for a in step.args if a.startswith("device="))


def cap_s(step: Step, left_s: float) -> float:
    """The longest `step` may run with `left_s` left: its budget, less its kill and two packings; 0 (not run) when that
    leaves less than a sweep's start."""
    cap = min(step.budget_s, left_s - TERM_S - KILL_S - 2 * PACK_S)
    return cap if cap >= START_S else 0.0


def worst_case(steps: list[Step], total_s: float = TOTAL_S) -> tuple[list[float], float]:
    """Each step's cap when every step before it ran to its cap, was killed with the whole grace and packed; and the
    seconds the device call then lasts, setup included."""
    used, caps = PACK_S, []
    for step in steps:
        caps.append(cap_s(step, total_s - used))
        used += caps[-1] and caps[-1] + TERM_S + KILL_S + PACK_S
    return caps, SETUP_S + used + PACK_S


def run_step(step: Step, python: list[str], out: Path, cap: float) -> None:
    """One sweep within `cap` seconds (killed past it: exit 124)."""
    cmd = [*python, "run.py", "-m", "tracking=none", *step.args, f"hydra.sweep.dir={out / step.name}"]
    started, cpu, load = time.monotonic(), _children_cpu_s(), os.getloadavg()[0]
    with open(out / f"{step.name}.log", "w") as log:
        log.write(" ".join(shlex.quote(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            step.rc = proc.wait(timeout=max(cap, 1))
        except subprocess.TimeoutExpired:
            _kill(proc)
            step.rc = 124
    step.took_s, step.cpu_s = time.monotonic() - started, _children_cpu_s() - cpu
    step.load = f"{load:.1f}-{os.getloadavg()[0]:.1f}"
    step.rows = rows(out / step.name)


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children."""
    return sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])  # ru_utime, ru_stime


def rows(folder: Path) -> list[dict]:
    """The sweep's rows from its summary.json, or (stopped at its cap) from each finished point's result.json."""
    summary = folder / "summary.json"
    if summary.is_file():
        return json.loads(summary.read_text())["rows"]
    found = []
    for path in sorted(folder.glob("*/result.json"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0):
        r = json.loads(path.read_text())
        note = r.get("reason") or r.get("headline") or ""
        found.append({"job": path.parent.name, "run_name": r["run_name"], "status": r["status"], "note": note,
                      "mode": r["mode"], "device": r["device"], "dtype": r["dtype"],
                      "precision_mode": r.get("precision_mode", "ieee"),
                      "line": f"{path.parent.name:>3} {r['run_name']:<32} {r['status'].upper():<7} {note}"})
    return found


def _kill(proc: subprocess.Popen) -> None:
    """The sweep's process group: SIGTERM, then SIGKILL TERM_S later."""
    for sig, grace in ((signal.SIGTERM, TERM_S), (signal.SIGKILL, KILL_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
            return


def on_device(step: Step) -> list[dict]:
    return [r for r in step.rows if (r["device"] == "cpu") == (step.device == "cpu")]


def absent(step: Step) -> str:
    """Why a step that had to run points on the device ran none there ('' when it ran one)."""
    mine = on_device(step)
    if not step.device or step.rc is None or any(r["status"] != "skipped" for r in mine):
        return ""
    first = next((r for r in mine if r.get("note")), None)
    return f"no {step.device} point ran" + (f": {len(mine)} skipped, e.g. job {first['job']}: {first['note']}" if first
                                             else f": {len(mine)} skipped" if mine else "")


def failures(step: Step) -> list[str]:
    """What went wrong on the device in a step, first first: not run; device points that failed where their CPU twin
    did not; its cap ran out or it crashed; no point run on the device."""
    if step.note:
        return [step.note]
    bad = [f"job {r['job']} {r['run_name']} {r['status'].upper()}: {r.get('note') or ''}".rstrip(": ")
           for r in step.rows if r["status"] in ("failed", "error") and not _cpu_too(r, step.rows)]
    if step.rc == 124:
        bad.append(f"stopped at its cap of {step.budget_s:.0f} s")
    elif step.rc and not step.rows:
        bad.append(f"exit {step.rc} with no summary: see {step.name}.log")
    return bad + ([absent(step)] if absent(step) else [])


def _cpu_too(row: dict, rows: list[dict]) -> bool:
    """A point whose CPU twin (same mode, dtype, precision mode) failed as well: the policy's verdict, not the device's."""
    twin = [r for r in rows if r["device"] == "cpu" and r["mode"] == row["mode"] and r["dtype"] == row["dtype"]
            and r.get("precision_mode") == row.get("precision_mode")]
    return bool(twin) and all(r["status"] == row["status"] for r in twin)


def shared(step: Step) -> list[str]:
    """Points that failed on the device and on the CPU alike (a dtype's limit the policy misses everywhere)."""
    return [f"job {r['job']} {r['run_name']} {r['status'].upper()} on the cpu too: {r.get('note') or ''}".rstrip(": ")
            for r in step.rows if r["status"] in ("failed", "error") and r["device"] != "cpu" and _cpu_too(r, step.rows)]


def verdict(steps: list[Step]) -> str:
    """SUMMARY.md's first line: incomplete while a step is to run, then the first failure, or passed."""
    pending = [s for s in steps if s.rc is None and not s.note]
    first = next(((s, f) for s in steps for f in failures(s)[:1]), None)
    failed = f"step `{first[0].name}`: {first[1]}" if first else ""
    if pending:
        done = sum(s.rc is not None for s in steps)
        return (f"**incomplete**: {done} of {len(steps)} step(s) finished, `{pending[0].name}` next (rewritten after each "
                f"step: a call cut short returns the steps it finished)" + (f"; first failure: {failed}" if first else ""))
    alike = sum(len(shared(s)) for s in steps)
    return (f"**FAILED**: {failed}" if first else
            f"**passed**: {len(steps)} step(s), every device point met its verdict or fails on the cpu alike"
            + (f" ({alike} point(s): listed under their step)" if alike else ""))


def summary(device: str, steps: list[Step], out: Path, quick: bool, started: float) -> str:
    lines = [f"# accelerator check: {device} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             verdict(steps), "", f"{_torch_version()}; {time.monotonic() - started:.0f} s in all{', --quick' if quick else ''}",
             "", "| step | budget s | took s | cpu s | load | exit | passed | failed | skipped | error |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in steps:
        tally = {k: sum(r["status"] == k for r in s.rows) for k in ("passed", "failed", "skipped", "error")}
        took = (f"{s.took_s:.0f} | {s.cpu_s:.0f} | {s.load}" if s.rc is not None else
                "not run | | " if s.note else "pending | | ")
        lines.append(f"| {s.name} | {s.budget_s:.0f} | {took} | {s.rc if s.rc is not None else ''} | "
                     + " | ".join(str(tally[k]) for k in ("passed", "failed", "skipped", "error")) + " |")
    for s in steps:
        if s.rc is None:
            lines += ["", f"## {s.name}", "", f"- {s.note}"] if s.note else []
            continue
        lines += ["", f"## {s.name}", "", f"`{s.shown()}`", "", "`python run.py -m tracking=none " + " ".join(s.args) + "`", ""]
        lines += [f"- FIRST: {f}" if i == 0 else f"- {f}" for i, f in enumerate(failures(s))]
        lines += [f"- {f} (the policy's, not the device's)" for f in shared(s)]
        lines += [f"    {r['line']}" for r in s.rows]
        if not s.rows:
            tail = (out / f"{s.name}.log").read_text(errors="replace").splitlines()[-8:]
            lines += ["", "log tail:", "", *(f"    {t}" for t in tail)]
    return "\n".join(lines) + "\n"


def _torch_version() -> str:
    try:
        return f"torch {metadata.version('torch')}"  # not `import torch`: seconds, for one line
    except metadata.PackageNotFoundError:
        return "torch not installed here"


def claim_outputs(outdir: Path, tar: Path | None) -> tuple[Path, Path | None]:
    """OUTDIR by run.py's rules (new or empty, not in a claimed folder), claimed by creating its SUMMARY.md (run.py's
    claim file would make the steps' sweeps another run's); the archive and the SUMMARY.md beside it as new files."""
    out = check_unused(outdir, "OUTDIR")
    owner = next((parent for parent in out.parents if (parent / CLAIM).is_file()), None)
    if owner is not None:
        raise UserError(f"OUTDIR={outdir} is inside {owner}, which {folder_in_use(owner)}; {REFUSED}")
    if tar is not None:
        archive = tar.expanduser().absolute()
        if archive.resolve().is_relative_to(out.resolve()):
            raise UserError(f"--tar {tar} is inside OUTDIR {outdir}: the archive would pack itself; put it elsewhere")
        for path in (archive, archive.parent / "SUMMARY.md"):
            if path.exists() or path.is_symlink():
                raise UserError(f"--tar {tar}: {path} already exists; refused to replace it: choose another place")
        tar = archive
    try:
        atomic_write_text(out / "SUMMARY.md", "# accelerator check: starting\n", overwrite=False)
    except UserError:
        raise UserError(f"OUTDIR={outdir} was taken by another check first; {REFUSED}") from None
    return out, tar


def publish(out: Path, tar: Path | None, text: str) -> None:
    """SUMMARY.md, and with --tar the archive and SUMMARY.md beside it, each replaced atomically: a call cut at any
    moment returns the last archive whole."""
    atomic_write_text(out / "SUMMARY.md", text)
    if tar is not None:
        def pack(tmp: str) -> None:
            with tarfile.open(tmp, "w:gz", compresslevel=1) as archive:  # 6 or 9: 2-5x the time, 3 % smaller
                archive.add(out, arcname=out.name)

        atomic_write(tar, pack)
        atomic_write_text(tar.parent / "SUMMARY.md", text)


def arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device")
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--tar", type=Path, help="pack OUTDIR into this new .tgz after every step, SUMMARY.md beside it")
    parser.add_argument("--fixtures", type=Path, default=REPO / ".fx", help="the fixture folder (default .fx/)")
    parser.add_argument("--no-fixtures", action="store_true", help="run without the genuine policies")
    parser.add_argument("--quick", action="store_true", help="two batch sizes, fp32 and bf16, millisecond runs")
    parser.add_argument("--python", default=sys.executable, help="the command that runs run.py (default: this Python)")
    parser.add_argument("--total-s", type=float, default=TOTAL_S,
                        help=f"the whole run, kills and packing included (default {TOTAL_S:g})")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|(cuda|npu)(:\d+)?", args.device):
        raise UserError(f"unknown DEVICE {args.device!r}; valid: cpu, cuda, cuda:N, npu, npu:N")
    if not math.isfinite(args.total_s) or args.total_s <= 0:
        raise UserError(f"--total-s {args.total_s:g}: the run's seconds must be a finite number above 0 (default {TOTAL_S:g})")
    return args


def run(args: argparse.Namespace, steps: list[Step], out: Path, tar: Path | None) -> None:
    """Each step within its cap, the summary and archive rewritten after each; a step that finds the device absent
    ends the run (the rest would skip as well)."""
    started = time.monotonic()
    _, worst = worst_case(steps, args.total_s)
    print(f"plan: {len(steps)} steps, {sum(s.budget_s for s in steps) / SLACK:.0f} s expected (each step's budget: "
          f"{SLACK:g} x its own); at worst {worst:.0f} s of the device call's {DEVICE_CALL_S:g} (setup {SETUP_S:g} s, "
          f"every step to its cap, killed and packed: within {args.total_s:.0f} s here)", flush=True)
    publish(out, tar, summary(args.device, steps, out, args.quick, started))
    for i, step in enumerate(steps):
        left = args.total_s - (time.monotonic() - started)
        cap = cap_s(step, left)
        if step.note or not cap:
            step.note = step.note or f"not run: {max(left, 0):.0f} s left of --total-s {args.total_s:g}"
            print(f"{step.name}: {step.note}", flush=True)
            continue
        print(step.shown() + ("" if cap == step.budget_s else f"; capped at {cap:.0f} s: what is left"), flush=True)
        run_step(step, shlex.split(args.python), out, cap)
        print(f"{step.name}: exit {step.rc} in {step.took_s:.0f} s ({step.cpu_s:.0f} s cpu, load {step.load})", flush=True)
        if on_device(step) and absent(step):
            for later in steps[i + 1:]:
                later.note = f"not run: {absent(step)} in step `{step.name}`"
        if any(later.rc is None and not later.note for later in steps[i + 1:]):  # else the final summary follows at once
            publish(out, tar, summary(args.device, steps, out, args.quick, started))
    publish(out, tar, summary(args.device, steps, out, args.quick, started))


def main(argv: list[str]) -> int:
    try:
        args = arguments(argv)
        onnx = [] if args.no_fixtures else fixtures(args.fixtures)
        out, tar = claim_outputs(args.outdir, args.tar)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # fixtures(): its message
        print(exc, file=sys.stderr)
        return 2
    meter = energy_meter(args.device)
    print(f"energy: {f'measured in step `benchmark` ({meter})' if meter else f'no meter on {args.device}: not measured'}")
    steps = plan(args.device, args.quick, onnx, bool(meter))
    run(args, steps, out, tar)
    text = (out / "SUMMARY.md").read_text()
    print(text.splitlines()[2])
    print(f"summary: {out / 'SUMMARY.md'}" + (f"; everything: {tar}" if tar else ""))
    return next((s.rc or 1 for s in steps if failures(s)), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
