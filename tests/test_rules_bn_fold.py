"""rules/bn_fold.rules: batch-norm folding end to end, against the seeds."""

import numpy as np

from eqquant.ir.interp import run
from eqquant.core.nodes import Call, Constant, Function, Module, post_order
from eqquant.ir.parser import parse
from eqquant.optimizer import optimize
from eqquant.rules.check import check_ruleset
from eqquant.rules.loader import load_rules
from eqquant.zoo import build

from conftest import seed_file
from seed_listings import listings

SCHEDULE = "simplify; bn_fold; simplify"


def calls(mod):
    return [n for n in post_order(mod.main.body) if isinstance(n, Call)]


def test_every_bn_fold_rule_is_an_identity():
    report = check_ruleset(load_rules("bn_fold"), trials=4)
    assert report.ok, report.format()
    assert len(report.results) == 14


def test_seed000_folds_to_one_conv_and_one_add():
    m = build("conv_bn")  # params uniform in [0, 1), as in the seed
    result = optimize(m.module, m.params, ["simplify", "bn_fold"], SCHEDULE)
    ops = calls(result.module)
    assert [c.op_name for c in ops] == ["nn.conv2d", "add"]
    conv, add = ops
    assert isinstance(conv.args[1], Constant) and conv.args[1].type.shape == (32, 3, 3, 3)
    assert isinstance(add.args[1], Constant) and add.args[1].type.shape == (32, 1, 1)
    assert add.args[0] is conv
    x = m.inputs["data"]
    ref = run(m.module, {"data": x}, m.params)
    np.testing.assert_allclose(run(result.module, {"data": x}), ref, rtol=1e-5, atol=1e-5)
    assert result.report.matches()["fold_batch_norm_into_conv2d"] == 1


def _without_ret(mod):
    f = mod.main
    return Module({"main": Function(params=f.params, body=f.body)}, version=mod.version)


def test_seed004_block_matches_prerequisite_optimize():
    """All three batch norms fold, and the program is TVM's prerequisite_optimize listing of
    seed 004 (same ops, attributes, sharing, constant numbering and shapes)."""
    m = build("resnet18_stem")
    result = optimize(m.module, m.params, ["simplify", "bn_fold"], SCHEDULE)
    assert not any(c.op_name == "nn.batch_norm" for c in calls(result.module))
    expected = parse(listings(seed_file("004"))[1][1])
    got = result.module
    got.version = expected.version
    assert _without_ret(got) == _without_ret(expected)
    x = m.inputs["data"]
    ref = run(m.module, {"data": x}, m.params)
    out = run(got, {"data": x})
    assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_resnet50_all_53_batch_norms_fold():
    m = build("resnet50", image_size=64)
    n_bn = sum(c.op_name == "nn.batch_norm" for c in calls(m.module))
    assert n_bn == 53
    result = optimize(m.module, m.params, ["simplify", "bn_fold"], SCHEDULE)
    assert not any(c.op_name == "nn.batch_norm" for c in calls(result.module))
    assert result.report.matches()["fold_batch_norm_into_conv2d"] == 53
    assert result.report.saturated
    x = m.inputs["data"]
    ref = run(m.module, {"data": x}, m.params)
    out = run(result.module, {"data": x})
    assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_dense_batch_norm_folds_into_dense():
    from eqquant.ir.builder import Builder
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (2, 8))
    w = b.param("w", rng.normal(size=(4, 8)).astype("float32"))
    stats = [b.param(k, rng.uniform(0.5, 1.5, 4).astype("float32"))
             for k in ("g", "b", "m", "v")]
    y = b.get(b.call("nn.batch_norm", b.call("nn.dense", x, w), *stats), 0)
    mod, params = b.finish(y)
    result = optimize(mod, params, ["bn_fold"])
    assert [c.op_name for c in calls(result.module)] == ["nn.dense", "add"]
    xv = rng.normal(size=(2, 8)).astype("float32")
    np.testing.assert_allclose(run(result.module, {"x": xv}), run(mod, {"x": xv}, params),
                               rtol=1e-5, atol=1e-5)


def test_lone_batch_norm_decomposes():
    m = build("conv_bn", image_size=8)
    from eqquant.ir.builder import Builder
    b = Builder()
    x = b.input("x", (1, 32, 8, 8))
    stats = [b.param(k, m.params[k]) for k in ("gamma", "beta", "mean", "variance")]
    mod, params = b.finish(b.get(b.call("nn.batch_norm", b.call("nn.relu", x), *stats), 0))
    from eqquant.extract.cost import NodeCount

    class NoBatchNorm(NodeCount):  # a runtime without a batch-norm kernel
        def op_cost(self, op, attrs, in_types, out_type):
            return 100.0 if op.name == "nn.batch_norm" else super().op_cost(
                op, attrs, in_types, out_type)

    result = optimize(mod, params, ["bn_fold"], cost=NoBatchNorm())
    assert result.report.matches()["decompose_batch_norm_nchw"] == 1
    assert [c.op_name for c in calls(result.module)] == ["nn.relu", "multiply", "add"]
    xv = np.random.default_rng(1).normal(size=(1, 32, 8, 8)).astype("float32")
    np.testing.assert_allclose(run(result.module, {"x": xv}), run(mod, {"x": xv}, params),
                               rtol=1e-5, atol=1e-5)


def test_conv_with_its_own_bias_then_batch_norm_folds():
    """PyTorch's Conv2d(bias=True) + BatchNorm2d (VGG-BN): imported as conv2d + bias_add, then
    batch_norm; the bias goes through the batch norm's affine map and one conv + add is left."""
    from eqquant.ir.builder import Builder
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (1, 4, 6, 6))
    w = b.param("w", rng.normal(size=(8, 4, 3, 3)).astype("float32"))
    bias = b.param("b", rng.normal(size=8).astype("float32"))
    stats = [b.param(k, v.astype("float32")) for k, v in (
        ("gamma", rng.uniform(0.5, 1.5, 8)), ("beta", rng.normal(size=8)),
        ("mean", rng.normal(size=8)), ("var", rng.uniform(0.5, 1.5, 8)))]
    y = b.call("nn.bias_add", b.call("nn.conv2d", x, w, padding=[1, 1, 1, 1]), bias, axis=1)
    mod, params = b.finish(b.get(b.call("nn.batch_norm", y, *stats), 0))
    result = optimize(mod, params, ["simplify", "bn_fold"], SCHEDULE)
    assert result.report.matches()["fold_batch_norm_into_conv2d_with_bias"] == 1
    assert [c.op_name for c in calls(result.module)] == ["nn.conv2d", "add"]
    xv = rng.normal(size=(1, 4, 6, 6)).astype("float32")
    np.testing.assert_allclose(run(result.module, {"x": xv}), run(mod, {"x": xv}, params),
                               rtol=1e-5, atol=1e-5)
