"""A bound on how deeply a text may nest brackets, checked before it is parsed.

The parser's tree builder, the printer, the type checker and the interpreter walk nested
expressions recursively; a program nested thousands deep (calls inside calls, tuples, lists,
inline functions) would exhaust Python's stack somewhere along the pipeline. A chain of
bindings (``%1 = f(%0); %2 = f(%1); ...``) is not nesting and has no such bound: only
brackets inside one expression count.

    check_nesting(text, "model.ir")   # ParseError at the bracket that goes too deep
"""
from __future__ import annotations

import re

from ..errors import ParseError, SourceLoc

MAX_NESTING = 200

# strings and comments first, so that brackets inside them do not count; per language
_COMMON = r'"(?:\\.|[^"\\\n])*"|[(\[{]|[)\]}]'
_TOKENS = {"ir": re.compile(r"/\*.*?\*/|//[^\n]*|" + _COMMON, re.S),
           "rules": re.compile(r"#[^\n]*|" + _COMMON, re.S)}


def check_nesting(text: str, file: str, language: str = "ir",
                  limit: int = MAX_NESTING) -> None:
    """Raise a located ParseError if brackets nest deeper than ``limit`` in ``text`` (the IR's
    or the rules' language: they differ in their comments)."""
    depth = 0
    for m in _TOKENS[language].finditer(text):
        tok = m.group()
        if tok in "([{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, m.start()) + 1
                col = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
                raise ParseError(f"brackets nest more than {limit} deep here; bind inner "
                                 f"values to names (%0 = ...;) instead",
                                 SourceLoc(file, line, col, text))
        elif tok in ")]}":
            depth = max(depth - 1, 0)
