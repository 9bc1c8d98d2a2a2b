"""The int8 GEMMs of ``vpdpbusd`` (AVX512-VNNI, AVX-VNNI): LLVM IR written with llvmlite by one
generator (``define_vpdpbusd``), compiled once as C functions that Numba-compiled kernels call
through an intrinsic (``llvm_loops.load_gemms``; both cache like any other Numba kernel), and
the drivers every GEMM of this interface runs under (AMX's too, ``amx.py``). The family's
paths are rows of one table (``WIDTHS``: vector width, vectors a block, pixels a step, the
features they need); this text says it for the 512-bit one on blocks of 64 (``vnni``).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

``vpdpbusd`` multiplies 4 unsigned bytes of A by 4 signed bytes of B and adds the four products
into one int32 lane, 16 lanes at a time. B is packed once as [O/64][K/4][64][4] (K padded to a
multiple of 4, O padded with zero weights to a multiple of 64): one 64-byte load gives 4
k-values for 16 output channels, and each block of 64 channels is one contiguous panel that
stays in cache. The micro-kernel
keeps 6 pixels x 64 channels in 24 accumulators, so each weight load feeds 6 ``vpdpbusd``; an
int8 activation x is fed as the byte x + 128 and the product corrected by 128 * sum_k B[k, o]
(see ``pack``).

The other rows: ``vnni16``, the same instruction on blocks of 16 channels (one vector of 16
sums a pixel, 12 pixels a step: 12 accumulators + the weights + the broadcast pixel), for the
layers that padding to 64 would waste (MobileNet's 16 to 160 channels), whose whole blocks are
requantized together on 32-bit words (``requantize_ir.block_words``); ``avxvnni``, 256-bit
(AVX-VNNI, or AVX512-VNNI with VL) on blocks of 16 as two vectors of 8, 6 pixels a step (16
ymm registers), for CPUs without AVX-512; it has no byte mask, so the last vector of a block
the channels end inside goes through an int32 tile (``masked`` False). Both pack B as
[O/16][K/4][16][4]. Which layer takes which is the lowering's (``lowering/plan.py``).

``Path.available()`` says whether the host CPU runs a row; a row's GEMMs are compiled at its
first use (``Path.KERNEL``), only where it does (the 512-bit row's as the module is imported).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..codegen.llvm_loops import (cpu_has, declare, gemm_at, gemm_definition, load_gemms,
                         panel_gemm, slot_cell, splat)

from .gather import CHUNK, SMALL, windows  # noqa: F401
from .gather import (_rows, group_span, load_entry, next_set_item, next_share, plan_shares,
                     release, set_major, share_rows, widen)
from .fp32 import copy_strided
from ..codegen.launch import Driver, parallel, share
from .int8 import add_residual, requantize_rows
# each layer's epilogue table (re-exported: the bindings take it from the path's module)
from ..codegen.epilogue_table import requantize_params  # noqa: F401
from ..codegen import memory

load_entry("uint8")   # the gather of this module's kernels, on bytes

@dataclass(frozen=True)
class Width:
    """A row of the family: a GEMM on vectors of ``lanes`` int32 sums (16: zmm; 8: ymm),
    ``vectors`` of them a block of output channels, ``rows`` pixels a step (rows x vectors
    accumulators, the weight vectors and the broadcast pixel within the vector registers),
    named ``symbol``; ``needs``: the CPU features it runs on (all of one group); ``masked``:
    the last vector of a block not whole is requantized in registers too and stored under a
    byte mask (AVX-512BW), else through an int32 tile and ``requantize_rows``."""

    symbol: str
    lanes: int
    vectors: int
    rows: int
    needs: tuple[tuple[str, ...], ...]
    masked: bool


WIDTHS = {
    "vnni": Width("eqquant_vnni_gemm", 16, 4, 6, (("avx512vnni",),), True),
    "vnni16": Width("eqquant_vnni16_gemm", 16, 1, 12, (("avx512vnni", "avx512bw"),), True),
    "avxvnni": Width("eqquant_vnni256_gemm", 8, 2, 6, (("avxvnni",), ("avx512vnni",
                                                                       "avx512vl")), False),
}


def define_vpdpbusd(name: str, lanes: int, vectors: int, rows: int, epilogue: bool):
    """Define (once per LLVM module) ``void <name>(A, lda, B, C, ldc, p0, p1, kq, oblocks)``,
    a ``vpdpbusd`` GEMM on vectors of ``lanes`` int32 (16: zmm, AVX512-VNNI; 8: ymm, AVX-VNNI),
    blocks of ``vectors`` x ``lanes`` output channels: for each block (its packed weights
    contiguous, kept in cache), the pixels p0..p1 go ``rows`` at a time: each step loads
    the block's weight vectors (its channels x 4 k) once and uses them for ``rows``
    broadcast pixels; leftover pixels go one at a time. With ``epilogue``,
    ``<name>_requantize(..., params, stride, lo, hi, valid)`` finishes each sum in registers
    as ``kernels_int8.requantize_rows`` does, bit for bit (``requantize_finish``), and
    stores 8-bit values into C (rows ldc bytes apart)."""
    @gemm_definition(name + ("_requantize" if epilogue else ""), "i8",
                     ("ptr", "i64", "i64", "i64", "i64") if epilogue else ())
    def define_gemm(mod, fn, args, b):
        from llvmlite import ir
        i32, i64 = ir.IntType(32), ir.IntType(64)
        vt = ir.VectorType(i32, lanes)
        dp = declare(mod, f"llvm.x86.avx512.vpdpbusd.{32 * lanes}",
                     ir.FunctionType(vt, [vt, vt, vt]))
        a_ptr = args[0]

        def row_step(bc, start, k, accs, weights):
            """the 4 bytes (a_k..a_k+3) of this pixel's row, broadcast, times the block's
            channels x 4 k"""
            a_off = bc.add(start, bc.mul(k, ir.Constant(i64, 4)))
            a32 = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=1)
            av = splat(bc, a32, vt)
            return [bc.call(dp, [accs[j], av, weights[j]]) for j in range(vectors)]

        block = lanes * vectors
        panel_gemm(fn, b, args, rows=rows, block=block, panel=block * 4,
                   weights=(lanes * 4, vectors, vt, 1), accumulators=(vectors, vt),
                   row_step=row_step, out_lane=i32,
                   finish=requantize_finish(args, block) if epilogue else None)
    return define_gemm


def requantize_finish(args, block: int):
    """``panel_gemm``'s finish for a requantizing GEMM of ``block`` channels a block: each
    row's sum vectors requantized (``requantize_ir``) and stored as 8 bits in C, rows ldc
    bytes apart, those of the first ``valid`` channels only (args: the GEMM's, then params,
    stride, lo, hi, valid): a last block of 96 channels stores 2 of its 4 vectors. A whole
    block of 16 channels on two vectors of 8 (AVX2's) is finished as one vector of 16, a
    whole block of 16, 32 or 64 on vectors of 16 (AVX-512's) as one where the layer takes
    the words' form (``requantize_ir.block_words``)."""
    from llvmlite import ir
    from ..codegen.requantize_ir import WORDS, block_words, with_epilogue
    i64 = ir.IntType(64)
    c_ptr, ldc = args[3], args[4]
    params, stride, lo, hi, valid = args[9:14]

    def finish(bc, accs, p, ob):
        lanes = accs[0][0].type.count
        if lanes == 16 and len(accs[0]) in (1, 2, 4) and block == 16 * len(accs[0]):
            # a whole block of 16, 32 or 64 channels in a layer that takes the words' form:
            # each row's vectors finished together (``block_words``) and stored in one
            col = bc.mul(ob, ir.Constant(i64, block))
            flag = bc.load(bc.gep(bc.bitcast(params, i64.as_pointer()),
                                  [bc.add(bc.mul(stride, ir.Constant(i64, WORDS)), col)]))
            words = bc.and_(bc.icmp_signed("<=", bc.add(col, ir.Constant(i64, block)), valid),
                            bc.icmp_signed("!=", flag, ir.Constant(i64, 0)))
            with bc.if_else(words, likely=True) as (whole, apart):
                with whole:
                    stored(accs, p, col, lambda bc, row: row)(bc, block_words(
                        bc, params, stride, col, lo))
                with apart:
                    vectors(bc, accs, p, ob, lanes)
        elif lanes == 8 and len(accs[0]) == 2 and block == 16:
            # a block of 16 channels on 8-lane vectors (AVX2): a row's two vectors joined and
            # finished as 16, where the block is whole (the words' packs then take 16 sums
            # at a time, and one store writes them)
            col = bc.mul(ob, ir.Constant(i64, block))
            whole = bc.icmp_signed("<=", bc.add(col, ir.Constant(i64, 16)), valid)
            join = ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(16)))
            with bc.if_else(whole, likely=True) as (joined, apart):
                with joined:
                    with_epilogue(bc, params, stride, col, 16, lo, hi, stored(
                        accs, p, col, lambda bc, row: bc.shuffle_vector(row[0], row[1], join)))
                with apart:
                    vectors(bc, accs, p, ob, lanes)
        else:
            vectors(bc, accs, p, ob, lanes)

    def vectors(bc, accs, p, ob, lanes):
        """each of a row's sum vectors finished on its own (those inside ``valid``; on
        AVX-512, the one ``valid`` ends inside too, stored under a byte mask)"""
        for j in range(len(accs[0])):
            col = bc.add(bc.mul(ob, ir.Constant(i64, block)), ir.Constant(i64, lanes * j))
            inside = bc.icmp_signed("<=", bc.add(col, ir.Constant(i64, lanes)), valid)
            with bc.if_else(inside, likely=True) as (whole, part):
                with whole:
                    with_epilogue(bc, params, stride, col, lanes, lo, hi, stored(
                        accs, p, col, lambda bc, row, j=j: row[j]))
                with part:
                    if lanes == 16:
                        count = bc.sub(valid, col)
                        with bc.if_then(bc.icmp_signed(">", count, ir.Constant(i64, 0))):
                            # (the 64-bit lanes' form: the words' constants of a last
                            # group not whole are not laid out for vectors)
                            with_epilogue(bc, params, stride, col, lanes, lo, hi, stored(
                                accs, p, col, lambda bc, row, j=j: row[j], count), "lanes")

    def stored(accs, p, col, sums, count=None):
        """``with_epilogue``'s body: for each row r of ``accs``, ``sums(bc, its vectors)``
        requantized and stored at row p + r, column col (its first ``count`` bytes alone,
        under a mask, where given)"""
        def rows(bc, requantize):
            mask = None
            for r, row in enumerate(accs):
                v = requantize(bc, sums(bc, row))
                at = bc.add(bc.mul(bc.add(p, ir.Constant(i64, r)), ldc), col)
                where = bc.bitcast(bc.gep(c_ptr, [at]), v.type.as_pointer())
                if count is None:
                    bc.store(v, where, align=1)
                    continue
                if mask is None:
                    n = v.type.count
                    lanes = ir.Constant(ir.VectorType(i64, n), list(range(n)))
                    mask = bc.icmp_signed("<", lanes, splat(bc, count, lanes.type))
                store = declare(bc.module, f"llvm.masked.store.v{v.type.count}i8.p0",
                                ir.FunctionType(ir.VoidType(), [v.type, where.type,
                                                                ir.IntType(32), mask.type]))
                bc.call(store, [v, where, ir.Constant(ir.IntType(32), 1), mask])
        return rows
    return finish


def pack_panels(w: np.ndarray, block: int, group: int, dtype) -> tuple:
    """int8 weights (O, K) -> (B packed [ceil(O/block)][Kp/group][block][group] as ``dtype``:
    each block of output channels one contiguous panel, O padded with zero rows; 128 * column
    sums (O,); Kp: K padded to a multiple of 4). The GEMMs' output has the padded width; the
    padded columns are 0. (The SIMD GEMMs' shared layout: ``group`` k-values of one channel
    are one lane's operands.)"""
    kp = -(-w.shape[1] // 4) * 4
    return (memory.panels(w, block, group, kp, dtype),
            128 * w.sum(axis=1, dtype=np.int32), kp)


def packer(block: int):
    """A path module's ``pack(w)``: int8 weights (O, K) -> [ceil(O/block)][Kp/4][block][4]
    int8 panels (``pack_panels``), for the VNNI kernels on blocks of ``block`` channels."""
    def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        return pack_panels(w, block, 4, np.int8)
    return pack


REQUANTIZING = ("ptr", "i64", "i64", "i64", "i64")   # the requantizing GEMM's extra arguments


def gemm_kernel(owner: str, define, load: bool, block: int, panel: int, lanes: int,
                masked: bool) -> tuple:
    """A kernel of the drivers below: (the slot of the GEMM that ``define(False)`` defines,
    that of ``define(True)``'s requantizing one, block, panel, lanes, masked, 0), the GEMMs
    compiled as C functions under ``owner``'s name where ``load`` (the CPU runs them; else
    both slots are 0, and no layer may take the kernel). A slot is the address of the cell
    that holds its GEMM's address (``llvm_loops.slot_cell``), known before the GEMMs load:

    - GEMM(A, lda, B, C, ldc, p0, p1, kq, oblocks): C rows p0..p1 (int32) = A rows times the
      packed B (``oblocks`` panels of ``kq`` x ``block`` x 4 bytes);
    - its requantizing one (..., params, params stride, lo, hi, valid): the same, requantized
      to 8 bits (``requantize_finish``);
    - ``block`` output channels a block, ``panel`` bytes of packed weights a k-quad and
      block, ``lanes`` sums a vector, ``masked`` as MASKED;
    - last, 1 where the GEMMs read the rows as int16 (AVX2's 16-bit ones, ``avx2.KERNEL``,
      whose panels are k-pairs: the grouped driver widens its rows for them), else 0.

    The drivers take it as an argument, so that they are compiled once for every kernel of
    this interface (AMX's, the 256-bit and blocks-of-16 ones), where each had its twin."""
    plain, requantizing = define(False), define(True)
    if load:
        load_gemms(owner, [plain, requantizing])
    cells = (slot_cell(plain.symbol), slot_cell(requantizing.symbol)) if load else (0, 0)
    return (*cells, block, panel, lanes, int(masked), 0)


def bound_gemms(kernel: tuple) -> tuple:
    """(gemm, gemm_parallel, gemm_call) of ``kernel`` (``gemm_kernel``'s): ``multiply`` and
    ``multiply_parallel`` with it bound, and the latter's launch as (kernel, args), as each
    path module gives them."""
    def gemm(a_u8, packed, out, p0=0, p1=-1, ob0=0, ob1=-1):
        multiply(kernel, a_u8, packed, out, p0, p1, ob0, ob1)

    def gemm_call(a_u8, packed, out) -> tuple:
        return multiply_parallel, (kernel, a_u8, packed, out)

    def gemm_parallel(a_u8, packed, out):
        multiply_parallel(kernel, a_u8, packed, out)
    return gemm, gemm_parallel, gemm_call


_gemm_at = gemm_at("i8")                       # (the drivers' calls of a kernel's GEMMs)
_requantize_at = gemm_at("i8", REQUANTIZING)

@njit(cache=True)
def multiply(kernel, a_u8, packed, out, p0=0, p1=-1, ob0=0, ob1=-1):
    """out[p, :] = a_u8[p, :] @ B for rows p0..p1 (a_u8: (P, Kp) uint8, out: (P, O) int32),
    for the blocks of output channels ob0..ob1 (all by default), on ``kernel``'s GEMM."""
    block, panel = kernel[2], kernel[3]
    oblocks, kq = packed.shape[0], packed.shape[1]
    p1 = a_u8.shape[0] if p1 < 0 else p1
    ob1 = oblocks if ob1 < 0 else ob1
    _gemm_at(kernel[0], (a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data + ob0 * kq * panel,
                         out.ctypes.data + ob0 * block * 4, out.shape[1], p0, p1, kq,
                         ob1 - ob0))


@parallel
def multiply_parallel(thread, threads, args):
    """``multiply`` over the cores, args (kernel, a_u8, packed, out): by chunks of pixels when
    there are many, by output blocks when the image is small (a 7x7 layer has 49 pixels)."""
    kernel, a_u8, packed, out = args
    block, panel = kernel[2], kernel[3]
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    if p >= SMALL or oblocks == 1:
        chunks = (p + CHUNK - 1) // CHUNK
        for t in range(*share(chunks, thread, threads)):
            _gemm_at(kernel[0], (a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data,
                                 out.ctypes.data, out.shape[1], t * CHUNK,
                                 min(p, t * CHUNK + CHUNK), kq, oblocks))
    else:
        for ob in range(*share(oblocks, thread, threads)):
            _gemm_at(kernel[0], (a_u8.ctypes.data, a_u8.shape[1],
                                 packed.ctypes.data + ob * kq * panel,
                                 out.ctypes.data + ob * block * 4, out.shape[1], 0, p, kq, 1))


def conv_kernel_of(kernel: tuple):
    """A path module's ``conv_kernel(w, kp, name)`` on ``kernel`` (``gemm_kernel``'s): (the fused
    convolution, its arguments besides ``pack``'s) = (``conv_requantize``, (kernel,)), the
    interface of every SIMD path (``avx2.conv_kernel`` chooses). A kernel whose GEMMs are
    never compiled (the CPU lacks them: its slots are 0) is refused: its driver would call
    through a null cell."""
    def conv_kernel(w: np.ndarray, kp: int, name: str = "") -> tuple:
        if not (kernel[0] and kernel[1]):
            raise RuntimeError("eqquant: this CPU does not run the GEMMs of the int8 kernel "
                               "asked for (the target offers only those it runs)")
        return conv_requantize, (kernel,)
    return conv_kernel


class Path:
    """A row of ``WIDTHS`` as the bindings take a SIMD path (the interface of a GEMM module:
    ``BLOCK``, ``ROWS``, ``PADS``, ``available``, ``pack``, ``conv_kernel``, ``gemm``,
    ``gemm_parallel``, ``gemm_call``, ``windows``, ``requantize_params``, ``conv_requantize``); its GEMMs
    compiled at first use (``KERNEL``: ``gemm_kernel``'s), only where the CPU runs them."""

    PADS = True     # any number of output channels: the last block is padded with zeros
    windows = staticmethod(windows)
    requantize_params = staticmethod(requantize_params)

    def __init__(self, name: str, width: Width):
        self.name, self.width = name, width
        self.LANES, self.ROWS = width.lanes, width.rows
        self.BLOCK = width.lanes * width.vectors       # output channels a block
        self.PANEL = self.BLOCK * 4      # bytes of packed weights a k-quad and block
        self.MASKED = width.masked
        self.pack = packer(self.BLOCK)   # [ceil(O/BLOCK)][Kp/4][BLOCK][4] int8 panels

    def __repr__(self) -> str:
        return f"<vpdpbusd path {self.name}>"

    def available(self) -> bool:
        return any(all(cpu_has(f) for f in group) for group in self.width.needs)

    def define(self, epilogue: bool = False):
        w = self.width
        return define_vpdpbusd(w.symbol, w.lanes, w.vectors, w.rows, epilogue)

    @functools.cached_property
    def KERNEL(self) -> tuple:
        return gemm_kernel(self.name, self.define, self.available(), self.BLOCK, self.PANEL,
                           self.LANES, self.MASKED)

    @property
    def conv_requantize(self):
        return conv_requantize

    def gemm(self, a_u8, packed, out, p0=0, p1=-1, ob0=0, ob1=-1):
        multiply(self.KERNEL, a_u8, packed, out, p0, p1, ob0, ob1)

    def gemm_parallel(self, a_u8, packed, out):
        multiply_parallel(self.KERNEL, a_u8, packed, out)

    def gemm_call(self, a_u8, packed, out) -> tuple:
        """``gemm_parallel``'s launch: (kernel, args)."""
        return multiply_parallel, (self.KERNEL, a_u8, packed, out)

    def conv_kernel(self, w: np.ndarray, kp: int, name: str = "") -> tuple:
        return conv_kernel_of(self.KERNEL)(w, kp)

    GROUPED = True   # runs grouped convolutions, a set of groups a GEMM (``group_span``)

    def group_span(self, groups: int, per_group: int) -> int:
        return group_span(groups, per_group, self.BLOCK)

    def stores_set(self, span_o: int) -> bool:
        """Whether a set of ``span_o`` outputs is stored from registers: under a byte mask,
        or in whole vectors (the 256-bit kernel's last vector, not whole, is not stored)."""
        return self.MASKED or span_o % self.LANES == 0

    def grouped_kernel(self, sets: int, span_o: int) -> tuple:
        """(``grouped_requantize``, its arguments besides ``pack``'s), as ``conv_kernel``."""
        conv_kernel_of(self.KERNEL)(None, 0)       # (refuses a kernel the CPU lacks)
        return grouped_requantize, (self.KERNEL, sets, span_o)


PATHS = {name: Path(name, width) for name, width in WIDTHS.items()}

# the 512-bit row on blocks of 64, as this module's own names (the AMX kernel and the tests
# take them from here); its GEMMs compiled as the module is imported, where the CPU runs them
_WIDE = PATHS["vnni"]
BLOCK, ROWS, LANES, PANEL, MASKED, PADS = (_WIDE.BLOCK, _WIDE.ROWS, _WIDE.LANES, _WIDE.PANEL,
                                           _WIDE.MASKED, _WIDE.PADS)
available, pack = _WIDE.available, _WIDE.pack
KERNEL = _WIDE.KERNEL
gemm, gemm_parallel, gemm_call = bound_gemms(KERNEL)
conv_kernel = conv_kernel_of(KERNEL)


@njit(cache=True)
def _finish(acc, cols, params, lo, hi, o0, p0, out):
    """acc (n, >= cols) int32 for channels o0..o0+cols and pixels p0.. -> 8-bit out (P, O):
    minus the zero-point correction, plus the bias, clamped per channel (relu, clip or
    nothing), requantized with UPWARD fixed point as ``kernels_int8.requantize`` does
    (``requantize_rows``, ``params`` from ``requantize_params``)."""
    requantize_rows(acc, params, o0, cols, lo, hi, out, p0, o0)


@njit(cache=True)
def _gemm_requantize(kernel, rows, kp, packed, ob0, ob1, out, n, params, lo, hi):
    """out[:n, ob0 * block:ob1 * block] (those of its columns out has) = the rows times the
    packed blocks ob0..ob1, requantized in registers (``kernel``'s requantizing GEMM; out
    (P, O) 8-bit, channel-last)."""
    block, panel = kernel[2], kernel[3]
    kq = packed.shape[1]
    _requantize_at(kernel[1], (rows.ctypes.data, kp, packed.ctypes.data + ob0 * kq * panel,
                               out.ctypes.data + ob0 * block, out.shape[1], 0, n, kq, ob1 - ob0,
                               params.ctypes.data + ob0 * block * 8, params.shape[1], lo, hi,
                               out.shape[1] - ob0 * block))


def _conv_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, kernel, params, lo,
               hi, out, threads, res, add):
    """``conv_requantize``'s plan (``launch.Driver``): a whole fused int8 convolution of a
    batch in one launch of its work items (``_conv_items``): nhwc (N, H, W, C) uint8 -> out
    (N, oh*ow, O) 8-bit, channel-last (an NCHW call site moves it), on
    ``kernel``'s GEMMs (``gemm_kernel``: this module's, AMX's, the 256-bit or blocks-of-16
    ones; one compiled driver for all). Each work item gathers a chunk of one image's
    pixels' windows into rows (``share_rows``: a pointwise convolution reads the image's
    own), multiplies them and finishes them in the GEMM's registers, so the worker threads
    wake once per convolution; a lone small image (fewer than 192 pixels) has its rows
    gathered once and is split by blocks of channels instead, and each block by pixels where
    the blocks alone would leave the threads unequal runs (``gather.plan_shares``: a lone image's
    rows are gathered by a launch before the items). A block whose
    last vector the channels end inside, on a kernel that cannot store it under a mask,
    goes through an int32 tile and ``_finish``. ``params``: the layer's
    ``requantize_params``. With a residual ``res`` (shaped as out; (0, 0, 0): none), each
    item's tile is then summed with it in place (``add_tile``, ``add``: its parameters), in
    cache: fused.qconv2d_add. A pointwise convolution of a batch is cut as one image of the
    batch's pixels (its rows one GEMM's, a late layer's weights read once per chunk of
    rows, not once per image)."""
    kp = packed.shape[1] * 4
    n, h, w, c = nhwc.shape
    if n > 1 and kh == kw == sh == sw == 1 and pt == pl == 0 and (oh, ow) == (h, w) and \
            nhwc.flags.c_contiguous and out.flags.c_contiguous:
        # a pointwise convolution of a batch: its images' pixels are one image's rows (each
        # row's sums its own: the same bits), cut into work items as one image's are
        nhwc, out = nhwc.reshape(1, 1, n * h * w, c), out.reshape(1, n * oh * ow, -1)
        res = res.reshape(1, n * oh * ow, -1) if res.shape[0] else res
        oh, ow = 1, n * h * w
    work, shared, counters, fill = plan_shares(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, ow,
                                               oh * ow, packed.shape[0], threads, kp)
    items = (_conv_items, (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, kernel,
                           params, lo, hi, out, res, add, work, shared, counters), threads)
    return [items] if fill is None else [(*fill, None), items]


@parallel
def _conv_items(thread, threads, args):
    """The work items of ``conv_requantize`` one thread takes (``gather.next_share``)."""
    (nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, kernel, params, lo, hi, out,
     res, add, work, shared, counters) = args
    block, panel, lanes, masked = kernel[2], kernel[3], kernel[4], kernel[5] != 0
    o_n, kq = out.shape[2], packed.shape[1]
    kp = kq * 4
    while True:
        b, ob0, ob1, p0, p1 = next_share(counters, thread, work)
        if b < 0:
            break
        rows = share_rows(nhwc[b], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1, kp,
                          shared)
        n = rows.shape[0]
        # blocks requantized in registers, straight into out (all of them when the
        # channels fill whole vectors, or a vector may be stored in part: masked)
        whole = ob1 if o_n % lanes == 0 or masked else min(ob1, o_n // block)
        if whole > ob0:
            _gemm_requantize(kernel, rows, kp, packed, ob0, whole, out[b, p0:], n, params,
                             lo, hi)
        rest = max(ob0, whole)      # the blocks finished through memory
        if rest < ob1:
            cols = (ob1 - rest) * block
            acc = np.empty((n, cols), np.int32)
            _gemm_at(kernel[0], (rows.ctypes.data, kp, packed.ctypes.data + rest * kq * panel,
                                 acc.ctypes.data, cols, 0, n, kq, ob1 - rest))
            _finish(acc, min(cols, o_n - rest * block), params, lo, hi, rest * block, p0,
                    out[b])
        add_residual(out, res, b, p0, n, ob0 * block, min(ob1 * block, o_n), add, lo, hi)
    release(counters)


conv_requantize = Driver(_conv_plan, (windows, _conv_items))


# -- grouped convolutions: each set of groups one block-diagonal GEMM --------------------------

def _grouped_plan(nhwc, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, kernel, sets,
                  span_o, params, lo, hi, out, threads, res, add):
    """``grouped_requantize``'s plan: a fused int8 convolution of ``sets`` sets of groups
    (``group_span``), nhwc (N, H, W, C) uint8 -> out (N, oh*ow, O) 8-bit, in two launches:
    the image moved set-major ((N, sets, H, W, C / sets), ``gather.set_major``), so
    that a set's windows are gathered as a whole image's (``gather``), then the work items
    (image, set, chunk of pixels: ``_grouped_items``), each a gather, the set's GEMM on its
    panels (``packed``: the sets' blocks one after another, ``params`` likewise, ``span_o``
    outputs a set) and its requantization in registers, stored at the set's channels. A
    residual (``res``) is not summed here (fused.qconv2d_add's binding adds it after)."""
    if res.shape[0]:
        raise ValueError("the int8 grouped driver sums no residual (fused.qconv2d_add's "
                         "binding adds it after)")
    by_set, move, chunks, counters = set_major(nhwc, sets, oh * ow, threads)
    return [move, (_grouped_items, (by_set, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed,
                                    kernel, span_o, params, lo, hi, out, chunks, counters),
                   threads)]


@parallel
def _grouped_items(thread, threads, args):
    """The work items of ``grouped_requantize`` one thread takes (``gather.next_item``)."""
    (by_set, kh, kw, sh, sw, pt, pl, dh, dw, pad, oh, ow, packed, kernel, span_o, params, lo,
     hi, out, chunks, counters) = args
    sets = by_set.shape[1]
    kp = packed.shape[1] * (2 if kernel[6] else 4)
    while True:
        b, s, p0, p1 = next_set_item(counters, thread, sets, chunks, oh * ow)
        if b < 0:
            break
        rows = _rows(by_set[b, s], kh, kw, sh, sw, pt, pl, dh, dw, pad, ow, p0, p1 - p0, kp)
        if kernel[6]:        # (a 16-bit GEMM: the rows widened)
            wide = np.empty((p1 - p0, kp), np.int16)
            widen(rows, wide)
            _set_requantize(kernel, wide, packed, s, sets, span_o, params, lo, hi, out[b], p0)
        else:
            _set_requantize(kernel, rows, packed, s, sets, span_o, params, lo, hi, out[b], p0)
    release(counters)


@njit(inline="always")
def _set_requantize(kernel, rows, packed, s, sets, span_o, params, lo, hi, out, p0):
    """out[p0:p0 + n, set s's span_o channels] = the rows (n, kp) times set s's panels,
    requantized in registers (``kernel``'s requantizing GEMM)."""
    block, panel = kernel[2], kernel[3]
    per_set, kq = packed.shape[0] // sets, packed.shape[1]
    o_n = out.shape[1]
    _requantize_at(kernel[1], (rows.ctypes.data, rows.shape[1],
                               packed.ctypes.data + s * per_set * kq * panel,
                               out.ctypes.data + p0 * o_n + s * span_o, o_n, 0, rows.shape[0],
                               kq, per_set, params.ctypes.data + s * per_set * block * 8,
                               params.shape[1], lo, hi, span_o))


grouped_requantize = Driver(_grouped_plan, (copy_strided, _grouped_items))
