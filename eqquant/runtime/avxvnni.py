"""An int8 GEMM on 256-bit VNNI (``vpdpbusd`` on ymm registers: AVX-VNNI, or AVX512-VNNI with
AVX512-VL): LLVM IR written with llvmlite, compiled once as C functions that Numba-compiled
kernels call through an intrinsic (``llvm_loops.load_gemms``), like ``vnni.py``, whose
interface it shares (pixel rows as unsigned bytes, packed weights, the same epilogue).

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

The instruction is the 512-bit kernel's on half the lanes: 4 unsigned bytes of A times 4
signed bytes of B summed into one int32 lane, exact. Blocks are 16 output channels (two
vectors of 8 lanes), so it serves CPUs with AVX-VNNI and no AVX-512 (16 vector registers:
6 pixels x 2 accumulators + 2 weight vectors + the broadcast pixel), and, on a CPU with
AVX512-VNNI, the layers whose width fills no 64-channel block of ``vnni.py`` (MobileNet's 24,
96, 144 channels: padded to 16, not to 64). B is packed once as [O/16][K/4][16][4], O padded
with zero weights to a multiple of 16; an int8 activation x is fed as the byte x + 128 and
the product corrected by 128 * sum_k B[k, o] (see ``pack``). The drivers are the 512-bit
kernel's, handed this kernel's GEMMs and widths (``KERNEL``).
"""
from __future__ import annotations


import numpy as np

from .llvm_loops import cpu_has
from . import vnni
# the gather and each layer's epilogue table are the 512-bit kernel's (re-exported: the
# bindings take them from the path's module)
from .gather import windows  # noqa: F401
from .vnni import conv_requantize, requantize_params  # noqa: F401
from .vnni import define_vpdpbusd

BLOCK = 16   # output channels per register block (2 x 8 lanes)
ROWS = 6     # pixels per micro-kernel step
PANEL = 64   # bytes of packed weights per k-quad and block (16 channels x 4 k)
PADS = True  # any number of output channels: the last block is padded with zero weights


def available() -> bool:
    return cpu_has("avxvnni") or (cpu_has("avx512vnni") and cpu_has("avx512vl"))


def _define(epilogue: bool = False):
    """The 256-bit GEMM: blocks of 16 channels (2 x 8 lanes), ROWS at a time
    (``vnni.define_vpdpbusd``)."""
    return define_vpdpbusd("eqquant_vnni256_gemm", 8, 2, ROWS, epilogue)


pack = vnni.packer(BLOCK)    # [ceil(O/16)][Kp/4][16][4] int8 panels


# the 512-bit kernel's drivers run this kernel's GEMMs, with its widths: blocks of 16
# channels, 64 bytes of panel per k-quad, 8 sums a vector
KERNEL = vnni.gemm_kernel("avxvnni", _define, available(), BLOCK, PANEL, 8, False)
gemm, gemm_parallel = vnni.bound_gemms(KERNEL)
conv_kernel = vnni.conv_kernel_of(KERNEL)
