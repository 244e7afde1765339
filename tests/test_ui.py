"""scripts/ui_check.py against a real `mlflow ui` and headless Chromium; skipped, saying why, where Chromium is absent."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from conftest import PYTHON, REPO, subprocess_env

pytestmark = pytest.mark.slow  # mlflow ui, a browser and a sweep: processes, run by `pytest -m slow`


def _ui_check():
    spec = importlib.util.spec_from_file_location("ui_check", REPO / "scripts" / "ui_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHROMIUM = _ui_check().browser()


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium); "
                                              "scripts/ui_check.py is a manual tool where CI lacks it")
def test_ui_shows_the_sweeps_runs_headline_metrics_and_plots(tmp_path, huggy_exp_cache):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = subprocess_env(huggy_exp_cache)
    sweep = subprocess.run([PYTHON, "run.py", "-m", "mode=precision", "dtype=fp32,bf16", "obs.rows=4",
                            f"hydra.sweep.dir={tmp_path / 'sweep'}", f"tracking.uri={uri}"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    check = subprocess.run([PYTHON, "scripts/ui_check.py", "--store", uri, "--screenshot", str(tmp_path / "ui.png")],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert "ui check: passed" in check.stdout and "runs view" in check.stdout and "parent plot" in check.stdout
    assert (tmp_path / "ui.png").stat().st_size > 10_000


def test_ui_check_fails_when_the_store_has_no_sweep(tmp_path):
    proc = subprocess.run([PYTHON, "scripts/ui_check.py", "--store", f"sqlite:///{tmp_path / 'empty.db'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and ("no sweep" in proc.stderr or "Chromium" in proc.stderr)
