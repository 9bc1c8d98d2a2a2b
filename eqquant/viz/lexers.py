"""Pygments lexers for eqquant's two languages: rule files (``.rules``) and the text IR
(``.ir``), registered as ``pygments.lexers`` entry points (``pyproject.toml``), so the manual
and any Pygments-based viewer highlight them (a fenced block marked ``rules`` or
``eqquant-ir``). TVMScript is Python, and Python's lexer reads it.

Their tokens follow the grammars (``grammar/rules.lark``, ``grammar/relay.lark``); they are
for reading, never for parsing: a file that lexes is not thereby valid.
"""
from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (Comment, Keyword, Name, Number, Operator, Punctuation, String,
                            Text, Whitespace)

_NUMBER = r"-?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?(f16|f32|f64|f|i8|i16|i32|i64|u8|u16|u32|u64)?\b"
_OP = r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*(?=\s*\()"       # an op or function called: nn.conv2d(
_STRING = r'"(\\\\|\\"|[^"])*"'


class RulesLexer(RegexLexer):
    """eqquant's rules language: rulesets of named identities between patterns."""

    name = "eqquant rules"
    aliases = ["rules", "eqquant-rules"]
    filenames = ["*.rules"]
    mimetypes = ["text/x-eqquant-rules"]

    tokens = {
        "root": [
            (r"\s+", Whitespace),
            (r"#.*?$", Comment.Single),
            (words(("ruleset", "include"), suffix=r"\b"), Keyword.Namespace),
            (r"(approx)(\s+)(rule)(\s+)([A-Za-z_]\w*)",
             bygroups(Keyword, Whitespace, Keyword, Whitespace, Name.Function)),
            (r"(rule)(\s+)([A-Za-z_]\w*)", bygroups(Keyword, Whitespace, Name.Function)),
            (words(("where", "if", "assuming", "in", "for"), suffix=r"\b"), Keyword),
            (words(("True", "False"), suffix=r"\b"), Keyword.Constant),
            (words(("dtype", "rank", "shape", "const", "positive"), suffix=r"(?=\s*\()"),
             Name.Builtin),
            (r"<=>|=>|==|!=", Operator),
            (r"\.\.\?[A-Za-z_]\w*|\?[A-Za-z_]\w*", Name.Variable),
            (r"\.\.", Operator),
            (_STRING, String.Double),
            (_OP, Name.Function),
            (r"[A-Za-z_]\w*(?=\s*=[^=>])", Name.Attribute),
            (_NUMBER, Number),
            (r"[A-Za-z_][\w.]*", Name),
            (r"[(){}\[\],:.=_]", Punctuation),
        ],
    }


class TextIRLexer(RegexLexer):
    """eqquant's text IR: Relay's text format (``def @main(%x: Tensor[...]) { ... }``)."""

    name = "eqquant text IR"
    aliases = ["eqquant-ir", "relay-ir"]
    filenames = ["*.ir"]
    mimetypes = ["text/x-eqquant-ir"]

    tokens = {
        "root": [
            (r"\s+", Whitespace),
            (r"#\[.*?\]", Comment.Preproc),
            (r"//.*?$", Comment.Single),
            (r"/\*", Comment.Multiline, "comment"),
            (words(("def", "fn", "let", "free_var"), suffix=r"\b"), Keyword),
            (r"meta\b", Keyword.Pseudo),
            (words(("Tensor", "Tuple"), suffix=r"\b"), Keyword.Type),
            (words(("True", "False"), suffix=r"\b"), Keyword.Constant),
            (r"@[A-Za-z_][\w.]*", Name.Function),
            (r"%[\w.]+(?:::[\w.]+)*", Name.Variable),      # (%aten::conv_0.weight)
            (_STRING, String.Double),
            (_OP, Name.Function),
            (r"[A-Za-z_]\w*(?=\s*=)", Name.Attribute),
            (_NUMBER, Number),
            (r"[A-Za-z_][\w.]*", Name),
            (r"->", Operator),
            (r"[(){}\[\],:;.=?]", Punctuation),
            (r".", Text),
        ],
        "comment": [
            (r"[^*]+", Comment.Multiline),
            (r"\*/", Comment.Multiline, "#pop"),
            (r"\*", Comment.Multiline),
        ],
    }
