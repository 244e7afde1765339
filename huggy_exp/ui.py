"""`python run.py mode=ui`: MLflow's UI for the tracking store on a free loopback port, opened at the latest sweep.

`mlflow ui` runs in its own process group with one worker (its default of 4 took about 40 s to answer on 2 cores);
the address of the latest sweep's runs is printed once the server answers /health, and Ctrl-C, SIGTERM (`kill`) or
SIGHUP (its terminal closed) stops the server and everything it started.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from huggy_exp import terminal
from huggy_exp.errors import UserError
from huggy_exp.tracking import redact

HOST = "127.0.0.1"  # loopback only: the UI has no authentication


def free_port(preferred: int) -> int:
    """`preferred` if nothing listens there, else the first free port above it. A port whose last connections wait in
    TIME_WAIT is free: the probe binds as the server will (SO_REUSEADDR, as uvicorn and gunicorn do)."""
    for port in range(preferred, min(preferred + 100, 65536)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            return port
    raise UserError(f"tracking.ui_port={preferred}: no free port on {HOST} in {preferred}..{preferred + 99}")


def mlflow_command() -> str:
    beside = Path(sys.executable).with_name("mlflow")
    found = str(beside) if beside.exists() else shutil.which("mlflow")
    if not found:
        raise UserError("the `mlflow` command is not installed beside this Python: pip install mlflow")
    return found


def start(uri: str, port: int, log: Path, wait_s: float) -> subprocess.Popen:
    """`mlflow ui --workers 1` on HOST:port in a new process group; returns once /health answers (or raises)."""
    command = [mlflow_command(), "ui", "--backend-store-uri", uri, "--host", HOST, "--port", str(port), "--workers", "1"]
    server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    deadline = time.time() + wait_s
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2):
                    return server
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    raise UserError(f"mlflow ui did not answer on {HOST}:{port} within {wait_s:g} s; its log ({log}):\n{tail}") from None
                time.sleep(0.5)
    except BaseException:  # not up, or stopped (Ctrl-C, SIGTERM) while starting: nothing of it is left behind
        stop(server)
        raise


def stop(server: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (its workers too), SIGKILL after 20 s."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    except ProcessLookupError:
        pass


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)  # stop the server as Ctrl-C (SIGINT) does
SAY = functools.partial(print, flush=True)  # a pipe (a test, `| tee`) sees each line as the server reaches it


def serve(uri: str, runs_path: str | None, port: int, wait_s: float, out=SAY) -> int:
    """Start the UI on `uri`, print its address and the latest sweep's runs (`runs_path`, after the `/`), wait for
    Ctrl-C (or SIGTERM, SIGHUP), stop it; 0 on a clean stop. The server is stopped in a `finally` before anything else
    is printed: a terminal that is gone (SIGHUP, then EIO on every write) cannot keep it running."""
    chosen = free_port(port)
    with terminal.handling(STOP_SIGNALS, terminal.interrupt), tempfile.TemporaryDirectory(prefix="huggy-ui-") as tmp:
        log = Path(tmp) / "mlflow-ui.log"
        out(f"starting mlflow ui on http://{HOST}:{chosen}/ (store {redact(uri)}, 1 worker) ...")
        try:
            server = start(uri, chosen, log, wait_s)
        except KeyboardInterrupt:  # stopped while it was starting: start() stops what it began
            out("stopped before it answered")
            return 0
        try:
            code = wait(server, chosen, port, runs_path, log, out)
        except KeyboardInterrupt:
            code = 0
        finally:
            with terminal.handling((signal.SIGINT, *STOP_SIGNALS), signal.SIG_IGN):  # a second signal cannot cut the stop
                stop(server)
        out("mlflow ui stopped")
        return code


def wait(server: subprocess.Popen, chosen: int, port: int, runs_path: str | None, log: Path, out) -> int:
    """Print where the UI is and wait until it exits by itself (1) or a signal ends the wait (KeyboardInterrupt)."""
    base = f"http://{HOST}:{chosen}/"
    out(f"MLflow UI: {base}")
    out(f"latest sweep's runs: {base}{runs_path}" if runs_path
        else "no sweep in this store yet: `python run.py -m dtype=fp32,fp16,bf16` makes one")
    if chosen != port:
        out(f"note: port {port} (tracking.ui_port) was taken; summary.md images in MLflow point at port {port}")
    out("Ctrl-C stops it")
    while server.poll() is None:
        time.sleep(0.5)
    out(f"mlflow ui exited by itself (code {server.returncode}); its log:\n{log.read_text(errors='replace')[-1500:]}")
    return 1
