"""ONNX models to the text IR: ``eqquant import MODEL.onnx -o DIR``.

    mod, params, notes = import_onnx("resnet18.onnx", shapes={"input": (1, 3, 224, 224)})

Each ONNX node is converted by one entry of ``CONVERTERS`` (op type -> function), built on
the registry through :class:`~eqquant.ir.builder.Builder`, so every node is type-checked as it
is made. Initializers become params (named as in the file); value names are kept, made valid
for the text IR where they are not (``input.1`` -> ``input_1``; purely numeric names are left
to the printer's numbering). A node whose inputs are all known constants (PyTorch's
``Shape -> Gather -> Concat`` chains feeding a Reshape, for example) is evaluated at import
with ONNX's own reference evaluator; ``Shape`` of a value is known from its static type.

Every failure is an :class:`OnnxImportError` naming the file, the node (index, name, op) and
what was expected: an op without a converter, an attribute value eqquant cannot express, a
dimension left symbolic, a malformed file.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import EqquantError
from ..ir.builder import Builder
from ..core.nodes import Call, Expr, Var
from ..core.types import DTYPES, TensorType
from ..ops.registry import onnx_forms


class OnnxImportError(EqquantError):
    kind = "import error"


class _NodeError(Exception):
    """Raised by a converter; the importer adds the file and the node."""


_LOCAL = re.compile(r"[A-Za-z_]\w*(?:(?:(?:::|\.)\w+)*(?:::|\.)\d*[A-Za-z_]\w*)?")


def valid_name(name: str) -> str | None:
    """A text-IR name for an ONNX value name; None for a purely numeric one (numbered by the
    printer). ``input.1`` -> ``input_1``, ``/layer1/conv/Conv_output_0`` ->
    ``layer1_conv_Conv_output_0``, ``onnx::Conv_12`` -> ``onnx::Conv_12``."""
    if _LOCAL.fullmatch(name):
        return name
    if name.isdigit() or not name:
        return None
    out = re.sub(r"\W+", "_", name).strip("_") or "v"
    return out if _LOCAL.fullmatch(out) else "v_" + out


# ---------------------------------------------------------------------------------------------


class Importer:
    def __init__(self, model, source: str, shapes: Mapping[str, tuple[int, ...]] | None):
        from onnx import numpy_helper
        self.model = model
        self.source = source
        self.forms = onnx_forms()   # ONNX op type -> (op, form), from the registry
        self.shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        self.b = Builder()
        self.values: dict[str, Expr] = {}            # ONNX name -> IR value
        self.consts: dict[str, np.ndarray] = {}      # ONNX name -> known constant
        self.missing: dict[str, str] = {}            # outputs eqquant does not produce
        self.used: set[str] = set()
        self.notes: list[str] = []
        self.input_names: dict[str, str] = {}         # ONNX input name -> text-IR name
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        for init in model.graph.initializer:
            size = int(np.prod(list(init.dims), dtype=object))
            if size > MAX_CONST_ELEMENTS:
                raise OnnxImportError(f"{source}: initializer '{init.name[:80]}' has {size:.3g} "
                                      f"elements, more than {MAX_CONST_ELEMENTS:.3g}")
            try:
                arr = numpy_helper.to_array(init)
            except Exception as e:  # noqa: BLE001 - onnx raises many kinds on a bad tensor
                raise OnnxImportError(f"{source}: initializer '{init.name[:80]}' cannot be "
                                      f"read ({e})") from None
            _check_dtype(arr.dtype, f"{source}: initializer '{init.name[:80]}'")
            self.consts[init.name] = arr

    # -- names and values ---------------------------------------------------------------------

    def fresh_name(self, onnx_name: str) -> str | None:
        name = valid_name(onnx_name)
        if name is None:
            return None
        base, i = name, 1
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def value(self, name: str) -> Expr:
        """The IR value of an ONNX name; an initializer becomes a param on first use."""
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            arr = self.consts[name]
            v = self.b.param(self.fresh_name(name) or f"const_{len(self.values)}", arr)
            self.values[name] = v
            return v
        if name in self.missing:
            raise _NodeError(self.missing[name])
        raise _NodeError(f"input '{name}' is not produced by any node, initializer or input")

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise _NodeError(f"{what} ('{name}') must be a constant (an initializer, a Constant "
                             "node or computed from them), not a value computed at run time")
        return self.consts[name]

    def const_ints(self, name: str, what: str) -> list[int]:
        """A constant that must be a vector (or a scalar) of integers."""
        v = np.asarray(self.const(name, what))
        if v.ndim > 1 or v.dtype.kind not in "iu":
            raise _NodeError(f"{what} must be a vector of integers, got {v.dtype} of shape "
                             f"{list(v.shape)}")
        return [int(x) for x in v.reshape(-1)]

    def const_scalar(self, name: str, what: str) -> float:
        """A constant that must hold one number."""
        v = np.asarray(self.const(name, what))
        if v.size != 1 or v.dtype.kind not in "iufb":
            raise _NodeError(f"{what} must be one number, got {v.dtype} of shape "
                             f"{list(v.shape)}")
        return float(v.reshape(()))

    def type(self, e: Expr) -> TensorType:
        t = self.b._types.expr(e)
        if not isinstance(t, TensorType):
            raise _NodeError(f"expected a tensor, got {t}")
        return t

    def call(self, op: str, *args: Expr, **attrs: Any) -> Call:
        return self.b.call(op, *args, **attrs)

    def scalar(self, value: float, like: Expr) -> Expr:
        return self.b.scalar(value, self.type(like).dtype)

    # -- the graph ----------------------------------------------------------------------------

    def inputs(self) -> None:
        from onnx import helper
        for vi in self.model.graph.input:
            if vi.name in self.consts:     # old exporters list initializers as inputs too
                continue
            tt = vi.type.tensor_type
            try:
                dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            except Exception:  # noqa: BLE001 - onnx raises KeyError or ValueError
                raise OnnxImportError(f"{self.source}: input '{vi.name}' has an element type "
                                      f"eqquant cannot read ({tt.elem_type})") from None
            _check_dtype(dtype, f"{self.source}: input '{vi.name}'")
            if vi.name in self.shapes:
                shape = self.shapes[vi.name]
            else:
                shape = []
                for i, d in enumerate(tt.shape.dim):
                    if d.HasField("dim_value") and d.dim_value > 0:
                        shape.append(d.dim_value)
                    elif i == 0:
                        shape.append(1)
                        self.notes.append(f"input '{vi.name}': batch dimension "
                                          f"'{d.dim_param or '?'}' set to 1")
                    else:
                        raise OnnxImportError(
                            f"{self.source}: input '{vi.name}': dimension {i} is symbolic "
                            f"('{d.dim_param or '?'}'); give the shape: --shape "
                            f"{vi.name}=" + ",".join(["N"] * len(tt.shape.dim)))
                shape = tuple(shape)
            name = self.fresh_name(vi.name) or f"input{len(self.b.params)}"
            self.values[vi.name] = self.b.input(name, shape, dtype)
            self.input_names[vi.name] = name

    def node(self, index: int, node) -> None:
        from onnx import helper
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        ins = list(node.input)
        domain_ok = node.domain in ("", "ai.onnx")
        if domain_ok and node.op_type == "Shape" and ins[0] in self.values:
            self.consts[node.output[0]] = _shape_slice(
                self.type(self.values[ins[0]]).shape, attrs)
            return
        if domain_ok and node.op_type == "Constant":
            self.consts[node.output[0]] = _constant_value(attrs)
            return
        if domain_ok and ins and all(not n or n in self.consts for n in ins):
            self._fold(node, ins)
            return
        forms = self.forms
        conv = CONVERTERS.get(node.op_type) if domain_ok else None
        form = forms.get(node.op_type) if domain_ok else None
        if conv is None and form is None:
            raise _NodeError(f"op {node.op_type}"
                             + (f" of domain '{node.domain}'" if not domain_ok else "")
                             + " is not supported (supported: "
                             + ", ".join(sorted({*CONVERTERS, *forms})) + ")")
        # an op's own ONNX form (its registry entry) first; then the converters below, for
        # ONNX ops that become several IR ops
        outs = form[1].read(self, form[0], attrs, ins) if form is not None else \
            conv(self, attrs, ins)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outs) or outs[i] is None:
                self.missing[name] = (f"output {i} of {node.op_type} node '{node.name}' "
                                      "is not supported (only its first output is)")
                continue
            e = outs[i]
            label = None if isinstance(e, Var) or getattr(e, "name", None) else \
                self.fresh_name(name)
            if label and isinstance(e, Call):
                e = replace(e, name=label)
                self.type(e)
            self.values[name] = e

    def _fold(self, node, ins) -> None:
        """Evaluate a node whose inputs are all constants with ONNX's reference evaluator:
        only ops without control flow or subgraphs, and only when the result's size is known
        beforehand to be bounded (a tiny file must not make import allocate gigabytes)."""
        from onnx.reference import ReferenceEvaluator
        if node.op_type not in FOLDABLE:
            raise _NodeError(f"a constant {node.op_type} is not evaluated at import (only "
                             f"{', '.join(sorted(FOLDABLE))} are)")
        feeds = {n: self.consts[n] for n in ins if n}
        bound = _folded_size(node.op_type, [self.consts[n] if n else None for n in ins])
        if bound > MAX_CONST_ELEMENTS:
            raise _NodeError(f"the constant it computes would have {bound:.3g} elements, more "
                             f"than {MAX_CONST_ELEMENTS:.3g}")
        try:
            outs = ReferenceEvaluator(node).run(None, feeds)
        except Exception as e:  # noqa: BLE001 - any failure of the reference is reported
            raise _NodeError(f"cannot evaluate this constant node ({e})") from None
        for name, arr in zip(node.output, outs):
            if name:
                arr = np.asarray(arr)
                _check_dtype(arr.dtype, f"the constant '{name[:80]}' it computes")
                self.consts[name] = arr

    def run(self):
        graph = self.model.graph
        self.inputs()
        for index, node in enumerate(graph.node):
            try:
                self.node(index, node)
            except (_NodeError, EqquantError) as e:
                msg = e.args[0] if isinstance(e, _NodeError) else e.message
                raise OnnxImportError(f"{self.source}: node {index} '{node.name}' "
                                      f"({node.op_type}): {msg}") from None
        outs = []
        for vi in graph.output:
            if vi.name in self.consts and vi.name not in self.values:
                raise OnnxImportError(f"{self.source}: output '{vi.name}' is a constant; "
                                      "eqquant programs compute their outputs from inputs")
            try:
                outs.append(self.value(vi.name))
            except _NodeError as e:
                raise OnnxImportError(f"{self.source}: output '{vi.name}': {e.args[0]}") \
                    from None
        if not outs:
            raise OnnxImportError(f"{self.source}: the graph has no outputs")
        body = outs[0] if len(outs) == 1 else self.b.tuple(*outs)
        mod, params = self.b.finish(body)
        return mod, params


# Constant subgraphs (PyTorch's Shape -> Gather -> Concat -> Reshape chains) are evaluated at
# import. Only these ops, none with control flow; a result larger than this is refused.
MAX_CONST_ELEMENTS = 1 << 26
FOLDABLE = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal", "Exp",
    "Expand", "Flatten", "Floor", "Gather", "Greater", "Identity", "Less", "Max", "Min",
    "Mul", "Neg", "Not", "Or", "Pow", "Range", "Reciprocal", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceSum", "Relu", "Reshape", "Shape", "Sigmoid", "Size", "Slice",
    "Sqrt", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where"})


def _folded_size(op: str, ins: list) -> float:
    """An upper bound on the number of elements a constant op produces, from its inputs."""
    sizes = [np.size(a) for a in ins if a is not None]
    largest = float(max(sizes, default=1))
    try:
        if op == "ConstantOfShape":
            return float(np.prod(np.asarray(ins[0], np.float64)))
        if op == "Expand":
            shape = np.asarray(ins[1], np.float64).reshape(-1)
            return float(np.prod(np.maximum(shape, 1))) * largest
        if op == "Tile":
            return float(np.size(ins[0])) * float(np.prod(np.abs(np.asarray(ins[1],
                                                                              np.float64))))
        if op == "Range":
            start, limit, delta = (float(np.reshape(a, -1)[0]) for a in ins[:3])
            return abs((limit - start) / delta) + 1 if delta else math.inf
        if op == "Reshape":
            return float(np.size(ins[0]))
    except (TypeError, ValueError, IndexError, OverflowError):
        return math.inf
    return largest * max(len(sizes), 1) if op == "Concat" else largest


def _check_dtype(dtype, what: str) -> None:
    name = str(dtype)
    if name not in DTYPES:
        raise OnnxImportError(f"{what} has element type {name}, which eqquant cannot hold "
                              f"(it holds {', '.join(DTYPES)})")


def _shape_slice(shape, attrs) -> np.ndarray:
    arr = np.asarray(shape, np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return arr[start:end]


def _constant_value(attrs) -> np.ndarray:
    from onnx import numpy_helper
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype)
    raise _NodeError(f"a Constant with {', '.join(attrs) or 'no value'} is not supported "
                     "(value, value_float(s), value_int(s) are)")


# ---------------------------------------------------------------------------------------------
# Converters of ONNX ops that are not one registry op's ONNX form (see OpDef.onnx): an ONNX op
# read as several IR ops, or with checks of its own: (importer, attrs, input names) -> value(s)

Converter = Callable[[Importer, dict, list], Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*op_types: str):
    def deco(fn):
        for t in op_types:
            CONVERTERS[t] = fn
        return fn
    return deco


def _two_d(im: Importer, x: Expr, what: str) -> TensorType:
    t = im.type(x)
    if t.rank != 4:
        raise _NodeError(f"only 2-d {what} on NCHW tensors is supported; the input has rank "
                         f"{t.rank}")
    return t


def _pads(im, attrs, in_hw, kernel, strides, dilations) -> list[int]:
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", ""):
        pads = list(attrs.get("pads", [0, 0, 0, 0]))
        if len(pads) != 4:
            raise _NodeError(f"pads {pads} should have 4 values for a 2-d window")
        return pads
    if auto == "VALID":
        return [0, 0, 0, 0]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise _NodeError(f"auto_pad '{auto}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, "
                         "VALID")
    begin, end = [], []
    for n, k, s, d in zip(in_hw, kernel, strides, dilations):
        total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


@converts("Conv")
def _conv(im, attrs, ins):
    x, w = im.value(ins[0]), im.value(ins[1])
    xt, wt = _two_d(im, x, "convolutions"), im.type(w)
    if wt.rank != 4:
        raise _NodeError(f"the weight has rank {wt.rank}; only 2-d convolutions are supported")
    kernel = list(attrs.get("kernel_shape", wt.shape[2:]))
    if tuple(kernel) != tuple(wt.shape[2:]):
        raise _NodeError(f"kernel_shape {kernel} disagrees with the weight's shape "
                         f"{list(wt.shape)}")
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    pads = _pads(im, attrs, xt.shape[2:], kernel, strides, dil)
    y = im.call("nn.conv2d", x, w, strides=strides, padding=pads, dilation=dil,
                groups=attrs.get("group", 1))
    if len(ins) > 2 and ins[2]:
        y = im.call("nn.bias_add", y, im.value(ins[2]), axis=1)
    return y


@converts("BatchNormalization")
def _batch_norm(im, attrs, ins):
    if attrs.get("training_mode", 0):
        raise _NodeError("training_mode=1 is not supported: export the model in eval mode")
    args = [im.value(n) for n in ins[:5]]
    bn = im.call("nn.batch_norm", *args, axis=1, epsilon=float(attrs.get("epsilon", 1e-5)))
    return im.b.get(bn, 0)


def _pool_attrs(im, attrs, x):
    t = _two_d(im, x, "pooling")
    kernel = list(attrs["kernel_shape"]) if "kernel_shape" in attrs else None
    if kernel is None or len(kernel) != 2:
        raise _NodeError(f"kernel_shape {kernel} should give 2 values")
    strides = list(attrs.get("strides", [1, 1]))
    dil = list(attrs.get("dilations", [1, 1]))
    return dict(pool_size=kernel, strides=strides, dilation=dil,
                padding=_pads(im, attrs, t.shape[2:], kernel, strides, dil),
                ceil_mode=bool(attrs.get("ceil_mode", 0)))


@converts("MaxPool")
def _max_pool(im, attrs, ins):
    if attrs.get("storage_order", 0):
        raise _NodeError("storage_order=1 (column major indices) is not supported")
    x = im.value(ins[0])
    return [im.call("nn.max_pool2d", x, **_pool_attrs(im, attrs, x)), None]


@converts("AveragePool")
def _avg_pool(im, attrs, ins):
    x = im.value(ins[0])
    return im.call("nn.avg_pool2d", x, **_pool_attrs(im, attrs, x),
                   count_include_pad=bool(attrs.get("count_include_pad", 0)))


@converts("GlobalAveragePool")
def _global_avg(im, attrs, ins):
    x = im.value(ins[0])
    _two_d(im, x, "pooling")
    return im.call("nn.global_avg_pool2d", x)


def _t2(im, x):
    return im.call("transpose", x, axes=[1, 0])


@converts("Gemm")
def _gemm(im, attrs, ins):
    a, b = im.value(ins[0]), im.value(ins[1])
    for e, what in ((a, "A"), (b, "B")):
        if im.type(e).rank != 2:
            raise _NodeError(f"{what} has rank {im.type(e).rank}; Gemm takes matrices")
    if attrs.get("transA", 0):
        a = _t2(im, a)
    w = b if attrs.get("transB", 0) else _t2(im, b)     # nn.dense wants (units, K)
    y = im.call("nn.dense", a, w)
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = im.call("multiply", y, im.scalar(alpha, y))
    if len(ins) > 2 and ins[2] and beta != 0.0:
        c = im.value(ins[2])
        if beta != 1.0:
            c = im.call("multiply", c, im.scalar(beta, c))
        y = im.call("add", y, c)
    return y


@converts("MatMul")
def _matmul(im, attrs, ins):
    a, b = im.value(ins[0]), im.value(ins[1])
    at, bt = im.type(a), im.type(b)
    if bt.rank != 2 or at.rank < 2:
        raise _NodeError(f"MatMul of ranks {at.rank} and {bt.rank}: only an (..., K) x (K, N) "
                         "product is supported")
    if at.rank == 2:
        return im.call("nn.dense", a, _t2(im, b))
    flat = im.call("reshape", a, newshape=[-1, at.shape[-1]])
    y = im.call("nn.dense", flat, _t2(im, b))
    return im.call("reshape", y, newshape=list(at.shape[:-1]) + [bt.shape[1]])


@converts("Flatten")
def _flatten(im, attrs, ins):
    x = im.value(ins[0])
    shape = im.type(x).shape
    axis = attrs.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if axis == 1 and len(shape) >= 2:
        return im.call("nn.batch_flatten", x)
    lead = int(np.prod(shape[:axis], dtype=np.int64))
    return im.call("reshape", x, newshape=[lead, -1 if shape[axis:] else 1])


@converts("Reshape")
def _reshape(im, attrs, ins):
    shape = im.const_ints(ins[1], "Reshape's shape")
    if attrs.get("allowzero", 0) and 0 in shape:
        raise _NodeError("allowzero=1 with a 0 in the shape (an empty tensor) is not supported")
    return im.call("reshape", im.value(ins[0]), newshape=shape)


@converts("Concat")
def _concat(im, attrs, ins):
    parts = [im.value(n) for n in ins if n]
    return im.call("concatenate", im.b.tuple(*parts), axis=attrs["axis"])


@converts("Softmax")
def _softmax(im, attrs, ins):
    x = im.value(ins[0])
    shape = im.type(x).shape
    axis = attrs.get("axis", -1 if im.opset >= 13 else 1)
    axis = axis + len(shape) if axis < 0 else axis
    if im.opset >= 13 or axis == len(shape) - 1:
        return im.call("nn.softmax", x, axis=axis)
    # before opset 13: the trailing axes from `axis` on are one flattened axis
    flat = im.call("reshape", x, newshape=[int(np.prod(shape[:axis], dtype=np.int64)), -1])
    return im.call("reshape", im.call("nn.softmax", flat, axis=-1), newshape=list(shape))


@converts("Identity")
def _identity(im, attrs, ins):
    return im.value(ins[0])


@converts("Dropout")
def _dropout(im, attrs, ins):
    return [im.value(ins[0]), None]


@converts("Pad")
def _pad(im, attrs, ins):
    x = im.value(ins[0])
    rank = im.type(x).rank
    mode = attrs.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect"):
        raise _NodeError(f"mode '{mode}' is not one of constant, edge, reflect")
    if im.opset >= 11:
        pads = im.const_ints(ins[1], "Pad's pads")
        value = im.const_scalar(ins[2], "Pad's constant_value") if len(ins) > 2 and ins[2] \
            else 0.0
        axes = [a % rank for a in im.const_ints(ins[3], "Pad's axes")] \
            if len(ins) > 3 and ins[3] else list(range(rank))
    else:
        pads, value, axes = list(attrs["pads"]), float(attrs.get("value", 0.0)), \
            list(range(rank))
    if len(pads) != 2 * len(axes):
        raise _NodeError(f"pads has {len(pads)} values for {len(axes)} axes")
    width = [[0, 0] for _ in range(rank)]
    for i, a in enumerate(axes):
        width[a] = [pads[i], pads[i + len(axes)]]
    if any(p < 0 for pair in width for p in pair):
        raise _NodeError(f"negative pads (cropping) are not supported: {pads}")
    return im.call("nn.pad", x, im.scalar(value, x), pad_width=width, pad_mode=mode)


@converts("Transpose")
def _transpose(im, attrs, ins):
    x = im.value(ins[0])
    perm = attrs.get("perm")
    return im.call("transpose", x, axes=list(perm) if perm is not None else None)


def _axes(im, attrs, ins, op) -> list[int] | None:
    if len(ins) > 1 and ins[1]:
        return im.const_ints(ins[1], f"{op}'s axes")
    return list(attrs["axes"]) if "axes" in attrs else None


@converts("Squeeze")
def _squeeze(im, attrs, ins):
    return im.call("squeeze", im.value(ins[0]), axis=_axes(im, attrs, ins, "Squeeze"))


@converts("Unsqueeze")
def _unsqueeze(im, attrs, ins):
    x = im.value(ins[0])
    axes = _axes(im, attrs, ins, "Unsqueeze")
    if not axes:
        raise _NodeError("Unsqueeze needs axes")
    shape = list(im.type(x).shape)
    rank = len(shape) + len(axes)
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise _NodeError(f"Unsqueeze axes {list(axes)} are out of range or repeated for a "
                         f"result of rank {rank}")
    for a in sorted(a % rank for a in axes):
        shape.insert(a, 1)
    if len(axes) == 1:
        return im.call("expand_dims", x, axis=axes[0] % rank)
    return im.call("reshape", x, newshape=shape)


# ---------------------------------------------------------------------------------------------


def read_onnx(path: str | Path):
    """Load and check an ONNX file; every failure is an OnnxImportError naming the file."""
    import onnx
    path = Path(path)
    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise OnnxImportError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and others
        raise OnnxImportError(f"{path}: not a readable ONNX model "
                              f"({type(e).__name__}: {e})") from None
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - ValidationError and friends
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{path}: not a valid ONNX model ({first})") from None
    return model


def import_onnx(model, shapes: Mapping[str, tuple[int, ...]] | None = None,
                source: str | None = None):
    """An ONNX model (a path or a ModelProto) as ``(module, params, notes)``; ``shapes``
    fixes input shapes the file leaves symbolic (a leading symbolic dimension defaults to 1,
    which ``notes`` says)."""
    mod, params, im = run_importer(model, shapes, source)
    return mod, params, im.notes


def run_importer(model, shapes=None, source: str | None = None):
    """``(module, params, importer)``: the importer keeps the notes and the input names."""
    if isinstance(model, (str, Path)):
        source = source or str(model)
        model = read_onnx(model)
    im = Importer(model, source or "<onnx model>", shapes)
    mod, params = im.run()
    return mod, params, im
