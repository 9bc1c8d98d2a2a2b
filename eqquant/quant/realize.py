"""The realize view: a quantized program in the primitive ops of TVM's ``realize`` output
(the seed's final listing): no QNN op is left, only casts, multiplies, rounds, clips,
int32 convolutions and ``fixed_point_multiply``.

    qnn.quantize(x, s, 0)        multiply(x, 1/s); round; clip; cast(int8)
    qnn.conv2d(x, w, 0, 0, ...)  nn.conv2d(x, w, ..., out_dtype="int32")
    qnn.requantize(q, s1, 0, s2, 0)   cast(int64); fixed_point_multiply; clip;
                                      (cast(int32), from an int32 accumulator); cast(int8)
    qnn.add(a, b, ...)           cast(b, int32); fixed_point_multiply (b to a's scale);
                                 add(cast(a, int32), .); then the requantize sequence
    qnn.dequantize(q, s, 0)      cast(float32); multiply(s)

It computes what the QNN program computes (the tests check it), for symmetric parameters
(zero points 0) and per-tensor scales.
"""
from __future__ import annotations

import numpy as np

from ..errors import EqquantError
from ..core.nodes import Call, Constant, Expr, Function, Module, Scalar, freeze_attrs, rewrite
from ..ir.typecheck import infer_types
from ..ops.registry import get_op
from ..ops.numerics import qrange
from ..ops.fixed_point import quantize_multiplier


def _call(name: str, *args: Expr, **attrs) -> Call:
    op = get_op(name)
    return Call(op=op, args=args, attrs=freeze_attrs(op.canonical_attrs(attrs)))


def _scalar_value(e: Expr, what: str) -> float:
    if isinstance(e, Scalar):
        return float(e.value)
    if isinstance(e, Constant) and e.data is not None and np.asarray(e.data).size == 1:
        return float(np.asarray(e.data).reshape(()))
    raise EqquantError(f"the realize view needs a constant per-tensor {what}", e.loc)


def _zero(e: Expr, what: str) -> None:
    if _scalar_value(e, what) != 0:
        raise EqquantError(f"the realize view takes symmetric quantization ({what} must be 0)",
                           e.loc)


def _requantize(q: Expr, in_dtype: str, ratio: float, out_dtype: str) -> Expr:
    """cast(int64); fixed_point_multiply; clip; [cast(int32), when rescaling an int32
    accumulator, as TVM's realize does]; cast(out_dtype)."""
    m, shift = quantize_multiplier(ratio)
    lo, hi = qrange(out_dtype)
    v = _call("cast", q, dtype="int64")
    v = _call("fixed_point_multiply", v, multiplier=m, shift=shift)
    v = _call("clip", v, a_min=float(lo), a_max=float(hi))
    if in_dtype == "int32":
        v = _call("cast", v, dtype="int32")
    return _call("cast", v, dtype=out_dtype)


def unfuse_all(mod: Module) -> Module:
    """Every fused op written as the chain it stands for (its registry ``unfuse``)."""
    def visit(node, kids):
        if isinstance(node, Call) and not isinstance(node.op, Expr) and node.op.unfuse:
            return node.op.unfuse(kids, node.attrs)
        return None
    fn = mod.main
    return Module({"main": Function(params=fn.params, body=rewrite(fn.body, visit),
                                    ret_type=fn.ret_type)}, version=mod.version)


def realize_view(mod: Module) -> Module:
    mod = unfuse_all(mod)
    types = infer_types(mod)

    def visit(node, kids):
        if not isinstance(node, Call) or isinstance(node.op, Expr):
            return None
        name, a = node.op.name, node.attrs
        if name == "qnn.quantize":
            x, s, z = kids
            _zero(z, "the zero point")
            lo, hi = qrange(a["out_dtype"])
            v = _call("multiply", x, Scalar(value=float(np.float32(1 / _scalar_value(s, "scale"))),
                                            dtype="float32"))
            v = _call("clip", _call("round", v), a_min=float(lo), a_max=float(hi))
            return _call("cast", v, dtype=a["out_dtype"])
        if name == "qnn.dequantize":
            q, s, z = kids
            _zero(z, "the zero point")
            return _call("multiply", _call("cast", q, dtype="float32"),
                         Scalar(value=_scalar_value(s, "scale"), dtype="float32"))
        if name == "qnn.conv2d":
            x, w, zx, zw = kids[:4]
            _zero(zx, "the input zero point")
            _zero(zw, "the kernel zero point")
            return _call("nn.conv2d", x, w, **{k: v for k, v in a.items()})
        if name == "qnn.requantize":
            q, s1, z1, s2, z2 = kids
            _zero(z1, "the input zero point")
            _zero(z2, "the output zero point")
            return _requantize(q, types[id(node.args[0])].dtype,
                               _scalar_value(s1, "scale") / _scalar_value(s2, "scale"),
                               a["out_dtype"])
        if name == "qnn.add":
            if node.attrs["method"] != "realize":
                raise EqquantError("the realize view writes TVM's qnn.add (method realize); "
                                   "this one rounds once (a uint8 program's add)", node.loc)
            lhs, rhs, sa, za, sb, zb, so, zo = kids
            for z in (za, zb, zo):
                _zero(z, "zero point")
            m, shift = quantize_multiplier(_scalar_value(sb, "scale") /
                                           _scalar_value(sa, "scale"))
            r = _call("fixed_point_multiply", _call("cast", rhs, dtype="int32"),
                      multiplier=m, shift=shift)
            total = _call("add", _call("cast", lhs, dtype="int32"), _call("cast", r, dtype="int32"))
            return _requantize(total, "int32",
                               _scalar_value(sa, "scale") / _scalar_value(so, "scale"),
                               str(types[id(node)].dtype))
        if name.startswith("qnn."):
            raise EqquantError(f"the realize view has no form for {name}", node.loc)
        return None

    fn = mod.main
    return Module({"main": Function(params=fn.params, body=rewrite(fn.body, visit),
                                    ret_type=fn.ret_type)}, version=mod.version)
