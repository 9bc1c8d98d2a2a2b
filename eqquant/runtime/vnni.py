"""An int8 GEMM on AVX512-VNNI (``vpdpbusd``): LLVM IR written with llvmlite, emitted into
Numba-compiled kernels through an intrinsic (so they cache like any other Numba kernel).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

``vpdpbusd`` multiplies 4 unsigned bytes of A by 4 signed bytes of B and adds the four products
into one int32 lane, 16 lanes at a time. B is packed once as [O/64][K/4][64][4] (K padded to a
multiple of 4, O a multiple of 64): one 64-byte load gives 4 k-values for 16 output channels,
and each block of 64 channels is one contiguous panel that stays in cache. The micro-kernel
keeps 6 pixels x 64 channels in 24 accumulators, so each weight load feeds 6 ``vpdpbusd``; an
int8 activation x is fed as the byte x + 128 and the product corrected by 128 * sum_k B[k, o]
(see ``pack``).

``available()`` says whether the host CPU has VNNI; callers keep the portable kernels for the
rest (a kernel using ``gemm_block`` is only compiled when it is called).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .llvm_loops import counted_loop

from .kernels_int8 import requantize_acc

BLOCK = 64  # output channels per register block (4 x 16 lanes)
PADS = False  # the output channels must be a multiple of BLOCK


@lru_cache(maxsize=1)
def available() -> bool:
    try:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        return bool(llvm.get_host_cpu_features().get("avx512vnni"))
    except Exception:  # noqa: BLE001 - no llvmlite, an odd platform: use the portable path
        return False


ROWS = 6    # pixels per micro-kernel step: 6 x 4 accumulators + 4 weight vectors in zmm


def define_gemm(mod):
    """Define (once per LLVM module) ``void eqquant_vnni_gemm(A, lda, B, C, ldc, p0, p1, kq,
    oblocks)``: for each block of 64 output
    channels (its packed weights contiguous, kept in cache), the pixels p0..p1 go ROWS at a
    time: each step loads 4 weight vectors (64 channels x 4 k) once and uses them for ROWS
    broadcast pixels, ROWS x 4 ``vpdpbusd``; leftover pixels go one at a time."""
    from llvmlite import ir
    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    name = "eqquant_vnni_gemm"
    if name in mod.globals:
        return mod.globals[name]
    dp = mod.globals.get("llvm.x86.avx512.vpdpbusd.512") or ir.Function(
        mod, ir.FunctionType(v16, [v16, v16, v16]), name="llvm.x86.avx512.vpdpbusd.512")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i64, i8p, i8p, i64, i64, i64,
                                                          i64, i64]), name=name)
    fn.linkage = "linkonce_odr"      # each Numba module that calls it carries a copy
    a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, kq, oblocks = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
    zeros = ir.Constant(v16, None)

    def loop(builder, start, stop, step, name, body):
        return counted_loop(fn, builder, start, stop, step, name, body)

    def micro(bc, p, ob, rows):
        """rows pixels from p times the 64 channels of block ob, over all of k."""
        pre = bc.block
        head = fn.append_basic_block("k.head")
        work = fn.append_basic_block("k.body")
        done = fn.append_basic_block("k.done")
        bc.branch(head)
        bc.position_at_end(head)
        k = bc.phi(i64, name="k")
        k.add_incoming(c64(0), pre)
        accs = [[bc.phi(v16) for _ in range(4)] for _ in range(rows)]
        for row in accs:
            for acc in row:
                acc.add_incoming(zeros, pre)
        bc.cbranch(bc.icmp_signed("<", k, kq), work, done)
        bc.position_at_end(work)
        panel = bc.mul(ob, bc.mul(kq, c64(BLOCK * 4)))          # this block's weights
        at = bc.add(panel, bc.mul(k, c64(BLOCK * 4)))
        bvs = [bc.load(bc.bitcast(bc.gep(b_ptr, [bc.add(at, c64(64 * j))]),
                                  v16.as_pointer()), align=1) for j in range(4)]
        new = []
        for r in range(rows):
            a_off = bc.add(bc.mul(bc.add(p, c64(r)), lda), bc.mul(k, c64(4)))
            a32 = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=1)
            av = bc.insert_element(ir.Constant(v16, ir.Undefined), a32, ir.Constant(i32, 0))
            av = bc.shuffle_vector(av, ir.Constant(v16, ir.Undefined),
                                   ir.Constant(v16, [0] * 16))
            new.append([bc.call(dp, [accs[r][j], av, bvs[j]]) for j in range(4)])
        k.add_incoming(bc.add(k, c64(1)), bc.block)
        for r in range(rows):
            for j in range(4):
                accs[r][j].add_incoming(new[r][j], bc.block)
        bc.branch(head)
        bc.position_at_end(done)
        c32 = bc.bitcast(c_ptr, i32.as_pointer())
        for r in range(rows):
            for j in range(4):
                off = bc.add(bc.mul(bc.add(p, c64(r)), ldc),
                             bc.add(bc.mul(ob, c64(BLOCK)), c64(16 * j)))
                bc.store(accs[r][j], bc.bitcast(bc.gep(c32, [off]), v16.as_pointer()),
                         align=4)

    def per_block(bb, ob):
        last = loop(bb, p0, p1, ROWS, "pg", lambda bc, p: micro(bc, p, ob, ROWS))
        loop(bb, last, p1, 1, "p1", lambda bc, p: micro(bc, p, ob, 1))

    loop(b, c64(0), oblocks, 1, "ob", per_block)
    b.ret_void()
    return fn


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K), O a multiple of 64 -> (B packed [O/64][K/4][64][4]: each block of
    64 output channels contiguous, 128 * column sums (O,), K padded to a multiple of 4)."""
    o, k = w.shape
    kp = -(-k // 4) * 4
    padded = np.zeros((o, kp), np.int8)
    padded[:, :k] = w
    packed = np.ascontiguousarray(
        padded.reshape(o // BLOCK, BLOCK, kp // 4, 4).transpose(0, 2, 1, 3))
    return packed, (128 * w.astype(np.int32).sum(axis=1)).astype(np.int32), kp


@intrinsic
def gemm_block(typingctx, a, lda, b, c, ldc, p0, p1, kq, oblocks):
    """gemm_block(A address, lda, B address, C address, ldc, p0, p1, kq, oblocks): C rows
    p0..p1 = A rows times the packed B (``oblocks`` panels of ``kq`` x 64 x 4 bytes)."""
    sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp,
                     types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        fn = define_gemm(builder.module)
        i8p = ir.IntType(8).as_pointer()
        a_, lda_, b_, c_, ldc_, p0_, p1_, kq_, ob_ = args
        builder.call(fn, [builder.inttoptr(a_, i8p), lda_, builder.inttoptr(b_, i8p),
                          builder.inttoptr(c_, i8p), ldc_, p0_, p1_, kq_, ob_])
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True)
def gemm(a_u8, packed, out, p0=0, p1=-1, ob0=0, ob1=-1):
    """out[p, :] = a_u8[p, :] @ B for rows p0..p1 (a_u8: (P, Kp) uint8, out: (P, O) int32),
    for the blocks of 64 output channels ob0..ob1 (all by default)."""
    oblocks, kq = packed.shape[0], packed.shape[1]
    p1 = a_u8.shape[0] if p1 < 0 else p1
    ob1 = oblocks if ob1 < 0 else ob1
    gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data + ob0 * kq * 256,
               out.ctypes.data + ob0 * 256, out.shape[1], p0, p1, kq, ob1 - ob0)


@njit(parallel=True, cache=True)
def gemm_parallel(a_u8, packed, out):
    """``gemm`` over the cores: by chunks of pixels when there are many, by output blocks when
    the image is small (a 7x7 layer has 49 pixels)."""
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    if p >= 192 or oblocks == 1:
        chunks = (p + 95) // 96
        for t in prange(chunks):
            gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data, out.ctypes.data,
                       out.shape[1], t * 96, min(p, t * 96 + 96), kq, oblocks)
    else:
        for ob in prange(oblocks):
            gemm_block(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data + ob * kq * 256,
                       out.ctypes.data + ob * 256, out.shape[1], 0, p, kq, 1)




@njit(cache=True)
def _finish(acc, add, clamp_lo, clamp_hi, multipliers, left, total, half, zin, zout, lo, hi,
            o0, p0, out):
    """acc (n, cols) int32 for channels o0.. and pixels p0.. -> out[o, p] 8-bit: minus the
    zero-point correction, plus the bias (both in ``add``), clamped per channel (relu, clip or
    nothing), requantized with UPWARD fixed point as ``kernels_int8.requantize`` does. Each
    row is computed along the channels (contiguous), then written out transposed."""
    n, cols = acc.shape
    buf = np.empty((n, cols), np.int64)
    for r in range(n):
        row = buf[r]
        for oc in range(cols):
            o = o0 + oc
            row[oc] = requantize_acc(np.int64(acc[r, oc]) + add[o], clamp_lo[o], clamp_hi[o],
                                     zin, left[o], multipliers[o], half[o], total[o], zout, lo,
                                     hi)
    for oc in range(cols):
        for r in range(n):
            out[o0 + oc, p0 + r] = buf[r, oc]


@njit(cache=True)
def _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows):
    """Pixel rows p0.. of the image's windows (taps in (tap, channel) order, ``pad`` outside
    the image, zeros in the padding of K) into ``rows`` (n, Kp)."""
    h, w, c_in = hwc.shape
    n, kp = rows.shape
    k = kh * kw * c_in
    span = kw * c_in
    flat = hwc.reshape(h, w * c_in)      # one image row: its pixels' channels, contiguous
    for r in range(n):
        y = (p0 + r) // ow
        xo = (p0 + r) - y * ow
        for i in range(kh):
            iy = y * sh - pt + i * dh
            ix0 = xo * sw - pl
            if dw == 1 and iy >= 0 and iy < h and ix0 >= 0 and ix0 + kw <= w:
                # the kernel row lies inside the image: one contiguous copy of kw pixels
                src = flat[iy, ix0 * c_in:ix0 * c_in + span]
                dst = rows[r, i * span:(i + 1) * span]
                for t in range(span):
                    dst[t] = src[t]
                continue
            for j in range(kw):
                ix = xo * sw - pl + j * dw
                base = (i * kw + j) * c_in
                if iy >= 0 and iy < h and ix >= 0 and ix < w:
                    for c in range(c_in):
                        rows[r, base + c] = hwc[iy, ix, c]
                else:
                    for c in range(c_in):
                        rows[r, base + c] = pad
        for c in range(k, kp):
            rows[r, c] = 0


@njit(parallel=True, cache=True)
def windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, rows):
    """All pixel rows of an image's windows (``_windows``), chunks of 96 rows in parallel."""
    n = rows.shape[0]
    for t in prange((n + 95) // 96):
        p0 = t * 96
        _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows[p0:min(n, p0 + 96)])


@njit(parallel=True, cache=True)
def conv_requantize(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, correction, bias,
                    clamp_lo, clamp_hi, multipliers, shifts, zin, zout, lo, hi, out):
    """A whole fused int8 convolution of one image in one parallel region: hwc (H, W, C)
    uint8 -> out (O, oh*ow) 8-bit. Each work item gathers a chunk of pixels' windows into
    rows, multiplies them (``gemm_block``) and finishes them (``_finish``), so the worker
    threads wake once per convolution; a small image
    (fewer than 192 pixels) has its rows gathered once and is split by blocks of 64
    channels instead."""
    p_n = oh * ow
    o_n = out.shape[0]
    oblocks, kq = packed.shape[0], packed.shape[1]
    kp = kq * 4
    add = np.empty(o_n, np.int64)
    left = np.empty(o_n, np.int64)
    total = np.empty(o_n, np.int64)
    half = np.empty(o_n, np.int64)
    for o in range(o_n):
        add[o] = np.int64(bias[o]) - correction[o]
        left[o] = max(shifts[o], 0)
        total[o] = max(-shifts[o], 0) + 31
        half[o] = np.int64(1) << (total[o] - 1)
    if p_n >= 192 or oblocks == 1:
        chunk = 96
        for item in prange((p_n + chunk - 1) // chunk):
            p0 = item * chunk
            n = min(p_n, p0 + chunk) - p0
            rows = np.empty((n, kp), np.uint8)
            _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, rows)
            acc = np.empty((n, o_n), np.int32)
            gemm_block(rows.ctypes.data, kp, packed.ctypes.data, acc.ctypes.data, o_n, 0, n,
                       kq, oblocks)
            _finish(acc, add, clamp_lo, clamp_hi, multipliers, left, total, half, zin, zout,
                    lo, hi, 0, p0, out)
    else:
        rows = np.empty((p_n, kp), np.uint8)
        _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, 0, rows)
        for ob in prange(oblocks):
            acc = np.empty((p_n, 64), np.int32)
            gemm_block(rows.ctypes.data, kp, packed.ctypes.data + ob * kq * 256,
                       acc.ctypes.data, 64, 0, p_n, kq, 1)
            _finish(acc, add, clamp_lo, clamp_hi, multipliers, left, total, half, zin, zout,
                    lo, hi, ob * 64, 0, out)
