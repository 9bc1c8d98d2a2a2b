"""Text IR -> :class:`Module`, with located errors.

    >>> m = parse('def @main(%x: Tensor[(2), float32]) { nn.relu(%x) }')
    >>> print(m)
    #[version = "0.0.5"]
    def @main(%x: Tensor[(2), float32]) {
      nn.relu(%x)
    }

Lark (``grammar/ir.lark``, LALR) reads the text into a tree; :class:`_TreeToModule` resolves names
scope by scope, looks ops up in the registry, canonicalises attributes and keeps sharing (a
binding used twice is one node). Block comments reading ``/* ty=T */`` are attached to the value
they follow and later checked by the type checker.
"""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import Any

import math

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import (ArityError, AttrError, EqquantError, NameError_, ParseError, SourceLoc,
                      TypeCheckError)
from ..ops.registry import get_op
from ..resources import grammar_path
from ..core.nodes import (Call, Constant, Expr, Function, GlobalVar, Module, Scalar, Tuple,
                          TupleGetItem, Var, freeze_attrs)
from ..core.types import (DTYPES, FuncType, TensorType, TupleType, Type, dim_of_text,
                          is_anonymous)
from .nesting import check_nesting

_SUFFIX_DTYPE = {"f": "float32", "f16": "float16", "f32": "float32", "f64": "float64",
                 "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64",
                 "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64"}
_INTS = re.compile(r"-?\d+")
_NUMBER = re.compile(r"^([+-]?(?:[0-9.]+(?:[eE][+-]?\d+)?|inf|nan))(f16|f32|f64|f|[iu]\d+)?$")

# How a terminal reads in "expected ..." messages.
_TERMINAL_TEXT = {
    "LOCAL": "a value like %x", "GLOBAL": "a function like @main", "IDENT": "a name",
    "INT": "an integer", "NUMBER": "a number", "STRING": "a string", "$END": "end of file",
    "VAR": "a pattern variable like ?x", "INT_LIST": "a list of ints",
    "TENSOR_TYPE": "a tensor type", "ARROW": "'=>' or '<=>'", "CMP": "'==' or '!='",
}


class CommentSink:
    """Collects comments during a parse (a Lark lexer callback appends to it)."""

    def __init__(self) -> None:
        self.items: list[Token] = []

    def __call__(self, tok: Token) -> Token:
        self.items.append(tok)
        return tok


_SINK = CommentSink()


@lru_cache(maxsize=2)
def _lark(positions: bool = True) -> Lark:
    """The LALR parser. ``positions`` (Lark's propagate_positions) records where every
    subtree ends, which attaching ``/* ty= */`` comments needs; it more than doubles the
    parse time, so a text without block comments is parsed without it (locations then come
    from each construct's first token)."""
    text = grammar_path("ir.lark").read_text()
    # cache=True: Lark keeps the analysed grammar in a file of the temp folder (keyed by the
    # grammar's digest and the options), so a new process does not analyse the grammar again
    return Lark(text, parser="lalr", start=["start", "type"], propagate_positions=positions,
                maybe_placeholders=True, lexer_callbacks={"BLOCK_COMMENT": _SINK}, cache=True)


def _expected_text(lark: Lark, names) -> str:
    out = []
    for name in sorted(set(names)):
        if name in _TERMINAL_TEXT:
            out.append(_TERMINAL_TEXT[name])
            continue
        try:
            pat = lark.get_terminal(name).pattern
            out.append(repr(pat.value) if pat.type == "str" else name.lower())
        except KeyError:
            out.append(name)
    return ", ".join(sorted(set(out)))


def _syntax_error(e: UnexpectedInput, text: str, file: str) -> ParseError:
    return _syntax_error_with(_lark(), e, text, file)


def _syntax_error_with(lark: Lark, e: UnexpectedInput, text: str, file: str) -> ParseError:
    """A Lark error as a located ParseError saying what was expected (shared by the rules
    parser)."""
    if isinstance(e, UnexpectedCharacters):
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        if text.startswith("/*", e.pos_in_stream):
            msg = "unclosed comment: '/*' has no matching '*/'"
        elif ch == '"':
            msg = "unterminated string"
        else:
            msg = f"unexpected character {ch!r}"
            if e.allowed:
                msg += f"; expected {_expected_text(lark, e.allowed)}"
        return ParseError(msg, SourceLoc(file, e.line, e.column, text))
    if isinstance(e, (UnexpectedToken, UnexpectedEOF)):
        tok = getattr(e, "token", None)
        expected = _expected_text(lark, getattr(e, "expected", set()) or set())
        if tok is None or tok.type == "$END":
            lines = text.splitlines() or [""]
            line, col = len(lines), len(lines[-1]) + 1
            msg = "unexpected end of file (the program is truncated?)"
        else:
            line, col = tok.line, tok.column
            msg = f"unexpected {str(tok)!r}"
        if expected:
            msg += f"; expected {expected}"
        return ParseError(msg, SourceLoc(file, line, col, text))
    return ParseError(str(e), None)


def parse(text: str, file: str = "<string>",
          constants: dict[int, np.ndarray] | None = None) -> Module:
    """Parse a whole program. ``constants`` gives the data of ``meta[relay.Constant][i]``
    (their types come from it, or else from each constant's ``/* ty=... */``)."""
    check_nesting(text, file)
    _SINK.items = []
    positions = "/*" in text
    try:
        tree = _lark(positions).parse(text, start="start")
    except UnexpectedInput as e:
        raise _syntax_error(e, text, file) from None
    comments = _SINK.items
    _SINK.items = []
    try:
        return _TreeToModule(text, file, constants or {}, comments, positions).module(tree)
    except _NeedPositions:   # rare: parse again, recording every subtree's position
        tree = _lark(True).parse(text, start="start")
        comments, _SINK.items = _SINK.items, []
        return _TreeToModule(text, file, constants or {}, comments, True).module(tree)


class _NeedPositions(Exception):
    """A location was needed for a subtree that has no token of its own."""


def parse_type(text: str, file: str = "<type>", line: int = 1, column: int = 1) -> Type:
    check_nesting(text, file)
    _SINK.items = []
    try:
        tree = _lark().parse(text, start="type")
    except UnexpectedInput as e:
        err = _syntax_error(e, text, file)
        if err.loc is not None:
            err.loc = SourceLoc(file, line + err.loc.line - 1,
                                (column if err.loc.line == 1 else 1) + err.loc.column - 1)
        raise err from None
    return _TreeToModule(text, file, {}, []).type(tree)


def decode_number(tok: Token | str) -> tuple[Any, str | None]:
    """A number literal (``1``, ``0.5f``, ``-3i8``, ``1e-5``) as (value, dtype or None when
    it has no suffix): the one decoder of the IR's and the rules' literals."""
    m = _NUMBER.match(str(tok))
    if not m:
        raise ValueError(f"bad number {tok}")
    body, suffix = m.group(1), m.group(2)
    is_floaty = any(c in body for c in ".eE") or "inf" in body or "nan" in body
    if len(body) > 400:
        raise ValueError(f"a number of {len(body)} characters is too long to be a literal")
    if is_floaty and "inf" not in body and "nan" not in body and math.isinf(float(body)):
        raise ValueError(f"{body} overflows every float dtype")
    if suffix is None:
        return (float(body) if is_floaty else int(body)), None
    dtype = _SUFFIX_DTYPE.get(suffix)
    if dtype is None:
        raise ValueError(f"unknown literal suffix '{suffix}'")
    if dtype.startswith("float"):
        return fit_literal(float(body), dtype), dtype
    if is_floaty:
        raise ValueError(f"'{tok}' is not an integer but has the integer suffix '{suffix}'")
    return fit_literal(int(body), dtype), dtype


def fit_literal(value, dtype: str):
    """``value`` as a literal of ``dtype``, or ValueError when it does not fit: an integer
    outside the dtype's range, a finite number that overflows a float dtype to infinity."""
    if dtype.startswith("float"):
        with np.errstate(over="ignore"):
            out = float(np.dtype(dtype).type(value))
        if math.isinf(out) and math.isfinite(value):
            raise ValueError(f"{value:g} overflows {dtype} (largest: "
                             f"{float(np.finfo(dtype).max):g})")
        return out
    if dtype == "bool":
        return value
    info = np.iinfo(dtype)
    if not info.min <= int(value) <= info.max:
        digits = str(value)
        text = digits if len(digits) < 40 else f"{digits[:20]}... ({len(digits)} digits)"
        raise ValueError(f"{text} does not fit {dtype} [{info.min}, {info.max}]")
    return int(value)


class _Scope:
    def __init__(self, parent: "_Scope | None" = None):
        self.parent = parent
        self.names: dict[str, Expr] = {}

    def lookup(self, name: str) -> Expr | None:
        s: _Scope | None = self
        while s is not None:
            if name in s.names:
                return s.names[name]
            s = s.parent
        return None


class _TreeToModule:
    def __init__(self, text: str, file: str, constants: dict[int, np.ndarray],
                 comments: list[Token], positions: bool = True):
        self.text, self.file = text, file
        self.positions = positions
        self.constants = constants
        self.comments = comments
        self.meta_nodes: dict[int, Constant] = {}
        self.by_end: dict[int, Expr] = {}  # end offset of a value's text -> the value
        self.globals: list[GlobalVar] = []
        self._types_read: dict[str, Type] = {}
        self.anonymous_sizes = 0
        self.ty_by_end = {self._owner_end(tok.start_pos): (tok, start, ty_text)
                          for tok, start, ty_text in self._ty_comments()}

    # -- locations -----------------------------------------------------------------------------
    def loc(self, item: Tree | Token) -> SourceLoc:
        if isinstance(item, Tree) and self.positions:
            return SourceLoc(self.file, item.meta.line, item.meta.column, self.text)
        while isinstance(item, Tree):  # the construct's first token
            item = next((c for c in item.children if c is not None), None)
        if item is None:  # a construct of keywords only (True, ()): positions are needed
            raise _NeedPositions()
        return SourceLoc(self.file, item.line, item.column, self.text)

    def note(self, tree: Tree, node: Expr) -> Expr:
        if self.positions:
            self.by_end[tree.meta.end_pos] = node
        return node

    # -- module --------------------------------------------------------------------------------
    def module(self, tree: Tree) -> Module:
        version = None
        functions: dict[str, Function] = {}
        for child in tree.children:
            if child is None:
                continue
            if child.data == "version":
                version = str(child.children[0])[1:-1]
                continue
            _, gtok, params, ret, body = child.children
            name = str(gtok)[1:]
            if name in functions:
                raise NameError_(f"function @{name} is defined twice", self.loc(gtok))
            functions[name] = self.function(params, ret, body, child)
        if "main" not in functions:
            raise NameError_("the program has no 'def @main'",
                             SourceLoc(self.file, 1, 1, self.text))
        mod = Module(functions, version=version)
        mod.annotations = self.annotations()
        self.check_globals(mod)
        return mod

    def check_globals(self, mod: Module) -> None:
        for node in self.globals:
            if node.name not in mod.functions:
                raise NameError_(f"@{node.name} is not defined", node.loc)

    def function(self, params_tree, ret_tree, body_tree, tree, scope=None) -> Function:
        scope = _Scope(scope)
        params: list[Var] = []
        attrs: dict[str, Any] = {}
        for p in (params_tree.children if params_tree is not None else []):
            if p.data == "param":
                tok, ty = p.children
                name = str(tok)[1:]
                if name in scope.names:
                    raise NameError_(f"parameter %{name} is declared twice", self.loc(tok))
                v = Var(name=name, type=self.type(ty), loc=self.loc(tok))
                scope.names[name] = v
                params.append(v)
                self.note(p, v)
            else:
                key, value = p.children
                attrs[str(key)] = self.attr_value(value)
        body = self.body(body_tree, scope)
        ret = self.type(ret_tree) if ret_tree is not None else None
        return Function(params=tuple(params), body=body, ret_type=ret,
                        attrs=freeze_attrs(attrs), loc=self.loc(tree))

    def body(self, tree: Tree, scope: _Scope) -> Expr:
        *bindings, result = tree.children
        local = _Scope(scope)
        for b in bindings:
            tok, expr_tree = b.children
            name = str(tok)[1:]
            if local.lookup(name) is not None:
                raise NameError_(f"%{name} is already defined", self.loc(tok))
            node = self.expr(expr_tree, local)
            if not name.isdigit() and hasattr(node, "name") and getattr(node, "name") is None \
                    and expr_tree.data in ("call_op", "call_value", "tuple", "proj", "fn"):
                node = self._rename(node, name, expr_tree)
            local.names[name] = node
        return self.expr(result, local)

    def _rename(self, node: Expr, name: str, tree: Tree) -> Expr:
        renamed = dataclasses.replace(node, name=name)
        if self.positions:
            self.by_end[tree.meta.end_pos] = renamed
        return renamed

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, tree: Tree | Token, scope: _Scope) -> Expr:
        kind = tree.data
        if kind == "local":
            tok = tree.children[0]
            node = scope.lookup(str(tok)[1:])
            if node is None:
                raise NameError_(f"{tok} is not defined", self.loc(tok))
            return self.note(tree, node)
        if kind == "global_":
            gv = GlobalVar(name=str(tree.children[0])[1:], loc=self.loc(tree))
            self.globals.append(gv)  # checked once every def is known
            return self.note(tree, gv)
        if kind == "call_op":
            return self.note(tree, self.call_op(tree, scope))
        if kind == "call_value":
            fn_tree, args_tree = tree.children
            fn = self.expr(fn_tree, scope)
            args, kwargs = self.args(args_tree, scope)
            if kwargs:
                raise AttrError("a function value takes no attributes",
                                self.loc(kwargs[0][2]))
            return self.note(tree, Call(op=fn, args=tuple(args), loc=self.loc(tree)))
        if kind == "proj":
            inner, idx = tree.children
            return self.note(tree, TupleGetItem(tuple=self.expr(inner, scope), index=int(idx),
                                                loc=self.loc(idx)))
        if kind == "tuple":
            fields = tuple(self.expr(c, scope) for c in tree.children if c is not None)
            return self.note(tree, Tuple(fields=fields, loc=self.loc(tree)))
        if kind == "empty_tuple":
            return self.note(tree, Tuple(fields=(), loc=self.loc(tree)))
        if kind == "meta":
            return self.note(tree, self.meta(tree))
        if kind == "number":
            tok = tree.children[0]
            try:
                value, dtype = decode_number(tok)
                if dtype is None:
                    dtype = "float32" if isinstance(value, float) else "int32"
                    value = fit_literal(value, dtype)
            except ValueError as e:
                raise ParseError(f"bad literal: {e}", self.loc(tok)) from None
            return self.note(tree, Scalar(value=value, dtype=dtype, loc=self.loc(tok)))
        if kind in ("true", "false"):
            return self.note(tree, Scalar(value=kind == "true", dtype="bool",
                                          loc=self.loc(tree)))
        if kind == "fn":
            _, params, ret, body = tree.children
            return self.note(tree, self.function(params, ret, body, tree, scope))
        raise ParseError(f"unexpected {kind}", self.loc(tree))  # grammar and builder disagree

    def args(self, tree: Tree | None, scope: _Scope):
        args: list[Expr] = []
        kwargs: list[tuple[str, Any, Tree]] = []
        for c in (tree.children if tree is not None else []):
            if isinstance(c, Tree) and c.data == "kwarg":
                key, value = c.children
                if any(k == str(key) for k, _, _ in kwargs):
                    raise AttrError(f"attribute '{key}' is given twice", self.loc(key))
                kwargs.append((str(key), self.attr_value(value), c))
            else:
                if kwargs:
                    raise ParseError("a positional argument follows an attribute",
                                     self.loc(c))
                args.append(self.expr(c, scope))
        return args, kwargs

    def call_op(self, tree: Tree, scope: _Scope) -> Call:
        name_tok, args_tree = tree.children
        try:
            op = get_op(str(name_tok))
        except EqquantError as e:
            e.loc = self.loc(name_tok)
            raise
        args, kwargs = self.args(args_tree, scope)
        if len(args) != len(op.inputs):
            raise ArityError(f"{op.name} takes {len(op.inputs)} argument"
                             f"{'s' if len(op.inputs) != 1 else ''} "
                             f"({', '.join(op.inputs)}), got {len(args)}", self.loc(name_tok))
        try:
            attrs = op.canonical_attrs({k: v for k, v, _ in kwargs})
        except AttrError as e:
            attr = getattr(e, "attr", None)
            e.loc = self.loc(next((t for k, _, t in kwargs if k == attr), name_tok))
            raise
        return Call(op=op, args=tuple(args), attrs=freeze_attrs(attrs), loc=self.loc(name_tok))

    def meta(self, tree: Tree) -> Constant:
        _, kind_tok, idx_tok = tree.children
        if str(kind_tok) != "relay.Constant":
            raise ParseError(f"unknown meta section '{kind_tok}' (expected relay.Constant)",
                             self.loc(kind_tok))
        idx = int(idx_tok)
        node = self.meta_nodes.get(idx)
        if node is None:
            data = self.constants.get(idx)
            ty = None
            if data is not None:
                ty = TensorType(tuple(int(d) for d in data.shape), str(data.dtype))
            else:
                ty = self._annotated_type(tree.meta.end_pos) if self.positions else None
            if ty is None:
                raise TypeCheckError(
                    f"meta[relay.Constant][{idx}] has no type: write its type after it "
                    f"(/* ty=Tensor[...] */) or give a params file", self.loc(tree))
            if not isinstance(ty, TensorType):
                raise TypeCheckError(f"a constant must be a tensor, not {ty}", self.loc(tree))
            node = Constant(index=idx, type=ty, data=data, loc=self.loc(tree))
            self.meta_nodes[idx] = node
        return node

    # -- attributes and types ------------------------------------------------------------------
    def attr_value(self, tree) -> Any:
        kind = tree.data
        if kind == "a_number":
            tok = tree.children[0]
            try:
                value, dtype = decode_number(tok)
            except ValueError as e:
                raise ParseError(f"bad literal: {e}", self.loc(tok)) from None
            if dtype is not None and dtype.startswith("float"):
                return float(value)
            return value
        if kind == "a_ints":
            return [int(v) for v in _INTS.findall(str(tree.children[0]))]
        if kind == "a_string":
            return _unquote(str(tree.children[0]))
        if kind == "a_true":
            return True
        if kind == "a_false":
            return False
        if kind == "a_none":
            return None
        if kind == "a_list":
            return [self.attr_value(c) for c in tree.children if c is not None]
        if kind == "a_dim":          # a size known only at run time (a shape's: reshape's)
            tok = tree.children[0]
            size = self.dim(str(tok), tok)
            if any(map(is_anonymous, size.names)):
                raise ParseError("a size in an attribute must be named (?n): a ? there "
                                 "would be a size of its own, unrelated to the input's",
                                 self.loc(tok))
            return size
        raise ParseError(f"unexpected attribute value {kind}", self.loc(tree))

    def type(self, tree) -> Type:
        kind = tree.data
        if kind == "tensor_type_token":
            tok = tree.children[0]
            inner, dtype = str(tok)[len("Tensor[("):].rsplit(")", 1)
            dtype = dtype.strip(" ,]\t\n")
            col = tok.column + str(tok).index(dtype, len(inner))
            dims = [d.strip() for d in inner.split(",") if d.strip()]
            return TensorType(tuple(self.dim(d, tok) for d in dims),
                              self.dtype(Token("IDENT", dtype, line=tok.line, column=col)))
        if kind == "tensor_type":
            *dims, dtype_tok = tree.children
            return TensorType(tuple(self.dim(str(d), d) for d in dims if d is not None),
                              self.dtype(dtype_tok))
        if kind == "scalar_type":
            return TensorType((), self.dtype(tree.children[0]))
        if kind == "tuple_type":
            return TupleType(tuple(self.type(c) for c in tree.children if c is not None))
        if kind == "func_type":
            *params, ret = tree.children[1:]
            return FuncType(tuple(self.type(p) for p in params if p is not None), self.type(ret))
        raise ParseError(f"unexpected type {kind}", self.loc(tree))

    def dim(self, text: str, tok: Token):
        """A size: an int, or a size known at run time (``?n``; each ``?`` a name of its own,
        numbered in the order the text gives them, so a program parses the same each time)."""
        try:
            return dim_of_text(text, self._fresh_size)
        except ValueError as e:
            raise ParseError(str(e), self.loc(tok)) from None

    def _fresh_size(self) -> str:
        self.anonymous_sizes += 1
        return f"_{self.anonymous_sizes}"

    def dtype(self, tok: Token) -> str:
        if str(tok) not in DTYPES:
            raise ParseError(f"unknown dtype '{tok}'; expected one of {', '.join(DTYPES)}",
                             self.loc(tok))
        return str(tok)

    # -- /* ty=... */ annotations --------------------------------------------------------------
    def _ty_comments(self):
        for tok in self.comments:
            body = str(tok)[2:-2]
            stripped = body.lstrip()
            if not stripped.startswith("ty="):
                continue
            start = tok.start_pos + 2 + (len(body) - len(stripped)) + 3
            ty_text = stripped[3:]
            cut = re.search(r"\s+\w+=", ty_text)  # "ty=T span=..." -> "T"
            if cut:
                ty_text = ty_text[: cut.start()]
            yield tok, start, ty_text.strip()

    def _owner_end(self, comment_start: int) -> int:
        i = comment_start
        while i > 0 and self.text[i - 1].isspace():
            i -= 1
        return i

    def _annotated_type(self, end_pos: int) -> Type | None:
        found = self.ty_by_end.get(end_pos)
        return self._comment_type(*found) if found else None

    def _comment_type(self, tok: Token, start: int, ty_text: str) -> Type:
        known = self._types_read.get(ty_text)
        if known is not None:     # (most annotations repeat a few types)
            return known
        # the position from the comment's own token: counting lines from the start of the
        # text for every annotation made reading quadratic in the text's length
        line = tok.line + self.text.count("\n", tok.start_pos, start)
        col = start - (self.text.rfind("\n", tok.start_pos, start) + 1) + 1 \
            if line != tok.line else tok.column + (start - tok.start_pos)
        try:
            t = parse_type(ty_text, self.file, line, col)
            self._types_read[ty_text] = t
            return t
        except ParseError as e:
            e.loc = SourceLoc(self.file, e.loc.line if e.loc else line,
                              e.loc.column if e.loc else col, self.text)
            e.message = f"in a ty= annotation: {e.message}"
            raise

    def annotations(self) -> list[tuple[Expr, Type, SourceLoc]]:
        out = []
        for end, (tok, start, ty_text) in self.ty_by_end.items():
            node = self.by_end.get(end)
            if node is None:
                continue  # a comment that follows no value (e.g. after a keyword): ignored
            ty = self._comment_type(tok, start, ty_text)
            out.append((node, ty, SourceLoc(self.file, tok.line, tok.column, self.text)))
        return out


def _unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)),
                  s[1:-1])
