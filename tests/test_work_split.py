"""How a convolution's work is shared out (runtime/kernels/gather.py): every pixel of every image in
exactly one chunk, chunks of about one size on whole micro-kernel row groups, and as many
work items as give each thread an equal run, then each run's items taken once, by its
thread or, its own run done, by another (``next_item``)."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.runtime.kernels.gather import (ROWS, SHARE, block_shares, chunk_bounds, item_runs,
                                   next_item, release, work_item, work_split)
from eqquant.runtime.codegen.launch import parallel


@settings(max_examples=300, deadline=None)
@given(images=st.integers(1, 4), p_n=st.integers(1, 13000), oblocks=st.integers(1, 40),
       threads=st.integers(1, 8))
def test_chunks_cover_every_pixel_once_in_equal_shares(images, p_n, oblocks, threads):
    chunks, groups, per_group = work_split(images, p_n, oblocks, threads)
    assert groups * per_group >= oblocks and (groups - 1) * per_group < oblocks  # none empty
    bounds = [chunk_bounds(p_n, chunks, c) for c in range(chunks)]
    assert bounds[0][0] == 0 and bounds[-1][1] == p_n
    for (a0, a1), (b0, _) in zip(bounds, bounds[1:]):
        assert a1 == b0                       # contiguous, no pixel twice or never
    sizes = [p1 - p0 for p0, p1 in bounds]
    assert min(sizes) > 0
    assert all(p0 % ROWS == 0 for p0, _ in bounds)
    assert max(sizes) - min(sizes) <= 2 * ROWS, sizes
    items = images * chunks * groups
    if images * p_n >= threads * SHARE:
        assert groups == 1                    # enough pixels: cut by pixels alone
    # a multiple of the threads, unless the pixels cannot be cut finer
    assert items % threads == 0 or (chunks + 1) * ROWS > p_n
    # each (image, chunk, group) is one item, and a thread's run of consecutive items reads
    # the weights of as few groups as a run of that length can (group-major)
    decoded = [work_item(i, chunks, groups) for i in range(items)]
    assert sorted(decoded) == [(b, c, g) for b in range(images) for c in range(chunks)
                               for g in range(groups)]
    per_image = chunks * groups
    for start in range(0, items, max(1, items // threads)):
        end = min(items, start + max(1, items // threads))   # a thread's run in one image
        end = min(end, (start // per_image + 1) * per_image)
        read = {g for _, _, g in decoded[start:end]}
        first, last = start % per_image, (end - 1) % per_image
        assert len(read) == last // chunks - first // chunks + 1


def test_a_14x14_image_is_no_longer_three_quarters_one_threads():
    """The case that was measured: 196 pixels, 8 blocks, 2 threads. Under a static schedule
    (each thread an equal run of consecutive items), the threads' pixel-block work differs
    by less than a tenth."""
    chunks, groups, per_group = work_split(1, 196, 8, 2)
    work = []
    for item in range(chunks * groups):
        _, chunk, g = work_item(item, chunks, groups)
        p0, p1 = chunk_bounds(196, chunks, chunk)
        work.append((p1 - p0) * (min(8, (g + 1) * per_group) - g * per_group))
    half = len(work) // 2
    assert len(work) % 2 == 0
    assert abs(sum(work[:half]) - sum(work[half:])) < 0.1 * sum(work) / 2, work


def test_a_14x14_image_on_two_threads_is_cut_by_pixels_alone():
    """Each thread a run of whole chunks, every block of them: its chunks' operands are
    prepared once (not once per group of blocks), and each thread has its own half of the
    image's rows, its two chunks' pixels differing by less than a tenth."""
    chunks, groups, per_group = work_split(1, 196, 24, 2)
    assert (groups, per_group) == (1, 24) and chunks % 2 == 0
    halves = [chunk_bounds(196, chunks, 0)[0], chunk_bounds(196, chunks, chunks // 2)[0], 196]
    assert abs((halves[1] - halves[0]) - (halves[2] - halves[1])) < 0.1 * 98
    # two 7 x 7 images on four threads are too few pixels for that: their blocks are grouped
    assert work_split(2, 49, 24, 4)[1] > 1


def test_a_float_convolution_gives_the_same_bits_on_any_number_of_threads():
    """The split changes with the threads; each output's sum, in the GEMM's order, does not
    (integer sums are exact in any order, and the int8 paths are checked against the
    reference elsewhere)."""
    from eqquant.ir.builder import Builder
    from eqquant.ir.params import bind_params
    from eqquant.runtime.execution.executor import Executor
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (2, 40, 14, 14))
    y = b.call("fused.conv2d", x, b.param("w", rng.normal(size=(72, 40, 3, 3)).astype("f4")),
               b.param("b", rng.normal(size=(72, 1, 1)).astype("f4")), padding=[1, 1])
    ex = Executor(bind_params(*b.finish(y)))
    xs = {"x": rng.normal(size=(2, 40, 14, 14)).astype(np.float32)}
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            runs.append(ex.run(xs).tobytes())
    finally:
        numba.set_num_threads(before)
    assert len(set(runs)) == 1


def test_a_cached_kernel_is_stamped_with_the_whole_runtime_source():
    """Numba checks a cached kernel against its own file only; the runtime's kernels are
    built from several files (an LLVM GEMM, the gather), so each carries a digest of the
    folder's source too, and a change to any of them compiles it again."""
    from numba.core import caching

    from eqquant.runtime.kernels import int8 as kernels_int8

    from eqquant.runtime import source_digest
    impl = caching.CompileResultCacheImpl(kernels_int8.depthwise_channels_last.py_func)
    stamp = impl.locator.get_source_stamp()
    assert isinstance(stamp, tuple) and stamp[1] == source_digest()
    # (and a launched kernel's C entry, defined in launch.py: ``launch.Parallel.entry``)
    kernels_int8.dequantize.serial(np.zeros(4, np.uint8), np.zeros(1, np.int32), np.ones(1, np.float32), 4,
                                   np.zeros(4, np.float32))
    entry = next(iter(kernels_int8.dequantize._entries.values()))
    assert caching.CompileResultCacheImpl(entry._pyfunc).locator.get_source_stamp()[1] == \
        source_digest()
    # (and a C function's: the depthwise sweep, which those kernels call by its address)
    from eqquant.runtime.kernels import depthwise as depthwise_simd
    depthwise_simd.entry("u8")
    cfunc = caching.CompileResultCacheImpl(depthwise_simd._entries["u8"]._pyfunc)
    assert cfunc.locator.get_source_stamp()[1] == source_digest()
    # (and the GEMMs' C functions, which every SIMD kernel calls: ``llvm_loops.load_gemms``)
    from eqquant.runtime.kernels import fma  # noqa: F401  (fills its tables if it can)
    from eqquant.runtime.codegen import llvm_loops
    from eqquant.runtime.kernels import gather
    for table in [*llvm_loops._TABLES.values(), *gather._ENTRIES.values()]:
        impl = caching.CompileResultCacheImpl(table._pyfunc)
        assert impl.locator.get_source_stamp()[1] == source_digest()
    outside = caching.CompileResultCacheImpl(_defined_elsewhere)
    assert not (isinstance(outside.locator.get_source_stamp(), tuple) and
                outside.locator.get_source_stamp()[-1] == source_digest())


def _defined_elsewhere(x):
    return x


@settings(max_examples=200, deadline=None)
@given(items=st.integers(0, 40), threads=st.integers(1, 8), order=st.lists(
    st.integers(0, 7), min_size=0, max_size=60))
def test_every_item_is_taken_once_its_threads_own_run_first(items, threads, order):
    """Threads asking for items in any interleaving (``order``; then each in turn until
    none is left): every item is handed out once; a thread gets its own run's items first,
    in order, and only then another's."""
    counters = item_runs(items, threads)
    taken, by = [], {t: [] for t in range(threads)}
    asks = [t % threads for t in order] + [t for t in range(threads) for _ in range(items + 1)]
    for t in asks:
        item = next_item(counters, t)
        if item >= 0:
            taken.append(item)
            by[t].append(item)
    assert sorted(taken) == list(range(items))
    assert all(next_item(counters, t) == -1 for t in range(threads))
    for t, got in by.items():
        own = [i for i in got if t * items // threads <= i < (t + 1) * items // threads]
        assert got[:len(own)] == own == sorted(own)
    # the last thread to finish puts the runs back at their start (``release``)
    for t in range(threads):
        release(counters)
    np.testing.assert_array_equal(counters, item_runs(items, threads))
    # one thread alone takes every run, its own first
    counters = item_runs(items, threads)
    alone = [next_item(counters, threads - 1) for _ in range(items + 1)]
    assert sorted(alone[:-1]) == list(range(items)) and alone[-1] == -1
    assert alone[:items - (threads - 1) * items // threads] == \
        list(range((threads - 1) * items // threads, items))


@numba.njit(parallel=True, cache=True)
def _race(items, threads, delay, owner):
    """Every thread takes items (``next_item``) and marks each with its index; thread 1
    first spins ``delay`` steps (a thread held up by the host)."""
    counters = item_runs(items, threads)
    spun = np.zeros(threads, np.float64)
    for thread in numba.prange(threads):
        if thread == 1:
            for i in range(delay):
                spun[thread] += np.sqrt(i + 1.0)
        while True:
            item = next_item(counters, thread)
            if item < 0:
                break
            owner[item] += thread + 1        # 0 where never taken, doubled where twice
    return spun


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="one thread: nothing to race")
def test_a_delayed_threads_run_is_taken_over_once():
    """Two threads on Numba's pool, the second held up: the first takes over the second's
    run, and every item is still taken exactly once."""
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        owner = np.zeros(64, np.int64)
        _race(64, 2, 50_000_000, owner)
    finally:
        numba.set_num_threads(before)
    assert set(owner) <= {1, 2}                   # each item once, by thread 0 or 1
    assert (owner[32:] == 1).any(), owner         # thread 0 took some of thread 1's run


def test_the_drivers_a_cpu_lacks_still_compile():
    """The VNNI family's driver cannot run its GEMMs on a CPU without VNNI or AMX, so its
    work loops (shared with the AVX2 and FMA drivers, which the tests run) are compiled here
    without running, for the AVX2 driver's argument types with the family's packed weights
    and a kernel (``vnni.gemm_kernel``). One compiled driver serves every kernel of the
    family: the GEMM is an argument, not a twin's."""
    from eqquant.runtime.kernels import amx
    from eqquant.runtime.kernels import avx2
    from eqquant.runtime.kernels import vnni
    from eqquant.runtime.codegen.launch import argument_type
    vnni16, avxvnni = vnni.PATHS["vnni16"], vnni.PATHS["avxvnni"]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 128, (1, 14, 14, 16)).astype(np.uint8)
    w = rng.integers(-127, 128, (32, 3 * 3 * 16)).astype(np.int8)
    packed = avx2.pack(w)[0]
    params = avx2.requantize_params(np.zeros(32, np.int64), np.zeros(32, np.int64),
                                    np.zeros(32, np.int64), np.full(32, 255, np.int64),
                                    np.full(32, 1 << 30, np.int64), np.zeros(32, np.int64),
                                    0, 0, 0, 255, packed.shape[1] * 2)
    out = np.empty((1, 196, 32), np.uint8)
    layouts = set()
    driver = vnni.conv_requantize
    for simd in (vnni, vnni16, avxvnni, amx):
        assert simd.conv_requantize is driver
        args = (x, 3, 3, 1, 1, 1, 1, 1, 1, 0, 14, 14, simd.pack(w)[0], simd.KERNEL, params, 0,
                255, out, 2, np.empty((0, 0, 0), np.uint8), np.zeros(7, np.int32))
        (items, values, count), = driver.plan(*args)      # (made in Python, nothing run)
        assert items is vnni._conv_items and count == 2
        layout = tuple(argument_type(v) for v in values)
        assert items.entry(layout).address            # compiled (or loaded), not run
        layouts.add(layout)
    assert len(layouts) == 1


def test_a_kernel_whose_gemms_were_never_compiled_is_refused():
    """A path's ``conv_kernel`` hands its driver the GEMMs' addresses; where the CPU lacks
    them they were never compiled (0), and a layer asking for them is refused with an
    error, not run into a jump to address 0."""
    from eqquant.runtime.kernels import vnni
    w = np.ones((16, 16), np.int8)
    kernel = (0, 0) + vnni.KERNEL[2:]
    with pytest.raises(RuntimeError, match="does not run the GEMMs"):
        vnni.conv_kernel_of(kernel)(w, 16)
    if vnni.available():
        assert vnni.conv_kernel(w, 16) == (vnni.conv_requantize, (vnni.KERNEL,))


def test_the_bindings_read_the_pools_size_as_it_is_now():
    """The convolutions split their work for the pool's size at each call (``threads``, a
    cheaper read of what ``numba.get_num_threads`` gives), after ``numba.set_num_threads``
    too."""
    from eqquant.runtime.lowering.fp32 import threads
    before = numba.get_num_threads()
    try:
        for n in sorted({1, before}):
            numba.set_num_threads(n)
            assert threads() == numba.get_num_threads() == n
    finally:
        numba.set_num_threads(before)


@settings(max_examples=300, deadline=None)
@given(p_n=st.integers(1, 191), oblocks=st.integers(1, 12), threads=st.integers(1, 8))
def test_a_small_images_blocks_are_shared_so_that_each_thread_has_an_equal_run(
        p_n, oblocks, threads):
    """A lone image of fewer than SMALL pixels: its channel blocks, each cut into
    ``block_shares`` pixel shares where the blocks alone do not divide among the threads.
    Under a static schedule each thread's run of (block, share) items then holds the same
    work, give or take a micro-kernel row group, unless the image is too small to share."""
    shares = block_shares(p_n, oblocks, threads)
    assert shares >= 1 and (shares == 1 or shares * ROWS <= p_n)
    bounds = [chunk_bounds(p_n, shares, s) for s in range(shares)]
    assert bounds[0][0] == 0 and bounds[-1][1] == p_n and all(
        a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    items = [q1 - q0 for _ in range(oblocks) for q0, q1 in bounds]
    if len(items) % threads == 0:
        run = len(items) // threads
        work = [sum(items[t * run:(t + 1) * run]) for t in range(threads)]
        assert max(work) - min(work) <= 2 * ROWS, work
    else:          # only where the pixels cannot be cut finer
        assert (shares + 1) * ROWS > p_n


def test_three_blocks_of_a_7x7_image_on_two_threads_are_cut_in_halves():
    """The measured case: MobileNet-v2's 7 x 7 projections to 160 channels (three 64-channel
    blocks, the last padded) had one thread run two blocks and the other one."""
    assert block_shares(49, 3, 2) == 2 and block_shares(49, 4, 2) == 1
    assert block_shares(49, 15, 2) == 2 and block_shares(10, 3, 2) == 1


@pytest.mark.parametrize("path", ["amx", "vnni", "vnni16", "avxvnni", "avx2"])
def test_a_small_images_shared_blocks_give_the_reference_bits(monkeypatch, path):
    """A 7 x 7 fused int8 convolution to 160 channels (blocks that do not divide among two
    threads, the last not whole) on one thread and on two: the reference's bits."""
    from eqquant.ir.interp import run
    from eqquant.ir.params import bind_params
    from eqquant.ir.parser import parse
    from eqquant.runtime.target import int8_paths
    from eqquant.runtime.execution.executor import Executor
    if path not in int8_paths():
        pytest.skip(f"this CPU has no {path}: that path cannot run here")
    monkeypatch.setenv("EQQUANT_INT8_KERNEL", path)
    k, o = 96, 160
    mod = parse(f"""def @main(%x: Tensor[(1, 7, 7, {k}), uint8], %w: Tensor[(3, 3, {k}, {o}), int8],
        %b: Tensor[({o}), int32], %m: Tensor[({o}), float32], %s: Tensor[({o}), float32]) {{
      fused.qconv2d(%x, %w, %b, 3, 0, 0.02f, %m, %s, 0, 0.05f, 7, padding=[1, 1, 1, 1],
                    data_layout="NHWC", kernel_layout="HWIO", axis=3, out_dtype="uint8")
    }}""")
    rng = np.random.default_rng(2)
    bound = bind_params(mod, {
        "w": rng.integers(-128, 128, (3, 3, k, o)).astype(np.int8),
        "b": rng.integers(-5000, 5000, o).astype(np.int32),
        "m": rng.uniform(0.02, 0.05, o).astype(np.float32),
        "s": np.full(o, 0.0005, np.float32)})
    ex = Executor(bound)
    assert ex.steps[0].fn.conv.gemm_path == path
    x = {"x": rng.integers(0, 256, (1, 7, 7, k)).astype(np.uint8)}
    want = run(bound, x)
    assert len(np.unique(want)) > 20
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, 2, before}):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            np.testing.assert_array_equal(ex.run(x), want)
    finally:
        numba.set_num_threads(before)


@settings(max_examples=200, deadline=None)
@given(h=st.integers(1, 12), w=st.integers(1, 12), c=st.sampled_from([1, 2, 3, 4, 8, 21, 64]),
       kh=st.integers(1, 7), kw=st.integers(1, 7), sh=st.integers(1, 3), sw=st.integers(1, 3),
       dh=st.integers(1, 2), dw=st.integers(1, 2), pt=st.integers(0, 3), pl=st.integers(0, 3),
       extra=st.integers(0, 4), floats=st.booleans(), data=st.data())
def test_the_gathered_windows_are_the_images_windows(h, w, c, kh, kw, sh, sw, dh, dw, pt, pl,
                                                     extra, floats, data):
    """``_windows`` (each kernel row inside the image one run, copied by two overlapping
    moves of 8 to 64 bytes or one memcpy; the border tap by tap) writes, for any run of
    pixels, exactly each pixel's window in (tap, channel) order, the padding value outside
    the image and zeros in K's padding: against numpy's sliding windows of the padded
    image, and with every byte around the rows untouched."""
    from numpy.lib.stride_tricks import sliding_window_view
    from eqquant.runtime.kernels.gather import _windows
    oh = (h + 2 * pt - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pl - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        return
    dtype = np.float32 if floats else np.uint8
    rng = np.random.default_rng(data.draw(st.integers(0, 999)))
    hwc = (rng.normal(size=(h, w, c)) if floats else rng.integers(0, 256, (h, w, c))
           ).astype(dtype)
    pad = dtype(0.0 if floats else 117)
    p0 = data.draw(st.integers(0, oh * ow - 1))
    n = data.draw(st.integers(1, oh * ow - p0))
    k = kh * kw * c
    buffer = np.full((n + 2, k + extra), 77, dtype)      # a row of guards either side
    _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, buffer[1:-1])
    padded = np.pad(hwc, ((pt, pt), (pl, pl), (0, 0)), constant_values=pad)
    win = sliding_window_view(padded, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(0, 1))
    win = win[::sh, ::sw, :, ::dh, ::dw][:oh, :ow]          # (oh, ow, c, kh, kw)
    want = win.transpose(0, 1, 3, 4, 2).reshape(oh * ow, k)[p0:p0 + n]
    np.testing.assert_array_equal(buffer[1:-1, :k], want)
    assert (buffer[1:-1, k:] == 0).all()
    assert (buffer[0] == 77).all() and (buffer[-1] == 77).all()


@parallel
def _take_all(thread, threads, args):
    """Every item once (``next_item``), then ``release``: a driver's items as the launcher
    runs them."""
    counters, owner = args
    while True:
        item = next_item(counters, thread)
        if item < 0:
            break
        owner[item] += 1
    release(counters)


@pytest.mark.parametrize("items, threads", [(0, 2), (1, 2), (37, 2), (37, 3), (64, 1)])
def test_a_bound_launch_finds_its_counters_reset_at_every_call(items, threads):
    """A bound convolution reuses its item counters: the last thread to finish puts every
    run back at its start (``release``), so each call hands out every item once again."""
    from eqquant.runtime.lowering.fp32 import entry_point
    counters, owner = item_runs(items, threads), np.zeros(items, np.int64)
    call = _take_all.bind((counters, owner), entry_point, threads)
    for n in range(1, 4):
        call()
        assert (owner == n).all()
        np.testing.assert_array_equal(counters, item_runs(items, threads))
