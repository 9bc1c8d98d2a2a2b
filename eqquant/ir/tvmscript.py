"""TVM Relax's TVMScript as a second text format: read into a :class:`Module`, print back.

The subset read is what TVM's ``mod.show()`` prints for a dataflow program::

    >>> text = '''
    ... @I.ir_module
    ... class Module:
    ...     @R.function
    ...     def main(x: R.Tensor((2, 3), dtype="float32")) -> R.Tensor((2, 3), dtype="float32"):
    ...         with R.dataflow():
    ...             lv: R.Tensor((2, 3), dtype="float32") = R.nn.relu(x)
    ...             R.output(lv)
    ...         return lv
    ... '''
    >>> print(parse_tvmscript(text))
    #[version = "0.0.5"]
    def @main(%x: Tensor[(2, 3), float32]) -> Tensor[(2, 3), float32] {
      %lv = nn.relu(%x);
      %lv
    }

A call ``R.<name>(...)`` is the registry op ``<name>`` (``R.nn.conv2d`` is ``nn.conv2d``),
its tensors positional and its attributes as keywords, unless the op's ``relax`` form says
otherwise (:class:`~eqquant.ops.registry.RelaxForm`: ``R.concat``, ``R.reshape(x,
R.shape([...]))``, ``R.expand_dims`` over several axes). ``R.const(v, "dtype")`` is a scalar
literal; ``metadata["relax.expr.Constant"][i]`` is constant ``i``, whose value comes from the
params (keyed ``metadata["relax.expr.Constant"][i]``, or ``meta[relay.Constant][i]`` as the
text IR keys it: one index space). A binding's type annotation is checked against the type
the program has, as a ``/* ty= */`` comment is in the text IR. Variables bound inside a
``with R.dataflow():`` block and not passed to ``R.output`` are not visible after it.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from functools import lru_cache
from typing import Any, Mapping

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedInput

from ..core.nodes import (Call, Constant, Expr, Function, Module, Scalar, Tuple, TupleGetItem,
                          Var, freeze_attrs, post_order)
from ..core.types import DTYPES, Dim, TensorType, TupleType, Type, dim_of_text, is_anonymous
from ..errors import (ArityError, EqquantError, NameError_, ParseError, SourceLoc,
                      TypeCheckError, UnknownOpError)
from ..ops.registry import get_op, relax_ops
from ..resources import grammar_path
from .nesting import check_nesting
from .parser import _syntax_error_with, fit_literal
from .typecheck import Inferer

_KEY = re.compile(r'^metadata\["relax\.expr\.Constant"\]\[(\d+)\]$')
CONSTANT_SECTION = "relax.expr.Constant"


def metadata_key(index: int) -> str:
    return f'metadata["{CONSTANT_SECTION}"][{index}]'


def metadata_constants(params: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    """The constants of a params file keyed as TVMScript writes them; keys of the text IR's
    form (``meta[relay.Constant][i]``) count too, so one file serves both formats."""
    from .params import meta_constants
    out = meta_constants(params)
    for k in params:
        m = _KEY.match(k)
        if m:
            out[int(m.group(1))] = params[k]
    return out


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(grammar_path("tvmscript.lark").read_text(), parser="lalr",
                propagate_positions=True, maybe_placeholders=True, cache=True)


def parse_tvmscript(text: str, file: str = "<string>",
                    constants: Mapping[int, np.ndarray] | None = None) -> Module:
    """Read an ``@I.ir_module`` class. ``constants`` gives the data of
    ``metadata["relax.expr.Constant"][i]`` (their types come from it)."""
    check_nesting(text, file)
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error_with(_lark(), e, text, file) from None
    return _Reader(text, file, dict(constants or {})).module(tree)


# -- reading -----------------------------------------------------------------------------------

class _Value:
    """A Python value written in the text (a number, string, list, shape): an attribute."""

    def __init__(self, value: Any):
        self.value = value


class _Reader:
    def __init__(self, text: str, file: str, constants: dict[int, np.ndarray]):
        self.text, self.file, self.constants = text, file, constants
        self.consts: dict[int, Constant] = {}
        self.annotations: list[tuple[Expr, Type, SourceLoc]] = []
        self.types = Inferer(None)
        self.ops = relax_ops()

    def loc(self, item: Tree | Token) -> SourceLoc:
        if isinstance(item, Tree):
            return SourceLoc(self.file, item.meta.line, item.meta.column, self.text)
        return SourceLoc(self.file, item.line, item.column, self.text)

    def module(self, tree: Tree) -> Module:
        cls_tok = next(c for c in tree.children if isinstance(c, Token))
        functions: dict[str, Function] = {}
        for fn_tree in (c for c in tree.children if isinstance(c, Tree)
                        and c.data == "function"):
            name_tok = fn_tree.children[2]
            if str(name_tok) in functions:
                raise NameError_(f"function {name_tok} is defined twice", self.loc(name_tok))
            functions[str(name_tok)] = self.function(fn_tree)
        if "main" not in functions:
            raise NameError_("the module has no function 'main'", self.loc(cls_tok))
        mod = Module(functions)
        mod.annotations = self.annotations
        return mod

    def function(self, tree: Tree) -> Function:
        deco, _def, name_tok, params_tree, ret_tree, *stmts = tree.children
        if str(deco.children[0]) != "R.function":
            raise ParseError(f"expected @R.function, got @{deco.children[0]}", self.loc(deco))
        scope: dict[str, Expr] = {}
        params = []
        for p in (params_tree.children if params_tree is not None else []):
            tok, ty_tree = p.children
            if str(tok) in scope:
                raise NameError_(f"parameter {tok} is declared twice", self.loc(tok))
            v = Var(name=str(tok), type=self.type(ty_tree), loc=self.loc(tok))
            self.types.remember(v, v.type)
            scope[str(tok)] = v
            params.append(v)
        *stmts, _ret_tok, result = stmts
        for s in stmts:
            self.statement(s, scope)
        body = self.expr(result, scope)
        if not isinstance(body, Expr):
            raise ParseError("a function returns a value of the program", self.loc(result))
        ret = self.type(ret_tree) if ret_tree is not None else None
        return Function(params=tuple(params), body=body, ret_type=ret, loc=self.loc(tree))

    def statement(self, tree: Tree, scope: dict[str, Expr]) -> None:
        if tree.data == "binding":
            name_tok, ty_tree, value = tree.children
            name = str(name_tok)
            if name in scope:
                raise NameError_(f"{name} is already defined", self.loc(name_tok))
            node = self.expr(value, scope)
            if not isinstance(node, Expr):
                raise ParseError(f"{name} is bound to a value that is not a tensor or a tuple",
                                 self.loc(value))
            if isinstance(node, (Call, Tuple, TupleGetItem)) and node.name is None:
                node = dataclasses.replace(node, name=name)
                self.types.remember(node, self.types.expr(node))
            if ty_tree is not None:
                self.annotations.append((node, self.type(ty_tree), self.loc(ty_tree)))
            scope[name] = node
            return
        # with R.dataflow(): ... R.output(names)
        with_tok, block, *rest = tree.children
        if str(block) != "R.dataflow":
            raise ParseError(f"expected 'with R.dataflow():', got 'with {block}()'",
                             self.loc(block))
        cut = next(i for i, c in enumerate(rest) if isinstance(c, Token) and c.type == "OUTPUT")
        inner, outputs = rest[:cut], rest[cut + 1:]
        before = set(scope)
        for s in inner:
            self.statement(s, scope)
        kept = set()
        for tok in (t for t in outputs if t is not None):
            if str(tok) not in scope or str(tok) in before:
                raise NameError_(f"R.output({tok}): {tok} is not bound in this dataflow block",
                                 self.loc(tok))
            kept.add(str(tok))
        for name in set(scope) - before - kept:
            del scope[name]

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, tree: Tree | Token, scope: dict[str, Expr]) -> Expr | _Value:
        kind = tree.data
        if kind == "name":
            tok = tree.children[0]
            node = scope.get(str(tok))
            if node is None:
                raise NameError_(f"{tok} is not defined", self.loc(tok))
            return node
        if kind == "metadata":
            return self.metadata(tree)
        if kind == "number":
            return _Value(_number(tree.children[0]))
        if kind == "string":
            return _Value(ast.literal_eval(str(tree.children[0])))
        if kind in ("true", "false", "none"):
            return _Value({"true": True, "false": False, "none": None}[kind])
        if kind in ("tuple", "list", "bare_tuple"):
            items = [self.expr(c, scope) for c in tree.children if c is not None]
            if items and all(isinstance(i, Expr) for i in items) and kind != "list":
                node = Tuple(fields=tuple(items), loc=self.loc(tree))  # type: ignore[arg-type]
                self.types.expr(node)
                return node
            if any(isinstance(i, Expr) for i in items):
                raise ParseError("a list or tuple mixes values of the program with constants",
                                 self.loc(tree))
            return _Value([i.value for i in items])  # type: ignore[union-attr]
        if kind == "item":
            inner, idx_tok = tree.children
            tup = self.expr(inner, scope)
            index = _number(idx_tok)
            if not isinstance(tup, Expr) or not isinstance(index, int):
                raise ParseError("x[i] takes one element of a tuple value by its integer index",
                                 self.loc(tree))
            node = TupleGetItem(tuple=tup, index=index, loc=self.loc(tree))
            self.typed(node, tree)
            return node
        if kind == "call":
            return self.call(tree, scope)
        raise ParseError(f"unsupported construct ({kind})", self.loc(tree))

    def typed(self, node: Expr, tree: Tree) -> Type:
        try:
            return self.types.expr(node)
        except EqquantError as e:
            if e.loc is None:
                e.loc = self.loc(tree)
            raise

    def metadata(self, tree: Tree) -> Constant:
        _, section, idx_tok = tree.children
        if ast.literal_eval(str(section)) != CONSTANT_SECTION:
            raise ParseError(f"unknown metadata section {section} (expected "
                             f'"{CONSTANT_SECTION}")', self.loc(section))
        idx = _number(idx_tok)
        if not isinstance(idx, int) or idx < 0:
            raise ParseError("a metadata index is a non-negative integer", self.loc(idx_tok))
        node = self.consts.get(idx)
        if node is None:
            data = self.constants.get(idx)
            if data is None:
                raise TypeCheckError(f"{metadata_key(idx)} has no value: TVMScript omits "
                                     f"constants, give them in a params file keyed "
                                     f"{metadata_key(idx)}", self.loc(tree))
            ty = TensorType(tuple(int(d) for d in data.shape), str(data.dtype))
            node = Constant(index=idx, type=ty, data=data, loc=self.loc(tree))
            self.types.remember(node, ty)
            self.consts[idx] = node
        return node

    def call(self, tree: Tree, scope: dict[str, Expr]) -> Expr | _Value:
        target_tok, args_tree = tree.children
        target = str(target_tok)
        args: list[Expr | _Value] = []
        kwargs: dict[str, Any] = {}
        for a in (args_tree.children if args_tree is not None else []):
            if isinstance(a, Tree) and a.data == "kwarg":
                key, value_tree = a.children
                value = self.expr(value_tree, scope)
                if not isinstance(value, _Value):
                    raise ParseError(f"keyword {key} takes a constant (a number, string or "
                                     f"list), not a value of the program", self.loc(value_tree))
                kwargs[str(key)] = value.value
            elif kwargs:
                raise ParseError("a positional argument follows a keyword", self.loc(a))
            else:
                args.append(self.expr(a, scope))
        if target == "R.const":
            return self.const(args, kwargs, tree)
        if target == "R.shape":
            if len(args) != 1 or not isinstance(args[0], _Value) or kwargs:
                raise ParseError("R.shape takes one list of ints", self.loc(tree))
            return args[0]
        op = self.ops.get(target)
        if op is None:
            hint = (" (types are written after a name: lv: R.Tensor(...) = ...)"
                    if target in ("R.Tensor", "R.Tuple") else "")
            raise UnknownOpError(f"{target} is not an op of the registry{hint}",
                                 self.loc(target_tok))
        form = op.relax
        for key in (form.ignore if form else ()):
            kwargs.pop(key, None)
        try:
            if form is not None and form.read is not None:
                node = form.read(_ReadContext(self, tree), args, kwargs)
            else:
                node = self.op_call(op, args, kwargs, tree)
        except EqquantError as e:
            if e.loc is None:
                e.loc = self.loc(target_tok)
            raise
        self.typed(node, tree)
        return node

    def op_call(self, op, args, kwargs, tree) -> Call:
        if len(args) != len(op.inputs) or not all(isinstance(a, Expr) for a in args):
            raise ArityError(f"{op.relax_name} takes {len(op.inputs)} value"
                             f"{'s' if len(op.inputs) != 1 else ''} of the program "
                             f"({', '.join(op.inputs)}) and keywords", self.loc(tree))
        attrs = op.canonical_attrs(kwargs)
        return Call(op=op, args=tuple(args), attrs=freeze_attrs(attrs), loc=self.loc(tree))

    def const(self, args, kwargs, tree) -> Scalar:
        dtype = kwargs.pop("dtype", None)
        if len(args) == 2 and dtype is None and isinstance(args[1], _Value):
            dtype = args[1].value
            args = args[:1]
        dtype = dtype or "float32"
        if len(args) != 1 or kwargs or not isinstance(args[0], _Value) or \
                not isinstance(args[0].value, (int, float, bool)):
            raise ParseError('R.const takes one number and its dtype: R.const(1.5, "float32") '
                             '(a tensor constant is metadata["relax.expr.Constant"][i])',
                             self.loc(tree))
        if dtype not in DTYPES:
            raise TypeCheckError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})",
                                 self.loc(tree))
        try:
            value = fit_literal(args[0].value, dtype)
        except ValueError as e:
            raise TypeCheckError(str(e), self.loc(tree)) from None
        node = Scalar(value=value, dtype=dtype, loc=self.loc(tree))
        self.types.remember(node, node.type)
        return node

    # -- types ---------------------------------------------------------------------------------
    def type(self, tree: Tree) -> Type:
        if tree.data != "call" or str(tree.children[0]) not in ("R.Tensor", "R.Tuple"):
            raise ParseError("expected a type: R.Tensor((d0, d1, ...), dtype=\"float32\") or "
                             "R.Tuple(...)", self.loc(tree))
        target, args_tree = str(tree.children[0]), tree.children[1]
        kids = args_tree.children if args_tree is not None else []
        if target == "R.Tuple":
            return TupleType(tuple(self.type(k) for k in kids))
        shape, dtype = None, None
        for k in kids:
            if isinstance(k, Tree) and k.data == "kwarg":
                key, v = k.children
                if str(key) != "dtype" or v.data != "string":
                    raise ParseError(f"R.Tensor takes a shape and dtype=\"...\" (eqquant "
                                     f"needs each axis: a size or a named one), not {key}=",
                                     self.loc(k))
                dtype = ast.literal_eval(str(v.children[0]))
            elif k.data == "string" and shape is not None:
                dtype = ast.literal_eval(str(k.children[0]))
            elif k.data in ("tuple", "list") and shape is None:
                dims = [_number(c.children[0]) if c.data == "number" else
                        _size(c, self.loc(c)) if c.data == "string" else None
                        for c in k.children if c is not None]
                if any(not isinstance(d, (int, Dim)) or (isinstance(d, int) and d < 0)
                       for d in dims):
                    raise ParseError("a tensor's shape is a tuple of non-negative integers "
                                     "and named sizes (\"n\")", self.loc(k))
                shape = tuple(dims)
            else:
                raise ParseError("R.Tensor takes a shape and dtype=\"...\" (eqquant needs "
                                 "each axis: a size or a named one)", self.loc(k))
        if shape is None or dtype is None:
            raise ParseError("R.Tensor needs its shape and its dtype (eqquant needs each "
                             "axis: a size or a named one)", self.loc(tree))
        if dtype not in DTYPES:
            raise TypeCheckError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})",
                                 self.loc(tree))
        return TensorType(shape, dtype)


@dataclasses.dataclass
class _ReadContext:
    """What an op's ``RelaxForm.read`` gets: build registry calls and ask types."""

    reader: _Reader
    tree: Tree

    def call(self, op_name: str, *args: Expr, **attrs: Any) -> Call:
        op = get_op(op_name)
        node = Call(op=op, args=args, attrs=freeze_attrs(op.canonical_attrs(attrs)),
                    loc=self.reader.loc(self.tree))
        self.reader.typed(node, self.tree)
        return node

    def type(self, node: Expr) -> Type:
        return self.reader.types.expr(node)

    def value(self, arg, what: str) -> Expr:
        if not isinstance(arg, Expr):
            raise ParseError(f"{what} is a value of the program", self.reader.loc(self.tree))
        return arg

    def constant(self, arg, what: str) -> Any:
        if not isinstance(arg, _Value):
            raise ParseError(f"{what} is a constant", self.reader.loc(self.tree))
        return arg.value


def _number(tok: Token) -> int | float:
    text = str(tok)
    try:
        return int(text)
    except ValueError:
        return float(text)


# -- printing ----------------------------------------------------------------------------------

def py_value(value: Any) -> str:
    """An attribute value as Python (and TVMScript) writes it."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(py_value(v) for v in value) + "]"
    return repr(value)


def _size(tree, loc):
    """A size known only at run time, as Relax writes it: a string naming it (``"n"``), or
    an expression of such names (``"n * 4"``)."""
    text = ast.literal_eval(str(tree.children[0]))
    try:
        return dim_of_text(re.sub(r"[A-Za-z_]\w*", lambda m: "?" + m.group(0),
                                  text.replace(" ", "")), lambda: "_")
    except ValueError:
        raise ParseError(f"{text!r} is not a size (a name such as \"n\", or sums and "
                         f"products of names and integers)", loc) from None


def _size_text(d) -> str:
    """A size as Relax writes it: an int, or a string of names (a ``?`` of its own is given
    the name it has inside, ``size_1``)."""
    if not isinstance(d, Dim):
        return str(d)
    named = Dim(tuple((tuple("size" + n if is_anonymous(n) else n for n in names), coef)
                      for names, coef in d.terms))
    return '"' + str(named).replace("?", "") + '"'


def relax_type(t: Type) -> str:
    if isinstance(t, TensorType):
        dims = ", ".join(map(_size_text, t.shape)) + ("," if len(t.shape) == 1 else "")
        return f'R.Tensor(({dims}), dtype="{t.dtype}")'
    if isinstance(t, TupleType):
        return "R.Tuple(" + ", ".join(relax_type(f) for f in t.fields) + ")"
    raise EqquantError(f"TVMScript has no form here for the type {t}")


def print_tvmscript(mod: Module) -> str:
    """The module as TVM's ``mod.show()`` prints it: one ``R.function`` per function, its
    values bound in a ``with R.dataflow():`` block, each with its type. Constants print as
    ``metadata["relax.expr.Constant"][i]`` (their values stay in the params file)."""
    from .typecheck import infer_types
    types = infer_types(mod)
    lines = ["# from tvm.script import ir as I", "# from tvm.script import relax as R", "",
             "@I.ir_module", "class Module:"]
    for name, fn in mod.functions.items():
        lines += _Printer(types).function(name, fn)
    return "\n".join(lines) + "\n"


class _Printer:
    def __init__(self, types: dict[int, Type]):
        self.types = types
        self.names: dict[int, str] = {}
        self.taken: set[str] = set()
        self.counter = 0

    def label(self, node: Expr) -> str:
        hint = getattr(node, "name", None)
        if hint and hint not in self.taken and re.fullmatch(r"[A-Za-z_]\w*", hint):
            name = hint
        else:
            while True:
                name = "lv" if self.counter == 0 else f"lv{self.counter}"
                self.counter += 1
                if name not in self.taken:
                    break
        self.taken.add(name)
        return name

    def ref(self, node: Expr) -> str:
        if isinstance(node, Var):
            return node.name
        if isinstance(node, Constant):
            return metadata_key(node.index)
        if isinstance(node, Tuple) and id(node) not in self.names:
            return "(" + self.value(node) + ")"
        if isinstance(node, Scalar):
            value = node.value if node.dtype == "bool" else (
                float(node.value) if node.dtype.startswith("float") else int(node.value))
            return f'R.const({value!r}, "{node.dtype}")'
        return self.names[id(node)]

    def function(self, name: str, fn: Function) -> list[str]:
        self.taken |= {p.name for p in fn.params}
        params = ", ".join(f"{p.name}: {relax_type(p.type)}" for p in fn.params)
        ret = fn.ret_type or self.types.get(id(fn.body))
        head = f"    def {name}({params})" + (f" -> {relax_type(ret)}" if ret else "") + ":"
        body = []
        for node in post_order(fn.body):
            if isinstance(node, (Var, Constant, Scalar)) or self.inline(node, fn.body):
                continue
            text = self.value(node)
            self.names[id(node)] = self.label(node)
            body.append(f"            {self.names[id(node)]}: "
                        f"{relax_type(self.types[id(node)])} = {text}")
        out = ["    @R.function", head]
        if body:
            out += ["        with R.dataflow():", *body,
                    f"            R.output({self.ref(fn.body)})"]
        out.append(f"        return {self.ref(fn.body)}")
        return out

    @staticmethod
    def inline(node: Expr, root: Expr) -> bool:
        """An unnamed tuple is written where it is used (``R.concat((a, b), axis=1)``)."""
        return isinstance(node, Tuple) and node.name is None and node is not root

    def value(self, node: Expr) -> str:
        if isinstance(node, Tuple):
            return ", ".join(self.ref(f) for f in node.fields) + \
                ("," if len(node.fields) == 1 else "")
        if isinstance(node, TupleGetItem):
            return f"{self.ref(node.tuple)}[{node.index}]"
        if isinstance(node, Call) and not isinstance(node.op, Expr):
            op = node.op
            args = [self.ref(a) for a in node.args]
            if op.relax is not None and op.relax.write is not None:
                extra, kwargs = op.relax.write(node, self.types)
            else:
                extra, kwargs = [], {k: node.attrs[k] for k, _ in op.printed_attrs(node.attrs)}
            args += extra + [f"{k}={py_value(v)}" for k, v in kwargs.items()]
            return f"{op.relax_name}({', '.join(args)})"
        raise EqquantError(f"TVMScript printing covers dataflow programs of registry ops; "
                           f"this program has a {type(node).__name__} (a composite function "
                           f"or a call of another function)")
