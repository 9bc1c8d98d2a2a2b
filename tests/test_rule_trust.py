"""No unchecked rule in a program (#54): opt, extract and quantize check every rule they load
with the checker's sampler first; a rejected rule stops the command with its counterexample
and location, nothing written; --unchecked-rules runs anyway and marks the output. The checker
draws floats across magnitudes, so float reassociation is no exact rule."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_exit
from eqquant.rules import trust
from eqquant.rules.check import check_rule_on_samples
from eqquant.rules.loader import load_rules, parse_rules

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """def @main(%x: Tensor[(1, 4, 6, 6), float32]) {
  %0 = add(%x, %x);
  %1 = nn.relu(%0);
  %2 = nn.max_pool2d(%1, pool_size=[2, 2], strides=[2, 2]);
  sigmoid(%2)
}
"""
# each a rule the checker must reject (the list), and what its failure says
WRONG = {
    "drop_relu": ("rule drop_relu: nn.relu(?x) => ?x", "counterexample"),
    "drop_sigmoid": ("rule drop_sigmoid: sigmoid(?x) => ?x", "counterexample"),
    "sigmoid_is_relu": ("rule sigmoid_is_relu: sigmoid(?x) => nn.relu(?x)", "counterexample"),
    "max_is_avg": ("rule max_is_avg: nn.max_pool2d(?x, ..?p) => nn.avg_pool2d(?x, ..?p)",
                   "counterexample"),
    "x_over_x": ("rule x_over_x: divide(?x, ?x) => 1f\n    if rank(?x) == 0, dtype(?x) == "
                 "float32", "counterexample"),
    "drop_relu_loosely": ("approx rule drop_relu_loosely (atol=10): nn.relu(?x) => ?x",
                          "counterexample"),
    "add_reassociates": ("rule add_reassociates: add(add(?a, ?b), ?c) => add(?a, add(?b, ?c))"
                         "\n    if dtype(?a) == float32", "mixed inputs"),
    "dense_in_integers_axis0": (textwrap.dedent("""\
        rule dense_in_integers_axis0:
            nn.dense(qnn.dequantize(?x, ?sx, ?zx, axis=-1), qnn.dequantize(?w, ?sw, ?zw, axis=0),
                     ..?d)
            => qnn.dequantize(qnn.dense(?x, ?w, ?zx, ?zw, ?sx, ?sw, ..?d, out_dtype="int32"),
                              multiply(?sx, ?sw), 0i32, axis=0)
            if dtype(?x) in {int8, uint8}, dtype(?w) == int8, rank(?x) == 2, rank(?w) == 2,
               rank(?sx) == 0, rank(?zx) == 0
            assuming positive(?sx), positive(?sw)"""), "dense_in_integers_axis0["),
}


def _rules_file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.rules"
    path.write_text(f"ruleset {name}\n\n# A rule that is not what it claims.\n{text}\n")
    return path


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "m.ir"
    path.write_text(PROGRAM)
    return path


@pytest.mark.parametrize("name", list(WRONG))
def test_a_rule_the_checker_rejects_stops_opt_with_its_counterexample(name, program, tmp_path,
                                                                     capsys):
    text, said = WRONG[name]
    rules = _rules_file(tmp_path, name, text)
    out = tmp_path / "out.ir"
    assert cli_exit(["opt", str(program), "-r", str(rules), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{rules}:4:" in err and "is not what it claims" in err and said in err, err
    assert not out.exists() and not out.with_suffix(".npz").exists()


def test_unchecked_rules_are_used_and_the_output_says_so(program, tmp_path, capsys):
    rules = _rules_file(tmp_path, "drop_relu", WRONG["drop_relu"][0])
    out = tmp_path / "out.ir"
    assert cli_exit(["opt", str(program), "-r", str(rules), "-o", str(out),
                     "--unchecked-rules"]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 rules used unchecked" in err and "drop_relu" in err
    head = out.read_text().splitlines()[:3]
    assert any(line.startswith("// UNCHECKED RULES") and "drop_relu" in line for line in head)
    assert "nn.relu" not in out.read_text()          # (the rule was used: the relu is gone)
    assert cli_exit(["extract", str(program), "-r", str(rules), "--unchecked-rules"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("// UNCHECKED RULES") and "nn.relu" not in printed


def test_float_reassociation_is_no_exact_rule_but_a_bounded_approx_one():
    rs = parse_rules(textwrap.dedent("""\
        ruleset floats
        rule exact: add(add(?a, ?b), ?c) => add(?a, add(?b, ?c))
            if dtype(?a) == float32
        approx rule within_rounding (rtol=0, atol=1e-6, scale=terms):
            add(add(?a, ?b), ?c) => add(?a, add(?b, ?c))
            if dtype(?a) == float32
        approx rule too_tight (rtol=0, atol=1e-9, scale=terms):
            add(add(?a, ?b), ?c) => add(?a, add(?b, ?c))
            if dtype(?a) == float32
        """))
    verdicts = {r.name: all(c.ok for c in check_rule_on_samples(r)) for r in rs.rules}
    assert verdicts == {"exact": False, "within_rounding": True, "too_tight": False}


def test_the_shipped_rules_pass_and_their_verdicts_are_kept(tmp_path, monkeypatch):
    """Checked once: a second load checks nothing; an edited rule is checked again; an entry
    this module did not write is not trusted."""
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(tmp_path / "cache"))
    rulesets = [load_rules("bn_fold"), load_rules("simplify")]
    trust.verify(rulesets)
    entries = sorted((tmp_path / "cache" / "checked").iterdir())
    assert len(entries) == sum(len(rs.rules) for rs in rulesets)

    def no_checking(rules, *how):
        assert not rules, [r.name for r in rules]
        return []
    monkeypatch.setattr(trust, "check_rules", no_checking)
    trust.verify(rulesets)                              # (all kept: nothing to check)
    entries[0].write_text("PASS, believe me\n")         # (not an entry trust wrote)
    with pytest.raises(AssertionError):
        trust.verify(rulesets)
    monkeypatch.undo()
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(tmp_path / "cache"))
    edited = tmp_path / "mine.rules"
    edited.write_text("ruleset mine\n# Relu of relu is relu.\n"
                      "rule relu_twice: nn.relu(nn.relu(?x)) => nn.relu(?x)\n")
    trust.verify([load_rules(edited)])
    before = set((tmp_path / "cache" / "checked").iterdir())
    edited.write_text("ruleset mine\n# Relu of relu is relu.\n"
                      "rule relu_twice: nn.relu(nn.relu(?x)) => ?x\n")
    with pytest.raises(Exception, match="relu_twice is not what it claims"):
        trust.verify([load_rules(edited)])
    assert set((tmp_path / "cache" / "checked").iterdir()) == before   # (no pass kept)


def test_rules_check_reports_a_kept_pass_as_kept_and_checks_it_again_when_asked(
        tmp_path, monkeypatch):
    """`rules check` at the usual draw reports a pass this eqquant kept (with its variants)
    marked [kept], checking nothing; --again, another seed or a damaged entry checks again;
    a failure is never kept."""
    from click.testing import CliRunner
    from eqquant.cli.main import cli
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(tmp_path / "cache"))
    mine = tmp_path / "mine.rules"
    mine.write_text("ruleset mine\n# Relu of relu is relu.\n"
                    "rule relu_twice: nn.relu(nn.relu(?x)) => nn.relu(?x)\n"
                    "# Not an identity.\nrule relu_gone: nn.relu(?x) => ?x\n")
    asked = []
    real = trust.check_rules

    def counting(rules, *how):
        asked.append(sorted(r.name for r in rules))
        return real(rules, *how)
    monkeypatch.setattr(trust, "check_rules", counting)

    def check(*extra):
        done = CliRunner().invoke(cli, ["rules", "check", str(mine), *extra])
        return done.exit_code, done.output
    code, out = check()
    assert code == 1 and "[kept]" not in out and asked.pop() == ["relu_gone", "relu_twice"]
    code, out = check()
    assert code == 1 and asked.pop() == ["relu_gone"]             # (a failure is not kept)
    assert "PASS  relu_twice  (" in out and out.count("[kept]") == 2, out
    assert "1 passed, 1 failed (1 [kept]" in out
    for extra in (["--again"], ["--seed", "3"]):
        code, out = check(*extra)
        assert asked.pop() == ["relu_gone", "relu_twice"] and "[kept]" not in out
    for entry in (tmp_path / "cache" / "checked").iterdir():
        entry.write_text(trust.PASSED + "[not json\n")             # (not what trust wrote)
    code, out = check()
    assert asked.pop() == ["relu_gone", "relu_twice"] and "[kept]" not in out


def test_helpers_check_rules_without_running_the_callers_script_again(tmp_path):
    """Rules are shared among helper processes; each is a new interpreter (python -m), so a
    user's script that calls eqquant at its top level runs once."""
    rules = tmp_path / "many.rules"
    rules.write_text("ruleset many\n" + "".join(
        f"# Relu is idempotent ({k}).\nrule r{k}: nn.relu(nn.relu(?x)) => nn.relu(?x)\n"
        for k in range(6)))
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(f"""\
        import os
        from eqquant.rules import trust
        from eqquant.rules.loader import load_rules
        print("the user's script ran", flush=True)
        trust.check_rules(load_rules({str(rules)!r}).rules)
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                                             "PYTHONPATH": str(ROOT),
                                             "EQQUANT_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("the user's script ran") == 1, done.stdout


def test_quantize_with_unchecked_rules_marks_its_report(tmp_path, monkeypatch):
    from eqquant.ir.loader import save_program
    from eqquant.ir.params import bind_params
    import eqquant
    mod = bind_params(eqquant.parse("""def @main(%x: Tensor[(1, 3, 8, 8), float32],
          %w: Tensor[(4, 3, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  nn.relu(%0)
}
"""), {"w": np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)})
    path, _ = save_program(tmp_path / "m.ir", mod)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(1).standard_normal((4, 1, 3, 8, 8)).astype(
        np.float32))
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(tmp_path / "empty-cache"))   # (no verdicts)
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(path), "--calib", str(calib), "--mode", "minmax",
                     "-o", str(out), "--unchecked-rules"]) == 0
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert report["unchecked_rules"] and out.read_text().splitlines()[1].startswith(
        "// UNCHECKED RULES")
    assert not (tmp_path / "empty-cache" / "checked").exists()     # (nothing was checked)
