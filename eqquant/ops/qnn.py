"""Quantized ops in TVM's QNN vocabulary. Scales and zero points are operands (scalars, or
vectors along ``axis`` for per-channel parameters), so rules can match and move them.

    qnn.quantize(x, s, z)         clip(round(x / s) + z)                 float -> int8/uint8
    qnn.dequantize(q, s, z)       (q - z) * s                            int -> float32
    qnn.requantize(q, s1, z1, s2, z2)   (q - z1) * s1 / s2 + z2 in fixed point (Q31 multiplier
                                  and shift, ties UPWARD or TONEAREST), clipped
    qnn.conv2d(x, w, zx, zw, sx, sw)    sum (x - zx)(w - zw): int32 accumulation
    qnn.dense(x, w, zx, zw, sx, sw)     the same for dense
    qnn.add(a, b, sa, za, sb, zb, so, zo)  b rescaled to sa, added in int32, requantized to so

Rounding of ``qnn.quantize`` is half to even (numpy's round, LLVM's nearbyint).
"""
from __future__ import annotations

import math

import numpy as np

from ..core.types import TensorType, is_float, is_int
from . import numerics
from .attrs import BOOL, DTYPE_REQUIRED, FLOAT_F, INT, OPT_INT, Attr, DTypeKind, StrKind
from .fused import write_epilogue
from .nn import CONV2D_ATTRS, conv2d_flops, conv2d_rel, dense_rel, matmul_shapes
from .registry import (ANNOTATION, COMPUTE, KERNEL, QUANT, OnnxForm, OpDef, OpTypeError,
                       get_op, register)
from .typerel import broadcast_shapes, tensor

QDTYPE = DTypeKind("dtype", allow_empty=False, choices=("int8", "uint8", "int32"))
EIGHT_BIT_OUT = DTypeKind("out_dtype", allow_empty=False, choices=("int8", "uint8"))
EIGHT_BIT = DTypeKind("dtype", allow_empty=False, choices=("int8", "uint8"))
ROUNDING = StrKind("rounding", ("UPWARD", "TONEAREST"))


def _param(types, i: int, name: str, data: TensorType, axis: int, floating: bool,
           broadcast: bool = False) -> None:
    """A scale or zero point: a scalar, or one value per channel along ``axis``; with
    ``broadcast``, also any tensor of rank >= 2 that broadcasts with the data."""
    t = tensor(types, i, name)
    if floating and t.dtype != "float32":
        raise OpTypeError(f"argument {i + 1} ('{name}') must be float32, got {t.dtype}", i)
    if not floating and t.dtype != "int32":
        raise OpTypeError(f"argument {i + 1} ('{name}') must be int32, got {t.dtype}", i)
    if t.rank == 0:
        return
    if broadcast and t.rank >= 2:
        if broadcast_shapes(data.shape, t.shape) is None:
            raise OpTypeError(f"argument {i + 1} ('{name}') {t} does not broadcast with "
                              f"{data}", i)
        return
    channels = data.shape[axis % data.rank] if data.rank else 1
    if t.rank != 1 or t.shape[0] not in (1, channels):
        raise OpTypeError(f"argument {i + 1} ('{name}') must be a scalar or have "
                          f"{channels} values (axis {axis}), got {t}", i)


def _along(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A scalar or per-channel parameter shaped to broadcast along ``axis`` (a parameter of
    rank >= 2 broadcasts as it is)."""
    v = np.asarray(v)
    if v.ndim >= 2:
        return v
    if v.ndim == 0 or v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def _saturate(v: np.ndarray, dtype: str) -> np.ndarray:
    lo, hi = numerics.qrange(dtype)
    return np.clip(v, lo, hi).astype(dtype)


# -- the calibration mark -----------------------------------------------------------------

def _calibrated_rel(types, attrs):
    x = tensor(types, 0, "data")
    if not is_float(x.dtype):
        raise OpTypeError(f"annotation.calibrated marks a float tensor, got {x.dtype}", 0)
    if attrs["dtype"] not in ("int8", "uint8"):
        raise OpTypeError(f"annotation.calibrated quantizes to int8 or uint8, got "
                          f"{attrs['dtype']}")
    _param(types, 1, "scale", x, attrs["axis"], True)
    _param(types, 2, "zero_point", x, attrs["axis"], False)
    return x


def _fake_quantize(x, scale, zp, *, dtype, axis):
    return _dequantize(_quantize(x, scale, zp, axis=axis, out_dtype=dtype), scale, zp, axis=axis)


def _calibrated_unfuse(args, attrs):
    """What the mark means, written out: qnn.dequantize(qnn.quantize(x, s, z), s, z)."""
    x, s, z = args
    inner = _call("qnn.quantize", x, s, z, axis=attrs["axis"], out_dtype=attrs["dtype"])
    return _call("qnn.dequantize", inner, s, z, axis=attrs["axis"])


# The mark *is* fake quantization, not the identity: marking a value is the one approximation
# of the quantization flow (eqquant.quant.annotate makes it), and every rule that acts on the
# marked program afterwards is an identity of the marked program's semantics (or a rounding
# approximation with a bound that holds for every input). So no rule can ever equate a value
# with its quantized round trip, and no range-dependent fact leaks between them.
register(OpDef("annotation.calibrated", inputs=("data", "scale", "zero_point"),
               props=frozenset({ANNOTATION, QUANT}),
               attrs=(Attr("dtype", EIGHT_BIT, "int8"), Attr("axis", INT, -1)),
               type_rel=_calibrated_rel, semantics=_fake_quantize, unfuse=_calibrated_unfuse,
               flops=lambda ins, out, a: 4.0 * out.size,
               doc="fake quantization: dequantize(quantize(x, scale, zero_point, dtype), scale, "
                   "zero_point); the calibration marks a value with its quantization this way"))


# -- dynamic quantization: a value's parameters computed from the value, at run time --------

def _range_rel(types, attrs):
    x = tensor(types, 0, "data")
    if x.dtype != "float32":
        raise OpTypeError(f"takes a float32 tensor, got {x.dtype}", 0)
    return TensorType((2,), "float32")


def _dynamic_rel(out_dtype: str):
    def rel(types, attrs):
        r = tensor(types, 0, "range")
        if r.dtype != "float32" or r.shape != (2,):
            raise OpTypeError(f"takes a range (qnn.dynamic_range's Tensor[(2), float32]), "
                              f"got {r}", 0)
        return TensorType((), out_dtype)
    return rel


def dynamic_range(x) -> np.ndarray:
    """[least, greatest] of ``x``'s finite values, float32 ([0, 0] where it has none):
    infinities and NaN take no part (they saturate when quantized)."""
    v = np.asarray(x, np.float32).reshape(-1)
    v = v[np.isfinite(v)]
    return np.array([v.min(), v.max()] if v.size else [0.0, 0.0], np.float32)


def range_params_of(r, dtype: str) -> tuple[float, int]:
    """(scale, zero point) of the range ``r`` (``dynamic_range``'s), as calibration would
    give them for it (``numerics.range_params``): ONNX's DynamicQuantizeLinear for uint8,
    TVM's symmetric int8 for int8; an empty range ([0, 0]) gets the scale 1.0."""
    return numerics.range_params(float(r[0]), float(r[1]), dtype == "int8")


def dynamic_params(x, dtype: str) -> tuple[float, int]:
    """(scale, zero point) of ``x``'s finite range: what dynamic quantization computes at
    run time."""
    return range_params_of(dynamic_range(x), dtype)


def dynamic_mark(x, dtype: str):
    """``x`` marked for dynamic quantization: the calibration mark with its parameters
    computed at run time from ``x``'s range (one node, read by both)."""
    r = _call("qnn.dynamic_range", x)
    return _call("annotation.calibrated", x, _call("qnn.dynamic_scale", r, dtype=dtype),
                 _call("qnn.dynamic_zero_point", r, dtype=dtype), dtype=dtype, axis=-1)


# Dynamic quantization (``quantize --mode dynamic``, as ONNX Runtime's quantize_dynamic) marks
# a value annotation.calibrated(x, qnn.dynamic_scale(r), qnn.dynamic_zero_point(r)), with
# r = qnn.dynamic_range(x): the same mark, its parameters computed from each input instead of
# a calibration set, so the same rules move the work into integers. The range is one op of
# its own, so that the scale and the zero point read the operand once between them.
register(OpDef("qnn.dynamic_range", inputs=("data",), props=frozenset({QUANT}),
               type_rel=_range_rel, kernel="DynamicRange", semantics=dynamic_range,
               flops=lambda ins, out, a: 2.0 * ins[0].size,
               doc="[least, greatest] finite value of a float32 tensor, computed at run time "
                   "([0, 0] where there is none): what qnn.dynamic_scale and "
                   "qnn.dynamic_zero_point read"))
for _name, _dtype, _part, _doc in (
        ("qnn.dynamic_scale", "float32", 0,
         "the scale that quantizes a range (qnn.dynamic_range's) to dtype: (max - min) / 255 "
         "over a range covering 0 for uint8, max|x| / 127 for int8"),
        ("qnn.dynamic_zero_point", "int32", 1,
         "the zero point going with qnn.dynamic_scale: round(-min / scale) for uint8, 0 for "
         "int8")):
    register(OpDef(_name, inputs=("range",), props=frozenset({QUANT}),
                   attrs=(Attr("dtype", EIGHT_BIT, "uint8"),),
                   type_rel=_dynamic_rel(_dtype), kernel="DynamicParams",
                   semantics=lambda r, *, dtype, _part=_part, _dtype=_dtype: np.array(
                       range_params_of(r, dtype)[_part], _dtype),
                   flops=lambda ins, out, a: 2.0, doc=_doc))


# -- quantize / dequantize / requantize -------------------------------------------------------

def _quantize_rel(types, attrs):
    x = tensor(types, 0, "data")
    if not is_float(x.dtype):
        raise OpTypeError(f"qnn.quantize takes a float tensor, got {x.dtype}", 0)
    _param(types, 1, "output_scale", x, attrs["axis"], True, broadcast=True)
    _param(types, 2, "output_zero_point", x, attrs["axis"], False)
    if attrs["out_dtype"] not in ("int8", "uint8", "int32"):
        raise OpTypeError("out_dtype must be int8, uint8 or int32")
    shape = x.shape
    if types[1].rank >= 2:  # a broadcast scale may widen the result, as a multiply would
        shape = broadcast_shapes(x.shape, types[1].shape)
    return TensorType(shape, attrs["out_dtype"])


def _quantize(x, scale, zp, *, axis, out_dtype):
    s = _along(scale, x.ndim, axis).astype(np.float32)
    z = _along(zp, x.ndim, axis).astype(np.int64)
    q = np.round(x.astype(np.float32) / s).astype(np.int64) + z
    return _saturate(q, out_dtype)


# ONNX's QDQ form of each QNN op: ``w`` is the QDQ writer (eqquant/interop/onnx_qdq.py), whose
# helpers give an operand's real value (w.dq), 8-bit parameters from the op's scale and zero
# point inputs (w.q8) and record what the ONNX value holds (w.keep: 8-bit; w.accumulate: an
# int32 accumulator's real value).

def _quantize_qdq(w, node):
    q = w.q8(node, 1, 2, node.attrs["out_dtype"])
    return w.keep(node, q, w.quantize(w.ex.name_of(node.args[0]), q))


def _requantize_qdq(w, node):
    q = w.q8(node, 3, 4, node.attrs["out_dtype"])
    return w.keep(node, q, w.quantize(w.dq(node.args[0]), q))


def _qconv_qdq(w, node):
    y, scale = w.conv(node, bias=None)
    return w.accumulate(node, scale, y)


def _qdense_qdq(w, node):
    weight, sw = w.weight(node, 1, 5, 3)
    sx = w.scalar(node, 4, "input scale").astype(np.float32)
    return w.accumulate(node, sx * sw, w.ex.emit("Gemm", [w.dq(node.args[0]), weight],
                                                 transB=1))


def _qadd_qdq(w, node):
    q = w.q8(node, 6, 7, w.ex.type(node).dtype)
    real = w.ex.emit("Add", [w.dq(node.args[0]), w.dq(node.args[1])])
    return w.keep(node, q, w.quantize(real, q))


def _qclip_qdq(w, node):
    """Clip in real units, on an accumulator's real value or on an 8-bit value's."""
    clip = {"activation": "clip", "a_min": node.attrs["a_min"], "a_max": node.attrs["a_max"]}
    x = node.args[0]
    scale = w.accumulator_scale(x)
    if scale is not None:
        return w.accumulate(node, scale, write_epilogue(w.ex, w.ex.name_of(x), clip))
    q = w.params(x)
    if q is None:
        raise w.unsupported(node)
    return w.keep(node, q, w.quantize(write_epilogue(w.ex, w.dq(x), clip), q))


def _fqconv_qdq(w, node):
    y, _ = w.conv(node, bias=2)
    q = w.q8(node, 9, 10, node.attrs["out_dtype"])
    return w.keep(node, q, w.quantize(write_epilogue(w.ex, y, node.attrs), q))


# The realize view of each QNN op (TVM's realize output, the seed's final listing): the same
# values in casts, multiplies, rounds, clips, int32 convolutions and fixed_point_multiply,
# for symmetric parameters (zero points 0) and per-tensor scales.

class RealizeError(Exception):
    """An op has no realize form with these parameters (the view adds the location)."""


def _call(name: str, *args, **attrs):
    from ..core.nodes import Call, freeze_attrs
    op = get_op(name)
    return Call(op=op, args=args, attrs=freeze_attrs(op.canonical_attrs(attrs)))


def _scalar_value(e, what: str) -> float:
    from ..core.nodes import Constant, Scalar
    if isinstance(e, Scalar):
        return float(e.value)
    if isinstance(e, Constant) and e.data is not None and np.asarray(e.data).size == 1:
        return float(np.asarray(e.data).reshape(()))
    raise RealizeError(f"the realize view needs a constant per-tensor {what}")


def _symmetric(*zero_points) -> None:
    for z in zero_points:
        if _scalar_value(z, "zero point") != 0:
            raise RealizeError("the realize view takes symmetric quantization (zero points 0)")


def _f32(value: float):
    from ..core.nodes import Scalar
    return Scalar(value=float(np.float32(value)), dtype="float32")


def realize_requantize(q, in_dtype: str, ratio: float, out_dtype: str):
    """cast(int64); fixed_point_multiply; clip; [cast(int32), when rescaling an int32
    accumulator, as TVM's realize does]; cast(out_dtype)."""
    from .fixed_point import quantize_multiplier
    m, shift = quantize_multiplier(ratio)
    lo, hi = numerics.qrange(out_dtype)
    v = _call("cast", q, dtype="int64")
    v = _call("fixed_point_multiply", v, multiplier=m, shift=shift)
    v = _call("clip", v, a_min=float(lo), a_max=float(hi))
    if in_dtype == "int32":
        v = _call("cast", v, dtype="int32")
    return _call("cast", v, dtype=out_dtype)


def _quantize_realize(args, attrs, in_types, out_type):
    """multiply(x, 1/s); round; clip; cast"""
    x, s, z = args
    _symmetric(z)
    lo, hi = numerics.qrange(attrs["out_dtype"])
    v = _call("multiply", x, _f32(1 / _scalar_value(s, "scale")))
    v = _call("clip", _call("round", v), a_min=float(lo), a_max=float(hi))
    return _call("cast", v, dtype=attrs["out_dtype"])


def _dequantize_realize(args, attrs, in_types, out_type):
    """cast(float32); multiply(s)"""
    q, s, z = args
    _symmetric(z)
    return _call("multiply", _call("cast", q, dtype="float32"),
                 _f32(_scalar_value(s, "scale")))


def _qconv_realize(args, attrs, in_types, out_type):
    """nn.conv2d(x, w, ..., out_dtype="int32")"""
    x, w, zx, zw = args[:4]
    _symmetric(zx, zw)
    return _call("nn.conv2d", x, w, **{k: v for k, v in attrs.items() if k != KERNEL})


def _requantize_realize(args, attrs, in_types, out_type):
    q, s1, z1, s2, z2 = args
    _symmetric(z1, z2)
    return realize_requantize(q, in_types[0].dtype, _scalar_value(s1, "scale")
                              / _scalar_value(s2, "scale"), attrs["out_dtype"])


def _qadd_realize(args, attrs, in_types, out_type):
    """cast(b, int32); fixed_point_multiply (b to a's scale); add(cast(a, int32), .); then
    the requantize sequence"""
    from .fixed_point import quantize_multiplier
    if attrs["method"] != "realize":
        raise RealizeError("the realize view writes TVM's qnn.add (method realize); this one "
                           "rounds once (a uint8 program's add)")
    lhs, rhs, sa, za, sb, zb, so, zo = args
    _symmetric(za, zb, zo)
    m, shift = quantize_multiplier(_scalar_value(sb, "scale") / _scalar_value(sa, "scale"))
    r = _call("fixed_point_multiply", _call("cast", rhs, dtype="int32"), multiplier=m,
              shift=shift)
    total = _call("add", _call("cast", lhs, dtype="int32"), _call("cast", r, dtype="int32"))
    return realize_requantize(total, "int32", _scalar_value(sa, "scale")
                              / _scalar_value(so, "scale"), str(out_type.dtype))


register(OpDef("qnn.quantize", inputs=("data", "output_scale", "output_zero_point"),
               onnx=(OnnxForm("QuantizeLinear", reads=False, qdq=_quantize_qdq),),
               realize=_quantize_realize,
               props=frozenset({QUANT}), kernel="Quantize",
               attrs=(Attr("axis", INT, -1), Attr("out_dtype", QDTYPE, "int8")),
               type_rel=_quantize_rel, semantics=_quantize,
               doc="clip(round(x / scale) + zero_point) to out_dtype"))


def _quantized_input(types, attrs, op: str) -> TensorType:
    """An integer tensor followed by its scale and zero point (per tensor or along axis)."""
    q = tensor(types, 0, "data")
    if not is_int(q.dtype):
        raise OpTypeError(f"{op} takes an integer tensor, got {q.dtype}", 0)
    _param(types, 1, "input_scale", q, attrs["axis"], True)
    _param(types, 2, "input_zero_point", q, attrs["axis"], False)
    return q


def _dequantize_rel(types, attrs):
    return TensorType(_quantized_input(types, attrs, "qnn.dequantize").shape, "float32")


def _dequantize(q, scale, zp, *, axis):
    s = _along(scale, q.ndim, axis).astype(np.float32)
    z = _along(zp, q.ndim, axis).astype(np.int64)
    return ((q.astype(np.int64) - z).astype(np.float32) * s).astype(np.float32)


register(OpDef("qnn.dequantize", inputs=("data", "input_scale", "input_zero_point"),
               onnx=(OnnxForm("DequantizeLinear", reads=False,
                               qdq=lambda w, node: w.dq(node.args[0])),),
               realize=_dequantize_realize,
               props=frozenset({QUANT}), attrs=(Attr("axis", INT, -1),),
               kernel="Dequantize",
               type_rel=_dequantize_rel, semantics=_dequantize,
               doc="(q - zero_point) * scale, as float32"))


def _requantize_rel(types, attrs):
    q = tensor(types, 0, "data")
    if not is_int(q.dtype):
        raise OpTypeError(f"qnn.requantize takes an integer tensor, got {q.dtype}", 0)
    for i, (name, fl) in enumerate((("input_scale", True), ("input_zero_point", False),
                                    ("output_scale", True), ("output_zero_point", False)),
                                   start=1):
        _param(types, i, name, q, attrs["axis"], fl)
    return TensorType(q.shape, attrs["out_dtype"])


def requantize_values(q, in_scale, in_zp, out_scale, out_zp, axis, rounding, out_dtype):
    """The integer arithmetic of qnn.requantize (shared with qnn.add)."""
    from .fixed_point import quantize_multiplier
    q = q.astype(np.int64) - _along(in_zp, q.ndim, axis).astype(np.int64)
    ratio = (np.asarray(in_scale, np.float64).reshape(-1) /
             np.asarray(out_scale, np.float64).reshape(-1))
    if ratio.size == 1:
        m, s = quantize_multiplier(float(ratio[0]))
        v = numerics.fixed_point_multiply(q, m, s, rounding)
    else:
        ax = axis % q.ndim
        moved = np.moveaxis(q, ax, 0)
        v = np.empty_like(moved)
        for c in range(moved.shape[0]):
            m, s = quantize_multiplier(float(ratio[c]))
            v[c] = numerics.fixed_point_multiply(moved[c], m, s, rounding)
        v = np.moveaxis(v, 0, ax)
    v = v + _along(out_zp, q.ndim, axis).astype(np.int64)
    return _saturate(v, out_dtype)


def _requantize(q, in_scale, in_zp, out_scale, out_zp, *, axis, rounding, out_dtype):
    return requantize_values(q, in_scale, in_zp, out_scale, out_zp, axis, rounding, out_dtype)


register(OpDef(
    "qnn.requantize",
    inputs=("data", "input_scale", "input_zero_point", "output_scale", "output_zero_point"),
    onnx=(OnnxForm("QuantizeLinear", reads=False, qdq=_requantize_qdq),),
    realize=_requantize_realize,
    props=frozenset({QUANT}), kernel="Requantize",
    attrs=(Attr("axis", INT, -1), Attr("rounding", ROUNDING, "UPWARD"),
           Attr("out_dtype", QDTYPE, "int8")),
    type_rel=_requantize_rel, semantics=_requantize,
    doc="(q - z1) * s1 / s2 + z2 with a Q31 fixed-point multiplier, saturated"))


# -- integer compute ---------------------------------------------------------------------------

def _weight_axis(attrs) -> int:
    """The output-channel axis of a weight: 0 (OIHW, a dense layer's (units, K)), or 3 for
    HWIO (a channel-last convolution's)."""
    return 3 if attrs.get("kernel_layout") == "HWIO" else 0


def _qcompute_rel(core_rel):
    def rel(types, attrs):
        x = tensor(types, 0, "data")
        w = tensor(types, 1, "weight")
        if x.dtype not in ("int8", "uint8") or w.dtype not in ("int8", "uint8"):
            raise OpTypeError(f"takes int8/uint8 data and weight, got {x.dtype} and {w.dtype}",
                              0)
        # (per channel, the data's parameters go along its channel axis: 3 in NHWC)
        channel = 3 if attrs.get("data_layout") == "NHWC" else 1
        _param(types, 2, "input_zero_point", x, channel, False)
        _param(types, 3, "kernel_zero_point", w, _weight_axis(attrs), False)
        _param(types, 4, "input_scale", x, channel, True)
        _param(types, 5, "kernel_scale", w, _weight_axis(attrs), True)
        out = core_rel(types[:2], {**attrs, "out_dtype": "int32"})
        return TensorType(out.shape, attrs["out_dtype"])
    return rel


def _qconv2d(x, w, zx, zw, sx, sw, **attrs):
    xi = x.astype(np.int64) - np.asarray(zx).astype(np.int64).reshape(())
    wi = w.astype(np.int64) - _along(zw, w.ndim, _weight_axis(attrs)).astype(np.int64)
    out_dtype = attrs["out_dtype"]
    return numerics.conv2d(xi, wi, **{**attrs, "out_dtype": "int64"}).astype(out_dtype)


def _qdense(x, w, zx, zw, sx, sw, *, units, out_dtype):
    xi = x.astype(np.int64) - np.asarray(zx).astype(np.int64).reshape(())
    wi = w.astype(np.int64) - _along(zw, w.ndim, 0).astype(np.int64)
    return np.matmul(xi, wi.T).astype(out_dtype)


QINPUTS = ("data", "weight", "input_zero_point", "kernel_zero_point", "input_scale",
           "kernel_scale")

# The kernels an int8 convolution or dense layer may run on (``kernel="x86.vnni16"``): the
# SIMD GEMMs, the direct depthwise kernel and the portable loops. Which apply to a site, what
# each costs and which a CPU runs is the lowering's (``runtime/lowering/plan.py``, ``runtime/
# target.py``); "" leaves the choice to the target's plan, made when the program is extracted
# or, at the latest, loaded. Every kernel gives the same bits: the attribute says how, never
# what (the reference semantics never see it).
INT8_KERNELS = ("x86.amx", "x86.vnni", "x86.vnni16", "x86.avxvnni", "x86.avx2", "x86.avx2.bytes",
                "x86.avx2.w7", "depthwise", "portable")
KERNEL_ATTR = Attr(KERNEL, StrKind("kernel", ("",) + INT8_KERNELS), "")
# attention's products of two computed operands: the 16-bit GEMM takes both less their zero
# points (the byte and VNNI GEMMs multiply bytes by constant weights), or the portable loops
PAIR_KERNELS = ("x86.avx2", "portable")
PAIR_KERNEL_ATTR = Attr(KERNEL, StrKind("kernel", ("",) + PAIR_KERNELS), "")
def _qconv_channels_last(attrs, in_types) -> bool:
    """The integer convolution kernels read and write channel-last images: the SIMD GEMMs
    (groups 1, and grouped ones in sets of groups on the VNNI paths) and the direct depthwise
    kernel. (The portable loops run NCHW: the runtime says where a site takes them.)"""
    return True


register(OpDef(
    "qnn.conv2d", inputs=QINPUTS, onnx=(OnnxForm("Conv", reads=False, qdq=_qconv_qdq),),
                                  realize=_qconv_realize,
                                  props=frozenset({COMPUTE, QUANT}),
    channels_last=_qconv_channels_last,
    kernel="QConv2D",
    attrs=tuple(a for a in CONV2D_ATTRS if a.name != "out_dtype")
    + (Attr("out_dtype", DTYPE_REQUIRED, "int32"), KERNEL_ATTR),
    type_rel=_qcompute_rel(conv2d_rel), semantics=_qconv2d, flops=conv2d_flops,
    doc="conv2d of (data - zx) and (weight - zw), accumulated in int32"))
register(OpDef(
    "qnn.dense", inputs=QINPUTS, onnx=(OnnxForm("Gemm", reads=False, qdq=_qdense_qdq),),
                                 props=frozenset({COMPUTE, QUANT}),
    kernel="QDense",
    attrs=(Attr("units", OPT_INT, None), Attr("out_dtype", DTYPE_REQUIRED, "int32"),
           KERNEL_ATTR),
    type_rel=_qcompute_rel(dense_rel), semantics=_qdense,
    flops=lambda ins, out, a: 2.0 * out.size * ins[1].shape[1],
    doc="dense of (data - zx) and (weight - zw), accumulated in int32"))


# ---- qnn.batch_matmul: attention's products of two quantized activations --------------------

def _qbatch_matmul_rel(types, attrs):
    a, b = tensor(types, 0, "tensor_a"), tensor(types, 1, "tensor_b")
    if a.dtype not in ("int8", "uint8") or b.dtype not in ("int8", "uint8"):
        raise OpTypeError(f"takes int8/uint8 operands, got {a.dtype} and {b.dtype}", 0)
    for i, (name, data, fl) in enumerate((("a_zero_point", a, False), ("b_zero_point", b, False),
                                          ("a_scale", a, True), ("b_scale", b, True)), start=2):
        if tensor(types, i, name).rank != 0:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be a scalar (one scale per "
                              f"tensor: either operand's rows and columns mix in each sum)", i)
        _param(types, i, name, data, -1, fl)
    shape = matmul_shapes(a, b, attrs["transpose_a"], attrs["transpose_b"])
    depth = a.shape[-2] if attrs["transpose_a"] else a.shape[-1]
    if depth * 255 * 255 > 2 ** 31 - 1:
        raise OpTypeError(f"a depth of {depth}: its int32 sums could overflow (at most "
                          f"{(2 ** 31 - 1) // (255 * 255)})", 0)
    return TensorType(shape, attrs["out_dtype"])


def _qbatch_matmul(a, b, za, zb, sa, sb, *, transpose_a, transpose_b, out_dtype):
    """(a - za) @ (b - zb) over the last two axes, exactly: the products of 8-bit values
    (at most 2^16 each) sum exactly in float64 for any depth below 2^37, so numpy's BLAS
    computes them (its int64 matmul has no BLAS and is many times slower)."""
    x = a.astype(np.float64) - float(np.asarray(za))
    y = b.astype(np.float64) - float(np.asarray(zb))
    x = np.swapaxes(x, -1, -2) if transpose_a else x
    y = np.swapaxes(y, -1, -2) if transpose_b else y
    return np.matmul(x, y).astype(np.int64).astype(out_dtype)


def _qbatch_matmul_qdq(w, node):
    sa = w.scalar(node, 4, "tensor_a's scale").astype(np.float32)
    sb = w.scalar(node, 5, "tensor_b's scale").astype(np.float32)
    a, b = w.dq(node.args[0]), w.dq(node.args[1])
    for flag, name, i in (("transpose_a", a, 0), ("transpose_b", b, 1)):
        if node.attrs[flag]:
            rank = w.ex.type(node.args[i]).rank
            perm = list(range(rank))
            perm[-2:] = perm[-2:][::-1]
            name = w.ex.emit("Transpose", [name], perm=perm)
        a, b = (name, b) if i == 0 else (a, name)
    return w.accumulate(node, sa * sb, w.ex.emit("MatMul", [a, b]))


register(OpDef(
    "qnn.batch_matmul", inputs=("tensor_a", "tensor_b", "a_zero_point", "b_zero_point",
                                "a_scale", "b_scale"),
    props=frozenset({COMPUTE, QUANT}), kernel="QBatchMatmul",
    onnx=(OnnxForm("MatMul", reads=False, qdq=_qbatch_matmul_qdq),),
    attrs=(Attr("transpose_a", BOOL, False), Attr("transpose_b", BOOL, True),
           Attr("out_dtype", DTYPE_REQUIRED, "int32"), PAIR_KERNEL_ATTR),
    type_rel=_qbatch_matmul_rel, semantics=_qbatch_matmul,
    flops=lambda ins, out, a: 2.0 * out.size * (
        ins[0].shape[-2] if a["transpose_a"] else ins[0].shape[-1]),
    doc="batch_matmul of (a - za) and (b - zb), accumulated in int32: attention's scores "
        "and its weighted values, two quantized activations"))


def _qadd_rel(types, attrs):
    a = tensor(types, 0, "lhs")
    b = tensor(types, 1, "rhs")
    if a.dtype != b.dtype or not is_int(a.dtype):
        raise OpTypeError(f"qnn.add takes two integer tensors of one dtype, got {a.dtype} "
                          f"and {b.dtype}", 1)
    if a.shape != b.shape:
        raise OpTypeError(f"qnn.add takes equal shapes, got {a.shape} and {b.shape}", 1)
    for i, (name, fl) in enumerate((("lhs_scale", True), ("lhs_zero_point", False),
                                    ("rhs_scale", True), ("rhs_zero_point", False),
                                    ("output_scale", True), ("output_zero_point", False)),
                                   start=2):
        t = tensor(types, i, name)
        if t.rank != 0:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be a scalar", i)
        _param(types, i, name, a, -1, fl)
    return a


ADD_FRACTION_BITS = 24


def add_multiplier(scale: float, out_scale: float) -> int:
    """scale / out_scale in fixed point with ADD_FRACTION_BITS fractional bits."""
    return int(round(float(np.float64(scale) / np.float64(out_scale)) * 2 ** ADD_FRACTION_BITS))


def _qadd(a, b, sa, za, sb, zb, so, zo, *, method):
    """method "realize", as TVM's realize does it: the rhs is rescaled to the lhs's scale, the
    two are added in int32 at that scale, and the sum is requantized to the output's (two
    roundings). method "once": both operands are rescaled to the output's scale in fixed point
    with 24 fractional bits, added, and rounded once (half up), as ONNX Runtime's QLinearAdd
    rounds its float sum once."""
    if method == "once":
        ma, mb = add_multiplier(float(sa), float(so)), add_multiplier(float(sb), float(so))
        v = ((a.astype(np.int64) - np.int64(za)) * ma + (b.astype(np.int64) - np.int64(zb)) * mb
             + (1 << (ADD_FRACTION_BITS - 1))) >> ADD_FRACTION_BITS
        return _saturate(v + np.int64(zo), str(a.dtype))
    zero = np.int32(0)
    ra = a.astype(np.int64) - np.int64(za)
    rb = requantize_values(b, sb, zb, sa, zero, -1, "UPWARD", "int32").astype(np.int64)
    total = np.clip(ra + rb, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    return requantize_values(total, sa, zero, so, zo, -1, "UPWARD", str(a.dtype))


register(OpDef(
    "qnn.add", inputs=("lhs", "rhs", "lhs_scale", "lhs_zero_point", "rhs_scale",
                       "rhs_zero_point", "output_scale", "output_zero_point"),
    onnx=(OnnxForm("Add", reads=False, qdq=_qadd_qdq),),
    realize=_qadd_realize,
    props=frozenset({QUANT}), type_rel=_qadd_rel, semantics=_qadd,
    attrs=(Attr("method", StrKind("method", ("realize", "once")), "realize"),),
    kernel="QAdd",
    doc="the sum of two quantized tensors, quantized. Not TVM's qnn.add operator: method "
        "'realize' is what TVM's realize pass writes for an add (rhs requantized to the lhs "
        "scale, an integer add, a requantize to the output), 'once' sums both at the output "
        "scale with one rounding (as ONNX Runtime's QLinearAdd)"))


# -- the product of two quantized tensors (squeeze-excitation's gate) --------------------------

def _qmul_rel(types, attrs):
    a, b = tensor(types, 0, "lhs"), tensor(types, 1, "rhs")
    if a.dtype != b.dtype or a.dtype not in ("int8", "uint8"):
        raise OpTypeError(f"qnn.mul takes two 8-bit tensors of one dtype, got {a.dtype} and "
                          f"{b.dtype}", 1)
    shape = broadcast_shapes(a.shape, b.shape)
    if shape is None:
        raise OpTypeError(f"shapes {a.shape} and {b.shape} do not broadcast", 1)
    for i, (name, fl) in enumerate((("lhs_scale", True), ("lhs_zero_point", False),
                                    ("rhs_scale", True), ("rhs_zero_point", False),
                                    ("output_scale", True), ("output_zero_point", False)),
                                   start=2):
        if tensor(types, i, name).rank != 0:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be a scalar", i)
        _param(types, i, name, a, -1, fl)
    if attrs["out_dtype"] not in ("int8", "uint8"):
        raise OpTypeError("out_dtype must be int8 or uint8")
    return TensorType(shape, attrs["out_dtype"])


def _qmul(a, b, sa, za, sb, zb, so, zo, *, out_dtype):
    """The exact integer product (a - za)(b - zb), rescaled by sa * sb / so in fixed point
    (one rounding, half up) and saturated."""
    product = (a.astype(np.int64) - np.int64(za)) * (b.astype(np.int64) - np.int64(zb))
    scale = np.float64(sa) * np.float64(sb)
    return requantize_values(product, scale, np.int64(0), so, zo, -1, "UPWARD", out_dtype)


def _qmul_qdq(w, node):
    q = w.q8(node, 6, 7, node.attrs["out_dtype"])
    real = w.ex.emit("Mul", [w.dq(node.args[0]), w.dq(node.args[1])])
    return w.keep(node, q, w.quantize(real, q))


register(OpDef(
    "qnn.mul", inputs=("lhs", "rhs", "lhs_scale", "lhs_zero_point", "rhs_scale",
                       "rhs_zero_point", "output_scale", "output_zero_point"),
    onnx=(OnnxForm("Mul", reads=False, qdq=_qmul_qdq),),
    props=frozenset({QUANT}), type_rel=_qmul_rel, semantics=_qmul,
    kernel="QMul",
    attrs=(Attr("out_dtype", EIGHT_BIT_OUT, "uint8"),),
    doc="the product of two quantized tensors (numpy broadcasting), quantized: the integer "
        "product of the centred values, requantized once (as ONNX Runtime's QLinearMul)"))


# -- clip on quantized values ------------------------------------------------------------------

def clip_bounds(scale, zero_point, a_min: float, a_max: float, dtype: str):
    """The integer bounds of clip(dequantize(q), a_min, a_max): z + round(bound / s) (one
    per channel when the scale is), saturated to ``dtype``; an infinite bound is the dtype's
    own limit."""
    lo, hi = numerics.qrange(dtype)
    s = np.asarray(scale, np.float64).reshape(-1)
    z = np.asarray(zero_point, np.int64).reshape(-1)

    def bound(v, limit):
        if not np.isfinite(v):
            return np.full(max(s.size, z.size), limit, np.int64)
        return np.clip(z + np.rint(v / s).astype(np.int64), lo, hi)
    return bound(a_min, lo), bound(a_max, hi)


def _qclip_rel(types, attrs):
    return _quantized_input(types, attrs, "qnn.clip")


def _qclip(q, scale, zp, *, a_min, a_max, axis):
    lo, hi = clip_bounds(scale, zp, a_min, a_max, str(q.dtype))
    shape = [1] * q.ndim
    if lo.size > 1:
        shape[axis % q.ndim] = -1
    return np.clip(q, lo.reshape(shape), hi.reshape(shape)).astype(q.dtype)


register(OpDef("qnn.clip", inputs=("data", "input_scale", "input_zero_point"),
               onnx=(OnnxForm("Clip", reads=False, qdq=_qclip_qdq),),
               props=frozenset({QUANT}), kernel="QClip",
               attrs=(Attr("a_min", FLOAT_F, -math.inf), Attr("a_max", FLOAT_F, math.inf),
                      Attr("axis", INT, -1)),
               type_rel=_qclip_rel, semantics=_qclip,
               doc="clip in the integers: between z + round(a_min / s) and z + round(a_max / s)"
                   " (a_min, a_max in real units; per channel along axis when s is)"))


# -- lookup tables: any function of one 8-bit value --------------------------------------------

EIGHT_BIT = DTypeKind("dtype", allow_empty=False, choices=("int8", "uint8"))


def _codes_rel(types, attrs):
    return TensorType((256,), attrs["dtype"])


register(OpDef("qnn.codes", inputs=(), attrs=(Attr("dtype", EIGHT_BIT, "uint8"),),
               props=frozenset({QUANT}), type_rel=_codes_rel,
               semantics=lambda *, dtype: np.arange(np.iinfo(dtype).min,
                                                    np.iinfo(dtype).max + 1).astype(dtype),
               doc="every value of an 8-bit dtype in increasing order (a lookup table's "
                   "domain); a constant"))


def _lut_rel(types, attrs):
    q = tensor(types, 0, "data")
    table = tensor(types, 1, "table")
    if q.dtype not in ("int8", "uint8") or table.shape[-1:] != (256,) or table.rank > 2 or \
            table.dtype not in ("int8", "uint8"):
        raise OpTypeError(f"qnn.lut looks an 8-bit tensor up in a table of 256 8-bit values "
                          f"(or one per channel: C x 256), got {q} and {table}", 1)
    if table.rank == 2 and (not q.rank or table.shape[0] != q.shape[attrs["axis"] % q.rank]):
        raise OpTypeError(f"a table per channel ({table.shape[0]}) for {q} along axis "
                          f"{attrs['axis']}", 1)
    _param(types, 2, "output_scale", q, -1, True)
    _param(types, 3, "output_zero_point", q, -1, False)
    return TensorType(q.shape, table.dtype)


def _lut(q, table, scale, zero_point, *, axis):
    index = q.astype(np.int64) - np.iinfo(q.dtype).min     # (all 256 codes: -128 too)
    if table.ndim == 1:
        return table[index]
    channel = np.arange(table.shape[0]).reshape([-1 if i == axis % q.ndim else 1
                                                 for i in range(q.ndim)])
    return table[channel, index]


def _lut_qdq(w, node):
    """ONNX: Gather from the table (as the export writes 8-bit values) at the input's code."""
    table = w.ex.value(node.args[1])
    if table is None:
        raise w.unsupported(node)
    out_ir = str(table.dtype)
    q = w.q8(node, 2, 3, out_ir)
    shift_out = 128 if (out_ir, w.ex.activation_dtype) == ("int8", "uint8") else 0
    exported = (table.astype(np.int16) + shift_out).astype(
        w.ex.activation_dtype if out_ir == "int8" else out_ir)
    in_ir = str(w.ex.type(node.args[0]).dtype)
    in_exported = w.ex.activation_dtype if in_ir == "int8" else in_ir
    index = w.ex.emit("Cast", [w.ex.name_of(node.args[0])], to=7)        # int64
    if in_exported == "int8":
        index = w.ex.emit("Add", [index, w.ex.const(np.int64(128))])
    if table.ndim == 2:         # one table per channel: the flat table, at channel * 256 + code
        shape = w.ex.type(node.args[0]).shape
        offsets = (np.arange(table.shape[0], dtype=np.int64) * 256).reshape(
            [-1 if i == node.attrs["axis"] % len(shape) else 1 for i in range(len(shape))])
        index = w.ex.emit("Add", [index, w.ex.const(offsets)])
        exported = exported.reshape(-1)
    return w.keep(node, q, w.ex.emit("Gather", [w.ex.const(exported, "table"), index]))


register(OpDef("qnn.lut", inputs=("data", "table", "output_scale", "output_zero_point"),
               attrs=(Attr("axis", INT, 1),),
               props=frozenset({QUANT}), type_rel=_lut_rel, semantics=_lut,
               kernel="Lut",
               flops=lambda ins, out, a: float(out.size),
               onnx=(OnnxForm("Gather", reads=False, qdq=_lut_qdq),),
               doc="table[q - lowest]: any function of one 8-bit value, tabulated; with a table "
                   "per channel (C x 256), table[c, q - lowest] for the channel c along axis; "
                   "the output has the scale and zero point given (the tables were quantized "
                   "with them)"))


# -- averages of 8-bit values -----------------------------------------------------------------
# qnn.avg_pool2d and qnn.global_avg_pool2d (TVM's names) take 8-bit values to 8-bit values:
# each is defined as dequantize, the float pool, quantize (ONNX Runtime's QLinearAveragePool
# computes the same way), so the rule that introduces one is that definition read backwards.

def _qpool(float_name: str, kernel: str | None = None):
    float_op = get_op(float_name)

    def rel(types, attrs):
        q = _quantized_input(types, {"axis": -1}, "qnn." + float_name[3:])
        if q.dtype not in ("int8", "uint8"):
            raise OpTypeError(f"qnn.{float_name[3:]} averages 8-bit values, got {q.dtype}", 0)
        _param(types, 3, "output_scale", q, -1, True)
        _param(types, 4, "output_zero_point", q, -1, False)
        pool_attrs = {k: v for k, v in attrs.items() if k != "out_dtype"}
        out = float_op.type_rel([TensorType(q.shape, "float32")], pool_attrs)
        return TensorType(out.shape, attrs["out_dtype"])

    def semantics(q, s, z, so, zo, *, out_dtype, **pool_attrs):
        real = float_op.semantics(_dequantize(q, s, z, axis=-1), **pool_attrs)
        return _quantize(real, so, zo, axis=-1, out_dtype=out_dtype)

    def qdq(w, node):
        out = w.q8(node, 3, 4, node.attrs["out_dtype"])
        real = float_op.onnx[0].write(w.ex, node, [w.dq(node.args[0])])
        return w.keep(node, out, w.quantize(real, out))

    register(OpDef(
        "qnn." + float_name[3:], inputs=("data", "input_scale", "input_zero_point",
                                        "output_scale", "output_zero_point"),
        attrs=float_op.attrs + (Attr("out_dtype", EIGHT_BIT_OUT, "uint8"),),
        props=frozenset({QUANT}), type_rel=rel, semantics=semantics, flops=float_op.flops,
        onnx=(OnnxForm(float_op.onnx[0].op_type, reads=False, qdq=qdq),), kernel=kernel,
        doc=f"{float_name} of 8-bit values to 8-bit values: quantize({float_name}(dequantize("
            f"data, input_scale, input_zero_point)), output_scale, output_zero_point)"))


_qpool("nn.avg_pool2d", kernel="QAvgPool2D")
_qpool("nn.global_avg_pool2d", kernel="GlobalAverage")


# -- a quantized convolution with its whole epilogue --------------------------------------------

FQ_INPUTS = ("data", "weight", "bias", "input_zero_point", "kernel_zero_point", "input_scale",
             "kernel_scale", "acc_scale", "acc_zero_point", "output_scale", "output_zero_point")


def _fqconv_rel(types, attrs):
    acc = _qcompute_rel(conv2d_rel)(types[:2] + types[3:7], {**attrs, "out_dtype": "int32"})
    b = tensor(types, 2, "bias")
    shape = broadcast_shapes(acc.shape, b.shape)  # the bias broadcasts, as add does
    if b.dtype != "int32" or shape is None:
        raise OpTypeError(f"bias must be int32 and broadcast with {acc.shape}, got {b}", 2)
    q = TensorType(shape, "int32")
    for i, (name, fl) in enumerate((("acc_scale", True), ("acc_zero_point", False),
                                    ("output_scale", True), ("output_zero_point", False)),
                                   start=7):
        _param(types, i, name, q, attrs["axis"], fl)
    return TensorType(shape, attrs["out_dtype"])


def _fqconv(x, w, b, zx, zw, sx, sw, s1, z1, s2, z2, *, activation, a_min, a_max, axis,
            rounding, out_dtype, **conv):
    acc = _qconv2d(x, w, zx, zw, sx, sw, **conv, out_dtype="int32").astype(np.int64) + b
    acc = np.clip(acc, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    if activation == "relu":
        acc = np.maximum(acc, 0)
    elif activation == "clip":
        acc = _qclip(acc, s1, z1, a_min=a_min, a_max=a_max, axis=axis)
    return requantize_values(acc, s1, z1, s2, z2, axis, rounding, out_dtype)


def _unfuse_qconv(args, attrs):
    """fused.qconv2d as the chain it stands for (the partition and realize views use it)."""
    from ..core.nodes import Call, freeze_attrs
    from .registry import get_op
    x, w, b, zx, zw, sx, sw, s1, z1, s2, z2 = args
    conv_op = get_op("qnn.conv2d")
    conv_attrs = {k: v for k, v in attrs.items() if k in conv_op.attr_map}
    conv_attrs["out_dtype"] = "int32"
    y = Call(op=conv_op, args=(x, w, zx, zw, sx, sw),
             attrs=freeze_attrs(conv_op.canonical_attrs(conv_attrs)))
    y = Call(op=get_op("add"), args=(y, b))
    if attrs["activation"] == "relu":
        y = Call(op=get_op("nn.relu"), args=(y,))
    elif attrs["activation"] == "clip":
        clip = get_op("qnn.clip")
        y = Call(op=clip, args=(y, s1, z1), attrs=freeze_attrs(clip.canonical_attrs(
            {"a_min": attrs["a_min"], "a_max": attrs["a_max"], "axis": attrs["axis"]})))
    rq = get_op("qnn.requantize")
    return Call(op=rq, args=(y, s1, z1, s2, z2), attrs=freeze_attrs(rq.canonical_attrs(
        {"axis": attrs["axis"], "rounding": attrs["rounding"], "out_dtype": attrs["out_dtype"]})))


register(OpDef(
    "fused.qconv2d", inputs=FQ_INPUTS, onnx=(OnnxForm("Conv", reads=False, qdq=_fqconv_qdq),),
                                       props=frozenset({COMPUTE, QUANT}),
    channels_last=_qconv_channels_last,
    unfuse=_unfuse_qconv,
    kernel="FusedQConv2D",
    attrs=tuple(a for a in CONV2D_ATTRS if a.name != "out_dtype")
    + (Attr("activation", StrKind("activation", ("none", "relu", "clip")), "none"),
       Attr("a_min", FLOAT_F, -math.inf), Attr("a_max", FLOAT_F, math.inf),
       Attr("axis", INT, 1), Attr("rounding", ROUNDING, "UPWARD"),
       Attr("out_dtype", QDTYPE, "int8"), KERNEL_ATTR),
    type_rel=_fqconv_rel, semantics=_fqconv, flops=conv2d_flops,
    doc="requantize(activation(qnn.conv2d(...) + bias)): an int8 convolution with its int32 "
        "bias, relu and requantization in one kernel"))


# -- a quantized convolution summed with a residual, in its epilogue ---------------------------

FQA_INPUTS = FQ_INPUTS + ("residual", "lhs_scale", "lhs_zero_point", "residual_scale",
                          "residual_zero_point", "sum_scale", "sum_zero_point")


def _fqconv_add_rel(types, attrs):
    out = _fqconv_rel(types[:11], attrs)
    r = tensor(types, 11, "residual")
    if r != out:
        raise OpTypeError(f"the residual must be {out}, as the convolution's output, got {r}",
                          11)
    for i, name in enumerate(FQA_INPUTS[12:], start=12):
        if tensor(types, i, name).rank != 0:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be a scalar", i)
        _param(types, i, name, r, -1, name.endswith("scale"))
    return out


def _fqconv_add(x, w, b, zx, zw, sx, sw, s1, z1, s2, z2, r, sa, za, sr, zr, so, zo, **attrs):
    y = _fqconv(x, w, b, zx, zw, sx, sw, s1, z1, s2, z2, **attrs)
    return _qadd(y, r, sa, za, sr, zr, so, zo, method="once")


def _unfuse_qconv_add(args, attrs):
    """qnn.add(method="once") of the unfused convolution and the residual."""
    return _call("qnn.add", _unfuse_qconv(args[:11], attrs), *args[11:], method="once")


def _fqconv_add_qdq(w, node):
    """The convolution's QDQ form (its output quantized to s2, z2), read back at the sum's
    lhs parameters, then the sum's."""
    y, _ = w.conv(node, bias=2)
    dtype = node.attrs["out_dtype"]
    conv = w.quantize(write_epilogue(w.ex, y, node.attrs), w.q8(node, 9, 10, dtype))
    lhs = w.q8(node, 12, 13, dtype)
    real = w.ex.emit("DequantizeLinear", [conv, lhs.scale, lhs.zero_point])
    q = w.q8(node, 16, 17, dtype)
    return w.keep(node, q, w.quantize(w.ex.emit("Add", [real, w.dq(node.args[11])]), q))


register(OpDef(
    "fused.qconv2d_add", inputs=FQA_INPUTS,
    onnx=(OnnxForm("Conv", reads=False, qdq=_fqconv_add_qdq),),
    props=frozenset({COMPUTE, QUANT}),
    channels_last=_qconv_channels_last,
    unfuse=_unfuse_qconv_add,
    kernel="FusedQConv2DAdd",
    attrs=get_op("fused.qconv2d").attrs,
    type_rel=_fqconv_add_rel, semantics=_fqconv_add,
    flops=lambda ins, out, attrs: conv2d_flops(ins, out, attrs) + 4.0 * out.size,
    doc="qnn.add(fused.qconv2d(x, ..., output_scale, output_zero_point), residual, lhs_scale, "
        "lhs_zero_point, residual_scale, residual_zero_point, sum_scale, sum_zero_point, "
        "method=\"once\"): a fused int8 convolution summed with a residual of its shape in its "
        "epilogue"))
