"""rules/fusion.rules and the partition view, against the seed's MergeComposite and
PartitionGraph listings."""
import numpy as np

from eqquant.ir.interp import run
from eqquant.core.nodes import Call, Function, Module, post_order, structural_equal
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.optimizer import optimize
from eqquant.passes.partition import partition_view
from eqquant.rules.check import check_ruleset
from eqquant.rules.loader import load_rules
from eqquant.zoo import build

from conftest import seed_file
from seed_listings import listings

RULES = ["simplify", "bn_fold", "fusion"]
SCHEDULE = "simplify; bn_fold; simplify; fusion"


def test_every_fusion_rule_is_an_identity():
    report = check_ruleset(load_rules("fusion"), trials=4)
    assert report.ok, report.format()


def fused_seed004():
    m = build("resnet18_stem")
    return m, optimize(m.module, m.params, RULES, SCHEDULE)


def test_seed004_fuses_into_the_seed_partition():
    m, result = fused_seed004()
    calls = [n for n in post_order(result.module.main.body) if isinstance(n, Call)]
    assert [c.op_name for c in calls] == ["fused.conv2d", "nn.max_pool2d", "fused.conv2d",
                                          "fused.conv2d", "add"]
    assert [c.attrs["activation"] for c in calls if c.op_name == "fused.conv2d"] == \
        ["relu", "relu", "none"]
    ref = run(m.module, m.inputs, m.params)
    out = run(result.module, m.inputs)
    assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))


def _strip(mod):
    f = mod.main
    return Module({"main": Function(params=f.params, body=f.body)}, version=None)


def test_composite_view_has_the_structure_of_partition_graph():
    """Three conv_add_relu composites (the last from the pattern nn.conv2d_add_), a max_pool2d
    and an add composite, called as in the seed's PartitionGraph listing."""
    _, result = fused_seed004()
    view = partition_view(result.module)
    expected = parse(listings(seed_file("004"))[3][1])
    assert structural_equal(_strip(view), _strip(expected), names=False)
    text = print_module(view)
    assert text.count('Composite="ccompiler.conv_add_relu"') == 3
    assert 'PartitionedFromPattern="nn.conv2d_add_"' in text
    assert text.count('Composite="ccompiler.max_pool2d"') == 1
    assert text.count('Composite="ccompiler.add"') == 1
    again = parse(text)  # the view is a program: it parses and computes the same thing
    assert again == view
    x = {"data": np.random.default_rng(0).normal(size=(1, 3, 224, 224)).astype("float32")}
    np.testing.assert_allclose(run(view, x), run(result.module, x), rtol=1e-5, atol=1e-5)


def test_mobilenet_relu6_fuses_as_clip():
    m = build("mobilenet_v2", image_size=64)
    result = optimize(m.module, m.params, RULES, SCHEDULE)
    acts = [c.attrs["activation"] for c in post_order(result.module.main.body)
            if isinstance(c, Call) and c.op_name == "fused.conv2d"]
    assert acts.count("clip") == 35 and "nn.batch_norm" not in print_module(result.module)
    dense = [c for c in post_order(result.module.main.body)
             if isinstance(c, Call) and c.op_name == "fused.dense"]
    assert len(dense) == 1


def test_conv_relu_without_bias_fuses_and_runs():
    from eqquant.ir.builder import Builder
    from eqquant.runtime.execution.executor import Executor
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (1, 3, 8, 8))
    w = b.param("w", rng.normal(size=(4, 3, 3, 3)).astype("float32"))
    mod, params = b.finish(b.call("nn.relu", b.call("nn.conv2d", x, w, padding=1)))
    result = optimize(mod, params, ["fusion"])
    calls = [n for n in post_order(result.module.main.body) if isinstance(n, Call)]
    assert [c.op_name for c in calls] == ["fused.conv2d"]
    assert calls[0].attrs["activation"] == "relu"
    xv = {"x": rng.normal(size=(1, 3, 8, 8)).astype("float32")}
    np.testing.assert_allclose(Executor(result.module).run(xv), run(mod, xv, params),
                               rtol=1e-5, atol=1e-5)
