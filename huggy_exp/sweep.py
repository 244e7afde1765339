"""Hydra edges: one-line errors for unknown group choices, and a multirun callback (tracking set-up, summary, exit code)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from huggy_exp import tracking
from huggy_exp.results import EXIT_CODES

GROUPS = ("mode", "model", "obs", "tracking", "case")


def check_choices(argv: list[str], conf_dir: Path) -> None:
    """`mode=nope` exits with one line naming the valid choices instead of Hydra's multi-line report."""
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if not sep or key not in GROUPS or any(c in value for c in "()[]{}*$"):
            continue
        valid = sorted(p.stem for p in (conf_dir / key).glob("*.yaml"))
        for choice in value.split(","):
            if choice and choice not in valid:
                print(f"error: unknown {key} {choice!r}; valid: {', '.join(valid)}", file=sys.stderr)
                sys.exit(2)


class SweepCallback(Callback):
    """Creates the MLflow experiment before jobs start; at the end prints one line per point and sets the exit code."""

    started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.started = time.time()
        settings = OmegaConf.to_container(config.tracking, resolve=True)
        if settings.get("enabled", True):
            tracking.http_limits(settings)
            try:
                tracking.ensure_experiment(tracking.store_uri(settings.get("uri")), settings.get("experiment") or tracking.DEFAULT_EXPERIMENT)
            except Exception as exc:  # the jobs will warn again; the sweep still runs
                print(f"warning: MLflow store not ready ({type(exc).__name__}: {exc})", file=sys.stderr)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        rows = summarize(sweep_dir, since=self.started)
        print(f"\nsweep summary ({len(rows)} jobs) in {sweep_dir}:")
        for row in rows:
            print("  " + row["line"])
        worst = max((EXIT_CODES.get(r["status"], 2) for r in rows), default=0)
        if worst:
            sys.exit(worst)


def summarize(sweep_dir: Path, since: float = 0.0) -> list[dict]:
    """One line per result.json written under the sweep dir since `since` (older ones are a reused dir's leftovers)."""
    rows = []
    found = [p for p in sweep_dir.rglob("result.json") if p.stat().st_mtime >= since]
    for path in sorted(found, key=lambda p: (len(str(p.parent)), str(p.parent))):
        r = json.loads(path.read_text())
        note = r.get("reason") or r.get("headline")
        line = f"{path.parent.name:>3} {r['run_name']:<32} {r['status'].upper():<7}" + (f" {note}" if note else "")
        rows.append({"status": r["status"], "line": line})
    return rows
