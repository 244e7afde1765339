"""Precision plans (conf/plan/, docs/precision-plans.md): a dtype per part of the policy, run by every mode that runs it
exactly as a dtype is, judged by the same engine and limits, refused in one line when it does not fit."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import torch

from conftest import PYTHON, REPO, run_job, subprocess_env
from huggy_exp import mlagents
from huggy_exp.config import PlanConf
from huggy_exp.errors import UserError
from huggy_exp.placement import plan_for, resolve
from huggy_exp.policy import Policy
from huggy_exp.runners import ACTIONS, OBS, TorchRunner

PLAN = "plan=huggy_bf16_head_fp32"  # conf/plan/: Huggy's MLP in bf16, mu in fp32 (the embedded default is Huggy-shaped)
FAST = {"benchmark": ["mode.budget_s=0.2", "mode.warmup_s=0.05", "mode.scenarios=[single_stream]"],
        "stats": ["mode.steps=20"], "fingerprint": ["mode.steps=20"], "record": ["mode.latency.budget_s=0.1"]}


def _plan(parts: dict[str, str], limits: str | None = None, policy: str | None = None) -> PlanConf:
    return PlanConf(name="t", policy=policy, limits=limits, parts=parts)


def _runner(plan: PlanConf | None, dtype: str = "fp32", backend: str = "eager") -> TorchRunner:
    w = mlagents.load_default().weights
    parts = tuple(Policy(w).parts())
    resolved = plan and plan_for(plan, parts, dtype, "")
    return TorchRunner(w, resolve("cpu", dtype, resolved), 0, backend)


def test_each_part_takes_its_planned_dtype_and_the_normalizer_stays_fp32():
    policy = _runner(_plan({"hidden_1": "bf16", "mu": "fp16"})).policy
    assert [layer.weight.dtype for layer in policy.body] == [torch.float32, torch.bfloat16, torch.float32]
    assert policy.continuous.mu.weight.dtype == torch.float16
    assert policy.normalizers[0].std.dtype == torch.float32 and policy.stat_dtype == torch.float32


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_plan_of_one_dtype_gives_that_dtypes_bytes(dtype):
    """The casts between parts change nothing where the parts agree: plan all-<dtype> == dtype=<dtype>, bit for bit,
    on the one-row (addmv) path and the batched one."""
    w = mlagents.load_default().weights
    plan = _plan({p: dtype for p in Policy(w).parts()})
    obs = np.random.default_rng(0).standard_normal((5, w.obs_dim)).astype(np.float32)
    for rows in (obs[:1], obs):
        planned, uniform = (_runner(p, dtype).infer({OBS: rows})[ACTIONS] for p in (plan, None))
        assert np.array_equal(planned, uniform)


def test_a_mixed_plan_lies_between_its_dtypes():
    w = mlagents.load_default().weights
    obs = np.random.default_rng(1).standard_normal((64, w.obs_dim)).astype(np.float32)
    got = {name: _runner(plan, dtype).infer({OBS: obs})[ACTIONS] for name, plan, dtype in (
        ("fp32", None, "fp32"), ("bf16", None, "bf16"), ("mixed", _plan({"mu": "fp32"}), "bf16"))}
    assert not np.array_equal(got["mixed"], got["bf16"]) and not np.array_equal(got["mixed"], got["fp32"])


@pytest.mark.parametrize("mode", ["action", "sample", "batch", "precision", "fingerprint", "stats", "benchmark",
                                  "onnx-compare", "record"])
def test_every_mode_that_runs_the_policy_runs_a_plan(mode, tmp_path):
    job = run_job(tmp_path, mode, PLAN, "dtype=bf16", *FAST.get(mode, []))
    assert job.record["status"] in ("passed", "failed"), job.record["reason"]
    plan = job.record["plan"]
    assert plan["name"] == "huggy_bf16_head_fp32" and len(plan["hash"]) == 12 and plan["limits"] == "bf16"
    assert plan["parts"] == {"hidden_0": "bf16", "hidden_1": "bf16", "hidden_2": "bf16", "mu": "fp32"}
    assert "plan:huggy_bf16_head_fp32" in job.record["run_name"]
    if mode not in ("stats", "record"):
        assert "plan huggy_bf16_head_fp32, bf16 limits" in job.record["headline"]


def test_a_plan_is_judged_by_its_lowest_dtypes_limits_unless_it_names_its_own(tmp_path):
    lowest = run_job(tmp_path / "lowest", "precision", PLAN, "dtype=fp32")
    assert lowest.record["status"] == "passed" and lowest.record["metrics"]["actions/vs_fp64/max_abs_limit"] == 5e-2
    own = run_job(tmp_path / "own", "precision", PLAN, "dtype=fp32", "plan.limits=fp32")
    assert own.record["status"] == "failed" and own.record["metrics"]["actions/vs_fp64/max_abs_limit"] == 1e-5


def test_record_and_replay_name_the_plan_as_the_point(tmp_path):
    bundle = tmp_path / "bundle"
    rec = run_job(tmp_path / "rec", "record", PLAN, "dtype=bf16", f"mode.out={bundle}", *FAST["record"])
    assert rec.record["details"]["point"] == "cpu/plan:huggy_bf16_head_fp32/eager/b64"
    rep = run_job(tmp_path / "rep", "replay", PLAN, "dtype=bf16", f"mode.bundle={bundle}", "mode.latency.budget_s=0.1")
    assert rep.record["status"] == "passed", rep.record["reason"]
    assert rep.record["metrics"]["agreement/bitwise_share"] == 1.0


@pytest.mark.parametrize("backend", ["fused", "onnxruntime"])
def test_a_backend_that_cannot_honour_a_plan_is_skipped_with_the_reason(backend, tmp_path):
    job = run_job(tmp_path, "action", PLAN, f"backend={backend}", "batch_size=1")
    assert job.record["status"] == "skipped"
    assert job.record["reason"].startswith(f"backend {backend} cannot run precision plan huggy_bf16_head_fp32: ")


@pytest.mark.parametrize("override, words", [
    ("plan.parts.mu=fp12", "plan huggy_bf16_head_fp32: part mu has unknown dtype 'fp12'; valid: int8, int8w, bf16"),
    ("plan.policy=4 inputs", "plan huggy_bf16_head_fp32 was made for a policy with 4 inputs; this policy has 1 input "
                             "[59], 21 continuous actions; body [512, 512, 512]"),
])
def test_a_bad_plan_is_an_error_naming_the_entry(override, words, tmp_path):
    job = run_job(tmp_path, "action", PLAN, override)
    assert job.record["status"] == "error" and job.record["reason"].startswith(words)


def test_an_unknown_part_is_one_line_naming_the_parts_and_exit_2(tmp_path):
    done = subprocess.run([PYTHON, "run.py", "mode=action", PLAN, "+plan.parts.hidden_9=bf16", "tracking=none",
                           f"hydra.run.dir={tmp_path / 'job'}"], cwd=REPO, env=subprocess_env(tmp_path / "cache"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert ("plan huggy_bf16_head_fp32: unknown part 'hidden_9'; this policy's parts: hidden_0, hidden_1, hidden_2, mu "
            "(its normalizers always stay fp32)") in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_a_plan_dtype_the_device_cannot_run_names_the_part_and_the_dtypes_that_run(monkeypatch):
    """int8 (torchao) runs on the CPU only: on a CUDA card (the CPU standing in for it) the plan is one line."""
    from huggy_exp import placement

    monkeypatch.setattr(placement, "resolve_device", lambda name: torch.device("cpu"))
    w = mlagents.load_default().weights
    plan = plan_for(_plan({"mu": "int8"}), tuple(Policy(w).parts()), "fp32", "")
    with pytest.raises(UserError, match=r"^plan t: part mu in int8: dtype int8 \(torchao int8\) runs on the CPU here, "
                                        r"not on cuda:0.*; dtypes that run on cuda:0: bf16, fp16, fp32, fp64$"):
        placement.resolve("cuda:0", "fp32", plan)


def test_the_content_hash_follows_what_runs_not_the_file():
    parts = ("hidden_0", "mu")
    a = plan_for(_plan({"mu": "fp32"}), parts, "bf16", "")
    b = plan_for(_plan({"hidden_0": "bf16", "mu": "fp32"}), parts, "fp32", "")
    c = plan_for(_plan({"mu": "fp32"}), parts, "fp32", "")
    assert a.hash == b.hash != c.hash and a.limits == "bf16" and c.limits == "fp32"


def test_a_plan_sweep_gives_every_point_a_verdict_and_picks_a_plan_like_for_like(tmp_path):
    """plan x dtype points on one device and batch (KL limit set between the plan's and uniform bf16's): the plan
    passes where bf16 fails, both are options at that batch, and a plan picked is said to be one."""
    from huggy_exp.compare import _why
    from huggy_exp.sweep import summarize

    head_bf16 = ["plan.parts.hidden_0=fp32", "plan.parts.hidden_1=fp32", "plan.parts.hidden_2=fp32", "plan.parts.mu=bf16"]
    for i, (plan, dtype) in enumerate((("huggy_bf16_head_fp32", "bf16"), ("none", "bf16"), ("none", "fp32"),
                                       ("huggy_bf16_head_fp32", "fp32"))):
        run_job(tmp_path / str(i), "precision", f"plan={plan}", f"dtype={dtype}", "verify.limits.bf16.kl_max=1.2e-3",
                *(head_bf16 if plan != "none" else ()))
    summary = summarize(tmp_path)
    assert [(r["numerics"], r["status"]) for r in summary["rows"]] == [
        ("plan:huggy_bf16_head_fp32", "passed"), ("bf16", "failed"), ("fp32", "passed"), ("plan:huggy_bf16_head_fp32", "passed")]
    plans = [r["plan"] for r in summary["rows"] if r["plan"]]
    assert plans[0]["hash"] == plans[1]["hash"]  # the plan names every part: the point's dtype changes nothing
    pick = summary["comparison"]["recommended"]["cpu at batch 64"]
    assert pick["failing"] == ["bf16"] and set(pick["passing"]) == {"plan:huggy_bf16_head_fp32", "fp32"}
    assert {(o["dtype"], o["backend"]) for o in pick["options"]} >= {("plan:huggy_bf16_head_fp32", "eager"), ("fp32", "eager")}
    choice = {"dtype": "plan:huggy_bf16_head_fp32", "backend": "eager", "p50_us": 1.0, "obs_per_s": None, "job": "0",
              "mode": "precision", "noisy": False, "label": "plan:huggy_bf16_head_fp32 eager"}
    assert "plan:huggy_bf16_head_fp32 eager (a precision plan, compared like for like: same device, batch and backend)" in _why(
        choice, [], [choice], 64, {"metrics": {}, "job": "0"})


def test_the_emulated_npu_runs_a_plan_and_still_catches_a_perturbed_card(tmp_path, huggy_exp_cache):
    folder = tmp_path / "sweep"
    done = subprocess.run([PYTHON, "tests/emulated_npu.py", "run.py", "-m", "mode=precision", "device=cpu,npu:0,npu:1",
                           PLAN, "dtype=bf16", "tracking=none", "plots=false", f"hydra.sweep.dir={folder}"], cwd=REPO,
                          env={**subprocess_env(huggy_exp_cache), "HUGGY_EXP_EMULATED_NPU_PERTURB": "1:0.01"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    points = {r["device"]: r for r in (json.loads(p.read_text()) for p in folder.glob("*/result.json"))}
    assert {d: (r["status"], r["plan"]["name"]) for d, r in points.items() if d != "npu:1"} == {
        "cpu": ("passed", "huggy_bf16_head_fp32"), "npu:0": ("passed", "huggy_bf16_head_fp32")}
    assert points["npu:0"]["emulated"] is True
    assert "FAILED: npu:1 (job 2) differs bit for bit from npu:0 (job 1)" in done.stdout
