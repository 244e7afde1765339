"""The package's shape, read from its source (ast only, nothing imported): small functions, tasks that read like their
description, and imports that point one way (config -> context -> task -> result -> tracking)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "huggy_exp"
MAX_FUNCTION_LINES = 60
MAX_RUN_LINES = 40  # a task's run(): build runners -> run feeds -> compare -> judge -> Result, on one screen


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_no_function_in_the_package_is_over_60_lines():
    long = [f"{p.relative_to(PACKAGE.parent)}:{line} {name} ({n} lines)"
            for p in _modules() for name, line, n in _functions(p) if n > MAX_FUNCTION_LINES]
    assert not long, long


def test_every_task_run_fits_on_a_screen():
    runs = {p.name: n for p in (PACKAGE / "tasks").glob("*.py") for name, _, n in _functions(p) if name == "run"}
    assert len(runs) >= 12, runs  # every mode's task was read
    assert all(n <= MAX_RUN_LINES for n in runs.values()), {k: n for k, n in runs.items() if n > MAX_RUN_LINES}


@pytest.mark.parametrize("path", sorted((PACKAGE / "tasks").glob("*.py")), ids=lambda p: p.name)
def test_a_task_never_imports_mlflow_hydra_or_the_job_runner(path):
    bad = {m for m in _imports(path) if m.split(".")[0] in ("mlflow", "hydra", "omegaconf")
           or m in ("huggy_exp.app", "huggy_exp.tracking", "huggy_exp.sweep")}
    assert not bad, bad


def test_the_context_does_not_import_the_runners_and_placement_owns_the_backend_check():
    assert not {m for m in _imports(PACKAGE / "context.py") if m.startswith("huggy_exp.runners")}
    assert "check_backend" in {name for name, _, _ in _functions(PACKAGE / "placement.py")}
    assert "check_backend" not in {name for name, _, _ in _functions(PACKAGE / "runners.py")}


def test_only_tracking_imports_mlflow():
    users = [p.name for p in _modules() if any(m.split(".")[0] == "mlflow" for m in _imports(p))]
    assert users == ["tracking.py"], users


def _task_classes():
    """Every task class (a class with a `name` and a `run`) in huggy_exp/tasks/, with its file."""
    for path in sorted((PACKAGE / "tasks").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and {"run"} <= {n.name for n in node.body if isinstance(n, ast.FunctionDef)} \
                    and any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "name" for t in n.targets) for n in node.body):
                yield path.name, node


def test_task_constructors_take_the_yaml_values_with_no_second_set_of_defaults():
    tasks = list(_task_classes())
    assert len(tasks) >= 14, [c.name for _, c in tasks]
    with_defaults = [f"{p}:{c.name}" for p, c in tasks for f in c.body if isinstance(f, ast.FunctionDef)
                     and f.name == "__init__" and (f.args.defaults or any(d is not None for d in f.args.kw_defaults))]
    assert not with_defaults, with_defaults


def test_the_context_does_not_validate_what_the_schema_validated():
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse((PACKAGE / "context.py").read_text()))
             if isinstance(n, (ast.Name, ast.Attribute))}
    assert not names & {"check_device", "check_dtype", "check_backend"}
