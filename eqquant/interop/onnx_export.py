"""fp32 programs to ONNX (opset 17), so ONNX Runtime can run the same model and weights.

    model = to_onnx(bind_params(mod, params))     # an onnx.ModelProto
    onnx.save(model, "model.onnx")

Every parameter without a value becomes a graph input; constants become initializers. The ops
are those of the zoo models and of eqquant's fused programs; another op raises a located
error naming it.
"""
from __future__ import annotations

import numpy as np

from ..errors import EqquantError
from ..ir.nodes import (Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var,
                        post_order)
from ..ir.typecheck import infer_types
from ..passes.inline import inline_calls

OPSET = 17


def to_onnx(mod: Module, name: str = "eqquant"):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    flat = inline_calls(mod)
    types = infer_types(flat)
    names: dict[int, str] = {}
    nodes, inits, inputs = [], [], []
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}_{counter[0]}"

    def const(arr: np.ndarray, prefix: str = "c") -> str:
        n = fresh(prefix)
        inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def emit(op_type: str, ins: list[str], **attrs) -> str:
        out = fresh(op_type.lower())
        nodes.append(helper.make_node(op_type, ins, [out], **attrs))
        return out

    def act(x: str, attrs) -> str:
        a = attrs.get("activation", "none")
        if a == "relu":
            return emit("Relu", [x])
        if a == "clip":
            return emit("Clip", [x, const(np.float32(attrs["a_min"])),
                                 const(np.float32(attrs["a_max"]))])
        return x

    for node in post_order(flat.main.body):
        if isinstance(node, Var):
            t = node.type
            inputs.append(helper.make_tensor_value_info(node.name, TensorProto.FLOAT
                                                        if t.dtype == "float32" else
                                                        helper.np_dtype_to_tensor_dtype(
                                                            np.dtype(t.dtype)), t.shape))
            names[id(node)] = node.name
            continue
        if isinstance(node, Constant):
            if node.data is None:
                raise EqquantError(f"meta[relay.Constant][{node.index}] has no value",
                                   node.loc)
            names[id(node)] = const(node.data, f"meta{node.index}")
            continue
        if isinstance(node, Scalar):
            names[id(node)] = const(node.data)
            continue
        if isinstance(node, Tuple):
            names[id(node)] = [names[id(f)] for f in node.fields]  # type: ignore[assignment]
            continue
        if isinstance(node, TupleGetItem):
            inner = names[id(node.tuple)]
            names[id(node)] = inner[node.index] if isinstance(inner, list) else inner
            continue
        if not isinstance(node, Call) or isinstance(node.op, Expr):
            raise EqquantError(f"ONNX export: cannot export a {type(node).__name__}",
                               getattr(node, "loc", None))
        names[id(node)] = _export_call(node, [names[id(a)] for a in node.args], types, emit,
                                       const, act)
    out_name = names[id(flat.main.body)]
    out_t = types[id(flat.main.body)]
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info(
        out_name, TensorProto.FLOAT, out_t.shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="eqquant")
    onnx.checker.check_model(model)
    return model


def _export_call(node: Call, ins, types, emit, const, act):
    op, a = node.op.name, node.attrs
    if op in ("nn.conv2d", "fused.conv2d"):
        w_t = types[id(node.args[1])]
        conv_attrs = dict(strides=list(a["strides"]), pads=list(a["padding"]),
                          dilations=list(a["dilation"]), group=a["groups"],
                          kernel_shape=list(w_t.shape[2:]))
        if op == "nn.conv2d":
            return emit("Conv", ins, **conv_attrs)
        b_t = types[id(node.args[2])]
        if isinstance(node.args[2], Constant) and b_t.size == w_t.shape[0]:
            bias = const(np.asarray(node.args[2].data).reshape(-1))
            return act(emit("Conv", [ins[0], ins[1], bias], **conv_attrs), a)
        return act(emit("Add", [emit("Conv", ins[:2], **conv_attrs), ins[2]]), a)
    if op == "nn.batch_norm":
        return emit("BatchNormalization", ins, epsilon=float(a["epsilon"]))
    if op in ("nn.dense", "fused.dense"):
        y = emit("Gemm", ins[:2], transB=1) if op == "nn.dense" else \
            emit("Gemm", ins, transB=1)
        return act(y, a) if op == "fused.dense" else y
    simple = {"nn.relu": "Relu", "add": "Add", "subtract": "Sub", "multiply": "Mul",
              "divide": "Div", "nn.global_avg_pool2d": "GlobalAveragePool",
              "sqrt": "Sqrt", "negative": "Neg", "abs": "Abs"}
    if op in simple:
        return emit(simple[op], ins)
    if op == "clip":
        return emit("Clip", [ins[0], const(np.float32(a["a_min"])),
                             const(np.float32(a["a_max"]))])
    if op in ("nn.max_pool2d", "nn.avg_pool2d"):
        kw = dict(kernel_shape=list(a["pool_size"]), strides=list(a["strides"]),
                  pads=list(a["padding"]), ceil_mode=int(a["ceil_mode"]))
        if op == "nn.max_pool2d":
            return emit("MaxPool", ins, dilations=list(a["dilation"]), **kw)
        return emit("AveragePool", ins, count_include_pad=int(a["count_include_pad"]), **kw)
    if op == "nn.batch_flatten":
        return emit("Flatten", ins, axis=1)
    if op in ("reshape", "expand_dims", "squeeze"):
        shape = types[id(node)].shape
        return emit("Reshape", [ins[0], const(np.asarray(shape, np.int64))])
    if op == "nn.bias_add":
        rank = len(types[id(node.args[0])].shape)
        axis = a["axis"] % rank
        shape = [1] * rank
        shape[axis] = -1
        return emit("Add", [ins[0], emit("Reshape", [ins[1], const(np.asarray(shape,
                                                                             np.int64))])])
    if op == "nn.softmax":
        return emit("Softmax", ins, axis=a["axis"])
    if op in ("nn.dropout", "annotation.stop_fusion", "annotation.cast_hint"):
        return ins[0]
    raise EqquantError(f"ONNX export: no mapping for {op}", node.loc)
