"""Programs to ONNX (opset 17), so ONNX Runtime can run what eqquant produced.

    model = to_onnx(bind_params(mod, params))     # an onnx.ModelProto
    save_onnx(bound, "model.onnx")                # checked, written atomically

fp32 ops map one to one (``FLOAT_OPS`` and the few special cases below). An int8 program (QNN
ops, as ``eqquant quantize`` extracts it) is written in ONNX's QDQ form by
:mod:`eqquant.interop.onnx_qdq`: QuantizeLinear / DequantizeLinear around float ops, uint8
activations and int8 weights, which ONNX Runtime fuses back into its integer kernels. Every
parameter without a value becomes a graph input; constants become initializers. An op with no
mapping raises a located error naming it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EqquantError
from ..core.nodes import (Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var,
                          post_order)
from ..ir.typecheck import infer_types
from ..passes.inline import inline_calls

OPSET = 17

# IR op -> ONNX op, for ops whose inputs and semantics are the same (and that have no ONNX
# form in the registry yet: see OpDef.onnx)
FLOAT_OPS = {"nn.global_avg_pool2d": "GlobalAveragePool"}
PASS_THROUGH = ("nn.dropout", "annotation.stop_fusion", "annotation.cast_hint")


class Exporter:
    """Walks a module in post order and emits ONNX nodes; ``names`` maps each IR value (by
    id) to its ONNX tensor name (a list for a tuple)."""

    def __init__(self, mod: Module, activation_dtype: str = "uint8"):
        # a calibration mark is fake quantization, not the identity: written as the
        # quantize/dequantize pair it means
        from ..quant.flow import expand_calibration
        self.flat = inline_calls(expand_calibration(inline_calls(mod)))
        self.types = infer_types(self.flat)
        self.names: dict[int, object] = {}
        self.nodes: list = []
        self.inits: list = []
        self.inputs: list = []
        self.counter = 0
        self.activation_dtype = activation_dtype
        self.quantized = False
        from . import onnx_qdq
        self.qdq = onnx_qdq.QDQ(self)

    # -- emitting ----------------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def const(self, arr, prefix: str = "c") -> str:
        from onnx import numpy_helper
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def emit(self, op_type: str, ins: list[str], **attrs) -> str:
        from onnx import helper
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, ins, [out], **attrs))
        return out

    def act(self, x: str, attrs) -> str:
        a = attrs.get("activation", "none")
        if a == "relu":
            return self.emit("Relu", [x])
        if a == "clip":
            return self.emit("Clip", [x, self.const(np.float32(attrs["a_min"])),
                                      self.const(np.float32(attrs["a_max"]))])
        return x

    def type(self, e: Expr):
        return self.types[id(e)]

    def value(self, e: Expr) -> np.ndarray | None:
        """The constant value of a scalar or constant argument (None if computed)."""
        return np.asarray(e.data) if isinstance(e, (Scalar, Constant)) else None

    # -- the walk ------------------------------------------------------------------------------

    def run(self, name: str):
        from onnx import TensorProto, helper
        for node in post_order(self.flat.main.body):
            if isinstance(node, Var):
                t = node.type
                self.inputs.append(helper.make_tensor_value_info(
                    node.name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)), t.shape))
                self.names[id(node)] = node.name
            elif isinstance(node, Constant):
                if node.data is None:
                    raise EqquantError(f"meta[relay.Constant][{node.index}] has no value",
                                       node.loc)
            elif isinstance(node, Scalar):
                pass            # initializers are made when an ONNX node reads them
            elif isinstance(node, Tuple):
                self.names[id(node)] = [self.name_of(f) for f in node.fields]
            elif isinstance(node, TupleGetItem):
                inner = self.name_of(node.tuple)
                self.names[id(node)] = inner[node.index] if isinstance(inner, list) else inner
            elif isinstance(node, Call) and not isinstance(node.op, Expr):
                out = self.qdq.call(node) if self.qdq.handles(node) else self.call(node)
                self.names[id(node)] = out
            else:
                raise EqquantError(f"ONNX export: cannot export a {type(node).__name__}",
                                   getattr(node, "loc", None))
        body = self.flat.main.body
        outs = body.fields if isinstance(body, Tuple) else (body,)
        outputs = []
        for o in outs:
            t = self.type(o)
            if t.dtype != "float32":
                raise EqquantError(f"ONNX export: the program's output is {t.dtype}; "
                                   "exported programs return float32 (dequantize it)")
            outputs.append(helper.make_tensor_value_info(self.name_of(o),
                                                         TensorProto.FLOAT, t.shape))
        graph = helper.make_graph(self.nodes, name, self.inputs, outputs,
                                  initializer=self.inits)
        opsets = [helper.make_opsetid("", OPSET)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="eqquant")
        return model

    def name_of(self, e: Expr):
        """The ONNX name of ``e``'s value; a constant becomes an initializer on first use."""
        if id(e) not in self.names:
            if isinstance(e, Constant):
                self.names[id(e)] = self.const(e.data, f"meta{e.index}")
            elif isinstance(e, Scalar):
                self.names[id(e)] = self.const(np.asarray(e.value, e.dtype))
        return self.names[id(e)]

    def call_on(self, node: Call, x: str) -> str:
        """``node``'s ONNX form applied to the tensor ``x`` (a layout op on 8-bit data)."""
        return self.call(node, [x] + [self.name_of(a) for a in node.args[1:]])

    def call(self, node: Call, ins: list | None = None) -> str:
        op, a = node.op.name, node.attrs
        checked = ins is None
        ins = ins or [self.name_of(x) for x in node.args]
        if checked and op not in PASS_THROUGH and any(
                getattr(self.type(x), "dtype", "float32") != "float32" for x in node.args[:1]):
            raise EqquantError(f"ONNX export: {op} on {self.type(node.args[0]).dtype} values "
                               "has no QDQ form", node.loc)
        if node.op.onnx:   # the op's own ONNX form, from its registry entry
            return node.op.onnx[0].write(self, node, ins)
        if op in ("nn.conv2d", "fused.conv2d"):
            w_t = self.type(node.args[1])
            conv = dict(strides=list(a["strides"]), pads=list(a["padding"]),
                        dilations=list(a["dilation"]), group=a["groups"],
                        kernel_shape=list(w_t.shape[2:]))
            if op == "nn.conv2d":
                return self.emit("Conv", ins, **conv)
            b_t = self.type(node.args[2])
            if isinstance(node.args[2], Constant) and b_t.size == w_t.shape[0]:
                bias = self.const(np.asarray(node.args[2].data).reshape(-1))
                return self.act(self.emit("Conv", [ins[0], ins[1], bias], **conv), a)
            return self.act(self.emit("Add", [self.emit("Conv", ins[:2], **conv), ins[2]]), a)
        if op == "nn.batch_norm":
            return self.emit("BatchNormalization", ins, epsilon=float(a["epsilon"]))
        if op in ("nn.dense", "fused.dense"):
            if op == "nn.dense":
                return self.emit("Gemm", ins[:2], transB=1)
            return self.act(self.emit("Gemm", ins, transB=1), a)
        if op in FLOAT_OPS:
            return self.emit(FLOAT_OPS[op], ins)
        if op in ("nn.max_pool2d", "nn.avg_pool2d"):
            return self.pool(op, ins[0], a)
        if op == "nn.batch_flatten":
            return self.emit("Flatten", ins, axis=1)
        if op in ("reshape", "expand_dims", "squeeze"):
            return self.reshape(ins[0], self.type(node).shape)
        if op == "transpose":
            rank = self.type(node.args[0]).rank
            axes = a["axes"] if a["axes"] is not None else list(range(rank))[::-1]
            return self.emit("Transpose", ins, perm=[x % rank for x in axes])
        if op == "concatenate":
            return self.emit("Concat", list(ins[0]), axis=a["axis"])
        if op == "nn.pad":
            width = [list(p) for p in a["pad_width"]]
            pads = [p[0] for p in width] + [p[1] for p in width]
            return self.emit("Pad", [ins[0], self.const(np.asarray(pads, np.int64)), ins[1]],
                             mode=a["pad_mode"])
        if op == "nn.bias_add":
            rank = self.type(node.args[0]).rank
            shape = [1] * rank
            shape[a["axis"] % rank] = -1
            return self.emit("Add", [ins[0], self.reshape(ins[1], shape)])
        if op == "nn.softmax":
            return self.emit("Softmax", ins, axis=a["axis"])
        if op in PASS_THROUGH:
            return ins[0]
        raise EqquantError(f"ONNX export: no mapping for {op}", node.loc)

    def pool(self, op: str, x: str, a) -> str:
        kw = dict(kernel_shape=list(a["pool_size"]), strides=list(a["strides"]),
                  pads=list(a["padding"]), ceil_mode=int(a["ceil_mode"]))
        if op == "nn.max_pool2d":
            return self.emit("MaxPool", [x], dilations=list(a["dilation"]), **kw)
        return self.emit("AveragePool", [x], count_include_pad=int(a["count_include_pad"]),
                         **kw)

    def reshape(self, x: str, shape) -> str:
        return self.emit("Reshape", [x, self.const(np.asarray(shape, np.int64))])


def to_onnx(mod: Module, name: str = "eqquant", activation_dtype: str = "uint8"):
    """``mod`` (constants bound) as a checked ONNX ModelProto; int8 programs in QDQ form with
    ``activation_dtype`` (uint8, as ONNX Runtime's quantize_static writes, or int8)."""
    import onnx
    model = Exporter(mod, activation_dtype).run(name)
    onnx.checker.check_model(model)
    return model


def save_onnx(mod: Module, path: str | Path, activation_dtype: str = "uint8") -> str:
    """Write ``mod`` to ``path`` (replaced only on success); returns "fp32" or "int8 QDQ"."""
    from ..ir.params import atomic_write
    exporter = Exporter(mod, activation_dtype)
    model = exporter.run(Path(path).stem)
    import onnx
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))
    return f"int8 QDQ, {activation_dtype} activations" if exporter.quantized else "fp32"
