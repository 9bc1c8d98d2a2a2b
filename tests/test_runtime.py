"""The Numba kernels against the reference interpreter, and the executor on whole models."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.optimizer import optimize
from eqquant.runtime.executor import Executor
from eqquant.zoo import build

RTOL, ATOL = 1e-4, 1e-5


def _check(mod, params, inputs, kernel_ops):
    bound = bind_params(mod, params)
    ex = Executor(bound)
    labels = [s.label for s in ex.steps]
    for op in kernel_ops:  # the op ran on its kernel, not on the reference fallback
        assert op in labels, labels
    np.testing.assert_allclose(ex.run(inputs), run(bound, inputs), rtol=RTOL, atol=ATOL)


conv_cases = st.fixed_dictionaries({
    "kind": st.sampled_from(["dense", "grouped", "depthwise", "pointwise"]),
    "c": st.integers(1, 6), "o": st.integers(1, 6), "hw": st.integers(5, 12),
    "k": st.integers(1, 5), "stride": st.integers(1, 3), "pad": st.integers(0, 2),
    "dil": st.integers(1, 2), "act": st.sampled_from(["none", "relu", "clip"]),
    "fused": st.booleans(), "seed": st.integers(0, 999)})


@settings(max_examples=40, deadline=None)
@given(conv_cases)
def test_conv2d_kernel(case):
    rng = np.random.default_rng(case["seed"])
    c, o, k = case["c"], case["o"], case["k"]
    groups = 1
    if case["kind"] == "grouped":
        c, o, groups = 2 * c, 2 * o, 2
    elif case["kind"] == "depthwise":
        o, groups = c, c
    elif case["kind"] == "pointwise":
        k, case["stride"], case["pad"] = 1, 1, 0
    hw = max(case["hw"], case["dil"] * (k - 1) + 1)
    b = Builder()
    x = b.input("x", (2, c, hw, hw))
    w = b.param("w", rng.normal(size=(o, c // groups, k, k)).astype("float32"))
    attrs = dict(strides=[case["stride"]] * 2, padding=[case["pad"]] * 2,
                 dilation=[case["dil"]] * 2, groups=groups)
    if case["fused"]:
        bias = b.param("b", rng.normal(size=(o, 1, 1)).astype("float32"))
        y = b.call("fused.conv2d", x, w, bias, activation=case["act"], a_min=-0.5, a_max=0.7,
                   **attrs)
    else:
        y = b.call("nn.conv2d", x, w, **attrs)
    mod, params = b.finish(y)
    xs = {"x": rng.normal(size=(2, c, hw, hw)).astype("float32")}
    _check(mod, params, xs, ["fused.conv2d" if case["fused"] else "nn.conv2d"])
    # and on the other fp32 path (im2col + BLAS, or the FMA GEMM where the CPU has it)
    import os
    from eqquant.runtime.bindings import fp32_path
    other = "blas" if fp32_path() == "fma" else "fma"
    os.environ["EQQUANT_FP32_KERNEL"] = other
    try:
        _check(mod, params, xs, ["fused.conv2d" if case["fused"] else "nn.conv2d"])
    finally:
        del os.environ["EQQUANT_FP32_KERNEL"]


def test_the_fma_conv_path_is_chosen_where_the_cpu_has_it(monkeypatch):
    from eqquant.runtime import fma
    from eqquant.runtime.bindings import fp32_path
    b = Builder()
    x = b.input("x", (1, 3, 8, 8))
    y = b.call("fused.conv2d", x, b.param("w", np.ones((20, 3, 3, 3), np.float32)),
               b.param("b", np.ones((20, 1, 1), np.float32)), padding=[1, 1])
    bound = bind_params(*b.finish(y))
    assert (Executor(bound).steps[0].fn.fma is not None) == fma.available()
    assert fp32_path() == ("fma" if fma.available() else "blas")
    monkeypatch.setenv("EQQUANT_FP32_KERNEL", "blas")
    assert Executor(bound).steps[0].fn.fma is None


pool_cases = st.fixed_dictionaries({
    "op": st.sampled_from(["nn.max_pool2d", "nn.avg_pool2d"]), "k": st.integers(1, 3),
    "stride": st.integers(1, 3), "pad": st.integers(0, 1), "dil": st.integers(1, 2),
    "include": st.booleans(), "hw": st.integers(5, 9), "seed": st.integers(0, 999)})


@settings(max_examples=30, deadline=None)
@given(pool_cases)
def test_pool_kernels(case):
    rng = np.random.default_rng(case["seed"])
    k = case["k"]
    b = Builder()
    attrs = dict(pool_size=[k, k], strides=[case["stride"]] * 2,
                 padding=[min(case["pad"], k - 1)] * 4, dilation=[case["dil"]] * 2)
    if case["op"] == "nn.avg_pool2d":
        attrs["count_include_pad"] = case["include"]
    hw = max(case["hw"], case["dil"] * (k - 1) + 1)
    y = b.call(case["op"], b.input("x", (1, 3, hw, hw)), **attrs)
    mod, params = b.finish(y)
    _check(mod, params, {"x": rng.normal(size=(1, 3, hw, hw)).astype("float32")}, [case["op"]])


def test_elementwise_dense_softmax_and_global_pool_kernels():
    rng = np.random.default_rng(0)
    b = Builder()
    x = b.input("x", (2, 4, 5, 5))
    y = b.input("y", (2, 4, 5, 5))
    s = b.call("add", x, y)
    s = b.call("multiply", s, b.param("k", rng.normal(size=(4, 1, 1)).astype("float32")))
    s = b.call("subtract", s, y)
    s = b.call("divide", s, b.param("d", rng.uniform(1, 2, (1, 4, 1, 1)).astype("float32")))
    s = b.call("nn.relu", s)
    s = b.call("clip", s, a_min=0.1, a_max=0.9)
    g = b.call("nn.batch_flatten", b.call("nn.global_avg_pool2d", s))
    d = b.call("fused.dense", g, b.param("w", rng.normal(size=(3, 4)).astype("float32")),
               b.param("bias", rng.normal(size=(3,)).astype("float32")), activation="relu")
    d = b.call("nn.dense", d, b.param("w2", rng.normal(size=(5, 3)).astype("float32")))
    out = b.call("nn.softmax", d)
    mod, params = b.finish(out)
    inputs = {"x": rng.normal(size=(2, 4, 5, 5)).astype("float32"),
              "y": rng.normal(size=(2, 4, 5, 5)).astype("float32")}
    _check(mod, params, inputs, ["add", "multiply", "subtract", "divide", "nn.relu", "clip",
                                 "nn.global_avg_pool2d", "fused.dense", "nn.dense",
                                 "nn.softmax", "nn.batch_flatten"])


def test_concatenate_and_pad_kernels():
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", (1, 3, 4, 5))
    y = b.input("y", (1, 2, 4, 5))
    c = b.call("concatenate", b.tuple(x, y), axis=1)
    p = b.call("nn.pad", c, b.scalar(-1.5), pad_width=[[0, 0], [0, 0], [1, 2], [0, 3]])
    mod, params = b.finish(p)
    inputs = {"x": rng.normal(size=(1, 3, 4, 5)).astype("float32"),
              "y": rng.normal(size=(1, 2, 4, 5)).astype("float32")}
    _check(mod, params, inputs, ["concatenate", "nn.pad"])


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_models_run_on_the_executor(name):
    m = build(name)  # 224 x 224, as the zoo makes them
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    ex = Executor(r.module)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    ref = run(m.module, m.inputs, m.params)
    out = ex.run(m.inputs)
    assert np.max(np.abs(out - ref)) <= 1e-4 * np.max(np.abs(ref))
    again = ex.run(m.inputs)  # buffers are reused across runs; results are copies
    np.testing.assert_array_equal(out, again)


def test_memory_plan_reuses_buffers():
    m = build("resnet18", image_size=64)
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    ex = Executor(r.module)
    distinct = {id(b) for b in ex.buffers.values()}
    assert len(distinct) < len(ex.buffers) / 2


def test_kernels_are_cached_on_disk():
    """cache=True: compiled kernels are written beside the module, for the next process."""
    import pathlib
    import eqquant.runtime.kernels_fp32 as kernels
    m = build("resnet18_stem", image_size=32)
    r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                 "simplify; bn_fold; simplify; fusion")
    Executor(r.module).run(m.inputs)
    cache = pathlib.Path(kernels.__file__).parent / "__pycache__"
    index = {p.name.split(".")[1].rsplit("-", 1)[0] for p in cache.glob("kernels_fp32.*.nbi")}
    assert {"im2col", "bias_act", "max_pool"} <= index
