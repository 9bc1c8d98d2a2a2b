"""An int8 GEMM on 512-bit VNNI in blocks of 16 output channels: one vector of 16 sums a
pixel, where ``vnni.py``'s blocks are 64 (four vectors). It is ``vnni.py``'s kernel (the
same ``vpdpbusd``, interface and epilogue) for the layers that padding to 64 channels would
waste (MobileNet's 16, 24 and 32 channels, a multiple of 16 padded to 16 instead of 64): a
step of K loads the block's one weight vector and multiplies it by ROWS broadcast pixels.
``avxvnni.py`` serves those layers on CPUs with AVX-VNNI and no AVX-512, with two vectors of
8 sums a pixel; here each instruction does 16 channels' work, and a whole block's sums are
requantized together on 32-bit words (``requantize_ir.block_words``). B is packed as
``avxvnni.py`` packs it, [O/16][K/4][16][4]. The drivers are the 512-bit kernel's, handed
this kernel's GEMMs and widths (``KERNEL``).
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

BLOCK = 16   # output channels per register block (one vector of 16 lanes)
ROWS = 12    # pixels per micro-kernel step: 12 accumulators + the weights + the broadcast
PANEL = 64   # bytes of packed weights per k-quad and block (16 channels x 4 k)
PADS = True  # any number of output channels: the last block is padded with zero weights


def available() -> bool:
    return cpu_has("avx512vnni") and cpu_has("avx512bw")


def _define(epilogue: bool = False):
    """The GEMM: blocks of 16 channels (one vector), ROWS at a time
    (``vnni.define_vpdpbusd``)."""
    return define_vpdpbusd("eqquant_vnni16_gemm", 16, 1, ROWS, epilogue)


pack = vnni.packer(BLOCK)    # [ceil(O/16)][Kp/4][16][4] int8 panels


# the 512-bit kernel's drivers run this kernel's GEMMs, with its widths: blocks of 16
# channels, 64 bytes of panel per k-quad, 16 sums a vector
KERNEL = vnni.gemm_kernel("vnni16", _define, available(), BLOCK, PANEL, 16, True)
gemm, gemm_parallel = vnni.bound_gemms(KERNEL)
conv_kernel = vnni.conv_kernel_of(KERNEL)
