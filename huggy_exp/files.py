"""Writing without loss: job folders claimed, no file replaced unasked, every output replaced in one step, a full disk
in one line (docs/reliability.md)."""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from pathlib import Path

from huggy_exp import host
from huggy_exp.errors import UserError

FULL_BYTES = 1 << 20  # a write that fails without an errno while less than this is free ran out of disk
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


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
        return host.free_bytes(folder) < FULL_BYTES
    except OSError:
        return False


def disk_full_message(exc: OSError, path: str | Path | None = None) -> str:
    """One line: what could not be written, how much is free on its disk and which disk that is."""
    target = path or exc.filename
    if target is None:
        return f"no space left on a disk ({exc.strerror or exc})"
    where = Path(target).expanduser().absolute()
    return (f"no space left writing {where} ({exc.strerror or exc}): {host.size(host.free_bytes(where))} free on its disk "
            f"({host.mount_point(where)})")


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
    if why := folder_in_use(folder):
        raise UserError(f"{key}={path} {why}; {REFUSED}")
    return folder


def claim_folder(path: str | Path, key: str) -> Path:
    """Make `path` (absent or empty) this process's job or sweep folder, returned absolute, by creating CLAIM in it
    exclusively: of two processes given one folder exactly one goes on, the other is refused in one line, nothing of
    the first touched. A folder inside a claimed one is that run's."""
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


# --- output files


def tool_paths() -> list[Path]:
    """What this process is made of: its conf/ tree (beside the package, run.py's), the folder of every imported
    package (huggy_exp, its plugins, torch, hydra, ...) and the file of every imported module (run.py among them)."""
    found = [str(Path(__file__).resolve().parents[1] / "conf")]
    for name, module in list(sys.modules.items()):
        if "." not in name:
            found += list(getattr(module, "__path__", None) or ()) or [getattr(module, "__file__", None)]
    return [Path(p) for p in found if isinstance(p, str) and p]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def claim_output(path: str | Path, overwrite: bool, protected: Iterable[str | Path | None], key: str) -> Path:
    """The output file `path`, once it is known not to replace anything unasked: an existing file unless `overwrite`;
    always, a file the job reads or the tool owns (`protected`: files, or folders whose files all are) or is made of
    (tool_paths), and what is not a regular file. Files are known by identity (through any path or link), not name."""
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

