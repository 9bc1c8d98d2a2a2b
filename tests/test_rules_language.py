"""The rules language: what a file compiles to, and static errors at file:line:col."""
import subprocess
import sys

import pytest

from eqquant.errors import ParseError, RuleError
from eqquant.rules.ast import format_rule
from eqquant.rules.compile import compile_ruleset
from eqquant.rules.loader import parse_rules

GOOD = """ruleset demo
# relu is idempotent.
rule relu_relu: nn.relu(nn.relu(?x)) => nn.relu(?x)
rule fold: nn.batch_norm(nn.conv2d(?x, ?w, ..?c), ?g, ?b, ?m, ?v, epsilon=?eps).0
    => nn.conv2d(?x, multiply(?w, ?k), ..?c)
    where ?k = divide(?g, sqrt(add(?v, ?eps)))
    if const(?w), dtype(?x) == float32
rule comm: add(?a, ?b) <=> add(?b, ?a)
"""


def test_compiles_to_egglog_with_names_and_guards():
    rs = parse_rules(GOOD, "demo.rules")
    assert rs.name == "demo" and [r.name for r in rs.rules] == ["relu_relu", "fold", "comm"]
    assert rs.rules[0].doc == "relu is idempotent."
    assert str(rs.rules[1].loc) == "demo.rules:4:6"
    text = compile_ruleset(rs).text
    assert "(ruleset rs.demo)" in text
    assert ':name "relu_relu"' in text and ':name "comm<-"' in text
    assert "(is-const ?w)" in text and '(= (dtype-of ?x) "float32")' in text
    assert '(Scalar ?eps "weak")' in text  # an attribute used as a value is a weak scalar
    assert "need-types" not in text        # types are an analysis: a guard just reads them
    again = parse_rules("\n".join(format_rule(r) for r in rs.rules), "again.rules")
    assert [format_rule(r) for r in again.rules] == [format_rule(r) for r in rs.rules]


def test_rules_show_egglog_cli():
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "rules", "show", "--egglog",
                        "bn_fold"], capture_output=True, text=True)
    assert r.returncode == 0 and "(rule ((= ?__root (GetItem (@nn.batch_norm" in r.stdout


# (name, source, error class, line, column, a word of the message)
BAD = [
    ("syntax", "rule r: nn.relu(?x => ?x\n", ParseError, 1, 20, "expected"),
    ("unknown op", "rule r: nn.rellu(?x) => ?x\n", RuleError, 1, 9, "nn.relu"),
    ("unknown op set", "rule r: {nosuch}(?x) => ?x\n", RuleError, 1, 10, "property"),
    ("unknown attribute", "rule r: nn.relu(?x, alpha=1) => ?x\n", RuleError, 1, 21, "alpha"),
    ("wrong arity", "rule r: add(?x) => ?x\n", RuleError, 1, 9, "takes 2"),
    ("unbound variable", "rule r: nn.relu(?x) => add(?x, ?y)\n", RuleError, 1, 32, "?y"),
    ("value and attribute", "rule r: add(reshape(?x, newshape=?x), ?y) => ?y\n", RuleError, 1,
     9, "both"),
    ("dtype mismatch", "rule r: nn.relu(?x) => add(?x, 1i8)\n    if dtype(?x) == float32\n",
     RuleError, 1, 24, "dtype"),
    ("bad attribute value", 'rule r: cast(?x, dtype="int7") => ?x\n', RuleError, 1, 18,
     "dtype"),
    ("left side not an op", "rule r: ?x => nn.relu(?x)\n", RuleError, 1, 9, "left side"),
    ("duplicate rule", "rule r: nn.relu(?x) => ?x\nrule r: negative(?x) => ?x\n", RuleError,
     2, 1, "twice"),
    ("approx option", "approx rule r (tol=1): nn.relu(?x) => ?x\n", RuleError, 1, 16, "tol"),
    ("missing include", 'include "nope.rules"\n', RuleError, 1, 1, "nope"),
    ("unbound rest", "rule r: nn.conv2d(?x, ?w) => nn.conv2d(?x, ?w, ..?c)\n", RuleError, 1,
     30, "..?c"),
    ("guard on unbound", "rule r: nn.relu(?x) => ?x\n    if const(?z)\n", RuleError, 2, 8,
     "?z"),
    ("op set only on the right", "rule r: nn.relu(?x) => {nn.relu, abs}(?x)\n", RuleError, 1,
     24, "op set"),
    ("bad dtype guard", "rule r: nn.relu(?x) => ?x\n    if dtype(?x) == float33\n", RuleError,
     2, 8, "dtype"),
    ("bad dtype set", "rule r: nn.relu(?x) => ?x\n    if dtype(?x) in {int8, int9}\n",
     RuleError, 2, 8, "dtype"),
    ("rank set", "rule r: nn.relu(?x) => ?x\n    if rank(?x) in {int8}\n", RuleError, 2, 8,
     "only dtype"),
    ("dtype against a value", "rule r: add(?x, ?y) => ?x\n    if dtype(?x) == ?y\n", RuleError,
     2, 8, "attribute variable"),
    ("dtype attribute on the left", "rule r: qnn.codes(dtype=dtype(?q)) => ?q\n", RuleError,
     1, 25, "right side only"),
    ("dtype attribute unfixed",
     "rule r: nn.relu(?q) => qnn.lut(?q, qnn.codes(dtype=dtype(?q)), 1f, 0i32)\n",
     RuleError, 1, 52, "no guard fixes"),
    ("shape pattern not equal", "rule r: nn.relu(?x) => ?x\n    if shape(?x) != [_, 1]\n",
     RuleError, 2, 8, "only be matched"),
    ("shape pattern rest inside", "rule r: nn.relu(?x) => ?x\n    if shape(?x) == [1, .., 2]\n",
     RuleError, 2, 8, "first or last"),
]


def test_dtype_sets_make_variants_and_dtype_compares_with_an_attribute():
    rs = parse_rules('rule q: qnn.quantize(nn.relu(?x), ?s, ?z, out_dtype=?d) => '
                     'qnn.quantize(?x, ?s, ?z, out_dtype=?d)\n'
                     '    if dtype(?x) in {float32, float16}, dtype(?s) == ?d\n', "v.rules")
    assert [r.name for r in rs.rules] == ["q[float32]", "q[float16]"]
    assert [str(g) for g in rs.rules[1].guards] == ["dtype(?x) == float16", "dtype(?s) == ?d"]
    text = compile_ruleset(rs).text
    assert '(= (dtype-of ?x) "float16")' in text and "(= (dtype-of ?s) ?d)" in text


@pytest.mark.parametrize("name,src,cls,line,col,word", BAD, ids=[b[0] for b in BAD])
def test_bad_rule_files(name, src, cls, line, col, word):
    with pytest.raises(cls) as info:
        parse_rules(src, "bad.rules")
    err = info.value
    assert err.loc is not None, err.format()
    assert (err.loc.line, err.loc.column) == (line, col), err.format()
    assert word.lower() in err.message.lower(), err.format()
    assert err.format().startswith(f"bad.rules:{line}:{col}:")


def test_at_least_ten_kinds_of_bad_rule_files():
    assert len(BAD) >= 10


def test_include_cycle(tmp_path):
    (tmp_path / "a.rules").write_text('include "b.rules"\n')
    (tmp_path / "b.rules").write_text('include "a.rules"\n')
    from eqquant.rules.loader import load_rules
    with pytest.raises(RuleError, match="cycle"):
        load_rules(tmp_path / "a.rules")


def test_include_merges_rules(tmp_path):
    (tmp_path / "base.rules").write_text("rule relu_relu: nn.relu(nn.relu(?x)) => nn.relu(?x)\n")
    (tmp_path / "top.rules").write_text('ruleset top\ninclude "base.rules"\n'
                                        "rule neg: negative(negative(?x)) => ?x\n")
    from eqquant.rules.loader import load_rules
    rs = load_rules(tmp_path / "top.rules")
    assert rs.name == "top" and [r.name for r in rs.rules] == ["relu_relu", "neg"]
    assert all(r.ruleset == "top" for r in rs.rules)


def test_cli_bad_rule_file_no_traceback(tmp_path):
    f = tmp_path / "bad.rules"
    f.write_text("rule r: nn.rellu(?x) => ?x\n")
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "rules", "show", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "bad.rules:1:9:" in r.stderr and "Traceback" not in r.stderr


def test_each_kind_of_guard_is_one_frozen_class_that_prints_back_as_written():
    """Every guard alternative of the grammar is read by one class of eqquant/rules/guards.py;
    each guard prints back as written, parses to the same guard, compiles to query facts and
    cannot be changed after it is made (frozen: the load-time check returns guards, it does
    not patch them)."""
    import dataclasses
    import re

    from eqquant.resources import grammar_path
    from eqquant.rules import guards
    grammar = grammar_path("rules.lark").read_text()
    alternatives = set(re.findall(r"->\s*(\w+_guard)\b", grammar)) | {"assumption"}
    assert alternatives == set(guards.KINDS)
    src = """
rule every_guard:
    qnn.requantize(?q, ?s, ?z, ?s2, ?z2, axis=?a, out_dtype=?d) => ?q
    if dtype(?q) == int8, rank(?q) != 3, shape(?s) == [1], shape(?q) == shape(?q),
       dtype(?q) == ?d, const(?s), ?a == 1
    assuming positive(?s)
"""
    rule = parse_rules(src, "g.rules").rules[0]
    kinds = [type(g).__name__ for g in rule.guards]
    assert kinds == ["DtypeIs", "RankIs", "ShapeIs", "SameAs", "TypeAttr", "Const", "AttrIs",
                     "Positive"]
    text = format_rule(rule)
    assert "if dtype(?q) == int8, rank(?q) != 3, shape(?s) == [1], shape(?q) == shape(?q), " \
           "dtype(?q) == ?d, const(?s), ?a == 1" in text and "assuming positive(?s)" in text
    again = parse_rules(text, "g2.rules").rules[0]
    assert [str(g) for g in again.guards] == [str(g) for g in rule.guards]
    assert rule.positive == ["?s"] and rule.needs_types
    egg = compile_ruleset(parse_rules(src, "g.rules")).rules[0].text
    assert '(= (dtype-of ?q) "int8")' in egg and "(is-const ?s)" in egg
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.guards[0].var = "?z"


def test_a_dtype_choice_splits_into_one_variant_per_dtype():
    src = """
rule pick:
    nn.relu(?x) => nn.relu(?x)
    if dtype(?x) in {int8, uint8}
"""
    variants = parse_rules(src, "p.rules").rules
    assert [v.name for v in variants] == ["pick[int8]", "pick[uint8]"]
    assert [str(v.guards[0]) for v in variants] == ["dtype(?x) == int8", "dtype(?x) == uint8"]


TUPLES = """ruleset tuples
# a join's first two inputs, and the rest
rule first_two:
    concatenate((?a, ?b, ..?rest), axis=?x) => concatenate((?b, ?a, ..?rest), axis=?x)
# each field quantized
rule each:
    qnn.quantize(concatenate((..?xs), axis=?x), ?s, ?z, axis=-1, out_dtype=?d)
    => concatenate((qnn.quantize(?e, ?s, ?z, axis=-1, out_dtype=?d) for ?e in ?xs), axis=?x)
    if rank(?s) == 0, rank(?z) == 0
"""


def test_tuple_rests_and_maps_compile_and_print_back():
    """``(?a, ..?rest)`` matches a tuple by its first fields and binds the rest (an egglog
    ExprList); ``(f(?e) for ?e in ?xs)`` builds the tuple of f over the rest's fields: a list
    constructor unrolled cell by cell by two helper rules of their own ruleset."""
    rs = parse_rules(TUPLES, "tuples.rules")
    text = compile_ruleset(rs).text
    assert "(MkTuple (ECons ?a (ECons ?b ?rest)))" in text
    assert "(MkTuple (ECons ?b (ECons ?a ?rest)))" in text
    assert "(ruleset rs.tuples.each)" in text
    assert "(constructor map.each" in text and "(ExprList Expr Expr String) ExprList)" in text
    assert ':ruleset rs.tuples.each :name "each/each"' in text and '"each/end"' in text
    again = parse_rules("\n".join(format_rule(r) for r in rs.rules), "again.rules")
    assert [format_rule(r) for r in again.rules] == [format_rule(r) for r in rs.rules]
    assert "for ?e in ?xs" in format_rule(rs.rules[1])


@pytest.mark.parametrize("src,word", [
    ("rule r: concatenate((?a, ..?r), axis=?x) => concatenate((?a, ..?q), axis=?x)\n",
     "..?q is not the rest"),
    ("rule r: concatenate((..?xs), axis=?x) => concatenate((nn.relu(?e) for ?e in ?ys), "
     "axis=?x)\n", "?ys is not the rest"),
    ("rule r: concatenate((?a, ..?xs), axis=?x) => concatenate((nn.relu(?a) for ?a in ?xs), "
     "axis=?x)\n", "bound by the left side already"),
    ("rule r: concatenate((..?xs), axis=?x) => concatenate((nn.relu(?f) for ?e in ?xs), "
     "axis=?x)\n", "?f is not bound"),
])
def test_tuple_rest_and_map_errors(src, word):
    with pytest.raises(RuleError, match=word.replace("?", r"\?").replace(".", r"\.")):
        parse_rules("ruleset bad\n" + src, "bad.rules")


def test_the_checker_tests_maps_and_rests_on_tuples_of_several_lengths():
    from eqquant.rules.check import check_ruleset
    report = check_ruleset(parse_rules(TUPLES, "tuples.rules"), trials=6)
    by = {r.rule.name + r.variant: r for r in report.results}
    assert not by["first_two"].ok                  # swapping two inputs changes the join
    assert all(by[f"each[{d}]"].ok for d in ("int8", "uint8", "int32"))
    wrong = TUPLES.replace("qnn.quantize(?e, ?s, ?z,", "qnn.quantize(?e, ?s, 0i32,")
    bad = check_ruleset(parse_rules(wrong, "wrong.rules"), trials=6)
    assert not all(r.ok for r in bad.results if r.rule.name == "each")


SHAPES = """
rule per_channel_scale: multiply(?x, ?k) => ?x
    if shape(?x) == [_, ?n, _, _], shape(?k) == [?n, 1, 1]
rule along_last_axis: add(?x, ?b) => ?x
    if shape(?x) == [.., ?n], shape(?b) == [?n]
"""


def test_shape_patterns_print_back_compile_to_size_lookups_and_match_in_the_egraph():
    """Shape patterns: `_` any size, `?n` one size wherever it is named, `..` any sizes at one
    end. They compile to look-ups in the type-dim table joined on the size variables, and the
    e-graph applies a rule only where the sizes agree."""
    from eqquant.ir.parser import parse
    from eqquant.optimizer import optimize
    rs = parse_rules(SHAPES, "s.rules")
    texts = [format_rule(r) for r in rs.rules]
    assert "if shape(?x) == [_, ?n, _, _], shape(?k) == [?n, 1, 1]" in texts[0]
    assert "if shape(?x) == [.., ?n], shape(?b) == [?n]" in texts[1]
    again = parse_rules("\n".join(texts), "s2.rules")
    assert [str(g) for r in again.rules for g in r.guards] == \
        [str(g) for r in rs.rules for g in r.guards]
    egg = compile_ruleset(rs).text
    assert "(type-dim ?_g" in egg and " 1 ?_size_n)" in egg and " 0 ?_size_n)" in egg
    assert " -1 ?_size_n)" in egg and '(= (rank-of ?x) "4")' in egg

    def fired(src):             # (the rules are written to test matching, not identities)
        from eqquant.rules.trust import unchecked
        mod = parse(src)
        with unchecked():
            report = optimize(mod, None, [rs], cost="nodes").report
        return {k for k, v in report.matches().items() if v}
    assert fired("""def @main(%x: Tensor[(1, 3, 2, 2), float32], %k: Tensor[(3, 1, 1), float32],
                  %b: Tensor[(2), float32]) { (multiply(%x, %k), add(%x, %b)) }""") == \
        {"per_channel_scale", "along_last_axis"}
    # (1, 1, 1) broadcasts, but it is not one scale per channel; (2, 1) is not a (C, 1, 1)
    # vector; a vector along the last axis of another size broadcasts only when it is 1 long
    assert fired("""def @main(%x: Tensor[(1, 3, 2, 2), float32], %k: Tensor[(1, 1, 1), float32],
                  %j: Tensor[(2, 1), float32], %b: Tensor[(1), float32]) {
                  (multiply(%x, %k), multiply(%x, %j), add(%x, %b)) }""") == set()


NAMED = """
rule bias_before_reshape: add(reshape(?y, newshape=?s) as ?r, ?b) => reshape(add(?y, ?b), newshape=?s)
    if shape(?y) == [.., ?n], shape(?r) == [.., ?n], shape(?b) == [?n]
"""


def test_a_named_call_prints_back_compiles_to_a_fact_and_guards_what_it_matched():
    """`f(...) as ?r` names what a call matches: its guards read the call's own type (here:
    the reshape keeps the last axis), in egglog a fact binding ?r, in the e-graph only
    where the sizes agree."""
    from eqquant.ir.parser import parse
    from eqquant.optimizer import optimize
    rs = parse_rules(NAMED, "n.rules")
    text = format_rule(rs.rules[0])
    assert "add(reshape(?y, newshape=?s) as ?r, ?b)" in text
    again = parse_rules(text, "n2.rules")
    assert format_rule(again.rules[0]) == text
    egg = compile_ruleset(rs).text
    assert "(= ?__root (@add ?r ?b)) (= ?r (@reshape ?y ?s))" in egg
    assert "(type-of ?r)" in egg

    def fired(src):
        mod = parse(src)
        report = optimize(mod, None, [rs], cost="nodes").report
        return {k for k, v in report.matches().items() if v}
    keeps = """def @main(%y: Tensor[(6, 4), float32], %b: Tensor[(4), float32]) {
               add(reshape(%y, newshape=[2, 3, 4]), %b) }"""
    moves = """def @main(%y: Tensor[(6, 4), float32], %b: Tensor[(4), float32]) {
               add(reshape(%y, newshape=[1, 3, 2, 1, 4]), %b) }"""
    breaks = """def @main(%y: Tensor[(6, 4), float32], %b: Tensor[(4), float32]) {
                add(reshape(%y, newshape=[3, 2, 4, 1]), reshape(%b, newshape=[1, 4, 1])) }"""
    assert fired(keeps) == {"bias_before_reshape"}
    assert fired(moves) == {"bias_before_reshape"}
    assert fired(breaks) == set()
    # a reshape that moves the last axis: (6, 4) -> (3, 8) takes a bias of 8, not of 4
    assert fired("""def @main(%y: Tensor[(4, 6), float32], %b: Tensor[(8), float32]) {
                    add(reshape(%y, newshape=[3, 8]), %b) }""") == set()


def test_the_checker_needs_the_named_calls_guard():
    """Without the guard on ?r the rule is wrong, and the checker says so."""
    from eqquant.rules.check import check_ruleset
    assert check_ruleset(parse_rules(NAMED, "n.rules")).ok
    loose = NAMED.replace("shape(?r) == [.., ?n], ", "")
    report = check_ruleset(parse_rules(loose, "loose.rules"))
    assert not report.ok and "different types" in report.format()


@pytest.mark.parametrize("src,word", [
    ("rule r: add(nn.relu(?x) as ?x, ?b) => ?b\n", "names two"),
    ("rule r: add(nn.relu(?x) as ?r, nn.relu(?b) as ?r) => ?b\n", "names two"),
    ("rule r: nn.relu(?x) as ?r => ?x\n", "whole left side"),
    ("rule r: nn.relu(?x) => nn.relu(?x) as ?r\n", "right side"),
    ("rule r: add(nn.relu(?x) as ?r, ?b) <=> add(?b, nn.relu(?x) as ?r)\n", "<=>"),
])
def test_named_call_errors(src, word):
    with pytest.raises(RuleError) as info:
        parse_rules(src, "bad.rules")
    assert word in info.value.message and info.value.loc is not None


def test_the_explainer_binds_a_named_call(tmp_path):
    """`rules explain`'s matcher binds ?r as egglog does: it finds the rule where the
    reshape keeps the last axis, and says which guard fails where it does not."""
    from eqquant.explain import explain_rules
    from eqquant.ir.parser import parse
    path = tmp_path / "n.rules"
    path.write_text("ruleset named\n" + NAMED)
    mod = parse("""def @main(%y: Tensor[(6, 4), float32], %b: Tensor[(4), float32],
                   %c: Tensor[(8), float32]) {
                   (add(reshape(%y, newshape=[2, 3, 4]), %b),
                    add(reshape(%y, newshape=[3, 8]), %c)) }""")
    report = explain_rules(mod, str(path), {})
    (answer,) = report.answers
    assert len(answer.hits) == 1
    text = report.text()
    assert "guard shape(?r) == [.., ?n] failed: ?r is [3, 8]" in text, text


def test_an_attribute_on_the_right_may_be_the_dtype_a_guard_fixes():
    """dtype(?q) as an attribute: written in per dtype variant, so one rule covers int8 and
    uint8 lookup tables (qnn.codes of the input's dtype)."""
    src = ("rule table: nn.relu(?q) => qnn.lut(?q, qnn.codes(dtype=dtype(?q)), 1f, 0i32)\n"
           "    if dtype(?q) in {uint8, int8}\n")
    rs = parse_rules(src, "t.rules")
    assert [r.name for r in rs.rules] == ["table[uint8]", "table[int8]"]
    assert 'qnn.codes(dtype="uint8")' in format_rule(rs.rules[0])
    assert 'qnn.codes(dtype="int8")' in format_rule(rs.rules[1])
    text = compile_ruleset(rs).text
    assert '"uint8"' in text and '"int8"' in text
