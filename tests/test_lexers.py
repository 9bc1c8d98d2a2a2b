"""The Pygments lexers of the rules language and the text IR (eqquant/viz/lexers.py): found
by name and by file name through their entry points, and every shipped rule file and a
printed program lexed without an error token, each construct its own kind of token."""
from __future__ import annotations

from pathlib import Path

import pytest

pygments = pytest.importorskip("pygments", reason="Pygments comes with the docs extra")
from pygments.token import Error, Keyword, Name, Operator  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _tokens(lexer, text):
    return [(t, v) for t, v in lexer.get_tokens(text) if v.strip()]


def test_the_lexers_are_found_by_name_and_file_name():
    from pygments.lexers import get_lexer_by_name, get_lexer_for_filename
    from eqquant.viz.lexers import RulesLexer, TextIRLexer
    assert isinstance(get_lexer_by_name("rules"), RulesLexer)
    assert isinstance(get_lexer_for_filename("bn_fold.rules"), RulesLexer)
    assert isinstance(get_lexer_by_name("eqquant-ir"), TextIRLexer)
    assert isinstance(get_lexer_for_filename("resnet18.ir"), TextIRLexer)


def test_every_shipped_rule_file_lexes_cleanly():
    from eqquant.viz.lexers import RulesLexer
    files = sorted((ROOT / "rules").glob("*.rules"))
    assert len(files) >= 6
    for path in files:
        toks = _tokens(RulesLexer(), path.read_text(encoding="utf-8"))
        assert not [v for t, v in toks if t in Error], path.name
        kinds = {(t, v) for t, v in toks}
        assert (Keyword.Namespace, "ruleset") in kinds, path.name
        assert any(t in Name.Variable and v.startswith("?") for t, v in toks), path.name
        assert any(t in Operator and v in ("=>", "<=>") for t, v in toks), path.name
    toks = _tokens(RulesLexer(), "approx rule f (rtol=0, atol=1e-5, scale=terms):\n"
                                 "    nn.relu(?x, ..?rest) => ?x  # why\n"
                                 "    if dtype(?x) == int8\n")
    assert (Name.Function, "f") in toks and (Name.Function, "nn.relu") in toks
    assert (Name.Variable, "..?rest") in toks and (Name.Builtin, "dtype") in toks


def test_a_printed_program_lexes_cleanly():
    from eqquant.ir.printer import print_module
    from eqquant.viz.lexers import TextIRLexer
    from eqquant.zoo import build
    text = print_module(build("resnet18_stem", image_size=32).module, show_types=True)
    toks = _tokens(TextIRLexer(), text)
    assert not [v for t, v in toks if t in Error]
    assert (Name.Variable, "%0") in toks and (Name.Function, "nn.conv2d") in toks
    assert (Name.Function, "@main") in toks and (Keyword.Type, "Tensor") in toks
