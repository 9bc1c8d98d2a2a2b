"""Why a rule fired or did not (``rules explain``), and where an op of an optimized program
came from (``--why``, ``Model.why``): on the zoo's resnet18, with rules written to just miss."""
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_exit

NEAR = """\
# Three rules written to just miss on a float ResNet.
ruleset near

# A convolution of int8 weights (the weights here are float32).
rule int8_conv:
    nn.conv2d(?x, ?w, ..?a) => nn.conv2d(?x, ?w, ..?a)
    if dtype(?w) == int8

# A channels-last convolution (the program's are NCHW).
rule nhwc_conv:
    nn.conv2d(?x, ?w, data_layout="NHWC", ..?a) => nn.conv2d(?x, ?w, data_layout="NHWC", ..?a)

# A dense layer on a relu (the classifier reads a flattened pool: the relu is missing).
rule dense_of_relu:
    nn.dense(nn.relu(?x), ?w, ..?a) => nn.dense(nn.relu(?x), ?w, ..?a)

# One that matches: a relu of a relu is one relu.
rule relu_twice:
    nn.relu(nn.relu(?x)) => nn.relu(?x)
"""


@pytest.fixture(scope="module")
def resnet18(tmp_path_factory) -> Path:
    from eqquant.ir.loader import save_program
    from eqquant.zoo import build
    m = build("resnet18", image_size=32)
    path = tmp_path_factory.mktemp("r18") / "resnet18.ir"
    save_program(path, m.module, m.params)
    rng = np.random.default_rng(0)
    np.savez(path.with_suffix(".calib.npz"),
             data=rng.normal(size=(2, 1, 3, 32, 32)).astype("float32"))
    return path


@pytest.fixture()
def near(tmp_path) -> Path:
    path = tmp_path / "near.rules"
    path.write_text(NEAR, encoding="utf-8")
    return path


def _section(text: str, rule: str) -> str:
    return text.split(f"rule {rule} ", 1)[1].split("\nrule ", 1)[0]


def test_rules_explain_names_the_failing_guard_attribute_and_subpattern(resnet18, near, capsys):
    assert cli_exit(["rules", "explain", str(near), "--on", str(resnet18), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    ir = re.escape(str(resnet18))
    # the wrong dtype: the guard, the value it failed on (a weight, by its parameter's name),
    # where that weight is declared, and the rule's own place in its file
    dtype = _section(out, "int8_conv")
    assert f"({near}:5:6)" in dtype and "matched 0 value(s)" in dtype
    assert re.search(r"near miss at %0 \(" + ir + r":\d+:\d+\): guard dtype\(\?w\) == int8 "
                     r"failed: \?w is float32 at %conv1\.weight \(" + ir + r":\d+:\d+\)", dtype)
    # 20 convolutions, each also with its folded weight after bn_fold: 40 places
    assert "40 near miss(es)" in dtype
    # the wrong layout attribute
    layout = _section(out, "nhwc_conv")
    assert re.search(r"near miss at %0 \(" + ir + r":\d+:\d+\): nn\.conv2d at %0 \(" + ir +
                     r":\d+:\d+\) has data_layout=\"NCHW\"; the rule wants \"NHWC\"", layout)
    # the missing relu: the sub-pattern, and what the value is instead
    relu = _section(out, "dense_of_relu")
    assert "1 near miss(es)" in relu
    assert re.search(r"near miss at %\d+ \(" + ir + r":\d+:\d+\): %\d+ \(" + ir +
                     r":\d+:\d+\) is not nn\.relu: it is nn\.batch_flatten", relu)
    # a rule with no value of its head op says so
    assert "no value whose op is the left side's head op" not in relu
    assert "matched 0 value(s)" in _section(out, "relu_twice")


def test_rules_explain_one_rule_and_an_unknown_one(resnet18, near, capsys):
    assert cli_exit(["rules", "explain", str(near), "--on", str(resnet18),
                     "--rule", "dense_of_relu"]) == 0
    out = capsys.readouterr().out
    assert "rule dense_of_relu" in out and "rule int8_conv" not in out
    assert cli_exit(["rules", "explain", str(near), "--on", str(resnet18),
                     "--rule", "no_such_rule"]) == 2
    err = capsys.readouterr().err
    assert "no rule named 'no_such_rule'" in err and "int8_conv" in err


def test_the_python_matcher_agrees_with_egglog_on_the_shipped_rules(resnet18):
    """Where a shipped rule fired, the matcher finds it at as many values as egglog counted
    matches (each fires once per match in a saturated run), and where it did not, none."""
    from eqquant.explain import explain_rules
    from eqquant.ir.loader import load_program
    mod, params = load_program(resnet18, None)
    for name in ("bn_fold", "fusion"):
        report = explain_rules(mod, name, params)
        assert report.answers
        for a in report.answers:
            assert len(a.hits) == a.egglog_matches, (a.name, len(a.hits), a.egglog_matches)
        assert sum(len(a.hits) for a in report.answers) > 0


def test_why_lists_the_rules_of_every_phase_in_order_with_locations(resnet18, tmp_path,
                                                                     capsys):
    """``quantize --why`` on an int8 convolution: batch-norm folding, fusion, quantization and
    layout rules, in that order, each with file:line:col; the alternatives extraction
    rejected (the float convolution among them) with their costs; the kernel chosen."""
    out_ir = tmp_path / "q" / "r18.ir"
    assert cli_exit(["quantize", str(resnet18), "--calib",
                     str(resnet18.with_suffix(".calib.npz")), "--mode", "minmax",
                     "--per-channel", "--cost", "cpu", "-o", str(out_ir), "--why", "%2"]) == 0
    out = capsys.readouterr().out
    why = out.split("%2 = ", 1)[1]
    assert why.startswith("fused.qconv2d")
    steps = re.findall(r"^\s+\d+\. (\S+)\s+(\S+):(\d+):(\d+)\s+\(ruleset (\w+)\)$", why, re.M)
    rulesets = [s[4] for s in steps]
    order = ["bn_fold", "fusion", "quantize", "layout"]
    assert [r for r in dict.fromkeys(rulesets)] == order, steps
    assert all(Path(f).name == f"{rs}.rules" for _, f, _, _, rs in steps)
    assert steps[0][0] == "fold_batch_norm_into_conv2d"
    # the int8 phase's choice: the integer convolution chosen, a float one rejected, costed
    phase = why.split("extraction in phase simplify, quantize:", 1)[1].split("extraction", 1)[0]
    assert re.search(r"chosen\s+[\d.]+ ms /\s+[\d.]+ ms\s+fused\.qconv2d", phase)
    rejected = re.findall(r"rejected\s+[\d.]+ ms /\s+([\d.]+) ms\s+(\S+)\(", phase)
    assert rejected and all(float(c) > 0 for c, _ in rejected)
    assert "its kernel:" in why and re.search(r"%2 = fused\.qconv2d .*: \S+ \(cheapest\)", why)


def test_why_on_a_users_own_rule_and_on_a_value_that_is_not_there(tmp_path, capsys):
    program = tmp_path / "p.ir"
    program.write_text('#[version = "0.0.5"]\n'
                       "def @main(%x: Tensor[(4, 4), float32]) {\n"
                       "  %0 = nn.relu(%x);\n"
                       "  %1 = nn.relu(%0);\n"
                       "  negative(%1)\n"
                       "}\n", encoding="utf-8")
    rules = tmp_path / "mine.rules"
    rules.write_text("ruleset mine\n\n# the negation of a relu of a relu: one relu is enough\n"
                     "rule negative_relu_twice:\n"
                     "    negative(nn.relu(nn.relu(?x))) => negative(nn.relu(?x))\n",
                     encoding="utf-8")
    out = tmp_path / "o.ir"
    assert cli_exit(["opt", str(program), "-r", str(rules), "-o", str(out), "--cost", "nodes",
                     "--why", "%result"]) == 0
    text = capsys.readouterr().out
    # the program written is %0 = nn.relu(%x); negative(%0): the negation the rule made
    assert "%result = negative" in text
    assert re.search(r"1\. negative_relu_twice\s+" + re.escape(str(rules)) +
                     r":4:6\s+\(ruleset mine\)", text), text
    # the extraction's choice there: the rule's negation, and the program's own, rejected
    assert re.search(r"chosen\s+\d+ /\s+\d+\s+negative\(", text)
    assert re.search(r"rejected\s+\d+ /\s+\d+\s+negative\(", text)
    assert cli_exit(["opt", str(program), "-r", str(rules), "-o", str(tmp_path / "o2.ir"),
                     "--why", "%77"]) == 2
    err = capsys.readouterr().err
    assert "has no value %77 (its values: %0, %result;" in err


def test_model_why_after_quantize(resnet18):
    import eqquant
    from eqquant.errors import EqquantError
    model = eqquant.load(resnet18)
    rng = np.random.default_rng(1)
    q = eqquant.quantize(model, [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")}],
                         mode="minmax", cost="cpu")
    text = q.why("%2")
    assert "fold_batch_norm_into_conv2d" in text and "ruleset layout" in text
    with pytest.raises(EqquantError, match="no value"):
        q.why("%9999")


def test_a_mixed_precision_program_keeps_the_float_phase_rules(tmp_path):
    """Mixed precision extracts its int8 program from an e-graph of its own (the program cut
    at its marks): an op's origin still starts with the float phase's rules."""
    from eqquant.quant.flow import quantize
    from eqquant.zoo import build
    m = build("resnet18_stem", image_size=32)
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")}]
    q = quantize(m.module, m.params, samples, "minmax", per_channel=True, cost="cpu",
                 min_sqnr=20.0)
    text = q.why("%2")
    assert "fused.qconv2d" in text.splitlines()[0]
    assert text.index("fold_batch_norm_into_conv2d") < text.index("quantize_calibrated") < \
        text.index("ruleset layout")
    assert "(mixed precision)" in text
