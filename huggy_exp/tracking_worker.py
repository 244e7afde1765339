"""A single run's MLflow connection, opened beside the job (`python -m huggy_exp.tracking_worker` is the helper).

Importing mlflow and its SQLAlchemy store costs a single run 2-3 s of CPU, more than the rest beyond `import torch`.
run.py starts this helper first, so that import runs beside the job; the finished job folder is then handed over and
logged with tracking.log_job, the same call and outcome. A helper that is gone or answers nothing: the job logs in its
own process. EOF on its stdin (the job ended first) ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ANSWER = "huggy-tracking-outcome "  # the helper's one line of JSON on stdout; anything else there is MLflow's
REPO = Path(__file__).resolve().parents[1]


class Helper:
    """The running helper process: log_job(settings, workdir) as tracking.log_job, then it exits."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @classmethod
    def start(cls) -> Helper | None:
        """None where mlflow is imported already (an in-process caller that has paid for it) or no process starts."""
        return None if "mlflow" in sys.modules else cls.spawn()

    @classmethod
    def spawn(cls) -> Helper | None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.Popen([sys.executable, "-m", "huggy_exp.tracking_worker"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())
        except OSError:
            return None
        return cls(proc)

    def log_job(self, settings: dict, workdir: Path) -> dict:
        from huggy_exp import tracking

        # the store's credentials as they are now: preflight moves them out of the URI after the helper has started
        env = {k: os.environ[k] for k in tracking.CREDENTIAL_ENV if k in os.environ}
        request = json.dumps({"settings": settings, "workdir": str(Path(workdir).absolute()), "env": env})
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            out, _ = self.proc.communicate(request + "\n", timeout=600)
            lines = [ln for ln in out.splitlines() if ln.startswith(ANSWER)]
            if lines and self.proc.returncode == 0:
                return json.loads(lines[-1][len(ANSWER):])
        self.close()
        return tracking.log_job(settings, workdir)  # the helper failed: the same call, in this process

    def close(self) -> None:
        """End the helper now if it still runs (it holds nothing yet: no run was handed over); never waits on its import."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the job: it records the interruption, we just end
    from huggy_exp import tracking

    tracking.preload()
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    request = json.loads(line)
    os.environ.update(request.get("env") or {})
    outcome = tracking.log_job(request["settings"], Path(request["workdir"]))
    try:
        print(ANSWER + json.dumps(outcome), flush=True)
    except BrokenPipeError:  # the job is gone (kill -9): record the outcome itself, and say nothing to a closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not fail again
        from huggy_exp.results import update_result

        with contextlib.suppress(OSError):
            update_result(Path(request["workdir"]), tracking=outcome)
    return 0


if __name__ == "__main__":
    code = main()
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    # the run is committed and the answer sent: MLflow's and SQLAlchemy's teardown at exit (~0.9 s of CPU, measured
    # between the answer and the exit) is nobody's wait, and the job's communicate() waits for our exit
    os._exit(code)
