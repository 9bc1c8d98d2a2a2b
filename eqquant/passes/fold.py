"""Constant folding (TVM's FoldConstant): every subexpression whose operands are all constants
is evaluated with the reference interpreter and becomes a new constant; then constants are
renumbered 0, 1, ... in the order they are first used.

    conv2d(%x, multiply(meta[0], reshape(divide(meta[1], sqrt(add(meta[2], 1e-05f))), ...)))
    ==>  conv2d(%x, meta[0])       # the scaled weight, computed once
"""
from __future__ import annotations

import numpy as np

from ..core.nodes import (Call, Constant, Expr, Function, Module, Scalar, Tuple, TupleGetItem,
                          iter_functions, post_order, rewrite)
from ..ir.params import module_constants
from ..core.types import type_of_array
from ..ops.registry import IDENTITY


def _is_value(e: Expr) -> bool:
    return (isinstance(e, Constant) and e.data is not None) or isinstance(e, Scalar)


def _value(e: Expr):
    return e.data


def fold_constants(mod: Module) -> Module:
    counter = [max(module_constants(mod), default=-1) + 1]

    def make(value) -> Expr:
        arr = np.asarray(value)
        if arr.ndim == 0 and arr.dtype.kind in "fiub" and arr.dtype != np.float16:
            v = arr.item()
            return Scalar(value=v, dtype=str(arr.dtype))
        c = Constant(index=counter[0], type=type_of_array(arr), data=np.ascontiguousarray(arr))
        counter[0] += 1
        return c

    def visit(node: Expr, children):
        if isinstance(node, Call) and not isinstance(node.op, Expr) and \
                (children or not node.op.inputs) and all(_is_value(c) for c in children):
            if IDENTITY in node.op.props:
                return children[0]
            out = node.op.semantics(*[_value(c) for c in children], **node.attrs)
            if not isinstance(out, tuple):
                return make(out)
        if isinstance(node, TupleGetItem):
            t = children[0]
            if isinstance(t, Tuple):
                return t.fields[node.index]
            if isinstance(t, Call) and not isinstance(t.op, Expr) and \
                    all(_is_value(c) for c in t.args):
                return make(t.op.semantics(*[_value(c) for c in t.args], **t.attrs)[node.index])
        return None

    with np.errstate(all="ignore"):
        functions = {}
        for name, fn in mod.functions.items():
            functions[name] = Function(params=fn.params, body=rewrite(fn.body, visit),
                                       ret_type=fn.ret_type, attrs=fn.attrs, name=fn.name,
                                       loc=fn.loc)
    return renumber_constants(Module(functions, version=mod.version))


def renumber_constants(mod: Module) -> Module:
    """Constants numbered 0, 1, ... in order of first use (as TVM prints them)."""
    order: dict[int, int] = {}
    for fn in mod.functions.values():
        for f in [fn, *iter_functions(fn.body)]:
            for node in post_order(f.body):
                if isinstance(node, Constant) and node.index not in order:
                    order[node.index] = len(order)

    def visit(node, children):
        if isinstance(node, Constant) and order[node.index] != node.index:
            return Constant(index=order[node.index], type=node.type, data=node.data,
                            loc=node.loc)
        return None

    return Module({name: Function(params=fn.params, body=rewrite(fn.body, visit),
                                  ret_type=fn.ret_type, attrs=fn.attrs, name=fn.name,
                                  loc=fn.loc)
                   for name, fn in mod.functions.items()}, version=mod.version)
