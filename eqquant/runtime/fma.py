"""An fp32 GEMM on AVX2 with FMA, for the float convolutions: LLVM IR written with llvmlite and
emitted into Numba kernels through an intrinsic, as the int8 GEMMs are (``avx2.py``).

    C[p, o] = sum_k A[p, k] * B[k, o]     A, B, C float32

B is packed once as [O/16][K][16] (the last block padded with zero weights): one k gives two
8-lane vectors of 16 output channels. The micro-kernel keeps 6 pixels x 16 channels in 12
accumulators; each step broadcasts one value of A per pixel and does 12 fused multiply-adds.
A convolution gathers each chunk of pixels' windows from the channel-last image into rows,
multiplies them and adds the bias and activation in the same parallel region. The sums run
in another order than im2col + BLAS does: results agree with the reference to float32
rounding (the tests' tolerance), not bit for bit.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .llvm_loops import counted_loop, reduction_loop
from .vnni import _windows

BLOCK = 16
ROWS = 6


@lru_cache(maxsize=1)
def available() -> bool:
    try:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        features = llvm.get_host_cpu_features()
        return bool(features.get("avx2") and features.get("fma"))
    except Exception:  # noqa: BLE001 - no llvmlite, an odd platform: keep BLAS
        return False


def define_sgemm(mod):
    """``void eqquant_fma_sgemm(A, lda, B, C, ldc, p0, p1, k, oblocks)`` (A, B, C float32;
    lda and ldc in elements)."""
    from llvmlite import ir
    f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
    fp = f32.as_pointer()
    v8 = ir.VectorType(f32, 8)
    name = "eqquant_fma_sgemm"
    if name in mod.globals:
        return mod.globals[name]
    fma = mod.globals.get("llvm.fma.v8f32") or ir.Function(
        mod, ir.FunctionType(v8, [v8, v8, v8]), name="llvm.fma.v8f32")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [fp, i64, fp, fp, i64, i64, i64, i64,
                                                          i64]), name=name)
    fn.linkage = "linkonce_odr"
    a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, kk, oblocks = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

    def micro(bc, p, ob, rows):
        def step(bc, k, accs):
            at = bc.add(bc.mul(ob, bc.mul(kk, c64(BLOCK))), bc.mul(k, c64(BLOCK)))
            bvs = [bc.load(bc.bitcast(bc.gep(b_ptr, [bc.add(at, c64(8 * j))]),
                                      v8.as_pointer()), align=4) for j in range(2)]
            new = []
            for r in range(rows):
                a = bc.load(bc.gep(a_ptr, [bc.add(bc.mul(bc.add(p, c64(r)), lda), k)]),
                            align=4)
                av = bc.insert_element(ir.Constant(v8, ir.Undefined), a, ir.Constant(i32, 0))
                av = bc.shuffle_vector(av, ir.Constant(v8, ir.Undefined), ir.Constant(
                    ir.VectorType(i32, 8), [0] * 8))
                new.append([bc.call(fma, [av, bvs[j], accs[r][j]]) for j in range(2)])
            return new
        accs = reduction_loop(fn, bc, kk, rows, 2, v8, step)
        for r in range(rows):
            for j in range(2):
                off = bc.add(bc.mul(bc.add(p, c64(r)), ldc),
                             bc.add(bc.mul(ob, c64(BLOCK)), c64(8 * j)))
                bc.store(accs[r][j], bc.bitcast(bc.gep(c_ptr, [off]), v8.as_pointer()),
                         align=4)

    def per_block(bb, ob):
        last = counted_loop(fn, bb, p0, p1, ROWS, "pg", lambda bc, p: micro(bc, p, ob, ROWS))
        counted_loop(fn, bb, last, p1, 1, "p1", lambda bc, p: micro(bc, p, ob, 1))

    counted_loop(fn, b, c64(0), oblocks, 1, "ob", per_block)
    b.ret_void()
    return fn


def pack(w: np.ndarray) -> np.ndarray:
    """float32 weights (O, K) -> B packed [ceil(O/16)][K][16] (zero rows pad the last block)."""
    o, k = w.shape
    op = -(-o // BLOCK) * BLOCK
    padded = np.zeros((op, k), np.float32)
    padded[:o] = w
    return np.ascontiguousarray(padded.reshape(op // BLOCK, BLOCK, k).transpose(0, 2, 1))


@intrinsic
def sgemm_block(typingctx, a, lda, b, c, ldc, p0, p1, k, oblocks):
    sig = types.void(types.intp, types.intp, types.intp, types.intp, types.intp, types.intp,
                     types.intp, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        fn = define_sgemm(builder.module)
        fp = ir.FloatType().as_pointer()
        a_, lda_, b_, c_, ldc_, p0_, p1_, k_, ob_ = args
        builder.call(fn, [builder.inttoptr(a_, fp), lda_, builder.inttoptr(b_, fp),
                          builder.inttoptr(c_, fp), ldc_, p0_, p1_, k_, ob_])
        return context.get_dummy_value()
    return sig, codegen


@njit(cache=True)
def sgemm(a, packed, out):
    """out (P, O') = a (P, K) @ B, O' the padded width."""
    sgemm_block(a.ctypes.data, a.shape[1], packed.ctypes.data, out.ctypes.data, out.shape[1],
                0, a.shape[0], packed.shape[1], packed.shape[0])


@njit(parallel=True, cache=True)
def conv(hwc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, packed, bias, act, lo, hi, out):
    """A float convolution of one image in one parallel region: hwc (H, W, C) float32 ->
    out (O, oh*ow): windows, GEMM, bias and activation (0 none, 1 relu, 2 clip to [lo, hi])
    a chunk of pixels at a time."""
    p_n = oh * ow
    o_n = out.shape[0]
    oblocks, k = packed.shape[0], packed.shape[1]
    width = oblocks * BLOCK
    for item in prange((p_n + 95) // 96):
        p0 = item * 96
        n = min(p_n, p0 + 96) - p0
        rows = np.empty((n, k), np.float32)
        _windows(hwc, kh, kw, sh, sw, pt, pl, dh, dw, np.float32(0.0), ow, p0, rows)
        acc = np.empty((n, width), np.float32)
        sgemm_block(rows.ctypes.data, k, packed.ctypes.data, acc.ctypes.data, width, 0, n, k,
                    oblocks)
        for o in range(o_n):
            b = bias[o]
            for r in range(n):
                v = acc[r, o] + b
                if act == 1:
                    v = max(v, np.float32(0.0))
                elif act == 2:
                    v = min(max(v, lo), hi)
                out[o, p0 + r] = v
