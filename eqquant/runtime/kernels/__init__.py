"""Kernels: each file a family, each kernel bit-exact against the reference semantics.

- float32: ``fp32.py`` (Numba loops: elementwise, pools, reductions, softmax, layer norm,
  direct depthwise and grouped convolutions, layout moves) and ``fma.py`` (the AVX-512 and
  AVX2+FMA convolution GEMMs, generated);
- int8 on x86 SIMD: ``vnni.py`` (one driver, its rows the VNNI widths: ``vnni``, ``vnni16``,
  ``avxvnni``), ``amx.py`` (AMX tiles), ``avx2.py`` (16-bit and byte drivers on AVX2);
- shared by both: ``depthwise.py`` (the depthwise sweep), ``pools.py`` (SIMD max pools) and
  ``gather.py`` (the window gather and the work split the GEMM drivers share);
- portable int8: ``int8.py`` (im2col and GEMM in Numba, requantize, qnn's elementwise ops).

A kernel knows nothing of ops: ``lowering/`` binds ops to kernels."""


def simd_module(path: str):
    """The GEMM of an int8 SIMD path (a module, or a row of ``vnni.PATHS``: they share one
    interface), or None (``portable``)."""
    if path == "amx":
        from . import amx
        return amx
    if path in ("vnni", "vnni16", "avxvnni"):
        from .vnni import PATHS
        return PATHS[path]
    if path == "avx2":
        from . import avx2
        return avx2
    return None
