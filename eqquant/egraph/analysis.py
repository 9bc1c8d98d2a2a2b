"""The analyses kept inside the e-graph: every class's type, and constness.

Types are an e-graph analysis in the sense of egg: each new e-node gets its type once, from
its operands' types through the registry's type relation, when the ``analysis`` ruleset
(saturated after loading and after every iteration) first sees it. The relation is Python
code, so the rule calls it through egglog's ``py-call``, with one key string put together in
egglog (the op, its operands' type texts, its attributes, joined by :data:`SEP`)::

    (rule ((= ?e (@nn.relu ?a0)) (= ?y0 (type-of ?a0)))
          ((let ?r (py-to-string (py-call $typer (py-from-string (+ "nn.relu" "␟" ?y0)))))
           (set (type-of ?e) ?r)
           (type-seen ?e ?r)))

A type is kept as structured facts beside the class: ``type-of`` (its text,
``Tensor[(1, 64, 56, 56), float32]``), and ``dtype-of``, ``shape-of`` and ``rank-of``, joined
from the small ``type-parts`` table the engine writes for each new type text; these are what
guards match. A node whose operands do not fit its type relation gets the text
:data:`ILL_TYPED` (a rule may build an alternative that is ill-typed in some context; such a
node is never extracted). Every type a class was given is also kept in ``type-seen``, so when
two classes with different types merge, the ``type:conflict`` rule records the pair instead
of one side winning silently; the engine turns it into an error naming the rule that made
the union (:class:`~eqquant.errors.IllTypedRewrite`).

Constness (``is-const``) is derived by plain egglog rules: a class is constant when one of
its nodes has only constant operands.
"""
from __future__ import annotations

import base64
import pickle
import re
from dataclasses import dataclass, field
from typing import Any

from ..core.types import Dim, TensorType, TupleType, Type
from ..ops.registry import OpTypeError, all_ops
from .schema import OP_PREFIX, attr_sort, decode_attr, egg_name, egg_string, schema

WEAK = TensorType((), "weak")   # a weak scalar: takes the dtype of the operand beside it
ILL_TYPED = "?"                 # the type text of a node whose type relation fails
SEP = "\u241f"                  # between the parts of a typer key (and of a list's types)

# every type text the typer has produced, read back by the extraction's view
TYPES: dict[str, Type] = {}


def type_text(t: Type) -> str:
    text = str(t)
    TYPES.setdefault(text, t)
    return text


def type_of_text(text: str) -> Type | None:
    return TYPES.get(text)


def resolve_weak(types: list[Type]) -> list[Type]:
    """Weak scalars take the dtype of the first tensor operand that is not weak."""
    if not any(t == WEAK for t in types):
        return types
    strong = next((t for t in types if isinstance(t, TensorType) and t != WEAK), None)
    if strong is None:
        raise OpTypeError("no operand gives a dtype to the weak scalar")
    return [TensorType((), strong.dtype) if t == WEAK else t for t in types]


def agree(a: str, b: str) -> bool:
    """Whether two type texts found in one class are the same type (a weak scalar agrees
    with any rank-0 tensor: it takes that tensor's dtype)."""
    if a == b:
        return True
    ta, tb = TYPES.get(a), TYPES.get(b)
    return any(weak == WEAK and isinstance(other, TensorType) and other.rank == 0
               for weak, other in ((ta, tb), (tb, ta)))


def parts_facts(texts) -> str:
    """``type-parts`` facts for tensor type texts: the table the ``type:parts`` rule joins
    to give each class its dtype, shape and rank without calling Python per class; and a
    ``type-dim`` fact per size."""
    lines = []
    for text in texts:
        t = TYPES.get(text)
        if isinstance(t, TensorType):
            lines.append(f"(type-parts {egg_string(text)} {egg_string(dtype_part(text))} "
                         f"{egg_string(shape_part(text))} {egg_string(rank_part(text))})")
            lines.extend(f"(type-dim {egg_string(text)} {i} {dim_code(d)})\n"
                         f"(type-dim {egg_string(text)} {i - t.rank} {dim_code(d)})"
                         for i, d in enumerate(t.shape))
    return "\n".join(lines)


_DIM_CODES: dict[Dim, int] = {}


def dim_code(d) -> int:
    """A size as a guard's ``type-dim`` fact holds it: an int as itself; a size known only at
    run time as a negative code of its own, so a shape pattern's size variable matches it
    only where the same size stands (``?n`` with ``?n``: equal for every size) and a literal
    size never does (a rule that needs a 1 there does not hold for every size)."""
    if not isinstance(d, Dim):
        return int(d)
    return _DIM_CODES.setdefault(d, -(1 << 40) - len(_DIM_CODES))


def _field(text: str, pick) -> str:
    t = TYPES.get(text)
    return pick(t) if isinstance(t, TensorType) else "tuple"


def dtype_part(text: str) -> str:
    return _field(text, lambda t: t.dtype)


def shape_part(text: str) -> str:
    return _field(text, lambda t: "[" + ", ".join(map(str, t.shape)) + "]")


def rank_part(text: str) -> str:
    return _field(text, lambda t: str(t.rank))


@dataclass
class Typer:
    """The type relation egglog calls, once per new e-node, with one key string: the node's
    kind (op name or leaf), then its operands' type texts and its attribute values, joined by
    :data:`SEP` (built by the rule in egglog, so a call costs one string crossing over).
    Leaves take the types of the program's inputs and constants. Results are memoized by
    key: layers of one shape share one entry, and the view's re-check is a look-up."""

    input_types: dict[str, Type]
    const_types: dict[int, Type]
    memo: dict[str, str] = field(default_factory=dict)

    def __call__(self, key: str) -> str:
        hit = self.memo.get(key)
        if hit is None:
            try:
                hit = type_text(self.infer(key))
            except (OpTypeError, KeyError, IndexError, ValueError, TypeError):
                hit = ILL_TYPED
            self.memo[key] = hit
        return hit

    def infer(self, key: str) -> Type:
        kind, _, rest = key.partition(SEP)
        if kind == "Input":
            return self.input_types[rest]
        if kind == "Const":
            return self.const_types[int(rest)]
        args = rest.split(SEP)
        if kind == "Scalar":
            return WEAK if args[1] == "weak" else TensorType((), args[1])
        if kind == "MkTuple":
            kids = _types(args if rest else [])
            if any(k == WEAK for k in kids):
                raise OpTypeError("a weak scalar cannot stand in a tuple")
            return TupleType(tuple(kids))
        if kind == "GetItem":
            t, index = _types(args[:1])[0], int(args[1])
            if not isinstance(t, TupleType) or index >= len(t.fields):
                raise OpTypeError(f"projection .{index} of {t}")
            return t.fields[index]
        op = all_ops()[kind]
        n = len(op.inputs)
        if len(args) != n + len(op.attrs):
            raise OpTypeError(f"{kind}: {len(args)} operands and attributes")
        kids = _types(args[:n])
        attrs = {spec.name: decode_attr(spec, v) for spec, v in zip(op.attrs, args[n:])}
        return op.type_rel(resolve_weak(kids), attrs)

    def node_type(self, kind: str, child_texts: list[str], value: Any = None,
                  attrs: tuple = ()) -> str:
        """The view's re-check of one serialized node (a memo hit: egglog asked first)."""
        if kind in ("Input", "Const"):
            parts = [str(value)]
        elif kind == "Scalar":
            parts = list(value)
        elif kind == "GetItem":
            parts = [child_texts[0], str(value)]
        else:
            parts = list(child_texts) + [str(a) for a in attrs]
        return self(SEP.join([kind] + parts))


ACTIVE: list[Typer] = []   # the typer of the session egglog is running for (see type_key)


def type_key(key: str) -> str:
    """What ``$typer`` calls. A plain module function: egglog keeps a PyObject as its pickle,
    and a function pickles by name, so a call costs no copy of the session's tables."""
    return ACTIVE[-1](key)


def _types(texts) -> list[Type]:
    return [TYPES[t] for t in texts]   # a KeyError here is an ill-typed operand (ILL_TYPED)


def pyobject(obj: Any) -> str:
    """An egglog literal for a Python object (``py-object`` of its pickle)."""
    return f'(py-object "{base64.b64encode(pickle.dumps(obj)).decode()}")'


def _typed(target: str, call: str) -> list[str]:
    return [f"(let ?r (py-to-string {call}))", f"(set (type-of {target}) ?r)",
            f"(type-seen {target} ?r)"]


def _rule(query: list[str], actions: list[str], name: str) -> str:
    return (f"(rule ({' '.join(query)})\n      ({' '.join(actions)})\n"
            f"      :ruleset analysis :name {egg_string(name)})")


def _key(kind: str, *parts: str) -> str:
    """The typer's call for a node: its key string is put together in egglog."""
    items = [egg_string(kind)]
    for p in parts:
        items += [f'"{SEP}"', p]
    key = f"(+ {' '.join(items)})" if parts else items[0]
    return f"(py-call $typer (py-from-string {key}))"


def declarations() -> str:
    """The analyses' functions and their rules for the leaves, lists and tuples; run after
    the schema's datatypes. Each op's own rules come with ``op_declarations``, given for the
    ops an e-graph meets (egglog plans a rule as it is declared: a few hundred of them,
    one pair per op of the registry, took longer than loading most programs)."""
    lines = [
        f"(let $typer {pyobject(type_key)})",
        # (a merge cannot call Python inside a run: egglog 13 deadlocks, so the agreement of
        # two merged classes' types is checked by the type-conflict rule over type-seen)
        "(function type-of (Expr) String :merge old)",
        "(relation type-seen (Expr String))",
        "(relation type-conflict (String String))",
        # the dtype, shape and rank of each type text seen so far (a few hundred at most),
        # written by the engine as the typer meets new types: see parts_facts
        "(relation type-parts (String String String String))",
        # each size of each type text, (text, axis, size), the axis also counted from the
        # end (-1 the last): what a shape pattern (shape(?k) == [?n, 1, 1]) looks up
        "(relation type-dim (String i64 i64))",
        "(function dtype-of (Expr) String :merge old)",
        "(function shape-of (Expr) String :merge old)",
        "(function rank-of (Expr) String :merge old)",
        "(function list-types (ExprList) String :merge old)",
        "(relation is-const (Expr))",
        "(relation list-const (ExprList))",
        "(relation is-root (Expr))",     # the program's result
        "(ruleset analysis)",
        _rule(["(type-seen ?e ?a)", "(type-seen ?e ?b)", f'(!= ?a "{ILL_TYPED}")',
               f'(!= ?b "{ILL_TYPED}")', "(!= ?a ?b)"], ["(type-conflict ?a ?b)"],
              "type:conflict"),
        _rule(["(= ?y (type-of ?e))", "(type-parts ?y ?d ?s ?r)"],
              ["(set (dtype-of ?e) ?d)", "(set (shape-of ?e) ?s)", "(set (rank-of ?e) ?r)"],
              "type:parts"),
        # types of the leaves, lists and projections
        _rule(["(= ?e (Input ?n))"], _typed("?e", _key("Input", "?n")), "type:Input"),
        _rule(["(= ?e (Const ?i))"], _typed("?e", _key("Const", "(to-string ?i)")),
              "type:Const"),
        _rule(["(= ?e (Scalar ?v ?d))"], _typed("?e", _key("Scalar", "?v", "?d")),
              "type:Scalar"),
        _rule(["(= ?l (ENil))"], ['(set (list-types ?l) "")'], "type:ENil"),
        _rule(["(= ?l (ECons ?h (ENil)))", "(= ?y (type-of ?h))"],
              ["(set (list-types ?l) ?y)"], "type:ECons1"),
        _rule(["(= ?l (ECons ?h ?t))", "(= ?y (type-of ?h))", "(= ?ys (list-types ?t))",
               '(!= ?ys "")'],
              [f'(set (list-types ?l) (+ ?y "{SEP}" ?ys))'], "type:ECons"),
        _rule(["(= ?e (MkTuple ?l))", "(= ?ys (list-types ?l))"],
              _typed("?e", _key("MkTuple", "?ys")), "type:MkTuple"),
        _rule(["(= ?e (GetItem ?t ?i))", "(= ?y (type-of ?t))"],
              _typed("?e", _key("GetItem", "?y", "(to-string ?i)")), "type:GetItem"),
        # constness
        "(rule ((= ?e (Const ?i))) ((is-const ?e)) :ruleset analysis :name \"const:Const\")",
        "(rule ((= ?e (Scalar ?v ?d))) ((is-const ?e)) :ruleset analysis "
        ":name \"const:Scalar\")",
        "(rule ((= ?l (ENil))) ((list-const ?l)) :ruleset analysis :name \"const:ENil\")",
        "(rule ((= ?l (ECons ?h ?t)) (is-const ?h) (list-const ?t)) ((list-const ?l)) "
        ":ruleset analysis :name \"const:ECons\")",
        "(rule ((= ?e (MkTuple ?l)) (list-const ?l)) ((is-const ?e)) :ruleset analysis "
        ":name \"const:MkTuple\")",
        "(rule ((= ?e (GetItem ?t ?i)) (is-const ?t)) ((is-const ?e)) :ruleset analysis "
        ":name \"const:GetItem\")",
    ]
    return "\n".join(lines) + "\n"


# an op's egglog constructor where egglog text calls it
OP_CALLED = re.compile(r"\((" + re.escape(OP_PREFIX) + r"[^\s()]+)")


def op_declarations(names) -> str:
    """The type and constness rules of the ops whose egglog constructors are ``names``
    (``OP_CALLED``'s finds; a name that is no op's is passed over), for an e-graph holding
    ``declarations()``: declared before the first e-node of the op is (a rule declared
    later sees the e-nodes already there too)."""
    lines = []
    ops = schema().ops
    for op in (ops[n] for n in sorted(names) if n in ops):
        name = egg_name(op)
        args = [f"?a{i}" for i in range(len(op.inputs))]
        attrs = [f"?t{i}" for i in range(len(op.attrs))]
        node = f"(= ?e ({name} {' '.join(args + attrs)}))"
        query = [node] + [f"(= ?y{i} (type-of {a}))" for i, a in enumerate(args)]
        parts = [f"?y{i}" for i in range(len(args))] + \
            [f"(to-string {t})" if attr_sort(spec.kind) == "i64" else t
             for t, spec in zip(attrs, op.attrs)]
        lines.append(_rule(query, _typed("?e", _key(op.name, *parts)), f"type:{op.name}"))
        lines.append(_rule([node] + [f"(is-const {a})" for a in args], ["(is-const ?e)"],
                           f"const:{op.name}"))
    return "\n".join(lines) + "\n"
