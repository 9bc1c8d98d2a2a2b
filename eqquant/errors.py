"""Located errors shared by every stage.

Every error a user can cause carries a :class:`SourceLoc` when one is known and formats itself
the way compilers do::

    model.ir:3:17: error: nn.conv2d: argument 'weight' has 3 dimensions, expected 4
        %0 = nn.conv2d(%data, %w, padding=[1, 1]);
                              ^

The CLI prints ``err.format()`` and exits with status 2; it never shows a traceback.
"""
from __future__ import annotations

from dataclasses import dataclass


QUOTED = 160        # the most of a source line an error quotes (around its column)


@dataclass(frozen=True)
class SourceLoc:
    """A position in a source text (1-based line and column)."""

    file: str
    line: int
    column: int
    source: str | None = None  # the whole text, to quote the line

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def quote(self) -> str:
        if self.source is None:
            return ""
        lines = self.source.splitlines()
        if not 1 <= self.line <= len(lines):
            return ""
        text = lines[self.line - 1].expandtabs(1)
        at = self.column - 1
        if len(text) > QUOTED:             # (a long line: the part around the column)
            start = max(0, min(at - QUOTED // 2, len(text) - QUOTED))
            cut = text[start:start + QUOTED]
            text = ("..." if start else "") + cut + ("..." if start + QUOTED < len(text) else "")
            at = at - start + (3 if start else 0)
        return f"    {text}\n    {' ' * at}^"


class EqquantError(Exception):
    """Base of all user-facing errors."""

    kind = "error"

    def __init__(self, message: str, loc: SourceLoc | None = None):
        super().__init__(message)
        self.message = message
        self.loc = loc

    def format(self) -> str:
        head = f"{self.loc}: " if self.loc else ""
        text = f"{head}{self.kind}: {self.message}"
        quote = self.loc.quote() if self.loc else ""
        return f"{text}\n{quote}" if quote else text

    def __str__(self) -> str:
        return self.format()


class ParseError(EqquantError):
    """The text is not in the language (syntax)."""

    kind = "syntax error"


class NameError_(EqquantError):
    """A value is used before it is defined, or defined twice."""

    kind = "name error"


class AttrError(EqquantError):
    """An attribute is unknown or has a value of the wrong kind."""

    kind = "attribute error"


class ArityError(EqquantError):
    """An op is called with the wrong number of arguments."""

    kind = "arity error"


class TypeCheckError(EqquantError):
    """Shapes or dtypes do not fit an op's type relation, or a ``/* ty= */`` annotation;
    ``arg``: the index of the operand the relation refused, where it names one."""

    kind = "type error"

    def __init__(self, message: str, loc: SourceLoc | None = None, arg: int | None = None):
        super().__init__(message, loc)
        self.arg = arg


class UnknownOpError(EqquantError):
    kind = "unknown op"


class ParamsError(EqquantError):
    """A params file is missing, malformed, or does not fit the program."""

    kind = "params error"


class RuleError(EqquantError):
    """A rules file is malformed or a rule is ill-formed (checked when the file loads)."""

    kind = "rule error"


class IllTypedRewrite(RuleError):
    """A rewrite made two values of different types equal: the rule is wrong (or its guards
    too weak). Raised by the engine, naming the rule and the two types."""

    kind = "ill-typed rewrite"


class EvalError(EqquantError):
    """The interpreter cannot run the program (missing input, unbound constant...)."""

    kind = "evaluation error"


class KernelError(EqquantError):
    """A call site names a kernel that cannot run it: the target does not offer it, or it does
    not apply to the site (``runtime/lowering/plan.py`` says why)."""

    kind = "kernel error"
