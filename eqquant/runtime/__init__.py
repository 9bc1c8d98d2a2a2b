"""The CPU runtime, laid out as its stages, each importing only those before it:

- ``codegen/``: Numba and llvmlite code generation, C entries, the launcher and its one
  thread pool;
- ``kernels/``: the kernels, float32, int8 on x86 SIMD and portable, each bit-exact;
- ``target.py``: which kernels this process may run (``Target``, ``--target``);
- ``lowering/``: the kernel plan (each site's kernel, written into the program) and the
  bindings that call the kernels;
- ``execution/``: the executor that runs a planned program, ``--profile``'s times and the
  measured cost model.

``deploy/`` saves the same plan ahead of time as a library of C entries.

One thread pool runs every kernel, entered the same way by each (``launch.py``: a kernel is
one thread's share, compiled into a C entry, and one parallel loop runs them all; the AVX2
int8 drivers keep a loop of their own): Numba's OpenMP workers, which spin a moment after each
parallel region before they sleep (libgomp's default), so the next op of a program finds
them awake: a pool told to sleep at once (``OMP_WAIT_POLICY=PASSIVE``) pays a wake-up per
op, a large share of a small int8 model's time. Only where float convolutions
run on numpy's BLAS (a CPU without AVX2 and FMA, or ``EQQUANT_FP32_KERNEL=blas``), whose
OpenBLAS threads fight spinning OpenMP ones for the cores, are the OpenMP threads told to
sleep when idle. A policy the user set is kept either way.

Numba checks a cached kernel against its own file only, while the kernels here are built
from several (a driver in ``vnni.py`` compiles in the gather of ``gather.py``, the LLVM GEMM
of ``llvm_loops.py``, the epilogue of ``requantize_ir.py``): after a change to one of those,
the cache would hand back the old kernel. Every kernel cached from this folder is stamped
with a digest of the whole folder's source (``source_digest``) besides its own file's.

Numba, setting up its CPU target (on a process's first kernel, cached or not), probes for a
BLAS by importing ``scipy.linalg``: a noticeable part of a first inference where SciPy is
installed (the ``ilp`` extra). No kernel here calls a BLAS through Numba, so that probe is answered
without ``scipy.linalg`` (``_numba_target_without_scipy``) where it is not loaded yet; it
imports as usual afterwards.
"""
import hashlib
import importlib.abc
import os
import sys
from functools import lru_cache

_FOLDER = os.path.dirname(os.path.abspath(__file__))


@lru_cache(maxsize=None)
def source_digest(folder: str = _FOLDER) -> str:
    """A digest of the runtime's source (every ``.py`` file under ``folder``, this one)."""
    h = hashlib.sha1()
    names = sorted(os.path.relpath(os.path.join(d, f), folder)
                   for d, _, files in os.walk(folder) for f in files if f.endswith(".py"))
    for name in names:
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
                if py_file and os.path.abspath(py_file).startswith(_FOLDER + os.sep):
                    return stamp, source_digest()
                return stamp
        Stamped.__name__ = Stamped.__qualname__ = cls.__name__
        return Stamped
    impl._locator_classes = [stamped(cls) for cls in impl._locator_classes]


_stamp_kernel_caches()


class _NoSciPyLinalg(importlib.abc.MetaPathFinder):
    """Refuses ``scipy.linalg`` while it is on ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):
        if name == "scipy.linalg" or name.startswith("scipy.linalg."):
            raise ImportError("eqquant: scipy.linalg is not loaded for Numba's BLAS probe")
        return None


def _numba_target_without_scipy() -> None:
    """Import Numba's array math (whose import probes for a BLAS, ``numba.np.linalg.
    ensure_blas``) with ``scipy.linalg`` refused, where it is not loaded: the probe finds
    none, and Numba types a dot product of floats by its own loop, which no kernel here
    uses."""
    if "scipy.linalg" in sys.modules or "numba.np.arraymath" in sys.modules:
        return
    guard = _NoSciPyLinalg()
    sys.meta_path.insert(0, guard)
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        sys.meta_path.remove(guard)


_numba_target_without_scipy()


def _blas_runs_float_convolutions() -> bool:
    if os.environ.get("EQQUANT_FP32_KERNEL") == "blas":
        return True
    from .codegen.llvm_loops import cpu_has
    return not (cpu_has("avx2") and cpu_has("fma"))


if _blas_runs_float_convolutions():
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
