"""The ONNX ops of the CNN and transformer zoo (HardSwish, HardSigmoid, Erf, Gelu, Tanh, Exp,
Reduce*, Cast, Slice, Split, Expand, Tile, LayerNormalization, batched MatMul, Softmax on any
axis): each imported model, drawn by hypothesis, runs on the reference interpreter and on the
executor as ONNX Runtime runs the model, and exports back to a model ONNX Runtime runs the
same way."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import onnxruntime as ort  # noqa: E402
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from eqquant.interop.onnx_export import to_onnx  # noqa: E402
from eqquant.interop.onnx_import import import_onnx  # noqa: E402
from eqquant.ir.interp import run  # noqa: E402
from eqquant.ir.params import bind_params  # noqa: E402
from eqquant.runtime.execution.executor import Executor  # noqa: E402

SETTINGS = settings(max_examples=12, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _model(nodes, shape, inits=(), opset=17):
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_value_info("y", helper.make_tensor_type_proto(TensorProto.FLOAT, None))],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8          # (the output's shape is left to the runtimes)
    return m


def _ort(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _agree(model, x, tol=1e-5):
    """Reference, executor and the exported model all compute what ONNX Runtime computes."""
    want = _ort(model, x)
    mod, params, _ = import_onnx(model)
    name = mod.main.params[0].name
    ref = run(mod, {name: x}, params)
    np.testing.assert_allclose(ref, want, rtol=tol, atol=tol)
    bound = bind_params(mod, params)
    got = Executor(bound).run({name: x})
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(_ort(to_onnx(bound), x), want, rtol=tol, atol=tol)
    return mod


def _data(shape, scale=3.0, seed=0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


shapes = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16),
       op=st.sampled_from(["HardSwish", "HardSigmoid", "Erf", "Tanh", "Exp", "Elu", "Selu",
                           "Softplus", "Softsign"]),
       alpha=st.floats(0.05, 1.0), beta=st.floats(-1.0, 1.0), defaults=st.booleans())
def test_unary_activations(shape, seed, op, alpha, beta, defaults):
    attrs = {"HardSigmoid": {"alpha": alpha, "beta": beta}, "Elu": {"alpha": alpha},
             "Selu": {"alpha": 1 + alpha, "gamma": 1 + beta / 2}}.get(op, {})
    attrs = {} if defaults else attrs
    mod = _agree(_model([helper.make_node(op, ["x"], ["y"], **attrs)], shape), _data(shape,
                                                                                  seed=seed))
    ir = {"HardSwish": "nn.hardswish", "HardSigmoid": "nn.hardsigmoid", "Erf": "erf",
          "Tanh": "tanh", "Exp": "exp", "Elu": "nn.elu", "Selu": "nn.selu",
          "Softplus": "nn.softplus", "Softsign": "nn.softsign"}[op]
    assert f"{ir}(%x" in str(mod)


def test_the_activations_run_on_their_own_kernels():
    x = _data((2, 8, 5, 5))
    for op, ir in (("HardSwish", "nn.hardswish"), ("HardSigmoid", "nn.hardsigmoid"),
                   ("Erf", "erf"), ("Elu", "nn.elu"), ("Selu", "nn.selu"),
                   ("Softplus", "nn.softplus"), ("Softsign", "nn.softsign")):
        mod, _, _ = import_onnx(_model([helper.make_node(op, ["x"], ["y"])], x.shape))
        ex = Executor(mod)
        ex.run({mod.main.params[0].name: x})
        assert [s.kind for s in ex.steps if s.label.startswith(ir)] == ["kernel"], ir


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16))
def test_gelu_as_pytorch_exports_it_and_as_one_op(shape, seed):
    """PyTorch at opset 17 writes GELU as x * 0.5 * (1 + erf(x / sqrt 2)); opset 20 has Gelu
    (erf and tanh forms)."""
    x = _data(shape, seed=seed)
    nodes = [helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["a"]),
             helper.make_node("Mul", ["x", "a"], ["m"]),
             helper.make_node("Mul", ["m", "half"], ["y"])]
    inits = [("r2", np.float32(np.sqrt(2))), ("one", np.float32(1)), ("half", np.float32(0.5))]
    _agree(_model(nodes, shape, inits=inits), x)
    for approximate in ("none", "tanh"):
        m = _model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], shape,
                   opset=20)
        mod = _agree(m, x)
        assert "nn.gelu" in str(mod)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), op=st.sampled_from(["ReduceMean", "ReduceSum",
                                                         "ReduceMax", "ReduceMin"]),
       keepdims=st.booleans(), opset=st.sampled_from([17, 18]), data=st.data())
def test_reductions(shape, seed, op, keepdims, opset, data):
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), min_size=1,
                              max_size=len(shape), unique_by=lambda a: a % len(shape)))
    inits = []
    if op == "ReduceSum" or opset >= 18:
        node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=int(keepdims))
        inits = [("axes", np.asarray(axes, np.int64))]
    else:
        node = helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=int(keepdims))
    _agree(_model([node], shape, inits=inits, opset=opset), _data(shape, seed=seed), tol=1e-4)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16),
       to=st.sampled_from([TensorProto.INT32, TensorProto.INT8, TensorProto.FLOAT16]))
def test_cast_there_and_back(shape, seed, to):
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=to),
             helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT)]
    x = np.clip(_data(shape, scale=40, seed=seed), -120, 120)
    _agree(_model(nodes, shape), x)


@SETTINGS
@given(shape=st.lists(st.integers(1, 7), min_size=1, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_slice(shape, seed, data):
    rank = len(shape)
    axes = data.draw(st.lists(st.integers(-rank, rank - 1), min_size=1, max_size=rank,
                              unique_by=lambda a: a % rank))
    starts, ends, steps = [], [], []
    for a in axes:
        dim = shape[a % rank]
        step = data.draw(st.sampled_from([1, 1, 2, -1, -2]))
        starts.append(data.draw(st.integers(-dim - 2, dim + 2)))
        ends.append(data.draw(st.sampled_from([2 ** 63 - 1, -(2 ** 63), dim, -1, 0, 1])))
        steps.append(step)
    cut = [slice(None)] * rank
    for a, b, e, t in zip(axes, starts, ends, steps):
        cut[a % rank] = slice(b, e, t)
    want_shape = np.empty(shape)[tuple(cut)].shape
    if 0 in want_shape:
        return                          # ONNX Runtime's empty results are not compared
    inits = [("s", np.asarray(starts, np.int64)), ("e", np.asarray(ends, np.int64)),
             ("a", np.asarray(axes, np.int64)), ("t", np.asarray(steps, np.int64))]
    _agree(_model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], shape,
                  inits=inits), _data(shape, seed=seed))


@SETTINGS
@given(shape=st.lists(st.integers(2, 6), min_size=2, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_split_with_sizes_and_into_equal_parts(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    cut = data.draw(st.integers(1, dim - 1))
    sizes = np.asarray([cut, dim - cut], np.int64)
    nodes = [helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=axis),
             helper.make_node("Concat", ["q", "p"], ["y"], axis=axis)]   # swapped
    x = _data(shape, seed=seed)
    _agree(_model(nodes, shape, inits=[("sizes", sizes)]), x)
    parts = data.draw(st.sampled_from([n for n in (1, 2, 3) if dim % n == 0]))  # (opset 17)
    outs = [f"o{i}" for i in range(parts)]
    nodes = [helper.make_node("Split", ["x"], outs, axis=axis),
             helper.make_node("Concat", outs[::-1], ["y"], axis=axis)]
    _agree(_model(nodes, shape), x)


@SETTINGS
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_expand_and_tile(shape, seed, data):
    target = [data.draw(st.sampled_from([d, 3])) if d == 1 else d for d in shape]
    target = [data.draw(st.integers(1, 3))] + target          # and one more leading axis
    reps = [data.draw(st.integers(1, 3)) for _ in shape]
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"])]
    x = _data(shape, seed=seed)
    _agree(_model(nodes, shape, inits=[("shape", np.asarray(target, np.int64))]), x)
    nodes = [helper.make_node("Tile", ["x", "reps"], ["y"])]
    _agree(_model(nodes, shape, inits=[("reps", np.asarray(reps, np.int64))]), x)


@SETTINGS
@given(shape=st.lists(st.integers(1, 6), min_size=2, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), bias=st.booleans(), eps=st.sampled_from([1e-5, 1e-6]))
def test_layer_norm(shape, seed, bias, eps):
    c = shape[-1]
    rng = np.random.default_rng(seed)
    inits = [("g", rng.normal(size=c).astype(np.float32))]
    if bias:
        inits.append(("b", rng.normal(size=c).astype(np.float32)))
    node = helper.make_node("LayerNormalization", ["x", "g"] + (["b"] if bias else []), ["y"],
                            axis=-1, epsilon=eps)
    _agree(_model([node], shape, inits=inits), _data(shape, seed=seed), tol=1e-4)


@SETTINGS
@given(batch=st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple),
       m=st.integers(1, 5), k=st.integers(1, 6), n=st.integers(1, 5),
       seed=st.integers(0, 2 ** 16), broadcast=st.booleans())
def test_matmul_of_two_activations(batch, m, k, n, seed, broadcast):
    """Attention's products: both operands computed (here from the one input), batched."""
    shape = batch + (m, k)
    rng = np.random.default_rng(seed)
    w = rng.normal(size=((1,) * len(batch) if broadcast else batch) + (k, n)).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "zero"], ["a"]),
             helper.make_node("Mul", ["w", "one"], ["b"]),      # a computed right operand
             helper.make_node("MatMul", ["a", "b"], ["y"])]
    inits = [("w", w), ("zero", np.float32(0)), ("one", np.float32(1))]
    mod = _agree(_model(nodes, shape, inits=inits), _data(shape, seed=seed), tol=1e-4)
    assert "nn.batch_matmul" in str(mod)


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data(),
       op=st.sampled_from(["Softmax", "LogSoftmax"]), opset=st.sampled_from([11, 17]))
def test_softmax_on_any_axis(shape, seed, data, op, opset):
    """Softmax and LogSoftmax over one axis (opset 13 on), or over the trailing axes from
    ``axis`` on, flattened (before 13)."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    _agree(_model([helper.make_node(op, ["x"], ["y"], axis=axis)], shape, opset=opset),
           _data(shape, seed=seed))


def test_log_softmax_runs_on_its_kernel():
    x = _data((3, 10))
    mod, _, _ = import_onnx(_model([helper.make_node("LogSoftmax", ["x"], ["y"])], x.shape))
    ex = Executor(mod)
    ex.run({mod.main.params[0].name: x})
    assert [s.kind for s in ex.steps if s.label.startswith("nn.log_softmax")] == ["kernel"]


@SETTINGS
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4).map(tuple),
       seed=st.integers(0, 2 ** 16), data=st.data())
def test_gather_with_constant_indices(shape, seed, data):
    """A scalar index (ViT's class token, x[:, 0]) and a vector of indices."""
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    dim = shape[axis]
    scalar = np.int64(data.draw(st.integers(-dim, dim - 1)))
    vector = np.asarray(data.draw(st.lists(st.integers(-dim, dim - 1), min_size=1,
                                           max_size=4)), np.int64)
    x = _data(shape, seed=seed)
    for idx in (scalar, vector):
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
        _agree(_model([node], shape, inits=[("i", idx)]), x)


@SETTINGS
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 6), w=st.integers(1, 6),
       seed=st.integers(0, 2 ** 16), mode=st.sampled_from(["nearest", "linear"]),
       ctm=st.sampled_from(["half_pixel", "pytorch_half_pixel", "align_corners",
                            "asymmetric"]),
       nearest=st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]),
       by=st.sampled_from(["scales", "sizes"]), data=st.data())
def test_resize(n, c, h, w, seed, mode, ctm, nearest, by, data):
    """Resize as PyTorch exports it (nn.Upsample: nearest/asymmetric/floor, bilinear with
    pytorch_half_pixel or align_corners) and every other combination of the two modes."""
    if by == "scales":
        factor = data.draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
        scales = np.asarray([1, 1, factor, factor], np.float32)
        if int(h * factor) != h * factor or int(w * factor) != w * factor or \
                int(h * factor) < 1 or int(w * factor) < 1:
            scales = np.asarray([1, 1, 2, 2], np.float32)
        inits = [("roi", np.zeros(0, np.float32)), ("scales", scales)]
        ins = ["x", "roi", "scales"]
    else:
        size = [data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))]
        inits = [("roi", np.zeros(0, np.float32)), ("scales", np.zeros(0, np.float32)),
                 ("sizes", np.asarray([n, c, *size], np.int64))]
        ins = ["x", "roi", "scales", "sizes"]
    node = helper.make_node("Resize", ins, ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode=nearest)
    mod = _agree(_model([node], (n, c, h, w), inits=inits), _data((n, c, h, w), seed=seed))
    assert "image.resize2d" in str(mod)


@SETTINGS
@given(n=st.integers(1, 2), groups=st.integers(1, 2), cin=st.integers(1, 3),
       cout=st.integers(1, 3), h=st.integers(1, 5), w=st.integers(1, 5),
       k=st.integers(1, 3), stride=st.integers(1, 3), dil=st.integers(1, 2),
       bias=st.booleans(), seed=st.integers(0, 2 ** 16), data=st.data())
def test_conv_transpose(n, groups, cin, cout, h, w, k, stride, dil, bias, seed, data):
    pads = [data.draw(st.integers(0, dil * (k - 1))) for _ in range(4)]
    out_pad = [data.draw(st.integers(0, stride - 1)) for _ in range(2)]  # (ORT: < stride)
    for size, i in ((h, 0), (w, 1)):   # (padding may not eat the whole output)
        assume((size - 1) * stride + dil * (k - 1) + out_pad[i] + 1 - pads[i] - pads[i + 2] >= 1)
    rng = np.random.default_rng(seed)
    weight = rng.normal(size=(cin * groups, cout, k, k)).astype(np.float32)
    inits = [("w", weight)] + ([("b", rng.normal(size=cout * groups).astype(np.float32))]
                               if bias else [])
    node = helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["y"],
                            strides=[stride, stride], dilations=[dil, dil], pads=pads,
                            output_padding=out_pad, group=groups)
    shape = (n, cin * groups, h, w)
    mod = _agree(_model([node], shape, inits=inits), _data(shape, seed=seed), tol=1e-4)
    assert "nn.conv2d_transpose" in str(mod)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16), data=st.data())
def test_where_with_a_constant_condition(shape, seed, data):
    """Where(condition, x, y): the condition a constant (as exporters write masks), y a
    constant broadcast from the right."""
    rng = np.random.default_rng(seed)
    cond_shape = shape[data.draw(st.integers(0, len(shape))):]
    cond = rng.random(cond_shape) < 0.5
    other = rng.normal(size=shape[-1:]).astype(np.float32)
    node = helper.make_node("Where", ["c", "x", "o"], ["y"])
    mod = _agree(_model([node], shape, inits=[("c", cond), ("o", other)]),
                 _data(shape, seed=seed))
    assert "where(" in str(mod)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2 ** 16),
       op=st.sampled_from(["Max", "Min", "Sum", "Mean"]), arity=st.integers(1, 4),
       broadcast=st.booleans())
def test_variadic_max_min_sum_and_mean(shape, seed, op, arity, broadcast):
    """ONNX Max, Min, Sum and Mean take any number of inputs, each broadcast: folded pairwise
    into ``maximum``/``minimum``/``add`` (a mean then divided by the count), which run on the
    binary kernel (NaNs and signed zeros as numpy's)."""
    rng = np.random.default_rng(seed)
    others = [f"c{i}" for i in range(arity - 1)]
    inits = [(n, rng.normal(size=(shape[-1],) if broadcast else shape).astype(np.float32))
             for n in others]
    mod = _agree(_model([helper.make_node(op, ["x", *others], ["y"])], shape, inits=inits),
                 _data(shape, seed=seed))
    ir = {"Max": "maximum", "Min": "minimum", "Sum": "add", "Mean": "add"}[op]
    assert str(mod).count(f"{ir}(") == arity - 1
    assert ("divide(" in str(mod)) == (op == "Mean")
