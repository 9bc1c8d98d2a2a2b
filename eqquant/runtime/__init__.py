"""The CPU runtime: Numba kernels (``kernels_fp32.py``, ``kernels_int8.py``), the SIMD GEMMs
generated with llvmlite (``fma.py`` for float, ``vnni.py``, ``avxvnni.py``, ``avx2.py`` for
int8) and the window gather and work split their drivers share (``gather.py``), their
bindings to registry ops (``bindings.py``, ``bindings_int8.py``) and the executor with its
memory plan (``executor.py``).

One thread pool runs every kernel: Numba's OpenMP workers, which spin a moment after each
parallel region before they sleep (libgomp's default), so the next op of a program finds
them awake: a pool told to sleep at once (``OMP_WAIT_POLICY=PASSIVE``) cost 30-60 us per op,
a quarter of resnet18's int8 time and half of MobileNet-v2's. Only where float convolutions
run on numpy's BLAS (a CPU without AVX2 and FMA, or ``EQQUANT_FP32_KERNEL=blas``), whose
OpenBLAS threads fight spinning OpenMP ones for the cores, are the OpenMP threads told to
sleep when idle. A policy the user set is kept either way.
"""
import os


def _blas_runs_float_convolutions() -> bool:
    if os.environ.get("EQQUANT_FP32_KERNEL") == "blas":
        return True
    from .llvm_loops import cpu_has
    return not (cpu_has("avx2") and cpu_has("fma"))


if _blas_runs_float_convolutions():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
