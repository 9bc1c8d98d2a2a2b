"""The CPU runtime: Numba kernels (``kernels_fp32.py``, ``kernels_int8.py``), an AVX512-VNNI
int8 GEMM generated with llvmlite (``vnni.py``), their bindings to registry ops
(``bindings.py``, ``bindings_int8.py``) and the executor with its memory plan (``executor.py``).

Numba's parallel kernels and OpenBLAS's GEMM take turns on the same cores; OpenMP threads
that spin after a parallel region starve the next GEMM (measured here: resnet18 took 6x
longer), so the OpenMP threads are told to sleep when idle, unless the user chose otherwise.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
