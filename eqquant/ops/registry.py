"""The op registry: one entry per op, the single source of truth.

An entry gives the op's inputs, its attributes with kinds and defaults, its type relation
(shapes and dtypes of the result from those of the inputs), its reference semantics in numpy and
the property sets rules and cost models use to cover many ops at once. The parser, the type
checker, the interpreter, the e-graph schema, the runtime and the cost models all read it; adding
an op is one ``register(OpDef(...))`` call in ``eqquant/ops/*.py`` and nothing else.

Worked example (``eqquant/ops/tensor.py``)::

    register(OpDef(
        "nn.relu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
        type_rel=same_as_input, semantics=lambda x: np.maximum(x, 0).astype(x.dtype),
        doc="max(x, 0)"))
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import AttrError, UnknownOpError
from ..ir.types import Type
from .attrs import REQUIRED, Attr, AttrValueError

# Property sets: a rule or a cost model may name a set instead of listing ops.
ELEMWISE = "elementwise"   # output element i depends only on input element(s) i
UNARY = "unary"
BINARY = "binary"          # two inputs, numpy broadcasting
IDENTITY = "identity"      # semantically the identity on its first input (annotations)
ANNOTATION = "annotation"
POOL = "pool"
REDUCE = "reduce"
LAYOUT = "layout"          # moves data without arithmetic (reshape, transpose...)
COMPUTE = "compute"        # heavy ops: conv2d, dense
EPILOGUE = "epilogue"      # an activation a quantized op applies to its accumulator (relu, clip)
SELECTS = "selects"        # every output element is one of the input's elements (max pools)
QUANT = "quant"


class OpTypeError(Exception):
    """Raised by a type relation; ``arg`` is the index of the offending input, if one is."""

    def __init__(self, message: str, arg: int | None = None):
        super().__init__(message)
        self.message = message
        self.arg = arg


TypeRel = Callable[[Sequence[Type], Mapping[str, Any]], Type]


@dataclass(frozen=True, eq=False)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    type_rel: TypeRel
    semantics: Callable[..., Any]  # semantics(*arrays, **attrs) -> array or tuple of arrays
    attrs: tuple[Attr, ...] = ()
    props: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""
    # cost: arithmetic per call (default: one per output element), and whether the op moves
    # data at all (a reshape is a view, an annotation is nothing at run time)
    flops: Callable[..., float] | None = None   # flops(in_types, out_type, attrs)
    moves_data: bool = True
    # attributes in the form the e-graph keeps, given the input types (e.g. reshape's 0s
    # resolved to the dimensions they copy, so that reshape chains collapse)
    canonicalize: Callable[..., dict] | None = None
    # a fused op's unfused form: unfuse(args, attrs) -> Expr (the partition view prints it)
    unfuse: Callable[..., Any] | None = None
    # the CPU kernel binding, "module:Class" (imported only when a program runs)
    kernel: str | None = None

    def __repr__(self) -> str:
        return f"<op {self.name}>"

    @property
    def attr_map(self) -> dict[str, Attr]:
        return {a.name: a for a in self.attrs}

    def canonical_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Check and canonicalise ``given`` and fill in defaults. Raises AttrError with the
        attribute's name in ``.attr`` for the caller to locate."""
        known = self.attr_map
        out: dict[str, Any] = {}
        for key, value in given.items():
            spec = known.get(key)
            if spec is None:
                err = AttrError(f"{self.name} has no attribute '{key}'"
                                + (f" (it has: {', '.join(known)})" if known else
                                   " (it takes no attributes)"))
                err.attr = key  # type: ignore[attr-defined]
                raise err
            try:
                out[key] = spec.kind.canonical(value)
            except AttrValueError as e:
                err = AttrError(f"{self.name}: attribute '{key}' expects {e}, got {value!r}")
                err.attr = key  # type: ignore[attr-defined]
                raise err from None
        missing = [a.name for a in self.attrs if a.default is REQUIRED and a.name not in out]
        if missing:
            raise AttrError(f"{self.name} needs the attribute{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}")
        return {a.name: out.get(a.name, a.default) for a in self.attrs}

    def printed_attrs(self, attrs: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Attributes that differ from their defaults, in declaration order, as text."""
        from ..ir.nodes import _values_equal
        return [(a.name, a.kind.format(attrs[a.name])) for a in self.attrs
                if a.name in attrs and (a.default is REQUIRED
                                        or not _values_equal(attrs[a.name], a.default))]


_OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise ValueError(f"op {op.name} registered twice")
    _OPS[op.name] = op
    return op


def _ensure_loaded() -> None:
    if not _OPS:
        from . import fused, nn, qnn, quant, tensor  # noqa: F401  (registration side effects)


def get_op(name: str) -> OpDef:
    _ensure_loaded()
    op = _OPS.get(name)
    if op is None:
        import difflib
        close = difflib.get_close_matches(name, _OPS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UnknownOpError(f"unknown op '{name}'{hint}")
    return op


def has_op(name: str) -> bool:
    _ensure_loaded()
    return name in _OPS


def all_ops() -> dict[str, OpDef]:
    _ensure_loaded()
    return dict(_OPS)


def ops_with(prop: str) -> list[OpDef]:
    _ensure_loaded()
    return [op for op in _OPS.values() if prop in op.props]
