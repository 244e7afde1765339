"""Write the graph ML-Agents' exporter writes (opset 9, same names), directly with onnx.helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from huggy_exp.mlagents.weights import ACTION_CLAMP, BODY_PREFIX, LOG_SIGMA, LOG_SIGMA_RANGE, MU_PREFIX, NORMALIZER_CLAMP, NORMALIZER_PREFIXES, ONNX_INPUT, PolicyWeights, atomic_write


def write_onnx(w: PolicyWeights, path: Path) -> None:
    """Build the graph ML-Agents' exporter writes (opset 9, same names), directly with onnx.helper."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits, nodes = [], []
    counter = iter(range(10_000))

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def node(op: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"/{op}_{next(counter)}_output_0"
        nodes.append(helper.make_node(op, inputs, [out], name=f"/{op}_{next(counter)}", **attrs))
        return out

    def scalar(value: float) -> str:
        out = f"/Constant_{next(counter)}_output_0"
        nodes.append(helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.array(value, np.float32))))
        return out

    const("version_number.1", [w.version_number])
    const("continuous_act_size_vector", [float(w.act_dim)])
    const("memory_size_vector", [w.memory_size])
    x = ONNX_INPUT
    if w.normalizer is not None:
        prefix = NORMALIZER_PREFIXES[0]
        x = node("Sub", [x, const(prefix + "running_mean", w.normalizer.running_mean)])
        x = node("Div", [x, const("normalizer_folded_std", w.normalizer.std)])
        x = node("Clip", [x], min=-NORMALIZER_CLAMP, max=NORMALIZER_CLAMP)
    x = node("Concat", [x], axis=1)
    for i, (weight, bias) in enumerate(w.layers):
        x = node("Gemm", [x, const(f"{BODY_PREFIX}{2 * i}.weight", weight), const(f"{BODY_PREFIX}{2 * i}.bias", bias)],
                 alpha=1.0, beta=1.0, transB=1)
        x = node("Mul", [x, node("Sigmoid", [x])])
    mu = node("Gemm", [x, const(MU_PREFIX + "weight", w.mu[0]), const(MU_PREFIX + "bias", w.mu[1])],
              alpha=1.0, beta=1.0, transB=1)
    if w.conditional_sigma:
        s = node("Gemm", [x, const(LOG_SIGMA + ".weight", w.log_sigma[0]), const(LOG_SIGMA + ".bias", w.log_sigma[1])],
                 alpha=1.0, beta=1.0, transB=1)
        log_sigma = node("Clip", [s], min=LOG_SIGMA_RANGE[0], max=LOG_SIGMA_RANGE[1])
    else:
        log_sigma = node("Add", [node("Mul", [mu, scalar(0.0)]), const(LOG_SIGMA, w.log_sigma)])
    std = node("Exp", [log_sigma])
    noisy = node("Add", [mu, node("Mul", [node("RandomNormalLike", [mu], dtype=TensorProto.FLOAT), std])])
    if w.tanh_squash:
        node("Tanh", [noisy], "continuous_actions")
        node("Identity", [mu], "deterministic_continuous_actions")
    else:
        node("Div", [node("Clip", [noisy], min=-ACTION_CLAMP, max=ACTION_CLAMP), scalar(ACTION_CLAMP)], "continuous_actions")
        node("Div", [node("Clip", [mu], min=-ACTION_CLAMP, max=ACTION_CLAMP), scalar(ACTION_CLAMP)],
             "deterministic_continuous_actions")
    node("Identity", ["version_number.1"], "version_number")
    node("Identity", ["memory_size_vector"], "memory_size")
    node("Identity", ["continuous_act_size_vector"], "continuous_action_output_shape")

    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "huggy_exp policy",
        [helper.make_tensor_value_info(ONNX_INPUT, f, ["batch", w.obs_dim])],
        [
            helper.make_tensor_value_info("version_number", f, [1]),
            helper.make_tensor_value_info("memory_size", f, [1]),
            helper.make_tensor_value_info("continuous_actions", f, ["batch", w.act_dim]),
            helper.make_tensor_value_info("continuous_action_output_shape", f, [1]),
            helper.make_tensor_value_info("deterministic_continuous_actions", f, ["batch", w.act_dim]),
        ],
        initializer=inits,
    )
    model = helper.make_model(graph, producer_name="huggy_exp", opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 4
    onnx.checker.check_model(model)
    atomic_write(path, lambda tmp: onnx.save(model, tmp))
