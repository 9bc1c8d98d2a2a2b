"""Sizes known only at run time (``?n``): binding them, and the batch a program runs over.

    sizes = input_sizes(mod.main, {"data": x})     # {"N": 8}: read off the inputs' shapes
    at8 = bind_sizes(mod, sizes)                     # the program at that size: static types
    batch_size(mod)                                  # "N": the size on every input's and
                                                     # the output's leading axis, else None

A program keeps its sizes open through the rules and extraction (a guard matches a symbolic
size only where the rule holds for every size); what runs a program (the executor, a
library) runs it at the sizes of the inputs it is given.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..core.nodes import Call, Function, Module, Var, freeze_attrs, rewrite
from ..core.types import (Dim, TensorType, TupleType, Type, bind_type, evaluate_dim, is_static,
                          match_shape, size_label, size_names)
from ..errors import EvalError


def is_symbolic(mod: Module) -> bool:
    """Whether ``mod``'s entry takes an input whose sizes are known only at run time."""
    return not all(is_static(p.type) for p in mod.main.params)


def open_sizes(mod: Module) -> list[str]:
    """The names of the entry's sizes known only at run time, in the order the inputs give
    them."""
    seen: dict[str, None] = {}
    for p in mod.main.params:
        if isinstance(p.type, TensorType):
            for d in p.type.shape:
                if isinstance(d, Dim):
                    seen.update(dict.fromkeys(d.names))
    return list(seen)


def leading_size(mod: Module) -> str | None:
    """The open size on the leading axis of the entry's inputs (the batch), where one is."""
    return next((name for name in map(_lead, mod.main.params) if name is not None), None)


def _lead(p: Var) -> str | None:
    """The name of the size on ``p``'s leading axis, where it is one name alone."""
    t = p.type
    return t.shape[0].name if isinstance(t, TensorType) and t.rank and \
        isinstance(t.shape[0], Dim) else None


def _leads(t, name: str) -> bool:
    """Whether ``t`` (or each field of a tuple) carries the size ``name`` on its leading axis
    alone, or not at all."""
    fields = t.fields if isinstance(t, TupleType) else (t,)
    return all(name not in size_names(f) or (
        isinstance(f, TensorType) and f.rank and f.shape[0] == Dim.named(name)
        and not size_names(TensorType(f.shape[1:], f.dtype))) for f in fields)


def input_sizes(fn: Function, inputs: Mapping[str, Any]) -> dict[str, int]:
    """The value of each open size, read off the shapes of ``inputs`` (by parameter name;
    those not given are skipped): EvalError where two inputs disagree on one size."""
    import numpy as np
    sizes: dict[str, int] = {}
    for p in fn.params:
        if p.name in inputs and isinstance(p.type, TensorType) and not is_static(p.type):
            match_shape(p.name, tuple(np.shape(inputs[p.name])), p.type, sizes)
    return sizes


def bind_sizes(mod: Module, sizes: Mapping[str, int], new: dict | None = None) -> Module:
    """``mod`` with its entry's open sizes fixed (each named in ``sizes``): its inputs'
    types and the shapes its attributes name bound, every other type follows by inference.
    EvalError naming a size not given. ``new``, where given, receives each node's id -> the
    node standing for it (``core.nodes.rewrite``'s)."""
    missing = [n for n in open_sizes(mod) if n not in sizes]
    if missing:
        raise EvalError("no value for the size" + ("s " if len(missing) > 1 else " ")
                        + ", ".join(map(size_label, missing)))
    fn = mod.main
    swap = {id(p): Var(name=p.name, type=bind_type(p.type, sizes), loc=p.loc)
            for p in fn.params if not is_static(p.type)}
    if not swap:
        return mod

    def visit(node, children):
        if id(node) in swap:
            return swap[id(node)]
        if isinstance(node, Call) and any(_holds_size(v) for v in node.attrs.values()):
            attrs = freeze_attrs({k: _bound(v, sizes) for k, v in node.attrs.items()})
            return Call(op=node.op, args=children, attrs=attrs, name=node.name,
                        loc=node.loc, origin=node.origin)
        return None
    body = rewrite(fn.body, visit, new)
    params = tuple(swap.get(id(p), p) for p in fn.params)
    ret = bind_type(fn.ret_type, sizes) if fn.ret_type is not None else None
    main = Function(params=params, body=body, ret_type=ret, attrs=fn.attrs, name=fn.name,
                    loc=fn.loc)
    return Module({**mod.functions, "main": main}, version=mod.version)


def _holds_size(v) -> bool:
    return isinstance(v, Dim) or (isinstance(v, (list, tuple)) and any(map(_holds_size, v)))


def _bound(v, sizes):
    """An attribute value with its sizes known at run time replaced by their values."""
    if isinstance(v, Dim):
        return evaluate_dim(v, sizes)
    if isinstance(v, (list, tuple)):
        return type(v)(_bound(x, sizes) for x in v)
    return v


def batch_size(mod: Module, out_type: Type | None = None) -> str | None:
    """The size a program runs its samples over: the one name on the leading axis of every
    input that has open sizes, appearing nowhere else in them, and on the leading axis of
    every output (``out_type``: the entry's inferred result type). None where there is none."""
    opened = [p for p in mod.main.params if not is_static(p.type)]
    names = {_lead(p) for p in opened}
    if len(names) != 1 or None in names:
        return None
    name = names.pop()
    outs = out_type.fields if isinstance(out_type, TupleType) else (out_type,)
    if not all(_leads(p.type, name) for p in opened) or not all(
            isinstance(t, TensorType) and t.rank and t.shape[0] == Dim.named(name) and
            _leads(t, name) for t in outs if t is not None):
        return None
    return name


def per_sample_problem(mod: Module, name: str) -> str | None:
    """Why ``mod`` may not run its batch (the size ``name``, ``batch_size``) one sample at a
    time, or None where every op maps sample i of its inputs to sample i of its result: each
    value that carries the size carries it on its leading axis alone, no op drops it (a
    reduction over the batch, a scale computed over the whole batch), and no op's axis
    attribute names the leading axis of a value that carries it (a softmax or a
    concatenation over the batch). Value types are enough to see all three."""
    from ..core.nodes import Call, Expr, post_order
    from ..ir.typecheck import infer_types
    from ..ir.printer import value_labels
    types = infer_types(mod)
    labels = value_labels(mod.main)
    def carries(t) -> bool:
        return name in size_names(t)

    for node in post_order(mod.main.body):
        if not isinstance(node, Call) or isinstance(node.op, Expr):
            continue
        ins = [types[id(a)] for a in node.args]
        if not any(map(carries, ins)):
            continue
        where = f"{labels.get(id(node), node.op.name)} = {node.op.name}"
        out = types[id(node)]
        if not all(_leads(t, name) for t in ins) or not _leads(out, name):
            return f"{where} moves ?{name} off the leading axis ({out})"
        if not carries(out):
            return f"{where} computes over the whole batch ({out} from {ins[0]})"
        first = ins[0] if isinstance(ins[0], TensorType) and carries(ins[0]) else None
        for key in ("axis", "axes"):
            value = node.attrs.get(key)
            if first is None or value is None or first.rank == 0:
                continue
            axes = [value] if isinstance(value, int) else list(value)
            axes = [a % first.rank for a in axes if isinstance(a, int)]
            if sorted(axes) == list(range(first.rank)) and len(axes) == first.rank:
                continue            # a permutation (transpose): the types above tell
            if 0 in axes:
                return f"{where} works along the batch axis ({key}={value})"
    return None
