"""conv2d and the pools: shape inference and reference semantics against direct loops, over
random strides, paddings, dilations and groups (depthwise included)."""
import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.typecheck import infer_expr


def loop_conv2d(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    pt, pl, pb, pr = pad
    oh = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), dtype=np.float64)
    og = o // groups
    for b, oc, i, j in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        acc = 0.0
        for ci, u, v in itertools.product(range(cg), range(kh), range(kw)):
            y = i * stride[0] - pt + u * dil[0]
            xx = j * stride[1] - pl + v * dil[1]
            if 0 <= y < h and 0 <= xx < wd:
                acc += float(x[b, g * cg + ci, y, xx]) * float(w[oc, ci, u, v])
        out[b, oc, i, j] = acc
    return out


def loop_pool(x, k, stride, pad, dil, mode, ceil_mode=False, count_include_pad=False):
    n, c, h, wd = x.shape
    pt, pl, pb, pr = pad

    def size(l, kk, s, d, a, bb):
        span = d * (kk - 1) + 1
        t = l + a + bb - span
        if not ceil_mode:
            return t // s + 1
        out = -(-t // s) + 1
        return out - 1 if (out - 1) * s >= l + a else out

    oh, ow = size(h, k[0], stride[0], dil[0], pt, pb), size(wd, k[1], stride[1], dil[1], pl, pr)
    out = np.zeros((n, c, oh, ow))
    for b, ch, i, j in itertools.product(range(n), range(c), range(oh), range(ow)):
        vals, count = [], 0
        for u, v in itertools.product(range(k[0]), range(k[1])):
            y = i * stride[0] - pt + u * dil[0]
            xx = j * stride[1] - pl + v * dil[1]
            if 0 <= y < h and 0 <= xx < wd:
                vals.append(x[b, ch, y, xx])
                count += 1
            elif -pt <= y < h + pb and -pl <= xx < wd + pr:
                count += count_include_pad
        if mode == "max":
            out[b, ch, i, j] = max(vals)
        else:
            out[b, ch, i, j] = sum(vals) / (count if count_include_pad else len(vals))
    return out


conv_cases = st.fixed_dictionaries({
    "groups_kind": st.sampled_from(["one", "two", "depthwise"]),
    "cg": st.integers(1, 3), "og": st.integers(1, 3),
    "h": st.integers(3, 9), "w": st.integers(3, 9),
    "k": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "stride": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "dil": st.tuples(st.integers(1, 2), st.integers(1, 2)),
    "pad": st.tuples(*[st.integers(0, 2)] * 4),
    "seed": st.integers(0, 2**16),
})


@settings(max_examples=60, deadline=None)
@given(conv_cases)
def test_conv2d_matches_loops(case):
    groups = {"one": 1, "two": 2, "depthwise": 3 * case["cg"]}[case["groups_kind"]]
    cg = 1 if case["groups_kind"] == "depthwise" else case["cg"]
    c = cg * groups
    o = case["og"] * groups
    kh, kw = case["k"]
    span_h = case["dil"][0] * (kh - 1) + 1
    span_w = case["dil"][1] * (kw - 1) + 1
    h = max(case["h"], span_h)
    w = max(case["w"], span_w)
    rng = np.random.default_rng(case["seed"])
    x = rng.normal(size=(1, c, h, w)).astype("float32")
    wt = rng.normal(size=(o, cg, kh, kw)).astype("float32")
    b = Builder()
    xi = b.input("x", x.shape)
    wi = b.input("w", wt.shape)
    y = b.call("nn.conv2d", xi, wi, strides=list(case["stride"]), padding=list(case["pad"]),
               dilation=list(case["dil"]), groups=groups)
    mod, _ = b.finish(y)
    expected = loop_conv2d(x, wt, case["stride"], case["pad"], case["dil"], groups)
    assert infer_expr(y).shape == expected.shape
    got = run(mod, {"x": x, "w": wt})
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_conv2d_int8_accumulates_in_int32():
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, size=(1, 4, 6, 6)).astype("int8")
    w = rng.integers(-128, 128, size=(8, 4, 3, 3)).astype("int8")
    b = Builder()
    y = b.call("nn.conv2d", b.input("x", x.shape, "int8"), b.input("w", w.shape, "int8"),
               padding=1, out_dtype="int32")
    mod, _ = b.finish(y)
    got = run(mod, {"x": x, "w": w})
    assert got.dtype == np.int32
    expected = loop_conv2d(x.astype(np.int64), w.astype(np.int64), (1, 1), (1, 1, 1, 1),
                           (1, 1), 1)
    np.testing.assert_array_equal(got, expected.astype(np.int64))


pool_cases = st.fixed_dictionaries({
    "h": st.integers(4, 9), "w": st.integers(4, 9),
    "k": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "stride": st.tuples(st.integers(1, 3), st.integers(1, 3)),
    "dil": st.tuples(st.integers(1, 2), st.integers(1, 2)),
    "pad": st.tuples(*[st.integers(0, 1)] * 4),
    "ceil": st.booleans(), "include": st.booleans(),
    "mode": st.sampled_from(["max", "avg"]), "seed": st.integers(0, 2**16),
})


@settings(max_examples=60, deadline=None)
@given(pool_cases)
def test_pools_match_loops(case):
    kh, kw = case["k"]
    # padding smaller than the window, as every framework requires
    pad = tuple(min(p, (kh if i % 2 == 0 else kw) - 1) for i, p in enumerate(case["pad"]))
    h = max(case["h"], case["dil"][0] * (kh - 1) + 1)
    w = max(case["w"], case["dil"][1] * (kw - 1) + 1)
    rng = np.random.default_rng(case["seed"])
    x = rng.normal(size=(1, 2, h, w)).astype("float32")
    b = Builder()
    attrs = dict(pool_size=[kh, kw], strides=list(case["stride"]), padding=list(pad),
                 dilation=list(case["dil"]), ceil_mode=case["ceil"])
    if case["mode"] == "avg":
        attrs["count_include_pad"] = case["include"]
    y = b.call(f"nn.{case['mode']}_pool2d", b.input("x", x.shape), **attrs)
    mod, _ = b.finish(y)
    expected = loop_pool(x, (kh, kw), case["stride"], pad, case["dil"], case["mode"],
                         case["ceil"], case["mode"] == "avg" and case["include"])
    assert infer_expr(y).shape == expected.shape
    np.testing.assert_allclose(run(mod, {"x": x}), expected, rtol=1e-5, atol=1e-6)


def test_global_avg_pool_and_padding_canonical():
    b = Builder()
    x = b.input("x", (1, 3, 5, 7))
    y = b.call("nn.global_avg_pool2d", x)
    assert infer_expr(y).shape == (1, 3, 1, 1)
    conv = b.call("nn.conv2d", x, b.input("w", (4, 3, 3, 3)), padding=[1, 2])
    assert list(conv.attrs["padding"]) == [1, 2, 1, 2]
    assert infer_expr(conv).shape == (1, 4, 5, 9)
