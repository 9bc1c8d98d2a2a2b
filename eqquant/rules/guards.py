"""Guards: the conditions after ``if`` (and ``assuming``) in a rule, one class per kind.

Each class owns everything about its kind: how it is read from the parse tree (``parse``),
checked when the file loads (``check``), compiled to egglog query facts (``compile``), how the
rule checker's sampler respects it (``constrain``) and whether an instance satisfies it
(``holds``). A new kind of guard is one class here, one line in ``KINDS`` and its syntax in
``grammar/rules.lark``.

    rule requantize_identity:
        qnn.requantize(?q, ?s, ?z, ?s, ?z, out_dtype=?d)  =>  ?q
        if dtype(?q) == ?d                     # TypeAttr
    if const(?w), rank(?x) == 4, shape(?a) == shape(?b), shape(?k) == [_, 1, 1], ?axis == 1
        # Const,     RankIs,         SameAs,                 ShapeIs,                 AttrIs
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.types import DTYPES
from ..errors import SourceLoc


@dataclass(frozen=True)
class Guard:
    """A condition on the variable ``var`` that the left side binds."""

    var: str
    loc: SourceLoc | None = None
    needs_types: ClassVar[bool] = False     # compiled against the type analysis
    in_if: ClassVar[bool] = True            # printed after ``if`` (else after ``assuming``)

    def check(self, ctx) -> "Guard":
        """The guard, checked against the rule's left side when the file loads (``ctx``:
        ``bound`` values, ``avars`` attribute variables, ``error(message, loc)``)."""
        if self.var not in ctx.bound:
            raise ctx.error(f"guard on {self.var}, which the left side does not bind", self.loc)
        return self

    def variants(self) -> list["Guard"]:
        """The plain guards this one stands for (a choice splits a rule into variants)."""
        return [self]

    def known_dtype(self) -> tuple[str, str] | None:
        """(var, dtype) when the guard fixes ``var``'s dtype."""
        return None

    def compile(self, side) -> list[str]:
        """egglog query facts; ``side`` gives ``fresh`` names and the ``attr_specs``."""
        raise NotImplementedError

    def constrain(self, inst) -> None:
        """Tell the rule checker's sampler (``inst``) what this guard fixes."""

    def holds(self, inst) -> bool:
        """Whether the sampled instance satisfies the guard (the sampler only aims)."""
        return True

    def failure(self, facts) -> str | None:
        """Why the guard does not hold on a match (``facts``: ``type(var)``, ``is_const(var)``,
        ``attr(var)``, ``sizes`` and ``where(var)``, as ``extract.matching`` gives them), or
        None when it holds: ``guard dtype(?w) == int8 failed: ?w is float32 at %12``."""
        return None

    def _failed(self, detail: str) -> str:
        return f"guard {self} failed: {detail}"


def _actual(facts, fn: str, var: str):
    """dtype, rank or shape of what ``var`` is bound to (None: no tensor type)."""
    t = facts.type(var)
    shape = getattr(t, "shape", None)
    if shape is None:
        return None
    return {"dtype": t.dtype, "rank": len(shape), "shape": list(shape)}[fn]


def _show(fn: str, value) -> str:
    if value is None:
        return "not a tensor"
    if fn == "shape":
        return "[" + ", ".join(str(d) for d in value) + "]"
    return str(value)


def _compare(side, fn: str, var: str, op: str, other: str) -> list[str]:
    """``fn(var) op other`` as query facts on the type analysis' ``fn-of`` tables."""
    if op == "!=":
        v = f"?_g{next(side.fresh)}"
        return [f"(= {v} ({fn}-of {var}))", f"(!= {v} {other})"]
    return [f"(= ({fn}-of {var}) {other})"]


def _type_of(inst, fn: str, var: str):
    t = inst.type_of(var)
    if getattr(t, "shape", None) is None:
        return None
    return {"dtype": t.dtype, "rank": len(t.shape), "shape": list(t.shape)}[fn]


@dataclass(frozen=True)
class Const(Guard):
    """``const(?w)``: ?w is a compile-time constant (a weight, a folded value)."""

    def __str__(self) -> str:
        return f"const({self.var})"

    def compile(self, side) -> list[str]:
        return [f"(is-const {self.var})"]

    def failure(self, facts) -> str | None:
        if facts.is_const(self.var):
            return None
        return self._failed(f"{self.var} is computed at run time, at {facts.where(self.var)}")

    @classmethod
    def parse(cls, kids, b, loc) -> "Const":
        return cls(str(kids[0]), loc)


@dataclass(frozen=True)
class Positive(Guard):
    """``assuming positive(?s)``: an invariant of the programs the rule sees (calibrated
    scales are positive). The engine does not test it; the checker draws ?s positive."""

    in_if: ClassVar[bool] = False

    def __str__(self) -> str:
        return f"positive({self.var})"

    def check(self, ctx) -> "Guard":
        if self.var not in ctx.bound:
            raise ctx.error(f"assuming positive({self.var}): the left side does not bind "
                            f"{self.var}", self.loc)
        return self

    def compile(self, side) -> list[str]:
        return []

    def constrain(self, inst) -> None:
        inst.positive.add(self.var.lstrip("?"))

    @classmethod
    def parse(cls, kids, b, loc) -> "Positive":
        return cls(str(kids[0]), loc)


@dataclass(frozen=True)
class AttrIs(Guard):
    """``?a == value`` / ``?a != value``: an attribute variable compared with a literal."""

    op: str = "=="
    value: Any = None

    def __str__(self) -> str:
        return f"{self.var} {self.op} {self.value}"

    def check(self, ctx) -> "Guard":
        from ..ops.attrs import AttrValueError
        if self.var not in ctx.avars:
            raise ctx.error(f"{self.var} is not an attribute variable of the left side",
                            self.loc)
        op, key = ctx.avars[self.var]
        if key == "..":
            raise ctx.error(f"{self.var} is a ..rest; it cannot be compared", self.loc)
        for o in op.ops:
            try:
                o.attr_map[key].kind.canonical(self.value)
            except AttrValueError as e:
                raise ctx.error(f"{self.var} is {o.name}'s '{key}', which expects {e}",
                                self.loc) from None
        return self

    def compile(self, side) -> list[str]:
        from ..egraph.schema import encode_attr
        _, spec = side.attr_specs[self.var]
        lit = encode_attr(spec, spec.kind.canonical(self.value))
        return [f"({'!=' if self.op == '!=' else '='} {self.var} {lit})"]

    def constrain(self, inst) -> None:
        (inst.attr_eq if self.op == "==" else inst.attr_ne)[self.var] = self.value

    def failure(self, facts) -> str | None:
        from ..ops.attrs import format_value
        got = facts.attr(self.var)
        same = format_value(got) == format_value(self.value)
        if same == (self.op == "=="):
            return None
        return self._failed(f"{self.var} is {format_value(got)} at {facts.where(self.var)}")

    @classmethod
    def parse(cls, kids, b, loc) -> "AttrIs":
        var, cmp, value = kids
        return cls(str(var), loc, str(cmp), b.attr_value(value).value)


@dataclass(frozen=True)
class _TypeGuard(Guard):
    """``fn(?x) op value`` for a type function fn (dtype, rank, shape)."""

    fn: ClassVar[str] = ""
    needs_types: ClassVar[bool] = True
    op: str = "=="
    value: Any = None

    def __str__(self) -> str:
        return f"{self.fn}({self.var}) {self.op} {self.rhs()}"

    def rhs(self) -> str:
        return str(self.value)

    def literal(self) -> str:
        """The value as the analysis keeps it (an egglog String)."""
        from ..egraph.schema import egg_string
        return egg_string(str(self.value))

    def compile(self, side) -> list[str]:
        return _compare(side, self.fn, self.var, self.op, self.literal())

    def constrain(self, inst) -> None:
        if self.op == "==":       # the sampler's table of fixed dtypes, ranks or shapes
            getattr(inst, self.fn)[self.var] = self.value

    def holds(self, inst) -> bool:
        return (_type_of(inst, self.fn, self.var) == self.value) == (self.op == "==")

    def failure(self, facts) -> str | None:
        got = _actual(facts, self.fn, self.var)
        if self._matches(got, facts) == (self.op == "=="):
            return None
        return self._failed(f"{self.var} is {_show(self.fn, got)} at {facts.where(self.var)}")

    def _matches(self, got, facts) -> bool:
        return got == (list(self.value) if self.fn == "shape" else self.value)


@dataclass(frozen=True)
class DtypeIs(_TypeGuard):
    """``dtype(?x) == int8``."""

    fn: ClassVar[str] = "dtype"

    def known_dtype(self):
        return (self.var, self.value) if self.op == "==" else None

    @classmethod
    def parse(cls, fn, var, cmp, value, b, loc) -> "DtypeIs":
        name = str(value.children[0])
        if value.data != "g_name" or name not in DTYPES:
            raise b.error(f"dtype(...) compares with a dtype ({', '.join(DTYPES)})", loc)
        return cls(var, loc, cmp, name)


@dataclass(frozen=True)
class DtypeIn(Guard):
    """``dtype(?x) in {int8, uint8}``: the rule stands for one variant per choice (each with
    a ``dtype(?x) == choice`` guard), made when the file loads."""

    dtypes: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"dtype({self.var}) in {{{', '.join(self.dtypes)}}}"

    def variants(self) -> list[Guard]:
        return [DtypeIs(self.var, self.loc, "==", d) for d in self.dtypes]

    def compile(self, side) -> list[str]:
        raise AssertionError("a dtype choice is split into variants before it compiles")

    def failure(self, facts) -> str | None:
        got = _actual(facts, "dtype", self.var)
        if got in self.dtypes:
            return None
        return self._failed(f"{self.var} is {_show('dtype', got)} at {facts.where(self.var)}")

    @classmethod
    def parse(cls, kids, b, loc) -> "DtypeIn":
        fn, var, *names = (str(c) for c in kids)
        if fn != "dtype" or any(n not in DTYPES for n in names):
            raise b.error(f"only dtype(...) in {{...}} is supported, with dtypes "
                          f"({', '.join(DTYPES)})", loc)
        return cls(var, loc, tuple(dict.fromkeys(names)))


@dataclass(frozen=True)
class RankIs(_TypeGuard):
    """``rank(?x) == 4`` (the analysis keeps ranks as text)."""

    fn: ClassVar[str] = "rank"

    @classmethod
    def parse(cls, fn, var, cmp, value, b, loc) -> "RankIs":
        text = str(value.children[0])
        if value.data != "g_number" or not text.isdigit() or len(text) > 2:
            raise b.error("rank(...) compares with a rank: an integer from 0 to 99", loc)
        return cls(var, loc, cmp, int(text))


REST = ".."      # in a shape pattern: any number of sizes


@dataclass(frozen=True)
class ShapeIs(_TypeGuard):
    """``shape(?x) == [1, 64, 1, 1]``, or a shape pattern: ``_`` is any size, ``?n`` a size
    variable (the same size wherever the rule's guards name it), and ``..`` at either end
    any number of sizes::

        if shape(?q) == [_, ?n, _, _], shape(?k) == [?n, 1, 1]     # ?k: one per channel
        if shape(?x) == [.., ?n], shape(?b) == [?n]                # ?b: along the last axis

    A literal shape is one string comparison on the analysis' ``shape-of``; a pattern is the
    rank (unless it has ``..``) and one look-up in its ``type-dim`` table per size it names,
    which egglog joins on the size variables."""

    fn: ClassVar[str] = "shape"

    def rhs(self) -> str:
        return "[" + ", ".join("_" if d is None else str(d) for d in self.value) + "]"

    def literal(self) -> str:
        from ..egraph.schema import egg_string
        from ..ops.attrs import format_value
        return egg_string(format_value(list(self.value)))

    @property
    def is_pattern(self) -> bool:
        return any(not isinstance(d, int) for d in self.value)

    def sizes(self):
        """(axis, size) for each entry that names a size: axes count from the end when the
        pattern opens with ``..``."""
        dims = list(self.value)
        if dims and dims[0] == REST:
            return [(i - len(dims), d) for i, d in enumerate(dims[1:], 1)
                    if d is not None]
        return [(i, d) for i, d in enumerate(dims) if d is not None and d != REST]

    def compile(self, side) -> list[str]:
        if not self.is_pattern:
            return super().compile(side)
        t = f"?_g{next(side.fresh)}"
        facts = [f"(= {t} (type-of {self.var}))"]
        if REST not in self.value:
            facts.append(f'(= (rank-of {self.var}) "{len(self.value)}")')
        return facts + [f"(type-dim {t} {i} {size_var(d) if isinstance(d, str) else d})"
                        for i, d in self.sizes()]

    def fits(self, shape, sizes: dict[str, int]) -> bool:
        """Whether ``shape`` fits the pattern, binding its size variables in ``sizes``."""
        if shape is None:
            return False
        rest = REST in self.value
        fixed = len(self.value) - rest
        if len(shape) < fixed or (not rest and len(shape) != fixed):
            return False
        for i, d in self.sizes():
            n = shape[i]
            if isinstance(d, str):
                if sizes.setdefault(d, n) != n:
                    return False
            elif d != n:
                return False
        return True

    def holds(self, inst) -> bool:
        return self.fits(_type_of(inst, "shape", self.var), inst.sizes) == (self.op == "==")

    def _matches(self, got, facts) -> bool:
        if not self.is_pattern:
            return got == list(self.value)
        sizes = dict(facts.sizes)       # (bound only if the whole pattern fits)
        if not self.fits(got, sizes):
            return False
        facts.sizes.update(sizes)
        return True

    @classmethod
    def parse(cls, fn, var, cmp, value, b, loc) -> "ShapeIs":
        if value.data != "g_ints":
            raise b.error("shape(...) compares with a list of sizes (a shape pattern: "
                          "[1, _, ?n, ..]), shape(?y) or an attribute variable", loc)
        words = re.findall(r"\.\.|-?\d+|_|\?[A-Za-z_]\w*", str(value.children[0]))
        dims = tuple(None if w == "_" else w if w[0] in "?." else int(w) for w in words)
        if any(isinstance(d, int) and abs(d) >= 2 ** 63 for d in dims):
            raise b.error("bad literal: a shape entry does not fit int64", loc)
        if dims.count(REST) > 1 or REST in dims[1:-1]:
            raise b.error("a shape pattern has `..` once at most, first or last", loc)
        if any(not isinstance(d, int) for d in dims) and cmp != "==":
            raise b.error("a shape pattern with `_`, `..` or a size variable can only be "
                          "matched (==)", loc)
        return cls(var, loc, cmp, dims)


def size_var(name: str) -> str:
    """The egglog variable of a shape pattern's size variable ``?n``."""
    return f"?_size_{name.lstrip('?')}"


@dataclass(frozen=True)
class _Between(Guard):
    """``fn(?x) op <other>``: a type compared with something the left side binds."""

    fn: str = "shape"
    op: str = "=="
    other: str = ""
    needs_types: ClassVar[bool] = True

    def __str__(self) -> str:
        return f"{self.fn}({self.var}) {self.op} {self.right()}"

    def right(self) -> str:
        return self.other


@dataclass(frozen=True)
class SameAs(_Between):
    """``shape(?a) == shape(?b)`` (or dtype, rank): two values' types compared."""

    def right(self) -> str:
        return f"{self.fn}({self.other})"

    def check(self, ctx) -> "Guard":
        super().check(ctx)
        if self.other not in ctx.bound:
            raise ctx.error(f"guard on {self.other}, which the left side does not bind",
                            self.loc)
        return self

    def compile(self, side) -> list[str]:
        other = f"({self.fn}-of {self.other})"
        if self.op == "!=":
            return _compare(side, self.fn, self.var, self.op, other)
        # a filter on the two looked-up values, not a join on them (every class has a
        # shape; most share one, and egglog's planner would join the two shape tables
        # before the pattern narrows them)
        v, w = f"?_g{next(side.fresh)}", f"?_g{next(side.fresh)}"
        return [f"(= {v} ({self.fn}-of {self.var}))", f"(= {w} {other})",
                f'(= {w} (+ {v} ""))']

    def constrain(self, inst) -> None:
        if self.fn in ("shape", "dtype") and self.op == "==":
            same = inst.same_shape if self.fn == "shape" else inst.same_dtype
            same[self.var] = self.other
            same[self.other] = self.var

    def holds(self, inst) -> bool:
        same = _type_of(inst, self.fn, self.var) == _type_of(inst, self.fn, self.other)
        return same == (self.op == "==")

    def failure(self, facts) -> str | None:
        a, b = _actual(facts, self.fn, self.var), _actual(facts, self.fn, self.other)
        if (a == b) == (self.op == "=="):
            return None
        return self._failed(f"{self.var} is {_show(self.fn, a)} at {facts.where(self.var)}, "
                            f"{self.other} is {_show(self.fn, b)} at "
                            f"{facts.where(self.other)}")

    @classmethod
    def parse(cls, fn, var, cmp, value, b, loc) -> "SameAs":
        other_fn, other = str(value.children[0]), str(value.children[1])
        if other_fn != fn:
            raise b.error(f"cannot compare {fn}(...) with {other_fn}(...)", loc)
        return cls(var, loc, fn, cmp, other)


@dataclass(frozen=True)
class TypeAttr(_Between):
    """``dtype(?x) == ?d`` or ``shape(?x) == ?s``: a type compared with an attribute
    variable of the left side (a cast's dtype, a reshape's newshape)."""

    def check(self, ctx) -> "Guard":
        super().check(ctx)
        if self.fn not in ("shape", "dtype") or self.other not in ctx.avars:
            raise ctx.error(f"{self.other} is not an attribute variable of the left side "
                            "(shape(...) and dtype(...) compare with one)", self.loc)
        return self

    def compile(self, side) -> list[str]:
        return _compare(side, self.fn, self.var, self.op, self.other)

    def constrain(self, inst) -> None:
        if self.op == "==":
            (inst.shape_attr if self.fn == "shape" else inst.dtype_attr)[self.other] = self.var

    def holds(self, inst) -> bool:
        right = inst.attrs.get(self.other)
        right = list(right or []) if self.fn == "shape" else right
        return (_type_of(inst, self.fn, self.var) == right) == (self.op == "==")

    def failure(self, facts) -> str | None:
        right = facts.attr(self.other)
        right = list(right or []) if self.fn == "shape" else right
        got = _actual(facts, self.fn, self.var)
        if (got == right) == (self.op == "=="):
            return None
        return self._failed(f"{self.var} is {_show(self.fn, got)} at {facts.where(self.var)}, "
                            f"{self.other} is {_show(self.fn, right)}")

    @classmethod
    def parse(cls, fn, var, cmp, value, b, loc) -> "TypeAttr":
        return cls(var, loc, fn, cmp, str(value.children[0]))


def _type_guard(kids, b, loc) -> Guard:
    """``fn(?x) op value``: the class is chosen by what the value is."""
    fn, var, cmp, value = str(kids[0]), str(kids[1]), str(kids[2]), kids[3]
    if value.data == "g_of":
        return SameAs.parse(fn, var, cmp, value, b, loc)
    if value.data == "g_var" and fn in ("dtype", "shape"):
        return TypeAttr.parse(fn, var, cmp, value, b, loc)
    kind = {"dtype": DtypeIs, "rank": RankIs, "shape": ShapeIs}[fn]
    return kind.parse(fn, var, cmp, value, b, loc)


# grammar rule (rules.lark) -> reader of its parse-tree children
KINDS = {
    "const_guard": Const.parse,
    "attr_guard": AttrIs.parse,
    "type_in_guard": DtypeIn.parse,
    "type_guard": _type_guard,
    "assumption": Positive.parse,
}


def with_choices(guards: list[Guard]) -> list[list[Guard]]:
    """Every combination of the guards' variants (one list of plain guards each)."""
    import itertools
    return [list(combo) for combo in itertools.product(*[g.variants() for g in guards])]
