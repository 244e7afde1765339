"""Ray across hosts (`hydra/launcher=ray`): the resource of each point, the refusals, the records a launcher decides,
the dual benchmark across hosts (fast, pure python); then a real two-node Ray cluster on this machine with an NPU node
and a loopback MLflow server (slow). docs/tracking-and-sweeps.md#ray-across-hosts."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from conftest import PYTHON, REPO, compose_config, free_port, start_server, stop_server, subprocess_env
from huggy_exp import cluster, compare
from huggy_exp.errors import UserError

HAS_RAY = importlib.util.find_spec("ray") is not None


def node(ip: str, **resources: float) -> dict:
    """A `ray.nodes()` entry as Ray returns it (the keys huggy_exp.cluster reads)."""
    return {"NodeID": uuid.uuid4().hex, "Alive": True, "NodeManagerAddress": ip,
            "Resources": {f"node:{ip}": 1.0, "memory": 1e9, "object_store_memory": 1e8, **resources}}


GPU_HOST, NPU_HOST = node("10.0.0.1", CPU=32, GPU=8), node("10.0.0.2", CPU=64, NPU=8)


# --- what each point asks for (fast)


def test_each_device_asks_for_its_own_ray_resource_and_a_cpu_to_drive_it():
    assert cluster.request("cuda:3", "precision", 1, [32, 64]) == {"num_cpus": 1, "num_gpus": 1, "resources": {}}
    assert cluster.request("npu:1", "benchmark", 1, [32, 64]) == {"num_cpus": 1, "num_gpus": 0, "resources": {"NPU": 1}}
    assert cluster.request("npu", "info", 4, [32, 64]) == {"num_cpus": 1, "num_gpus": 0, "resources": {"NPU": 1}}


def test_a_timed_cpu_point_holds_every_cpu_of_the_largest_node_an_untimed_one_its_share():
    assert cluster.request("cpu", "benchmark", 2, [32, 64])["num_cpus"] == 64  # nothing else asking for a CPU runs beside it
    assert cluster.request("cpu", "precision", 2, [32, 64])["num_cpus"] == 64  # precision reports a latency too
    assert cluster.request("cpu", "info", 2, [32, 64])["num_cpus"] == 2
    assert cluster.request("cpu", "export-onnx", 1, [])["num_cpus"] == 1


def test_a_device_no_node_has_is_a_skip_reason_and_a_request_no_node_meets_is_unmet():
    nodes = [GPU_HOST, node("10.0.0.3", CPU=4)]
    assert "no node of the Ray cluster has a NPU resource" in cluster.missing_device("npu:0", nodes)
    assert cluster.missing_device("cuda:0", nodes) is None and cluster.missing_device("cpu", nodes) is None
    # one node must hold all of it at once: 8 GPUs here and 64 CPUs there is not a node with both
    assert cluster.unmet({"num_cpus": 64, "num_gpus": 1}, nodes + [NPU_HOST]).startswith("no node of the Ray cluster has CPU=64, GPU=1")
    assert cluster.unmet({"num_cpus": 32, "num_gpus": 1}, nodes) is None
    dead = {**NPU_HOST, "Alive": False}
    assert "NPU" in cluster.missing_device("npu:0", [GPU_HOST, dead])  # a dead node's NPUs do not count
    assert cluster.unmet({"num_cpus": 1}, [dead]) == "the Ray cluster has no alive node"


def test_file_stores_and_loopback_servers_are_refused_on_a_cluster_of_several_machines_saying_why():
    two = cluster.hosts([GPU_HOST, NPU_HOST, node("10.0.0.2", CPU=1)])
    assert two == ["10.0.0.1", "10.0.0.2"]
    with pytest.raises(UserError, match=r"file store on one host's disk.*spans 2 machines.*mlflow server"):
        cluster.check_store("sqlite:////home/me/repo/mlruns/mlflow.db", two)
    with pytest.raises(UserError, match="head's loopback"):
        cluster.check_store("http://127.0.0.1:5000", two)
    cluster.check_store("http://10.0.0.1:5000", two)
    cluster.check_store("sqlite:////shared/mlflow.db", two, shared_filesystem=True)  # the user says every node mounts it
    cluster.check_store("sqlite:////home/me/repo/mlruns/mlflow.db", ["10.0.0.1"])  # one machine: its disk is everyone's
    with pytest.raises(UserError, match="not a cluster address"):
        cluster.split_address("head-without-port")
    assert cluster.split_address("ray://10.0.0.1:10001") == ("10.0.0.1", 10001) and cluster.split_address("auto") is None


def _cli(args: list[str]) -> tuple[int, str, str]:
    import run

    out, err, saved = io.StringIO(), io.StringIO(), sys.argv[:]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run.cli(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            sys.argv[:] = saved
    return code, out.getvalue(), err.getvalue()


def test_without_the_ray_extra_a_ray_sweep_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    code, out, err = _cli(["-m", "hydra/launcher=ray", "device=cpu,npu:0", "tracking=none", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "hydra/launcher=ray needs ray[default], which is not installed: pip install -e '.[ray]'" in err
    assert not (tmp_path / "s").exists()  # refused before Hydra made anything


def test_an_unreachable_cluster_address_is_one_line_and_exit_2_in_seconds(monkeypatch, tmp_path):
    monkeypatch.setattr(cluster, "require_ray", lambda: None)  # the address is checked before Ray is imported
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:  # another test of this worker's: set
        monkeypatch.delitem(sys.modules, name)  # aside for this one (restored after), so the check below sees this run's
    port = free_port()  # nothing listens there
    started = time.monotonic()
    code, out, err = _cli(["-m", "hydra/launcher=ray", f"hydra.launcher.ray.init.address=127.0.0.1:{port}",
                           "hydra.launcher.connect_timeout_s=3", "device=cpu", "dtype=fp32,bf16", "tracking=none",
                           f"hydra.sweep.dir={tmp_path / 's'}"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"hydra.launcher.ray.init.address=127.0.0.1:{port}: no Ray cluster answers at 127.0.0.1:{port}" in err
    assert time.monotonic() - started < 30 and "ray" not in sys.modules  # Ray's own retries would take minutes


def test_the_launcher_is_a_hydra_plugin_whose_start_up_imports_no_ray():
    code = ("import sys; from hydra.core.plugins import Plugins; from hydra.plugins.launcher import Launcher; "
            "names = [p.__name__ for p in Plugins.instance().discover(Launcher)]; "
            "print('HuggyRayLauncher' in names, 'ray' in sys.modules)")
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.stdout.split() == ["True", "False"], done.stdout + done.stderr


def test_hydra_launcher_ray_composes_to_this_projects_launcher():
    from hydra import compose, initialize_config_dir

    from huggy_exp.preflight import setup

    setup()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=ray", "hydra.launcher.cpus_per_point=2"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.huggy_ray_launcher.launcher.HuggyRayLauncher"
    assert launcher.cpus_per_point == 2 and launcher.ray.init.address is None


def test_a_point_a_launcher_decided_keeps_its_job_id_host_and_stays_pending(tmp_path):
    """A dead worker's point: recorded here under the worker's job id, with its host, and left for `mode=sync`."""
    from huggy_exp import app, tracking

    cfg = compose_config(["mode=action", "tracking=mlflow", f"tracking.uri=sqlite:///{tmp_path / 'db' / 'm.db'}"])
    host = {"hostname": "npu-host-7", "ray_node_ip": "10.0.0.2", "cards": '{"NPU": ["3"]}', "cann": "8.0.RC3"}
    job = app.JobInfo(job_id="a" * 32, host=host, preset=("error", "the Ray worker running this point died"),
                      pending="its Ray worker died mid-point: `python run.py mode=sync` logs it")
    result = app.execute(cfg, tmp_path / "job", "action", job)
    record = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result.status == "error" and record["job_id"] == "a" * 32 and record["host"] == host
    assert record["tracking"] == {"status": "pending", "reason": job.pending}
    assert not (tmp_path / "db").exists()  # nothing was logged: sync does it, exactly once
    tags = tracking.run_tags(record, None)
    assert tags["host.hostname"] == "npu-host-7" and tags["host.cann"] == "8.0.RC3" and tags["env.host"]
    skipped = app.execute(cfg, tmp_path / "job2", "action", app.JobInfo(preset=("skipped", "no node has a NPU")))
    assert skipped.status == "skipped" and skipped.reason == "no node has a NPU"


def test_point_info_reads_what_the_launcher_set(monkeypatch):
    from huggy_exp import app

    monkeypatch.delenv(app.POINT_ENV, raising=False)
    assert app.point_info() == {}  # any other launcher: JobInfo's defaults
    monkeypatch.setenv(app.POINT_ENV, json.dumps({"job_id": "b" * 32, "preset": ["skipped", "why"], "host": {"hostname": "h"}}))
    assert app.point_info() == {"job_id": "b" * 32, "host": {"hostname": "h"}, "preset": ("skipped", "why"), "pending": None}


def test_on_a_ray_worker_the_card_ray_assigned_is_the_points_device(monkeypatch):
    """Ray makes exactly the assigned card visible (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES): `cuda:3` there
    is index 0 of this process; elsewhere the index means what it says."""
    import torch

    from huggy_exp import placement
    from huggy_exp.errors import Unsupported

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv(placement.ASSIGNED_CARD_ENV, raising=False)
    with pytest.raises(Unsupported, match="only 1 cuda device"):
        placement.resolve_device("cuda:3")
    monkeypatch.setenv(placement.ASSIGNED_CARD_ENV, "cuda")
    assert placement.resolve_device("cuda:3") == torch.device("cuda", 0)
    monkeypatch.setenv(placement.ASSIGNED_CARD_ENV, "npu")  # another kind's card: the index stands
    with pytest.raises(Unsupported):
        placement.resolve_device("cuda:3")


@pytest.mark.skipif(not HAS_RAY, reason="the [ray] extra is not installed")
def test_failure_6_accelerator_points_under_ray_run_one_per_worker_process():
    """Issue 24, failure 6: `ray.remote(f).options(num_gpus=1 | resources={"NPU": 1})` loses Ray's max_calls=1 (Ray
    sets it only for functions decorated with num_gpus, and `.options()` cannot set it), so a reused worker timed a
    later point on its first card. An accelerator point's function exits its worker after one call; a cpu point's may
    stay."""
    from hydra_plugins.huggy_ray_launcher import _core

    remote = _core.remote_functions()
    assert remote[True]._max_calls == 1 and remote[False]._max_calls == 0


def test_two_cards_that_ran_on_one_card_are_not_a_two_card_check():
    """Under Ray `npu:0` and `npu:1` name no card (Ray picks one): the record says which card each ran on, and two
    points on one card are never reported as two cards agreeing, nor one card disagreeing with itself."""
    point = lambda job, device, cls, card: {"job": job, "device": device, "class": cls, "batch_size": 64, "card": card}  # noqa: E731
    same = [point(0, "npu:0", 0, "a2/npu:0"), point(1, "npu:1", 0, "a2/npu:0")]
    assert compare.one_card(same) == "npu:0 (job 0), npu:1 (job 1) all ran on a2/npu:0"
    assert compare.cards_disagree([point(0, "npu:0", 0, "a2/npu:0"), point(1, "npu:1", 1, "a2/npu:0")]) is None
    two = [point(0, "npu:0", 0, "a2/npu:0"), point(1, "npu:1", 1, "a2/npu:1")]
    assert compare.one_card(two) is None and compare.cards_disagree(two) == "npu:1 (job 1) differs bit for bit from npu:0 (job 0)"
    lines = compare.comparison_lines([], [{"mode": "fingerprint", "dtype": "fp32", "obs": "random/64/x1.0", "seed": 0,
                                           "identical": True, "points": same, "one_card": compare.one_card(same)}], {})
    assert lines == ["agreement fingerprint fp32 random/64/x1.0 seed 0: npu:0(job 0), npu:1(job 1): bit-identical; "
                     "NOT a two-card check: npu:0 (job 0), npu:1 (job 1) all ran on a2/npu:0"]


def _row(job: str, device: str, dtype: str, host: str, vs_fp64: dict, status: str = "passed") -> dict:
    return {"job": job, "device": device, "dtype": dtype, "host": host, "status": status, "mode": "precision",
            "knobs": {}, "obs": "random/64/x1.0", "seed": 0, "model_sha256": "m", "batch_size": 64, "vs_fp64": vs_fp64}


def test_the_comparison_has_the_dual_benchmark_of_a_cuda_and_an_npu_point_of_one_dtype_across_hosts():
    metrics = {"actions/vs_fp64/rmse": 2e-3, "actions/vs_fp64/max_rel": 0.02, "discrete_actions/vs_fp64/agreement": 0.99,
               "actions/vs_fp64/cosine": 1.0}
    npu = compare.errors_vs_fp64(metrics)
    assert npu == {"actions": {"rmse": 2e-3, "max_rel": 0.02}, "discrete_actions": {"mismatch_share": pytest.approx(0.01)}}
    rows = [_row("0", "cuda:0", "fp16", "g1", {"actions": {"rmse": 1e-3, "max_rel": 0.04}}),
            _row("1", "npu:0", "fp16", "a2", {"actions": {"rmse": 2.5e-3, "max_rel": 0.02}}),
            _row("2", "npu:1", "bf16", "a2", {"actions": {"rmse": 1e-3, "max_rel": 0.01}}),  # no cuda bf16 point
            _row("3", "npu:0", "fp16", "a3", {"actions": {"rmse": 1e-3, "max_rel": 0.01}}, status="skipped")]
    dual = compare.dual_benchmarks(rows)
    assert len(dual) == 1 and dual[0]["npu"] == {"job": "1", "device": "npu:0", "host": "a2"}
    by_metric = {r["metric"]: r for r in dual[0]["rows"]}
    assert by_metric["rmse"]["ratio"] == pytest.approx(2.5) and by_metric["rmse"]["verdict"] == "fail"
    assert by_metric["max_rel"]["ratio"] == pytest.approx(0.5) and by_metric["max_rel"]["verdict"] == "pass"
    assert dual[0]["verdict"] == "fail"
    line, = compare.dual_lines(dual)
    assert line.startswith("dual benchmark fp16 precision: npu:0(job 1 on a2) vs cuda:0(job 0 on g1): fail")
    assert "actions rmse ratio 2.5 fail" in line


# --- a real cluster on this machine (slow): a head (1 CPU) and an "NPU node" (1 CPU, NPU=2), a loopback MLflow server

MARK = "HUGGY_EXP_TEST_RAY_CLUSTER"  # every process of the test cluster inherits it, and runs in its `ray start`'s session


def _marked(mark: str, sessions: set[int]) -> list[int]:
    """This test cluster's processes: the marker in their environment, or (for Ray's setproctitle'd agents, whose
    environment reads blank) a session of its own `ray start` commands."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                session = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[3])
                if session in sessions or f"{MARK}={mark}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
    return [p for p in pids if p != os.getpid()]


def _end(mark: str, sessions: set[int], grace_s: float = 10.0) -> None:
    """SIGTERM every process of this test cluster, then SIGKILL what is left after `grace_s` (bounded)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _marked(mark, sessions):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while _marked(mark, sessions) and time.monotonic() < deadline:
            time.sleep(0.2)


def _ray(*args: str, env: dict, sessions: set[int], timeout: int = 180) -> subprocess.CompletedProcess:
    """`ray start …` in a session of its own (its daemons stay in it), bounded in time."""
    ray_bin = Path(PYTHON).with_name("ray")
    proc = subprocess.Popen(["nice", "-n", "10", str(ray_bin), "start", *args, "--disable-usage-stats",
                             "--object-store-memory=100000000"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    sessions.add(proc.pid)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def ray_cluster(huggy_exp_cache):
    if not HAS_RAY:
        pytest.skip("the [ray] extra is not installed: pip install -e '.[ray]'")
    mark = uuid.uuid4().hex
    temp = tempfile.mkdtemp(prefix="hxr", dir="/tmp")  # short: Ray's socket paths must stay under 107 characters
    env = {**subprocess_env(huggy_exp_cache), MARK: mark, "RAY_USAGE_STATS_ENABLED": "0"}
    port, sessions = free_port(), set()
    try:
        head = _ray("--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false",
                    f"--temp-dir={temp}", env=env, sessions=sessions)
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-2000:]
        npu = _ray(f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=1", '--resources={"NPU": 2}',
                   env=env, sessions=sessions)
        assert npu.returncode == 0, npu.stdout[-2000:] + npu.stderr[-2000:]
        code = ("import json, ray; ray.init(address='127.0.0.1:%d', logging_level='error'); "
                "print(json.dumps([n['NodeID'] for n in ray.nodes() if n['Alive'] and 'NPU' in n['Resources']]))" % port)
        found = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        npu_nodes = json.loads(found.stdout.strip().splitlines()[-1])
        assert len(npu_nodes) == 1, found.stdout + found.stderr
        yield {"address": f"127.0.0.1:{port}", "npu_node": npu_nodes[0], "env": env}
    finally:
        _end(mark, sessions)
        assert not _marked(mark, sessions), "the test cluster's processes outlived its teardown"
        subprocess.run(["rm", "-rf", temp], timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray_server")
    port = free_port()
    proc = start_server(root, port)
    yield f"http://127.0.0.1:{port}"
    stop_server(proc)


def _sweep(args: list[str], ray_cluster: dict, **kw):
    cmd = ["nice", "-n", "10", PYTHON, "run.py", "-m", "hydra/launcher=ray",
           f"hydra.launcher.ray.init.address={ray_cluster['address']}", *args]
    return subprocess.Popen(cmd, cwd=REPO, env=ray_cluster["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, **kw)


def _children(uri: str, parent: str):
    import mlflow
    from mlflow.entities import ViewType

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("huggy_exp")
    runs = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'",
                              run_view_type=ViewType.ACTIVE_ONLY, max_results=100)
    return client.get_run(parent), runs


@pytest.mark.slow
def test_a_sweep_across_the_cluster_places_skips_and_tracks_every_point(ray_cluster, server, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(["device=cpu,npu:0,cuda:0", "dtype=fp32,bf16", "obs.rows=4", f"hydra.sweep.dir={sweep}",
                   f"tracking.uri={server}"], ray_cluster)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/result.json")}
    assert len(records) == 6, out[-3000:]
    by_device: dict[str, list[dict]] = {}
    for r in records.values():
        by_device.setdefault(r["device"], []).append(r)
    for r in by_device["npu:0"]:  # scheduled on the NPU node (Ray gave it one of that node's NPUs), skipped there
        assert r["status"] == "skipped" and "npu needs torch_npu, which is not installed here" in r["reason"]
        assert r["host"]["ray_node_id"] == ray_cluster["npu_node"]
        assert json.loads(r["host"]["cards"])["NPU"][0] in ("0", "1")
    for r in by_device["cuda:0"]:  # decided on the head before submission: no node has a GPU
        assert r["status"] == "skipped" and r["reason"].startswith("device cuda:0: no node of the Ray cluster has a GPU resource")
        assert "host" not in r
    for r in by_device["cpu"]:
        assert r["status"] == "passed" and r["host"]["hostname"] and r["host"]["device_name"]
    assert {r["dtype"] for r in by_device["cpu"]} == {"fp32", "bf16"}
    assert all(r["tracking"]["status"] == "logged" for r in records.values())
    info = json.loads((sweep / "sweep.json").read_text())
    parent, children = _children(server, info["parent_run_id"])
    assert parent.info.status == "FINISHED" and len(children) == 6
    assert sorted(c.data.tags["huggy.job_id"] for c in children) == sorted(r["job_id"] for r in records.values())
    assert not [c for c in children if c.info.status == "RUNNING"]
    npu_runs = [c for c in children if c.data.tags["device"] == "npu:0"]
    assert all(c.data.tags["host.ray_node_id"] == ray_cluster["npu_node"] and "host.cann" in c.data.tags for c in npu_runs)
    summary = json.loads((sweep / "summary.json").read_text())
    assert len(summary["rows"]) == 6 and all(r["host"] for r in summary["rows"])
    assert "2/6 passed, 0 failed, 4 skipped, 0 error" in out


@pytest.mark.slow
def test_each_accelerator_point_runs_in_a_worker_of_its_own_and_records_its_card(ray_cluster, tmp_path):
    """Four NPU points on the NPU node (one CPU: they run one after another): four worker processes, each point's
    record naming the card Ray gave it (skipped there: no torch_npu, after the worker started)."""
    sweep = tmp_path / "sweep"
    proc = _sweep(["device=npu:0,npu:1", "dtype=fp32,bf16", "mode=info", "tracking=none", f"hydra.sweep.dir={sweep}"],
                  ray_cluster)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-4000:]
    hosts = [json.loads(p.read_text())["host"] for p in sorted(sweep.glob("*/result.json"))]
    assert len(hosts) == 4 and len({h["pid"] for h in hosts}) == 4, hosts
    assert all(h["card"] in ("npu:0", "npu:1") and h["ray_node_id"] == ray_cluster["npu_node"] for h in hosts)


@pytest.mark.slow
def test_a_worker_killed_mid_point_is_recorded_and_sync_completes_it_exactly_once(ray_cluster, server, tmp_path):
    sweep = tmp_path / "sweep"
    proc = _sweep(["device=cpu", "dtype=fp32,bf16", "obs.rows=4000", f"hydra.sweep.dir={sweep}", f"tracking.uri={server}"],
                  ray_cluster)
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        for marker in sorted(sweep.glob("*/ray_worker.json")):
            with contextlib.suppress(OSError, ValueError, KeyError):
                worker = json.loads(marker.read_text())
                if not (marker.parent / "result.json").exists():
                    os.kill(worker["pid"], signal.SIGKILL)
                    killed = marker.parent
                    break
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    assert killed is not None, "no point was seen running: " + out[-3000:]
    assert proc.returncode == 2, out[-4000:]  # the worst point is an error
    record = json.loads((killed / "result.json").read_text())
    assert record["status"] == "error" and "died before the point finished" in record["reason"]
    assert record["tracking"]["status"] == "pending" and "mode=sync" in record["tracking"]["reason"]
    other = next(p for p in sweep.glob("*/result.json") if p.parent != killed)
    assert json.loads(other.read_text())["status"] == "passed"
    env = ray_cluster["env"]
    for expected in ("1 logged, 0 still pending", "0 pending result(s)"):  # the second sync finds nothing to do
        done = subprocess.run([PYTHON, "run.py", "mode=sync", f"tracking.uri={server}", f"mode.paths=[{sweep}]"], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and expected in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    info = json.loads((sweep / "sweep.json").read_text())
    parent, children = _children(server, info["parent_run_id"])
    assert len(children) == 2 and not [c for c in children if c.info.status == "RUNNING"]
    mine = [c for c in children if c.data.tags["huggy.job_id"] == record["job_id"]]
    assert len(mine) == 1 and mine[0].info.status == "FAILED" and mine[0].data.tags["status"] == "error"


@pytest.mark.slow
def test_bad_cluster_inputs_are_one_line_and_exit_2(ray_cluster, tmp_path):
    cases = [(["hydra.launcher.cpus_per_point=64", "mode=info", "tracking=none"],
              "device=cpu mode=info: no node of the Ray cluster has CPU=64"),
             ([f"tracking.uri=http://127.0.0.1:{free_port()}"], "is not reachable from the Ray node")]
    for args, expected in cases:
        proc = _sweep(["device=cpu", "dtype=fp32,bf16", f"hydra.sweep.dir={tmp_path / uuid.uuid4().hex}", *args], ray_cluster)
        out, _ = proc.communicate(timeout=300)
        lines = [line for line in out.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0] and "Traceback" not in out, out[-3000:]


@pytest.mark.slow
def test_without_shared_storage_the_workers_files_land_in_the_heads_job_folder(tmp_path, monkeypatch):
    """What the head does with a point's return: the worker's job folder written here when the head's has no record of
    that job (no shared storage), names leaving the folder dropped; left alone when the worker wrote here (shared)."""
    if not HAS_RAY:
        pytest.skip("the [ray] extra is not installed: pip install -e '.[ray]'")
    from omegaconf import OmegaConf

    from hydra_plugins.huggy_ray_launcher import _core

    sweep_config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep"), "subdir": "${hydra.job.num}"},
                                               "job": {"num": 4}}})
    record = json.dumps({"job_id": "c" * 32, "status": "passed"}).encode()
    files = {"result.json": record, "actions.npy": b"npy", ".hydra/config.yaml": b"a: 1", "../escape.txt": b"x"}
    monkeypatch.setattr(_core.ray, "get", lambda ref: ("the JobReturn", files))
    assert _core._collect(None, sweep_config, {"job_id": "c" * 32}, object()) == "the JobReturn"
    job = tmp_path / "sweep" / "4"
    assert (job / "result.json").read_bytes() == record and (job / ".hydra" / "config.yaml").read_text() == "a: 1"
    assert (job / "actions.npy").read_bytes() == b"npy" and not (tmp_path / "sweep" / "escape.txt").exists()
    (job / "actions.npy").write_bytes(b"the head's own")  # shared storage: the worker wrote this folder itself
    _core._collect(None, sweep_config, {"job_id": "c" * 32}, object())
    assert (job / "actions.npy").read_bytes() == b"the head's own"
