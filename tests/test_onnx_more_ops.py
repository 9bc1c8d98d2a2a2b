"""ONNX ops of models from elsewhere, each one registry entry, drawn by hypothesis and checked
against ONNX Runtime: PRelu (its slope broadcast as opset 7 and later say, and per channel as
opset 6 says), Pow, Sign, Reciprocal, InstanceNormalization, and Gather
at indices computed at run time (an embedding look-up); each on the reference interpreter and
the executor, and exported back to a model ONNX Runtime runs the same way."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnxruntime as ort  # noqa: E402
from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from eqquant.errors import EvalError  # noqa: E402
from eqquant.interop.onnx_export import to_onnx  # noqa: E402
from eqquant.interop.onnx_import import import_onnx  # noqa: E402
from eqquant.ir.interp import run  # noqa: E402
from eqquant.ir.params import bind_params  # noqa: E402
from eqquant.runtime.execution.executor import Executor  # noqa: E402
from test_onnx_ops import SETTINGS, _agree, _data, _model  # noqa: E402

shapes = st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16), data=st.data())
def test_prelu_with_its_slope_broadcast(shape, seed, data):
    """Opset 13: the slope broadcasts from the right: one value, or one per element of one
    axis (the channels, as PyTorch exports (C, 1, 1))."""
    axis = data.draw(st.integers(0, len(shape) - 1))
    slope_shape = data.draw(st.sampled_from([(1,), (shape[axis],) + (1,) * (len(shape) - 1
                                                                           - axis)]))
    slope = np.random.default_rng(seed).uniform(-1, 1, size=slope_shape).astype(np.float32)
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], shape, [("s", slope)],
                   opset=13)
    mod = _agree(model, _data(shape, seed=seed))
    assert "nn.prelu(" in str(mod)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16), one=st.booleans())
def test_prelu_of_opset_6_is_per_channel(shape, seed, one):
    """Before opset 7 a 1-d slope is one value per channel of axis 1 (PyTorch's old exports,
    as ONNX's own pytorch-converted tests have them), which numpy's broadcasting would put
    on the last axis."""
    slope = np.random.default_rng(seed).uniform(-1, 1, size=1 if one else shape[1])
    x = _data(shape, seed=seed)
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], shape,
                   [("s", slope.astype(np.float32))], opset=6)
    mod, params, _ = import_onnx(model)
    want = np.where(x < 0, x * slope.reshape((-1,) + (1,) * (len(shape) - 2)).astype(
        np.float32), x)
    np.testing.assert_array_equal(run(mod, {"x": x}, params), want)
    np.testing.assert_array_equal(Executor(bind_params(mod, params)).run({"x": x}), want)


def test_prelu_whose_slope_varies_along_two_axes_is_refused():
    from eqquant.interop.onnx_import import OnnxImportError
    model = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], (1, 2, 3),
                   [("s", np.ones((2, 3), np.float32))], opset=13)
    with pytest.raises(OnnxImportError, match=r"\(PRelu\).*varies along 2 axes"):
        import_onnx(model)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16),
       exponent=st.sampled_from(["int", "float", "tensor"]))
def test_pow(shape, seed, exponent):
    rng = np.random.default_rng(seed)
    e = {"int": np.asarray(rng.integers(-2, 4), np.int64),
         "float": np.asarray(rng.uniform(-2, 3), np.float32),
         "tensor": rng.uniform(-2, 3, size=shape[-1:]).astype(np.float32)}[exponent]
    x = np.abs(_data(shape, seed=seed)) + np.float32(0.1)     # (a real power of a positive)
    mod = _agree(_model([helper.make_node("Pow", ["x", "e"], ["y"])], shape, [("e", e)],
                        opset=13), x, tol=1e-4)
    assert "power(" in str(mod)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16), op=st.sampled_from(["Sign", "Reciprocal"]))
def test_sign_and_reciprocal(shape, seed, op):
    x = _data(shape, seed=seed)
    x[..., 0] = 0.0 if op == "Sign" else 0.5            # (Sign of 0 is 0)
    mod = _agree(_model([helper.make_node(op, ["x"], ["y"])], shape), x)
    assert {"Sign": "sign(", "Reciprocal": "divide(1f"}[op] in str(mod)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=3, max_size=5).map(tuple),
       seed=st.integers(0, 2 ** 16), eps=st.sampled_from([1e-5, 1e-3, 1e-9]))
def test_instance_normalization(shape, seed, eps):
    """Over two or more positions: over one, the variance is 0 and the result is beta, which
    ONNX Runtime's float32 arithmetic misses by up to 3e-4 when epsilon is 1e-9 (its
    rounding error over sqrt(epsilon))."""
    assume(int(np.prod(shape[2:])) >= 2)
    rng = np.random.default_rng(seed)
    c = shape[1]
    inits = [("g", rng.normal(size=c).astype(np.float32)),
             ("b", rng.normal(size=c).astype(np.float32))]
    node = helper.make_node("InstanceNormalization", ["x", "g", "b"], ["y"], epsilon=eps)
    mod = _agree(_model([node], shape, inits), _data(shape, seed=seed) + 2, tol=1e-4)
    assert "nn.instance_norm(" in str(mod)


def _gather_model(table, ids_shape, axis):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=axis)], "m",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, list(ids_shape))],
        [helper.make_value_info("y", helper.make_tensor_type_proto(TensorProto.FLOAT, None))],
        initializer=[numpy_helper.from_array(table, "table")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@SETTINGS
@given(rows=st.integers(1, 9), width=st.integers(1, 6),
       ids_shape=st.lists(st.integers(1, 4), min_size=0, max_size=2).map(tuple),
       axis=st.integers(0, 1), seed=st.integers(0, 2 ** 16))
def test_gather_at_run_time_indices(rows, width, ids_shape, axis, seed):
    """An embedding look-up: token IDs (an input, int64, negative ones counting from the
    end) into a constant table, along either axis."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(rows, width)).astype(np.float32)
    n = table.shape[axis]
    ids = rng.integers(-n, n, size=ids_shape).astype(np.int64)
    model = _gather_model(table, ids_shape, axis)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"ids": ids})[0]
    mod, params, _ = import_onnx(model)
    assert "take_at(" in str(mod)
    np.testing.assert_array_equal(run(mod, {"ids": ids}, params), want)
    bound = bind_params(mod, params)
    np.testing.assert_array_equal(Executor(bound).run({"ids": ids}), want)
    again = ort.InferenceSession(to_onnx(bound).SerializeToString(),
                                 providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(again.run(None, {"ids": ids})[0], want)


def test_an_index_outside_the_table_is_an_error_not_a_crash():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    mod, params, _ = import_onnx(_gather_model(table, (1, 4), 0))
    ids = np.asarray([[0, 1, 4, 2]], np.int64)
    with pytest.raises(EvalError, match="index 4 is out of range for axis 0 of size 4"):
        run(mod, {"ids": ids}, params)
    # (the executor checks the input as it enters: its kernel cannot raise)
    with pytest.raises(EvalError, match=r"%ids: 4 is outside \[-4, 3\] \(take_at's indices"):
        Executor(bind_params(mod, params)).run({"ids": ids})


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16),
       op=st.sampled_from(["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]),
       logic=st.sampled_from([None, "Not", "And", "Or", "Xor"]))
def test_comparisons_and_logic_make_an_attention_mask(shape, seed, op, logic):
    """An attention mask as exporters write it: compare an input with a constant, combine
    truth values, and pick with Where: -inf where masked, the input elsewhere."""
    rng = np.random.default_rng(seed)
    x = np.round(_data(shape, seed=seed))                 # (ties, so Equal is sometimes true)
    nodes = [helper.make_node(op, ["x", "t"], ["m"])]
    inits = [("t", np.round(rng.normal(size=shape[-1:])).astype(np.float32)),
             ("neg", np.asarray(-np.inf, np.float32))]
    mask = "m"
    if logic == "Not":
        nodes.append(helper.make_node("Not", ["m"], ["m2"]))
        mask = "m2"
    elif logic:
        nodes += [helper.make_node("Greater", ["x", "zero"], ["p"]),
                  helper.make_node(logic, ["m", "p"], ["m2"])]
        inits.append(("zero", np.asarray(0.0, np.float32)))
        mask = "m2"
    nodes.append(helper.make_node("Where", [mask, "neg", "x"], ["y"]))
    mod = _agree(_model(nodes, shape, inits, opset=13), x)
    ir = {"Equal": "equal(", "Less": "less(", "LessOrEqual": "less_equal(",
          "Greater": "greater(", "GreaterOrEqual": "greater_equal("}[op]
    assert ir in str(mod) and "where(" in str(mod)


def test_arithmetic_on_truth_values_is_a_type_error():
    from eqquant import parse
    from eqquant.errors import TypeCheckError
    from eqquant.ir.typecheck import infer_types
    for body in ("negative(%b)", "add(%b, %b)", "logical_not(%x)"):
        mod = parse(f"def @main(%b: Tensor[(2, 3), bool], %x: Tensor[(2, 3), float32]) "
                    f"{{ {body} }}")
        with pytest.raises(TypeCheckError):
            infer_types(mod)


@SETTINGS
@given(n=st.integers(1, 2), c=st.integers(1, 3), hw=st.integers(1, 3), b=st.integers(1, 3),
       op=st.sampled_from(["DepthToSpace DCR", "DepthToSpace CRD", "SpaceToDepth"]),
       seed=st.integers(0, 2 ** 16))
def test_depth_to_space_and_back(n, c, hw, b, op, seed):
    """PixelShuffle's export (DepthToSpace, either mode) and its inverse: a reshape, a
    transpose and a reshape, which the layout kernels run."""
    name, *mode = op.split()
    shape = (n, c * b * b, hw, hw) if name == "DepthToSpace" else (n, c, hw * b, hw * b)
    attrs = {"blocksize": b, **({"mode": mode[0]} if mode else {})}
    mod = _agree(_model([helper.make_node(name, ["x"], ["y"], **attrs)], shape, opset=13),
                 _data(shape, seed=seed))
    assert "transpose(" in str(mod)


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=4, max_size=4).map(tuple),
       size=st.sampled_from([1, 3, 5]), seed=st.integers(0, 2 ** 16), defaults=st.booleans())
def test_local_response_normalization(shape, size, seed, defaults):
    """LRN (AlexNet's, GoogLeNet's), as ONNX Runtime takes it: NCHW, an odd size."""
    attrs = {"size": size} if defaults else {"size": size, "alpha": 0.01, "beta": 0.5,
                                              "bias": 1.5}
    mod = _agree(_model([helper.make_node("LRN", ["x"], ["y"], **attrs)], shape, opset=13),
                 _data(shape, seed=seed), tol=1e-4)
    assert "nn.lrn(" in str(mod)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_gather_elements(shape, seed, data):
    """GatherElements at constant indices (negative ones too), the indices no larger than
    the data on the other axes."""
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(0, len(shape) - 1))
    ishape = tuple(data.draw(st.integers(1, d)) if k != axis else data.draw(st.integers(1, 4))
                   for k, d in enumerate(shape))
    idx = rng.integers(-shape[axis], shape[axis], ishape).astype(np.int64)
    model = _model([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)], shape,
                   [("i", idx)], opset=13)
    mod = _agree(model, _data(shape, seed=seed))
    assert "gather(" in str(mod)


def test_not_equal_exports_as_not_of_equal():
    """not_equal has no ONNX op of its own: it is written Not(Equal), which ONNX Runtime
    computes as the reference does (NaN unequal to itself)."""
    from eqquant import parse
    mod = parse("def @main(%x: Tensor[(2, 3), float32], %y: Tensor[(3), float32]) { "
                "where(not_equal(%x, %y), %x, 0f) }")
    x = np.asarray([[1, np.nan, 3], [4, 5, 6]], np.float32)
    y = np.asarray([1, np.nan, 0], np.float32)
    sess = ort.InferenceSession(to_onnx(mod).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x, "y": y})[0]
    np.testing.assert_array_equal(got, run(mod, {"x": x, "y": y}))
    assert np.isnan(got[0, 1]) and got[0, 0] == 0 and got[0, 2] == 3


@SETTINGS
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 5), w=st.integers(1, 5),
       sh=st.integers(1, 3), sw=st.integers(1, 3), mode=st.sampled_from(["nearest", "linear"]),
       opset=st.sampled_from([7, 9]), seed=st.integers(0, 2 ** 16))
def test_upsample_of_old_opsets(n, c, h, w, sh, sw, mode, opset, seed):
    """Upsample, as exporters wrote nn.Upsample before Resize (opset 7: scales as an
    attribute; 9: as an input): image.resize2d at asymmetric coordinates."""
    scales = np.asarray([1, 1, sh, sw], np.float32)
    if opset == 7:
        node, inits = helper.make_node("Upsample", ["x"], ["y"], mode=mode,
                                       scales=scales.tolist()), []
    else:
        node, inits = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode), \
            [("s", scales)]
    shape = (n, c, h, w)
    x = _data(shape, seed=seed)
    model = _model([node], shape, inits, opset=opset)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    mod, params, _ = import_onnx(model)
    assert "image.resize2d(" in str(mod)
    np.testing.assert_allclose(run(mod, {"x": x}, params), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Executor(bind_params(mod, params)).run({"x": x}), want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spatial", [0, 1])
def test_batch_normalization_of_opset_7_per_element_or_per_channel(spatial):
    """BatchNormalization before opset 9: ``spatial=0`` keeps one statistic per element of
    an image, read as a multiply and an add by constants; ``spatial=1``, the usual one per
    channel."""
    rng = np.random.default_rng(5)
    shape = (2, 3, 4, 5)
    per = shape[1:] if spatial == 0 else shape[1:2]
    inits = [("s", rng.uniform(0.5, 1.5, per)), ("b", rng.normal(size=per)),
             ("m", rng.normal(size=per)), ("v", rng.uniform(0.5, 2, per))]
    inits = [(k, v.astype(np.float32)) for k, v in inits]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                            spatial=spatial, epsilon=1e-3)
    mod = _agree(_model([node], shape, inits, opset=7), _data(shape, seed=1), tol=1e-4)
    assert ("nn.batch_norm(" in str(mod)) == (spatial == 1)
