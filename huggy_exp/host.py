"""What this host has left for a job: free disk and available memory, read before anything is written or allocated
(docs/reliability.md)."""

from __future__ import annotations

import os
import resource
from pathlib import Path

from huggy_exp.errors import UserError

MIN_FREE_BYTES = 64 << 20  # a job dir's disk must have this much free before a job starts (config, arrays, plots, run.log)
MEMORY_SHARE = 0.8  # a job may plan to take this share of the memory available when it starts


def size(n: float) -> str:
    """`1.5 GiB`, `640 KiB`, `12 B`."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{int(n)} B"


def free_bytes(path: str | Path) -> int:
    """Free bytes (for this user) on the filesystem of `path` or of its nearest existing parent."""
    p = Path(path).expanduser().absolute()
    existing = next((q for q in (p, *p.parents) if q.exists()), Path("/"))
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize


def mount_point(path: str | Path) -> Path:
    """The mount point of the filesystem holding `path` (or its nearest existing parent): the disk a message names."""
    p = Path(path).expanduser().absolute()
    p = next((q for q in (p, *p.parents) if q.exists()), Path("/"))
    dev = p.stat().st_dev
    while p.parent != p and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def check_free(path: str | Path, key: str) -> None:
    """Refuse to start a job on a disk that cannot hold its files (Hydra writes .hydra/ before any code of ours runs)."""
    free = free_bytes(path)
    if free < MIN_FREE_BYTES:
        raise UserError(f"{key}={path}: only {size(free)} free on its disk, a job needs at least "
                        f"{size(MIN_FREE_BYTES)}; free some space or choose another folder")


def available_memory() -> tuple[int, str]:
    """(bytes this process may still take, what bounds it): the least of the host's MemAvailable, the cgroup's
    memory.max headroom and the address-space limit (RLIMIT_AS) headroom."""
    bounds: list[tuple[int, str]] = []
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        bounds.append((int(info["MemAvailable"].split()[0]) * 1024, "available on the host (MemAvailable)"))
    except (OSError, KeyError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            bounds.append((int(limit) - used, "left in this cgroup (memory.max)"))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            vm = next(int(ln.split()[1]) * 1024 for ln in Path("/proc/self/status").read_text().splitlines()
                      if ln.startswith("VmSize:"))
        except (OSError, StopIteration, ValueError):
            vm = 0
        bounds.append((soft - vm, "left under this process's address-space limit (RLIMIT_AS)"))
    if not bounds:
        return 1 << 62, "unknown"
    free, why = min(bounds)
    return max(free, 0), why
