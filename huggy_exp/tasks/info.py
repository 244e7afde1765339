"""`info`: versions, devices, model dimensions, normalizer summary, files. Described in docs/modes.md#info."""

from __future__ import annotations

import numpy as np

from huggy_exp import environment
from huggy_exp.context import Context
from huggy_exp.mlagents import configuration_mismatches, model_configuration, sha256_file
from huggy_exp.placement import cann_version, inventory
from huggy_exp.results import Result
from huggy_exp.tasks import Task


class InfoTask(Task):
    def run(self, ctx: Context) -> Result:
        model, w = ctx.model, ctx.weights
        env, devices = {**environment.summary(), "cann": cann_version()}, inventory()
        n = w.normalizer
        normalizer = _normalizer_summary(n) if n is not None else None
        per_input = {f"obs_{i}": _normalizer_summary(o.normalizer) for i, o in enumerate(w.inputs) if o.normalizer is not None}
        files = {}  # the model's files (the checkpoint or .onnx, and a twin .onnx): path, size, sha256
        first = "checkpoint" if model.source != "onnx" else "onnx"
        for label, path in ((first, model.path), ("onnx", model.onnx_path)):
            if path is not None and label not in files:
                files[label] = {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        dims = {"obs_dim": w.obs_dim, "act_dim": w.act_dim, "hidden_units": w.hidden_units, "num_layers": w.num_layers,
                "parameters": w.parameter_count, "log_sigma_parameters": w.log_sigma_count,
                "conditional_sigma": w.conditional_sigma, "tanh_squash": w.tanh_squash,
                "version_number": w.version_number, "memory_size": w.memory_size, "step": model.step,
                "inputs": len(w.inputs), "discrete_branches": len(w.branches), "discrete_actions": sum(w.branch_sizes)}
        shape = {"inputs": [{"name": f"obs_{i}", "size": o.size, "normalized": o.normalizer is not None}
                            for i, o in enumerate(w.inputs)],
                 "continuous_actions": w.act_dim, "branch_sizes": list(w.branch_sizes), "memory_size": w.memory,
                 "lstm_hidden": w.lstm.hidden_size if w.lstm else 0, "description": w.describe_shape()}
        behavior, config = model_configuration(model.path)
        mismatches = configuration_mismatches(config, w) if config else []
        summary = [f"policy: {w.describe_shape()}; {w.num_layers}x{w.hidden_units} Swish; "
                   f"{w.parameter_count:,} parameters (+{w.log_sigma_count} log_sigma), step {model.step}",
                   _normalizer_line(n, normalizer, per_input), f"torch {env['torch']}, torch_npu {env['torch_npu']}, "
                   f"CANN {env['cann']}, onnxruntime {env['onnxruntime']}",
                   "devices: " + ", ".join(f"{k}={v}" for k, v in devices.items()),
                   *(f"{k}: {v['path']} ({v['bytes']:,} bytes, sha256 {v['sha256'][:16]}...)"
                     for k, v in files.items())]
        if config:
            summary.append("configuration.yaml: " + ("; ".join(mismatches) if mismatches else
                                                      f"{behavior} {config['trainer_type']} settings agree with the weights"))
        known = {k: (normalizer or {}).get(k) for k in ("normalization_steps", "fp16_overflow_dims")}
        metrics = {k: float(v) for k, v in {**dims, **known}.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return Result(metrics=metrics, summary=summary,
                      details={"environment": env, "devices": devices, "policy": dims, "shape": shape,
                               "normalizers": per_input, "normalizer": normalizer, "model_files": files,
                               "configuration": config, "configuration_mismatches": mismatches})


def _normalizer_line(n, normalizer: dict | None, per_input: dict) -> str:
    if n is None:
        return f"normalizers on {', '.join(per_input)} (kept fp32)" if per_input else "normalizer: none"
    return (f"normalizer: steps {n.steps}, std {normalizer['std_min']:.3g}..{normalizer['std_max']:.3g}, "
            + ("fp16 overflow unknown (.onnx holds only the folded std)" if normalizer["fp16_overflow_dims"] is None
               else f"{normalizer['fp16_overflow_dims']} dims overflow fp16 (kept fp32)"))


def _normalizer_summary(n) -> dict:
    """Steps, mean/variance/std ranges, never-varied and fp16-overflowing dimensions of one input's normalizer."""
    std, var = n.std.astype(np.float64), n.running_variance
    known = var is not None
    return {"normalization_steps": n.steps, "running_mean_min": float(n.running_mean.min()),
            "running_mean_max": float(n.running_mean.max()),
            "running_variance_min": float(var.min()) if known else None,
            "running_variance_max": float(var.max()) if known else None,
            "running_variance_median": float(np.median(var)) if known else None,
            "std_min": float(std.min()), "std_max": float(std.max()),
            "never_varied_dims": int(np.sum(var == 1.0)) if known else None,
            "fp16_overflow_dims": n.fp16_overflow_dims()}
