"""The suite's own isolation: a test that leaves process-wide state changed (a signal handler, an environment
variable, torch's switches, the working directory) fails, naming it, and the next test finds it restored, so that the
suite passes in any order and whatever signal state it starts in (conftest.leaves_process_state_as_found)."""

from __future__ import annotations

import signal
import subprocess

from conftest import PYTHON, REPO

LEAKY = '''
import os, signal, torch

def test_leaks():
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.environ["HUGGY_EXP_LEAK_PROBE"] = "1"
    torch.set_num_threads(torch.get_num_threads() + 1)
    os.chdir("/")

def test_finds_it_restored(tmp_path):
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL and "HUGGY_EXP_LEAK_PROBE" not in os.environ
    assert os.getcwd() != "/"
'''


def test_a_test_that_leaks_process_state_fails_naming_it_and_the_next_test_finds_it_restored(tmp_path):
    (tmp_path / "test_leaky.py").write_text(LEAKY)
    done = subprocess.run([PYTHON, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "-n", "0", "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path / "test_leaky.py")],
                          cwd=tmp_path, env={"PYTHONPATH": f"{REPO / 'tests'}:{REPO}", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as under nohup
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "2 passed, 1 error" in out, out[-3000:]
    leak = next(line for line in out.splitlines() if "left process-wide state changed" in line)
    for named in ("signal SIGUSR1", "env HUGGY_EXP_LEAK_PROBE: 'absent' -> '1'", "torch threads", "cwd"):
        assert named in leak, leak
