"""The one parallel launcher (``runtime/codegen/launch.py``): a kernel written as one thread's share
runs on every thread through one compiled parallel loop, its arguments passed exactly
through the block (arrays of any layout, numbers of every width, tuples), and the threads'
shares cover the work once."""
from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings, strategies as st

from eqquant.runtime.codegen import launch
from eqquant.runtime.codegen.launch import parallel, share


@parallel
def _echo(thread, threads, args):
    """Writes its scalar arguments (as float64) into out, from thread 0; every thread marks
    its share of ``seen``."""
    a, b, c, d, e, pair, seen, out = args
    for i in range(*share(seen.size, thread, threads)):
        seen[i] += 1
    if thread == 0:
        out[0] = a
        out[1] = b
        out[2] = c
        out[3] = d
        out[4] = 1.0 if e else 0.0
        out[5] = pair[0]
        out[6] = pair[1][0]
        out[7] = pair[1][1]


@parallel
def _scaled(thread, threads, args):
    """out[i, j] = x[i, j] * k, rows shared out."""
    x, k, out = args
    for i in range(*share(x.shape[0], thread, threads)):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j] * k


def test_scalars_and_tuples_reach_the_part_exactly():
    out, seen = np.zeros(8), np.zeros(1000, np.int64)
    values = (np.float32(0.1), -2.5e300, np.int32(-7), np.uint8(200), True,
              (np.int64(2 ** 62 + 1), (np.float32(3.25), -3)))
    _echo(*values, seen, out)
    want = [np.float64(np.float32(0.1)), -2.5e300, -7, 200, 1.0, float(2 ** 62 + 1), 3.25, -3]
    np.testing.assert_array_equal(out, want)
    assert (seen == 1).all()            # every element once, whatever the threads
    _echo.serial(*values, seen, out)
    assert (seen == 2).all()


@parallel
def _first(thread, threads, args):
    """out[0] = the integer argument (as Numba types it)."""
    v, out = args
    if thread == 0:
        out[0] = v


def test_integers_of_every_width_reach_the_part_exactly():
    for value in (np.uint64(2 ** 64 - 3), np.int64(-2 ** 63), np.uint8(255), np.int8(-128),
                  np.uint32(2 ** 32 - 1), np.int16(-30000)):
        out = np.zeros(1, value.dtype)
        _first(value, out)
        assert out[0] == value, value


def test_arrays_of_any_layout_are_read_through_their_strides():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 50)).astype(np.float32)
    for view in (x, x[::3, 5:40], x.T, x[:, ::-2]):
        out = np.zeros(view.shape, np.float32)
        _scaled(view, np.float32(1.5), out)
        np.testing.assert_array_equal(out, view * np.float32(1.5))
        strided = np.zeros((view.shape[0], 2 * view.shape[1]), np.float32)[:, ::2]
        _scaled(view, np.float32(-2.0), strided)      # a strided output too
        np.testing.assert_array_equal(strided, view * np.float32(-2.0))


def test_one_parallel_loop_serves_every_kernel_and_a_bound_call_follows_the_pool():
    from eqquant.runtime.lowering.fp32 import entry_point
    x = np.arange(64, dtype=np.float32).reshape(16, 4)
    out = np.zeros_like(x)
    _scaled(x, np.float32(2.0), out)
    _echo(np.float32(0), 0.0, np.int32(0), np.uint8(0), False, (np.int64(0), (np.float32(0), 0)),
          np.zeros(3, np.int64), np.zeros(8))
    assert len(launch._launch.signatures) == 1
    call = _scaled.bind((x, np.float32(3.0), out), entry_point)
    before = numba.get_num_threads()
    try:
        for n in range(1, before + 1):
            numba.set_num_threads(n)
            out[:] = 0
            call()
            np.testing.assert_array_equal(out, x * 3)
    finally:
        numba.set_num_threads(before)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64))
def test_the_shares_cover_the_work_once_in_order(n, threads):
    runs = [share.py_func(n, t, threads) for t in range(threads)]
    assert runs[0][0] == 0 and runs[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert all(hi - lo in (n // threads, n // threads + 1) for lo, hi in runs)
