"""ONNX import: models built with onnx.helper and tests/data/tiny_resnet.onnx import, run on
the executor and the interpreter, and agree with ONNX Runtime; every bad input gives a located
error naming the node and op."""
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

import onnx_models as om  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from conftest import cli_exit  # noqa: E402
from eqquant.interop.onnx_import import OnnxImportError, import_onnx, valid_name  # noqa: E402
from eqquant.ir.interp import run  # noqa: E402
from eqquant.ir.loader import load_program  # noqa: E402
from eqquant.core.nodes import Call, post_order  # noqa: E402
from eqquant.ir.params import bind_params  # noqa: E402
from eqquant.ir.parser import parse  # noqa: E402
from eqquant.ir.printer import print_module  # noqa: E402
from eqquant.optimizer import optimize  # noqa: E402
from eqquant.runtime.execution.executor import Executor  # noqa: E402
from eqquant.runtime.execution.sized import executor_for  # noqa: E402
from eqquant.core.types import Dim  # noqa: E402
from eqquant.errors import EvalError  # noqa: E402

DATA = Path(__file__).parent / "data"


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def eq_inputs(mod, params, onnx_feeds):
    free = [p for p in mod.main.params if p.name not in params]
    return {p.name: arr for p, arr in zip(free, onnx_feeds.values())}


def close(out, ref, rel=1e-4):
    assert out.shape == ref.shape
    assert np.max(np.abs(out - ref)) <= rel * np.max(np.abs(ref))


@pytest.mark.parametrize("name", sorted(om.ALL))
def test_helper_models_match_onnxruntime(name):
    model = om.ALL[name]()
    mod, params, _ = import_onnx(model)
    feeds = om.input_for(model)
    ref = ort_run(model, feeds)
    bound = bind_params(mod, params)
    x = eq_inputs(mod, params, feeds)
    close(Executor(bound).run(x), ref)
    close(np.asarray(run(bound, x)), ref)
    # the text IR round-trips and the optimizer keeps the function
    text = print_module(mod)
    assert print_module(parse(text)) == text
    opt = optimize(mod, params, ["simplify", "bn_fold", "fusion"],
                   "simplify; bn_fold; simplify; fusion").module
    close(Executor(opt).run(x), ref)
    if name.startswith(("resnet", "mobilenet")):
        ops = {n.op_name for n in post_order(opt.main.body) if isinstance(n, Call)}
        assert "nn.batch_norm" not in ops, "every BatchNormalization folds into its conv"


def test_tiny_resnet_file(tmp_path):
    path = DATA / "tiny_resnet.onnx"
    model = onnx.load(str(path))
    mod, params, notes = import_onnx(path)
    # the file's symbolic batch 'N' stays open: one program for every batch size
    assert mod.main.params[0].name == "input_1" and mod.main.params[0].type.shape == (
        Dim.named("N"), 3, 16, 16)
    assert "Tensor[(?N, 3, 16, 16), float32]" in print_module(mod)
    x = np.random.default_rng(3).standard_normal((3, 3, 16, 16)).astype(np.float32)
    close(executor_for(bind_params(mod, params)).run({"input_1": x}),
          ort_run(model, {"input.1": x}))
    x = x[:1]
    ref = ort_run(model, {"input.1": x})
    close(executor_for(bind_params(mod, params)).run({"input_1": x}), ref)
    # the command line writes text IR + params that load and run the same
    assert cli_exit(["import", str(path), "-o", str(tmp_path / "out")]) == 0
    mod2, params2 = load_program(tmp_path / "out" / "tiny_resnet.ir")
    close(executor_for(bind_params(mod2, params2)).run({"input_1": x}), ref)
    # --shape fixes the batch
    assert cli_exit(["import", str(path), "-o", str(tmp_path / "b2"), "--shape",
                      "input.1=2,3,16,16"]) == 0
    mod3, _ = load_program(tmp_path / "b2" / "tiny_resnet.ir")
    assert mod3.main.params[0].type.shape == (2, 3, 16, 16)


def test_names_are_kept_or_made_valid():
    assert valid_name("conv1.weight") == "conv1.weight"
    assert valid_name("onnx::Conv_12") == "onnx::Conv_12"
    assert valid_name("input.1") == "input_1"
    assert valid_name("/layer1/conv/Conv_output_0") == "layer1_conv_Conv_output_0"
    assert valid_name("123") is None
    assert valid_name("3d") == "v_3d"
    for name in ("input.1", "/a/b:0", "x y", "3d", "a-b"):
        new = valid_name(name)
        parse(f"def @main(%{new}: float32) {{ %{new} }}")   # a valid text-IR name


def test_old_opsets_softmax_and_clip_attributes():
    g = om.G(opset=10)
    y = g.node("Clip", ["x"], min=-0.5, max=0.5)
    out = g.node("Softmax", [y], axis=1)        # opset < 13: axes 1.. flattened together
    model = g.model([("x", [2, 3, 4, 5])], [out])
    mod, params, _ = import_onnx(model)
    feeds = om.input_for(model)
    close(Executor(bind_params(mod, params)).run(eq_inputs(mod, params, feeds)),
          ort_run(model, feeds))



# ---- errors -----------------------------------------------------------------------------------


def _single(op, ins, shape=(1, 3, 8, 8), opset=17, inits=(), domain="", **attrs):
    node = helper.make_node(op, ins, ["y"], name="bad_node", domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [])], initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)] + (
        [helper.make_opsetid(domain, 1)] if domain else []))
    model.ir_version = 8
    return model


def _w(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


BAD = {
    "unsupported op": (_single("LpNormalization", ["x"]), "op LpNormalization is not supported"),
    "custom domain": (_single("MyOp", ["x"], domain="com.example"),
                      "op MyOp of domain 'com.example' is not supported"),
    "4-d convolution": (_single("Conv", ["x", "w"], shape=(1, 3, 4, 4, 4, 4),
                                inits=[_w("w", np.ones((2, 3, 1, 1, 1, 1), np.float32))]),
                        "only 2-d and 3-d convolutions"),
    "runtime reshape shape": (_single("Reshape", ["x", "x"]), "Reshape's shape"),
    "training batch norm": (_single("BatchNormalization", ["x", "s", "b", "m", "v"],
                                    training_mode=1, inits=[_w(n, np.ones(3, np.float32))
                                                            for n in "sbmv"]),
                            "training_mode=1"),
    "max pool indices order": (_single("MaxPool", ["x"], kernel_shape=[2, 2],
                                       storage_order=1), "storage_order=1"),
    "type error": (_single("Add", ["x", "w"], inits=[_w("w", np.ones((5,), np.float32))]),
                   "add"),
    # the hostile probe's cases
    "constant of shape bomb": (_single("ConstantOfShape", ["s"], inits=[_w(
        "s", np.array([1 << 20, 1 << 20], np.int64))]), "more than"),
    "constant loop": (_single("Loop", ["n", "c"], inits=[_w("n", np.array(1 << 62, np.int64)),
                                                         _w("c", np.array(True))],
                              body=helper.make_graph([], "b", [], [])),
                      "is not evaluated at import"),
    "complex initializer": (_single("Add", ["x", "w"], inits=[_w(
        "w", np.ones((1,), np.complex64))]), "cannot hold"),
    "unsqueeze axes": (_single("Unsqueeze", ["x", "a"], inits=[_w("a", np.array([9], np.int64))]),
                       "out of range"),
    "conv kernel shape": (_single("Conv", ["x", "w"], kernel_shape=[3, 3], inits=[_w(
        "w", np.ones((2, 3, 1, 1), np.float32))]), "disagrees with the weight"),
    "clip vector bound": (_single("Clip", ["x", "lo"], inits=[_w(
        "lo", np.zeros(3, np.float32))]), "must be one number"),
    # found by the long fuzz run: constants of the wrong rank or kind
    "reshape shape matrix": (_single("Reshape", ["x", "s"], inits=[_w(
        "s", np.ones((2, 2), np.int64))]), "must be a vector of integers"),
    "pad pads float": (_single("Pad", ["x", "p"], inits=[_w(
        "p", np.zeros(8, np.float32))]), "must be a vector of integers"),
    # found by the fuzz suite: a string attribute whose bytes are not text
    "string attribute not utf-8": (_single("Conv", ["x", "w"], auto_pad=b"\xff\xffER",
                                           inits=[_w("w", np.ones((2, 3, 1, 1), np.float32))]),
                                   "not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_models_give_located_errors(case, tmp_path, capsys):
    model, expected = BAD[case]
    with pytest.raises(OnnxImportError) as info:
        import_onnx(model, source="bad.onnx")
    msg = info.value.format()
    assert "bad.onnx" in msg and expected in msg
    if case not in ("runtime reshape shape", "complex initializer"):
        assert "'bad_node'" in msg
    # and on the command line: exit 2, the message, no traceback, nothing written
    path = tmp_path / "bad.onnx"
    path.write_bytes(model.SerializeToString())
    out = tmp_path / "out"
    assert cli_exit(["import", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (out / "bad.ir").exists()


@pytest.mark.parametrize("content, expected", [
    (b"\x00\x01 this is not protobuf \xff" * 3, "not a readable ONNX model"),
    (b"", "not a valid ONNX model"),
])
def test_malformed_files(tmp_path, capsys, content, expected):
    path = tmp_path / "broken.onnx"
    path.write_bytes(content)
    assert cli_exit(["import", str(path), "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and expected in err and "Traceback" not in err


def test_truncated_file_and_missing_file(tmp_path, capsys):
    data = (DATA / "tiny_resnet.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    assert cli_exit(["import", str(path), "-o", str(tmp_path / "o")]) == 2
    assert "cut.onnx" in capsys.readouterr().err
    assert cli_exit(["import", str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_symbolic_inner_dimensions_stay_open(tmp_path, capsys):
    g = om.G()
    out = g.node("Relu", ["x"])
    model = g.model([("x", [1, 3, "H", "W"])], [out])
    mod, _, _ = import_onnx(model)
    assert "Tensor[(1, 3, ?H, ?W), float32]" in print_module(mod)
    ex = executor_for(mod)
    for h, w in ((4, 5), (8, 8)):
        x = np.random.default_rng(h).standard_normal((1, 3, h, w)).astype(np.float32)
        assert np.array_equal(ex.run({"x": x}), np.maximum(x, 0))
    with pytest.raises(EvalError, match="%x expects shape"):
        ex.run({"x": np.zeros((2, 3, 4, 4), np.float32)})
    mod, _, _ = import_onnx(model, shapes={"x": (1, 3, 8, 8)})
    assert mod.main.params[0].type.shape == (1, 3, 8, 8)
    path = tmp_path / "sym.onnx"
    onnx.save(model, str(path))
    assert cli_exit(["import", str(path), "-o", str(tmp_path / "o"), "--shape", "x=oops"]) == 2
    assert "NAME=D1,D2" in capsys.readouterr().err


def test_unsupported_second_output_is_named():
    g = om.G()
    y, mask = g.node("Dropout", ["x"], n_out=2)
    out = g.node("Add", [y, mask])
    model = g.model([("x", [1, 4])], [out])
    with pytest.raises(OnnxImportError, match="output 1 of Dropout node"):
        import_onnx(model)


def test_quantize_command_takes_onnx_and_its_input_names(tmp_path, capsys):
    """eqquant quantize MODEL.onnx: calibration arrays keyed by the ONNX input name."""
    rng = np.random.default_rng(8)
    np.savez(tmp_path / "calib.npz",
             **{"input.1": rng.standard_normal((3, 1, 3, 16, 16)).astype(np.float32)})
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(DATA / "tiny_resnet.onnx"), "--calib",
                      str(tmp_path / "calib.npz"), "--mode", "minmax", "-o", str(out)]) == 0
    assert "output: SQNR" in capsys.readouterr().out and out.exists()
    np.savez(tmp_path / "bad.npz", other=np.zeros((2, 1, 3, 16, 16), np.float32))
    assert cli_exit(["quantize", str(DATA / "tiny_resnet.onnx"), "--calib",
                      str(tmp_path / "bad.npz"), "-o", str(tmp_path / "x.ir")]) == 2
    err = capsys.readouterr().err
    assert "bad.npz: calibration data names other" in err and "Traceback" not in err


def test_run_command_takes_onnx(tmp_path, capsys):
    x = np.random.default_rng(9).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "x.npz", **{"input.1": x})
    assert cli_exit(["run", str(DATA / "tiny_resnet.onnx"), "--input", str(tmp_path / "x.npz"),
                      "-o", str(tmp_path / "y.npy")]) == 0
    ref = ort_run(onnx.load(str(DATA / "tiny_resnet.onnx")), {"input.1": x})
    close(np.load(tmp_path / "y.npy"), ref)


@pytest.mark.parametrize("sigmoid_first", [False, True])
def test_silu_as_pytorch_exports_it_becomes_one_op_with_the_bits_of_its_two_steps(
        sigmoid_first):
    """EfficientNet's SiLU as PyTorch writes it (Mul of x and Sigmoid(x), either way round):
    the simplify rules make it one nn.silu, whose kernel (one pass) gives the bits of the
    sigmoid's and the product's kernels, and which exports back as Mul(x, Sigmoid(x)),
    matching ONNX Runtime."""
    from eqquant.interop.onnx_export import to_onnx
    mul = ["s", "x"] if sigmoid_first else ["x", "s"]
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", mul, ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 8, 30, 31])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 8, 30, 31])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod, params, _ = import_onnx(model)
    x = {"x": np.random.default_rng(1).normal(size=(2, 8, 30, 31)).astype("float32") * 6}
    x["x"][0, 0, 0, :4] = [np.inf, -np.inf, np.nan, -100.0]
    opt = optimize(mod, None, ["simplify"], cost="nodes").module
    ops = [n.op_name for n in post_order(opt.main.body) if isinstance(n, Call)]
    assert ops == ["nn.silu"], ops
    two_steps = Executor(mod).run(x)
    np.testing.assert_array_equal(Executor(opt).run(x), two_steps)
    np.testing.assert_allclose(run(opt, x), two_steps, rtol=1e-6, atol=1e-7)
    exported = to_onnx(opt)
    assert sorted(n.op_type for n in exported.graph.node) == ["Mul", "Sigmoid"]
    np.testing.assert_allclose(ort_run(exported, x), ort_run(model, x), rtol=1e-6, atol=1e-7)


def test_gelu_as_pytorch_opset17_writes_it_imports_with_literal_scalars_and_becomes_gelu():
    """PyTorch's opset-17 GELU (Div, Erf, Add, Mul, Mul with rank-0 initializers): the
    rank-0 constants import as inline literals (as Relay's frontend writes them), so the
    simplify rules recognise nn.gelu; the program matches ONNX Runtime."""
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", ["x", "a"],
                                                                            ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [_w("sqrt2", np.float32(np.sqrt(2))), _w("one", np.float32(1)),
             _w("half", np.float32(0.5))]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 64])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [2, 64])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod, params, _ = import_onnx(model)
    text = print_module(mod)
    assert "1.4142135f" in text and "0.5f" in text and not params, text
    x = np.random.default_rng(0).normal(size=(2, 64)).astype("float32") * 3
    close(run(mod, {"x": x}), ort_run(model, {"x": x}), rel=1e-6)
    opt = optimize(mod, None, ["simplify"], cost="nodes").module
    ops = [n.op_name for n in post_order(opt.main.body) if isinstance(n, Call)]
    assert ops == ["nn.gelu"], ops
    close(run(opt, {"x": x}), ort_run(model, {"x": x}), rel=1e-6)
