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

Numba checks a cached kernel against its own file only, while the kernels here are built
from several (a driver in ``vnni.py`` compiles in the gather of ``gather.py``, the LLVM GEMM
of ``llvm_loops.py``, the epilogue of ``requantize_ir.py``): after a change to one of those,
the cache would hand back the old kernel. Every kernel cached from this folder is stamped
with a digest of the whole folder's source (``source_digest``) besides its own file's.
"""
import hashlib
import os
from functools import lru_cache

_FOLDER = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=None)
def source_digest(folder: str = _FOLDER) -> str:
    """A digest of the runtime's source (every ``.py`` file of ``folder``, this one)."""
    h = hashlib.sha1()
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".py")):
        with open(os.path.join(folder, name), "rb") as fh:
            h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()[:12]


def _stamp_kernel_caches() -> None:
    """Wrap each of Numba's cache locators so that a kernel defined in this folder carries
    ``source_digest()`` in its source stamp (kernels defined elsewhere are left alone)."""
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl   # (Numba < 0.61)
    if any(getattr(cls, "_eqquant_stamped", False) for cls in impl._locator_classes):
        return

    def stamped(cls):
        class Stamped(cls):
            _eqquant_stamped = True

            def get_source_stamp(self):
                stamp = super().get_source_stamp()
                py_file = getattr(self, "_py_file", None)
                if py_file and os.path.dirname(os.path.abspath(py_file)) == _FOLDER:
                    return stamp, source_digest()
                return stamp
        Stamped.__name__ = Stamped.__qualname__ = cls.__name__
        return Stamped
    impl._locator_classes = [stamped(cls) for cls in impl._locator_classes]


_stamp_kernel_caches()


def _blas_runs_float_convolutions() -> bool:
    if os.environ.get("EQQUANT_FP32_KERNEL") == "blas":
        return True
    from .llvm_loops import cpu_has
    return not (cpu_has("avx2") and cpu_has("fma"))


if _blas_runs_float_convolutions():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
