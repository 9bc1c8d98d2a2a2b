"""The target: which kernels this process may run, made once from the CPU's features.

    t = current()                 # the host's, or the one ``use`` set (``--target``)
    t.int8                        # SIMD GEMM paths offered, fastest first: ("amx", "vnni", ...)
    t.offers("x86.vnni16")        # whether a kernel name (``ops.qnn.INT8_KERNELS``) runs here
    print(t.describe())           # what a user sees in ``run -v`` and ``extract --explain``
    Target.named("avx2")          # the kernels an AVX2-only CPU runs (this CPU must run them)

A target names kernels, never chooses among them: which of its kernels a site takes is the
lowering's plan (``lowering/plan.py``), printed in the extracted program (``kernel="x86.vnni"``)
and in ``run -v``. A target is one of:

- ``host``: every kernel this CPU runs (its features as Numba compiles for them:
  ``llvm_loops.cpu_has``, which follows ``NUMBA_CPU_FEATURES`` where set);
- a kind of CPU the project runs on, as this CPU runs it: ``avx512`` (AVX512-VNNI, no AMX:
  an AMD EPYC Zen 4), ``avxvnni`` (256-bit VNNI, no AVX-512), ``avx2`` (AVX2 and FMA only:
  an AMD EPYC Zen 3), ``portable`` (no SIMD kernel at all). Asking for a kind whose kernels
  this CPU lacks is an error, never a silent fallback.

``EQQUANT_INT8_KERNEL`` / ``EQQUANT_FP32_KERNEL`` (one path name each) pin the host target to
one int8 GEMM / float convolution path, for a whole process (CI runs the suite so); the
target's name says so wherever it is printed. The direct depthwise kernel and the portable
loops are offered by every target.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import EqquantError

INT8_PATHS = ("amx", "vnni", "vnni16", "avxvnni", "avx2")   # the SIMD GEMMs, fastest first
FP32_PATHS = ("avx512", "fma", "blas")                      # float convolutions, fastest first
ALWAYS = ("depthwise", "portable")    # int8 kernels every target offers

# the kinds ``--target`` names: (int8 GEMM paths, float paths) a CPU of that kind runs
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx512": (("vnni", "vnni16", "avxvnni", "avx2"), ("avx512", "fma", "blas")),
    "avxvnni": (("avxvnni", "avx2"), ("fma", "blas")),
    "avx2": (("avx2",), ("fma", "blas")),
    "portable": ((), ("blas",)),
}
NAMES = ("host", *KINDS)


def gemm_kernel(path: str) -> str:
    """The kernel name of an int8 SIMD GEMM path ("vnni" -> "x86.vnni")."""
    return f"x86.{path}"


# int8 kernels of a SIMD GEMM path besides the path's own (x86.PATH): kernel -> its path
VARIANTS = {"x86.avx2.bytes": "avx2", "x86.avx2.w7": "avx2"}


def gemm_path(kernel: str) -> str | None:
    """The SIMD GEMM path of a kernel name ("x86.vnni" -> "vnni", "x86.avx2.bytes" ->
    "avx2"), None for the others."""
    if kernel in VARIANTS:
        return VARIANTS[kernel]
    path = kernel[4:] if kernel.startswith("x86.") else None
    return path if path in INT8_PATHS else None


def int8_paths() -> tuple[str, ...]:
    """The int8 SIMD GEMM paths this CPU runs, fastest first."""
    from .kernels import simd_module
    return tuple(p for p in INT8_PATHS if simd_module(p).available())


def fp32_paths() -> tuple[str, ...]:
    """The float convolution paths this CPU runs, fastest first ("blas" everywhere)."""
    from .kernels import fma
    return tuple(p for p in FP32_PATHS if p == "blas" or fma.available(p))


@lru_cache(maxsize=None)
def host_cpu() -> str:
    """This CPU's name as LLVM knows it ("znver4", "sapphirerapids"; "generic" where
    llvmlite cannot tell): what the kernel plan's costs may depend on (``SPEED_ON_CPU``)."""
    try:
        import llvmlite.binding as llvm
        return str(llvm.get_host_cpu_name()) or "generic"
    except Exception:  # noqa: BLE001 - no llvmlite, an odd platform
        return "generic"


@dataclass(frozen=True)
class Target:
    name: str
    int8: tuple[str, ...]     # SIMD GEMM paths offered, fastest first (none: portable only)
    fp32: tuple[str, ...]     # float convolution paths offered, fastest first
    cpu: str = "generic"      # the CPU the kernels run on (LLVM's name): the plan's costs

    @property
    def int8_path(self) -> str:
        """The fastest int8 GEMM path offered ("portable" where none is)."""
        return self.int8[0] if self.int8 else "portable"

    @property
    def fp32_path(self) -> str:
        return self.fp32[0]

    def int8_kernels(self) -> tuple[str, ...]:
        """The int8 kernel names offered, fastest first."""
        variants = tuple(k for k, p in VARIANTS.items() if p in self.int8)
        return tuple(gemm_kernel(p) for p in self.int8) + variants + ALWAYS

    def fp32_kernels(self) -> tuple[str, ...]:
        """The float convolution kernel names offered, fastest first."""
        return tuple(f"x86.{p}" for p in self.fp32 if p != "blas") + ("blas", "direct")

    def offers(self, kernel: str) -> bool:
        return kernel in self.int8_kernels() or kernel in self.fp32_kernels()

    def describe(self) -> str:
        return (f"target {self.name} on {self.cpu}: int8 {', '.join(self.int8_kernels())}; "
                f"fp32 {', '.join(self.fp32)}")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "int8": list(self.int8), "fp32": list(self.fp32),
                "cpu": self.cpu}

    @classmethod
    def from_json(cls, data: Any) -> "Target":
        """A target written by ``to_json``, checked against this CPU (a path it lacks is an
        error, as ``named``'s)."""
        try:
            t = cls(str(data["name"]), tuple(map(str, data["int8"])),
                    tuple(map(str, data["fp32"])), str(data.get("cpu", host_cpu())))
        except (KeyError, TypeError) as e:
            raise EqquantError(f"not a target: {data!r} ({e})") from None
        _check(t.name, t.int8, int8_paths(), "int8")
        _check(t.name, t.fp32, fp32_paths(), "float")
        if not t.fp32:
            raise EqquantError(f"target {t.name}: no float convolution path")
        return t

    @classmethod
    def host(cls) -> "Target":
        """Every kernel this CPU runs, less what ``EQQUANT_INT8_KERNEL`` /
        ``EQQUANT_FP32_KERNEL`` pin away (a pinned path this CPU lacks is an error)."""
        int8, fp32 = int8_paths(), fp32_paths()
        name = "host"
        pinned8 = os.environ.get("EQQUANT_INT8_KERNEL", "")
        if pinned8:
            if pinned8 not in INT8_PATHS + ("portable",):
                raise EqquantError(f"EQQUANT_INT8_KERNEL={pinned8}: not an int8 path (one of "
                                   f"{', '.join(INT8_PATHS + ('portable',))})")
            if pinned8 != "portable" and pinned8 not in int8:
                raise EqquantError(f"EQQUANT_INT8_KERNEL={pinned8}: this CPU runs "
                                   f"{', '.join(int8 + ('portable',))}")
            int8 = () if pinned8 == "portable" else (pinned8,)
            name += f", EQQUANT_INT8_KERNEL={pinned8}"
        pinned32 = os.environ.get("EQQUANT_FP32_KERNEL", "")
        if pinned32:
            if pinned32 not in FP32_PATHS:
                raise EqquantError(f"EQQUANT_FP32_KERNEL={pinned32}: not a float path (one of "
                                   f"{', '.join(FP32_PATHS)})")
            if pinned32 not in fp32:
                raise EqquantError(f"EQQUANT_FP32_KERNEL={pinned32}: this CPU runs "
                                   f"{', '.join(fp32)}")
            fp32 = (pinned32,)
            name += f", EQQUANT_FP32_KERNEL={pinned32}"
        return cls(name, int8, fp32, cpu=host_cpu())

    @classmethod
    def named(cls, name: str) -> "Target":
        """``host`` or a kind of CPU (``KINDS``) as this CPU runs it."""
        if name == "host":
            return cls.host()
        if name not in KINDS:
            raise EqquantError(f"no target {name!r} (one of {', '.join(NAMES)})")
        int8, fp32 = KINDS[name]
        _check(name, int8, int8_paths(), "int8")
        _check(name, fp32, fp32_paths(), "float")
        return cls(name, int8, fp32, cpu=host_cpu())


def _check(name: str, wanted, available, what: str) -> None:
    lacking = [p for p in wanted if p not in available]
    if lacking:
        raise EqquantError(f"target {name}: this CPU does not run the {what} path"
                           f"{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} (it runs "
                           f"{', '.join(available) or 'none'})")


_USED: list[Target] = []


def current() -> Target:
    """The process's target: the one ``use`` set, else the host's (read afresh: the pins are
    the environment's as it is now)."""
    return _USED[-1] if _USED else Target.host()


class using:
    """``with using(target):`` the process's target is ``target`` inside (an executor binds
    its kernels so), the one before after."""

    def __init__(self, target: Target):
        self.target = target

    def __enter__(self) -> Target:
        _USED.append(self.target)
        return self.target

    def __exit__(self, *exc) -> None:
        _USED.pop()


def chosen() -> Target | None:
    """The target ``use`` set (None: the host's is used)."""
    return _USED[-1] if _USED else None


def use(target: Target | str | None) -> None:
    """Make ``target`` (or its name) the process's target; None: the host's again."""
    _USED.clear()
    if target is not None:
        _USED.append(Target.named(target) if isinstance(target, str) else target)
