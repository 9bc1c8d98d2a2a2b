"""An int8 GEMM on AMX tiles (``tdpbusd``, Intel's Advanced Matrix Extensions): LLVM IR
written with llvmlite, compiled once as C functions that Numba-compiled kernels call through
an intrinsic (``llvm_loops.load_gemms``), like ``vnni.py``, whose interface, weight panels
and drivers it shares.

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

A tile is 16 rows of 64 bytes. ``tdpbusd`` multiplies a tile of A (16 pixels x 64 bytes of
their rows) by a tile of B (16 k-quads x 16 channels x 4 bytes, the VNNI layout) and adds
each 4 products of an unsigned and a signed byte into the int32 sums of a third tile (16
pixels x 16 channels): exact, as ``vpdpbusd``, 16 x 16 x 64 products an instruction. The
weights are packed as ``vnni.pack``'s panels ([O/64][K/4][64][4]) with K padded to a
multiple of 64, a B tile being 16 of a panel's k-quad rows (256 bytes apart) of 16 channels.
Per block of 64 channels, the pixels go 16 at a time: four tiles of sums (16 pixels x 64
channels), one tile of A loaded per 64 bytes of the rows and multiplied by the block's four
B tiles: six of the eight tiles. A chunk's last, partial group of pixels takes tiles of
fewer rows: the shape is set per group, before its sums start (configuring the tiles,
``ldtilecfg``, which LLVM places, clears them). The sums are stored to C, or to a tile of the
stack and requantized from there, row by row, by ``vnni.py``'s epilogue
(``vnni.requantize_finish``): the same bits. Which layers take the tiles: ``suits``.

Linux gives a process the AMX state only when it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)``): ``available()`` asks once, and is False where the CPU lacks AMX-INT8
or the system refuses; the VNNI kernels then run. The drivers are ``vnni.py``'s, handed this
module's GEMMs (``KERNEL``).
"""
from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np

from ..codegen.llvm_loops import counted_loop, cpu_has, declare, do_while_loop, gemm_definition
from ..codegen import memory
from . import vnni
# each layer's epilogue constants are the VNNI kernel's, the gather is every path's
# (re-exported: the bindings take them from the path's module)
from .vnni import conv_requantize, requantize_params  # noqa: F401
from .gather import windows  # noqa: F401

BLOCK = 64    # output channels per block (4 tiles of 16)
ROWS = 16     # pixels per tile
PADS = True   # any number of output channels: the last block is padded with zero weights
STEP = 16     # k-quads per tile of A (64 bytes of a pixel's row)
PANEL = 256   # bytes of a panel's k-quad row (64 channels x 4)

_ARCH_PRCTL = 158                  # x86-64 Linux system call numbers and arguments
_ARCH_GET_XCOMP_PERM, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 0x1022, 0x1023, 18


@lru_cache(maxsize=None)
def tile_permission() -> bool:
    """Whether this process may use the AMX tiles: asked of Linux once (the permission is the
    process's, for all its threads); False elsewhere, or where refused."""
    import ctypes
    import platform
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        long = ctypes.c_long          # (syscall's arguments are longs: passed as such)
        if libc.syscall(long(_ARCH_PRCTL), long(_ARCH_REQ_XCOMP_PERM),
                        long(_XFEATURE_XTILEDATA)) != 0:
            return False
        granted = ctypes.c_uint64(0)
        if libc.syscall(long(_ARCH_PRCTL), long(_ARCH_GET_XCOMP_PERM),
                        ctypes.byref(granted)) != 0:
            return False
        return bool(granted.value >> _XFEATURE_XTILEDATA & 1)
    except (OSError, AttributeError):
        return False


def available() -> bool:
    return cpu_has("amx-int8") and cpu_has("amx-tile") and tile_permission()


DEPTH_FROM = 128   # the least K a layer on the tiles has


def suits(depth: int) -> bool:
    """Whether a layer whose outputs are sums of ``depth`` products (K) takes the tiles: K a
    multiple of 64 (no padding) and at least DEPTH_FROM. The tiles' sums pass through memory
    on their way to the epilogue, which the VNNI kernel finishes in registers: measured on a
    Xeon with AMX (2 threads, against the VNNI kernels), ResNet-50's layers of K = 256 to
    4608 took 0.39-0.72x the time, those of K = 128 0.91x, of K = 64 1.09-1.26x; MobileNet-v2's
    layers of K = 192 to 960 0.64-0.89x, but those padded to 64 (K = 16 to 160: 24 -> 64, 144
    -> 192) 1.05-4.2x, and ResNet's stem (147 -> 192) 1.23x."""
    return depth >= DEPTH_FROM and depth % (STEP * 4) == 0


@lru_cache(maxsize=None)
def _tile_type():
    """LLVM's ``x86_amx`` type (llvmlite has no class of its own for it), one instance."""
    from llvmlite import ir

    class Tile(ir.Type):
        def _to_string(self):
            return "x86_amx"

        def __eq__(self, other):
            return isinstance(other, Tile)

        def __hash__(self):
            return hash("x86_amx")
    return Tile()


def define_tdpbusd(name: str, epilogue: bool):
    """Define (once per LLVM module) ``void <name>(A, lda, B, C, ldc, p0, p1, kq, oblocks)``:
    C rows p0..p1 (int32, ldc apart) = A's rows (lda bytes apart) times ``oblocks`` panels of
    ``kq`` x 64 x 4 bytes, by tiles (see the module's docstring). With ``epilogue``,
    ``<name>_requantize(..., params, stride, lo, hi, valid)`` finishes each row of sums as
    ``kernels_int8.requantize_rows`` does, bit for bit, and stores 8-bit values into C (rows
    ldc bytes apart; ``vnni.requantize_finish``)."""
    @gemm_definition(name + ("_requantize" if epilogue else ""), "i8",
                     ("ptr", "i64", "i64", "i64", "i64") if epilogue else ())
    def define_gemm(mod, fn, args, b):
        from llvmlite import ir
        i16, i32, i64 = ir.IntType(16), ir.IntType(32), ir.IntType(64)
        ptr = ir.IntType(8).as_pointer()
        tile = _tile_type()
        load = declare(mod, "llvm.x86.tileloadd64.internal",
                       ir.FunctionType(tile, [i16, i16, ptr, i64]))
        dot = declare(mod, "llvm.x86.tdpbusd.internal",
                      ir.FunctionType(tile, [i16, i16, i16, tile, tile, tile]))
        store = declare(mod, "llvm.x86.tilestored64.internal",
                        ir.FunctionType(ir.VoidType(), [i16, i16, ptr, i64, tile]))
        zero = declare(mod, "llvm.x86.tilezero.internal", ir.FunctionType(tile, [i16, i16]))
        a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, kq, blocks = args[:9]
        c64, c16 = (lambda v: ir.Constant(i64, v)), (lambda v: ir.Constant(i16, v))  # noqa: E731
        width = c16(64)                 # bytes of a row of every tile
        steps = b.udiv(kq, c64(STEP))     # (kq: a multiple of STEP, ``pack``)
        sums = None
        if epilogue:    # a group's sums, 16 rows of 64 int32, for the epilogue to read
            slot = b.alloca(ir.ArrayType(i32, ROWS * BLOCK))
            slot.align = 64
            sums = b.bitcast(slot, ptr)
            finish = vnni.requantize_finish(args, BLOCK)

        def per_block(bb, ob):
            panel = bb.gep(b_ptr, [bb.mul(ob, bb.mul(kq, c64(PANEL)))])

            def group(bc, p):
                left_rows = bc.sub(p1, p)
                m = bc.select(bc.icmp_signed("<", left_rows, c64(ROWS)), left_rows, c64(ROWS))
                m16 = bc.trunc(m, i16)
                accs = [bc.call(zero, [m16, width]) for _ in range(4)]
                row0 = bc.gep(a_ptr, [bc.mul(p, lda)])

                def step(bk, s, accs):
                    a = bk.call(load, [m16, width, bk.gep(row0, [bk.mul(s, c64(64))]), lda])
                    at = bk.mul(s, c64(STEP * PANEL))
                    return [bk.call(dot, [m16, width, width, acc, a, bk.call(load, [
                        c16(STEP), width, bk.gep(panel, [bk.add(at, c64(64 * j))]),
                        c64(PANEL)])]) for j, acc in enumerate(accs)]
                final = do_while_loop(fn, bc, steps, accs, step)
                if epilogue:
                    for j, acc in enumerate(final):
                        bc.call(store, [m16, width, bc.gep(sums, [c64(64 * j)]),
                                        c64(BLOCK * 4), acc])
                    vt = ir.VectorType(i32, 16)
                    rows = bc.bitcast(sums, vt.as_pointer())

                    def row(br, r):
                        vectors = [br.load(br.gep(rows, [br.add(br.mul(r, c64(4)), c64(j))]),
                                           align=64) for j in range(4)]
                        finish(br, [vectors], br.add(p, r), ob)
                    counted_loop(fn, bc, c64(0), m, 1, "r", row)
                else:
                    out = bc.gep(c_ptr, [bc.mul(bc.add(bc.mul(p, ldc), bc.mul(ob, c64(BLOCK))),
                                                c64(4))])
                    for j, acc in enumerate(final):
                        bc.call(store, [m16, width, bc.gep(out, [c64(64 * j)]),
                                        bc.mul(ldc, c64(4)), acc])

            # (p + 16 <= p1 + 15: every p below p1)
            counted_loop(fn, bb, p0, bb.add(p1, c64(ROWS - 1)), ROWS, "p", group)

        counted_loop(fn, b, c64(0), blocks, 1, "ob", per_block)
    return define_gemm


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K) -> ([ceil(O/64)][Kp/4][64][4] int8 panels, 128 * column sums (O,),
    Kp): ``vnni.pack``'s panels with K padded to a multiple of 64 (a whole tile of A a step;
    the rows gathered for them are as wide, their padding zero)."""
    kp = -(-w.shape[1] // (STEP * 4)) * STEP * 4
    return (memory.panels(w, BLOCK, 4, kp, np.int8), 128 * w.sum(axis=1, dtype=np.int32), kp)


# the VNNI kernel's drivers run the tile GEMMs (with the 512-bit kernel's widths: blocks of 64
# channels, 256 bytes of panel per k-quad, the epilogue on vectors of 16 sums)
KERNEL = vnni.gemm_kernel("amx", lambda epilogue: define_tdpbusd("eqquant_amx_gemm", epilogue),
                          available(), BLOCK, PANEL, 16, True)
gemm, gemm_parallel, gemm_call = vnni.bound_gemms(KERNEL)
conv_kernel = vnni.conv_kernel_of(KERNEL)
