"""Files someone else wrote (checkpoints, ONNX graphs, result.json files, bundles' arrays), sized before they are read:
a regular file only, under a cap, never more than it holds (docs/reliability.md)."""

from __future__ import annotations

import json
import math
import os
import re
import stat
import zipfile
import zlib
from pathlib import Path

import numpy as np

from huggy_exp import host
from huggy_exp.errors import UserError
from huggy_exp.host import MEMORY_SHARE, size

MAX_CHECKPOINT_BYTES = 256 << 20  # a .pt's storages, inflated: ~19x the genuine Huggy .pt (13.5 MB with its optimizer)
MAX_ONNX_BYTES = 256 << 20  # an .onnx plus its external data: ~110x the genuine Huggy .onnx (2.3 MB)
MAX_JSON_BYTES = 64 << 20  # a foreign JSON file (a result.json sync reads, a bundle's manifest): ~300x a sweep point's
MAX_JSON_DEPTH = 64  # nesting of a foreign JSON file (results nest 5 deep); Python's parser recurses per level
MAX_ARRAY_BYTES = 1 << 30  # one array of a foreign .npz (a bundle's inputs, outputs, latency), inflated
MAX_NPZ_BYTES = 2 << 30  # every array of one foreign .npz together, inflated
MAX_LATENCY_SAMPLES = 1_000_000  # a bundle's timed calls per point: what mode.latency.max_samples can record


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


# --- JSON and arrays: read under a cap, never a special file


def read_capped(path: str | Path, cap: int, what: str) -> bytes:
    """The bytes of a regular file of at most `cap` bytes, of which no more than cap + 1 are read even if it grows. A
    FIFO, a device, a socket or a folder is refused before it is opened (a symlink is followed: /dev/zero is a device)."""
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
    """A foreign JSON file, parsed only once it is a regular file under MAX_JSON_BYTES nested at most MAX_JSON_DEPTH deep
    (Python's parser recurses per level: a deeper file raises RecursionError); each refusal one line naming the file."""
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
    free, why = host.available_memory()
    if total > MEMORY_SHARE * free:
        raise UserError(f"{what} {path}: its arrays declare {size(total)}, but only {size(free)} is {why}: not loaded")
    check_zip(Path(path), total_cap, what)
