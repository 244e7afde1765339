"""`onnx-compare`: the torch policy on (device, dtype) against onnxruntime running the ML-Agents .onnx."""

from __future__ import annotations

import numpy as np

from huggy_exp import plots
from huggy_exp.context import Context
from huggy_exp.mlagents import ACTION_CLAMP, check_onnx_pairing
from huggy_exp.numerics import compare, limits_for, sampling_check
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, SAMPLED, build, reference
from huggy_exp.tasks import latency


class OnnxCompareTask:
    name = "onnx-compare"

    def __init__(self, provider: str = "CPUExecutionProvider", atol: dict | None = None, specialize: dict | None = None,
                 sample_rows: int = 16, samples: int = 512, confidence: float = 0.999, rel_floor: float = 1e-3):
        self.provider = provider
        self.atol = atol or {"fp64": 1e-5, "fp32": 1e-5, "fp16": 1e-2, "bf16": 5e-2}
        self.specialize = specialize or {}
        self.sample_rows, self.samples, self.confidence, self.rel_floor = sample_rows, samples, confidence, rel_floor

    def run(self, ctx: Context) -> Result:
        ctx.require_huggy_shape(self.name)
        obs, w = ctx.observations, ctx.weights
        onnx_path = ctx.onnx_path()
        check_onnx_pairing(onnx_path, w)
        ort = build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0, provider=self.provider)
        under_test = build(ctx)
        mine, theirs = under_test.infer(obs), ort.infer(obs)
        result = Result()

        # --- deterministic actions, element-wise
        atol = limits_for({k: {"atol": v} for k, v in self.atol.items()}, ctx.dtype, ctx.device, self.specialize)["atol"]
        m = compare(mine[ACTIONS], theirs[ACTIONS], self.rel_floor)
        result.metrics.update({f"deterministic.{k}": v for k, v in m.items()})
        if theirs[ACTIONS].shape != mine[ACTIONS].shape:
            result.fail(f"deterministic_continuous_actions shape {theirs[ACTIONS].shape} != {mine[ACTIONS].shape}")
        elif m["max_abs"] > atol or m["nan_mismatch"] or m["inf_mismatch"]:
            result.fail(f"deterministic_continuous_actions max_abs {m['max_abs']:.3g} > atol {atol:g}"
                        + (f", {int(m['nan_mismatch'] + m['inf_mismatch'])} NaN/Inf mismatches" if m["nan_mismatch"] + m["inf_mismatch"] else ""))

        # --- constant outputs, exactly
        expected = {"version_number": w.version_number, "memory_size": w.memory_size, "continuous_action_output_shape": float(w.act_dim)}
        constants = {}
        for name, value in expected.items():
            got = theirs.get(name)
            same = got is not None and got.shape == (1,) and float(got[0]) == value
            constants[name] = {"onnx": None if got is None else got.tolist(), "expected": value, "equal": same}
            result.metrics[f"{name}.equal"] = float(same)
            if not same:
                result.fail(f"{name}: onnx {constants[name]['onnx']} != {value}")

        # --- sampled actions, statistically: many onnxruntime draws against mu and exp(log_sigma)
        rows = obs[: self.sample_rows]
        draws = ort.infer(np.tile(rows, (self.samples, 1)))[SAMPLED].reshape(self.samples, len(rows), -1)
        # the distribution comes from the fp32 CPU policy: this tests the graph's sampler; the dtype is tested above
        ref = reference(ctx, "fp32").trace(rows)
        mu, sigma = ref["mu"][: len(rows)].astype(np.float64), np.exp(ref["log_sigma"][: len(rows)].astype(np.float64))
        if w.tanh_squash:
            stats = sampling_check(np.arctanh(np.clip(draws, -1 + 1e-7, 1 - 1e-7)), mu, sigma, None, None, self.confidence)
        else:
            stats = sampling_check(draws * ACTION_CLAMP, mu, sigma, -ACTION_CLAMP, ACTION_CLAMP, self.confidence)
        result.metrics.update({f"sampled.{k}": v for k, v in stats.items()})
        if not stats["mean_z_max"] <= stats["mean_z_crit"]:  # written so that NaN never passes
            result.fail(f"sampled means off: max |z| {stats['mean_z_max']:.2f} > {stats['mean_z_crit']:.2f} ({self.confidence:.1%} confidence)")
        if stats["spread_cells"] > 0 and not abs(stats["spread_ratio"] - 1) <= stats["spread_tolerance"]:
            result.fail(f"sampled spread {stats['spread_ratio']:.3f} x exp(log_sigma), outside 1 +- {stats['spread_tolerance']:.3f}")

        result.details.update({"onnx": str(onnx_path), "provider": self.provider, "atol": atol, "constants": constants,
                               "headline": f"deterministic max_abs {m['max_abs']:.2e} (atol {atol:g}); constants "
                                           f"{'equal' if all(c['equal'] for c in constants.values()) else 'DIFFER'}; "
                                           f"sampled max|z| {stats['mean_z_max']:.2f}/{stats['mean_z_crit']:.2f}, spread {stats['spread_ratio']:.3f}"})
        result.summary = [
            f"{ort.name} on {onnx_path.name} vs {under_test.name} ({ctx.device} {ctx.dtype})",
            result.details["headline"],
            f"sampled: {int(stats['cells'])} cells x {self.samples} draws; mean test at {self.confidence:.1%} (Bonferroni), "
            f"spread on {int(stats['spread_cells'])} unclipped cells",
        ]
        result.tables["outputs"] = [{"output": "deterministic_continuous_actions", **m},
                                    *({"output": k, **v} for k, v in constants.items())]
        result.arrays.update({"torch_actions": mine[ACTIONS].astype(np.float32), "onnx_actions": theirs[ACTIONS]})
        result.files.append(plots.error_histogram(ctx.workdir / "error_histogram.png",
                                                  {f"torch {ctx.dtype} - onnxruntime": mine[ACTIONS] - theirs[ACTIONS]},
                                                  f"deterministic actions, {ctx.device} {ctx.dtype} vs {ort.name}"))
        latency(under_test, ctx, obs, result)
        return result
