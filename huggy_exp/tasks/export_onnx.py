"""`export-onnx`: export the rebuilt policy as an ML-Agents-compatible .onnx, check it, and compare with the source."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from huggy_exp.context import Context
from huggy_exp.errors import UserError
from huggy_exp.mlagents import ONNX_INPUT, ONNX_OUTPUTS, PolicyWeights
from huggy_exp.numerics import compare
from huggy_exp.policy import Policy
from huggy_exp.results import Result
from huggy_exp.runners import ACTIONS, build, reference

BATCH_OUTPUTS = ("continuous_actions", "deterministic_continuous_actions")


class MLAgentsExport(nn.Module):
    """The forward ML-Agents exports: five outputs in its order, log_sigma broadcast as mu * 0 + log_sigma."""

    def __init__(self, weights: PolicyWeights):
        super().__init__()
        self.policy = Policy(weights)
        self.register_buffer("version_number", torch.tensor([weights.version_number], dtype=torch.float32))
        self.register_buffer("memory_size", torch.tensor([weights.memory_size], dtype=torch.float32))
        self.register_buffer("continuous_action_output_shape", torch.tensor([float(weights.act_dim)]))

    def forward(self, obs_0: torch.Tensor):
        head = self.policy.continuous
        x = self.policy.features(obs_0)
        mu = head.mu(x)
        sampled = head.squash(mu + torch.randn_like(mu) * torch.exp(head.log_sigma_of(x, mu)))
        return (self.version_number * 1, self.memory_size * 1, sampled, self.continuous_action_output_shape * 1, head.head(mu))


class ExportOnnxTask:
    name = "export-onnx"

    def __init__(self, path: str | None = None, opset: int = 9, atol: float = 1e-5):
        self.path, self.opset, self.atol = path, opset, atol

    def run(self, ctx: Context) -> Result:
        import onnx

        ctx.require_huggy_shape(self.name)
        w, obs = ctx.weights, ctx.observations
        out = Path(self.path).expanduser() if self.path else ctx.workdir / f"{Path(ctx.model.path).stem.split('-')[0]}.onnx"
        out.parent.mkdir(parents=True, exist_ok=True)
        module = MLAgentsExport(w).eval()
        dynamic = {ONNX_INPUT: {0: "batch"}, **{name: {0: "batch"} for name in BATCH_OUTPUTS}}
        try:
            with warnings.catch_warnings():
                # deliberate: the TorchScript exporter is the one ML-Agents uses and the only one that writes opset 9
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(module, (torch.zeros(1, w.obs_dim),), str(out), input_names=[ONNX_INPUT],
                                  output_names=list(ONNX_OUTPUTS), dynamic_axes=dynamic, opset_version=self.opset,
                                  dynamo=False)
        except Exception as exc:
            raise UserError(f"torch.onnx.export failed at opset {self.opset}: {str(exc).splitlines()[0]}") from None
        model = _name_outputs(onnx.load(str(out)))
        onnx.checker.check_model(model, full_check=True)
        onnx.save(model, str(out))
        interface = _interface(model)
        result = Result(files=[str(out) if self.path else out.name])  # an artifact wherever it was written
        problems = _interface_problems(interface, w.obs_dim, w.act_dim)
        for p in problems:
            result.fail(p)

        # --- run it, against the fp32 torch policy and against the source .onnx
        exported = build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0, onnx=out).infer(obs)
        torch_fp32 = reference(ctx, "fp32").infer(obs)[ACTIONS]
        m_torch = compare(exported[ACTIONS], torch_fp32)
        result.metrics.update({f"vs_torch.{k}": v for k, v in m_torch.items()})
        if m_torch["max_abs"] > self.atol:
            result.fail(f"exported graph vs torch fp32: max_abs {m_torch['max_abs']:.3g} > {self.atol:g}")
        source = ctx.model.onnx_path
        headline = f"exported {out.name} (opset {self.opset}): vs torch max_abs {m_torch['max_abs']:.2e}"
        if source is not None:
            theirs = build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0, onnx=source).infer(obs)
            m_src = compare(exported[ACTIONS], theirs[ACTIONS])
            identical = bool(np.array_equal(exported[ACTIONS], theirs[ACTIONS]))
            result.metrics.update({f"vs_source.{k}": v for k, v in m_src.items()})
            result.metrics["vs_source.bit_identical"] = float(identical)
            for name in ("version_number", "memory_size", "continuous_action_output_shape"):
                if not np.array_equal(exported[name], theirs.get(name)):
                    result.fail(f"{name}: exported {exported[name].tolist()} != source {np.asarray(theirs.get(name)).tolist()}")
            if m_src["max_abs"] > self.atol:
                result.fail(f"exported vs source .onnx: max_abs {m_src['max_abs']:.3g} > {self.atol:g}")
            headline += f", vs source {source.name} max_abs {m_src['max_abs']:.2e} ({'bit-identical' if identical else 'not bit-identical'})"
        else:
            headline += "; no source .onnx to compare with"
        if ctx.dtype != "fp32" or ctx.device != "cpu":
            headline += f" (the graph is float32 from the CPU; device={ctx.device} dtype={ctx.dtype} do not apply)"
        result.details.update({"exported": str(out), "source_onnx": str(source) if source else None, "interface": interface,
                               "headline": headline})
        result.arrays["exported_actions"] = exported[ACTIONS]
        result.summary = [headline, f"interface: inputs {interface['inputs']}, outputs {interface['outputs']}",
                          f"onnx.checker: clean; written to {out}"]
        return result


def _name_outputs(model):
    """The exporter folds the constant outputs into initializers with generated names; route them through Identity
    nodes to ML-Agents' names, as ML-Agents' own graphs do."""
    from onnx import helper

    for output, name in zip(model.graph.output, ONNX_OUTPUTS):
        if output.name != name:
            model.graph.node.append(helper.make_node("Identity", [output.name], [name], name=f"/{name}/Identity"))
            output.name = name
    return model


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _interface(model) -> dict:
    return {
        "opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
        "inputs": {i.name: _dims(i) for i in model.graph.input},
        "outputs": {o.name: _dims(o) for o in model.graph.output},
    }


def _interface_problems(interface: dict, obs_dim: int, act_dim: int) -> list[str]:
    """ML-Agents' names and order; a symbolic batch on the input and on every action output."""
    problems = []
    if list(interface["inputs"]) != [ONNX_INPUT] or interface["inputs"][ONNX_INPUT][1:] != [obs_dim]:
        problems.append(f"input {interface['inputs']} is not {ONNX_INPUT} [batch, {obs_dim}]")
    if list(interface["outputs"]) != list(ONNX_OUTPUTS):
        problems.append(f"outputs {list(interface['outputs'])} are not ML-Agents' {list(ONNX_OUTPUTS)}")
    for name in BATCH_OUTPUTS:
        dims = interface["outputs"].get(name, [])
        if len(dims) != 2 or not isinstance(dims[0], str) or dims[1] != act_dim:
            problems.append(f"{name} shape {dims} is not [batch, {act_dim}] with a dynamic batch")
    return problems
