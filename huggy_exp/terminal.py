"""The process's edges: output that an ASCII-only or closed terminal cannot kill, and the signals that end a job.

SIGINT (Ctrl-C), SIGTERM and a closed output pipe (`python run.py -m ... | head -2`) end a job the same way: the job
records the interruption (its result.json kept, its MLflow run ended KILLED), a sweep writes the summary of what
finished and ends its parent run, and the process exits 128 + the signal's number (130, 143, 141). A closed pipe lets
the running job finish first: only its output was lost, not its work.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

ENDING = (signal.SIGINT, signal.SIGTERM)  # the signals a job turns into an interruption (SIGPIPE: a closed pipe, below)
PIPE_CLOSED = threading.Event()  # set when stdout or stderr lost its reader; the job in progress still finishes


class Interrupted(KeyboardInterrupt):
    """A signal that ends the job, raised where Ctrl-C's KeyboardInterrupt is (every handler of that catches it)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def exit_code(exc: BaseException) -> int:
    """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 141 for a closed pipe."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def describe(exc: BaseException) -> str:
    signum = getattr(exc, "signum", signal.SIGINT)
    return {signal.SIGINT: "Ctrl-C", signal.SIGPIPE: "its output pipe closed"}.get(signum, signal.Signals(signum).name)


class Output:
    """A text stream that outlives its reader: once the pipe is closed, writes go to /dev/null and PIPE_CLOSED is set
    (no BrokenPipeError reaches the job); output that cannot be written (a full device, `> /dev/full`; an I/O error)
    goes to /dev/null too, and the job goes on; characters the terminal cannot encode are written escaped."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._lost(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        """Output lost: a closed pipe ends the run once the job is kept (check_pipe); any other failure loses only the
        output, never the job."""
        if isinstance(exc, BrokenPipeError):
            PIPE_CLOSED.set()
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # the buffered rest, and Python's flush at exit, go nowhere
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def guard_output() -> None:
    """stdout and stderr as Output (idempotent; run.py and every job process call it)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, Output) or stream is None:
            continue
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")  # PYTHONIOENCODING=ascii: `·` is printed as \xb7
        setattr(sys, name, Output(stream))


def check_pipe() -> None:
    """After a job: a closed output pipe ends the run here, as SIGPIPE would, now that the job's result is kept."""
    if PIPE_CLOSED.is_set():
        raise Interrupted(signal.SIGPIPE)


def interrupt(signum: int, frame) -> None:
    """A handler that ends what runs as Ctrl-C does (an Interrupted is a KeyboardInterrupt)."""
    raise Interrupted(signum)


@contextmanager
def handling(signals, handler):
    """`handler` for each of `signals` while inside, the previous handlers back after (main thread only: the caller's)."""
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


@contextmanager
def guarded():
    """For the whole command: guarded output, and SIGTERM raised as an interruption (SIGINT already is)."""
    saved = sys.stdout, sys.stderr
    main = threading.current_thread() is threading.main_thread()
    with handling((signal.SIGTERM,) if main else (), interrupt):
        guard_output()
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


@contextmanager
def deferred(on_signal=None):
    """A section no interruption may cut (a file set and the manifest naming it; a C++ test that a Python exception
    raised inside its callbacks would crash): SIGINT and SIGTERM are noted, `on_signal()` is called to cut the work
    short, and the interruption is raised once the section is over. Outside the main thread it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def note(signum: int, frame) -> None:
        if not caught and on_signal is not None:
            on_signal()
        caught.append(signum)

    with handling(ENDING, note):
        yield
    if caught:
        raise Interrupted(caught[0])
