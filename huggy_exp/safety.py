"""The host's limits at the boundaries: no file replaced unasked, a full disk in one line, memory estimated before it is
taken, archives sized before they are read. docs/reliability.md lists what each guard does and its numbers."""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import platform
import re
import resource
import stat
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from huggy_exp.config import MAX_OBS_BYTES, RowBytes, modes
from huggy_exp.errors import UserError

MIN_FREE_BYTES = 64 << 20  # a job dir's disk must have this much free before a job starts (config, arrays, plots, run.log)
MAX_CHECKPOINT_BYTES = 256 << 20  # a .pt's storages, inflated: ~19x the genuine Huggy .pt (13.5 MB with its optimizer)
MAX_ONNX_BYTES = 256 << 20  # an .onnx plus its external data: ~110x the genuine Huggy .onnx (2.3 MB)
FULL_BYTES = 1 << 20  # a write that fails without an errno while less than this is free ran out of disk
MAX_SWEEP_POINTS = 10_000  # points one -m may launch: each is validated first and runs as a job (a day at 10 s each)
MEMORY_SHARE = 0.8  # a job may plan to take this share of the memory available when it starts
MAX_JSON_BYTES = 64 << 20  # a foreign JSON file (a result.json sync reads, a bundle's manifest): ~300x a sweep point's
MAX_JSON_DEPTH = 64  # nesting of a foreign JSON file (results nest 5 deep); Python's parser recurses per level
MAX_ARRAY_BYTES = 1 << 30  # one array of a foreign .npz (a bundle's inputs, outputs, latency), inflated
MAX_NPZ_BYTES = 2 << 30  # every array of one foreign .npz together, inflated
MAX_LATENCY_SAMPLES = 1_000_000  # a bundle's timed calls per point: what mode.latency.max_samples can record
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def size(n: float) -> str:
    """`1.5 GiB`, `640 KiB`, `12 B`."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{int(n)} B"


# --- disk


def free_bytes(path: str | Path) -> int:
    """Free bytes (for this user) on the filesystem of `path` or of its nearest existing parent."""
    p = Path(path).expanduser().absolute()
    existing = next((q for q in (p, *p.parents) if q.exists()), Path("/"))
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_ERRNOS


def _short_write(exc: BaseException, folder: Path) -> bool:
    """A writer that lost the errno (numpy's `N requested and M written`, torch's `file write failed`) on a disk that
    has no room left: the same full disk."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return False
    if re.search(r"\d+ requested and \d+ written", str(exc)):
        return True
    try:
        return free_bytes(folder) < FULL_BYTES
    except OSError:
        return False


def mount_point(path: str | Path) -> Path:
    """The mount point of the filesystem holding `path` (or its nearest existing parent): the disk a message names."""
    p = Path(path).expanduser().absolute()
    p = next((q for q in (p, *p.parents) if q.exists()), Path("/"))
    dev = p.stat().st_dev
    while p.parent != p and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def disk_full_message(exc: OSError, path: str | Path | None = None) -> str:
    """One line: what could not be written, how much is free on its disk and which disk that is."""
    target = path or exc.filename
    if target is None:
        return f"no space left on a disk ({exc.strerror or exc})"
    where = Path(target).expanduser().absolute()
    return (f"no space left writing {where} ({exc.strerror or exc}): {size(free_bytes(where))} free on its disk "
            f"({mount_point(where)})")


def check_free(path: str | Path, key: str) -> None:
    """Refuse to start a job on a disk that cannot hold its files (Hydra writes .hydra/ before any code of ours runs)."""
    free = free_bytes(path)
    if free < MIN_FREE_BYTES:
        raise UserError(f"{key}={path}: only {size(free)} free on its disk, a job needs at least "
                        f"{size(MIN_FREE_BYTES)}; "
                        "free some space or choose another folder")


# --- job and sweep folders

CLAIM = ".huggy_exp-claim"  # created exclusively in a job or sweep folder before anything else is written there


def folder_in_use(folder: str | Path) -> str | None:
    """Why `folder` cannot be a new job's or sweep's (another job claimed it, or it holds files: the user's, an earlier
    job's); None when it is absent or empty."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return None
    names = sorted(p.name for p in folder.iterdir())
    if CLAIM in names:
        try:
            who = (folder / CLAIM).read_text(errors="replace").strip()[:200]
        except OSError:
            who = "unreadable claim"
        return f"is already claimed by another run ({who or 'no owner recorded'})"
    if not names:
        return None
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"holds files that are not this job's ({shown})"


REFUSED = "refused, so that nothing in it is replaced: choose a new or empty folder (the default is a fresh one per run)"


def check_unused(path: str | Path, key: str) -> Path:
    """The absolute folder `path`, once it is known to be absent or empty (one line naming what is in it otherwise)."""
    folder = Path(path).expanduser().absolute()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{key}={path} is a file, not a folder; {REFUSED}")
    why = folder_in_use(folder)
    if why:
        raise UserError(f"{key}={path} {why}; {REFUSED}")
    return folder


def claim_folder(path: str | Path, key: str) -> Path:
    """Make `path` this process's job or sweep folder before anything is written into it: it must be absent or empty,
    and it is claimed by creating CLAIM exclusively, so that of two processes given one folder exactly one goes on and
    the other is refused in one line, nothing of the first touched; a folder inside a claimed one is that run's.
    Returns the absolute folder."""
    folder = check_unused(path, key)
    owner = next((parent for parent in folder.parents if (parent / CLAIM).is_file()), None)
    if owner is not None:  # a running sweep's point folder (<sweep dir>/0) belongs to that sweep
        raise UserError(f"{key}={path} is inside {owner}, which {folder_in_use(owner)}; {REFUSED}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / CLAIM, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError(f"{key}={path} {folder_in_use(folder) or 'was claimed by another job first'}; {REFUSED}") from None
    except OSError as exc:
        if is_disk_full(exc):
            raise UserError(f"{key}={path}: {disk_full_message(exc, folder / CLAIM)}") from None
        raise UserError(f"{key}={path}: cannot create it ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(f"pid {os.getpid()} on {platform.node()} since {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    return folder


# --- files


def tool_paths() -> list[Path]:
    """What this process is made of: its conf/ tree (beside the package, run.py's), the folder of every imported
    package (huggy_exp, its plugins, torch, hydra, ...) and the file of every imported module (run.py among them)."""
    found = [str(Path(__file__).resolve().parents[1] / "conf")]
    for name, module in list(sys.modules.items()):
        if "." not in name:
            found += list(getattr(module, "__path__", None) or ()) or [getattr(module, "__file__", None)]
    return [Path(p) for p in found if isinstance(p, str)]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def claim_output(path: str | Path, overwrite: bool, protected: Iterable[str | Path | None], key: str) -> Path:
    """The output file `path`, once it is known not to replace anything unasked: an existing file is refused unless
    `overwrite`; a file the job reads or the tool owns (`protected`: files, or folders whose files are all protected),
    one the tool is made of (tool_paths), and anything that is not a regular file (a device, a FIFO, a socket) always.
    Files are known by what they are (the same file, through any path or link), not by their names."""
    out = Path(path).expanduser()
    target = out.resolve()
    owned = [Path(p).expanduser().resolve() for p in filter(None, protected)] + tool_paths()
    known = {i: q for q in owned if (i := _identity(q))}
    mine = [target, *target.parents] if target.exists() else []  # an existing file inside a protected folder too
    hit = next((q for q in owned if q == target), None) or next((known[i] for p in mine if (i := _identity(p)) in known), None)
    if hit is not None:
        raise UserError(f"{key}={path} is the model's own file or one the job reads, the tool owns or is made of ({hit}: "
                        "the model's, an input's, the job's, the tracking store's, the cache's, the code's or the "
                        "config's); refused even with mode.overwrite=true: write it elsewhere")
    if out.is_dir():
        raise UserError(f"{key}={path} is a folder; give a file name")
    if target.exists() and not target.is_file():
        raise UserError(f"{key}={path} is not a regular file (a device, a FIFO or a socket); refused even with "
                        "mode.overwrite=true: give a file name")
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise UserError(f"{key}={path} already exists; refused to replace it: choose another path, or set "
                        "mode.overwrite=true")
    return out


def atomic_write(path: Path, write: Callable[[str], object], overwrite: bool = True) -> None:
    """`write(tmp)` into a temporary file beside `path`, flushed to disk, then moved over it in one step: a reader, a
    crash or a full disk leaves the old file or the new one, never a part. `overwrite=False` never replaces a file.
    A full disk is an OSError(ENOSPC) naming `path`, whatever the writer raised (numpy and torch lose the errno)."""
    path = Path(path)
    tmp = None
    try:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            os.close(fd)
            write(tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        except (OSError, RuntimeError) as exc:
            if is_disk_full(exc):  # the file the user knows, not the temporary one
                raise OSError(exc.errno, exc.strerror, str(path)) from None
            if _short_write(exc, path.parent):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from None
            raise
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if the name exists, with no window for a race
            except FileExistsError:
                raise UserError(f"{path} already exists; refused to replace it") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_text(path: Path, text: str, overwrite: bool = True) -> None:
    atomic_write(path, lambda tmp: Path(tmp).write_text(text), overwrite)


@contextmanager
def flock(path: Path, create: bool = False):
    """An exclusive flock, across processes, on a folder itself (no lock file: a full disk or a read-only job dir still
    locks) or on a lock file, `create`d if need be; released when the holder ends, even killed."""
    fd = os.open(path, os.O_RDONLY | (os.O_CREAT if create else os.O_DIRECTORY), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# --- memory


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


def require_memory(need: int, what: str, keys: str) -> None:
    """Refuse, before allocating, what would not fit in MEMORY_SHARE of the memory available (one line, the user's keys)."""
    free, why = available_memory()
    if need > MEMORY_SHARE * free:
        advice = "pass a file of fewer rows" if keys.startswith("obs.path=") else f"lower {_names(keys)}"
        raise UserError(f"{keys}: {what} would take about {size(need)}, but only {size(free)} is {why}; {advice}")


def check_sweep_size(counts: dict[str, int]) -> None:
    """A sweep's points (the product of its swept values), counted before any is listed or composed."""
    points = math.prod(counts.values())
    if points > MAX_SWEEP_POINTS:
        sizes = " × ".join(f"{what} ({n:,} values)" for what, n in counts.items())
        raise UserError(f"-m {sizes}: {points:,} points, over the {MAX_SWEEP_POINTS:,} one sweep may launch (each is "
                        "validated first, then runs as a job); sweep fewer values, or split the sweep")


def _names(keys: str) -> str:
    """`mode.steps=10 × mode.envs=4` -> `mode.steps or mode.envs`."""
    return " or ".join(dict.fromkeys(re.findall(r"([\w.]+)=", keys))) or keys


# --- archives


def check_zip(path: Path, cap: int, what: str) -> None:
    """A zip (torch.save's container) whose entries inflate past `cap` is refused before any is read: the declared sizes
    first, then, for compressed entries, the bytes they really inflate to (a header can lie), counted in chunks."""
    try:
        with zipfile.ZipFile(path) as zf:
            entries = zf.infolist()
            declared = sum(e.file_size for e in entries)
            if declared > cap:
                raise UserError(f"{what} {path}: its zip storages declare {size(declared)} inflated, over the "
                                f"{size(cap)} limit for a policy network (docs/reliability.md)")
            total = 0
            for e in entries:
                if e.compress_type == zipfile.ZIP_STORED:
                    total += e.file_size
                    continue
                with zf.open(e) as fh:
                    while chunk := fh.read(1 << 20):
                        total += len(chunk)
                        if total > cap:
                            raise UserError(f"{what} {path}: its zip storages inflate past the {size(cap)} limit for a "
                                            "policy network (docs/reliability.md)")
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, NotImplementedError, RuntimeError):
        return  # a damaged archive has no sizes to trust: its reader reports it (truncated or corrupt), as before


def check_file_size(path: Path, cap: int, what: str) -> None:
    n = path.stat().st_size
    if n > cap:
        raise UserError(f"{what} {path} is {size(n)}, over the {size(cap)} limit for a policy network (docs/reliability.md)")


# --- the memory a job's own values drive, estimated before the task allocates it

def job_allocations(mode: str, cfg: dict, w) -> list[tuple[int, str, str]]:
    """(bytes, what, the user's keys) of each allocation a job's values size: rows x bytes per row x the copies the modes
    hold (feeds, device and reference outputs, float64 draws and comparisons), and what the mode's own knobs allocate
    (its schema's `allocations`). Rough on purpose: it is there to refuse what cannot fit, not to pack memory tightly."""
    schema = modes()[mode]
    if not schema.runs_policy:
        return []
    lstm = w.lstm.weight_ih.shape[0] if w.lstm is not None else 0
    width_in = w.obs_dim + sum(w.branch_sizes) + 2 * w.memory  # obs, masks, recurrent_in
    width_out = w.act_dim * 3 + 2 * len(w.branch_sizes) + 2 * w.memory  # actions, mu, sampled; discrete; recurrent_out
    hidden = sum(int(weight.shape[0]) for weight, _ in w.layers) + lstm
    row = RowBytes(feed=8 * 3 * width_in + 4 * 6 * width_out, forward=4 * (width_in + width_out) * 4 + 8 * hidden * 3,
                   io=4 * (width_in + width_out))
    out = [(int(cfg["batch_size"]) * row.forward, "a forward call of batch_size rows", f"batch_size={cfg['batch_size']}")]
    obs = cfg.get("obs") or {}
    obs_row = row.feed + row.forward  # the feeds run through the runners and the fp64 reference in one call (run_feeds)
    if obs.get("source") != "file":
        _obs_cap(int(obs["rows"]), w.obs_dim, f"obs.rows={obs['rows']}")
        out.append((int(obs["rows"]) * obs_row, "the observations and their outputs", f"obs.rows={obs['rows']}"))
    elif obs.get("path") and (rows := file_rows(obs["path"], w.obs_dim)) * w.obs_dim * 4 <= MAX_OBS_BYTES:  # else its reader refuses it at the cap
        out.append((rows * obs_row, f"the {rows:,} observation rows of the file and their outputs", f"obs.path={obs['path']}"))
    for need, what, keys, drawn in schema.allocations(cfg, row):
        if drawn:
            _obs_cap(drawn, w.obs_dim, keys)  # drawn by the observation source, whose cap would name obs.rows
        out.append((need, what, keys))
    return out


def file_rows(path: str | Path, width: int) -> int:
    """The observation rows a .npy (its header's leading dims) or an .npz (its arrays' inflated bytes over a float32 row
    of `width`) holds, read without loading it; 0 when it cannot be told (its reader then says why)."""
    try:
        p = Path(path).expanduser()
        if p.suffix == ".npz":
            with zipfile.ZipFile(p) as zf:
                return sum(i.file_size for i in zf.infolist()) // max(4 * width, 1)
        with open(p, "rb") as fh:
            shape, _ = npy_header(fh)
        return math.prod(shape[:-1]) if len(shape) > 1 else 1
    except (OSError, ValueError, SyntaxError, zipfile.BadZipFile, EOFError):
        return 0


def _obs_cap(rows: int, obs_dim: int, keys: str) -> None:
    if rows * obs_dim * 4 > MAX_OBS_BYTES:
        raise UserError(f"{keys}: {rows:,} rows of {obs_dim} float32 observations need {size(rows * obs_dim * 4)}, over the "
                        f"{size(MAX_OBS_BYTES)} limit of the observation source; lower {_names(keys)}")


def check_job_memory(mode: str, cfg: dict, weights) -> None:
    """Each user-sized allocation of the job, and all of them together, against the memory available now."""
    allocations = job_allocations(mode, cfg, weights)
    for need, what, keys in allocations:
        require_memory(need, what, keys)
    if len(allocations) > 1:
        need, what, keys = max(allocations)
        require_memory(sum(a[0] for a in allocations), f"the job (largest part: {what})", keys)


# --- foreign files: read under a cap, never a special file


def read_capped(path: str | Path, cap: int, what: str) -> bytes:
    """The bytes of a regular file of at most `cap` bytes. A FIFO, a device, a socket or a folder is refused before it
    is opened (a symlink is followed to what it names: /dev/zero is a device), and no more than cap + 1 bytes are read
    even if the file grows."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            kinds = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                     stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}
            kind = kinds.get(stat.S_IFMT(st.st_mode), "not a regular file")
            raise UserError(f"{what} {path} is not a regular file ({kind}): not read")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for another kind of file since the stat above
            raise UserError(f"{what} {path} is not a regular file: not read")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise UserError(f"{what} {path} is over the {size(cap)} limit for it (docs/reliability.md): not read")
    return data


_STRINGS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included (unrolled: linear and fast)


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (strings skipped), counted without recursion."""
    bare = np.frombuffer(_STRINGS.sub(b'""', data), np.uint8)
    depth = deepest = 0
    for start in range(0, len(bare), 1 << 20):  # 1 MiB at a time: a 64 MiB file costs megabytes, not gigabytes
        chunk = bare[start:start + (1 << 20)]
        steps = (chunk == ord("[")).astype(np.int32) + (chunk == ord("{")) - (chunk == ord("]")) - (chunk == ord("}"))
        running = np.cumsum(steps) + depth
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def read_json(path: str | Path, what: str):
    """A foreign JSON file, parsed only once it is known to be a regular file under MAX_JSON_BYTES, nested at most
    MAX_JSON_DEPTH deep (Python's parser recurses once per level: a deep file would stop the reader with a
    RecursionError). Every refusal is a UserError of one line naming the file."""
    data = read_capped(path, MAX_JSON_BYTES, what)
    found = json_depth(data)
    if found > MAX_JSON_DEPTH:
        raise UserError(f"{what} {path} nests {found:,} levels deep, over the limit of {MAX_JSON_DEPTH}: not read")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise UserError(f"{what} {path} is not valid JSON ({' '.join(str(exc).split())[:120]})") from None


def npy_header(fh) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from an open .npy's header, read with numpy's own parser; nothing of its data is read."""
    version = np.lib.format.read_magic(fh)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(fh)
    return tuple(int(d) for d in shape), np.dtype(dtype)


def _declared(fh, name: str, what: str, cap: int, held: int | None = None) -> int:
    """The bytes an open .npy's header declares, refused over `cap` or over what the file holds (`held`: the bytes of
    its zip member; else the file's bytes after the header)."""
    shape, dtype = npy_header(fh)
    need = math.prod(shape) * dtype.itemsize
    held = os.fstat(fh.fileno()).st_size - fh.tell() if held is None else held
    if need > cap:
        raise UserError(f"{what} {name} declares {size(need)} ({list(shape)} {dtype}), over the {size(cap)} limit for "
                        "one array (docs/reliability.md): not loaded")
    if need > held:
        raise UserError(f"{what} {name} declares {size(need)} ({list(shape)} {dtype}) but holds {size(held)}: not loaded")
    return need


def check_npy(path: str | Path, what: str) -> None:
    """A foreign .npy is loaded only if its header declares at most MAX_ARRAY_BYTES, and no more than the file holds (a
    lying header would make numpy allocate what it declares)."""
    try:
        with open(path, "rb") as fh:
            _declared(fh, str(path), what, MAX_ARRAY_BYTES)
    except (OSError, ValueError, EOFError):
        return  # not a .npy: its reader reports it


def check_npz(path: str | Path, what: str, array_cap: int | None = None, total_cap: int | None = None) -> None:
    """A foreign .npz whose arrays would inflate past the caps, or past the memory available, is refused before any is
    loaded: each member's declared shape x item size (read from its .npy header: a 1.5 TiB array is declared in 128
    bytes), then the bytes the compressed members really inflate to (check_zip)."""
    array_cap, total_cap, total = array_cap or MAX_ARRAY_BYTES, total_cap or MAX_NPZ_BYTES, 0
    try:
        with zipfile.ZipFile(path) as zf:
            for entry in zf.infolist():
                with zf.open(entry) as fh:
                    total += _declared(fh, f"{path}: {entry.filename}", what, array_cap, entry.file_size)
    except (zipfile.BadZipFile, zlib.error, OSError, EOFError, ValueError, NotImplementedError, RuntimeError):
        pass  # not an .npz of plain arrays: its reader reports it (not a zip, truncated, pickled objects)
    if total > total_cap:
        raise UserError(f"{what} {path}: its arrays declare {size(total)} together, over the {size(total_cap)} limit "
                        "(docs/reliability.md): not loaded")
    free, why = available_memory()
    if total > MEMORY_SHARE * free:
        raise UserError(f"{what} {path}: its arrays declare {size(total)}, but only {size(free)} is {why}: not loaded")
    check_zip(Path(path), total_cap, what)
