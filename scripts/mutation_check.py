"""Does the test suite catch the bugs it exists to catch? Apply each known mutation to a temp copy and run the tests.

    python scripts/mutation_check.py                  # every mutation: the default run, then the slow run
    python scripts/mutation_check.py --only silu      # one mutation (repeatable)
    python scripts/mutation_check.py --rev main~3     # the tree of a commit instead of the working tree

Per mutation, on a fresh copy of the tree (tracked and untracked-but-not-ignored files; `../shared` linked beside it):
1. the mutation's hint tests (`-m 'not slow'`, a subset of the default run) with `-x`: a failure there is a failure
   of the default run, found quickly;
2. else the whole default run (`python -m pytest -q -x`, on every core as pyproject's `-n auto` says);
3. else the slow run (`python -m pytest -q -x -m slow -n 0`).
Each in file order (`-p no:randomly`), so that the first failing test it names is the same from run to run.
It reports `default`, `slow only` or `MISSED`, with the first failing test, or `not applied` when the code it
mutates is no longer spelled as below (then update the mutation). Before any mutation, the union of the hint tests
runs on the unmutated copy: if one fails there, a "catch" would mean nothing, so the check stops.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old, new): old must occur in file; every occurrence is replaced
    hints: tuple[str, ...] = ()  # tests (node ids or files) expected to catch it, tried first


MUTATIONS = (
    Mutation("silu", "Swish x*sigmoid(x) swapped for F.silu (8e-7 off ML-Agents' own ops)", (
        ("huggy_exp/policy.py", "x = torch.sigmoid(x).mul_(x)", "x = torch.nn.functional.silu(x)"),
    ), ("tests/test_trust.py::test_fp32_cpu_actions_are_bit_identical_to_mlagents_ops_on_our_own_fixture",
        "tests/test_conformance.py")),
    Mutation("device-noise", "sampling noise from the device's default generator, not a seeded CPU generator", (
        ("huggy_exp/policy.py", 'gen = torch.Generator(device="cpu").manual_seed(int(seed))', "gen = None"),
        ("huggy_exp/policy.py", 'gen = torch.Generator(device="cpu").manual_seed(int(seed) + DISCRETE_SEED_OFFSET)',
         "gen = None"),
    ), ("tests/test_policy_placement.py::test_sampled_actions_same_seed_identical_bytes",)),
    Mutation("noise-unmoved", "the Gaussian head adds CPU noise to device tensors without moving it", (
        ("huggy_exp/policy.py", "torch.exp(log_sigma) * noise.to(mu.device, dtype)", "torch.exp(log_sigma) * noise.to(dtype=dtype)"),
    ), ("tests/test_placement_fake_device.py::test_every_shape_runs_on_the_device_with_cpu_noise_and_fp32_statistics",)),
    Mutation("nan-passes", "NaN/inf in a job's outputs no longer fails it (Result.check_finite skipped)", (
        ("huggy_exp/results.py", "        for name, array in self.arrays.items():\n",
         "        return\n        for name, array in self.arrays.items():\n"),
    ), ("tests/test_trust.py::test_nan_inf_in_any_output_array_fails_with_count_and_place",)),
    Mutation("nan-mismatch", "comparison metrics stop counting NaN that differ between actual and expected", (
        ("huggy_exp/verify.py", '"nan_mismatch": float(np.sum(np.isnan(a) != np.isnan(e))),', '"nan_mismatch": 0.0,'),
    ), ("tests/test_shapes_modes_prec.py",)),
    Mutation("margin-dropped", "discrete margin rule dropped: every flip is excused, whatever the margin", (
        ("huggy_exp/verify.py", "near = m <= allowed", "near = np.ones_like(flips)"),
    ), ("tests/test_shapes_modes_prec.py::test_a_flip_fails_only_where_the_fp64_margin_exceeds_the_bound",
        "tests/test_verify.py::test_a_discrete_flip_is_excused_only_within_the_one_margin_rule")),
    Mutation("margin-ignored", "discrete margin rule dropped the other way: no flip is ever excused", (
        ("huggy_exp/verify.py", "near = m <= allowed", "near = np.zeros_like(flips)"),
    ), ("tests/test_verify.py",
        "tests/test_shapes_modes_prec.py::test_a_flip_fails_only_where_the_fp64_margin_exceeds_the_bound",
        "tests/test_shapes_modes_prec.py::test_half_precision_verdicts_follow_the_fp64_margins")),
    Mutation("nan-excused", "the engine no longer fails an output with NaN/inf in it", (
        ("huggy_exp/verify.py", "    if count:\n        oc.failures.append(", "    if False:\n        oc.failures.append("),
    ), ("tests/test_verify.py::test_nan_or_inf_fails_whatever_the_limits",)),
    Mutation("non-atomic-result", "result.json written in place (truncate + write) instead of temp file + os.replace", (
        ("huggy_exp/files.py", "    atomic_write(path, lambda tmp: Path(tmp).write_text(text), overwrite)",
         "    Path(path).write_text(text)  # in place"),
    ), ("tests/test_trust.py::test_result_json_is_replaced_atomically_never_rewritten_in_place",)),
    Mutation("provider-unchecked", "onnxruntime's silent CPU fallback accepted (session providers not checked)", (
        ("huggy_exp/runners.py", "    active = session.get_providers()\n",
         "    return\n    active = session.get_providers()\n"),
    ), ("tests/test_benchmark.py::test_onnxruntime_provider_fallback_is_refused",)),
    Mutation("sqlite-unlocked", "the SQLite store's file lock removed (flock never taken)", (
        ("huggy_exp/tracking.py", "return flock(_lock_path(db), create=True)", "return contextlib.nullcontext()"),
    ), ("tests/test_trust.py::test_the_sqlite_store_lock_excludes_every_other_writer",
        "tests/test_trust.py::test_four_first_runs_at_once_on_a_fresh_store_lose_nothing_and_share_no_directory",
        "tests/test_trust.py::test_two_sweeps_at_once_into_one_store_give_two_parents_and_every_child",
        "tests/test_sweeps.py::test_three_parallel_joblib_sweeps_into_one_sqlite_store_lose_and_duplicate_nothing")),
    Mutation("fp16-normalizer", "normalizer statistics cast to the compute dtype (fp16 overflows at ~6e8)", (
        ("huggy_exp/policy.py", "kind = stat_dtype if name in exempt else", "kind = dtype if name in exempt else"),
    ), ("tests/test_policy_placement.py::test_normalizer_buffers_stay_float32_under_low_precision",
        "tests/test_placement_fake_device.py::test_every_shape_runs_on_the_device_with_cpu_noise_and_fp32_statistics")),
    Mutation("rnn-tf32", "precision_mode=ieee leaves CUDA's switches alone (cuDNN RNNs and convolutions stay TF32)", (
        ("huggy_exp/placement.py", '    if kind == "cuda":\n        tf32 = mode', '    if kind == "cuda" and mode != "ieee":\n        tf32 = mode'),
    ), ("tests/test_precision_mode.py::test_an_fp32_cuda_point_runs_cudnn_rnns_in_ieee_although_torch_defaults_them_to_tf32",)),
    Mutation("ort-tf32", "onnxruntime's CUDA provider keeps its TF32 default whatever precision_mode says", (
        ("huggy_exp/placement.py", 'options["use_tf32"] = "1" if mode == "tf32" else "0"', 'options["use_tf32"] = "1"'),
    ), ("tests/test_precision_mode.py::test_onnxruntime_cuda_runs_fp32_in_tf32_only_when_precision_mode_says_so",)),
    Mutation("conv-hf32", "precision_mode=ieee leaves torch_npu's conv HF32 (on by default) alone", (
        ("huggy_exp/placement.py", 'hf32 for op in ("matmul", "conv", "aclnn")}', 'hf32 for op in ("matmul",)}'),
    ), ("tests/test_precision_mode.py::test_hf32_sets_ascends_switches_and_cube_math_type_and_ieee_turns_conv_hf32_off",)),
    Mutation("precision-unchecked", "a precision switch that did not take is reported as the mode asked", (
        ("huggy_exp/placement.py", "    if wrong:\n", "    if False:\n"),
    ), ("tests/test_precision_mode.py::test_a_switch_that_does_not_take_is_skipped_naming_what_it_read",)),
    # issue 24's predicted first-run failures (#n: its row), each undone
    Mutation("compile-unreset", "#2: dynamo not reset per runner (a sweep's later policies hit recompile_limit)", (
        ("huggy_exp/runners.py", "    torch._dynamo.reset()\n    return _torchair()", "    return _torchair()"),
    ), ("tests/test_first_run_failures.py::test_failure_2_compile_resets_dynamo_per_runner_so_each_new_policy_compiles",)),
    Mutation("compile-eager-fallback", "#2: past recompile_limit dynamo runs eager, timed as compile", (
        ("huggy_exp/runners.py", "fail_on_recompile_limit_hit = True", "fail_on_recompile_limit_hit = False"),
    ), ("tests/test_first_run_failures.py::test_failure_2_past_the_recompile_limit_compile_is_an_error_not_eager",)),
    Mutation("backend-error-ends-point", "#3: a backend that fails to compile or capture raises out of the point", (
        ("huggy_exp/tasks/benchmark.py", "                if name == VERSUS:\n                    raise\n",
         "                raise\n"),
    ), ("tests/test_first_run_failures.py::test_failure_3_a_backend_that_fails_to_compile_fails_alone_and_the_others_run",)),
    Mutation("compile-inductor-on-npu", "#3: compile on the NPU through inductor, not torch_npu's backend", (
        ("huggy_exp/runners.py", '"mps": "inductor", "npu": "npu"}', '"mps": "inductor", "npu": "inductor"}'),
    ), ("tests/test_first_run_failures.py::test_failure_3_the_compile_backend_follows_the_device_kind",
        "tests/test_emulated_npu.py::test_failure_3_compile_on_the_npu_runs_torch_npus_dynamo_backend_on_the_card")),
    Mutation("torchair-stand-in-timed", "#3: torch_npu's eager stand-in for a missing torchair is timed as compile", (
        ("huggy_exp/runners.py", '== "_eager_npu_backend":', '== "no such backend":'),
    ), ("tests/test_emulated_npu.py::test_failure_3_a_compile_backend_that_fails_on_the_card_fails_alone_with_its_first_line",)),
    Mutation("compiler-error-unnamed", "#3: a failed compile's reason is dynamo's announcement, not the compiler's error", (
        ("huggy_exp/errors.py", 'if lines[0].endswith(":") and len(lines) > 1', "if False"),
    ), ("tests/test_first_run_failures.py::test_failure_3_a_compilers_reason_names_its_error_not_dynamos_announcement",)),
    Mutation("lstm-unflattened", "#5: the LSTM's weights are not flattened once placed (cuDNN repacks every call)", (
        ("huggy_exp/policy.py", "            self.memory.lstm.flatten_parameters()", "            pass"),
    ), ("tests/test_first_run_failures.py::test_failure_5_the_lstm_weights_are_flattened_once_placed",)),
    Mutation("set-device-dropped", "#7/#10: nothing makes the point's card current (graphs capture on card 0)", (
        ("huggy_exp/placement.py", "    if device.type in (\"cuda\", \"npu\") and device.index is not None:\n        mod =",
         "    if False:\n        mod ="),
    ), ("tests/test_emulated_npu.py::test_failure_7_graphs_on_the_second_card_replay_fresh_outputs",
        "tests/test_emulated_npu.py::test_failure_10_a_thread_that_never_set_the_card_runs_the_policy_on_it")),
    Mutation("set-device-main-thread-only", "#10: a thread other than the one that built the runner never sets its card", (
        ("huggy_exp/runners.py", "        use_device(self.target.device)  # whichever thread calls", "        pass"),
    ), ("tests/test_emulated_npu.py::test_failure_10_a_thread_that_never_set_the_card_runs_the_policy_on_it",)),
    Mutation("provider-missing-is-error", "#8: an onnxruntime build without the device's provider ends the job (exit 2)", (
        ("huggy_exp/runners.py", "            raise Unsupported(f\"onnxruntime provider {provider!r} is not in this",
         "            raise UserError(f\"onnxruntime provider {provider!r} is not in this"),
    ), ("tests/test_first_run_failures.py::test_failure_8_a_provider_missing_from_this_onnxruntime_is_skipped_naming_those_found",
        "tests/test_emulated_npu.py::test_failure_8_onnxruntime_without_cann_is_skipped_naming_the_providers_found")),
    Mutation("npu-fallback-allowed", "#9: torch_npu's silent CPU fallback left on", (
        ("huggy_exp/placement.py", "        os.environ.setdefault(NPU_FALLBACK_ENV, \"1\")", "        pass"),
    ), ("tests/test_first_run_failures.py::test_failure_9_the_npu_cpu_fallback_switch_is_set_before_the_first_npu_op",
        "tests/test_emulated_npu.py::test_failure_9_the_npu_cpu_fallback_switch_is_set_and_recorded")),
    Mutation("peak-memory-shared", "#11: one allocator peak for every backend, and batch never resets it", (
        ("huggy_exp/tasks/benchmark.py", "    if device.type in (\"cuda\", \"npu\") and isinstance(runner, TorchRunner):",
         "    if False:"),
        ("huggy_exp/tasks/batch.py", "        reset_peak_memory(target.device)  # this job's peak", "        pass  # this job's peak"),
    ), ("tests/test_emulated_npu.py::test_failure_11_peak_memory_is_per_backend_and_batch_reads_its_own",)),
    Mutation("slurm-card-skipped", "#12: under SLURM, `cuda:1` with one visible card is skipped", (
        ("huggy_exp/placement.py", " or len(visible) == 1 and os.environ.get(\"SLURM_JOB_ID\")", ""),
    ), ("tests/test_first_run_failures.py::test_failure_12_under_slurm_one_visible_card_is_the_points_card",)),
    Mutation("ray-noset-accepted", "#12: Ray's RAY_EXPERIMENTAL_NOSET_* accepted (the assigned card cannot be found)", (
        ("huggy_exp/placement.py", "    if os.environ.get(noset):", "    if False:"),
    ), ("tests/test_first_run_failures.py::test_failure_12_rays_noset_variables_are_refused_in_one_line",)),
    Mutation("switches-unrecorded", "#13: result.json without the device runtime's switches", (
        ("huggy_exp/app.py", "        \"switches\": environment.device_switches(),", ""),
    ), ("tests/test_first_run_failures.py::test_failure_13_every_device_switch_is_in_result_json",
        "tests/test_emulated_npu.py::test_failure_13_the_npu_switches_are_in_result_json")),
    Mutation("cards-disagreement-ignored", "two cards of one kind that differ bit for bit no longer fail the sweep", (
        ("huggy_exp/compare.py", "    return \"; \".join(found) or None", "    return None"),
    ), ("tests/test_emulated_npu.py::test_a_sweep_on_two_cards_names_the_card_that_differs_by_one_ulp_and_says_emulated",
        "tests/test_emulated_npu.py::test_cards_of_one_kind_must_agree_and_the_odd_one_is_named")),
    Mutation("fingerprint-second-hash", "the sweep's summaries show the quantized hash under the name `fingerprint`", (
        ("huggy_exp/sweep.py", '"fingerprint": (r.get("tags") or {}).get(FINGERPRINT),',
         '"fingerprint": (r.get("tags") or {}).get("quantized_fingerprint"),'),
    ), ("tests/test_answers.py::test_one_sweep_shows_one_fingerprint_per_point_everywhere",)),
    Mutation("recommend-across-batches", "a sweep's pick compares latencies measured at different batch sizes", (
        ("huggy_exp/compare.py", '_pick(device, batch, [t for t in here if t["batch"] == batch])', "_pick(device, batch, here)"),
    ), ("tests/test_answers.py::test_every_recommendation_is_the_fastest_passing_point_at_its_batch_backend_and_device",)),
    Mutation("ray-worker-reused", "accelerator points under Ray lose max_calls=1: a reused worker runs the next point", (
        ("hydra_plugins/huggy_ray_launcher/_core.py", "return {True: ray.remote(max_calls=1)(_run_point)",
         "return {True: ray.remote(_run_point)"),
    ), ("tests/test_ray.py::test_failure_6_accelerator_points_under_ray_run_one_per_worker_process",
        "tests/test_ray.py::test_each_accelerator_point_runs_in_a_worker_of_its_own_and_records_its_card")),
    Mutation("one-card-as-two", "the dual-card agreement compares device strings, not the cards the points ran on", (
        ("huggy_exp/compare.py", 'if len({_card(c) for c in cards}) > 1 and', 'if len({c["device"] for c in cards}) > 1 and'),
    ), ("tests/test_ray.py::test_two_cards_that_ran_on_one_card_are_not_a_two_card_check",)),
    Mutation("cpu-first", "the accelerator check's sweeps list cpu before the device (its jobs run first, issue 24 #1)", (
        ("scripts/accelerator_check.py", 'devices = device if device == "cpu" else f"{device},cpu"',
         'devices = device if device == "cpu" else f"cpu,{device}"'),
    ), ("tests/test_accelerator_check.py::test_failure_1_device_points_run_before_the_cpu_jobs_in_every_step",)),
    Mutation("fixtures-silent", "a missing fixture folder skips the genuine policies silently (issue 24 #4)", (
        ("scripts/accelerator_check.py", "    if not folder.is_dir():\n        raise SystemExit(",
         "    if not folder.is_dir():\n        return []\n        raise SystemExit("),
    ), ("tests/test_accelerator_check.py::test_failure_4_a_missing_fixture_folder_is_an_error_unless_a_flag_says_to_skip_it",)),
    Mutation("int8-float-row", "the one-row path caches the weights before torchao quantizes them: int8 runs fp32 there", (
        ("huggy_exp/policy.py", "        if quantize is not None:\n            quantize(self)\n        self._cache_parameters()",
         "        self._cache_parameters()\n        if quantize is not None:\n            quantize(self)"),
    ), ("tests/test_int8.py",)),
    Mutation("policy-units-unjudged", "KL and |Δμ|/σ reported beside their limits but never failed", (
        ("huggy_exp/verify.py", "        if not bad and not oc.metrics[metric] <= bound:", "        if False:"),
    ), ("tests/test_int8.py",)),
)


def copy_tree(dest: Path, rev: str | None) -> Path:
    """The tree (tracked + untracked-not-ignored files, or a commit's) under dest/repo, with dest/shared linked."""
    repo = dest / "repo"
    repo.mkdir(parents=True)
    if rev:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(repo)], input=archive, check=True)
    else:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                                capture_output=True).stdout.decode().split("\0")
        for rel in (rel for rel in listed if rel and (REPO / rel).is_file()):  # a tracked file deleted here: not copied
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, repo / rel)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (dest / "shared").symlink_to(shared.resolve())
    return repo


def apply(repo: Path, mutation: Mutation) -> str | None:
    """Apply every edit; the reason it cannot be applied, or None."""
    for rel, old, new in mutation.edits:
        path = repo / rel
        text = path.read_text() if path.is_file() else ""
        if old not in text:
            return f"{rel} no longer contains {old.strip().splitlines()[0]!r}"
        path.write_text(text.replace(old, new))
    return None


def present(repo: Path, hints) -> list[str]:
    """The hints this tree has (a file, or file::test whose def is in it): an older tree may lack a newer test."""
    found = []
    for hint in hints:
        file, _, test = hint.partition("::")
        if (repo / file).is_file() and (not test or f"def {test}(" in (repo / file).read_text()):
            found.append(hint)
    return found


def pytest(repo: Path, args: list[str], timeout: float) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYDRA_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(repo), PYTHONDONTWRITEBYTECODE="1")
    started = time.monotonic()
    try:  # SIGINT as a terminal leaves it: started in the background (`&` without job control), this process ignores
        # it, and so would the suite's Ctrl-C test, whose failure would then read as a catch
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:randomly",
                               *args], cwd=repo, env=env, capture_output=True, text=True, timeout=timeout,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else str(exc.stdout or "")
        return 124, out, time.monotonic() - started


def first_failure(output: str) -> str:
    found = re.search(r"^(?:FAILED|ERROR) (\S+)", output, re.M)
    return found.group(1) if found else output.strip().splitlines()[-1][:120] if output.strip() else "?"


def check(mutation: Mutation, rev: str | None, slow: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as tmp:
        repo = copy_tree(Path(tmp), rev)
        problem = apply(repo, mutation)
        if problem:
            return {"name": mutation.name, "verdict": "not applied", "by": problem, "seconds": 0.0}
        hints = present(repo, mutation.hints)
        runs = [("default", ["-m", "not slow", "-n", "0", *hints])] if hints else []  # a few tests: no workers to start
        runs += [("default", [])] + ([("slow only", ["-m", "slow", "-n", "0"])] if slow else [])  # serial, as .ci/run
        total, verdict, by = 0.0, "MISSED", ""
        for run, args in runs:
            rc, out, seconds = pytest(repo, args, timeout)
            total += seconds
            if rc == 124:  # a run cut short proves nothing either way
                verdict, by = f"unknown ({run} run timed out)", ""
            elif rc not in (0, 5):  # caught (0: passed, 5: nothing collected)
                verdict, by = run if rc == 1 else f"{run} (pytest exit {rc})", first_failure(out)
            if verdict != "MISSED":
                break
        return {"name": mutation.name, "verdict": verdict, "by": by, "seconds": total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[m.name for m in MUTATIONS], help="run only this mutation")
    parser.add_argument("--rev", help="check a commit's tree (git archive) instead of the working tree")
    parser.add_argument("--no-slow", action="store_true", help="skip the slow run (a miss then reads 'MISSED')")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run (default 1800)")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="do not rerun the hint tests unmutated (only when they just passed on this same tree)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if not args.skip_baseline:
        with tempfile.TemporaryDirectory(prefix="mutation-baseline-") as tmp:
            repo = copy_tree(Path(tmp), args.rev)
            hints = present(repo, sorted({h for m in chosen for h in m.hints}))
            rc, out, seconds = pytest(repo, ["-m", "not slow", "-n", "0", *hints], args.timeout) if hints else (0, "", 0.0)
        if rc != 0:
            print(f"the unmutated hint tests fail ({first_failure(out)}): fix that first", file=sys.stderr)
            return 2
        print(f"baseline: the hint tests pass unmutated ({seconds:.0f} s)", flush=True)
    print("| mutation | what | caught by | first failing test | s |\n| --- | --- | --- | --- | --- |", flush=True)
    results = []
    for mutation in chosen:
        r = check(mutation, args.rev, not args.no_slow, args.timeout)
        results.append(r)
        print(f"| `{r['name']}` | {mutation.what} | {r['verdict']} | {r['by']} | {r['seconds']:.0f} |", flush=True)
    return 1 if any(r["verdict"] in ("MISSED", "not applied") or r["verdict"].startswith("unknown") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
