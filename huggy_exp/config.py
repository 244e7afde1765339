"""The config schema, once: types (Hydra structured configs in the ConfigStore), ranges and choices (field metadata).

conf/*.yaml hold the values and their comments; each extends its schema (`/schema/<group>/<name>@_here_`), so
Hydra refuses a wrong type while composing. `validate` then checks what composition lets through: `+`-added
unknown keys, ranges, choices, finite numbers. Every failure is one line naming the key and what is valid.
The ground floor: it imports nothing of huggy_exp but errors (the command line and host checks: preflight.py).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, ClassVar, Dict, List, NamedTuple, Optional, Tuple, get_args, get_origin, get_type_hints

from omegaconf import MISSING, DictConfig, OmegaConf

from huggy_exp.errors import UserError

DEVICE_KINDS = ("cpu", "cuda", "npu", "mps")  # what `device` names before `:<index>`; `specialize` entries are <kind>_<dtype>


@dataclass(frozen=True)
class Dtype:
    """What a dtype is, declared once."""

    torch: str  # the torch dtype its layers compute in (placement.DTYPES)
    mantissa: int  # its number format for ULPs: mantissa bits and the least normal exponent
    emin: int
    ulp_standard: float  # msprobe's ULP standard: the share of elements above it is reported (verify.ulp)
    quantized: Optional[str] = None  # torchao's config of its Linear layers (placement.QUANTIZED, docs/verification.md)
    peer: Optional[str] = None  # the backend whose own quantization of the .onnx runs beside it (onnxruntime's W8A8)

    emulated_on_cpu = property(lambda self: self.torch == "float16")  # no CPU has fp16 matmul kernels: cpu_note
    fp32_math = property(lambda self: self.torch == "float32" and not self.quantized)  # precision_mode applies to it


# narrowest first, as a sweep's comparison lists them. int8 quantizes the activations per call and the weights per
# channel (W8A8, int8 GEMMs); int8w only the weights (dequantized into the float32 GEMM); both are float32 between their
# Linear layers, and count as bf16's 8 significant bits (7 and a sign per value, scaled per channel). A new dtype is a
# line here and its row of limits in conf/config.yaml (`verify.limits`).
DTYPES = {"int8": Dtype("float32", 7, -126, 1.0, "Int8DynamicActivationInt8WeightConfig", peer="onnxruntime"),
          "int8w": Dtype("float32", 7, -126, 1.0, "Int8WeightOnlyConfig"),
          "bf16": Dtype("bfloat16", 7, -126, 1.0),
          "fp16": Dtype("float16", 10, -14, 1.0),
          "fp32": Dtype("float32", 23, -126, 32.0),
          "fp64": Dtype("float64", 52, -1022, 32.0)}
DTYPE_NAMES = tuple(DTYPES)
ONNX_DTYPE = "fp32"  # ML-Agents' .onnx graphs (and export-onnx's) are float32
SWEEP_REFERENCE = "fp32"  # a sweep compares its points with the cpu point of this dtype on the same inputs


def cpu_note(dtype: str, kind: str) -> str:
    """Why a point's timing is capped ('' where it is not): a dtype the CPU emulates (Dtype.emulated_on_cpu)."""
    if kind != "cpu" or not DTYPES[dtype].emulated_on_cpu:
        return ""
    return (f"{dtype} on a CPU without {DTYPES[dtype].torch} matmul kernels is far slower than fp32 (emulated): its "
            "timing is capped and bounded")


@dataclass(frozen=True)
class Backend:
    """What a backend is, declared once (docs/backends-and-timing.md: its list there and the YAML comments come from
    it). What runs it, by dotted path: a torch backend's `forward`, or another engine's `runner`."""

    name: str
    help: str
    forward: Optional[str] = None  # a `(policy, target) -> (forward, sample)` builder; None: Policy.act, every shape
    runner: Optional[str] = None  # `(ctx, target, batch, threads, provider, onnx) -> Runner`, running the .onnx graph
    graph: Optional[str] = None  # that graph's dtype
    fixed_shape: bool = False  # it runs one chunk shape (the last chunk padded)
    devices: Tuple[str, ...] = DEVICE_KINDS  # the device kinds it runs
    dtypes: Optional[Tuple[str, ...]] = None  # the dtypes it runs (None: all)
    quantized: bool = False  # it runs torchao's quantized layers
    reference: bool = False  # the point's reference: benchmark gates the others on it; its timing is the point's
    planless: str = ""  # why it cannot run a precision plan (conf/plan/): such a point is skipped with this reason

    def runs_dtype(self, dtype: str) -> str:
        """The dtype it really runs for a point of `dtype`: the graph's own for a graph backend (fp32), except for a
        dtype whose peer it is (int8: onnxruntime's own int8 of the graph); a torch backend runs the point's."""
        return dtype if self.graph is None or DTYPES[dtype].peer == self.name else self.graph

    def refusal(self, dtype: str, kind: str) -> str:
        """Why it cannot run a point of `dtype` on a `kind` device ('' where it can): the gate runners.build reads."""
        ran, quantized = self.runs_dtype(dtype), DTYPES[dtype].quantized
        if ran != dtype:
            peers = "".join(f" or its own {d}" for d, t in DTYPES.items() if t.peer == self.name)
            return f"backend {self.name} runs the {ran} .onnx graph{peers}; dtype {dtype} does not apply"
        if quantized and not (self.quantized or self.graph):
            those = ", ".join(n for n, b in BACKENDS.items() if b.quantized)
            return f"dtype {dtype} (torchao int8) runs backend {those} only; backend {self.name} does not apply"
        if self.dtypes is not None and dtype not in self.dtypes or kind not in self.devices:
            return (f"backend {self.name} runs {'/'.join(self.dtypes or ())}{' ' if self.dtypes else ''}on "
                    f"{'/'.join(self.devices)} only; this job is {kind} {dtype}")
        return ""


BACKENDS = {b.name: b for b in (
    Backend("eager", "the policy in torch.inference_mode, every shape", quantized=True, reference=True),
    Backend("compile", "torch.compile: inductor with freezing, torchair on npu",
            forward="huggy_exp.runners.compiled", fixed_shape=True),
    Backend("fused", "one C++ kernel, CPU fp32, batch 1", forward="huggy_exp.runners.fused",
            devices=("cpu",), dtypes=("fp32",), planless="its one C++ kernel computes every layer in fp32"),
    Backend("graphs", "CUDA/NPU graph replay, cuda/npu only", forward="huggy_exp.runners.graphs",
            fixed_shape=True, devices=("cuda", "npu")),
    Backend("onnxruntime", "the fp32 .onnx on the device's provider; int8: its own quantization",
            runner="huggy_exp.runners.onnxruntime", graph=ONNX_DTYPE, devices=("cpu", "cuda", "npu"),
            planless="it runs the exported fp32 graph (or its own int8 quantization of it), one dtype throughout"))}
BACKEND_NAMES = tuple(BACKENDS)
REFERENCE_BACKEND = next(n for n, b in BACKENDS.items() if b.reference)
GRAPH_BACKENDS = tuple(n for n, b in BACKENDS.items() if b.graph)  # they run the .onnx graph, not the torch policy


def ran_dtype(backend: str, dtype: str) -> str:
    """The dtype `backend` really runs for a point of `dtype` (Backend.runs_dtype): every figure is labelled with it."""
    return BACKENDS[backend].runs_dtype(dtype)


P50_RATIO = ("eager", "onnxruntime")  # benchmark's first line: eager's p50 over onnxruntime's (headline eager_vs_ort)
PRECISION_MODES = ("ieee", "tf32", "hf32")  # fp32 math: IEEE fp32, TF32 (CUDA), HF32 (Ascend): placement.set_precision
# verify.limits has a row per dtype and one per reduced fp32 mode: fp32 computed in TF32 or HF32 (10 explicit mantissa
# bits in the matmul and convolution inputs, fp32's range and accumulation) is judged by its mode's row, not IEEE fp32's
LIMIT_ROWS = DTYPE_NAMES + tuple(m for m in PRECISION_MODES if m != "ieee")


def limit_row(dtype: str, precision_mode: str | None = "ieee") -> str:
    """The verify.limits row a point is judged by: its dtype's, or its mode's where fp32 runs in TF32 or HF32."""
    return precision_mode if dtype == "fp32" and precision_mode not in (None, "ieee") else dtype


def numerics_label(dtype: str, precision_mode: str | None = "ieee", plan: str | None = None) -> str:
    """What a point computes in, as run names and sweep comparisons show it: `fp32`, `fp32-tf32` off IEEE, or a
    precision plan's `plan:<name>`."""
    if plan is not None:
        return f"{PLAN_PREFIX}{plan}"
    return dtype if precision_mode in (None, "ieee") else f"{dtype}-{precision_mode}"


PLAN_PREFIX = "plan:"
VERDICTS = ("passed", "failed", "skipped", "error")
SCENARIOS = ("single_stream", "multi_stream", "offline", "server", "control_loop")  # mode=benchmark
OBS_SOURCES = ("random", "zeros", "extreme", "file")  # obs.source
STATS_SOURCES = ("dynamics", "replay")  # mode=stats: mode.source
LOOPS = ("open", "closed")  # mode=fingerprint: mode.loop
ACTION_KINDS = ("deterministic", "sampled")  # mode=fingerprint: mode.actions (rollout.Stepper)
MASKS = ("random", "feeds")  # onnx-compare, export-onnx: mode.masks
MAX_SEED = 2**62  # fingerprint and stats add the step to the seed; torch generators take < 2^64
MAX_BATCH = 2**24
FLOAT32_MAX = 3.4028234663852886e38  # observations are float32: a scale past it is inf in every row it draws
MAX_OBS_BYTES = 1 << 30  # 1 GiB of float32 observations (~4.5M Huggy rows); the random source needs ~3x that while drawing


def rule(default: Any = MISSING, *, lo: float | None = None, hi: float | None = None, choices: tuple = (),
         lo_open: bool = False, judges: bool = False):
    """A field with its legal range or choices (a list's: of each entry; checked by `validate`). `judges`: a mode knob
    that judges or times the outputs, never shapes them: points that differ only in it compare (compare.inputs_key)."""
    return field(default=default, metadata={"lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open, "judges": judges})


# --- metrics: what a run reports, declared once; producers write these paths, the headline and MLflow read them


class Metric(NamedTuple):
    """A metric: its path in result.json's `metrics` and MLflow (`{field}`: filled by `at` or by the headline: the output
    `stem`, the reference `ref`, a benchmark's `backend` and `batch`), its unit and what it means."""

    path: str
    unit: str
    means: str

    def at(self, **fields: object) -> "Metric":
        """This metric with some of its fields filled (`MAX_ABS.at(ref="fp64")`); a field it lacks is a KeyError."""
        if unknown := set(fields) - set(re.findall(r"\{(\w+)\}", self.path)):
            raise KeyError(f"{self.path} has no field {sorted(unknown)[0]}")
        return self._replace(path=re.sub(r"\{(\w+)\}", lambda m: str(fields.get(m[1], m[0])), self.path))


class Headline(NamedTuple):
    """A short figure a run shows first: the first of `of` that the job produced, divided by the first of `over` when
    given. Open fields: `stem` each output in verify.DECLARED's order, `batch` the job's timed batch (`top`: the largest
    timed), `backend` the fastest one there (headline.py fills them)."""

    of: Tuple[Metric, ...]
    over: Tuple[Metric, ...] = ()
    top: bool = False


_OUT = "{stem}/vs_{ref}/"  # the engine's per-output metrics (verify.Comparison.metrics)
MAX_ABS = Metric(_OUT + "max_abs", "output units", "largest |output - reference| of any element")
COSINE_MIN_ROW = Metric(_OUT + "cosine_min_row", "1", "the worst row's cosine similarity to the reference")
AGREEMENT = Metric(_OUT + "agreement", "share", "share of discrete actions equal to the reference's")
KL_MAX = Metric(_OUT + "kl_max", "nats", "the worst row's KL(point || reference) of the action distribution")
SHIFT_MAX = Metric(_OUT + "mean_shift_sigma_max", "σ", "the worst |Δμ| in the reference's standard deviations")
SQNR = Metric(_OUT + "sqnr_db", "dB", "10·log10(Σref² / Σ(ref - x)²); +inf: identical outputs")
ORT_INT8_KL = Metric("onnxruntime_int8/" + KL_MAX.path, "nats", "onnxruntime's own int8 of the .onnx: its worst KL")
LATENCY = Metric("latency/{stat}", "µs, obs/s", "the point's own timing at its batch (timing.py): p50_us, p99_us, obs_per_s")
ORT_INT8_P50 = Metric("onnxruntime_int8/latency/p50_us", "µs", "onnxruntime's int8 peer: median latency")
BACKEND_P50 = Metric("{backend}/b{batch}/p50_us", "µs", "benchmark: a backend's median latency at a batch")
BACKEND_P99 = Metric("{backend}/b{batch}/p99_us", "µs", "benchmark: a backend's 99th-percentile latency at a batch")
BACKEND_OBS = Metric("{backend}/b{batch}/obs_per_s", "obs/s", "benchmark: a backend's throughput at a batch")


def own(path: str, unit: str, means: str) -> Headline:
    """The headline of one metric a mode alone reports."""
    return Headline((Metric(path, unit, means),))


# --- groups


@dataclass
class ModelConf:
    checkpoint: Optional[str] = MISSING
    onnx: Optional[str] = MISSING
    results_dir: Optional[str] = MISSING
    hub_repo: Optional[str] = MISSING
    behavior: Optional[str] = MISSING
    step: Optional[int] = rule(lo=0)


@dataclass
class ObsConf:
    source: str = rule(choices=OBS_SOURCES)
    rows: int = rule(lo=1)
    scale: float = rule(lo=0, hi=FLOAT32_MAX)
    path: Optional[str] = MISSING


@dataclass
class PlanConf:
    """A precision plan (conf/plan/<name>.yaml, docs/precision-plans.md): a dtype per part of the policy; a part it
    leaves out runs in the point's dtype."""

    name: str = MISSING
    policy: Optional[str] = MISSING  # the policy shape it was made for (null: any with these parts)
    limits: Optional[str] = rule(None, choices=DTYPE_NAMES)  # whose limits judge it (null: the lowest dtype it runs)
    parts: Optional[Dict[str, str]] = MISSING  # mode=precision's names: hidden_<i>, lstm, mu, logits; null: no plan


@dataclass
class TrackingConf:
    enabled: bool = MISSING
    uri: Optional[str] = MISSING
    experiment: Optional[str] = MISSING
    http_retries: int = rule(lo=0, hi=10)
    http_timeout_s: int = rule(lo=0, hi=600)
    user: Optional[str] = None
    ui_port: int = rule(lo=1, hi=65535)


@dataclass
class Dynamics:
    decay: float = rule(lo=0, hi=1)
    gain: float = MISSING
    noise: float = rule(lo=0)


# --- modes: one schema per conf/mode/<name>.yaml


class Allocation(NamedTuple):
    """Memory a job's own values size: bytes, what they hold, the keys that size them; `drawn` of its rows come from the
    observation source (held to MAX_OBS_BYTES)."""

    bytes: int
    what: str
    keys: str
    drawn: int = 0


class RowBytes(NamedTuple):
    """What one row of the policy costs a job (memory.job_allocations measures it from the weights)."""

    feed: int  # a row drawn (float64), kept (float32), its outputs compared
    forward: int  # one row through a runner and the fp64 reference
    io: int  # a row's float32 inputs and outputs


@dataclass
class ModeConf:
    """A mode, declared once: its knobs (the fields, conf/mode/<name>.yaml holds their values) and its traits (class
    variables), which every other module reads. A new mode is a new subclass here: nothing to register."""

    _target_: str = MISSING
    name: ClassVar[str] = ""
    runs_policy: ClassVar[bool] = True  # loads and runs the policy (false: no memory pre-check)
    timed: ClassVar[bool] = True  # reports latency: a timed CPU point holds its Ray node alone; beside other jobs, tagged
    verified: ClassVar[bool] = True  # judged against CPU fp64: its points choose a sweep's recommended dtype
    headline: ClassVar[Dict[str, Headline]] = {}  # short name -> the metrics it copies (tests/test_metrics.py: produced)
    per_batch: ClassVar[bool] = False  # verifies (and fingerprints) the job's batch of rows, not every observation row
    not_logged: ClassVar[Tuple[str, ...]] = ()  # headline names MLflow does not get as `answer/<name>`
    # the headline names that answer the mode's own question (logged as `answer/<name>`), first on the runs page after
    # the verdict and in the run's first chart section: where a verified point's error, cosine and p50 do not
    first_screen: ClassVar[Tuple[str, ...]] = ()
    reads_store: ClassVar[bool] = False  # serves an existing tracking store: a store that does not exist is refused

    @classmethod
    def is_task(cls) -> bool:
        """Whether Hydra instantiates a task class (sync and ui are run.py's own, `_target_: null`)."""
        return cls._target_ is not None

    @classmethod
    def allocations(cls, cfg: dict, row: RowBytes) -> list[Allocation]:
        """What the mode's own knobs allocate beyond a batch and the observations (`cfg`: the job's plain config)."""
        return []

    @classmethod
    def host_needs(cls, knobs: dict) -> dict[str, str]:
        """The Python modules its knobs need on this host, each with why and how to install it: preflight refuses the
        job in one line before any runs when one does not import."""
        return {}


@dataclass
class OfflineMode(ModeConf):
    """A mode that never runs the policy: nothing timed, nothing verified (info, checkpoints, diff, sync, ui)."""

    runs_policy = False
    timed = False
    verified = False


@dataclass
class ActionMode(ModeConf):
    name = "action"
    headline = {"act_mean": own("action_mean", "action units", "mean of every action"),
                "act_std": own("action_std", "action units", "std of every action")}


@dataclass
class SampleMode(ActionMode):
    name = "sample"


@dataclass
class InfoMode(OfflineMode):
    name = "info"
    headline = {
        "parameters": own("parameters", "count", "the policy's parameters"),
        "fp16_overflow_dims": own("fp16_overflow_dims", "count", "normalizer dimensions whose variance overflows fp16")}


@dataclass
class CheckpointsMode(OfflineMode):
    name = "checkpoints"
    headline = {"checkpoints": own("checkpoints", "count", "checkpoints in the results folder"),
                "best_reward": own("best_reward", "reward", "the best checkpoint's reward")}


@dataclass
class Threshold:
    max_abs: float = rule(lo=0)
    cosine_min: float = rule(lo=-1, hi=1)
    margin: float = rule(lo=0)  # discrete: a flip fails where fp64's top-1 minus top-2 masked logit exceeds margin x max(1, |best|)
    rtol: float = rule(lo=0)
    kl_max: float = rule(lo=0)  # policy units: the worst row's KL(point || fp64) of the action distribution, nats
    mean_shift_max: float = rule(lo=0)  # policy units: the worst |Δμ| / σ (σ: the policy's own std, fp64's)
    batch_max_abs: float = rule(lo=0)  # mode=batch: max |batched - single-row| (int8's per-row scales: bit-identical)
    layer_rel_rmse: float = rule(lo=0)  # mode=precision: each layer's RMSE / RMS of fp64's layer


# the one per-dtype table, every mode's limits (docs/verification.md): a row per dtype and per reduced fp32 mode
# (LIMIT_ROWS), each required (a row left out is `missing key verify.limits.bf16` at load, never a default)
Thresholds = make_dataclass("Thresholds", [(d, Threshold, field(default=MISSING)) for d in LIMIT_ROWS])


@dataclass
class VerifyConf:
    limits: Thresholds = MISSING
    specialize: Dict[str, Any] = MISSING
    rel_floor: float = rule(lo=0, lo_open=True)
    decimals: int = rule(lo=0, hi=9)


@dataclass
class Relative:
    warn: float = rule(lo=0)
    fail: float = rule(lo=0)


@dataclass
class BatchMode(ModeConf):
    name = "batch"
    headline = {
        "invariance_max": own("batch_invariance_max_abs", "output units", "max |batched - single-row| of any output"),
        "rows_identical": own("rows_bit_identical", "share", "rows whose batched outputs equal single-row ones bit for bit"),
        "rows_per_s": own("batched_rows_per_s", "rows/s", "throughput in batches")}
    budget_s: float = rule(lo=0, hi=600, lo_open=True, judges=True)


@dataclass
class BenchmarkMode(ModeConf):
    name = "benchmark"
    per_batch = True
    not_logged = ("p50_us", "p99_us", "ort_p50_us", "eager_vs_ort", "obs_per_s",
                  "loop_hz_max")  # logged per backend at the job's batch instead
    # with LoadGen's scenarios or the control loop: VALID/INVALID, the server's highest QPS, the deadline-miss rate
    first_screen = ("server_valid", "server_qps", "miss_rate")
    # at the job's own batch size (a ladder without it: its largest): eager's and onnxruntime's p50 and `eager_vs_ort` =
    # eager p50 / onnxruntime p50 (> 1: torch is slower); throughput at the largest batch timed; the LoadGen server's
    # highest QPS under its p99 bound, the control loop's miss rate and highest rate; the fastest backend's (`best_`)
    headline = {
        "p50_us": Headline((BACKEND_P50.at(backend="eager"),)), "p99_us": Headline((BACKEND_P99.at(backend="eager"),)),
        "ort_p50_us": Headline((BACKEND_P50.at(backend="onnxruntime"),)),
        "eager_vs_ort": Headline((BACKEND_P50.at(backend="eager"),), over=(BACKEND_P50.at(backend="onnxruntime"),)),
        "obs_per_s": Headline((BACKEND_OBS.at(backend="eager"),), top=True),
        "server_valid": own("loadgen/server/valid", "1/0", "LoadGen server: VALID (1) or INVALID (0)"),
        "server_qps": own("loadgen/server/max_qps", "queries/s", "LoadGen server: highest QPS within its p99 bound"),
        "miss_rate": own("control_loop/miss_rate", "share", "control loop: ticks that missed their deadline"),
        "loop_hz_max": own("control_loop/max_rate_hz", "Hz", "control loop: highest rate within mode.max_miss_rate"),
        "best_p50_us": Headline((BACKEND_P50,)), "best_obs_per_s": Headline((BACKEND_OBS,))}
    backends: List[str] = rule(choices=BACKEND_NAMES)
    batch_sizes: Optional[List[int]] = MISSING
    scenarios: List[str] = rule(choices=SCENARIOS)
    rounds: int = rule(lo=1, hi=1000)
    budget_s: float = rule(lo=0, hi=3600, lo_open=True, judges=True)
    warmup_s: float = rule(lo=0, hi=600)
    settle_s: float = rule(lo=0, hi=60)
    energy: bool = MISSING
    energy_window_s: float = rule(lo=5, hi=600)  # energy counters tick every ~100 ms: a shorter window is their noise
    energy_idle_s: float = rule(lo=0.5, hi=60)
    chunk_rows: int = rule(lo=1, hi=MAX_BATCH)
    fp16_cpu_max_rows: int = rule(lo=1, hi=MAX_BATCH)
    fp16_cpu_samples: int = rule(lo=1, hi=1_000_000)
    qsl_samples: int = rule(lo=1, hi=1_000_000)
    min_duration_ms: Optional[int] = rule(None, lo=1, hi=3_600_000)
    max_duration_ms: int = rule(lo=1, hi=3_600_000)
    min_query_count: int = rule(lo=1, hi=10_000_000)
    samples_per_query: int = rule(lo=1, hi=65_536)
    check_samples: int = rule(lo=0, hi=1_000_000)
    target_qps: float = rule(lo=0, hi=10_000_000, lo_open=True)
    latency_bound_ms: float = rule(lo=0, hi=3_600_000, lo_open=True)
    search_steps: int = rule(lo=0, hi=30)
    search_ms: int = rule(lo=1, hi=600_000)
    rate_hz: float = rule(lo=0, hi=100_000, lo_open=True)  # 10 µs a tick: beyond that no Python loop keeps time
    duration_s: float = rule(lo=0, hi=3600, lo_open=True)
    max_miss_rate: float = rule(lo=0, hi=1)
    confidence: float = rule(lo=0, hi=1, lo_open=True, judges=True)
    loop_search_s: float = rule(lo=0, hi=600, lo_open=True)

    @classmethod
    def host_needs(cls, knobs: dict) -> dict[str, str]:
        """MLPerf LoadGen for its LoadGen scenarios (the control loop is LoadGen-free)."""
        wanted = [s for s in knobs["scenarios"] if s != "control_loop"]
        return {"mlperf_loadgen": f"mode.scenarios {wanted} run on MLPerf LoadGen: {LOADGEN_INSTALL}"} if wanted else {}

    @classmethod
    def allocations(cls, cfg: dict, row: RowBytes) -> list[Allocation]:
        """The ladder's largest batch; LoadGen's server schedule (target_qps x its run: min_duration_ms, else budget_s);
        the control loop's per-tick record (rate_hz x duration_s)."""
        knobs = cfg["mode"]
        ladder = knobs.get("batch_sizes") or [cfg["batch_size"]]
        top = max(int(b) for b in ladder)
        out = [Allocation(top * (row.feed + row.forward), f"the benchmark's largest batch ({top:,} rows)",
                          f"mode.batch_sizes={ladder}")]
        out += cls._loadgen_allocations(knobs)
        if "control_loop" in knobs["scenarios"]:
            ticks = int(knobs["rate_hz"] * knobs["duration_s"])
            out.append(Allocation(ticks * TICK_BYTES, f"the control loop's record of {ticks:,} ticks",
                                  f"mode.rate_hz={knobs['rate_hz']} × mode.duration_s={knobs['duration_s']}"))
        return out

    @staticmethod
    def _loadgen_allocations(knobs: dict) -> list[Allocation]:
        """What LoadGen generates for each scenario asked before it issues a query, as far as the knobs alone decide it
        (loadgen.Settings.check_schedule adds the measured rate before each run), and its accuracy run's one query."""
        duration = (f"mode.min_duration_ms={knobs['min_duration_ms']}" if knobs.get("min_duration_ms")
                    else f"mode.budget_s={knobs['budget_s']}")
        seconds, least = (knobs.get("min_duration_ms") or knobs["budget_s"] * 1e3) / 1e3, int(knobs["min_query_count"])
        out = []
        for scenario in [s for s in knobs["scenarios"] if s != "control_loop"]:
            per_query = int(knobs["samples_per_query"]) if scenario == "multi_stream" else 1
            rate = float(knobs["target_qps"]) if scenario == "server" else 0.0
            queries, samples, need = loadgen_schedule(scenario, seconds, least, per_query, rate)
            keys = (f"mode.target_qps={knobs['target_qps']} × {duration}" if rate * seconds >= least else
                    f"mode.samples_per_query={per_query} × mode.min_query_count={least}" if per_query > 1 else
                    f"mode.min_query_count={least}")
            out.append(Allocation(need, f"LoadGen's {scenario} schedule of {queries:,} queries"
                                  + (f" ({samples:,} samples)" if samples != queries else ""), keys))
        if out:
            samples = int(knobs["qsl_samples"])
            out.append(Allocation(samples * LOADGEN_QUERY_BYTES, f"LoadGen's accuracy run of {samples:,} samples",
                                  f"mode.qsl_samples={samples}"))
        return out


LOADGEN_INSTALL = "pip install mlcommons-loadgen==6.0.17"
LOADGEN_QUERY_BYTES = 512  # LoadGen's schedule and record of one query (measured: 360-390 B at 0.4-0.8 M queries), or
# of one sample of an offline query (its Python object in the issue callback: 480 B measured at 0.4 M samples)
LOADGEN_SAMPLE_BYTES = 64  # each further sample of a multi_stream query (measured: 50-53 B at 0.8-1.3 M samples)
MULTI_STREAM_MIN_QUERIES = 662  # LoadGen's early stopping cannot conclude on fewer MultiStream queries (mlperf.conf)


def loadgen_schedule(scenario: str, seconds: float, least: int, per_query: int, rate: float) -> tuple[int, int, int]:
    """(queries, samples, bytes) LoadGen generates before it issues a query (its GenerateQueries): queries at `rate` a second
    for twice the run's `seconds` (server: once), at least `least` (multi_stream: its early-stopping minimum too),
    `per_query` samples each; offline: one query of 1.1 x seconds x rate samples, at least `least`. `rate` 0: what the
    knobs alone decide."""
    if scenario == "offline":
        samples = max(least, int(1.1 * seconds * rate))
        return 1, samples, samples * LOADGEN_QUERY_BYTES
    floor = max(least, MULTI_STREAM_MIN_QUERIES if scenario == "multi_stream" else 0)
    queries = max(floor, int((1 if scenario == "server" else 2) * seconds * rate))
    return queries, queries * per_query, queries * (LOADGEN_QUERY_BYTES + (per_query - 1) * LOADGEN_SAMPLE_BYTES)
TICK_BYTES = 64  # the control loop's per-tick record: latency, compute and wake (float64) and their derived copies


@dataclass
class ExportOnnxMode(ModeConf):
    name = "export-onnx"
    timed = False
    verified = False
    headline = {
        "max_abs_vs_torch": Headline((MAX_ABS.at(ref="torch"),)),
        "src_identical": own("graph/vs_source/bit_identical", "1/0", "the export equals the source .onnx's outputs")}
    path: Optional[str] = rule(judges=True)
    opset: int = rule(lo=7, hi=21, judges=True)
    atol: float = rule(lo=0, judges=True)
    masks: str = rule(choices=MASKS)
    overwrite: bool = False


@dataclass
class FingerprintMode(ModeConf):
    name = "fingerprint"
    headline = {"fp_match": own("matches_cpu_fp32", "1/0", "fingerprint equal to CPU fp32's"),
                "fp_qmatch": own("quantized_matches_cpu_fp32", "1/0", "quantized fingerprint equal to CPU fp32's")}
    steps: int = rule(lo=1, hi=1_000_000)
    loop: str = rule(choices=LOOPS)
    actions: str = rule(choices=ACTION_KINDS)
    envs: int = rule(lo=1, hi=1_000_000)
    decimals: int = rule(lo=0, hi=9, judges=True)
    require_match: List[str] = rule(choices=DTYPE_NAMES, judges=True)
    dynamics: Dynamics = MISSING

    @classmethod
    def allocations(cls, cfg: dict, row: RowBytes) -> list[Allocation]:
        return rollout_rows(cfg, row, drawn=cfg["mode"]["loop"] == "open" and cfg["obs"]["source"] != "file")


@dataclass
class OnnxCompareMode(ModeConf):
    name = "onnx-compare"
    headline = {
        "max_abs_vs_ort": Headline((MAX_ABS.at(ref="onnxruntime"),)),
        "sampled_z": own("sampled/mean_z_max", "z", "sampled actions: the largest |z| of a mean against the reference's")}
    provider: str = rule(judges=True)
    sample_rows: int = rule(lo=1, hi=100_000)
    samples: int = rule(lo=2, hi=1_000_000)
    confidence: float = rule(lo=0, hi=1, lo_open=True, judges=True)
    rel_floor: float = rule(lo=0, lo_open=True, judges=True)
    masks: str = rule(choices=MASKS)

    @classmethod
    def allocations(cls, cfg: dict, row: RowBytes) -> list[Allocation]:
        rows = int(cfg["mode"]["sample_rows"]) * int(cfg["mode"]["samples"])
        return [Allocation(rows * row.io * 3, f"{rows:,} tiled rows of sampled draws",
                           f"mode.sample_rows={cfg['mode']['sample_rows']} × mode.samples={cfg['mode']['samples']}")]


@dataclass
class PrecisionMode(ModeConf):
    name = "precision"
    headline = {"rel_ratio": own("relative/ratio", "ratio", "the device's RMSE vs fp64 over the CPU's in the same dtype")}
    relative: Relative = rule(judges=True)


@dataclass
class SearchMode(ModeConf):
    """The cheapest precision plan that passes every limit on one observation split, re-judged on another
    (docs/precision-plans.md)."""

    name = "search"
    verified = False  # its points are plans under trial, not a sweep's choices: mode=precision judges one
    headline = {
        "kept_fp32": own("search/kept_fp32", "parts", "parts of the plan found that stay in fp32"),
        "low_share": own("search/low_flops_share", "1", "share of the policy's FLOPs the plan runs in a low dtype"),
        "evaluations": own("search/evaluations", "plans", "plans judged on the search split to find it"),
        "held_out": own("search/held_out_passed", "1 = yes", "the plan passes the held-out split too (0: overfit)"),
        "plan_p50_us": own("search/plan_p50_us", "µs", "the plan's p50 latency at the job's batch size")}
    candidates: Optional[List[str]] = rule(choices=DTYPE_NAMES)
    save_as: Optional[str] = MISSING


@dataclass
class StatsMode(ModeConf):
    name = "stats"
    headline = {"drift_max": own("drift_max", "action units", "the largest |action - CPU fp32's| over the rollout"),
                "saturation": own("saturation_rate", "share", "actions at or beyond mode.saturation"),
                "smoothness": own("smoothness", "action units", "mean |action change| between steps")}
    steps: int = rule(lo=1, hi=1_000_000)
    envs: int = rule(lo=1, hi=1_000_000)
    source: str = rule(choices=STATS_SOURCES)
    trajectory: Optional[str] = MISSING
    drift_threshold: float = rule(lo=0, judges=True)
    drift_fail: Optional[float] = rule(lo=0, judges=True)
    saturation: float = rule(lo=0, hi=1, lo_open=True, judges=True)
    dynamics: Dynamics = MISSING

    @classmethod
    def allocations(cls, cfg: dict, row: RowBytes) -> list[Allocation]:
        return rollout_rows(cfg, row, drawn=False)


def rollout_rows(cfg: dict, row: RowBytes, drawn: bool) -> list[Allocation]:
    """A rollout's steps x envs rows for two runners (fingerprint, stats); `drawn`: the observation source draws them."""
    steps, envs = int(cfg["mode"]["steps"]), int(cfg["mode"]["envs"])
    rows = steps * envs
    return [Allocation(rows * row.feed * 2, f"{rows:,} rollout rows (steps × envs) for two runners",
                       f"mode.steps={steps} × mode.envs={envs}", rows if drawn else 0)]


@dataclass
class LatencySamples:
    budget_s: float = rule(lo=0, hi=600, lo_open=True)
    warmup_s: float = rule(lo=0, hi=600)
    max_samples: int = rule(lo=5, hi=1_000_000)


@dataclass
class RecordMode(ModeConf):
    name = "record"
    verified = False
    headline = {"points": own("bundle/points", "count", "points in the bundle")}
    out: Optional[str] = MISSING
    latency: LatencySamples = MISSING
    decimals: int = rule(lo=0, hi=9, judges=True)


@dataclass
class ReplayMode(ModeConf):
    name = "replay"
    verified = False
    headline = {
        "bitwise": own("agreement/bitwise_share", "share", "the least share of bit-identical elements of an output"),
        "ulp_max": own("agreement/ulp_max", "ULP", "the largest float32 ULP distance to the recording"),
        "dual_ratio": own("dual/worst_ratio", "ratio", "msprobe's dual benchmark: the worst error ratio"),
        "lat_ratio": own("latency_change/median_ratio", "ratio", "median latency over the recording's"),
        "lat_p": own("latency_change/p_value", "p", "Mann-Whitney U p-value of the latency change")}
    first_screen = ("bitwise", "dual_ratio", "lat_ratio")  # did the port hold
    bundle: Optional[str] = MISSING
    reference_point: Optional[str] = MISSING
    allow_other_model: bool = MISSING
    require_bitwise: bool = MISSING
    latency: LatencySamples = MISSING
    alpha: float = rule(lo=0, hi=1, lo_open=True)
    fail_on_latency: bool = MISSING
    decimals: int = rule(lo=0, hi=9, judges=True)


@dataclass
class DiffMode(OfflineMode):
    name = "diff"
    headline = {"changed": own("diff/changed", "count", "common points that changed"),
                "only_base": own("diff/only_baseline", "count", "points only in the baseline"),
                "only_cand": own("diff/only_candidate", "count", "points only in the candidate")}
    baseline: Optional[str] = MISSING
    candidate: Optional[str] = MISSING
    alpha: float = rule(lo=0, hi=1, lo_open=True)
    fail_on_latency: bool = MISSING


@dataclass
class SyncMode(OfflineMode):
    name = "sync"
    _target_: Optional[str] = None  # not a task: run.py hands it to tracking.sync
    paths: List[str] = MISSING


@dataclass
class RejudgeMode(OfflineMode):
    name = "rejudge"
    _target_: Optional[str] = None  # not a task: run.py hands it to app.rejudge (it reads results, runs no policy)
    path: Optional[str] = MISSING


@dataclass
class UiMode(OfflineMode):
    name = "ui"
    reads_store = True
    _target_: Optional[str] = None  # not a task: run.py hands it to huggy_exp.ui (the port is tracking.ui_port)
    wait_s: float = rule(lo=1, hi=3600)


def modes() -> dict[str, type[ModeConf]]:
    """Every mode by name: the named ModeConf subclasses declared here (and any declared elsewhere, e.g. a test's)."""
    found, todo = {}, list(ModeConf.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        found.update({cls.name: cls} if cls.name else {})
    return found


@dataclass
class Config:
    device: str = MISSING
    dtype: str = rule(choices=DTYPE_NAMES)
    precision_mode: str = rule(choices=PRECISION_MODES)
    batch_size: int = rule(lo=1, hi=MAX_BATCH)
    seed: int = rule(lo=0, hi=MAX_SEED)
    backend: str = rule(choices=BACKEND_NAMES)
    threads: int = rule(lo=1, hi=1024)
    plots: bool = MISSING
    expect: Optional[str] = rule(None, choices=VERDICTS)
    needs: List[str] = field(default_factory=list)
    mode: Any = MISSING
    model: ModelConf = MISSING
    obs: ObsConf = MISSING
    tracking: TrackingConf = MISSING
    verify: VerifyConf = MISSING
    plan: PlanConf = MISSING


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (idempotent); conf/ files extend them."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    if "config_schema.yaml" in cs.repo:  # stored already in this process: each store converts every dataclass again
        return
    cs.store(name="config_schema", node=Config)
    for name, node in modes().items():
        cs.store(group="schema/mode", name=name, node=node)


# --- validation of a composed config


def validate(cfg: DictConfig, mode: str) -> dict:
    """The composed config as plain values; UserError (one line) for an unknown key, a wrong type, a value out of range,
    a NaN/inf number or a rule across keys. Pure: the host's checks are preflight.validate's."""
    if mode not in modes():
        raise UserError(f"unknown mode {mode!r}; valid: {', '.join(sorted(modes()))}")
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    _check(Config, plain, "")
    _check(modes()[mode], plain["mode"], "mode.")
    if mode == "stats" and plain["mode"]["source"] == "replay" and not plain["mode"]["trajectory"]:
        raise UserError("mode.source=replay needs mode.trajectory=<file.npy> (float32 [T, obs_dim]) or an .npz of obs_<i> [T, d_i]")
    _check_specialize(plain["verify"]["specialize"])  # a mapping: _check has seen to it
    bad = next((k for k, v in (plain["plan"]["parts"] or {}).items() if v not in DTYPE_NAMES), None)
    if bad is not None:
        raise UserError(f"plan {plain['plan']['name']}: part {bad} has unknown dtype {plain['plan']['parts'][bad]!r}; "
                        f"valid: {', '.join(DTYPE_NAMES)}")
    return plain


def _check_specialize(value: dict, key: str = "verify.specialize") -> None:
    """A free map of `<device kind>_<dtype>` entries (e.g. npu_fp16): each name a known device kind and dtype, each entry
    any keys of a verify.limits row, every number finite and in range; the first bad one is one line."""
    hints, known = get_type_hints(Threshold), {f.name: f for f in fields(Threshold)}
    for name, limits in value.items():
        kind, _, dtype = str(name).partition("_")
        if kind not in DEVICE_KINDS or dtype not in LIMIT_ROWS:
            raise UserError(f"unknown key {key}.{name}: an entry is named <device kind>_<dtype> (device kinds "
                            f"{', '.join(DEVICE_KINDS)}; dtypes {', '.join(LIMIT_ROWS)}), e.g. npu_fp16")
        if not isinstance(limits, dict):
            raise UserError(f"{key}.{name} must be a mapping of {', '.join(known)}, got {limits!r}")
        for k, v in limits.items():
            if k not in known:
                raise UserError(f"unknown key {key}.{name}.{k}; valid keys: {', '.join(known)}")
            if isinstance(v, str) and v.strip().lower().lstrip("+-.") in ("nan", "inf", "infinity"):  # `.nan`: YAML's NaN
                raise UserError(f"{key}.{name}.{k}={v!r} must be a finite number (NaN or inf would pass every value)")
            _check_value(hints[k], v, f"{key}.{name}.{k}", known[k].metadata)


def _check(schema: type, values: Any, prefix: str) -> None:
    if not isinstance(values, dict):
        raise UserError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    known, hints = {f.name: f for f in fields(schema)}, get_type_hints(schema)
    for key in values:
        if key not in known:
            raise UserError(_unknown(f"{prefix}{key}", prefix.rstrip(".") or "the config", sorted(known)))
    for name, f in known.items():
        key = f"{prefix}{name}"
        if values.get(name) == MISSING:  # `???`: a YAML file left it out
            raise UserError(f"missing key {key}")
        if name == "mode" and schema is Config:  # checked by its own mode's schema (validate)
            continue
        if name not in values:  # composition fills every schema key: only `~key` removes one
            raise UserError(f"missing key {key}: every job reads it (a `~{key}` cannot delete it; set it instead)")
        _check_value(hints[name], values[name], key, f.metadata)


def _check_value(kind: Any, value: Any, key: str, meta: dict) -> None:
    if kind is Any:
        return
    if value is None:
        if not _optional(kind):
            raise UserError(f"{key} must be set (got null)")
        return
    if _optional(kind):
        kind = next(a for a in get_args(kind) if a is not type(None))
    origin, args = get_origin(kind), get_args(kind)
    if is_dataclass(kind):
        _check(kind, value, key + ".")
    elif origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{key} must be a mapping, got {value!r}")
        for k, v in value.items():
            _check_value(args[1], v, f"{key}.{k}", {"lo": 0} if args[1] is float else {})
    elif origin is list:
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}")
        choices = meta.get("choices")
        if bad := [v for v in value if choices and v not in choices]:
            raise UserError(f"{key}: unknown entry {bad[0]!r}; valid: {', '.join(choices)}")
        for i, v in enumerate(value):
            _check_value(args[0], v, f"{key}[{i}]", {"lo": 1, "hi": 2**31} if args[0] is int else {})
    elif kind is bool and not isinstance(value, bool):
        raise UserError(f"{key}={value!r} is not true/false")
    elif kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise UserError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}")
        if not math.isfinite(value):
            raise UserError(f"{key}={value!r} must be a finite number")
        lo, hi, lo_open = meta.get("lo"), meta.get("hi"), meta.get("lo_open")
        span = " and ".join(filter(None, [f"{'>' if lo_open else '>='} {lo}" if lo is not None else "",
                                          f"<= {hi}" if hi is not None else ""]))
        if (lo is not None and (value < lo or (lo_open and value == lo))) or (hi is not None and value > hi):
            raise UserError(f"{key}={value!r} is out of range: must be {span}")
    elif kind is str:
        if meta.get("choices") and value not in meta["choices"]:
            raise UserError(f"unknown {key} {value!r}; valid: {', '.join(meta['choices'])}")
        if not isinstance(value, str):
            raise UserError(f"{key}={value!r} is not a string")


def _optional(kind: Any) -> bool:
    return type(None) in getattr(kind, "__args__", ())


@functools.cache
def free_maps() -> tuple[str, ...]:
    """Every schema map with free keys (Dict[str, Any]): `mode.<key>` (e.g. mode.specialize) and `verify.specialize`."""
    tables = [("mode", schema) for schema in modes().values()] + [("verify", VerifyConf)]
    return tuple(sorted({f"{prefix}.{f.name}" for prefix, schema in tables for f in fields(schema)
                         if get_type_hints(schema)[f.name] == Dict[str, Any]}))


def unknown_key(key: str, mode: str) -> str:
    """`unknown key mode.tolerence; valid keys of mode (batch): budget_s, tolerance`."""
    parts = key.split(".")
    kind: Any = modes().get(mode, ModeConf) if parts[0] == "mode" else Config
    for part in (parts[1:] if parts[0] == "mode" else parts)[:-1]:
        if get_origin(kind) is dict:  # per-dtype tables: the key is a dtype
            kind = get_args(kind)[1]
        elif not is_dataclass(kind):
            return f"unknown key {key}"
        else:
            kind = get_type_hints(kind).get(part)
            kind = next(a for a in get_args(kind) if a is not type(None)) if _optional(kind) else kind
    if get_origin(kind) is not dict and not is_dataclass(kind):
        return f"unknown key {key}"
    names = list(DTYPE_NAMES) if get_origin(kind) is dict else sorted(f.name for f in fields(kind))
    where = ".".join(parts[:-1]) or "the config"
    return _unknown(key, f"{where} ({mode})" if parts[0] == "mode" and len(parts) == 2 else where, names)


def _unknown(key: str, where: str, names: list[str]) -> str:
    names = [n for n in names if n != "_target_"]
    return f"unknown key {key}; valid keys of {where}: {', '.join(names) or 'none (this mode has no knobs)'}"
