"""The rule checker: shipped rules pass; deliberately wrong ones fail with counterexamples."""
import re
import subprocess
import sys

import pytest

from eqquant.resources import rules_dir
from eqquant.rules.check import check_ruleset
from eqquant.rules.loader import load_rules, parse_rules

from conftest import REPO


def test_every_shipped_rule_passes():
    files = sorted(rules_dir().glob("*.rules"))
    assert {f.stem for f in files} >= {"bn_fold", "simplify", "quantize"}
    # (quantize.rules, the largest, is checked with the same trials, and its variants
    # counted, by tests/test_rules_quantize.py: not twice)
    for f in (f for f in files if f.stem != "quantize"):
        report = check_ruleset(load_rules(f), trials=4)
        assert report.ok, report.format()
        assert all(r.trials >= 1 for r in report.results)


@pytest.fixture(scope="module")
def wrong_report():
    return check_ruleset(load_rules(REPO / "tests" / "data" / "wrong.rules"), trials=4)


def test_wrong_rules_are_rejected_with_counterexamples(wrong_report):
    report = wrong_report
    by_name = {r.rule.name + r.variant: r for r in report.results}
    assert set(by_name) == {"wrong_sign_in_shift", "wrong_reshape_axis",
                            "round_within_a_thousandth", "relu_absorbed_at_any_zero_point",
                            "quantize_without_saturation[int8]",
                            "quantize_without_saturation[uint8]",
                            "avg_pool2d_counting_padding[int8]",
                            "avg_pool2d_counting_padding[uint8]"}
    for name, r in by_name.items():
        assert not r.ok, name
        # the instance: each variable with its type (a tensor's shape, or a scalar's dtype)
        assert re.search(r"%\w+: (Tensor\[|float32|u?int\d+)", r.message)
    assert "counterexample" in by_name["wrong_sign_in_shift"].message
    assert "counterexample" in by_name["round_within_a_thousandth"].message
    assert "rtol 0.001" in by_name["round_within_a_thousandth"].message


def test_approx_rule_within_its_tolerance_passes():
    rs = parse_rules("approx rule round_half (rtol=0.0, atol=0.5):\n"
                     "    nn.relu(?x) => nn.relu(round(?x))\n    if dtype(?x) == float32\n")
    assert check_ruleset(rs).ok


def test_identity_over_a_property_set_catches_dropout():
    # nn.dropout is an annotation too, but it returns a tuple: not the identity
    rs = parse_rules("rule drop: {annotation.stop_fusion, annotation.cast_hint, nn.dropout}"
                     "(?x, ..?a) => ?x\n")
    results = {r.variant: r for r in check_ruleset(rs).results}
    assert results["[annotation.stop_fusion]"].ok
    assert not results["[nn.dropout]"].ok
    assert "different types" in results["[nn.dropout]"].message


def test_cli_rules_check_exit_codes():
    ok = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "rules", "check",
                         "simplify", "bn_fold"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 failed" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "rules", "check",
                          str(REPO / "tests" / "data" / "wrong.rules")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "8 failed" in bad.stdout


def test_the_wide_regime_finds_a_rule_that_holds_only_inside_the_grid(wrong_report):
    """Fake quantization equals its input only inside the grid: the checker draws inputs far
    outside it, so an approx rule that forgets saturation fails for each dtype."""
    for r in wrong_report.results:
        if r.rule.name == "quantize_without_saturation":
            assert not r.ok and "counterexample" in r.message, r.format()
