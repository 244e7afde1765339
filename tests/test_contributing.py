"""CONTRIBUTING's instructions cannot drift: a toy mode, a toy backend and toy dtypes, each added in a copy of the tree
from its "Files to touch" list alone (nothing else edited), compose, validate and run, and show up everywhere they
should (no silent place: the backend in every list of backends, a float16 dtype with its CPU note)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import List

import pytest
from conftest import PYTHON, REPO, subprocess_env

TOY_TASK = '''"""mode=toy: a test's mode (tests/test_contributing.py)."""

from huggy_exp.config import ToyMode
from huggy_exp.context import Context
from huggy_exp.results import Result
from huggy_exp.tasks import Task


class ToyTask(Task):
    mode: ToyMode

    def run(self, ctx: Context) -> Result:
        value = self.mode.scale * ctx.seed
        return Result(metrics={"toy_value": value}, summary=[f"toy value {value:g}"])
'''
TOY_YAML = '''# mode=toy: a test's mode (tests/test_contributing.py)
defaults:
  - /schema/mode/toy@_here_   # types, ranges and known keys: huggy_exp/config.py
  - _self_

_target_: huggy_exp.tasks.toy.ToyTask
scale: 2.0   # multiplies the seed (a number >= 0)
'''
TOY_SCHEMA = '''

@dataclass
class ToyMode(ModeConf):
    name: ClassVar[str] = "toy"
    runs_policy: ClassVar[bool] = False
    timed: ClassVar[bool] = False
    verified: ClassVar[bool] = False
    headline: ClassVar[Dict[str, Headline]] = {"value": own("toy_value", "1", "scale x seed")}
    scale: float = rule(lo=0)
'''


def files_to_touch(section: str) -> list[str]:
    """The code files of a CONTRIBUTING section's "Files to touch" line (before its `; then` docs and tests)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    line = " ".join(body.split("Files to touch:", 1)[1].split("; then", 1)[0].split())
    return re.findall(r"`([^`]+)`", line)


def test_contributing_names_the_three_code_files_of_a_mode():
    assert files_to_touch("Adding a mode") == ["huggy_exp/tasks/<name>.py", "conf/mode/<name>.yaml", "huggy_exp/config.py"]


def section(name: str) -> str:
    text = (REPO / "CONTRIBUTING.md").read_text()
    return text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]


def test_adding_a_mode_lists_every_trait_of_a_mode_and_its_default():
    """Every class variable and class method of ModeConf that other modules read is a listed trait, with its default."""
    from huggy_exp.config import ModeConf

    traits = {n for n, v in vars(ModeConf).items() if isinstance(v, classmethod) and n != "is_task"}
    traits |= {n for n in ModeConf.__annotations__ if "ClassVar" in str(ModeConf.__annotations__[n]) and n != "name"}
    body = " ".join(section("Adding a mode").split())
    listed = set(re.findall(r"- `(\w+)(?:\(.*?\))?` \(default (?:true|false|none)\)", body))
    assert traits == listed, f"not listed: {sorted(traits - listed)}; not traits: {sorted(listed - traits)}"
    assert "default to true" in body and "`verified = False`" in body and "`timed = False`" in body


def test_a_knob_that_judges_is_declared_by_its_field_and_a_list_field_holds_its_choices():
    from dataclasses import fields

    from huggy_exp import compare, config
    from huggy_exp.errors import UserError

    judges = {f.name for f in fields(config.StatsMode) if f.metadata.get("judges")}
    assert judges == {"drift_threshold", "drift_fail", "saturation"}
    row = {"mode": "stats", "obs": "random/8/x1.0", "batch_size": 8, "seed": 0, "model_sha256": "m",
           "knobs": {"steps": 10, "drift_threshold": 0.05}}
    looser = {**row, "knobs": {"steps": 10, "drift_threshold": 0.5}}
    longer = {**row, "knobs": {"steps": 20, "drift_threshold": 0.05}}
    assert compare.inputs_key(row) == compare.inputs_key(looser) != compare.inputs_key(longer)
    meta = {"choices": ("red", "blue")}  # any list field's choices, not three dotted paths
    with pytest.raises(UserError, match=r"mode.colors: unknown entry 'green'; valid: red, blue"):
        config._check_value(List[str], ["red", "green"], "mode.colors", meta)


def test_a_modes_host_check_is_its_declared_trait_not_its_name():

    from huggy_exp import config

    assert config.BenchmarkMode.host_needs({"scenarios": ["control_loop"]}) == {}
    assert set(config.BenchmarkMode.host_needs({"scenarios": ["server"]})) == {"mlperf_loadgen"}
    assert all(not schema.host_needs({}) for name, schema in config.modes().items() if name != "benchmark")
    import inspect

    from huggy_exp import preflight

    assert not re.search(r"mode == [\"']\w", inspect.getsource(preflight.validate)), "a host check keyed by a mode's name"


def copy_tree(tree):
    for part in ("huggy_exp", "conf", "hydra_plugins", "scripts", "docs"):
        shutil.copytree(REPO / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "run.py", tree / "run.py")


@pytest.mark.slow
def test_a_toy_mode_added_from_contributings_list_runs_through_a_sweep(tmp_path, huggy_exp_cache):
    tree = tmp_path / "tree"
    copy_tree(tree)
    edits = {"huggy_exp/tasks/<name>.py": TOY_TASK, "conf/mode/<name>.yaml": TOY_YAML}
    for path in files_to_touch("Adding a mode"):
        target = tree / path.replace("<name>", "toy")
        if path in edits:
            target.write_text(edits[path])
        else:  # the schema: appended to config.py
            target.write_text(target.read_text() + TOY_SCHEMA)
    env = {**subprocess_env(huggy_exp_cache), "PYTHONPATH": str(tree)}
    sweep = tmp_path / "sweep"
    out = subprocess.run([PYTHON, "run.py", "-m", "mode=toy", "seed=1,2", "tracking=none", "plots=false",
                          f"hydra.sweep.dir={sweep}"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/result.json"))]
    assert [r["status"] for r in records] == ["passed", "passed"]
    # no silent place: its headline metric was produced, its knob's rule holds, step 4's reference lists the knob
    assert [r["headline_metrics"]["value"] for r in records] == [2.0, 4.0]
    bad = subprocess.run([PYTHON, "run.py", "mode=toy", "mode.scale=-1", "tracking=none", f"hydra.run.dir={tmp_path / 'bad'}"],
                         cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "mode.scale=-1.0 is out of range: must be >= 0" in bad.stderr, bad.stderr[-2000:]
    subprocess.run([PYTHON, "scripts/config_reference.py", "--write"], cwd=tree, env=env, check=True, timeout=120)
    assert "`mode.scale` = `2.0`: multiplies the seed" in (tree / "docs" / "configuration.md").read_text()


def test_contributing_names_the_two_code_files_of_a_backend():
    assert files_to_touch("Adding a backend") == ["huggy_exp/config.py", "huggy_exp/runners.py"]


TOY_BACKEND = '''    Backend("toy", "a test's backend: the policy's own single-tensor forward", forward="huggy_exp.runners.toy",
            devices=("cpu",), dtypes=("fp32",)),
'''
TOY_FORWARD = '''

def toy(policy: Policy, target: Target) -> tuple[Callable, Callable]:
    """Backend toy (tests/test_contributing.py): the policy's own single-tensor forward and sample."""
    return policy.forward, policy.sample
'''
BENCH = ["mode.rounds=1", "mode.budget_s=0.02", "mode.warmup_s=0.01", "mode.settle_s=0", "mode.scenarios=[offline]",
         "obs.rows=16", "batch_size=8", "tracking=none", "plots=false"]


@pytest.mark.slow
def test_a_toy_backend_added_from_contributings_list_is_listed_everywhere_and_benchmarked(tmp_path, huggy_exp_cache):
    """A torch backend declared in config.py with its forward builder in runners.py, then the generator run: every list
    of backends names it, an unknown backend's line lists it, benchmark gates and times it, and a dtype it does not
    run is skipped saying so (nothing else edited)."""
    tree = tmp_path / "tree"
    copy_tree(tree)
    assert files_to_touch("Adding a backend") == ["huggy_exp/config.py", "huggy_exp/runners.py"]
    schema = tree / "huggy_exp" / "config.py"
    opening = "BACKENDS = {b.name: b for b in (\n"
    schema.write_text(schema.read_text().replace(opening, opening + TOY_BACKEND))
    runners = tree / "huggy_exp" / "runners.py"
    runners.write_text(runners.read_text() + TOY_FORWARD)
    env = {**subprocess_env(huggy_exp_cache), "PYTHONPATH": str(tree)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, *args], cwd=tree, env=env, capture_output=True, text=True, timeout=300)

    assert run("scripts/config_reference.py", "--write").returncode == 0
    for rel in ("conf/config.yaml", "conf/mode/benchmark.yaml", "docs/configuration.md", "docs/backends-and-timing.md"):
        assert re.search(r"\btoy\b", (tree / rel).read_text()), rel
    out = run("run.py", "backend=nope", "tracking=none")
    assert out.returncode == 2 and re.search(r"unknown backend 'nope'; valid: .*\btoy\b", out.stderr), out.stderr[-2000:]
    out = run("run.py", "mode=benchmark", "mode.backends=[eager,toy]", f"hydra.run.dir={tmp_path / 'bench'}", *BENCH)
    record = json.loads((tmp_path / "bench" / "result.json").read_text())
    assert record["status"] == "passed", (record["reason"], out.stderr[-2000:])
    assert record["details"]["backends"]["toy"]["status"] == "passed" and record["metrics"]["toy/b8/p50_us"] > 0
    run("run.py", "mode=action", "backend=toy", "dtype=bf16", f"hydra.run.dir={tmp_path / 'bf16'}", *BENCH[5:])
    record = json.loads((tmp_path / "bf16" / "result.json").read_text())
    assert record["status"] == "skipped" and "backend toy runs fp32 on cpu only" in record["reason"], record["reason"]


def test_contributing_names_the_two_files_of_a_dtype():
    assert files_to_touch("Adding a dtype") == ["huggy_exp/config.py", "conf/config.yaml"]


@pytest.mark.slow
def test_a_toy_dtype_added_from_contributings_list_is_judged_in_every_mode_that_reads_the_limits(tmp_path, huggy_exp_cache):
    """`fp32x`: fp32 under another name with a batch limit of its own, and `fp16x`: float16 under another name. Each
    declared in config.DTYPES, given a row of verify.limits and named in the comment of `dtype`, nothing else: fp32x
    sweeps beside fp32, computes fp32's bytes, and batch reads its own limit; fp16x is capped on the CPU with its note."""
    tree = tmp_path / "tree"
    copy_tree(tree)
    assert files_to_touch("Adding a dtype") == ["huggy_exp/config.py", "conf/config.yaml"]
    schema, conf = tree / "huggy_exp" / "config.py", tree / "conf" / "config.yaml"
    for name, toy in (("fp32", "fp32x"), ("fp16", "fp16x")):
        line = next(x for x in schema.read_text().splitlines() if f'"{name}": Dtype(' in x)
        schema.write_text(schema.read_text().replace(line, line.replace(f'"{name}"', f'"{toy}"') + "\n" + line))
        row = re.search(rf"^    {name}: \{{.*?\}}\n", conf.read_text(), re.S | re.M).group(0)
        conf.write_text(conf.read_text().replace(row, row + row.replace(f"{name}:", f"{toy}:")
                                                 .replace("batch_max_abs: 1.0e-05", "batch_max_abs: 0.0")))
    conf.write_text(conf.read_text().replace("# fp32 | fp16 |", "# fp32 | fp32x | fp16x | fp16 |", 1))
    env = {**subprocess_env(huggy_exp_cache), "PYTHONPATH": str(tree)}
    sweep = tmp_path / "sweep"
    out = subprocess.run([PYTHON, "run.py", "-m", "mode=precision,batch", "dtype=fp32,fp32x", "tracking=none",
                          "plots=false", "obs.rows=16", "batch_size=8", f"hydra.sweep.dir={sweep}"], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=300)
    records = {(r["mode"], r["dtype"]): r for r in (json.loads(p.read_text()) for p in sweep.glob("*/result.json"))}
    assert set(records) == {(m, d) for m in ("precision", "batch") for d in ("fp32", "fp32x")}, out.stderr[-2000:]
    assert records["precision", "fp32x"]["status"] == "passed", records["precision", "fp32x"]["reason"]
    assert records["precision", "fp32x"]["metrics"]["actions/vs_fp64/max_abs"] == \
        records["precision", "fp32"]["metrics"]["actions/vs_fp64/max_abs"]
    # its own batch limit, 0: any row that differs from single-row inference by a bit fails (fp32's 1e-5 passes)
    batch = records["batch", "fp32x"]
    assert batch["metrics"]["batch_invariance_max_abs"] > 0 and batch["status"] == "failed", batch["reason"]
    assert records["batch", "fp32"]["status"] == "passed"
    out = subprocess.run([PYTHON, "run.py", "mode=benchmark", "dtype=fp16x", "mode.batch_sizes=[8,1024]",
                          "mode.fp16_cpu_max_rows=64", f"hydra.run.dir={tmp_path / 'fp16x'}", *BENCH], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=300)
    record = json.loads((tmp_path / "fp16x" / "result.json").read_text())
    assert record["status"] == "passed", (record["reason"], out.stderr[-2000:])
    assert record["details"]["fp16_cpu_note"].startswith("fp16x on a CPU without float16 matmul kernels")
    assert "eager/b8/p50_us" in record["metrics"] and "eager/b1024/p50_us" not in record["metrics"]
