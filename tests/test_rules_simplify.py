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
