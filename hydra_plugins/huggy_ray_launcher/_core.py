"""`hydra/launcher=ray`: connect, check the cluster, submit each point with its device's resources, bring the records
back. Imported only when a Ray sweep runs (it imports Ray); the rules themselves are huggy_exp/cluster.py.

Head: `preflight` (run.py, before Hydra starts: one line and exit 2 for a bad address, a missing extra, a request no
node can meet, a store the workers cannot reach), then `launch` (after the sweep's parent run exists): points whose
device no node has run here as `skipped`; the others go to Ray with `max_retries=0`. A point whose worker dies is
recorded here as `error`, tracking pending, under the job id the worker had, so `mode=sync` logs it exactly once
(replacing any partial copy the worker left). Worker: `_run_point` runs Hydra's job and returns its job folder's files.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import ray
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import DictConfig, OmegaConf, open_dict

from huggy_exp import cluster, tracking
from huggy_exp.app import POINT_ENV
from huggy_exp.errors import UserError

log = logging.getLogger(__name__)
WORKER_FILE = "ray_worker.json"  # in a point's job folder: which node and process ran it (written when it starts)


def launcher_settings(cfg: DictConfig) -> dict:
    """hydra.launcher of a composed config as the plain settings HuggyRayLauncher keeps."""
    raw = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    raw.pop("_target_", None)
    from hydra_plugins.huggy_ray_launcher.launcher import HuggyRayLauncher

    try:
        return HuggyRayLauncher(**raw).settings
    except (TypeError, ValueError) as exc:  # an unknown key (a typo) or a value of the wrong kind
        raise UserError(f"hydra.launcher: {exc}; see conf/hydra/launcher/ray.yaml for its keys") from None


def connect(settings: dict) -> list[dict]:
    """ray.init once per process (a local cluster when the address is null), bounded in time; the alive nodes."""
    init = dict((settings.get("ray") or {}).get("init") or {})
    address = init.get("address")
    if address:
        cluster.check_reachable(str(address), settings["connect_timeout_s"])
    if not ray.is_initialized():
        if not address:  # a local cluster on this host: no dashboard, a small object store (records are small)
            init.setdefault("include_dashboard", False)
            init.setdefault("object_store_memory", 78643200)
        init.setdefault("logging_level", logging.WARNING)
        try:
            ray.init(**init)
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError... each a user's setting here
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"hydra.launcher.ray.init={init}: Ray could not start or join the cluster ({first[:240]})") from None
    return [n for n in ray.nodes() if n.get("Alive")]


def point_options(settings: dict, device: str, mode: str, nodes: list[dict]) -> tuple[dict, str | None]:
    """(ray.remote options of the point, why it is skipped or None). Device resources come from huggy_exp.cluster;
    hydra.launcher.ray.remote adds options (resources are merged); a task is never retried (a retry would rerun a
    point whose first run may have logged)."""
    cpus = [cluster.node_totals(n).get("CPU", 0.0) for n in nodes]
    req = cluster.request(device, mode, settings["cpus_per_point"], cpus)
    extra = (settings.get("ray") or {}).get("remote") or {}
    options = {**extra, "num_cpus": req["num_cpus"], "num_gpus": req["num_gpus"], "max_retries": 0,
               "resources": {**(extra.get("resources") or {}), **req["resources"]}, "retry_exceptions": False}
    env = {k: os.environ[k] for k in tracking.CREDENTIAL_ENV if k in os.environ}
    if env:  # workers do not inherit the head's environment: the store's credentials travel with the task
        runtime = dict(options.get("runtime_env") or {})
        runtime["env_vars"] = {**env, **(runtime.get("env_vars") or {})}
        options["runtime_env"] = runtime
    return options, cluster.missing_device(device, nodes)


def preflight(composed: list[DictConfig]) -> None:
    """Before Hydra starts: the cluster answers, every point's request can be met by some node (or its device is
    absent: it will be skipped), and the store is one every node reaches. A UserError names what is wrong."""
    settings = launcher_settings(composed[0])
    nodes = connect(settings)
    for cfg in composed:
        device, mode = str(cfg.device), str(cfg.hydra.runtime.choices.get("mode"))
        options, skip = point_options(settings, device, mode, nodes)
        why = None if skip else cluster.unmet(options, nodes)
        if why:
            raise UserError(f"device={device} mode={mode}: {why}; lower hydra.launcher.cpus_per_point or the resources "
                            "in hydra.launcher.ray.remote, or add a node that has them")
    track = OmegaConf.to_container(composed[0].tracking, resolve=True)
    if not track.get("enabled", True):
        return
    uri = tracking.store_uri(track.get("uri"))
    cluster.check_store(tracking.redact(uri), cluster.hosts(nodes), settings["shared_filesystem"])
    check_store_from_nodes(uri, nodes, settings["check_timeout_s"])


def _probe_store(uri: str) -> str | None:
    """On one node: why the store cannot be reached or written from there (None when it can)."""
    try:
        tracking.probe(tracking.store_uri(uri))
    except tracking.StoreDown as exc:
        return str(exc)
    return None


def check_store_from_nodes(uri: str, nodes: list[dict], timeout_s: float) -> None:
    """Ask every node, in parallel, whether it reaches the store (MLflow's /health, or the SQLite file writable there).
    A node that says no is a UserError; a node that does not answer within `timeout_s` is only warned about."""
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe_store)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(uri):
            n for n in nodes}
    done, late = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    for ref in done:
        try:
            why = ray.get(ref)
        except ray.exceptions.RayError as exc:
            why = f"the check itself failed there ({type(exc).__name__})"
        if why:
            node = refs[ref]
            raise UserError(f"tracking.uri={tracking.redact(uri)} is not reachable from the Ray node "
                            f"{node.get('NodeManagerAddress')} ({why}); every node must reach the store: an `mlflow "
                            "server` bound to an address the workers reach")
    for ref in late:
        ray.cancel(ref, force=True)
        print(f"warning: the Ray node {refs[ref].get('NodeManagerAddress')} did not say within {timeout_s:g} s whether it "
              f"reaches tracking.uri={tracking.redact(uri)}; its points log there or stay pending", flush=True)


def launch(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    """Submit every point (after the parent run exists), run the skipped ones here, then collect in order."""
    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
    sweep_dir.mkdir(parents=True, exist_ok=True)
    nodes = connect(launcher.settings)
    info = tracking.read_sweep(sweep_dir)
    info = {**info, "dir": str(sweep_dir)} if info else {}
    print(f"ray: {len(job_overrides)} point(s) on {len(nodes)} node(s): "
          + "; ".join(cluster.describe(n) for n in nodes), flush=True)
    remote, cap_bytes = remote_functions(), int(launcher.settings["return_files_mb"] * 2**20)
    slots: list[tuple[DictConfig, dict, Any]] = []
    for offset, overrides in enumerate(job_overrides):
        idx = initial_job_idx + offset
        sweep_config = launcher.hydra_context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"ray_{info.get('id', 'sweep')}_{idx}"
            sweep_config.hydra.job.num = idx
            sweep_config.hydra.sweep.dir = str(sweep_dir)
        device, mode = str(sweep_config.device), str(sweep_config.hydra.runtime.choices.get("mode"))
        options, skip = point_options(launcher.settings, device, mode, nodes)
        skip = skip or cluster.unmet(options, nodes)  # never queued forever (preflight refused this for run.py)
        point = {"job_id": uuid.uuid4().hex}
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        if skip:
            slots.append((sweep_config, {**point, "preset": ["skipped", skip]}, None))
            continue
        submit = remote[device.split(":", 1)[0] in cluster.ACCELERATOR].options(**options).remote
        slots.append((sweep_config, point, submit(launcher.hydra_context, sweep_config, launcher.task_function,
                                                  Singleton.get_state(), info, point, cap_bytes)))
    try:
        return [_run_job(launcher.hydra_context, launcher.task_function, sweep_config, point) if ref is None
                else _collect(launcher, sweep_config, point, ref) for sweep_config, point, ref in slots]
    except KeyboardInterrupt:
        for _, _, ref in slots:
            if ref is not None:
                ray.cancel(ref, force=True)
        raise


def remote_functions() -> dict[bool, Any]:
    """The point's Ray function, by whether it holds an accelerator. An accelerator point runs alone in its worker
    process (`max_calls=1`: the worker exits after it), so no later point inherits its card, its allocator or its
    compiled graphs. Ray gives that default only to functions decorated with num_gpus (never to NPUs), and `.options()`
    cannot set it: it is set here, at decoration."""
    return {True: ray.remote(max_calls=1)(_run_point), False: ray.remote(_run_point)}


def _job_dir(sweep_config: DictConfig) -> Path:
    return Path(str(sweep_config.hydra.sweep.dir)) / str(sweep_config.hydra.sweep.subdir)


def _collect(launcher: Any, sweep_config: DictConfig, point: dict, ref: Any) -> JobReturn:
    """The point's JobReturn; its worker's files written here when the head does not share its storage; a dead worker
    recorded here as `error`, tracking pending."""
    job_dir = _job_dir(sweep_config)
    try:
        ret, files = ray.get(ref)
    except ray.exceptions.RayError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        what = "raised" if isinstance(exc, ray.exceptions.RayTaskError) else "died before the point finished"
        worker = _read_json(job_dir / WORKER_FILE) or {}
        where = f" (pid {worker['pid']} on {worker.get('hostname')}, Ray node {worker.get('node_ip')})" if worker else ""
        held = _read_json(job_dir / "result.json")
        if held and held.get("job_id") == point["job_id"]:  # shared storage: the worker's own record is here; sync logs it
            print(f"ray: point {sweep_config.hydra.job.num}: its worker{where} {what} after writing its result", flush=True)
            ret = JobReturn(overrides=list(sweep_config.hydra.overrides.task), cfg=sweep_config, hydra_cfg=None,
                            working_dir=str(job_dir), task_name=str(sweep_config.hydra.job.name),
                            status=JobStatus.COMPLETED)
            ret.return_value = held.get("status", "error")
            return ret
        reason = f"the Ray worker running this point{where} {what} ({type(exc).__name__}: {first}); rerun the point"
        pending = ("its Ray worker died mid-point: `python run.py mode=sync` logs this record, replacing any partial "
                   "copy the worker left")
        return _run_job(launcher.hydra_context, launcher.task_function, sweep_config,
                        {**point, "preset": ["error", reason], "pending": pending, "host": worker.get("host")})
    held = _read_json(job_dir / "result.json")
    if not (held and held.get("job_id") == point["job_id"]):  # no shared storage: the worker's copy comes here
        _write_files(job_dir, files)
    return ret


def _run_job(hydra_context: Any, task_function: Any, sweep_config: DictConfig, point: dict,
             card: str = "") -> JobReturn:
    """Hydra's job of one point, with the point's record (and the card kind Ray assigned it) in the environment; on a
    worker, or on the head for a point decided there (skipped: no node has its device; error: its worker died), so
    that every point's result.json, run and summary row look alike."""
    from huggy_exp.placement import ASSIGNED_CARD_ENV

    os.environ[POINT_ENV] = json.dumps(point)
    if card:
        os.environ[ASSIGNED_CARD_ENV] = card
    try:
        HydraConfig.instance().set_config(sweep_config)
        return run_job(hydra_context=hydra_context, task_function=task_function, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    finally:
        os.environ.pop(POINT_ENV, None)
        os.environ.pop(ASSIGNED_CARD_ENV, None)


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_files(job_dir: Path, files: dict[str, bytes]) -> None:
    """The worker's job folder, here (result.json last, atomically); names that would leave the folder are dropped."""
    from huggy_exp.results import atomic_write

    job_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(files, key=lambda n: n == "result.json"):
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts:
            continue
        atomic_write(job_dir / rel, lambda tmp, data=files[name]: Path(tmp).write_bytes(data))  # its folders made too


def host_facts(device: str) -> dict:
    """Where a point runs: hostname, Ray node, its worker process, the cards Ray gave it (`card`: the one it ran on, as
    the node numbers its cards, whatever index the point's device string said), the device's name, driver and CANN."""
    from huggy_exp import environment, placement

    kind = device.split(":", 1)[0]
    ctx = ray.get_runtime_context()
    cards = {k: v for k, v in ctx.get_accelerator_ids().items() if v}
    versions = environment.versions()
    held = cards.get(cluster.ACCELERATOR.get(kind, ""), [])
    return {"hostname": platform.node(), "ray_node_id": ctx.get_node_id(), "ray_node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(), "cards": json.dumps(cards, sort_keys=True) if cards else "none",
            "card": f"{kind}:{held[0]}" if len(held) == 1 else "none",  # the card this point ran on, as its node numbers it
            "device_name": environment.cpu()["model"] if kind == "cpu" else placement.device_name(kind),
            "cuda_driver": versions["cuda_driver"], "npu_driver": versions["npu_driver"], "cann": versions["cann"]}


def _files(job_dir: Path, cap_bytes: int) -> dict[str, bytes]:
    """The job folder's files for the head: result.json always, the others while they fit in `cap_bytes`."""
    out, total = {}, 0
    paths = sorted((p for p in job_dir.rglob("*") if p.is_file()), key=lambda p: (p.name != "result.json", str(p)))
    for path in paths:
        size = path.stat().st_size
        if path.name != "result.json" and total + size > cap_bytes:
            continue
        out[path.relative_to(job_dir).as_posix()] = path.read_bytes()
        total += size
    return out


def _run_point(hydra_context: Any, sweep_config: DictConfig, task_function: Any, singleton_state: Any, sweep_info: dict,
               point: dict, cap_bytes: int) -> tuple[JobReturn, dict[str, bytes]]:
    """On a worker: the sweep's sweep.json where this host lacks it, WORKER_FILE, then Hydra's job with the point's
    job id and host facts; returns the JobReturn and the job folder's files."""
    from huggy_exp.results import atomic_write_text

    setup_globals()
    Singleton.set_state(singleton_state)
    HydraConfig.instance().set_config(sweep_config)
    sweep_dir = Path(str(sweep_config.hydra.sweep.dir))
    if sweep_info and tracking.read_sweep(sweep_dir) is None:  # no shared storage: the parent run's id comes with us
        tracking.write_sweep(sweep_dir, sweep_info)
    job_dir = _job_dir(sweep_config)  # made by the atomic write of WORKER_FILE
    device = str(sweep_config.device)
    host = host_facts(device)
    atomic_write_text(job_dir / WORKER_FILE, json.dumps({"pid": os.getpid(), "hostname": host["hostname"],
                                                         "node_ip": host["ray_node_ip"], "started": time.time(),
                                                         "host": host}) + "\n")
    kind = device.split(":", 1)[0]
    card = kind if kind in cluster.ACCELERATOR and host["cards"] != "none" else ""
    ret = _run_job(hydra_context, task_function, sweep_config, {**point, "host": host}, card)
    return ret, _files(job_dir, cap_bytes)
