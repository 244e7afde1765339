"""ML-Agents' action heads as file formats: each head owns its ONNX pattern, read and written, and its outputs.

ContinuousHead: a Gaussian on mu: PPO (log_sigma a constant broadcast as mu * 0 + log_sigma, actions clamp(., -3, 3) / 3)
or SAC (log_sigma = clip(Linear(x), -20, 2), samples tanh-squashed, raw mu as the deterministic output).
DiscreteHead: one Linear per branch, logits masked by a slice of `action_masks`, Softmax; ArgMax and Multinomial.
A hybrid policy has both; their outputs follow ML-Agents' order (continuous, then discrete).
"""

from __future__ import annotations

import numpy as np

from huggy_exp.mlagents.onnx_graph import Graph, expose, follow, linear, slice_start, source
from huggy_exp.mlagents.weights import (
    ACTION_CLAMP, ACTION_MASKS, BRANCH_PREFIX, CONTINUOUS_OUTPUTS, DISCRETE_OUTPUTS, LOG_SIGMA, LOG_SIGMA_RANGE, MASK_PENALTY,
    MU_PREFIX, PolicyWeights,
)


class ContinuousHead:
    outputs = CONTINUOUS_OUTPUTS  # actions, their shape (a copy of the size vector), deterministic actions
    size_vector, dtype = "continuous_act_size_vector", "float"

    @staticmethod
    def sizes(w: PolicyWeights) -> tuple[list, int] | None:
        """(the size vector, the actions' width); None when the policy has no such head."""
        return ([float(w.act_dim)], w.act_dim) if w.mu is not None else None

    @staticmethod
    def is_log_sigma(g: Graph, gemm) -> bool:
        """SAC's log_sigma Gemm: it feeds Clip -> Exp."""
        return any(c.op_type == "Clip" and c.output and any(e.op_type == "Exp" for e in g.consumers(c.output[0]))
                   for c in g.consumers(gemm.output[0]))

    @staticmethod
    def read_onnx(g: Graph, gemm) -> dict:
        """mu from its Gemm; log_sigma from what feeds Exp (an added constant, or a clipped Gemm); tanh unless the
        deterministic output is clamp / 3 (a Div)."""
        exp = next((n for n in g.nodes if n.op_type == "Exp"), None)
        if exp is None:
            raise g.fail("no Exp node computing the action std")
        src = g.producer.get(exp.input[0]) if exp.input else None
        if src is not None and src.op_type == "Clip":
            sigma = g.producer.get(src.input[0]) if src.input else None
            if sigma is None or sigma.op_type != "Gemm":
                raise g.fail("clipped log_sigma is not produced by a Gemm")
            log_sigma: np.ndarray | tuple = linear(g, sigma)
        elif src is not None and src.op_type == "Add" and g.const_input(src) is not None:
            log_sigma = g.const_input(src).reshape(1, -1)
        else:
            raise g.fail("log_sigma is neither an added constant nor a clipped Gemm")
        det = g.producer.get("deterministic_continuous_actions")
        return {"mu": linear(g, gemm), "log_sigma": log_sigma, "tanh_squash": not (det is not None and det.op_type == "Div")}

    @staticmethod
    def write_onnx(b, w: PolicyWeights, x: str) -> None:
        """mu, log_sigma, RandomNormalLike samples, clamp / 3 (PPO) or tanh and raw mu (SAC)."""
        from onnx import TensorProto

        mu = b.gemm(x, MU_PREFIX, *w.mu)
        if w.conditional_sigma:
            log_sigma = b.node("Clip", [b.gemm(x, LOG_SIGMA + ".", *w.log_sigma)], min=LOG_SIGMA_RANGE[0], max=LOG_SIGMA_RANGE[1])
        else:
            log_sigma = b.node("Add", [b.node("Mul", [mu, b.scalar(0.0)]), b.const(LOG_SIGMA, w.log_sigma)])
        std = b.node("Exp", [log_sigma])
        noisy = b.node("Add", [mu, b.node("Mul", [b.node("RandomNormalLike", [mu], dtype=TensorProto.FLOAT), std])])
        if w.tanh_squash:
            b.node("Tanh", [noisy], "continuous_actions")
            b.node("Identity", [mu], "deterministic_continuous_actions")
        else:
            for raw, out in ((noisy, "continuous_actions"), (mu, "deterministic_continuous_actions")):
                b.node("Div", [b.node("Clip", [raw], min=-ACTION_CLAMP, max=ACTION_CLAMP), b.scalar(ACTION_CLAMP)], out)


class DiscreteHead:
    outputs = DISCRETE_OUTPUTS
    size_vector, dtype = "discrete_act_size_vector", "int64"

    @staticmethod
    def sizes(w: PolicyWeights) -> tuple[list, int] | None:
        return ([[float(s) for s in w.branch_sizes]], len(w.branches)) if w.branches else None

    @staticmethod
    def mask_start(g: Graph, gemm, masks: str | None) -> int | None:
        """Where in `action_masks` a branch Gemm's mask starts, if its logits are masked (Mul with a Slice of the masks)."""
        if masks is None or not gemm.output:
            return None
        for mul in (n for n in g.consumers(gemm.output[0]) if n.op_type == "Mul"):
            other = next((i for i in mul.input if i != gemm.output[0]), None)
            sl = source(g, other) if other else None
            if (sl is not None and sl.op_type == "Slice" and sl.input and follow(g, masks) in (sl.input[0], masks)
                    and (start := slice_start(g, sl)) is not None):
                return start
        return None

    @staticmethod
    def read_onnx(g: Graph, branches: list[tuple[int, object]]) -> dict:
        """The branch Linears (in mask order); each must read its own slice of `action_masks`."""
        weights = tuple(linear(g, n) for _, n in branches)
        starts = [s for s, _ in branches]
        if starts != list(np.cumsum([0, *(w.shape[0] for w, _ in weights)])[:-1]):
            raise g.fail(f"discrete branches read action_masks from {starts}, not from the running sum of their sizes")
        return {"branches": weights}

    @staticmethod
    def write_onnx(b, w: PolicyWeights, x: str) -> None:
        """Per branch: mask slice, logits * mask - 1e8 * (1 - mask), Softmax; Multinomial(Log(p)) and ArgMax(p), concatenated."""
        from onnx import TensorProto

        sampled, deterministic, start = [], [], 0
        for i, (weight, bias) in enumerate(w.branches):
            mask = b.node("Slice", [ACTION_MASKS], axes=[1], starts=[start], ends=[start + weight.shape[0]])
            logits = b.gemm(x, f"{BRANCH_PREFIX}{i}.", weight, bias)
            block = b.node("Add", [b.node("Mul", [mask, b.scalar(-1.0)]), b.scalar(1.0)])
            masked = b.node("Sub", [b.node("Mul", [logits, mask]), b.node("Mul", [block, b.scalar(MASK_PENALTY)])])
            probs = b.node("Softmax", [masked], axis=1)
            sampled.append(b.node("Multinomial", [b.node("Log", [probs])], dtype=TensorProto.INT64, sample_size=1))
            deterministic.append(b.node("ArgMax", [probs], axis=1, keepdims=1))
            start += weight.shape[0]
        b.node("Concat", sampled, "discrete_actions", axis=1)
        b.node("Concat", deterministic, "deterministic_discrete_actions", axis=1)


HEADS = (ContinuousHead, DiscreteHead)  # ML-Agents' output order


def with_distributions(model):
    """The graph (an onnx ModelProto, changed in place) with what its actions come from as outputs too, as
    Policy.distributions names them: `mu` (what the deterministic action clamps or passes on), `log_sigma` (Exp's
    input), `masked_logits` (every branch's Softmax input): a runner of it is judged in KL, |Δμ|/σ like a torch one."""
    g = Graph(model, "graph")
    found, t = {}, "deterministic_continuous_actions"
    while t in g.producer and g.producer[t].op_type in ("Div", "Clip", "Identity"):
        t = g.producer[t].input[0]
    exps = [n.input[0] for n in g.nodes if n.op_type == "Exp"]
    if t != "deterministic_continuous_actions" and exps:
        found.update(mu=[t], log_sigma=exps[:1])
    found["masked_logits"] = [n.input[0] for n in g.nodes if n.op_type == "Softmax"]
    expose(model, {name: tensors for name, tensors in found.items() if tensors}, typed=True)
    return model


def read_heads(g: Graph, cursor: str, masks: str | None) -> tuple[dict, dict[str, list[str]]]:
    """The heads on the features: Gemms whose logits are masked are discrete branches, a Gemm feeding Clip -> Exp is SAC's
    log_sigma, the one left is mu. PolicyWeights fields: mu, log_sigma, tanh_squash, branches; and the tensors of
    Policy.trace's `mu` and `logits` (the branches' Gemms in mask order)."""
    gemms = [n for n in g.consumers(cursor) if n.op_type == "Gemm" and n.output]
    branches = sorted(((start, n) for n in gemms if (start := DiscreteHead.mask_start(g, n, masks)) is not None),
                      key=lambda b: b[0])
    claimed = {id(n) for _, n in branches}
    mus = [n for n in gemms if id(n) not in claimed and not ContinuousHead.is_log_sigma(g, n)]
    if len(mus) > 1:
        raise g.fail(f"{len(mus)} Gemm heads on the last hidden layer that are neither masked branches nor log_sigma")
    if not mus and not branches:
        raise g.fail("no chain of Gemm -> Sigmoid -> Mul layers followed by a mu Gemm or discrete branch Gemms")
    out, parts = {"mu": None, "log_sigma": None, "tanh_squash": False, "branches": ()}, {}
    if mus:
        out.update(ContinuousHead.read_onnx(g, mus[0]))
        parts["mu"] = [mus[0].output[0]]
    if branches:
        out.update(DiscreteHead.read_onnx(g, branches))
        parts["logits"] = [n.output[0] for _, n in branches]
    return out, parts
