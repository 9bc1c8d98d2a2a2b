"""The kernels of look-ups and masks (``runtime/kernels/indexing.py``): take_at's rows of a
table, the comparisons and where, as launches with the reference's bits; take_at's indices
checked as they enter (a kernel cannot raise), by the executor and by a saved library."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.errors import EvalError
from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.runtime.execution.executor import Executor


def _program(build):
    b = Builder()
    out = build(b)
    mod, params = b.finish(out)
    return bind_params(mod, params)


def _kinds(ex) -> dict[str, str]:
    return {st.node.op_name: st.kind for st in ex.steps if st.node is not None}


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3),
       axis=st.integers(0, 2), ids=st.lists(st.integers(1, 3), min_size=1, max_size=2),
       dtype=st.sampled_from(["float32", "int8", "int64"]),
       index_dtype=st.sampled_from(["int32", "int64"]), seed=st.integers(0, 99))
def test_take_at_is_a_launch_with_the_references_bits(shape, axis, ids, dtype, index_dtype,
                                                      seed):
    """Any table, axis and shape of indices (negative ones count from the end): a kernel
    step whose launch the executor binds, the reference's bits."""
    axis %= len(shape)
    rng = np.random.default_rng(seed)
    table = (rng.standard_normal(shape) * 50).astype(dtype)
    mod = _program(lambda b: b.call("take_at", b.param("t", table),
                                    b.input("i", tuple(ids), index_dtype), axis=axis))
    ex = Executor(mod)
    assert _kinds(ex)["take_at"] == "kernel"
    assert ex.bounds["i"][:2] == (-shape[axis], shape[axis] - 1)
    idx = rng.integers(-shape[axis], shape[axis], ids).astype(index_dtype)
    np.testing.assert_array_equal(ex.run({"i": idx}), run(mod, {"i": idx}))


def test_indices_outside_the_table_are_an_error_whether_given_or_computed():
    """Indices that are an input are checked as they enter; computed ones by the step
    itself, in Python before its kernel (that step is no launch). Either way an index
    outside the table is an EvalError naming the bounds, never a read past the table."""
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    given_ = _program(lambda b: b.call("take_at", b.param("t", table),
                                       b.input("i", (2,), "int64")))
    ex = Executor(given_)
    np.testing.assert_array_equal(ex.run({"i": np.array([-4, 3])}), table[[0, 3]])
    for bad in ([4, 0], [0, -5]):
        with pytest.raises(EvalError, match=r"%i: -?\d+ is outside \[-4, 3\]"):
            ex.run({"i": np.array(bad)})

    def shifted(b):
        i = b.input("i", (2,), "int64")
        return b.call("take_at", b.param("t", table),
                      b.call("add", i, b.param("one", np.array(1, np.int64))))
    computed = _program(shifted)
    ex = Executor(computed)
    step = next(st for st in ex.steps if st.node is not None and st.node.op_name == "take_at")
    assert step.kind == "kernel" and not ex.bounds
    assert step.fn.kernel_call([table, np.zeros(2, np.int64)], np.empty((2, 3), np.float32)) \
        is None                         # (not bound as a launch: its check runs first)
    np.testing.assert_array_equal(ex.run({"i": np.array([0, 2])}), table[[1, 3]])
    with pytest.raises(EvalError, match=r"outside \[-4, 3\]"):
        ex.run({"i": np.array([0, 3])})


COMPARISONS = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_comparisons_and_where_are_launches_with_the_references_bits(op, dtype):
    """Each comparison (NaN unequal to everything) on broadcast operands, then a where on
    its bool result (an attention mask's -inf where a token is padding): kernels, the
    reference's bits."""
    rng = np.random.default_rng(5)
    a = rng.integers(-2, 3, (2, 1, 5)).astype(dtype)
    b = rng.integers(-2, 3, (3, 1)).astype(dtype)
    if dtype == "float32":
        a[0, 0, 1] = np.nan
        b[1, 0] = np.nan

    def build(bld):
        x, y = bld.input("a", a.shape, dtype), bld.input("b", b.shape, dtype)
        cond = bld.call(op, x, y)
        return bld.call("where", cond, bld.param("ninf", np.array(-np.inf, np.float32)),
                        bld.param("zero", np.zeros((1, 5), np.float32)))
    mod = _program(build)
    ex = Executor(mod)
    assert _kinds(ex)[op] == "kernel" and _kinds(ex)["where"] == "kernel"
    for _ in range(2):
        np.testing.assert_array_equal(ex.run({"a": a, "b": b}), run(mod, {"a": a, "b": b}))
        a = rng.integers(-2, 3, a.shape).astype(dtype)


def test_a_library_checks_its_index_inputs_as_the_executor_does(tmp_path):
    """A token-ID look-up and a mask saved in a library: the input's bounds are in its plan,
    an index outside them an EvalError there too; the executor's bits inside them."""
    from eqquant.deploy.build import build
    from eqquant.deploy.loader import Library
    table = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)

    def build_program(b):
        ids, mask = b.input("ids", (1, 6), "int64"), b.input("mask", (1, 6), "int64")
        rows = b.call("take_at", b.param("t", table), ids)
        padding = b.call("equal", mask, b.param("zero", np.array(0, np.int64)))
        gate = b.call("where", padding, b.param("off", np.array(0.0, np.float32)),
                      b.param("on", np.array(1.0, np.float32)))
        return b.call("multiply", rows, b.call("expand_dims", gate, axis=2))
    mod = _program(build_program)
    ex = Executor(mod)
    assert all(st.kind in ("kernel", "view") for st in ex.steps)
    build(ex, tmp_path / "lib")
    plan = json.loads((tmp_path / "lib" / "plan.json").read_text())
    entry = next(i for i in plan["inputs"] if i["name"] == "ids")
    assert entry["bounds"][:2] == [-10, 9]
    library = Library(tmp_path / "lib")
    x = {"ids": np.array([[1, 9, -1, 0, 3, 4]]), "mask": np.array([[1, 1, 1, 0, 0, 1]])}
    np.testing.assert_array_equal(library.run(x), ex.run(x))
    np.testing.assert_array_equal(ex.run(x), run(mod, x))
    x["ids"][0, 2] = 10
    for runner in (ex, library):
        with pytest.raises(EvalError, match=r"%ids: 10 is outside \[-10, 9\]"):
            runner.run(x)


def test_a_program_with_index_inputs_opens_on_its_library(tmp_path, monkeypatch):
    """The check a library passes before it is used draws its random input within the index
    inputs' bounds (an input outside them is refused before any kernel runs, so a check on one
    would check nothing): a token-ID program opened as `eqquant run` opens it, saved in a
    cache of its own, runs on its library."""
    from conftest import own_cache
    from eqquant.deploy.cache import open_program
    from eqquant.ir.loader import save_program
    own_cache(monkeypatch, tmp_path / "cache")
    table = np.random.default_rng(1).standard_normal((10, 4)).astype(np.float32)

    def build_program(b):
        ids = b.input("ids", (1, 6), "int64")
        return b.call("nn.relu", b.call("take_at", b.param("t", table), ids))
    ir, _ = save_program(tmp_path / "ids.ir", _program(build_program))
    program = open_program(ir)
    assert program.engine == "library", program.note
    x = {"ids": np.array([[1, 9, -1, 0, 3, 4]])}
    np.testing.assert_array_equal(program.run(x), np.maximum(table[[1, 9, 9, 0, 3, 4]], 0)[None])


@pytest.mark.parametrize("src,dst", [("int64", "float32"), ("bool", "float32"),
                                     ("int64", "int32"), ("uint8", "int8"), ("int32", "int64"),
                                     ("float32", "float32"), ("float32", "int32")])
def test_cast_is_a_launch_where_its_conversion_is_numpys(src, dst):
    """cast as a launch: integers (rounded to nearest as floats, wrapped as narrower
    integers) and truth values, with numpy's bits; a float to an integer stays the reference's
    (numpy's answer for NaN and values out of range is not compiled code's)."""
    rng = np.random.default_rng(3)
    if src == "bool":
        x = rng.integers(0, 2, (2, 3, 5)).astype(bool)
    elif src.startswith("float"):
        x = (rng.standard_normal((2, 3, 5)) * 1e3).astype(src)
    else:
        info = np.iinfo(src)
        x = rng.integers(info.min, info.max, (2, 3, 5), dtype=src, endpoint=True)
        x.flat[:3] = [info.min, info.max, 0]
    mod = _program(lambda b: b.call("cast", b.input("x", x.shape, src), dtype=dst))
    ex = Executor(mod)
    assert _kinds(ex)["cast"] == ("reference" if (src, dst) == ("float32", "int32")
                                  else "kernel")
    got = ex.run({"x": x})
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got, x.astype(dst))
    np.testing.assert_array_equal(got, run(mod, {"x": x}))


@pytest.mark.parametrize("shape,to,dtype", [((1, 1, 1, 6), (1, 2, 6, 6), "float32"),
                                            ((6,), (3, 6), "bool"), ((2, 1, 3), (2, 4, 3),
                                                                     "int64")])
def test_broadcast_to_is_a_launch_with_numpys_bits(shape, to, dtype):
    """broadcast_to (an attention mask spread over its heads and rows) as a launch."""
    x = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    mod = _program(lambda b: b.call("broadcast_to", b.input("x", shape, dtype),
                                    shape=list(to)))
    ex = Executor(mod)
    assert _kinds(ex)["broadcast_to"] == "kernel"
    np.testing.assert_array_equal(ex.run({"x": x}), np.broadcast_to(x, to))
    np.testing.assert_array_equal(ex.run({"x": x}), run(mod, {"x": x}))
