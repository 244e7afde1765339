"""Ray across hosts as pure functions: what each sweep point asks of the cluster, whether any node can ever meet it,
and whether the tracking store is one every node reaches (docs/tracking-and-sweeps.md#ray-across-hosts). No `import
ray`: hydra_plugins/huggy_ray_launcher/_core.py hands these functions plain dicts (`ray.nodes()`), so the rules are
tested without a cluster and a sweep without Ray never pays Ray's import."""

from __future__ import annotations

import importlib.util
import socket
from urllib.parse import urlparse

from huggy_exp.config import modes
from huggy_exp.errors import UserError

EXTRA = "pip install -e '.[ray]'"  # the optional extra that installs hydra-ray-launcher and ray[default]
# the Ray resource of each accelerator kind: CUDA GPUs are Ray's own `GPU`; Ascend NPUs its `NPU` (for which Ray sets
# ASCEND_RT_VISIBLE_DEVICES); Apple's MPS has no Ray resource: a Mac node declares --resources '{"MPS": 1}'
ACCELERATOR = {"cuda": "GPU", "npu": "NPU", "mps": "MPS"}
LOOPBACK = ("localhost", "127.0.0.1", "::1", "0.0.0.0")


def require_ray() -> None:
    """The [ray] extra is installed (found without importing it: Ray's import costs seconds)."""
    for module, dist in (("ray", "ray[default]"), ("hydra_plugins.hydra_ray_launcher", "hydra-ray-launcher")):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UserError(f"hydra/launcher=ray needs {dist}, which is not installed: {EXTRA}")


def request(device: str, mode: str, cpus_per_point: int, node_cpus: list[float]) -> dict:
    """The Ray resources (ray.remote's options) one point asks for: cuda:N, npu:N, mps -> one GPU, NPU or MPS (a card is
    never shared) and one CPU to drive it; cpu -> `cpus_per_point` CPUs, and a timed cpu point every CPU of the largest
    node (`node_cpus`: each alive node's count), so that nothing else asking for a CPU runs beside it while it times."""
    name = ACCELERATOR.get(str(device).split(":", 1)[0])
    if name is not None:
        return {"num_cpus": 1, "num_gpus": int(name == "GPU"), "resources": {} if name == "GPU" else {name: 1}}
    cpus = float(cpus_per_point)
    if modes()[mode].timed:  # a mode that times nothing may share a node's CPUs
        cpus = max([cpus, *node_cpus])
    return {"num_cpus": cpus, "num_gpus": 0, "resources": {}}


def node_totals(node: dict) -> dict[str, float]:
    """One `ray.nodes()` entry's total resources, with Ray's names (CPU, GPU, NPU, custom ones)."""
    return {k: float(v) for k, v in (node.get("Resources") or {}).items()}


def unmet(req: dict, nodes: list[dict]) -> str | None:
    """Why no alive node can ever run this request (`num_cpus` -> CPU, `num_gpus` -> GPU, custom resources as they
    are; None when one can): a node must hold every resource at once."""
    alive = [n for n in nodes if n.get("Alive", True)]
    need = {"CPU": req.get("num_cpus") or 0, "GPU": req.get("num_gpus") or 0, **(req.get("resources") or {})}
    need = {k: float(v) for k, v in need.items() if float(v) > 0}
    if not alive:
        return "the Ray cluster has no alive node"
    if any(all(node_totals(n).get(k, 0.0) >= v for k, v in need.items()) for n in alive):
        return None
    asked = ", ".join(f"{k}={v:g}" for k, v in need.items())
    have = "; ".join(describe(n) for n in alive)
    return f"no node of the Ray cluster has {asked} (nodes: {have})"


def describe(node: dict) -> str:
    """`127.0.0.1 CPU=1 NPU=2` (Ray's own node:/memory bookkeeping left out)."""
    totals = node_totals(node)
    shown = " ".join(f"{k}={v:g}" for k, v in sorted(totals.items())
                     if not k.startswith("node:") and k not in ("memory", "object_store_memory"))
    return f"{node.get('NodeManagerAddress', '?')} {shown}".strip()


def missing_device(device: str, nodes: list[dict]) -> str | None:
    """A point whose device no node has: the reason it is skipped (its device kind is absent from the cluster)."""
    name = ACCELERATOR.get(str(device).split(":", 1)[0])
    if name is None or unmet({"resources": {name: 1}}, nodes) is None:
        return None
    return (f"device {device}: no node of the Ray cluster has a {name} resource (nodes: "
            f"{'; '.join(describe(n) for n in nodes if n.get('Alive', True)) or 'none'})")


def hosts(nodes: list[dict]) -> list[str]:
    """The distinct machines among the alive nodes (two nodes on one machine share its address)."""
    return sorted({str(n.get("NodeManagerAddress") or n.get("NodeName") or "?") for n in nodes if n.get("Alive", True)})


def check_store(uri: str, cluster_hosts: list[str], shared_filesystem: bool = False) -> None:
    """A store every worker can reach: on a cluster of several machines a SQLite file on one host's disk and a server
    on the head's loopback are refused (UserError), saying why and what to use."""
    if len(cluster_hosts) < 2:
        return
    parsed = urlparse(uri)
    where = ", ".join(cluster_hosts)
    if parsed.scheme in ("sqlite", "file", ""):
        if shared_filesystem and parsed.scheme == "sqlite":
            return
        raise UserError(f"tracking.uri={uri}: a file store on one host's disk, but the Ray cluster spans {len(cluster_hosts)} "
                        f"machines ({where}) whose workers cannot write it; start `mlflow server --host <head address> "
                        "--port 5000` on the head and give tracking.uri=http://<head address>:5000 (or, with the "
                        "SQLite file on a filesystem every node mounts at the same path, hydra.launcher.shared_filesystem=true)")
    if parsed.scheme in ("http", "https") and (parsed.hostname or "") in LOOPBACK:
        raise UserError(f"tracking.uri={uri}: a server on the head's loopback, which the workers of the other "
                        f"machines ({where}) cannot reach; bind the server to an address they reach "
                        "(mlflow server --host <head address>) and give that address")


def split_address(address: str) -> tuple[str, int] | None:
    """`host:port` of a cluster address (`ray://host:10001` or `host:6379`); None for `auto` or `local`."""
    text = str(address).strip()
    if text in ("auto", "local", ""):
        return None
    text = text.split("://", 1)[-1]
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"hydra.launcher.ray.init.address={address!r}: not a cluster address; give <head host>:<port> "
                        "(what `ray start --head --port=<port>` printed), or leave it null for a local cluster")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float) -> None:
    """Something listens at the cluster's address within `timeout_s` (Ray's own connect retries take minutes)."""
    target = split_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        raise UserError(f"hydra.launcher.ray.init.address={address}: no Ray cluster answers at {target[0]}:{target[1]} "
                        f"within {timeout_s:g} s ({exc.strerror or exc}); start one with `ray start --head "
                        f"--port={target[1]}` on the head, or leave the address null for a local cluster") from None
