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
(zero points 0) and per-tensor scales. Each op's form is its registry entry's ``realize``
(``eqquant/ops/qnn.py``); this module only walks the program.
"""
from __future__ import annotations

from ..errors import EqquantError
from ..core.nodes import Call, Expr, Function, Module, rewrite
from ..ir.typecheck import infer_types
from ..ops.registry import INPUT_SCALE, OUTPUT_SCALE, QUANT
from ..ops.qnn import RealizeError


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
    """Each op with a realize form (``OpDef.realize``) written in it; a quantized op (one with
    an input or output scale) without one is an error naming it."""
    mod = unfuse_all(mod)
    types = infer_types(mod)

    def visit(node, kids):
        if not isinstance(node, Call) or isinstance(node.op, Expr):
            return None
        op = node.op
        if op.realize is None:
            if QUANT in op.props and (op.role(INPUT_SCALE) is not None
                                      or op.role(OUTPUT_SCALE) is not None):
                raise EqquantError(f"the realize view has no form for {op.name}", node.loc)
            return None
        try:
            return op.realize(kids, node.attrs, [types[id(a)] for a in node.args],
                              types[id(node)])
        except RealizeError as e:
            raise EqquantError(f"{op.name}: {e}", node.loc) from None

    fn = mod.main
    return Module({"main": Function(params=fn.params, body=rewrite(fn.body, visit),
                                    ret_type=fn.ret_type)}, version=mod.version)
