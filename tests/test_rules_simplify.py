"""rules/simplify.rules: every rule is an identity, and together they clean real programs."""
import numpy as np

from eqquant.ir.interp import run
from eqquant.core.nodes import Call, post_order
from eqquant.ir.parser import parse
from eqquant.optimizer import optimize
from eqquant.rules.check import check_ruleset
from eqquant.rules.loader import load_rules


def test_every_simplify_rule_is_an_identity():
    report = check_ruleset(load_rules("simplify"), trials=4)
    assert report.ok, report.format()


def test_simplify_cleans_annotations_dropout_and_reshapes():
    mod = parse("""def @main(%x: Tensor[(1, 8, 2, 2), float32]) {
  %0 = annotation.stop_fusion(%x);
  %1 = annotation.cast_hint(%0, dtype="int8");
  %2 = nn.dropout(%1, rate=0.3);
  %3 = %2.0;
  %4 = multiply(%3, 1f);
  %5 = add(%4, 0f);
  %6 = reshape(%5, newshape=[1, 32]);
  %7 = reshape(%6, newshape=[0, 4, 8]);
  %8 = reshape(%7, newshape=[1, 8, 2, 2]);
  %9 = negative(negative(%8));
  nn.relu(nn.relu(%9))
}""")
    result = optimize(mod, None, ["simplify"], cost="nodes")
    ops = [n.op_name for n in post_order(result.module.main.body) if isinstance(n, Call)]
    assert ops == ["nn.relu"]
    x = np.random.default_rng(0).normal(size=(1, 8, 2, 2)).astype("float32")
    np.testing.assert_array_equal(run(result.module, {"x": x}), run(mod, {"x": x}))
    fired = {k for k, v in result.report.matches().items() if v}
    assert {"drop_dropout", "multiply_one", "add_zero", "reshape_reshape",
            "reshape_same_shape", "double_negative", "relu_relu"} <= fired


def test_gelu_written_out_becomes_one_gelu_in_both_groupings():
    mod = parse("""def @main(%x: Tensor[(2, 16), float32]) {
  %0 = divide(%x, 1.4142135f);
  %1 = add(erf(%0), 1f);
  %2 = multiply(multiply(%x, %1), 0.5f);
  %3 = multiply(%2, 0.5f);
  %4 = add(erf(divide(%3, 1.4142135f)), 1f);
  multiply(multiply(%3, 0.5f), %4)
}""")
    result = optimize(mod, None, ["simplify"], cost="nodes")
    ops = [n.op_name for n in post_order(result.module.main.body) if isinstance(n, Call)]
    assert ops.count("nn.gelu") == 2 and "erf" not in ops, ops
    x = np.random.default_rng(0).normal(size=(2, 16)).astype("float32") * 3
    np.testing.assert_allclose(run(result.module, {"x": x}), run(mod, {"x": x}), rtol=1e-6,
                               atol=1e-7)
    # a divisor that is not sqrt 2 is not GELU
    other = parse("""def @main(%x: Tensor[(4), float32]) {
  multiply(multiply(%x, add(erf(divide(%x, 1.5f)), 1f)), 0.5f)
}""")
    ops = [n.op_name for n in post_order(optimize(other, None, ["simplify"], cost="nodes")
                                         .module.main.body) if isinstance(n, Call)]
    assert "nn.gelu" not in ops and "erf" in ops


def test_a_constant_operand_is_also_written_second():
    mod = parse("""def @main(%x: Tensor[(1, 4), float32]) {
  multiply(2f, add(1f, %x))
}""")
    result = optimize(mod, None, ["simplify"], cost="nodes")
    fired = {k for k, v in result.report.matches().items() if v}
    assert {"constant_second[add]", "constant_second[multiply]"} <= fired
    x = np.arange(4, dtype="float32").reshape(1, 4)
    np.testing.assert_array_equal(run(result.module, {"x": x}), (1 + x) * 2)
