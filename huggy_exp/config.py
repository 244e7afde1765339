"""The config schema, once: types (Hydra structured configs in the ConfigStore), ranges and choices (field metadata).

conf/*.yaml hold the values and their comments; each extends its schema (`/schema/<group>/<name>@_here_`), so
Hydra refuses a wrong type while composing. `validate` then checks what composition lets through: `+`-added
unknown keys, ranges, choices, finite numbers. Every failure is one line naming the key and what is valid.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional, get_type_hints

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf

from huggy_exp.errors import UserError

DTYPE_NAMES = ("fp32", "fp16", "bf16", "fp64")
BACKENDS = ("eager", "compile", "fused", "graphs", "onnxruntime")
VERDICTS = ("passed", "failed", "skipped", "error")
SCENARIOS = ("single_stream", "multi_stream", "offline", "server", "control_loop")  # mode=benchmark
OBS_SOURCES = ("random", "zeros", "extreme", "file")  # obs.source
STATS_SOURCES = ("dynamics", "replay")  # mode=stats: mode.source
LOOPS = ("open", "closed")  # mode=fingerprint: mode.loop
ACTION_KINDS = ("deterministic", "sampled")  # mode=fingerprint: mode.actions (rollout.Stepper)
MASKS = ("random", "feeds")  # onnx-compare, export-onnx: mode.masks
MAX_SEED = 2**62  # fingerprint and stats add the step to the seed; torch generators take < 2^64
MAX_BATCH = 2**24


def rule(default: Any = MISSING, *, lo: float | None = None, hi: float | None = None, choices: tuple = (),
         lo_open: bool = False, factory=None):
    """A field with its legal range or choices (checked by `validate`)."""
    meta = {"lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


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
    scale: float = rule(lo=0)
    path: Optional[str] = MISSING


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


@dataclass
class ModeConf:
    _target_: str = MISSING


@dataclass
class Threshold:
    max_abs: float = rule(lo=0)
    cosine_min: float = rule(lo=-1, hi=1)
    margin: float = rule(lo=0)  # discrete: a flip fails where fp64's top-1 minus top-2 masked logit exceeds margin x max(1, |best|)
    rtol: float = rule(0.0, lo=0)


@dataclass
class VerifyConf:
    limits: Dict[str, Threshold] = MISSING
    specialize: Dict[str, Any] = MISSING
    rel_floor: float = rule(lo=0, lo_open=True)
    decimals: int = rule(lo=0, hi=9)


@dataclass
class LayerThreshold:
    rel_rmse: float = rule(lo=0)


@dataclass
class Relative:
    warn: float = rule(lo=0)
    fail: float = rule(lo=0)


@dataclass
class BatchMode(ModeConf):
    tolerance: Dict[str, float] = MISSING
    budget_s: float = rule(lo=0, hi=600, lo_open=True)


@dataclass
class BenchmarkMode(ModeConf):
    backends: List[str] = MISSING
    batch_sizes: Optional[List[int]] = MISSING
    scenarios: List[str] = MISSING
    rounds: int = rule(lo=1, hi=1000)
    budget_s: float = rule(lo=0, hi=3600, lo_open=True)
    warmup_s: float = rule(lo=0, hi=600)
    settle_s: float = rule(lo=0, hi=60)
    chunk_rows: int = rule(lo=1, hi=MAX_BATCH)
    tolerance: Dict[str, float] = MISSING
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
    confidence: float = rule(lo=0, hi=1, lo_open=True)
    loop_search_s: float = rule(lo=0, hi=600, lo_open=True)


@dataclass
class ExportOnnxMode(ModeConf):
    path: Optional[str] = MISSING
    opset: int = rule(lo=7, hi=21)
    atol: float = rule(lo=0)
    masks: str = rule(choices=MASKS)
    overwrite: bool = False


@dataclass
class FingerprintMode(ModeConf):
    steps: int = rule(lo=1, hi=1_000_000)
    loop: str = rule(choices=LOOPS)
    actions: str = rule(choices=ACTION_KINDS)
    envs: int = rule(lo=1, hi=1_000_000)
    decimals: int = rule(lo=0, hi=9)
    require_match: List[str] = MISSING
    dynamics: Dynamics = MISSING


@dataclass
class OnnxCompareMode(ModeConf):
    provider: str = MISSING
    atol: Dict[str, float] = MISSING
    specialize: Dict[str, Any] = MISSING
    sample_rows: int = rule(lo=1, hi=100_000)
    samples: int = rule(lo=2, hi=1_000_000)
    confidence: float = rule(lo=0, hi=1, lo_open=True)
    rel_floor: float = rule(lo=0, lo_open=True)
    masks: str = rule(choices=MASKS)


@dataclass
class PrecisionMode(ModeConf):
    layer_thresholds: Dict[str, LayerThreshold] = MISSING
    layer_specialize: Dict[str, Any] = MISSING
    relative: Relative = MISSING


@dataclass
class StatsMode(ModeConf):
    steps: int = rule(lo=1, hi=1_000_000)
    envs: int = rule(lo=1, hi=1_000_000)
    source: str = rule(choices=STATS_SOURCES)
    trajectory: Optional[str] = MISSING
    drift_threshold: float = rule(lo=0)
    drift_fail: Optional[float] = rule(lo=0)
    saturation: float = rule(lo=0, hi=1, lo_open=True)
    dynamics: Dynamics = MISSING


@dataclass
class LatencySamples:
    budget_s: float = rule(lo=0, hi=600, lo_open=True)
    warmup_s: float = rule(lo=0, hi=600)
    max_samples: int = rule(lo=5, hi=1_000_000)


@dataclass
class RecordMode(ModeConf):
    out: Optional[str] = MISSING
    latency: LatencySamples = MISSING
    decimals: int = rule(lo=0, hi=9)


@dataclass
class ReplayMode(ModeConf):
    bundle: Optional[str] = MISSING
    reference_point: Optional[str] = MISSING
    allow_other_model: bool = MISSING
    tolerance: Dict[str, float] = MISSING
    require_bitwise: bool = MISSING
    latency: LatencySamples = MISSING
    alpha: float = rule(lo=0, hi=1, lo_open=True)
    fail_on_latency: bool = MISSING
    decimals: int = rule(lo=0, hi=9)


@dataclass
class DiffMode(ModeConf):
    baseline: Optional[str] = MISSING
    candidate: Optional[str] = MISSING
    alpha: float = rule(lo=0, hi=1, lo_open=True)
    fail_on_latency: bool = MISSING


@dataclass
class SyncMode(ModeConf):
    _target_: Optional[str] = None  # not a task: run.py hands it to tracking.sync
    paths: List[str] = MISSING


@dataclass
class UiMode(ModeConf):
    _target_: Optional[str] = None  # not a task: run.py hands it to huggy_exp.ui (the port is tracking.ui_port)
    wait_s: float = rule(lo=1, hi=3600)


NOT_TASKS = ("sync", "ui")  # modes run.py handles itself (tracking), not task classes
MODES: dict[str, type] = {
    "action": ModeConf, "sample": ModeConf, "info": ModeConf, "checkpoints": ModeConf, "batch": BatchMode,
    "benchmark": BenchmarkMode,
    "export-onnx": ExportOnnxMode, "fingerprint": FingerprintMode, "onnx-compare": OnnxCompareMode,
    "precision": PrecisionMode, "stats": StatsMode, "sync": SyncMode, "ui": UiMode,
    "record": RecordMode, "replay": ReplayMode, "diff": DiffMode,
}


@dataclass
class Config:
    device: str = MISSING
    dtype: str = rule(choices=DTYPE_NAMES)
    batch_size: int = rule(lo=1, hi=MAX_BATCH)
    seed: int = rule(lo=0, hi=MAX_SEED)
    backend: str = rule(choices=BACKENDS)
    threads: int = rule(lo=1, hi=1024)
    plots: bool = MISSING
    expect: Optional[str] = rule(None, choices=VERDICTS)
    needs: List[str] = field(default_factory=list)
    mode: Any = MISSING
    model: ModelConf = MISSING
    obs: ObsConf = MISSING
    tracking: TrackingConf = MISSING
    verify: VerifyConf = MISSING


def register() -> None:
    """Put the schemas in Hydra's ConfigStore (idempotent); conf/ files extend them."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    if "config_schema.yaml" in cs.repo:  # stored already in this process: each store converts every dataclass again
        return
    cs.store(name="config_schema", node=Config)
    for group, node in (("model", ModelConf), ("obs", ObsConf), ("tracking", TrackingConf)):
        cs.store(group=f"schema/{group}", name="base", node=node)
    for name, node in MODES.items():
        cs.store(group="schema/mode", name=name, node=node)


# --- validation of a composed config


def validate(cfg: DictConfig, mode: str) -> None:
    """Raise UserError (one line) for an unknown key, a wrong type, a value out of range, or a NaN/inf number."""
    from huggy_exp.placement import check_device

    if mode not in MODES:
        raise UserError(f"unknown mode {mode!r}; valid: {', '.join(sorted(MODES))}")
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop("hydra", None)
    _check(Config, plain, "")
    _check(MODES[mode], plain["mode"], "mode.")
    check_device(str(plain["device"]))
    if mode == "stats" and plain["mode"]["source"] == "replay" and not plain["mode"]["trajectory"]:
        raise UserError("mode.source=replay needs mode.trajectory=<file.npy> (float32 [T, obs_dim]) or an .npz of obs_<i> [T, d_i]")
    if mode == "benchmark":
        from huggy_exp.loadgen import check_available

        check_available(plain["mode"]["scenarios"])
    track = plain["tracking"]
    if track.get("enabled") and track.get("uri"):
        from huggy_exp.tracking import StoreDown, check_uri

        try:
            check_uri(track["uri"])
        except StoreDown as exc:
            raise UserError(str(exc)) from None


def _check(schema: type, values: Any, prefix: str) -> None:
    if not isinstance(values, dict):
        raise UserError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {values!r}")
    known = {f.name: f for f in fields(schema)}
    hints = get_type_hints(schema)
    for key, value in values.items():
        if key not in known:
            names = sorted(k for k in known if k != "_target_")
            where = prefix.rstrip(".") or "the config"
            raise UserError(f"unknown key {prefix}{key}; valid keys of {where}: "
                            f"{', '.join(names) if names else 'none (this mode has no knobs)'}")
    for name, f in known.items():
        key = f"{prefix}{name}"
        if name not in values:
            if f.default is MISSING and f.default_factory is MISSING and name not in ("mode",):  # type: ignore[misc]
                raise UserError(f"missing key {key}")
            continue
        value = values[name]
        if name == "mode" and schema is Config:
            continue
        _check_value(hints[name], value, key, f.metadata)


def _check_value(kind: Any, value: Any, key: str, meta: dict) -> None:
    if kind is Any:
        return
    origin = getattr(kind, "__origin__", None)
    args = getattr(kind, "__args__", ())
    if origin is type(None) or value is None:
        if value is None and not _optional(kind):
            raise UserError(f"{key} must be set (got null)")
        return
    if _optional(kind):
        kind = next(a for a in args if a is not type(None))
        origin, args = getattr(kind, "__origin__", None), getattr(kind, "__args__", ())
    if is_dataclass(kind):
        _check(kind, value, key + ".")
        return
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise UserError(f"{key} must be a mapping, got {value!r}")
        if key.split(".")[-1] in ("tolerance", "atol", "limits", "layer_thresholds"):
            for k in value:
                if k not in DTYPE_NAMES:
                    raise UserError(f"unknown key {key}.{k}; valid: {', '.join(DTYPE_NAMES)}")
        for k, v in value.items():
            _check_value(args[1], v, f"{key}.{k}", {"lo": 0} if args[1] is float else {})
        return
    if origin in (list, List):
        if not isinstance(value, list):
            raise UserError(f"{key} must be a list, got {value!r}")
        choices = {"mode.require_match": DTYPE_NAMES, "mode.backends": BACKENDS,
                   "mode.scenarios": SCENARIOS}.get(key)
        bad = [v for v in value if choices and v not in choices]
        if bad:
            raise UserError(f"{key}: unknown entry {bad[0]!r}; valid: {', '.join(choices)}")
        item = getattr(kind, "__args__", (Any,))[0]
        for i, v in enumerate(value):
            _check_value(item, v, f"{key}[{i}]", {"lo": 1, "hi": 2**31} if item is int else {})
        return
    if kind is bool:
        if not isinstance(value, bool):
            raise UserError(f"{key}={value!r} is not true/false")
        return
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            raise UserError(f"{key}={value!r} is not {'an integer' if kind is int else 'a number'}")
        if not math.isfinite(value):
            raise UserError(f"{key}={value!r} must be a finite number")
        lo, hi = meta.get("lo"), meta.get("hi")
        low = f"{'>' if meta.get('lo_open') else '>='} {lo}" if lo is not None else ""
        span = " and ".join(filter(None, [low, f"<= {hi}" if hi is not None else ""]))
        if (lo is not None and (value < lo or (meta.get("lo_open") and value == lo))) or (hi is not None and value > hi):
            raise UserError(f"{key}={value!r} is out of range: must be {span}")
        return
    if kind is str:
        choices = meta.get("choices") or ()
        if choices and value not in choices:
            raise UserError(f"unknown {key} {value!r}; valid: {', '.join(choices)}")
        if not isinstance(value, str):
            raise UserError(f"{key}={value!r} is not a string")
        return


def _optional(kind: Any) -> bool:
    return type(None) in getattr(kind, "__args__", ())


# --- before Hydra runs anything: every job of the command line composed and validated


GROUPS = ("mode", "model", "obs", "tracking", "case")
JOBS_ENV = "HUGGY_EXP_SWEEP_JOBS"  # run.py's preflight counts the jobs; the sweep callback writes it to sweep.json


def unique_suffix() -> str:
    """<time>-<microseconds>-<pid>: two runs started in the same second never share a directory."""
    import os
    import time

    now = time.time()
    return f"{time.strftime('%H-%M-%S', time.localtime(now))}-{int(now * 1e6) % 1_000_000:06d}-{os.getpid()}"


def available(what: str, yes: str, no: str) -> str:
    """`${huggy_available:<device or file>,<if here>,<if not>}`: an expectation that holds on every host.

    A device (cpu, cuda[:N], npu[:N], mps) is here when torch can place on it; anything else is a path that exists.
    """
    import re
    from pathlib import Path

    from huggy_exp.errors import Unsupported

    if re.fullmatch(r"(cpu|cuda|npu|mps)(:\d+)?", str(what)):
        from huggy_exp.placement import resolve_device

        try:
            resolve_device(str(what))
        except Unsupported:
            return no
        return yes
    return yes if Path(str(what)).expanduser().exists() else no


def setup() -> None:
    """Schemas into the ConfigStore and the resolvers (run.py, its jobs and tests call this before composing)."""
    register()
    if not OmegaConf.has_resolver("huggy_unique"):
        OmegaConf.register_new_resolver("huggy_unique", unique_suffix, use_cache=True)
    if not OmegaConf.has_resolver("huggy_available"):
        OmegaConf.register_new_resolver("huggy_available", available)


def group_options(group: str, dirs: list) -> list[str]:
    from pathlib import Path

    return sorted({p.stem for d in dirs for p in (Path(d) / group).glob("*.yaml")})


@functools.cache
def free_maps() -> tuple[str, ...]:
    """Every schema map with free keys (Dict[str, Any]): `mode.<key>` (e.g. mode.specialize) and `verify.specialize`."""
    tables = [("mode", schema) for schema in MODES.values()] + [("verify", VerifyConf)]
    return tuple(sorted({f"{prefix}.{f.name}" for prefix, schema in tables for f in fields(schema)
                         if get_type_hints(schema)[f.name] == Dict[str, Any]}))


def normalize_argv(argv: list[str]) -> list[str]:
    """The command line as Hydra must see it: `+case=` as `case=` (a group now); an override of a free map
    (`verify.specialize={npu_fp16: {...}}`, as the docs write it) merged with `++`, since Hydra refuses new keys there
    without it; a server URI's `user:password@` moved into MLflow's variables, so no file or log ever holds it."""
    import re

    out = []
    for arg in argv:
        if arg.startswith("+case="):
            arg = arg[1:]
        key = arg.split("=", 1)[0]
        if "=" in arg and not key.startswith(("+", "~")) and any(key == m or key.startswith(m + ".") for m in free_maps()):
            arg = "++" + arg
        uri = re.fullmatch(r"(\+{0,2}tracking\.uri=)(['\"]?)(https?://[^@]*@.*)\2", arg)
        if uri:
            from huggy_exp.tracking import use_credentials

            arg = f"{uri[1]}{uri[2]}{use_credentials(uri[3])}{uri[2]}"
        out.append(arg)
    return out


def expand(argv: list[str], conf_dirs: list) -> tuple[list[str], list[list[str]]]:
    """(plain overrides, one list of `key=value` per swept value); glob() only on groups and never empty."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for arg in argv:
        try:
            parsed += parser.parse_overrides([arg])
        except HydraException as exc:
            reason = " ".join(str(exc).split()).split(" See https://")[0]
            if not arg.isascii():
                key, _, value = arg.partition("=")
                raise UserError(f"{arg}: Hydra reads only ASCII outside quotes; quote the value: "
                                f"{key}='{value}' (in the shell: \"{key}='{value}'\")") from None
            raise UserError(f"{arg}: {reason} (Hydra's override grammar: key=value, -m key=a,b,c)") from None
    plain, sweeps = [], []
    for o in parsed:
        if o.get_key_element().startswith("hydra"):  # Hydra's own settings: composed too, never swept by us
            plain.append(o.input_line)
            continue
        key = o.get_key_element()
        if not o.is_sweep_override():
            if key.lstrip("+") in GROUPS and not o.is_delete():
                _known_choice(key.lstrip("+"), str(o.value()), conf_dirs)
            plain.append(o.input_line)
            continue
        if isinstance(o.value(), Glob):
            if key.lstrip("+") not in GROUPS:
                raise UserError(f"{o.input_line}: glob() selects config files, so it works only on the groups "
                                f"{', '.join(GROUPS)}; list the values instead ({key}=a,b,c)")
            options = group_options(key.lstrip("+"), conf_dirs)
            values = o.value().filter(options)
            if not values:
                raise UserError(f"{o.input_line} matches no {key} file; available: {', '.join(options) or 'none'}")
        else:
            values = list(o.sweep_string_iterator())
            if key.lstrip("+") in GROUPS:
                for v in values:
                    _known_choice(key.lstrip("+"), v, conf_dirs)
        sweeps.append([f"{key}={v}" for v in values])
    return plain, sweeps


def _known_choice(group: str, value: str, conf_dirs: list) -> None:
    options = group_options(group, conf_dirs)
    if value not in options and not (group == "case" and value == "null"):
        raise UserError(f"unknown {group} {value!r}; valid: {', '.join(options)}")


def shares_machine(launcher: str, settings) -> bool:
    """Whether a launcher runs jobs beside each other: joblib unless n_jobs=1, submitit (local, or SLURM nodes); not
    Ray, whose timed points hold their card, or every CPU of a node, alone (docs/tracking-and-sweeps.md)."""
    if launcher in ("basic", "ray"):
        return False
    return not (launcher == "joblib" and settings.get("n_jobs") == 1)


def preflight(argv: list[str], conf_dir, keep: list | None = None) -> int:
    """Compose and validate every job the command line asks for; the first bad one is a UserError (one line).

    Returns how many jobs Hydra will launch (the product of the swept values; 1 without -m). `keep`, when given,
    receives each composed config (Hydra node included) so that a single run need not be composed again (run_once).
    """
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra._internal.utils import get_args_parser
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    parser = get_args_parser()

    def refuse(message: str):
        raise UserError(f"{message.replace('unrecognized arguments', 'unknown option')}; run.py takes key=value overrides "
                        "and Hydra's flags (-m, --cfg job, --info, --config-dir DIR, --help)")

    parser.error = refuse  # argparse would print its 8-line usage; one line, exit 2, as for every other bad value
    args = parser.parse_args(argv)
    if args.help or args.hydra_help or args.cfg or args.info or args.shell_completion or args.experimental_rerun:
        return 0
    dirs = [Path(conf_dir)] + ([Path(args.config_dir).expanduser().resolve()] if args.config_dir else [])
    if args.config_dir and not dirs[1].is_dir():
        raise UserError(f"--config-dir {args.config_dir}: no such folder")
    extra = [f"hydra.searchpath=[file://{dirs[1]}]"] if args.config_dir else []
    plain, sweeps = expand(args.overrides, dirs)
    if sweeps and not args.multirun:
        raise UserError(f"{sweeps[0][0].split('=')[0]} has several values: add -m to sweep over them")
    jobs = [plain] + [plain + [value] for values in sweeps for value in values]
    if sweeps:
        jobs = jobs[1:]
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3", job_name="run"):  # as @hydra.main names run.py's job
        for overrides in jobs:
            try:
                cfg = compose(config_name=args.config_name or "config", overrides=overrides + extra,
                              return_hydra_config=True)
            except (HydraException, OmegaConfBaseException, yaml.YAMLError) as exc:
                raise UserError(_in_case(composition_error(exc, overrides, _case_file(overrides, dirs)), overrides,
                                         dirs)) from None
            _check_output_dir(cfg.hydra.sweep.dir if args.multirun else cfg.hydra.run.dir,
                              "hydra.sweep.dir" if args.multirun else "hydra.run.dir")
            mode = cfg.hydra.runtime.choices.get("mode")
            with_cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
            try:
                validate(with_cfg, mode)
            except UserError as exc:
                raise UserError(_in_case(str(exc), overrides, dirs)) from None
            if keep is not None:
                keep.append(cfg)
    return math.prod(len(values) for values in sweeps)


def _check_output_dir(path: str, key: str) -> None:
    """The job directory must be creatable (tried in its nearest existing parent: root ignores permission bits), hold no
    earlier job's result (it would be overwritten, a result pending for MLflow lost) nor anything else (the user's files),
    and have room for a job's files. run.py claims it (safety.claim_folder) once every job is validated."""
    import tempfile
    from pathlib import Path

    from huggy_exp.safety import check_free, check_unused

    target = Path(path).expanduser().absolute()
    parent = next((p for p in [target, *target.parents] if p.exists()), Path("/"))
    if not parent.is_dir():
        raise UserError(f"{key}={path}: {parent} is a file, not a folder")
    held = held_result(target, sweep=key == "hydra.sweep.dir")
    if held is not None:
        raise UserError(f"{key}={path} already holds a job's result ({held}); refused, so that it is not overwritten: "
                        f"choose another {key} (the default is a fresh folder per run)")
    check_unused(path, key)
    try:
        Path(tempfile.mkdtemp(dir=parent, prefix=".huggy_exp-probe-")).rmdir()
    except OSError as exc:
        raise UserError(f"{key}={path}: cannot create a folder in {parent} ({exc.strerror or exc})") from None
    check_free(target, key)


def held_result(folder, sweep: bool = False) -> str | None:
    """`result.json, tracking pending` if `folder` (a sweep: any job folder under it) already holds a job's result."""
    import json
    from pathlib import Path

    folder = Path(folder)
    if sweep:
        found = next(iter(sorted(folder.glob("**/result.json"))), None) if folder.is_dir() else None
    else:
        found = folder / "result.json"
    if found is None or not found.is_file():
        return None
    try:
        state = (json.loads(found.read_text()).get("tracking") or {}).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        state = "unreadable"
    shown = found.relative_to(folder) if found.is_relative_to(folder) else found
    return f"{shown}, tracking {state}" + (": not in MLflow yet" if state in ("pending", "logging") else "")


def _case_file(overrides: list[str], dirs: list):
    """The file of the job's case (the --config-dir copy wins, as in Hydra's search path), or None."""
    from pathlib import Path

    names = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "case"]
    if not names or names[-1] == "null":
        return None
    files = [Path(d) / "case" / f"{names[-1]}.yaml" for d in dirs]
    return next((f for f in reversed(files) if f.is_file()), files[0])


def _in_case(message: str, overrides: list[str], dirs: list) -> str:
    """Prefix a job's error with the case file it came from: `case bad (conf/case/bad.yaml): ...`."""
    path = _case_file(overrides, dirs)
    return message if path is None else f"case {path.stem} ({path}): {message}"


def composition_error(exc: BaseException, overrides: list[str], case_file=None) -> str:
    """Hydra's multi-line composition report as one line: what was asked, and OmegaConf's reason with the key."""
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"not valid YAML: {where}{getattr(exc, 'problem', None) or str(exc).splitlines()[0]}"
    head = " ".join(str(exc).split("\n")[0].split()).rstrip(".").rstrip(":")
    cause = exc.__cause__
    lines = [ln.strip() for ln in str(cause if cause is not None else exc).splitlines() if ln.strip()]
    if cause is None:  # Hydra put OmegaConf's report in its own text: `In 'case/x': ...`, the reason, `full_key: ...`
        if not any(ln.startswith("full_key:") for ln in lines[1:]):
            return "; ".join(" ".join(ln.split()) for ln in lines[:3]) or head
        lines = lines[1:]
    key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), None)
    reason = lines[0] if lines else type(cause).__name__
    if key and ("not in struct" in reason or "not in '" in reason):
        return unknown_key(key, _mode_choice(overrides, case_file))
    return f"{head}: {reason}" + (f" (key {key})" if key and key not in reason else "")


def _mode_choice(overrides: list[str], case_file=None) -> str:
    """The mode a job asked for: on the command line, else in its case file's `override /mode: x`, else action."""
    chosen = [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].lstrip("+") == "mode"]
    if chosen:
        return chosen[-1]
    try:
        defaults = (yaml.safe_load(case_file.read_text()) or {}).get("defaults") or [] if case_file else []
    except (OSError, yaml.YAMLError, AttributeError):
        defaults = []
    picked = [v for d in defaults if isinstance(d, dict) for k, v in d.items() if k.split()[-1] in ("/mode", "mode")]
    return str(picked[-1]) if picked else "action"


def unknown_key(key: str, mode: str) -> str:
    """`unknown key mode.tolerence; valid keys of mode (batch): budget_s, tolerance`."""
    parts = key.split(".")
    kind: Any = MODES.get(mode, ModeConf) if parts[0] == "mode" else Config
    for part in (parts[1:] if parts[0] == "mode" else parts)[:-1]:
        if getattr(kind, "__origin__", None) in (dict, Dict):  # per-dtype tables: the key is a dtype
            kind = kind.__args__[1]
            continue
        if not is_dataclass(kind):
            return f"unknown key {key}"
        kind = get_type_hints(kind).get(part)
        if _optional(kind):
            kind = next(a for a in kind.__args__ if a is not type(None))
    if getattr(kind, "__origin__", None) in (dict, Dict):
        names = list(DTYPE_NAMES)
    elif is_dataclass(kind):
        names = sorted(f.name for f in fields(kind) if f.name != "_target_")
    else:
        return f"unknown key {key}"
    where = ".".join(parts[:-1]) or "the config"
    where = f"{where} ({mode})" if parts[0] == "mode" and len(parts) == 2 else where
    return f"unknown key {key}; valid keys of {where}: {', '.join(names) if names else 'none (this mode has no knobs)'}"


def single_run(argv: list[str]) -> bool:
    """Plain `key=value` overrides only: no -m, no --config-dir, --cfg, --help or other Hydra flag."""
    return not any(a.startswith("-") for a in argv)


def run_once(cfg, task_function) -> None:
    """Run one job from the config preflight composed, as @hydra.main runs it (hydra.mode RUN, Hydra's and the job's
    logging, callbacks, <job dir>/.hydra/), without composing it twice more: @hydra.main composes once to learn the
    mode and once to run (~0.2 s each, a sixth of a single run's start-up over `import torch`). Hydra 1.3's run_job."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode
    from omegaconf import open_dict

    with open_dict(cfg.hydra):
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.overrides.hydra.append("hydra.mode=RUN")  # what @hydra.main adds when the config names no mode

    def launch() -> None:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name="config")
        ret = run_job(hydra_context=HydraContext(config_loader=None, callbacks=callbacks), task_function=task_function,
                      config=cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, configure_logging=True)
        callbacks.on_run_end(config=cfg, config_name="config", job_return=ret)
        _ = ret.return_value  # re-raises what the job raised, as Hydra's run does

    run_and_report(launch)
