"""The package's shape, read from its source (ast only, nothing imported): small functions, tasks that read like their
description, and imports that point one way (config -> context -> task -> result -> tracking)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "huggy_exp"
EDGES = [REPO / "run.py", *sorted((REPO / "hydra_plugins").rglob("*.py")), *sorted((REPO / "benchmarks").rglob("*.py")),
         *sorted((REPO / "scripts").rglob("*.py"))]  # the code around the package, held to the same rules
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


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """huggy_exp's modules -> the package modules each imports (`from huggy_exp import x` names module x)."""
    names = {_name(p): p for p in _modules()}
    return {name: {m for m in _imports(path) if m in names and m != name} for name, path in names.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds an import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_package():
    assert not _circles(_graph())


def test_the_circle_check_sees_a_circle_through_a_lazy_import():
    graph = _graph()
    graph["huggy_exp.config"] = graph["huggy_exp.config"] | {"huggy_exp.placement"}  # what config.validate used to do
    assert ["huggy_exp.config", "huggy_exp.placement"] in _circles(graph)


def test_the_schema_is_the_ground_floor_importing_nothing_above_errors():
    assert _graph()["huggy_exp.config"] <= {"huggy_exp.errors"}, _graph()["huggy_exp.config"]


@pytest.mark.parametrize("path", [*_modules(), *EDGES], ids=lambda p: str(p.relative_to(REPO)))
def test_no_function_is_over_60_lines(path):
    long = [f"{line} {name} ({n} lines)" for name, line, n in _functions(path) if n > MAX_FUNCTION_LINES]
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
    users = [str(p.relative_to(REPO)) for p in [*_modules(), *EDGES] if any(m.split(".")[0] == "mlflow" for m in _imports(p))]
    assert users == ["huggy_exp/tracking.py"], users


def _defined(path: Path) -> set[str]:
    """The names a module defines at its top level (functions, classes, constants, its own imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("path", EDGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_edges_import_only_what_the_package_defines(path):
    """run.py, the launcher, the benchmark and the scripts (no default test runs bench.py) name nothing removed."""
    modules = {_name(p): p for p in _modules()}
    missing = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("huggy_exp"):
            where = modules.get(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" not in modules
                        and (where is None or a.name not in _defined(where))]
    assert not missing, missing


PLANS = {"scripts/accelerator_check.py"}  # a run plan names the modes it runs, in order: a plan, not a trait table


def test_a_mode_declares_itself_once_no_module_keeps_a_table_of_mode_names():
    """A mode's traits (runs the policy, timed, verified, headline, memory) live on its schema class in config.py; a
    tuple, set, list or dict mostly of mode names anywhere else is a side registry that a new mode forgets."""
    from huggy_exp.config import modes

    names = set(modes())
    tables = []
    for path in [*_modules(), *EDGES]:
        if path.name == "config.py" or path.relative_to(REPO).as_posix() in PLANS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.Set, ast.List)) else []
            strings = [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            found = {s for s in strings if s in names}
            if len(found) >= 2 and 2 * len(found) > len(strings):  # mostly mode names (not a table that has a "batch")
                tables.append(f"{path.relative_to(REPO)}:{node.lineno} {sorted(found)}")
        for node in ast.parse(path.read_text()).body:  # a module constant of one mode's name is a trait table too
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            items = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", None) or []
            strings = [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if strings and set(strings) <= names:
                tables.append(f"{path.relative_to(REPO)}:{node.lineno} {strings}")
    assert not tables, tables


def test_no_module_probes_a_runner_for_what_the_runner_protocol_declares():
    """Callers read what runners.Runner declares (target, memory_size, sample, trace, distributions...): a hasattr or
    getattr on a runner is a backend that silently does less (a runner without a target timed unsynchronised)."""
    probes = [f"{path.relative_to(REPO)}:{node.lineno}" for path in [*_modules(), *EDGES]
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
              and node.args and "runner" in ast.unparse(node.args[0]).lower()]
    assert not probes, probes


def test_one_path_for_every_shape_only_the_policy_knows_huggys_shape():
    """Huggy's lean path (one input, continuous actions, no memory) is the policy's own: no runner, kernel, task or
    format module forks on the shape, and feeds are always a dict (no bare-array union, one chunker)."""
    forks = [f"{p.relative_to(REPO)}:{n}" for p in [*_modules(), *EDGES] if p.name != "policy.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if "huggy_shaped" in line]
    assert not forks, forks
    runners = ast.parse((PACKAGE / "runners.py").read_text())
    feeds = next(n for n in runners.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "Feeds")
    assert "ndarray" not in ast.unparse(feeds.value).replace("Mapping[str, np.ndarray]", ""), ast.unparse(feeds.value)
    torch_runner = next(n for n in runners.body if isinstance(n, ast.ClassDef) and n.name == "TorchRunner")
    chunkers = [n.name for n in torch_runner.body if isinstance(n, ast.FunctionDef) and "chunk" in n.name]
    assert chunkers == ["_chunks"], chunkers


def test_an_output_declares_itself_once_in_verify_declared():
    """ML-Agents' output names live in verify.DECLARED (and the format package, mlagents/, that reads and writes
    them): a module that spells one again keeps a second output table that a new output forgets."""
    from huggy_exp.verify import DECLARED

    names = {o.name for o in DECLARED}  # "discrete_actions" is also a file stem and a metric prefix: not counted
    spelled = [f"{p.relative_to(REPO)}:{n.lineno} {n.value}" for p in [*_modules(), *EDGES]
               if p.name != "verify.py" and "mlagents" not in p.parts
               for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Constant) and n.value in names]
    assert not spelled, spelled


def test_every_mutation_of_the_mutation_check_still_applies_to_this_tree():
    """scripts/mutation_check.py proves the suite catches known bugs by editing the code as it is spelled; a
    restructuring that respells a line must move its mutation along, or the check reports 'not applied' and proves
    nothing."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    stale = [f"{m.name}: {rel}" for m in module.MUTATIONS for rel, old, _ in m.edits
             if not (REPO / rel).is_file() or old not in (REPO / rel).read_text()]
    assert module.MUTATIONS and not stale


def _trait_literals(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, code) of every place that keys behaviour on a backend or dtype name spelled as a literal: a comparison
    (`==`, `!=`, `in`) with one or with a tuple, list or set holding one, a `match` case on one, and a dict literal keyed
    by them that is indexed or looked up (`{"fp16": ...}[dtype]`, `.get`) or kept as a module's table."""
    def named(node: ast.AST) -> bool:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(n, ast.Constant) and n.value in names for n in items)

    def keyed(node: ast.AST) -> bool:
        return isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in names for k in node.keys)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(named(n) for n in (node.left, *node.comparators)):
            found.append(node)
        elif isinstance(node, ast.MatchValue) and named(node.value):
            found.append(node)
        elif isinstance(node, ast.Subscript) and keyed(node.value):
            found.append(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and keyed(node.func.value):
            found.append(node)
    found += [n for n in getattr(tree, "body", []) if isinstance(n, (ast.Assign, ast.AnnAssign)) and keyed(n.value)]
    return [(n.lineno, ast.unparse(n)[:120]) for n in found]


def _trait_names() -> set[str]:
    from huggy_exp.config import BACKENDS, DTYPES

    return {*BACKENDS, *DTYPES}


@pytest.mark.parametrize("path", [p for p in [*_modules(), *EDGES] if p.name != "config.py"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_compares_a_backend_or_dtype_name_to_a_literal(path):
    """A backend's and a dtype's traits (its shapes, dtypes, devices, reference, peer, the CPU's emulation) are declared
    once in config.BACKENDS and config.DTYPES: `ctx.backend == "compile"` or `dtype == "fp16"` elsewhere is a silent
    place that a new backend or dtype misses."""
    assert not _trait_literals(ast.parse(path.read_text()), _trait_names())


def test_the_literal_check_sees_every_spelling_of_a_trait_keyed_by_name():
    code = '''
SLOW = {"fp16": 1}
def f(ctx, backend, dtype):
    a = backend in ("compile", "graphs")
    b = ctx.dtype == "fp16"
    c = "onnxruntime" != ctx.backend
    d = {"eager": 1, "fused": 2}[backend]
    e = {"int8": 1}.get(dtype)
    match dtype:
        case "bf16":
            pass
    return build(ctx, "eager"), {"fp32": 1.0}, dtype in DTYPES
'''
    found = [line for line, _ in _trait_literals(ast.parse(code), _trait_names())]
    assert found == [4, 5, 6, 7, 8, 10, 2], found
