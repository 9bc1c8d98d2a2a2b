"""Programs to ONNX (opset 17), so ONNX Runtime can run what eqquant produced.

    model = to_onnx(bind_params(mod, params))     # an onnx.ModelProto
    save_onnx(bound, "model.onnx")                # checked, written atomically

Each op is written by its registry entry's ONNX form (``OpDef.onnx``). An int8 program (QNN
ops, as ``eqquant quantize`` extracts it) is written in ONNX's QDQ form by
:mod:`eqquant.interop.onnx_qdq`: QuantizeLinear / DequantizeLinear around float ops, uint8
activations and int8 weights, which ONNX Runtime fuses back into its integer kernels. Every
parameter without a value becomes a graph input; constants become initializers. An op with no
mapping raises a located error naming it.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.types import Dim
from ..errors import EqquantError
from ..core.nodes import (Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var,
                          post_order)
from ..ir.typecheck import infer_types
from ..ops.onnx_conventions import OnnxFormError
from ..ops.registry import IDENTITY
from ..passes.inline import inline_calls

OPSET = 17

class Exporter:
    """Walks a module in post order and emits ONNX nodes; ``names`` maps each IR value (by
    id) to its ONNX tensor name (a list for a tuple)."""

    opset = OPSET

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

    def emit_many(self, op_type: str, ins: list[str], n: int, **attrs) -> list[str]:
        """An ONNX node with ``n`` outputs (a tuple-valued op: Split)."""
        from onnx import helper
        outs = [self.fresh(op_type.lower()) for _ in range(n)]
        self.nodes.append(helper.make_node(op_type, ins, outs, **attrs))
        return outs

    def emit(self, op_type: str, ins: list[str], **attrs) -> str:
        from onnx import helper
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, ins, [out], **attrs))
        return out

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
                    node.name, helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype)),
                    onnx_shape(t.shape)))
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
                layout = node.attrs.get("data_layout", node.attrs.get("layout", "NCHW"))
                if layout not in ("NCHW", "NCDHW"):   # ONNX's convolutions and pools are
                    #                                    channels-first
                    raise EqquantError(f"ONNX export: {node.op.name} with layout {layout}; "
                                       f"ONNX's Conv and pools are NCHW", node.loc)
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
                                                         TensorProto.FLOAT,
                                                         onnx_shape(t.shape)))
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
        """``node`` written by its op's ONNX form (``OpDef.onnx``); an annotation that is the
        identity passes its input through."""
        checked = ins is None
        ins = ins or [self.name_of(x) for x in node.args]
        if IDENTITY in node.op.props:
            return ins[0]
        first = getattr(self.type(node.args[0]), "dtype", "float32") if node.args else ""
        if checked and first in ("int8", "uint8") and \
                getattr(self.type(node), "dtype", "") == first:   # (a cast converts it)
            raise EqquantError(f"ONNX export: {node.op.name} on "
                               f"{self.type(node.args[0]).dtype} values has no QDQ form",
                               node.loc)
        if not node.op.onnx:
            raise EqquantError(f"ONNX export: {node.op.name} has no ONNX form (OpDef.onnx)",
                               node.loc)
        try:
            return node.op.onnx[0].write(self, node, ins)
        except OnnxFormError as e:
            raise EqquantError(f"ONNX export: {node.op.name}: {e}", node.loc) from None

    def reshape(self, x: str, shape) -> str:
        if any(isinstance(d, Dim) for d in shape):
            raise EqquantError("ONNX export: a reshape to sizes known only at run time "
                               f"({', '.join(map(str, shape))}) is not exported (fix the "
                               "sizes on import: --shape)")
        return self.emit("Reshape", [x, self.const(np.asarray(shape, np.int64))])


def onnx_shape(shape) -> list:
    """A shape as ONNX's value infos take it: a size known only at run time as its name
    (``dim_param``: ``?batch`` is "batch", ``4*?n`` is "4*n")."""
    return [str(d).replace("?", "") or "unk" if isinstance(d, Dim) else int(d)
            for d in shape]


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
