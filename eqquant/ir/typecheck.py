"""Type and shape inference for every value, driven by the registry's type relations.

    types = check_module(mod)        # {id(node): Type}; raises TypeCheckError
    types[id(mod.main.body)]         # Tensor[(1, 64, 56, 56), float32]

Errors name the op and the argument and point at the call: ``model.ir:4:8: type error:
nn.conv2d: argument 2 ('weight') must have rank 4, got Tensor[(3, 3), float32]``. The
``/* ty=... */`` annotations a program was written with are checked against what is inferred.
"""
from __future__ import annotations

from ..errors import TypeCheckError
from ..ops.registry import OpTypeError, is_scale
from ..core.nodes import (Call, Constant, Expr, Function, GlobalVar, Module, Scalar, Tuple,
                          TupleGetItem, Var, post_order)
from ..core.types import (Dim, FuncType, SizeUnknown, TensorType, TupleType, Type, is_static,
                          size_label, size_names, size_problem)


class Inferer:
    def __init__(self, mod: Module | None):
        self.mod = mod
        self.types: dict[int, Type] = {}
        self._alive: list[Expr] = []  # ids are keys: keep their nodes alive so none is reused
        self.global_types: dict[str, FuncType] = {}
        self.in_progress: set[str] = set()

    def remember(self, node: Expr, ty: Type) -> None:
        """Record a type worked out elsewhere (keeping the node alive, as for every key)."""
        self.types[id(node)] = ty
        self._alive.append(node)

    def global_type(self, gv: GlobalVar) -> FuncType:
        if gv.name in self.global_types:
            return self.global_types[gv.name]
        if self.mod is None or gv.name not in self.mod.functions:
            raise TypeCheckError(f"@{gv.name} is not defined", gv.loc)
        if gv.name in self.in_progress:
            raise TypeCheckError(f"@{gv.name} is recursive, which is not supported", gv.loc)
        self.in_progress.add(gv.name)
        t = self.function(self.mod.functions[gv.name])
        self.in_progress.discard(gv.name)
        self.global_types[gv.name] = t
        return t

    def function(self, fn: Function) -> FuncType:
        body = self.expr(fn.body)
        if fn.ret_type is not None and fn.ret_type != body:
            raise TypeCheckError(f"the function is declared to return {fn.ret_type} but its "
                                 f"body has type {body}", fn.loc)
        t = FuncType(tuple(p.type for p in fn.params), body)
        self.types[id(fn)] = t
        return t

    def expr(self, root: Expr) -> Type:
        for node in post_order(root, self.types):   # only the nodes not typed yet
            if id(node) not in self.types:
                self.types[id(node)] = self.node(node)
                self._alive.append(node)
        return self.types[id(root)]

    def node(self, node: Expr) -> Type:
        if isinstance(node, (Var, Constant)):
            problem = size_problem(node.type)
            if problem:
                raise TypeCheckError(problem, node.loc)
            return node.type
        if isinstance(node, Scalar):
            return node.type
        if isinstance(node, GlobalVar):
            return self.global_type(node)
        if isinstance(node, Function):
            return self.function(node)
        if isinstance(node, Tuple):
            return TupleType(tuple(self.types[id(f)] for f in node.fields))
        if isinstance(node, TupleGetItem):
            t = self.types[id(node.tuple)]
            if not isinstance(t, TupleType):
                raise TypeCheckError(f"projection .{node.index} of a value of type {t}, which "
                                     f"is not a tuple", node.loc)
            if not 0 <= node.index < len(t.fields):
                raise TypeCheckError(f"projection .{node.index} out of range for {t}", node.loc)
            return t.fields[node.index]
        if isinstance(node, Call):
            return self.call(node)
        raise TypeCheckError(f"cannot type {type(node).__name__}", getattr(node, "loc", None))

    def call(self, node: Call) -> Type:
        arg_types = [self.types[id(a)] for a in node.args]
        if isinstance(node.op, Expr):
            ft = self.types[id(node.op)]
            if not isinstance(ft, FuncType):
                raise TypeCheckError(f"calling a value of type {ft}, which is not a function",
                                     node.loc)
            if len(ft.params) != len(arg_types):
                raise TypeCheckError(f"the function takes {len(ft.params)} arguments, got "
                                     f"{len(arg_types)}", node.loc)
            for i, (want, got) in enumerate(zip(ft.params, arg_types)):
                if want != got:
                    raise TypeCheckError(f"argument {i + 1} has type {got}, the function "
                                         f"expects {want}", node.loc)
            return ft.ret
        op = node.op
        try:
            out = op.type_rel(arg_types, node.attrs)
        except OpTypeError as e:
            raise TypeCheckError(f"{op.name}: {e.message}", node.loc, e.arg) from None
        except (OverflowError, ValueError, MemoryError) as e:   # sizes past any real tensor
            raise TypeCheckError(f"{op.name}: its attributes give impossible sizes ({e})",
                                 node.loc) from None
        except TypeError as e:
            if is_static(TupleType(tuple(arg_types))):
                raise
            # a question about a size known only at run time (SizeUnknown), or a relation
            # that needs every size: either way it does not hold for every size
            raise TypeCheckError(f"{op.name}: it does not hold for every size of "
                                 f"{', '.join(sorted_sizes(arg_types))}"
                                 + (f" ({e})" if isinstance(e, SizeUnknown) else "")
                                 + "; fix the size with --shape, or name equal sizes alike "
                                 "(?n)", node.loc) from None
        problem = size_problem(out)
        if problem:
            raise TypeCheckError(f"{op.name}: {problem}", node.loc)
        for name, arg in zip(op.inputs, node.args):
            bad = _not_a_scale(arg) if is_scale(name) else None
            if bad is not None:
                raise TypeCheckError(f"{op.name}: its {name} must be positive and finite, "
                                     f"got {bad}", getattr(arg, "loc", None) or node.loc)
        ratio = _rescale(op, node.args, arg_types[0] if arg_types else None)
        if ratio is not None:
            raise TypeCheckError(f"{op.name}: it rescales {arg_types[0].dtype} values by "
                                 f"input_scale / output_scale = {ratio[0]:.3g}, which its "
                                 f"fixed-point product holds only below {ratio[1]:g} (the "
                                 f"product of a value and a Q31 multiplier must stay within "
                                 f"int64)", node.loc)
        return out


def infer_types(mod: Module) -> dict[int, Type]:
    """Types of every node of every function, keyed by ``id(node)``."""
    inf = Inferer(mod)
    for name in mod.functions:
        inf.global_type(GlobalVar(name=name))
    return inf.types


def infer_expr(expr: Expr) -> Type:
    return Inferer(None).expr(expr)


def check_module(mod: Module) -> dict[int, Type]:
    """Infer every type and check the program's ``/* ty=... */`` annotations against them."""
    types = infer_types(mod)
    for node, ty, loc in mod.annotations:
        got = types.get(id(node))
        if got is not None and not _fits(ty, got):
            raise TypeCheckError(f"the annotation says {ty} but the value has type {got}", loc)
    return types


def sorted_sizes(types) -> list[str]:
    return [size_label(n) for n in sorted(set().union(*(size_names(t) for t in types)))]


def _fits(annotated: Type, inferred: Type) -> bool:
    """An annotation's type against the inferred one; a ``?`` in the annotation (a size of
    its own, numbered apart from the program's) stands for any size."""
    if isinstance(annotated, TensorType) and isinstance(inferred, TensorType):
        return (annotated.dtype == inferred.dtype and annotated.rank == inferred.rank
                and all(a == b or (isinstance(a, Dim) and str(a) == "?")
                        for a, b in zip(annotated.shape, inferred.shape)))
    if isinstance(annotated, TupleType) and isinstance(inferred, TupleType):
        return len(annotated.fields) == len(inferred.fields) and all(
            map(_fits, annotated.fields, inferred.fields))
    return annotated == inferred


def _rescale(op, args, data) -> tuple[float, float] | None:
    """Of an op that rescales its integers (``data``'s type) from ``input_scale`` to
    ``output_scale`` (and no other scale: a requantize, an integer average), the literal
    ratio and the bound it passes, where its fixed-point product could leave int64: a
    value of b bits, shifted left by the ratio's exponent and multiplied by a Q31
    multiplier, stays below 2**62 while the ratio is below 2**(32 - b) (1 for int32, 2**24
    for 8 bits). Else None. (A ratio however small is held: the shift leaves 0, which is
    the rounded result.)"""
    import numpy as np
    names = dict(zip(op.inputs, args))
    if not {"input_scale", "output_scale"} <= set(names) or any(
            is_scale(n) for n in names if n not in ("input_scale", "output_scale")):
        return None
    if not isinstance(data, TensorType) or not data.dtype.startswith(("int", "uint")):
        return None
    sides = [_literal(names[n]) for n in ("input_scale", "output_scale")]
    if any(v is None or not v.size or not np.all(np.isfinite(v) & (v > 0)) for v in sides):
        return None
    bound = 2.0 ** (32 - np.iinfo(data.dtype).bits)
    ratio = float(sides[0].max() / sides[1].min())
    return (ratio, bound) if ratio >= bound else None


def _literal(arg: Expr):
    import numpy as np
    if isinstance(arg, Scalar):
        return np.asarray(arg.value, np.float64).reshape(-1)
    if isinstance(arg, Constant) and arg.data is not None:
        return np.asarray(arg.data, np.float64).reshape(-1)
    return None


def _not_a_scale(arg: Expr) -> float | None:
    """The first value of a literal scale (a Scalar, or a Constant's data) that is not a
    positive finite number, else None (a value computed at run time: not known here)."""
    import numpy as np
    values = _literal(arg)
    if values is None:
        return None
    bad = values[~(np.isfinite(values) & (values > 0))]
    return float(bad.reshape(-1)[0]) if bad.size else None
