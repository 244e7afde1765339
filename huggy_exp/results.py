"""What a task returns and how it lands on disk: result.json (atomic) plus .npy arrays and .csv tables beside it."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from huggy_exp.files import atomic_write, atomic_write_text

EXIT_CODES = {"passed": 0, "skipped": 0, "failed": 1, "error": 2}
EXIT_PENDING = 3  # every verdict passed, but some results are not in MLflow yet: `python run.py mode=sync`
EXIT_INTERRUPTED = 130


@dataclass
class Result:
    """A task's answer: a status, its one-line headline, latency, flat numeric metrics, string tags, arrays, small
    tables, extra files and free-form details (result.json keeps those under `details`)."""

    status: str = "passed"
    reason: str = ""
    headline: str = ""  # one line for sweep summaries, the MLflow run note and result.json readers
    latency: dict[str, float] = field(default_factory=dict)  # p50_us, p99_us, obs_per_s, noisy, ... of the point
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    tables: dict[str, list[dict]] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # extra files: names in the job dir, or absolute paths
    details: dict = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # stepped metrics: name -> [(step, value)]
    tracking: str = "off"  # set by app after the job: off | logged | pending

    def fail(self, reason: str) -> None:
        """Downgrade to failed, keeping every reason given."""
        self.status = "failed"
        self.reason = f"{self.reason}; {reason}" if self.reason else reason

    def check_finite(self) -> None:
        """Finite or failed: a NaN/inf in any array a task produced fails the job, with the count and first place
        (inputs are refused before they run: observations, weights; so a non-finite output is the job's own)."""
        for name, array in self.arrays.items():
            if (where := first_nonfinite(array)) is not None:
                count, index = where
                self.fail(f"{name}: {count} NaN/inf value{'s' * (count > 1)} (first at {list(index)})")


def held_result(folder, sweep: bool = False) -> str | None:
    """`result.json, tracking pending` if `folder` (a sweep: any job folder under it) already holds a job's result."""
    folder = Path(folder)
    found = min(folder.glob("**/result.json"), default=None) if sweep else folder / "result.json"
    if found is None or not found.is_file():
        return None
    try:
        state = (json.loads(found.read_text()).get("tracking") or {}).get("status", "unknown")
    except (OSError, ValueError, AttributeError):
        state = "unreadable"
    shown = found.relative_to(folder) if found.is_relative_to(folder) else found
    return f"{shown}, tracking {state}" + (": not in MLflow yet" if state in ("pending", "logging") else "")


def expectation(record: dict) -> str:
    """` (expected FAILED: met)` / ` (expected PASSED: NOT met)` of a case's point ('' without `expect`): the words
    every place that shows a verdict puts beside it (the job's last line, the sweep's lines, the report)."""
    if record.get("expect") is None:
        return ""
    return f" (expected {str(record['expect']).upper()}: " + ("met)" if record.get("expectation_met") else "NOT met)")


def first_nonfinite(array) -> tuple[int, tuple[int, ...]] | None:
    """(count, index of the first) NaN/inf values of a float array; None when all are finite or it is not float."""
    a = np.asarray(array)
    bad = ~np.isfinite(a) if a.dtype.kind in "fc" else np.zeros(0, bool)
    return (int(bad.sum()), tuple(int(i) for i in np.argwhere(bad)[0])) if bad.any() else None


def jsonable(value):
    """Plain JSON: numpy scalars to Python, NaN/inf to strings (JSON has neither)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    return str(value) if isinstance(value, Path) or isinstance(value, float) and not math.isfinite(value) else value


def write_table(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    """Rows as a .csv (atomically); `columns` picks and orders them (default: every key of every row)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, columns or list(dict.fromkeys(k for row in rows for k in row)), extrasaction="ignore")
    writer.writeheader()
    writer.writerows(jsonable(rows))
    atomic_write_text(path, text.getvalue())


def write_result(workdir: Path, record: dict, result: Result) -> Path:
    """Arrays as <name>.npy, tables as <name>.csv, then result.json last and atomically (it marks completion)."""
    workdir.mkdir(parents=True, exist_ok=True)
    for name, array in result.arrays.items():
        atomic_write(workdir / f"{name}.npy", lambda tmp, a=array: _save_npy(tmp, a))
    for name, rows in result.tables.items():
        write_table(workdir / f"{name}.csv", rows)
    record = {**record, **{k: getattr(result, k) for k in ("status", "reason", "headline", "latency", "metrics")},
              "series": {name: [list(p) for p in points] for name, points in result.series.items()},
              "tags": result.tags, "arrays": {name: f"{name}.npy" for name in result.arrays},
              "tables": {name: f"{name}.csv" for name in result.tables}, "files": result.files,
              "details": result.details}
    return write_json(workdir / "result.json", record)


def _save_npy(tmp: str, array) -> None:
    with open(tmp, "wb") as fh:  # a file object: np.save would append .npy to a bare name
        np.save(fh, np.asarray(array), allow_pickle=False)


def read_result(workdir: Path) -> dict:
    return json.loads((Path(workdir) / "result.json").read_text())


def update_result(workdir: Path, **fields) -> None:
    """Rewrite result.json with some top-level keys replaced (atomically: a reader sees the old or the new file)."""
    write_json(Path(workdir) / "result.json", {**read_result(workdir), **fields})


def write_json(path: Path, record: dict) -> Path:
    atomic_write_text(path, json.dumps(jsonable(record), indent=2) + "\n")
    return path
