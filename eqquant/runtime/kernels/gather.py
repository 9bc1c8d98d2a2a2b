"""The left operand of the convolution GEMMs (int8 and fp32 alike): each output pixel's
window of a channel-last image gathered into one row (taps in (tap, channel) order), and how
a convolution's work is shared out: chunks of about CHUNK pixels, and on an image of few
chunks also groups of output-channel blocks (``work_split``, ``chunk_bounds``); the images of
a batch are the work items of one parallel region. The SIMD drivers (``vnni.py``,
``avx2.py``, ``fma.py``) call these from their parallel regions."""
from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from ..codegen import memory
from ..codegen.launch import parallel, share
from ..codegen.llvm_loops import call_slot, copy_runs_intrinsic, fetch_add_intrinsic, fill_slot, slot
from ..codegen.serial import twin
from .fp32 import strided_call

_copy_runs = copy_runs_intrinsic()
_fetch_add = fetch_add_intrinsic()
_fetch_add_ordered = fetch_add_intrinsic("acq_rel")


SMALL = 192   # images with fewer pixels are split by channel blocks instead of by pixels
CHUNK = 96    # pixels per work item


@njit(inline="always")
def own_rows(kh, kw, sh, sw, pt, pl, c, kp, ow, w):
    """Whether a convolution's GEMM rows are the image's own (a view, no gather): 1x1, stride
    1, no padding, its c channels filling the rows' kp and its ow columns the image's w.
    The drivers' plans (Python: ``own_rows.py_func``) and their compiled items ask the same
    question, so that they agree on which rows a work item reads."""
    return (kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and
            c == kp and ow == w)


@njit(cache=True)
def _rows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, n, kp):
    """Pixel rows p0..p0+n of the GEMM's left operand (uint8, (n, kp)): the image's own rows
    where ``own_rows`` (a view, no copy), else the windows gathered (``_windows``)."""
    h, w, c = hwc.shape
    if own_rows(kh, kw, sh, sw, pt, pl, c, kp, ow, w):
        return hwc.reshape(h * w, c)[p0:p0 + n]
    rows = np.empty((n, kp), np.uint8)
    copy_windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows)
    return rows


@njit(cache=True)
def widen(rows_u8, rows16):
    """uint8 pixel rows -> the int16 rows a 16-bit GEMM reads (AVX2's): one loop over both
    when they are contiguous (a pointwise convolution's rows of 16 channels, taken row by
    row, ran at a quarter of the speed: a short loop's set-up for every 16 bytes)."""
    n, kp = rows_u8.shape
    if rows_u8.flags.c_contiguous and rows16.flags.c_contiguous:
        flat, flat16 = rows_u8.reshape(n * kp), rows16.reshape(n * kp)
        for i in range(n * kp):
            flat16[i] = flat[i]
        return
    for r in range(n):
        for c in range(kp):
            rows16[r, c] = rows_u8[r, c]


def group_span(groups: int, per_group: int, block: int) -> int:
    """The groups a grouped convolution's GEMM takes together (a set): the most that divide
    ``groups`` and whose ``per_group`` outputs each fill at most one block of ``block``
    channels (1 where a group fills a block or more). A set is one GEMM whose weights are
    block-diagonal (each output reads its own group's inputs, zeros elsewhere): its products
    are ceil(set outputs / block) * block / per_group times the convolution's, the same for
    every set size that fits a block; a larger set makes fewer, longer GEMMs."""
    best = 1
    for g in range(1, groups + 1):
        if groups % g == 0 and g * per_group <= max(block, per_group):
            best = g
    return best


@njit(cache=True)
def next_set_item(counters, thread, sets, chunks, p_n):
    """A grouped driver's next work item for ``thread`` (``next_item``): (image, set, its
    chunk's pixels p0, p1) of ``chunks`` chunks of ``p_n`` pixels; image -1 when none is
    left."""
    item = next_item(counters, thread)
    if item < 0:
        return -1, 0, 0, 0
    p0, p1 = chunk_bounds(p_n, chunks, item % chunks)
    return item // (sets * chunks), (item // chunks) % sets, p0, p1


def set_major(nhwc, sets, p_n, threads) -> tuple:
    """A grouped driver's first launch and its work items' counters (the int8 one of ``vnni.py``,
    the float one of ``fma.py``): (the batch nhwc (N, H, W, C) moved set-major into a new (N,
    sets, H, W, C / sets), the launch moving it, chunks of an image's ``p_n`` output pixels,
    ``item_runs`` of the items (image, set, chunk))."""
    n, h, w, c = nhwc.shape
    span_i = c // sets
    by_set = memory.empty((n, sets, h, w, span_i), nhwc.dtype)
    src = nhwc.reshape(n, h * w, sets, span_i).transpose(0, 2, 1, 3)
    chunks = max(1, -(-p_n // CHUNK))
    return by_set, (*strided_call(src, by_set), None), chunks, item_runs(n * sets * chunks,
                                                                         threads)


ITEMS = 4     # work items wanted per thread where the pixels are too few to cut by them alone
SHARE = CHUNK // 2   # pixels per thread enough to cut the work by pixels alone
ROWS = 8      # chunks start at multiples of ROWS pixels (whole row groups of the micro-kernels)


@njit(cache=True)
def work_split(images, p_n, oblocks, threads):
    """(chunks per image, groups of channel blocks, blocks per group) for a batch of
    ``images`` images of ``p_n`` output pixels on ``threads`` threads (the caller's
    ``numba.get_num_threads()``: called in a kernel, it would stop Numba caching it). Work
    items: ``work_item``. Where every thread can have SHARE pixels or more, the work is cut
    by pixels alone; else every chunk is split into as many groups (about a power of two,
    at most the blocks, none empty) as make ITEMS items per thread. Either way the chunks
    are as many as make the item count a multiple of the threads, all of about one size:
    each thread takes an equal run of consecutive items first (``next_item``; under Numba's
    static schedule, before it, that run was all it took), so items of unequal work (a 14 x
    14 image cut in 96, 96 and 4 pixels) left one thread three quarters of a convolution.

    Why pixels alone where they suffice: a work item prepares its chunk's operands (the
    gather, the 16-bit rows or the byte kernel's lists) for whichever blocks it multiplies,
    so a chunk split into four groups was prepared four times; and a thread that keeps the
    same pixels from layer to layer reads rows its own core wrote. A 14 x 14 image on two
    threads, cut in 4 chunks of 48-52 pixels rather than 3 chunks x 4 groups (AMD EPYC Zen 3,
    alternating processes): MobileNet-v2's 14 x 14 pointwise layers 0.86-0.96x the time,
    resnet50's 0.93-0.95x; the int8 programs 0.95-0.98x, fp32 level or faster."""
    chunks = (p_n + CHUNK - 1) // CHUNK
    groups = 1
    if images * p_n < threads * SHARE:
        while images * chunks * groups < ITEMS * threads and groups * 2 <= oblocks:
            groups *= 2
    per_group = (oblocks + groups - 1) // groups
    groups = (oblocks + per_group - 1) // per_group     # none empty (5 blocks: 2, 2, 1)
    while (images * chunks * groups) % threads != 0 and (chunks + 1) * ROWS <= p_n:
        chunks += 1
    return chunks, groups, per_group


LINE = 8   # int64 counters a cache line apart (``item_runs``)


@njit(cache=True)
def item_runs(items, threads):
    """The counters of ``next_item``: thread t's run of the ``items`` work items is
    [t * items // threads, (t + 1) * items // threads); in a cache line of its own, the
    next item of it to take (the counter), the run's end and its start. A last line counts
    the threads that have taken their last item (``release``)."""
    counters = np.zeros((threads + 1, LINE), np.int64)
    for t in range(threads):
        counters[t, 0] = t * items // threads
        counters[t, 1] = (t + 1) * items // threads
        counters[t, 2] = counters[t, 0]
    return counters


@njit(cache=True)
def release(counters):
    """The calling thread has taken its last item of ``counters``' (``next_item`` gave -1):
    the last of the threads to do so puts every run back at its start, so that a bound
    kernel's next call finds its counters as ``item_runs`` made them (every other thread
    is done with them by then; the launch's end orders the reset before the next call)."""
    threads = counters.shape[0] - 1
    if _fetch_add_ordered(counters[threads].ctypes.data, np.int64(1)) == threads - 1:
        for t in range(threads):
            counters[t, 0] = counters[t, 2]
        counters[threads, 0] = 0


@njit(cache=True)
def next_item(counters, thread):
    """The next work item for ``thread`` (a parallel loop's index over the threads): its own
    run's next, then, its run done, the next item of another thread's unfinished run (from
    that run's counter, as its own thread takes them: one item at a time, atomically); -1
    when every run is done. The drivers' parallel loops run over the threads, each taking items
    until none is left. The items a thread takes from its own run are those Numba's static
    schedule gave it (the same pixels from layer to layer, a group's chunks together); what
    it takes from another's run is the work a delayed thread (a shared host's other load, a
    chunk of many high bits on the 16-bit kernel) left the others waiting for, spinning at
    the region's end. Against the static schedule, on an AMD EPYC (Zen 3) host shared with
    other loads, 2 threads, alternating processes, two runs: int8 resnet18 1.01 and 0.94x
    the time, resnet50 0.99 and 0.99x, MobileNet-v2 0.98 and 0.94x; fp32 resnet18 and
    MobileNet-v2 0.98x. The same bits: every item is computed once, by whichever thread."""
    threads = counters.shape[0] - 1
    for k in range(threads):
        t = (thread + k) % threads
        item = _fetch_add(counters[t].ctypes.data, np.int64(1))
        if item < counters[t, 1]:
            return item
    return -1


@njit(cache=True)
def next_work(counters, thread, chunks, groups, per_group, oblocks):
    """``next_item``'s item for ``thread`` as the convolution drivers take it: (image,
    chunk, first block, end block) of a ``work_split`` (``work_item``), an item whose group
    has no blocks skipped; (-1, 0, 0, 0) when none is left."""
    while True:
        item = next_item(counters, thread)
        if item < 0:
            return -1, 0, 0, 0
        b, chunk, g = work_item(item, chunks, groups)
        ob0 = g * per_group
        ob1 = min(oblocks, ob0 + per_group)
        if ob0 < ob1:
            return b, chunk, ob0, ob1


@njit(cache=True)
def work_item(item, chunks, groups):
    """(image, chunk, group) of work item ``item`` (``work_split``): image item // (chunks *
    groups), then group-major: the chunks of a group are consecutive items, so that a thread,
    given a run of consecutive items, reads the weights of as few groups as it can. Taken
    chunk-major, each of two threads read every group's weights for a 14 x 14 image (four
    chunks, three groups), which come from memory in a whole program's run."""
    b, rest = item // (chunks * groups), item % (chunks * groups)
    return b, rest % chunks, rest // chunks


@njit(cache=True)
def block_shares(p_n, oblocks, threads):
    """Pixel shares per channel block of a lone small image (fewer than SMALL pixels: its
    rows gathered once, the work items blocks): as many as give every thread an equal run of
    (block, share) items, where the blocks alone do not (1 where they do, or where the image
    has too few pixels to share). Three 64-channel blocks of a 7 x 7 image on two threads
    took two blocks' time, one thread having two and the other one; in halves, each has a
    block and a half. Each item's block and pixels: ``share_item``."""
    a, b = oblocks, threads
    while b:
        a, b = b, a % b
    shares = threads // a
    while shares > 1 and shares * ROWS > p_n:
        shares -= 1
    return shares


@njit(cache=True)
def share_item(item, shares, p_n):
    """(channel block, first pixel, end pixel) of work item ``item`` of a lone small image
    cut into ``block_shares`` shares per block: the shares of a block are consecutive items."""
    p0, p1 = chunk_bounds(p_n, shares, item % shares)
    return item // shares, p0, p1


@njit(cache=True)
def chunk_bounds(p_n, chunks, chunk):
    """The pixels [p0, p1) of chunk ``chunk`` of ``chunks`` (``work_split``): equal shares of
    the ``p_n`` pixels, each starting at a multiple of ROWS (none empty while chunks * ROWS
    <= p_n)."""
    p0 = 0 if chunk == 0 else (chunk * p_n // chunks) // ROWS * ROWS
    p1 = p_n if chunk == chunks - 1 else ((chunk + 1) * p_n // chunks) // ROWS * ROWS
    return p0, p1


@njit(cache=True)
def shared_windows(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, groups, kp):
    """A lone image split by channel groups too (``work_split``): its windows' rows (p_n,
    kp), gathered once, in parallel, for every group's work items to read (``windows``);
    else an empty array, each work item gathering its own chunk (a pointwise convolution
    reads the image's own rows). Gathering per group had a 14 x 14 layer's 196 rows of 2304
    taps gathered four times."""
    pointwise = own_rows(kh, kw, sh, sw, pt, pl, nhwc.shape[3], kp, ow, nhwc.shape[2])
    rows = np.empty((p_n if nhwc.shape[0] == 1 and groups > 1 and not pointwise else 0, kp),
                    nhwc.dtype)
    if rows.shape[0]:
        _windows_region(nhwc[0], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows)
    return rows


@njit(cache=True)
def split_plan(images, p_n, oblocks, threads):
    """How a SIMD convolution driver's one parallel loop cuts a batch's work (both ways in
    one loop: each parallel loop is a compile of its own for Numba, with an empty cache):
    (work, items). A lone small image (fewer than SMALL pixels, more than one block of
    channels) has its rows gathered once, and its items are (block, share of its pixels)
    (``block_shares``); else the items are ``work_split``'s chunks and groups. work: (lone,
    chunks, groups, per_group, shares, p_n, oblocks), for ``next_share``."""
    lone = images == 1 and p_n < SMALL and oblocks > 1
    if lone:
        chunks, groups, per_group = 1, 1, 1
        shares = block_shares(p_n, oblocks, threads)
        items = oblocks * shares
    else:
        chunks, groups, per_group = work_split(images, p_n, oblocks, threads)
        shares = 1
        items = images * chunks * groups
    work = (np.intp(1 if lone else 0), np.intp(chunks), np.intp(groups), np.intp(per_group),
            np.intp(shares), np.intp(p_n), np.intp(oblocks))
    return work, items


@njit(cache=True)
def split_work(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, oblocks, threads, kp):
    """``split_plan``'s cut, with what the items share and their counters, inside a
    driver's compiled code (AVX2's byte driver, ``avx2._bytes_region``): (work, shared,
    counters) for ``next_share`` and ``share_rows``; ``shared``: a lone image's rows
    (``_rows``), else ``shared_windows``'s. ``plan_shares`` makes the same in Python, for
    the drivers of ``launch.Driver``."""
    work, items = split_plan(nhwc.shape[0], p_n, oblocks, threads)
    if work[0]:
        shared = _rows(nhwc[0], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, np.intp(0), p_n, kp)
    else:
        shared = shared_windows(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, work[2],
                                kp)
    return work, shared, item_runs(items, threads)


def plan_shares(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, oblocks, threads, kp):
    """``split_work`` in Python, for a driver of ``launch.Driver``: (work, shared, counters,
    fill), ``fill`` the launch that gathers ``shared`` before the items run, or None
    (``_shared``). The same cut: ``split_plan``'s source, run as Python."""
    work, items = _split_plan(nhwc.shape[0], p_n, oblocks, threads)
    shared, fill = _shared(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, kp, work[0] != 0,
                           work[2])
    return work, shared, _item_runs(items, threads), fill


def plan_chunks(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, oblocks, threads, kp):
    """The float driver's cut (``work_split``'s chunks and groups, no lone image's shares),
    in Python: ((chunks, groups, per_group), shared, counters, fill), as ``plan_shares``."""
    images = nhwc.shape[0]
    chunks, groups, per_group = _work_split(images, p_n, oblocks, threads)
    shared, fill = _shared(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, kp, False,
                           groups)
    split = (np.intp(chunks), np.intp(groups), np.intp(per_group))
    return split, shared, _item_runs(images * chunks * groups, threads), fill


def _shared(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p_n, kp, lone, groups):
    """The rows every work item of a lone image reads (``share_rows``), as ``split_work``
    makes them: a lone small image's gathered on one thread (``_rows``; a view of its own
    for a pointwise convolution), a lone image split by groups of channel blocks too
    gathered in parallel (``shared_windows``); else none. (rows, fill): fill the launch
    that gathers them, (kernel, arguments), or None."""
    h, w, c = nhwc.shape[1], nhwc.shape[2], nhwc.shape[3]
    pointwise = _own_rows(kh, kw, sh, sw, pt, pl, c, kp, ow, w)
    if lone and pointwise:
        return nhwc[0].reshape(h * w, c)[:p_n], None
    if lone or (nhwc.shape[0] == 1 and groups > 1 and not pointwise):
        rows = memory.empty((p_n, kp), nhwc.dtype)
        kernel = windows.serial if lone else windows
        return rows, (kernel, (nhwc[0], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows))
    return np.empty((0, kp), nhwc.dtype), None


@njit(cache=True)
def next_share(counters, thread, work):
    """``thread``'s next work item of ``split_work``'s: (image, first block, end block,
    first pixel, end pixel); image -1 when none is left."""
    lone, chunks, groups, per_group, shares, p_n, oblocks = work
    none = (np.intp(-1), np.intp(0), np.intp(0), np.intp(0), np.intp(0))
    if lone:
        item = next_item(counters, thread)
        if item < 0:
            return none
        ob, p0, p1 = share_item(item, shares, p_n)
        return np.intp(0), np.intp(ob), np.intp(ob + 1), np.intp(p0), np.intp(p1)
    b, chunk, ob0, ob1 = next_work(counters, thread, chunks, groups, per_group, oblocks)
    if b < 0:
        return none
    p0, p1 = chunk_bounds(p_n, chunks, chunk)
    return np.intp(b), np.intp(ob0), np.intp(ob1), np.intp(p0), np.intp(p1)


@njit(cache=True)
def share_rows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1, kp, shared):
    """The rows of an image's pixels p0..p1: ``shared``'s where it holds them (``split_work``),
    else gathered (``_rows``)."""
    if shared.shape[0]:
        return shared[p0:p1]
    return _rows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1 - p0, kp)


@njit(inline="always")
def _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows):
    """Pixel rows p0.. of the image's windows (taps in (tap, channel) order, ``pad`` outside
    the image, zeros in the padding of K) into ``rows`` (n, Kp). The pixels of one output
    row are taken a kernel row at a time: those whose kernel row lies inside the image (with
    dw 1, one run of kw pixels) in a loop of copies whose moves are chosen once
    (``llvm_loops.copy_runs_intrinsic``), the others tap by tap. Taken pixel by pixel, each
    run's copy chosen there and the border's tap-by-tap code in the same loop, resnet18's
    stem's gather took about twice as long."""
    h, w, c_in = hwc.shape
    n, kp = rows.shape
    k = kh * kw * c_in
    span = kw * c_in
    size = rows.itemsize
    if not (hwc.flags.c_contiguous and rows.flags.c_contiguous):
        raise ValueError("_windows reads and writes C-contiguous arrays")
    src, dst = hwc.ctypes.data, rows.ctypes.data
    run = span * size
    r0 = 0
    y = p0 // ow
    x0 = p0 - y * ow
    while r0 < n:
        m = min(n - r0, ow - x0)        # rows r0..r0+m: output row y, columns x0..x0+m
        for i in range(kh):
            iy = y * sh - pt + i * dh
            # the columns whose kernel row lies inside the image: a..b
            a = b = x0
            if dw == 1 and iy >= 0 and iy < h and w - kw + pl >= 0:
                a = max(x0, (pl + sw - 1) // sw)
                b = max(a, min(x0 + m, (w - kw + pl) // sw + 1))
            d = dst + ((r0 + a - x0) * kp + i * span) * size
            s = src + ((iy * w + a * sw - pl) * c_in) * size
            _copy_runs(d, s, run, b - a, kp * size, sw * c_in * size)
            if a == x0 and b == x0 + m:
                continue
            for xo in range(x0, x0 + m):
                if a <= xo < b:
                    continue
                r = r0 + xo - x0
                for j in range(kw):
                    ix = xo * sw - pl + j * dw
                    base = (i * kw + j) * c_in
                    if iy >= 0 and iy < h and ix >= 0 and ix < w:
                        for c in range(c_in):
                            rows[r, base + c] = hwc[iy, ix, c]
                    else:
                        for c in range(c_in):
                            rows[r, base + c] = pad
        for r in range(r0, r0 + m):
            for c in range(k, kp):
                rows[r, c] = 0
        r0 += m
        y += 1
        x0 = 0


@parallel
def windows(thread, threads, args):
    """All pixel rows of an image's windows (``_windows``), chunks of CHUNK rows shared out."""
    hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows = args
    n = rows.shape[0]
    for t in range(*share((n + CHUNK - 1) // CHUNK, thread, threads)):
        p0 = t * CHUNK
        copy_windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0,
                     rows[p0:min(n, p0 + CHUNK)])


_windows_part = windows.part


@njit(parallel=True, cache=True)
def _windows_region(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows):
    """``windows`` as a parallel loop of Numba's own, each chunk of rows one share, for a
    caller in compiled code (``shared_windows``, which only AVX2's byte driver reaches)."""
    chunks = (rows.shape[0] + CHUNK - 1) // CHUNK
    for t in prange(chunks):
        _windows_part(t, chunks, (hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows))


# The gather compiled once, as a C function for each element type (``_windows_entry``), that
# the kernels call through its slot (``copy_windows``). Called as a Numba function, its code
# went through LLVM again in every function and parallel region that reached it: the
# parallel ``windows`` (its loop's function, two wrappers, itself), ``shared_windows``, the
# chunks' ``_rows`` and each convolution driver; the gathers' compiles, with ``windows``
# and ``shared_windows``, were most of a cold resnet18 start, int8 and fp32 alike.

def _windows_entry(hwc, h, w, c, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows, n, kp):
    """``_windows`` on C-contiguous arrays given by their addresses and shapes (inlined here:
    compiled apart and linked in, its code went through Numba and LLVM twice, on every
    first start)."""
    _windows(carray(hwc, (h, w, c)), kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0,
             carray(rows, (n, kp)))


# element type -> (its name in the C function's symbol, the type of the padding value)
_KINDS = {"uint8": ("u8", "int64"), "float32": ("f32", "float32")}
_ENTRIES: dict = {}   # element -> the compiled C function (kept alive: its slot points into it)


def _entry_signature(element: str):
    from numba import types
    el, pad = getattr(types, element), getattr(types, _KINDS[element][1])
    i = types.intp
    return types.void(types.CPointer(el), *([i] * 11), pad, i, i, types.CPointer(el), i, i)


def load_entry(element: str) -> None:
    """Compile (or load from Numba's disk cache) the gather's C function for ``element``
    ("uint8" or "float32") once, and put its address in its slot. Each module whose kernels
    gather calls it as it is imported, for the element type its kernels read (``vnni.py``
    and ``avx2.py`` bytes, ``fma.py`` floats), so the slot is filled before any of them
    runs, cached or compiled (a kernel calling an empty slot would jump to 0): at once, or
    at the end of ``compiling.deferring`` (``llvm_loops.load_gemms``). One type's
    alone: compiled with an empty cache, each is a compile of its own, and a program reads
    one."""
    from ..codegen.compiling import c_function, defer
    kind = _KINDS[element][0]

    def load() -> bool:
        if element not in _ENTRIES:
            entry = c_function(twin(_windows_entry, f"_{kind}"), _entry_signature(element))
            if entry is None:               # (recorded by compiling.survey)
                return False
            fill_slot(f"eqquant_windows_{kind}", entry.address, entry)
            _ENTRIES[element] = entry
        return True
    slot(f"eqquant_windows_{kind}")   # (at once: a cached kernel links to it)
    defer(f"windows {kind}", load)


def _copy_windows_intrinsic():
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.core.errors import TypingError
    from numba.extending import intrinsic

    def copy_windows(typingctx, hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows):
        """``copy_windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows)``:
        ``_windows`` through the C function of the arrays' element type (uint8 or float32;
        C-contiguous arrays, said at compile time)."""
        for name, a, ndim in (("hwc", hwc, 3), ("rows", rows, 2)):
            if not (isinstance(a, types.Array) and a.ndim == ndim and a.layout == "C"):
                raise TypingError(f"copy_windows: {name} must be a C-contiguous {ndim}-d "
                                  f"array, not {a}")
        element = str(hwc.dtype)
        if element not in _KINDS or rows.dtype != hwc.dtype:
            raise TypingError(f"copy_windows gathers uint8 or float32 rows of the image's "
                              f"type, not {hwc.dtype} into {rows.dtype}")
        kind, pad_type = _KINDS[element]
        ints = (kh, kw, sh, sw, pt, pl, dh, dw)
        sig = types.void(hwc, *ints, pad, ow, p0, rows)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            image = context.make_array(hwc)(context, builder, args[0])
            out = context.make_array(rows)(context, builder, args[12])

            def cast(value, from_type, to_type=types.intp):
                return context.cast(builder, value, from_type, to_type)
            tail = [cast(v, t) for v, t in zip(args[1:9], ints)]
            pad_value = cast(args[9], pad, getattr(types, pad_type))
            values = [builder.ptrtoint(image.data, i64),
                      *cgutils.unpack_tuple(builder, image.shape, 3), *tail, pad_value,
                      cast(args[10], ow), cast(args[11], p0),
                      builder.ptrtoint(out.data, i64),
                      *cgutils.unpack_tuple(builder, out.shape, 2)]
            fnty = ir.FunctionType(ir.VoidType(), [v.type for v in values])
            call_slot(builder, f"eqquant_windows_{kind}", fnty, values)
            return context.get_dummy_value()
        return sig, codegen
    return intrinsic(copy_windows)


copy_windows = _copy_windows_intrinsic()


# the Python twins of the plan's integer code (``plan_shares``), its calls bound to theirs
_split_plan = twin(split_plan.py_func, "_py", block_shares=block_shares.py_func,
                   work_split=work_split.py_func)
_item_runs = item_runs.py_func
_work_split = work_split.py_func
_own_rows = own_rows.py_func
