"""Requantization arithmetic and calibration, against direct implementations."""
import math

import numpy as np
import pytest

from eqquant.quant.calibrate import (CalibrationTable, MinMax, Percentile, Range,
                                     find_scale_by_kl, kl_threshold, weight_scale)
from eqquant.ops.fixed_point import fixed_point_multiply, quantize_multiplier


def tvm_fixed_point_multiply(x: int, multiplier: int, shift: int, tonearest=False) -> int:
    """TVM's q_multiply_shift, written directly with Python integers (no overflow), then
    wrapped to int32 as the cast back does."""
    left, right = max(shift, 0), max(-shift, 0)
    v = (x << left) * multiplier
    total = 31 + right
    half = 1 << (total - 1)
    v = v + (half if not tonearest or v >= 0 else half - 1)
    v >>= total  # arithmetic shift: floor division by 2**total
    return ((v + 2**31) % 2**32) - 2**31


def _exact(sample: np.ndarray, multiplier: int, shift: int) -> np.ndarray:
    """TVM's formula in exact integers (numpy object arrays of Python ints), then int32."""
    v = (sample.astype(object) << max(shift, 0)) * multiplier
    total = 31 + max(-shift, 0)
    v = (v + (1 << (total - 1))) >> total
    return np.array([((int(r) + 2**31) % 2**32) - 2**31 for r in v], dtype=np.int64)


def test_fixed_point_multiply_bit_exact_on_a_million_inputs():
    rng = np.random.default_rng(0)
    per_shift = 50_000
    shifts = list(range(-31, 31, 3))
    # edge values: extremes, zero, ones, powers of two (exact halves, i.e. ties)
    edges = np.array([0, 1, -1, 2**31 - 1, -2**31, 2**30, -2**30, 3, -3, 2**15, -2**15],
                     dtype=np.int64)
    checked = 0
    for shift in shifts:
        multiplier = int(rng.integers(2**30, 2**31))
        x = rng.integers(-2**31, 2**31, per_shift, dtype=np.int64)
        x[:edges.size] = edges
        if shift > 0:  # keep x << shift in int64, as TVM's int32 inputs always are
            x >>= shift
        x = x.astype(np.int32)
        got = fixed_point_multiply(x, multiplier, shift).astype(np.int64)
        np.testing.assert_array_equal(got, _exact(x, multiplier, shift))
        # the loop-by-loop version of TVM's q_multiply_shift agrees on a sample too
        want = [tvm_fixed_point_multiply(int(v), multiplier, shift) for v in x[:2000]]
        np.testing.assert_array_equal(got[:2000], want)
        checked += x.size
    assert checked >= 1_000_000


def test_ties_round_upward_and_tonearest_away_from_zero():
    m, s = quantize_multiplier(0.5)
    x = np.array([1, 3, -1, -3, 5, -5], np.int32)
    np.testing.assert_array_equal(fixed_point_multiply(x, m, s), [1, 2, 0, -1, 3, -2])
    np.testing.assert_array_equal(fixed_point_multiply(x, m, s, "TONEAREST"),
                                  [1, 2, -1, -2, 3, -3])


@pytest.mark.parametrize("scale", [1.0, 0.5, 0.0123, 3.7e-5, 123.456, 0.99999999999,
                                   2.0 ** -20])
def test_quantize_multiplier(scale):
    m, s = quantize_multiplier(scale)
    assert 2**30 <= m < 2**31
    assert math.isclose(m * 2.0 ** (s - 31), scale, rel_tol=2**-30)


def plain_kl_threshold(hist, edges, nq=255):
    """TVM's MinimizeKL written out loop by loop (float64), to check the vectorised one."""
    nb = len(hist)
    zero = nb // 2
    best, best_t = float("inf"), None
    for i in range(nq // 2, zero + 1):
        start, stop = zero - i, zero + i + 1
        sliced = [float(h) for h in hist[start:stop]]
        p = list(sliced)
        p[0] = float(sum(hist[: start + 1]))
        p[-1] = float(sum(hist[stop - 1:]))
        merged = len(sliced) // nq
        q = [0.0] * len(sliced)
        for j in range(nq):
            a, b = j * merged, (len(sliced) if j == nq - 1 else (j + 1) * merged)
            tot = sum(sliced[a:b])
            nz = sum(1 for v in sliced[a:b] if v != 0)
            for k in range(a, b):
                q[k] = tot / nz if nz and p[k] != 0 else 0.0

        def smooth(d, eps=1e-4):
            nz = sum(1 for v in d if v == 0)
            nn = len(d) - nz
            if nn == 0 or eps * nz / nn >= 1.0:
                return None
            e1 = eps * nz / nn
            return [v + eps if v == 0 else v - e1 for v in d]
        ps, qs = smooth(p), smooth(q)
        if ps is None or qs is None:
            div = float("inf")
        else:
            sp, sq = sum(ps), sum(qs)
            div = sum((a / sp) * math.log((a / sp) / (b / sq)) for a, b in zip(ps, qs)
                      if a > 0 and b > 0)
        if div < best:
            best, best_t = div, float(edges[stop])
    return best_t


@pytest.mark.parametrize("seed,dist", [(0, "normal"), (1, "laplace"), (2, "relu")])
def test_kl_threshold_matches_the_plain_algorithm(seed, dist):
    rng = np.random.default_rng(seed)
    x = {"normal": rng.normal(size=20000), "laplace": rng.laplace(size=20000),
         "relu": np.maximum(rng.normal(size=20000), 0)}[dist]
    thres = np.abs(x).max()
    hist, edges = np.histogram(x, bins=1001, range=(-thres, thres))
    got = kl_threshold(hist, edges, num_quantized_bins=63)
    assert got == pytest.approx(plain_kl_threshold(hist, edges, 63), rel=1e-12)
    assert 0 < got <= thres


def test_kl_clips_outliers_more_than_minmax():
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.normal(size=100_000), [60.0]])  # one far outlier
    t = find_scale_by_kl(x)
    assert 3.0 < t < 30.0


def test_observers_weight_scales_and_table(tmp_path):
    mm, pc = MinMax(), Percentile(99.0)
    for b in (np.array([-1.0, 2.0]), np.array([0.5, -3.0])):
        mm.update(b)
        pc.update(b)
    assert (mm.range().lo, mm.range().hi) == (-3.0, 2.0)
    assert mm.range().scale() == pytest.approx(3.0 / 127)
    assert 2.0 < pc.range().hi <= 3.0
    w = np.array([[1.0, -2.0], [0.25, 0.5]])
    np.testing.assert_allclose(weight_scale(w), [2.0 / 127])
    np.testing.assert_allclose(weight_scale(w, per_channel=True), [2.0 / 127, 0.5 / 127])
    np.testing.assert_allclose(weight_scale(w, "power2", per_channel=True),
                               [2.0 / 127, 0.5 / 127])
    np.testing.assert_allclose(weight_scale(np.array([[3.0]]), "power2"), [4.0 / 127])
    table = CalibrationTable("minmax", {"%conv1": Range(-1.5, 2.5)})
    table.save(tmp_path / "calib.json")
    again = CalibrationTable.load(tmp_path / "calib.json")
    assert again == table


def test_global_scale_and_array_samples():
    from eqquant.quant.annotate import calibrate
    from eqquant.quant.calibrate import GlobalScale
    from eqquant.zoo import build
    g = GlobalScale()
    g.update(np.array([100.0]))
    assert (g.range().lo, g.range().hi) == (-8.0, 8.0)
    m = build("conv_bn", image_size=8)
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(1, 3, 8, 8)).astype("float32") for _ in range(2)]
    table = calibrate(m.module, m.params, arrays, "minmax")
    assert table.ranges["%data"].hi == pytest.approx(max(float(a.max()) for a in arrays))
