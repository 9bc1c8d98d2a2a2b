"""An int8 GEMM on AVX2, for CPUs without VNNI: LLVM IR written with llvmlite, compiled once
as C functions that Numba-compiled kernels call through an intrinsic
(``llvm_loops.load_gemms``), like ``vnni.py``, whose interface it shares (pixel rows as
unsigned bytes, packed weights, the same epilogue).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

AVX2 has two multiplies of bytes, neither both exact and fast for uint8 x int8:

- ``vpmaddubsw`` multiplies 32 unsigned bytes by 32 signed ones and adds each pair of
  products into an int16 with saturation (|a * b + a' * b'| reaches 65,280: the known
  saturation of 8-bit dot products on CPUs without VNNI); ``vpmaddwd`` by ones then adds
  the pairs into int32 lanes: 32 products for two multiplies and one add.
- ``vpmaddwd`` on bytes widened to int16 is exact: 16 products for one multiply and one add.

The byte kernel (``bytes_block``, ``bytes_requantize``; ``gemm_bytes``) makes the first
exact. Each activation a = l + 128 h is split into its low 7 bits l and its high bit h
(``split_high``). The low bits go through ``vpmaddubsw``: a pair of products l * b + l' * b'
lies within +-32,512 and cannot saturate. The high bits, rare after a ReLU (0.1-3% of the
bytes ResNet's int8 convolutions read, 2-12% of their quads of 4 bytes), are listed quad by
quad, and each listed quad's 4 high bits, as bytes of 0 or 1, are multiplied with the same
``vpmaddubsw`` by that quad's weights (just read by the sums, so in cache) and by 128 with
``vpmaddwd``, into the row's sums before the epilogue. (Its speed against the 16-bit kernel's,
measured: docs/runtime.md.)

Where listing does not pay, the 16-bit kernel (``gemm_block``, ``gemm_requantize``) takes
the rows, widened to int16 a chunk at a time (each pixel's pair (a_k, a_k+1) one broadcast
32-bit load). Which kernel runs is decided at two levels; neither changes a bit of the sums:

- per layer, by the kernel plan (``lowering``): the byte driver is its own kernel,
  ``x86.avx2.bytes`` (``conv_requantize_bytes``), the 16-bit one ``x86.avx2``
  (``conv_requantize``); both are launches, so a library saved ahead of time holds either.
  Rows of fewer than BYTES_FROM bytes take the 16-bit kernel (the byte kernel lost on
  resnet18's 7 x 7 stem and its 1x1 stride-2 layers, and on resnet50's 1x1 layers of 64
  bytes);
- per chunk of pixels, in the work items (``split_or_widen``): a chunk whose sampled quads
  (``high_quad_share``) are high in 1/TRY_BELOW or more is widened without listing, and
  one whose list outgrows its room (1/HIGH_SHARE of its quads) is widened after trying.
  MobileNet-v2's layers read 45-99% of high quads (its linear bottlenecks' zero points
  near 128, its ReLU6 outputs spread up to 255), so its chunks mostly take the 16-bit
  kernel, at the cost of the sampling.

The byte kernel reads its own packing of the weights (``pack_quads``: [Kp/4][16][4] int8 per
block of 16 output channels, 4 k-values for 8 channels in 32 bytes), beside the 16-bit kernel's
panels (``pack``), which are as they were without it. The 16-bit kernel keeps 6 pixels x 16
channels in 12 accumulators, the byte kernel 4 x 16 (at 6, with the weights, the ones and a
broadcast, no register was left for the products: LLVM spilled two sums a step). The
convolution driver requantizes the sums in registers and stores 8-bit values, as the VNNI
kernels do (``vnni.requantize_finish``): finished through an int32 tile in memory,
MobileNet-v2's int8 convolutions took 1.7x as long on an AMD EPYC with AVX2 (its 1x1 layers of
few input channels 2.5-3x: the epilogue, not the products, was their cost).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..codegen import memory
from ..codegen.launch import Driver, parallel, share

from ..codegen.llvm_loops import (carried_loop, counted_loop, cpu_has, declare, gemm_definition,
                         gemm_intrinsic, load_gemms, load_vectors, panel_gemm, slot_cell,
                         splat, while_loop)
# the gather, set-up and epilogue it shares with the VNNI kernel (windows: re-exported)
from .gather import load_entry, next_share, plan_shares, release, share_rows, windows
from .gather import group_span as gather_group_span, widen
# requantize_params: re-exported, the bindings derive each layer's epilogue table with it
from .vnni import requantize_params  # noqa: F401
from .int8 import add_residual
from .vnni import _finish, grouped_requantize, pack_panels, requantize_finish

load_entry("uint8")   # the gather of this module's kernels, on bytes

BLOCK = 16   # output channels per register block (2 x 8 lanes)
ROWS = 6     # pixels per micro-kernel step: 6 x 2 accumulators + 2 weight vectors in ymm
BYTE_ROWS = 4   # the byte kernel's pixels a step: 4 x 2 accumulators, 2 weights, the ones
PANEL = 64   # bytes of packed weights per k-step and block (16 channels x 2 int16 or 4 int8)
HIGH_SHARE = 8   # a chunk's high bits listed for the byte kernel: in up to 1/8 of its quads
BYTES_FROM = 256  # the byte kernel for rows of this many bytes or more
NARROW = 64      # weights within +-64: a pair of products of bytes within +-32,640, no
                 # saturation in vpmaddubsw's int16 (7-bit weights: quantize's weight_bits)
TRY_BELOW = 10   # a chunk whose sampled quads are high in 1/10 or more: the 16-bit kernel
SAMPLES = 64     # words of a chunk's rows sampled for their share of quads with a high bit


def available() -> bool:
    return cpu_has("avx2")


EPILOGUE = ("ptr", "i64", "i64", "i64", "i64")   # params, stride, lo, hi, valid


def _define(epilogue: bool = False):
    """Define (once per LLVM module) ``void eqquant_avx2_gemm(A, lda, B, C, ldc, p0, p1,
    kpairs, oblocks)`` (A int16 rows of lda elements): for each block of 16 output channels,
    pixels p0..p1, ROWS at a time (then one at a time), over all k-pairs of the 16-bit
    panels. With ``epilogue``, ``eqquant_avx2_gemm_requantize(..., params, stride, lo, hi,
    valid)`` finishes each sum in registers and stores 8-bit values
    (``vnni.requantize_finish``), as the VNNI GEMMs do."""
    @gemm_definition("eqquant_avx2_gemm" + ("_requantize" if epilogue else ""), "i8",
                     EPILOGUE if epilogue else ())
    def define_gemm(mod, fn, args, b):
        from llvmlite import ir
        i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v8 = ir.VectorType(i32, 8)
        v16 = ir.VectorType(i16, 16)
        madd = declare(mod, "llvm.x86.avx2.pmadd.wd", ir.FunctionType(v8, [v16, v16]))
        a_ptr = args[0]
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def row_step(bc, start, k, accs, weights):
            """the int16 pair (a_k, a_k+1) of this pixel's row, broadcast to every lane"""
            a_off = bc.mul(bc.add(start, bc.mul(k, c64(2))), c64(2))
            lane = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=2)
            av = bc.bitcast(splat(bc, lane, v8), v16)
            return [bc.add(accs[j], bc.call(madd, [av, weights[j]])) for j in range(2)]

        panel_gemm(fn, b, args, rows=ROWS, block=BLOCK, panel=PANEL, weights=(32, 2, v16, 1),
                   accumulators=(2, v8), row_step=row_step, out_lane=i32,
                   finish=requantize_finish(args, BLOCK) if epilogue else None)
    return define_gemm


HIGH = ("ptr", "ptr")     # the byte kernel's high-bit list: starts (n + 1), entries (m, 2)


def _define_bytes(epilogue: bool = False):
    """Define ``void eqquant_avx2_bytes(A, lda, B, C, ldc, p0, p1, kquads, oblocks, starts,
    high)`` (A the rows' low 7 bits, lda bytes apart; ``split_high``'s list): as
    ``_define``'s GEMM, BYTE_ROWS pixels at a time, over the byte quads with ``vpmaddubsw``,
    each row's listed high bits then added (``correct``); with ``epilogue``,
    ``..._requantize(..., params, stride, lo, hi, valid, starts, high)``."""
    extra = (EPILOGUE if epilogue else ()) + HIGH

    @gemm_definition("eqquant_avx2_bytes" + ("_requantize" if epilogue else ""), "i8", extra)
    def define_gemm(mod, fn, args, b):
        from llvmlite import ir
        i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
        v8, v16, v32 = ir.VectorType(i32, 8), ir.VectorType(i16, 16), ir.VectorType(i8, 32)
        bytes_madd = declare(mod, "llvm.x86.avx2.pmadd.ub.sw",
                             ir.FunctionType(v16, [v32, v32]))
        madd = declare(mod, "llvm.x86.avx2.pmadd.wd", ir.FunctionType(v8, [v16, v16]))
        ones, scale = ir.Constant(v16, [1] * 16), ir.Constant(v16, [128] * 16)
        a_ptr, b_ptr, count = args[0], args[2], args[7]
        starts, high = (b.bitcast(v, i32.as_pointer()) for v in args[-2:])
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def row_step(bc, start, k, accs, weights):
            """the 4 low-bit bytes a_4k..a_4k+3 of this pixel's row, in every lane: pairs of
            products within +-32,512 (127 x 128 x 2), so vpmaddubsw cannot saturate"""
            at = bc.add(start, bc.mul(k, c64(4)))
            lane = bc.load(bc.bitcast(bc.gep(a_ptr, [at]), i32.as_pointer()), align=1)
            av = bc.bitcast(splat(bc, lane, v8), v32)
            return [bc.add(accs[j], bc.call(madd, [bc.call(bytes_madd, [av, weights[j]]),
                                                   ones])) for j in range(2)]

        def correct(bc, accs, p, ob):
            """each row's listed high bits: (quad q, its 4 high bits as bytes h) times block
            ob's byte quad q (``vpmaddubsw``: pairs of products of 0 or 1 by an int8), by
            128 (``vpmaddwd``): the quads the sums just read, in cache"""
            quads = bc.mul(ob, bc.mul(count, c64(PANEL)))
            out = []
            for r, row in enumerate(accs):
                q = bc.add(p, c64(r))
                first, end = (bc.sext(bc.load(bc.gep(starts, [bc.add(q, c64(d))]), align=4),
                                      i64) for d in (0, 1))

                def add_high(bc, i, sums):
                    at = bc.mul(i, c64(2))
                    quad = bc.sext(bc.load(bc.gep(high, [at]), align=4), i64)
                    bits = bc.load(bc.gep(high, [bc.add(at, c64(1))]), align=4)
                    hv = bc.bitcast(splat(bc, bits, v8), v32)
                    w = load_vectors(bc, b_ptr, bc.add(quads, bc.mul(quad, c64(PANEL))), 32, 2,
                                     v32, 32)
                    return [bc.add(sums[t], bc.call(madd, [bc.call(bytes_madd, [hv, w[t]]),
                                                           scale])) for t in range(2)]
                out.append(carried_loop(fn, bc, first, end, list(row), add_high, "high"))
            return out

        panel_gemm(fn, b, args, rows=BYTE_ROWS, block=BLOCK, panel=PANEL,
                   weights=(32, 2, v32, 32),
                   accumulators=(2, v8), row_step=row_step, out_lane=i32,
                   finish=requantize_finish(args, BLOCK) if epilogue else None,
                   correct=correct)
    return define_gemm


PADS = True   # any number of output channels: the last block is padded with zero weights


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K) -> [ceil(O/16)][Kp/2][16][2] int16 panels (``vnni.pack_panels``):
    one 32-byte load gives 2 k-values for 8 output channels (the 16-bit kernel's)."""
    return pack_panels(w, BLOCK, 2, np.int16)


def pack_quads(w: np.ndarray) -> np.ndarray:
    """int8 weights (O, K) -> [ceil(O/16)][Kp/4][16][4] int8 quads (the byte kernel's): one
    32-byte load gives 4 k-values for 8 output channels."""
    return pack_panels(w, BLOCK, 4, np.int8)[0]


def narrow(w: np.ndarray) -> bool:
    """Whether int8 weights are within +-NARROW, so that ``vpmaddubsw`` adds each pair of a
    row's products exactly, whatever the bytes they multiply: the byte kernel then reads
    whole bytes, nothing split or listed ("x86.avx2.w7", ``conv_requantize_narrow``)."""
    return int(np.abs(np.asarray(w, np.int64)).max(initial=0)) <= NARROW


def conv_kernel(w: np.ndarray, kp: int, name: str = "x86.avx2") -> tuple:
    """(the fused convolution, its arguments besides ``pack``'s) for weights (O, K) whose
    rows are padded to kp bytes, on the kernel the plan named: ``conv_requantize_bytes``
    with the byte quads for "x86.avx2.bytes" (rows of BYTES_FROM bytes or more:
    ``lowering``'s guard), ``conv_requantize_narrow`` with them for "x86.avx2.w7" (weights
    within +-NARROW: ``narrow``, the plan's guard, checked again here), else
    ``conv_requantize`` alone, the 16-bit kernel's launches."""
    if name == "x86.avx2.bytes" and kp >= BYTES_FROM:
        return conv_requantize_bytes, (pack_quads(w),)
    if name == "x86.avx2.w7":
        if not narrow(w):
            raise ValueError(f"eqquant: x86.avx2.w7 takes weights within +-{NARROW}")
        return conv_requantize_narrow, (pack_quads(w),)
    return conv_requantize, ()


# gemm_block(A address, lda, B address, C address, ldc, p0, p1, kpairs, oblocks).
gemm_block = gemm_intrinsic(_define(), "i8")
# gemm_requantize(..., params address, params stride, lo, hi, valid): requantized to 8 bits
gemm_requantize = gemm_intrinsic(_define(True), "i8", EPILOGUE)
# the byte kernel: bytes_block(A low bits address, lda, B address, C address, ldc, p0, p1,
# kquads, oblocks, starts address, high address), bytes_requantize(..., the epilogue's, starts,
# high)
bytes_block = gemm_intrinsic(_define_bytes(), "i8", HIGH)
bytes_requantize = gemm_intrinsic(_define_bytes(True), "i8", EPILOGUE + HIGH)
if available():
    load_gemms("avx2", [g.define for g in (gemm_block, gemm_requantize, bytes_block,
                                           bytes_requantize)])
# the 16-bit GEMMs as a kernel of the VNNI module's drivers (``vnni.gemm_kernel``'s tuple:
# their slots, block, panel, lanes, no byte mask, 16-bit rows): its grouped driver runs them
KERNEL = (*((slot_cell(gemm_block.define.symbol), slot_cell(gemm_requantize.define.symbol))
            if available() else (0, 0)), BLOCK, PANEL, 8, 0, 1)


def _define_split(mod):
    """Define (once per LLVM module) ``i64 eqquant_avx2_split_high(rows, low, n, kp, starts,
    high, cap, whole)``, ``split_high``'s work on the n rows as one run of bytes (each quad
    numbered from its row's start, or with ``whole`` nonzero from the first row's):
    each 32-byte group (then 4-byte ones, at the end) is one load, its
    low 7 bits one masked store, its high bits one ``vpmovmskb``, a mask walked quad by
    quad, the row of each quad found by counting rows up as the quads come. (A loop of
    Numba's over 4-byte words took 5x as long as widening the rows, more than the byte
    kernel saved; a loop over each row's groups, 4x for a 7 x 7 stem's rows of 148 bytes.)
    Gives up (-1) when the entries outgrow high's room, cap."""
    from llvmlite import ir
    name = "eqquant_avx2_split_high"
    if name in mod.globals:
        return mod.globals[name]
    i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
    p8 = i8.as_pointer()
    fn = ir.Function(mod, ir.FunctionType(i64, [p8, p8, i64, i64, p8, p8, i64, i64]),
                     name=name)
    fn.linkage = "linkonce_odr"
    rows, low, n, kp, starts8, high8, cap, whole = fn.args
    c32 = lambda v: ir.Constant(i32, v)  # noqa: E731
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
    bc = ir.IRBuilder(fn.append_basic_block("entry"))
    full = fn.append_basic_block("full")
    starts, high = bc.bitcast(starts8, i32.as_pointer()), bc.bitcast(high8, i32.as_pointer())
    cttz = declare(mod, "llvm.cttz.i32", ir.FunctionType(i32, [i32, i1]))

    def group(bc, at, size, state):
        """``size`` bytes at byte ``at``: low bits stored, high ones listed; the state (entry
        count m, row, the row's end) carried"""
        vt = ir.VectorType(i8, size)
        v = bc.load(bc.bitcast(bc.gep(rows, [at]), vt.as_pointer()), align=1)
        bc.store(bc.and_(v, ir.Constant(vt, [0x7F] * size)),
                 bc.bitcast(bc.gep(low, [at]), vt.as_pointer()), align=1)
        bits = bc.bitcast(bc.icmp_signed("<", v, ir.Constant(vt, [0] * size)), ir.IntType(size))
        bits = bc.zext(bits, i32) if size < 32 else bits

        def one_quad(bc, values):
            mask, m, r, end = values
            shift = bc.and_(bc.call(cttz, [mask, ir.Constant(i1, 1)]), c32(~3))
            pos = bc.add(at, bc.zext(shift, i64))

            def next_row(bc, rv):        # rows passed: each one's start is the count so far
                r1 = bc.add(rv[0], c64(1))
                bc.store(bc.trunc(m, i32), bc.gep(starts, [r1]), align=4)
                return [r1, bc.add(rv[1], kp)]
            r, end = while_loop(fn, bc, [r, end],
                                lambda bc, rv: bc.icmp_signed(">=", pos, rv[1]), next_row,
                                "rows")
            room = fn.append_basic_block("room")
            bc.cbranch(bc.icmp_signed("<", m, cap), room, full)
            bc.position_at_end(room)
            # the quad's 4 high bits, one to a byte (bit i to bit 0 of byte i)
            nibble = bc.and_(bc.lshr(mask, shift), c32(15))
            bits = bc.and_(bc.mul(nibble, c32(0x00204081)), c32(0x01010101))
            origin = bc.select(bc.icmp_signed("!=", whole, c64(0)), c64(0), bc.sub(end, kp))
            quad = bc.lshr(bc.sub(pos, origin), c64(2))
            at2 = bc.mul(m, c64(2))
            bc.store(bc.trunc(quad, i32), bc.gep(high, [at2]), align=4)
            bc.store(bits, bc.gep(high, [bc.add(at2, c64(1))]), align=4)
            rest = bc.and_(mask, bc.xor(bc.shl(c32(15), shift), c32(-1)))
            return [rest, bc.add(m, c64(1)), r, end]
        out = while_loop(fn, bc, [bits, *state],
                         lambda bc, vs: bc.icmp_unsigned("!=", vs[0], c32(0)), one_quad, "bits")
        return out[1:]

    total = bc.mul(n, kp)
    bc.store(c32(0), starts, align=4)
    state = [c64(0), c64(0), kp]
    groups = bc.sdiv(total, c64(32))
    state = carried_loop(fn, bc, c64(0), groups, state, lambda bc, g, st: group(
        bc, bc.mul(g, c64(32)), 32, st), "g32")
    tail = bc.mul(groups, c64(32))
    state = carried_loop(fn, bc, c64(0), bc.sdiv(bc.sub(total, tail), c64(4)), state,
                         lambda bc, t, st: group(bc, bc.add(tail, bc.mul(t, c64(4))), 4, st),
                         "g4")
    m, r, _ = state
    # the rows after the last listed quad's: their starts (and the end) are the count
    counted_loop(fn, bc, bc.add(r, c64(1)), bc.add(n, c64(1)), 1, "ends", lambda bc, q: bc.store(
        bc.trunc(m, i32), bc.gep(starts, [q]), align=4))
    bc.ret(m)
    bc.position_at_end(full)
    bc.ret(c64(-1))
    return fn


def _split_intrinsic():
    from numba import types
    from numba.extending import intrinsic

    def split(typingctx, rows, low, n, kp, starts, high, cap, whole):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            fn = _define_split(builder.module)
            p8 = ir.IntType(8).as_pointer()
            a = list(args)
            for i in (0, 1, 4, 5):
                a[i] = builder.inttoptr(a[i], p8)
            return builder.call(fn, a)
        return types.int64(*([types.intp] * 8)), codegen
    return intrinsic(split)


_split = _split_intrinsic()


@njit(cache=True)
def split_high(rows, low, starts, high):
    """The rows' low 7 bits into ``low`` (same shape), and the list of their high bits: row
    r's entries are high[starts[r]:starts[r + 1]], each (q, h_4q + (h_4q+1 << 8) + (h_4q+2
    << 16) + (h_4q+3 << 24)) for a quad of bytes a_4q..a_4q+3 with a high bit, h = a >> 7
    (the quad's high bits, one to a byte, little-endian as its bytes). Returns the
    number of entries, or -1 where high has too few rows for them (the chunk then takes the
    16-bit kernel). Rows and low C-contiguous, their length a multiple of 4."""
    if not (rows.flags.c_contiguous and low.flags.c_contiguous):
        raise ValueError("split_high reads and writes C-contiguous rows")
    n, kp = rows.shape
    if n == 0:
        starts[0] = 0
        return 0
    return _split(rows.ctypes.data, low.ctypes.data, n, kp, starts.ctypes.data,
                  high.ctypes.data, high.shape[0], 0)


@njit(cache=True)
def gemm(a_u8, packed, out):
    """out = a_u8 @ B (a_u8: (P, Kp) uint8, out: (P, O') int32, O' the padded width), on the
    16-bit kernel."""
    a16 = np.empty(a_u8.shape, np.int16)
    widen(a_u8, a16)
    gemm_block(a16.ctypes.data, a16.shape[1], packed.ctypes.data, out.ctypes.data,
               out.shape[1], 0, a16.shape[0], packed.shape[1], packed.shape[0])


@njit(cache=True)
def gemm_bytes(a_u8, packed, quads, out):
    """``gemm`` on the byte kernel (``quads``: ``pack_quads``'s) where the rows' high bits can
    be listed (``listed``), else on the 16-bit one; True where it took the byte kernel."""
    low, starts, high, rows16 = listed(a_u8, empties(a_u8.shape[1]))
    n = a_u8.shape[0]
    if rows16.shape[0]:
        gemm_block(rows16.ctypes.data, rows16.shape[1], packed.ctypes.data, out.ctypes.data,
                   out.shape[1], 0, n, packed.shape[1], packed.shape[0])
        return False
    bytes_block(low.ctypes.data, low.shape[1], quads.ctypes.data, out.ctypes.data,
                out.shape[1], 0, n, quads.shape[1], quads.shape[0], starts.ctypes.data,
                high.ctypes.data)
    return True


@parallel
def gemm_parallel(thread, threads, args):
    """``gemm`` over the cores, args (a_u8, packed, out): by chunks of pixels when there are
    many, by blocks of output channels when the image is small (each thread widening the
    image's few rows for itself)."""
    a_u8, packed, out = args
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    kp = a_u8.shape[1]
    if p >= 192 or oblocks == 1:
        for t in range(*share((p + 95) // 96, thread, threads)):
            p0, p1 = t * 96, min(p, t * 96 + 96)
            a16 = np.empty((p1 - p0, kp), np.int16)
            widen(a_u8[p0:p1], a16)
            gemm_block(a16.ctypes.data, kp, packed.ctypes.data, out.ctypes.data + p0 *
                       out.shape[1] * 4, out.shape[1], 0, p1 - p0, kq, oblocks)
    else:
        a16 = np.empty((p, kp), np.int16)
        widen(a_u8, a16)
        for ob in range(*share(oblocks, thread, threads)):
            gemm_block(a16.ctypes.data, kp, packed.ctypes.data + ob * kq * PANEL,
                       out.ctypes.data + ob * BLOCK * 4, out.shape[1], 0, p, kq, 1)


def gemm_call(a_u8, packed, out) -> tuple:
    """``gemm_parallel``'s launch: (kernel, args), as the VNNI paths give it."""
    return gemm_parallel, (a_u8, packed, out)


@njit(cache=True)
def _gemm_requantize(rows16, packed, ob0, ob1, out, n, params, lo, hi):
    """out[:n, ob0 * 16:ob1 * 16] (those of its columns out has) = the int16 rows times the
    packed blocks ob0..ob1, requantized in registers (out (P, O) 8-bit, channel-last)."""
    kq = packed.shape[1]
    gemm_requantize(rows16.ctypes.data, rows16.shape[1], packed.ctypes.data + ob0 * kq * PANEL,
                    out.ctypes.data + ob0 * BLOCK, out.shape[1], 0, n, kq, ob1 - ob0,
                    params.ctypes.data + ob0 * BLOCK * 8, params.shape[1], lo, hi,
                    out.shape[1] - ob0 * BLOCK)


@njit(cache=True)
def _tile(rows16, packed, ob0, ob1, o_n, params, lo, hi, p0, out):
    """out[p0:p0 + n, channels of blocks ob0..ob1] = the rows (n, kp) int16 times those
    blocks, requantized: in registers where whole vectors of 8 channels are stored, the
    blocks of a last partial vector through an int32 tile (``_finish``)."""
    n, kq = rows16.shape[0], packed.shape[1]
    whole = ob1 if o_n % 8 == 0 else min(ob1, o_n // BLOCK)
    if whole > ob0:
        _gemm_requantize(rows16, packed, ob0, whole, out[p0:], n, params, lo, hi)
    rest = max(ob0, whole)
    if rest < ob1:
        cols = (ob1 - rest) * BLOCK
        acc = np.empty((n, cols), np.int32)
        gemm_block(rows16.ctypes.data, rows16.shape[1], packed.ctypes.data + rest * kq * PANEL,
                   acc.ctypes.data, cols, 0, n, kq, ob1 - rest)
        _finish(acc, min(cols, o_n - rest * BLOCK), params, lo, hi, rest * BLOCK, p0, out)


@njit(cache=True)
def _tile_bytes(low, starts, high, rows16, packed, quads, ob0, ob1, o_n, params, lo, hi, p0,
                out):
    """``_tile`` on the 16-bit kernel where ``rows16`` holds the rows (n, kp), else on the
    byte kernel (``low`` their low 7 bits, ``starts`` (n + 1) and ``high`` their high bits:
    ``split_or_widen``'s)."""
    if rows16.shape[0]:
        _tile(rows16, packed, ob0, ob1, o_n, params, lo, hi, p0, out)
        return
    n, kq = low.shape[0], quads.shape[1]
    whole = ob1 if o_n % 8 == 0 else min(ob1, o_n // BLOCK)
    if whole > ob0:
        bytes_requantize(low.ctypes.data, low.shape[1], quads.ctypes.data + ob0 * kq * PANEL,
                         out.ctypes.data + p0 * out.shape[1] + ob0 * BLOCK, out.shape[1], 0, n,
                         kq, whole - ob0, params.ctypes.data + ob0 * BLOCK * 8,
                         params.shape[1], lo, hi, out.shape[1] - ob0 * BLOCK,
                         starts.ctypes.data, high.ctypes.data)
    rest = max(ob0, whole)
    if rest < ob1:
        cols = (ob1 - rest) * BLOCK
        acc = np.empty((n, cols), np.int32)
        bytes_block(low.ctypes.data, low.shape[1], quads.ctypes.data + rest * kq * PANEL,
                    acc.ctypes.data, cols, 0, n, kq, ob1 - rest, starts.ctypes.data,
                    high.ctypes.data)
        _finish(acc, min(cols, o_n - rest * BLOCK), params, lo, hi, rest * BLOCK, p0, out)


@njit(cache=True)
def high_quad_share(nhwc):
    """The share of C-contiguous rows' 4-byte words (quads) with a high bit, from up to
    SAMPLES of them spread over the rows (each read as one 32-bit word): rows of
    1/TRY_BELOW or more take the 16-bit kernel without trying to list their high bits (a
    chunk that gives up costs its listing besides the widening, 5-8% more than the 16-bit
    kernel alone). Sampled in each chunk's rows, gathered or about to be read: sampled in
    the image before the convolution, the words came from the other core's cache, and
    MobileNet-v2 took 3-14% longer (measured while the 16-bit GEMM was slowed by the loop
    order ``llvm_loops.carried_loop`` fixes)."""
    flat = nhwc.reshape(nhwc.size)
    words = flat[:flat.size // 4 * 4].view(np.uint32)
    if words.size == 0:
        return 0.0
    step = max(1, words.size // SAMPLES)
    hits = seen = 0
    for i in range(0, words.size, step):
        hits += (words[i] & 0x80808080) != 0
        seen += 1
    return hits / seen


@njit(cache=True)
def split_or_widen(rows, none):
    """A chunk's rows for the byte kernel (``split_high``'s low bits, starts and high list,
    and ``none[3]``, an empty int16 array), or for the 16-bit kernel (``none[:3]``, empty
    arrays, and the rows widened): where they have fewer than BYTES_FROM bytes, where a
    sample of their quads is high in 1/TRY_BELOW or more (``high_quad_share``), or
    where their list outgrows its room (``listed``)."""
    if rows.shape[1] >= BYTES_FROM and high_quad_share(rows) * TRY_BELOW < 1:
        return listed(rows, none)
    return widened(rows, none)


@njit(cache=True)
def listed(rows, none):
    """``split_or_widen``'s operands of the byte kernel, room for the high bits of 1 /
    HIGH_SHARE of the quads (``split_high``), or of the 16-bit kernel where that is too
    little."""
    n, kp = rows.shape
    low = np.empty((n, kp), np.uint8)
    starts = np.empty(n + 1, np.int32)
    high = np.empty((n * (kp // (4 * HIGH_SHARE)), 2), np.int32)
    if split_high(rows, low, starts, high) >= 0:
        return low, starts, high, none[3]
    return widened(rows, none)


@njit(cache=True)
def widened(rows, none):
    """``split_or_widen``'s operands of the 16-bit kernel: the rows widened to int16."""
    rows16 = np.empty(rows.shape, np.int16)
    widen(rows, rows16)
    return none[0], none[1], none[2], rows16


@njit(cache=True)
def empties(kp):
    """``split_or_widen``'s empty arrays for rows of kp bytes (made once per call, not per
    chunk)."""
    return (np.empty((0, kp), np.uint8), np.empty(0, np.int32), np.empty((0, 2), np.int32),
            np.empty((0, kp), np.int16))


def _conv_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, params, lo, hi, out,
               threads, res, add):
    """``conv_requantize``'s plan (``launch.Driver``): a whole fused int8 convolution of a
    batch in one launch of its work items (``_conv_items``; as ``vnni.conv_requantize``: out
    (N, oh*ow, O), channel-last; a residual ``res`` summed with each item's tile): gather a
    chunk of pixels' windows, widen them, multiply and requantize in registers (``_tile``).
    A lone image's rows are gathered and widened once, by launches before the items."""
    kp = packed.shape[1] * 2
    work, shared, counters, fill = plan_shares(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow,
                                               oh * ow, packed.shape[0], threads, kp)
    lone = work[0] != 0
    wide = memory.empty((shared.shape[0] if lone else 0, kp), np.int16)
    launches = [] if fill is None else [(*fill, None)]
    if lone:
        launches.append((widen_rows.serial, (shared, wide), None))
    launches.append((_conv_items, (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed,
                                   params, lo, hi, out, res, add, work, shared, counters,
                                   wide), threads))
    return launches


@parallel
def widen_rows(thread, threads, args):
    """``gather.widen`` of rows (n, kp) uint8 into int16 rows, the rows shared out."""
    rows_u8, rows16 = args
    lo, hi = share(rows_u8.shape[0], thread, threads)
    widen(rows_u8[lo:hi], rows16[lo:hi])


@parallel
def _conv_items(thread, threads, args):
    """The work items of ``conv_requantize`` one thread takes (``gather.next_share``)."""
    (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, params, lo, hi, out, res, add,
     work, shared, counters, wide) = args
    o_n, kp = out.shape[2], packed.shape[1] * 2
    lone = work[0] != 0
    while True:
        b, ob0, ob1, p0, p1 = next_share(counters, thread, work)
        if b < 0:
            break
        if lone:
            rows16 = wide[p0:p1]
        else:
            rows = share_rows(nhwc[b], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1, kp,
                              shared)
            rows16 = np.empty((rows.shape[0], kp), np.int16)
            widen(rows, rows16)
        n = rows16.shape[0]
        _tile(rows16, packed, ob0, ob1, o_n, params, lo, hi, p0, out[b])
        add_residual(out, res, b, p0, n, ob0 * BLOCK, min(ob1 * BLOCK, o_n), add, lo, hi)
    release(counters)


conv_requantize = Driver(_conv_plan, (windows, widen_rows, _conv_items))


# -- attention's products: two computed operands on the 16-bit GEMM (qnn.batch_matmul) --------

PAIR_ROWS = 48   # rows of a product a work item (8 steps of ROWS)


@parallel
def pair_pack(thread, threads, args):
    """qnn.batch_matmul's b less its zero point as the 16-bit GEMM's panels (``pack``'s
    layout, [B][ceil(N/16)][Kp/2][16][2] int16, zeros past N and K), a block of 16 columns a
    unit: b is (B, N, K) where ``dot`` (q @ k^T, its rows dotted with a's), else (B, K, N).
    Exact: an 8-bit value less a zero point of 15 bits or fewer fits int16 (the plan's
    guard)."""
    b, zeros_b, dot, panels = args
    zb = np.int32(zeros_b[0])
    nb, blocks = panels.shape[0], panels.shape[1]
    n = b.shape[1] if dot else b.shape[2]
    k = b.shape[2] if dot else b.shape[1]
    for t in range(*share(nb * blocks, thread, threads)):
        bi, ob = t // blocks, t % blocks
        panel = panels[bi, ob]
        panel[:] = 0
        for j in range(min(BLOCK, n - ob * BLOCK)):
            col = ob * BLOCK + j
            for kx in range(k):
                v = b[bi, col, kx] if dot else b[bi, kx, col]
                panel[kx >> 1, j, kx & 1] = np.int32(v) - zb


@parallel
def pair_products(thread, threads, args):
    """qnn.batch_matmul on the 16-bit GEMM: out[bi, i, j] = sum over k of (a[bi, i, k] -
    za) * (b - zb), b as ``pair_pack`` made its panels; a work item PAIR_ROWS rows of one
    product, its rows less their zero point widened to int16 (zeros past K), their sums
    (vpmaddwd: exact, an int32 pair of products of 16-bit numbers) into the output's rows,
    through a tile where the output's width is no multiple of 16. a is (B, M, K), any
    strides (a transposed operand's view)."""
    a, zeros_a, panels, out = args
    za = np.int32(zeros_a[0])
    nb, m, n = out.shape
    k = a.shape[2]
    blocks, kq = panels.shape[1], panels.shape[2]
    chunks = (m + PAIR_ROWS - 1) // PAIR_ROWS
    rows16 = np.zeros((PAIR_ROWS, 2 * kq), np.int16)
    tile = np.empty((PAIR_ROWS if n % BLOCK else 0, blocks * BLOCK), np.int32)
    for t in range(*share(nb * chunks, thread, threads)):
        bi, c = t // chunks, t % chunks
        p0 = c * PAIR_ROWS
        rows = min(m, p0 + PAIR_ROWS) - p0
        for p in range(rows):
            for kx in range(k):
                rows16[p, kx] = np.int32(a[bi, p0 + p, kx]) - za
        if n % BLOCK == 0:
            gemm_block(rows16.ctypes.data, 2 * kq, panels[bi].ctypes.data,
                       out[bi, p0:].ctypes.data, n, 0, rows, kq, blocks)
        else:
            gemm_block(rows16.ctypes.data, 2 * kq, panels[bi].ctypes.data, tile.ctypes.data,
                       blocks * BLOCK, 0, rows, kq, blocks)
            for p in range(rows):
                for j in range(n):
                    out[bi, p0 + p, j] = tile[p, j]


# -- grouped convolutions: each set of groups one block-diagonal GEMM (``vnni``'s driver) -----

GROUPED = True    # runs grouped convolutions on the 16-bit GEMM, a set of groups a GEMM


def group_span(groups: int, per_group: int) -> int:
    """The groups one GEMM takes together (``gather.group_span``, on blocks of 16)."""
    return gather_group_span(groups, per_group, BLOCK)


def stores_set(span_o: int) -> bool:
    """Whether a set of ``span_o`` outputs is stored from registers: in whole vectors
    (``KERNEL``'s lanes; AVX2 has no byte mask)."""
    return span_o % KERNEL[4] == 0


def grouped_kernel(sets: int, span_o: int) -> tuple:
    """(``vnni.grouped_requantize``, its arguments besides ``pack``'s), as ``conv_kernel``:
    the drivers' one grouped driver, on this module's 16-bit GEMMs (``KERNEL``)."""
    if not KERNEL[1]:
        raise RuntimeError("eqquant: this CPU does not run AVX2 (the target offers only the "
                           "kernels it runs)")
    return grouped_requantize, (KERNEL, sets, span_o)


def _bytes_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, quads, params, lo,
                hi, out, threads, res, add):
    """``conv_requantize_bytes``'s plan (``launch.Driver``): ``conv_requantize``'s, on the byte
    kernel (``quads``: ``pack_quads``'s weights) wherever a chunk's high bits can be listed
    and on the 16-bit kernel where they cannot (``split_or_widen``: rows whose sampled quads
    are high in 1/TRY_BELOW or more, or whose list outgrows its room), chunk by chunk, in
    the work items (``_bytes_items``). A lone image's rows, gathered once, are split once
    (``split_rows``) before the items. Either way the sums are exact: the choice is speed."""
    kp = packed.shape[1] * 2
    work, shared, counters, fill = plan_shares(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow,
                                               oh * ow, packed.shape[0], threads, kp)
    n = shared.shape[0] if work[0] != 0 else 0
    lone = (memory.empty((n, kp), np.uint8), memory.empty((n + 1,), np.int32),
            memory.empty((n * (kp // (4 * HIGH_SHARE)) + 1, 2), np.int32),
            memory.empty((n, kp), np.int16), memory.empty((1,), np.int64))
    launches = [] if fill is None else [(*fill, None)]
    if n:
        launches.append((split_rows.serial, (shared, *lone), None))
    launches.append((_bytes_items, (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed,
                                    quads, params, lo, hi, out, res, add, work, shared,
                                    counters, *lone, np.zeros(1, np.int64)), threads))
    return launches


@parallel
def split_rows(thread, threads, args):
    """A lone image's rows for the byte kernel, split once (their low bits, starts and high
    list; ``taken[0]`` 1), or, where the list outgrows its room or a sample of their quads
    is high in 1/TRY_BELOW or more, widened for the 16-bit kernel (``taken[0]`` 0)."""
    rows, low, starts, high, wide, taken = args
    taken[0] = 0
    if high_quad_share(rows) * TRY_BELOW < 1 and split_high(rows, low, starts, high) >= 0:
        taken[0] = 1
    else:
        widen(rows, wide)


@parallel
def _bytes_items(thread, threads, args):
    """The work items of ``conv_requantize_bytes`` one thread takes (``gather.next_share``),
    each on the byte kernel or the 16-bit one (``split_or_widen``, or ``split_rows``'s
    choice for a lone image)."""
    (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, quads, params, lo, hi, out,
     res, add, work, shared, counters, low1, starts1, high1, wide1, taken, narrow) = args
    o_n, kp = out.shape[2], packed.shape[1] * 2
    lone = work[0] != 0
    none = empties(kp)
    while True:
        b, ob0, ob1, p0, p1 = next_share(counters, thread, work)
        if b < 0:
            break
        if lone and taken[0]:
            _tile_bytes(low1[p0:p1], starts1[p0:p1 + 1], high1, none[3], packed, quads, ob0,
                        ob1, o_n, params, lo, hi, p0, out[b])
        elif lone:
            _tile(wide1[p0:p1], packed, ob0, ob1, o_n, params, lo, hi, p0, out[b])
        else:
            rows = share_rows(nhwc[b], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1, kp,
                              shared)
            if narrow[0]:       # (7-bit weights: whole bytes, no high bit listed)
                low, starts, high, rows16 = rows, np.zeros(p1 - p0 + 1, np.int32), none[2], \
                    none[3]
            else:
                low, starts, high, rows16 = split_or_widen(rows, none)
            _tile_bytes(low, starts, high, rows16, packed, quads, ob0, ob1, o_n, params, lo,
                        hi, p0, out[b])
        add_residual(out, res, b, p0, p1 - p0, ob0 * BLOCK, min(ob1 * BLOCK, o_n), add, lo,
                     hi)
    release(counters)


conv_requantize_bytes = Driver(_bytes_plan, (windows, split_rows, _bytes_items))


def _narrow_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, quads, params, lo,
                 hi, out, threads, res, add):
    """``conv_requantize_narrow``'s plan (``launch.Driver``): ``conv_requantize_bytes``'s work
    items on the byte kernel over whole bytes, for weights within +-NARROW (``narrow``):
    every pair of products fits ``vpmaddubsw``'s int16, so no chunk is split, listed or
    widened, and the sums are exact. A lone image's rows, gathered once before the items,
    are read as they are (no high bit listed: its starts all 0)."""
    kp = packed.shape[1] * 2
    work, shared, counters, fill = plan_shares(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow,
                                               oh * ow, packed.shape[0], threads, kp)
    n = shared.shape[0] if work[0] != 0 else 0
    lone = (shared if n else memory.empty((0, kp), np.uint8), np.zeros(n + 1, np.int32),
            memory.empty((1, 2), np.int32), memory.empty((0, kp), np.int16),
            np.ones(1, np.int64))
    launches = [] if fill is None else [(*fill, None)]
    launches.append((_bytes_items, (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed,
                                    quads, params, lo, hi, out, res, add, work, shared,
                                    counters, *lone, np.ones(1, np.int64)), threads))
    return launches


conv_requantize_narrow = Driver(_narrow_plan, (windows, _bytes_items))
