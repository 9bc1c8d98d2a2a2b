"""Params files, BindParams, and the zoo."""
import numpy as np
import pytest

from eqquant.errors import EvalError, ParamsError
from eqquant.ir.interp import run
from eqquant.ir.loader import load_program
from eqquant.core.nodes import Call, Constant, post_order
from eqquant.ir.params import bind_params, constant_params, load_params, save_params
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.ir.typecheck import check_module
from eqquant.zoo import build, write


def test_pickled_npz_is_refused(tmp_path):
    f = tmp_path / "evil.npz"
    np.savez(f, obj=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ParamsError, match="evil.npz"):
        load_params(f)


def test_bind_params_turns_parameters_into_constants(tmp_path):
    model = build("conv_bn", image_size=16)
    bound = bind_params(model.module, model.params)
    assert [p.name for p in bound.main.params] == ["data"]
    consts = [n for n in post_order(bound.main.body) if isinstance(n, Constant)]
    assert sorted(c.index for c in consts) == [0, 1, 2, 3, 4]
    x = model.inputs["data"]
    np.testing.assert_array_equal(run(bound, {"data": x}),
                                  run(model.module, {"data": x}, model.params))
    # the bound program saves as text + meta constants and loads back to the same function
    text = print_module(bound)
    (tmp_path / "b.ir").write_text(text)
    save_params(tmp_path / "b.npz", constant_params(bound))
    mod, params = load_program(tmp_path / "b.ir")
    assert mod == bound
    np.testing.assert_array_equal(run(mod, {"data": x}), run(bound, {"data": x}))


def test_bind_params_checks_shapes():
    model = build("conv_bn", image_size=16)
    bad = dict(model.params, gamma=np.zeros(7, np.float32))
    with pytest.raises(ParamsError, match="gamma"):
        bind_params(model.module, bad)


def test_missing_input_and_constant_value():
    mod = parse("def @main(%x: Tensor[(2), float32]) {\n  add(%x, meta[relay.Constant][0] "
                "/* ty=Tensor[(2), float32] */)\n}\n")
    with pytest.raises(EvalError, match="%x"):
        run(mod, {})
    with pytest.raises(EvalError, match="no value"):
        run(mod, {"x": np.ones(2, np.float32)})


@pytest.mark.parametrize("name", ["conv_bn", "resnet18_stem", "resnet18", "resnet50",
                                  "mobilenet_v2", "vgg_small"])
def test_zoo_models(name, tmp_path):
    a, b = build(name, seed=3, image_size=64), build(name, seed=3, image_size=64)
    assert print_module(a.module) == print_module(b.module)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    check_module(a.module)
    paths = write(a, tmp_path)
    mod, params = load_program(paths["ir"])
    assert mod == a.module
    out = run(mod, load_params(paths["input"]), params)
    assert np.isfinite(out).all() and out.std() > 0
    bns = [n for n in post_order(mod.main.body)
           if isinstance(n, Call) and n.op_name == "nn.batch_norm"]
    expected_bns = {"conv_bn": 1, "resnet18_stem": 3, "resnet18": 20, "resnet50": 53,
                    "mobilenet_v2": 52, "vgg_small": 3}[name]
    assert len(bns) == expected_bns
    var = params[bns[0].args[4].name]
    assert var.std() > 0 and not np.allclose(var, 1)  # non-trivial statistics


def test_mobilenet_has_depthwise_and_relu6():
    mod = build("mobilenet_v2", image_size=32).module
    convs = [n for n in post_order(mod.main.body) if isinstance(n, Call)
             and n.op_name == "nn.conv2d"]
    types = check_module(mod)
    depthwise = [c for c in convs if c.attrs["groups"] > 1
                 and c.attrs["groups"] == types[id(c.args[0])].shape[1]]
    assert len(depthwise) == 17
    clips = [n for n in post_order(mod.main.body) if isinstance(n, Call) and n.op_name == "clip"]
    assert clips and all((c.attrs["a_min"], c.attrs["a_max"]) == (0.0, 6.0) for c in clips)


def test_global_functions_are_called_and_inlined():
    from eqquant.passes.inline import inline_calls
    mod = parse("""def @helper(%a: Tensor[(2), float32]) -> Tensor[(2), float32] {
  nn.relu(%a)
}
def @main(%x: Tensor[(2), float32]) {
  %0 = @helper(%x);
  add(%0, @helper(%0))
}
""")
    check_module(mod)
    x = np.array([-1.0, 2.0], np.float32)
    np.testing.assert_array_equal(run(mod, {"x": x}), [0.0, 4.0])
    flat = inline_calls(mod)
    assert list(flat.functions) == ["main"]
    np.testing.assert_array_equal(run(flat, {"x": x}), [0.0, 4.0])
    assert parse(print_module(mod)) == mod


def test_the_seed_names_are_aliases_of_the_descriptive_names():
    from eqquant.errors import EqquantError
    assert print_module(build("seed004", image_size=16).module) == \
        print_module(build("resnet18_stem", image_size=16).module)
    assert build("seed000", image_size=16).name == "conv_bn"
    with pytest.raises(EqquantError, match="aliases: seed000, seed004"):
        build("seed005")
