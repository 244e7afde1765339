"""`export-onnx`: the rebuilt policy as an ML-Agents .onnx, checked and compared.
Described in docs/modes.md#export-onnx."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from huggy_exp import mlagents
from huggy_exp.config import ONNX_DTYPE, ExportOnnxMode
from huggy_exp.context import Context
from huggy_exp.errors import UserError
from huggy_exp.mlagents import PolicyWeights, interface
from huggy_exp.mlagents.onnx_graph import value_info
from huggy_exp.numerics import allowed_branches
from huggy_exp.policy import Policy
from huggy_exp.results import Result, first_nonfinite
from huggy_exp.files import atomic_write, claim_output
from huggy_exp.runners import DISCRETE_SAMPLED, build, over_steps, reference, run_feeds
from huggy_exp.tasks import Task, is_sequence
from huggy_exp.tasks.compare import expected_constants, feeds_with_masks, first_divergence, judge_outputs
from huggy_exp.verify import DECLARED


class MLAgentsExport(nn.Module):
    """The forward ML-Agents exports, for every shape: inputs obs_0 .. obs_<k>, action_masks (discrete), recurrent_in
    (memory); outputs version_number, memory_size, each head's sampled / shape / deterministic outputs (continuous, then
    discrete), recurrent_out. log_sigma is broadcast as mu * 0 + log_sigma; discrete draws are torch.multinomial of the
    masked softmax (exported as Multinomial(Log(p))), deterministic ones its ArgMax."""

    def __init__(self, weights: PolicyWeights):
        super().__init__()
        self.policy = Policy(weights)
        self.inputs = len(weights.inputs)
        for name, value in expected_constants(weights).items():  # the constant outputs, as ML-Agents writes them
            self.register_buffer(name, torch.from_numpy(value))

    def forward(self, *inputs: torch.Tensor):
        p = self.policy
        rest = list(inputs[self.inputs:])
        masks = rest.pop(0) if p.discrete is not None else None
        memory = rest.pop(0) if p.memory is not None else None
        x, memory_out = p.encode(list(inputs[: self.inputs]), memory)
        out = [self.version_number * 1, self.memory_size * 1]
        if p.continuous is not None:
            head = p.continuous
            mu = head.mu(x)
            sampled = head.squash(mu + torch.randn_like(mu) * torch.exp(head.log_sigma_of(x, mu)))
            out += [sampled, self.continuous_action_output_shape * 1, head.head(mu)]
        if p.discrete is not None:
            probs = p.discrete.probs(x, masks)
            out += [torch.cat([torch.multinomial(q, 1) for q in probs], dim=1), self.discrete_action_output_shape * 1,
                    torch.cat([torch.argmax(q, dim=1, keepdim=True) for q in probs], dim=1)]
        if memory_out is not None:
            out.append(memory_out)
        return tuple(out)


class ExportOnnxTask(Task):
    mode: ExportOnnxMode

    def run(self, ctx: Context) -> Result:
        w = ctx.weights
        feeds = feeds_with_masks(ctx, self.mode.masks)
        sequence = is_sequence(feeds)
        # --- export, check the graph and its interface
        out, found = self.export(ctx)
        result = Result(files=[str(out) if self.mode.path else out.name])  # an artifact wherever it was written
        self.judge_interface(found, w, result)
        # --- run it (a sequence step by step, each graph carrying its own memory), compare with the fp32 torch policy
        graph = lambda path: build(ctx, "onnxruntime", device="cpu", dtype="fp32", batch_size=0, threads=0, onnx=path)  # noqa: E731
        exported = run_feeds(graph(out), feeds)
        ref = reference(ctx, "fp32")
        margins = over_steps(ref.distributions, feeds, w.memory).get("masked_logits") if w.branches else None
        rows, constants = judge_outputs(result, "exported graph vs torch fp32: ", w, exported, run_feeds(ref, feeds),
                                        "torch", self.mode.atol, 1e-3, margins, exported, expected_constants(w),
                                        sequence, origin="exported")
        self._sampled(exported, feeds, w, result)
        # --- ... and with the source .onnx, when there is one; judge
        source = ctx.model.onnx_path
        headline = (f"exported {out.name} (opset {self.mode.opset}, {w.describe_shape()}): vs torch "
                    + _brief(result.metrics, "torch"))
        headline += (self.versus_source(ctx, exported, run_feeds(graph(source), feeds), sequence, margins, rows, result)
                     if source is not None else "; no source .onnx to compare with")
        if ctx.dtype != ONNX_DTYPE or ctx.device != "cpu":
            headline += f" (the graph is float32 from the CPU; device={ctx.device} dtype={ctx.dtype} do not apply)"
        result.details.update({"exported": str(out), "source_onnx": str(source) if source else None, "interface": found,
                               "constants": constants, "sequence": sequence, "headline": headline})
        result.arrays.update({f"exported_{o.stem}": np.asarray(exported[o.name]) for o in DECLARED if o.name in exported})
        result.tables["outputs"] = rows
        result.summary = [headline, f"interface: inputs {found['inputs']}, outputs {found['outputs']}",
                          f"onnx.checker: clean; written to {out}"]
        first_divergence(ctx, out, feeds, result)  # the export's own intermediates: where it leaves the policy, if it does
        return result

    def export(self, ctx: Context) -> tuple[Path, dict]:
        """The policy exported as ML-Agents does (TorchScript exporter, opset `mode.opset`), its outputs named as ML-Agents
        names them, checked by onnx.checker and written in one step: (where it went, the interface it has)."""
        import onnx

        w, opset = ctx.weights, self.mode.opset
        own = (ctx.model.path, ctx.model.onnx_path, ctx.model_spec.checkpoint, ctx.model_spec.onnx, ctx.model_spec.results_dir,
               *mlagents.model_files(ctx.model.path), *ctx.owned)
        out = (claim_output(self.mode.path, self.mode.overwrite, own, "mode.path") if self.mode.path
               else ctx.workdir / f"{Path(ctx.model.path).stem.split('-')[0]}.onnx")
        tmpdir = tempfile.TemporaryDirectory(prefix="huggy_exp-export-")
        traced = Path(tmpdir.name) / out.name  # the exporter writes here; `out` gets the checked graph in one step
        io = interface(w)
        input_names, output_names = [n for n, _, _ in io["inputs"]], [n for n, _, _ in io["outputs"]]
        dummy = tuple(torch.ones(1, *dims[1:]) if name == "action_masks" else torch.zeros(1, *dims[1:]) for name, _, dims in io["inputs"])
        dynamic = {name: {0: "batch"} for name, _, dims in io["inputs"] + io["outputs"] if dims[:1] == ["batch"]}
        try:
            with warnings.catch_warnings():
                # deliberate: the TorchScript exporter is the one ML-Agents uses and the only one that writes opset 9
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)  # nn.LSTM's own shape checks, constant for the trace
                # the exporter's LSTM advice is met: h0/c0 come from the recurrent_in input
                warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size other than 1", UserWarning)
                torch.onnx.export(MLAgentsExport(w).eval(), dummy, str(traced), input_names=input_names, output_names=output_names,
                                  dynamic_axes=dynamic, opset_version=opset, dynamo=False)
        except Exception as exc:
            raise UserError(f"torch.onnx.export failed at opset {opset}: {str(exc).splitlines()[0]}") from None
        model = onnx.load(str(traced), format="protobuf")
        tmpdir.cleanup()
        # the exporter folds the constant outputs into initializers with generated names: Identity nodes route them to
        # ML-Agents' names, as ML-Agents' own graphs do
        for output, name in zip(model.graph.output, output_names):
            if output.name != name:
                model.graph.node.append(onnx.helper.make_node("Identity", [output.name], [name],
                                                              name=f"/{name}/Identity"))
                output.name = name
        onnx.checker.check_model(model, full_check=True)
        atomic_write(out, lambda tmp: onnx.save(model, tmp, format="protobuf"), overwrite=self.mode.overwrite)
        return out, _interface(model)

    def judge_interface(self, found: dict, w: PolicyWeights, result: Result) -> None:
        """The graph's inputs and outputs against ML-Agents' interface for these weights (names and order, element
        types, widths; a symbolic batch on every input and batched output): each problem fails."""
        io, opset, problems = interface(w), self.mode.opset, []
        if found["opset"] != opset:
            problems.append(f"opset {found['opset']} is not {opset}")
        for side in ("inputs", "outputs"):
            want = [name for name, _, _ in io[side]]
            if list(found[side]) != want:
                problems.append(f"{side} {list(found[side])} are not ML-Agents' {want}")
                continue
            for name, kind, dims in io[side]:
                got = found[side][name]
                batched = dims[:1] == ["batch"]
                if found["types"].get(name) != kind or len(got) != len(dims) or got[batched:] != dims[batched:] or (
                        batched and not isinstance(got[0], str)):
                    problems.append(f"{name} {found['types'].get(name)} {got} is not {kind} {dims}"
                                    + (" with a dynamic batch" if batched else ""))
        for p in problems:
            result.fail(p)
        result.tags.update({"onnx_inputs": ",".join(found["inputs"]), "onnx_outputs": ",".join(found["outputs"])})
        result.metrics.update({"interface/inputs": float(len(found["inputs"])), "interface/outputs": float(len(found["outputs"])),
                               "interface/opset": float(found["opset"]), "interface/problems": float(len(problems))})

    def versus_source(self, ctx: Context, exported: dict, theirs: dict, sequence: bool, margins, rows: list[dict],
                      result: Result) -> str:
        """The exported graph against the source .onnx: every output (the constants exactly) and whether the two are
        bit-identical; adds the table rows, returns the headline phrase."""
        w, source = ctx.weights, ctx.model.onnx_path
        consts = {k: np.asarray(theirs[k][0] if sequence else theirs[k]) for k in expected_constants(w) if k in theirs}
        rows_src, _ = judge_outputs(result, "exported vs source .onnx: ", w, exported, theirs, "source", self.mode.atol,
                                    1e-3, margins, exported, consts, sequence, "source", "exported")
        compared = [k for k in (*(o.name for o in DECLARED), *expected_constants(w)) if k in theirs and k in exported]
        identical = bool(compared) and all(np.array_equal(exported[k], theirs[k]) for k in compared)
        result.metrics["graph/vs_source/bit_identical"] = float(identical)
        rows += [{**r, "output": f"{r['output']} (vs source)"} for r in rows_src]
        return f", vs source {source.name} {_brief(result.metrics, 'source')} ({'bit-identical' if identical else 'not bit-identical'})"

    def _sampled(self, exported: dict, feeds: dict, w: PolicyWeights, result: Result) -> None:
        """The exported sampled outputs: present with the deterministic ones' shapes and dtypes; no masked action drawn."""
        failures = []
        for sampled, det in ((o.sampled, o.name) for o in DECLARED if o.sampled):
            if det in exported and (sampled not in exported or np.shape(exported[sampled]) != np.shape(exported[det])
                                    or np.asarray(exported[sampled]).dtype != np.asarray(exported[det]).dtype):
                failures.append(f"{sampled} is not shaped and typed like {det}")
            elif sampled in exported and (bad := first_nonfinite(exported[sampled])) is not None:
                failures.append(f"{sampled}: {bad[0]} NaN/inf values (first at {list(bad[1])})")
        if w.branches and DISCRETE_SAMPLED in exported and "action_masks" in feeds:
            picks = np.asarray(exported[DISCRETE_SAMPLED])
            starts = np.cumsum([0, *w.branch_sizes])[:-1]
            inside = (picks >= 0) & (picks < np.asarray(w.branch_sizes))
            chosen = np.take_along_axis(feeds["action_masks"], np.where(inside, picks, 0) + starts, axis=-1)
            live = allowed_branches(feeds["action_masks"], w.branch_sizes)  # a fully masked branch draws uniformly
            masked = int(np.sum(((chosen == 0) & live) | ~inside))
            result.metrics["sampled_discrete/masked_draws"] = float(masked)
            if masked:
                failures.append(f"{DISCRETE_SAMPLED}: {masked} draws of a masked action or outside their branch")
        for reason in failures:
            result.fail(f"exported graph: {reason}")


def _brief(metrics: dict, reference: str) -> str:
    """The exported graph's figures against `reference` (torch, source), in words."""
    get = lambda stem, k: metrics.get(f"{stem}/vs_{reference}/{k}")  # noqa: E731
    parts = [f"max_abs {get('actions', 'max_abs'):.2e}"] if get("actions", "max_abs") is not None else []
    if get("discrete_actions", "agreement") is not None:
        parts.append(f"discrete agreement {get('discrete_actions', 'agreement'):.2%}")
    if get("memories", "max_abs") is not None:
        parts.append(f"recurrent_out max_abs {get('memories', 'max_abs'):.2e}")
    return ", ".join(parts)


def _interface(model) -> dict:
    from onnx import TensorProto

    kind = {TensorProto.FLOAT: "float", TensorProto.INT64: "int64"}
    return {"opset": max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "inputs": dict(map(value_info, model.graph.input)), "outputs": dict(map(value_info, model.graph.output)),
            "types": {v.name: kind.get(v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type))
                      for v in (*model.graph.input, *model.graph.output)}}
