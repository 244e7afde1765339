"""Lookups over an ONNX graph (producers, consumers, constants, attributes) shared by the readers of its parts."""

from __future__ import annotations

import numpy as np

from huggy_exp.errors import UserError
from huggy_exp.mlagents.weights import check_finite

PASSTHROUGH = ("Cast", "Identity")
RESHAPES = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", *PASSTHROUGH)


def value_info(v) -> tuple[str, list]:
    """(name, dims) of a graph input/output; a dim is an int, its symbolic name, or '?'."""
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in v.type.tensor_type.shape.dim]
    return v.name, dims


class Graph:
    """Producer/consumer/constant lookups over an ONNX graph."""

    def __init__(self, model, origin: str):
        from onnx import numpy_helper

        self.origin = origin
        self.nodes = list(model.graph.node)
        tensors = [(i.name, i) for i in model.graph.initializer]
        tensors += [(n.output[0], a.t) for n in self.nodes if n.op_type == "Constant" and n.output
                    for a in n.attribute if a.name == "value"]
        self.const = {}
        for name, tensor in tensors:
            try:
                self.const[name] = numpy_helper.to_array(tensor)
            except Exception as exc:
                raise self.fail(f"constant {name!r} cannot be read ({type(exc).__name__})") from None
        self.producer = {out: n for n in self.nodes for out in n.output}
        self.inputs = [i.name for i in model.graph.input if i.name not in self.const]
        self.dims = dict(value_info(i) for i in model.graph.input)  # each graph input's [dim, ...]

    def consumers(self, name: str) -> list:
        return [n for n in self.nodes if name in n.input]

    def only(self, name: str, op: str | None = None):
        users = [n for n in self.consumers(name) if op is None or n.op_type == op]
        return users[0] if len(users) == 1 else None

    def const_input(self, node) -> np.ndarray | None:
        name = next((n for n in node.input if n in self.const), None)
        return None if name is None else self.weight(name)

    def weight(self, name: str) -> np.ndarray:
        """A constant as float32: numeric and finite, or an error naming it."""
        value = self.const[name]
        if value.dtype.kind not in "biuf":
            raise self.fail(f"constant {name!r} is {value.dtype}, not numbers")
        check_finite(value, f"initializer {name}", self.origin)
        return value.astype(np.float32)

    def attr(self, node, name: str, default=None):
        from onnx import helper

        return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)

    def fail(self, what: str) -> UserError:
        return UserError(f"{self.origin}: not an ML-Agents policy graph: {what}")


def follow(g: Graph, name: str, ops: tuple[str, ...] = PASSTHROUGH) -> str:
    """Walk single-consumer ops of the given kinds from `name`; the name of the last tensor."""
    seen = set()
    while (node := g.only(name)) is not None and node.op_type in ops and node.output:
        if id(node) in seen:
            raise g.fail("the graph has a cycle")
        seen.add(id(node))
        name = node.output[0]
    return name


def source(g: Graph, name: str):
    """The node producing `name`, looking through passthrough ops."""
    seen = set()
    node = g.producer.get(name)
    while node is not None and node.op_type in PASSTHROUGH and node.input and id(node) not in seen:
        seen.add(id(node))
        node = g.producer.get(node.input[0])
    return node


def linear(g: Graph, node) -> tuple[np.ndarray, np.ndarray]:
    names = list(node.input[1:3])
    if len(names) < 2 or not all(n in g.const for n in names):
        raise g.fail(f"Gemm {node.name or node.output[0]} has no constant weight and bias")
    weight, bias = (g.weight(n) for n in names)
    if weight.ndim != 2:
        raise g.fail(f"Gemm {node.name or node.output[0]} weight is {list(weight.shape)}, not a matrix")
    return (weight if g.attr(node, "transB", 0) else weight.T), bias.reshape(-1)


def slice_start(g: Graph, node) -> int | None:
    """A Slice's first start (attribute up to opset 9, constant input after), or None."""
    if node is None or node.op_type != "Slice":
        return None
    starts = g.attr(node, "starts")
    if starts is None and len(node.input) > 1 and node.input[1] in g.const:
        starts = g.const[node.input[1]].reshape(-1).tolist()
    return int(starts[0]) if starts else None


def expose(model, parts: dict[str, list[str]], typed: bool) -> None:
    """Each part's tensors (several side by side on axis 1) as a graph output of its name, `typed` float [batch, ?]."""
    from onnx import TensorProto, helper

    for name, tensors in parts.items():
        joined = {"op_type": "Concat", "axis": 1} if len(tensors) > 1 else {"op_type": "Identity"}
        model.graph.node.append(helper.make_node(inputs=tensors, outputs=[name], **joined))
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", None]) if typed
                                  else helper.make_empty_tensor_value_info(name))
