"""The AVX2 byte kernel (``runtime/kernels/avx2.py``): ``vpmaddubsw`` on the activations' low 7 bits,
their high bits listed by ``split_high`` and added back, must give the exact integer sums
whatever the bytes: no saturation at the extremes (255 x -128, 127 x 127), the listing
right at row and group edges, a chunk with too many high bits handed to the 16-bit kernel,
and a whole convolution bit for bit against the reference where the byte path runs."""
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from eqquant.ir.builder import Builder
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.target import Target
from kernel_paths import forced_int8_path

# the byte driver (x86.avx2.bytes) and the 16-bit one (x86.avx2): an AVX2 CPU's kernels
BYTES = Target.named("avx2")

avx2 = pytest.importorskip("eqquant.runtime.kernels.avx2")
if not avx2.available():
    pytest.skip("this CPU has no AVX2: the byte kernel cannot run here", allow_module_level=True)


def _bytes(rng, shape, high: float) -> np.ndarray:
    """uint8 values below 128 with a share ``high`` of them (the top bit) set."""
    a = rng.integers(0, 128, shape).astype(np.uint8)
    a[rng.random(shape) < high] |= 0x80
    return a


def _listed(rows: np.ndarray) -> tuple[list, list]:
    """``split_high``'s starts and entries, by numpy: each quad with a high bit, in order."""
    n, kp = rows.shape
    h = (rows >> 7).reshape(n, kp // 4, 4).astype(np.int64)
    starts, entries = [0], []
    for r in range(n):
        for q in np.nonzero(h[r].any(axis=1))[0]:
            entries.append((int(q), int((h[r, q] << np.array([0, 8, 16, 24])).sum())))
        starts.append(len(entries))
    return starts, entries


def _fits(rows: np.ndarray) -> bool:
    """Whether a chunk's room (``listed``: (kp / 4) // HIGH_SHARE entries a row) holds the
    rows' high bits."""
    return len(_listed(rows)[1]) <= rows.shape[0] * ((rows.shape[1] // 4) // avx2.HIGH_SHARE)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 40), quads=st.integers(1, 40), high=st.sampled_from([0.0, 0.01, 0.1]),
       seed=st.integers(0, 2 ** 32 - 1))
@example(n=3, quads=8, high=0.0, seed=0)       # whole 32-byte groups, no high bit at all
@example(n=5, quads=9, high=0.05, seed=1)      # rows of 36 bytes: groups straddle rows
@example(n=1, quads=1, high=1.0, seed=2)       # one 4-byte row, all high
def test_the_high_bits_are_listed_by_quad_and_row(n, quads, high, seed):
    rng = np.random.default_rng(seed)
    rows = _bytes(rng, (n, 4 * quads), high)
    starts_want, entries_want = _listed(rows)
    low = np.full_like(rows, 0xEE)
    starts = np.full(n + 1, -7, np.int32)
    big = np.zeros((n * quads, 2), np.int32)           # room for every quad: never gives up
    assert avx2.split_high(rows, low, starts, big) == len(entries_want)
    np.testing.assert_array_equal(low, rows & 0x7F)
    assert starts.tolist() == starts_want
    assert [tuple(e) for e in big[:len(entries_want)].tolist()] == entries_want
    rooms = n * (quads // avx2.HIGH_SHARE)               # a chunk's room, then a guard
    guarded = np.full((rooms + 2 * quads, 2), -5, np.int32)
    assert (avx2.split_high(rows, low, starts, guarded[:rooms]) >= 0) == _fits(rows)
    assert (guarded[rooms:] == -5).all()                 # nothing written past the room


def test_the_listing_gives_up_past_its_room_and_the_16_bit_kernel_takes_the_chunk():
    rng = np.random.default_rng(3)
    kp = 64                                             # 16 quads a row: room for 2 a row
    few = _bytes(rng, (24, kp), 0.0)
    few[:, 5] |= 0x80                                   # one quad a row
    few[0, ::4] |= 0x80                                 # and the first row: all its 16
    many = _bytes(rng, (24, kp), 0.0)
    many[:4, ::4] |= 0x80                               # 4 rows of 16: 64 > 48
    room = np.zeros((24 * 2, 2), np.int32)
    low, starts = np.empty_like(few), np.empty(25, np.int32)
    assert avx2.split_high(few, low, starts, room) == 16 + 23
    assert avx2.split_high(many, low, starts, room) == -1
    w = rng.integers(-128, 128, (20, kp)).astype(np.int8)
    packed, _, _ = avx2.pack(w)
    for rows, takes_bytes in ((few, True), (many, False)):
        out = np.zeros((24, packed.shape[0] * avx2.BLOCK), np.int32)
        assert avx2.gemm_bytes(rows, packed, avx2.pack_quads(w), out) == takes_bytes
        np.testing.assert_array_equal(out[:, :20], rows.astype(np.int64) @ w.T.astype(np.int64))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 30), k=st.integers(1, 300), o=st.integers(1, 70),
       high=st.sampled_from([0.0, 0.003, 0.02]), seed=st.integers(0, 2 ** 32 - 1))
@example(p=13, k=576, o=40, high=0.02, seed=4)      # the byte kernel, with high bits
@example(p=6, k=64, o=16, high=0.0, seed=5)
@example(p=2, k=7, o=12, high=0.02, seed=1)         # no room for a high bit: 16-bit kernel
def test_the_byte_kernel_is_exact_at_the_extremes(p, k, o, high, seed):
    """Sums of the byte kernel against int64 numpy, with the products that saturate
    ``vpmaddubsw`` on whole bytes (255 x -128 and 255 x 127 pairs) in every row that has a
    high bit, and 127 x -128 pairs (the largest the low bits make) in every row."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (o, k)).astype(np.int8)
    w[0, :] = -128
    if o > 1:
        w[1, :] = 127
    a = _bytes(rng, (p, k), high)
    a[:, :2] |= 0x7F                                    # 127 or 255 in the first pair
    packed, _, kp = avx2.pack(w)
    rows = np.zeros((p, kp), np.uint8)
    rows[:, :k] = a
    out = np.zeros((p, packed.shape[0] * avx2.BLOCK), np.int32)
    # (the kernel it says it ran)
    assert avx2.gemm_bytes(rows, packed, avx2.pack_quads(w), out) == _fits(rows)
    np.testing.assert_array_equal(out[:, :o], a.astype(np.int64) @ w.T.astype(np.int64))
    assert not out[:, o:].any()


def test_a_row_of_high_bytes_at_the_weights_extremes_is_summed_exactly():
    """A row of 255s, every one of its 197 quads listed, against weights of -128 and 127 in
    two blocks: its high bits' products are at their largest (128 x -128 x 788 bytes, far
    outside int16). The other rows have no high bit (the chunk's room, 1/8 of its quads,
    holds the one row's)."""
    rng = np.random.default_rng(7)
    quads = 197
    a = _bytes(rng, (16, 4 * quads), 0.0)
    a[0] = 255
    w = rng.integers(-128, 128, (40, 4 * quads)).astype(np.int8)
    w[0], w[1], w[17] = -128, 127, -128                 # the extremes in two blocks
    packed, _, kp = avx2.pack(w)
    assert kp == 4 * quads and _fits(a)
    out = np.zeros((16, packed.shape[0] * avx2.BLOCK), np.int32)
    assert avx2.gemm_bytes(a, packed, avx2.pack_quads(w), out)     # (the byte kernel's)
    np.testing.assert_array_equal(out[:, :40], a.astype(np.int64) @ w.T.astype(np.int64))


def _conv(rng, c, o, k, stride, size, batch, residual, wmax=128, edge=None, pin=""):
    """fused.qconv2d(_add) with ReLU, channel-last, its weights' extremes in channel 0 (and
    with ``wmax`` 64, 7-bit weights: -64 in channel 0, 64 in channel 1) (input zero point 3:
    the padding byte has no high bit): (the program, its output's size)."""
    b = Builder()
    x = b.input("x", (batch, size, size, c), "uint8")
    w = rng.integers(-wmax, wmax, (k, k, c, o)).astype("i1")
    w[..., 0] = -wmax
    if wmax < 128 and o > 1:
        w[..., 1] = wmax
    if edge is not None:
        w[0, 0, 3, 0] = edge
    qargs = [b.param("w", w), b.param("b", rng.integers(-900, 900, o).astype("i4")),
             b.param("zx", np.array(3, np.int32)), b.param("zw", np.array(0, np.int32)),
             b.param("sx", np.array(0.05, np.float32)),
             b.param("sw", rng.uniform(0.01, 0.02, o).astype(np.float32)),
             b.param("s1", (0.05 * rng.uniform(0.01, 0.02, o)).astype(np.float32)),
             b.param("z1", np.array(0, np.int32)), b.param("s2", np.array(0.1, np.float32))]
    out = dict(strides=[stride] * 2, padding=[k // 2] * 4, activation="relu",
               out_dtype="uint8", axis=3, data_layout="NHWC", kernel_layout="HWIO",
               **({"kernel": pin} if pin else {}))
    oh = (size + 2 * (k // 2) - k) // stride + 1
    if residual:
        r = b.input("r", (batch, oh, oh, o), "uint8")
        y = b.call("fused.qconv2d_add", x, *qargs, b.param("z2", np.array(5, np.int32)), r,
                   *[b.param(name, np.array(v, dt)) for name, v, dt in [
                       ("sa", 0.1, np.float32), ("za", 5, np.int32), ("sr", 0.07, np.float32),
                       ("zr", 4, np.int32), ("so", 0.12, np.float32), ("zo", 6, np.int32)]],
                   **out)
    else:
        y = b.call("fused.qconv2d", x, *qargs, b.param("z2", np.array(5, np.int32)), **out)
    return bind_params(*b.finish(y)), oh


@settings(max_examples=25, deadline=None)
@given(c=st.integers(29, 45), o=st.integers(1, 100), k=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), size=st.integers(5, 20), batch=st.integers(1, 2),
       residual=st.booleans(), seed=st.integers(0, 999))
# a 7 x 7 image of 3 channel blocks (split by blocks, its rows split once for all), 20 x 20
# ones of 400 pixels (chunks of pixels; lists from the image's, then each chunk's split), a
# pointwise layer reading the image's rows
@example(c=32, o=48, k=3, stride=1, size=7, batch=1, residual=True, seed=1)
@example(c=44, o=24, k=3, stride=1, size=20, batch=2, residual=False, seed=2)
@example(c=30, o=24, k=3, stride=1, size=20, batch=1, residual=False, seed=2)
@example(c=29, o=70, k=1, stride=1, size=16, batch=2, residual=True, seed=3)
@example(c=41, o=5, k=1, stride=2, size=5, batch=2, residual=False, seed=178)
def test_convolutions_on_the_byte_kernel_are_bit_exact(c, o, k, stride, size, batch, residual,
                                                       seed):
    """fused.qconv2d(_add) on activations most of whose bytes are below 128 (the byte
    kernel's case: a ReLU's output) and with their weights' extremes, channel-last, on the
    AVX2 path, against the integer reference; then on an image high in every byte (each
    chunk widened for the 16-bit kernel), exact too. The plan gives the site the byte
    driver, and a library saved ahead of time holds it (its launches)."""
    rng = np.random.default_rng(seed)
    c = c if k == 3 else 9 * c           # rows of 256 bytes or more (``BYTES_FROM``)
    bound, oh = _conv(rng, c, o, k, stride, size, batch, residual)
    # 0.2% of the bytes high (about 1% of the quads): at 0.5%, 64 sampled words of a 9-row
    # image once drew 7 high ones, over the byte kernel's 1/10 (seed 178, c=41, k=1)
    xs = {"x": _bytes(rng, (batch, size, size, c), 0.002)}
    xs["x"][:, 0, 0, :4] = 255                      # a quad of 255s in a corner pixel
    if residual:
        xs["r"] = rng.integers(0, 256, (batch, oh, oh, o)).astype("uint8")
    # the byte kernel's case: the image's rows (windows) take it, as a whole
    from eqquant.runtime.kernels.gather import _rows
    kp = -(-k * k * c // 4) * 4
    rows = _rows(xs["x"][0], k, k, stride, stride, k // 2, k // 2, 1, 1, 3, oh, 0, oh * oh, kp)
    assert avx2.split_or_widen(np.ascontiguousarray(rows), avx2.empties(kp))[3].size == 0
    with forced_int8_path("avx2"):
        ex = Executor(bound, target=BYTES)
        convs = [s.fn.conv for s in ex.steps if "qconv2d" in s.label]
        assert [c.conv_kernel for c in convs] == [avx2.conv_requantize_bytes]
        np.testing.assert_array_equal(ex.run(xs), run(bound, xs))
        dense = {**xs, "x": xs["x"] | 0x80}
        np.testing.assert_array_equal(ex.run(dense), run(bound, dense))
        np.testing.assert_array_equal(ex.run(xs), run(bound, xs))


def test_chunks_whose_lists_outgrow_their_room_take_the_16_bit_kernel():
    """An image whose high quads are few but packed in one corner, so that the chunks there
    outgrow their room: those take the 16-bit kernel, the others the byte kernel, all exact
    (as the executor runs them, and as a library saved ahead of time does)."""
    rng = np.random.default_rng(5)
    bound, oh = _conv(rng, 32, 40, 3, 1, 20, 1, False)
    x = _bytes(rng, (1, 20, 20, 32), 0.0)
    x[0, :6, :6, :] |= 0x80                             # 36 of 400 pixels: 9% of the quads
    with forced_int8_path("avx2"):
        ex = Executor(bound, target=BYTES)
        (conv,) = [s.fn.conv for s in ex.steps if "qconv2d" in s.label]
        assert conv.conv_kernel is avx2.conv_requantize_bytes
        np.testing.assert_array_equal(ex.run({"x": x}), run(bound, {"x": x}))
        if sys.platform.startswith("linux"):
            import tempfile
            from pathlib import Path
            from eqquant.deploy.build import build as save
            from eqquant.deploy.loader import Library
            with tempfile.TemporaryDirectory() as d:
                save(ex, Path(d) / "lib")
                got = Library(Path(d) / "lib").run({"x": x})
            np.testing.assert_array_equal(got, run(bound, {"x": x}))




@settings(max_examples=20, deadline=None)
@given(c=st.integers(1, 45), o=st.integers(1, 70), k=st.sampled_from([1, 3]),
       stride=st.integers(1, 2), size=st.integers(3, 20), batch=st.integers(1, 2),
       residual=st.booleans(), seed=st.integers(0, 999))
@example(c=32, o=48, k=3, stride=1, size=7, batch=1, residual=True, seed=1)   # a lone image
@example(c=3, o=16, k=3, stride=2, size=20, batch=2, residual=False, seed=2)  # rows of 28 bytes
def test_7_bit_weights_run_every_byte_on_the_byte_kernel_exactly(c, o, k, stride, size, batch,
                                                                 residual, seed):
    """Weights within +-64 (quantize's weight_bits=7): the plan gives the site x86.avx2.w7,
    the byte kernel on whole bytes, nothing split or listed; its sums are exact for any
    bytes, images of 255s at the weights' extremes (pairs of products of 32,640, next to
    vpmaddubsw's saturation) and random ones, as the executor runs it and as a library
    saved ahead of time does."""
    rng = np.random.default_rng(seed)
    bound, oh = _conv(rng, c, o, k, stride, size, batch, residual, wmax=64)
    images = [rng.integers(0, 256, (batch, size, size, c)).astype("uint8"),
              np.full((batch, size, size, c), 255, np.uint8)]
    with forced_int8_path("avx2"):
        ex = Executor(bound, target=BYTES)
        (conv,) = [s.fn.conv for s in ex.steps if "qconv2d" in s.label]
        assert conv.conv_kernel is avx2.conv_requantize_narrow
        assert [d.chosen.kernel for d in ex.kernel_decisions] == ["x86.avx2.w7"]
        for x in images:
            xs = {"x": x}
            if residual:
                xs["r"] = rng.integers(0, 256, (batch, oh, oh, o)).astype("uint8")
            np.testing.assert_array_equal(ex.run(xs), run(bound, xs))
        if sys.platform.startswith("linux"):
            import tempfile
            from pathlib import Path
            from eqquant.deploy.build import build as save
            from eqquant.deploy.loader import Library
            with tempfile.TemporaryDirectory() as d:
                save(ex, Path(d) / "lib")
                got = Library(Path(d) / "lib").run(xs)
            np.testing.assert_array_equal(got, run(bound, xs))


def test_weights_past_7_bits_keep_the_narrow_kernel_out_and_a_pin_of_it_is_refused():
    """One weight of 65 (or -65): pairs of products of bytes reach 33,150, past int16, so the
    plan says why x86.avx2.w7 does not run the site, and a program naming it is refused."""
    from eqquant.errors import KernelError
    from eqquant.runtime.lowering.plan import plan_kernels
    for edge in (64, -64, 65, -65):
        bound, _ = _conv(np.random.default_rng(0), 32, 16, 3, 1, 8, 1, False, 64, edge)
        (d,) = Executor(bound, target=BYTES).kernel_decisions
        opt = {o.kernel: o for o in d.options}["x86.avx2.w7"]
        narrow = abs(edge) <= 64
        assert (d.chosen.kernel == "x86.avx2.w7") == narrow
        assert ("7-bit weights" in d.site.describe()) == narrow
        if not narrow:
            assert opt.cost is None and "+-64" in opt.why
            pinned, _ = _conv(np.random.default_rng(0), 32, 16, 3, 1, 8, 1, False, 64, edge,
                              pin="x86.avx2.w7")
            with pytest.raises(KernelError, match="x86.avx2.w7.*cannot run this site"):
                plan_kernels(pinned, BYTES)
