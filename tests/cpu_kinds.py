"""The CPU kinds this project's machines are drawn from, as a more capable machine runs them:
Numba told to compile for a CPU with fewer features (``NUMBA_CPU_NAME``,
``NUMBA_CPU_FEATURES``), which eqquant's kernel choice follows (``llvm_loops.cpu_has``). An
Intel Xeon with AMX so runs what an AMD EPYC with AVX2 only runs: its int8 and float paths,
the code LLVM emits for it, its libraries.

    python tests/cpu_kinds.py avx2      # shell lines setting the two variables (nothing
                                        # where this CPU is that kind, or lacks a feature)

Kinds: "avx2" (an AMD EPYC Zen 3: AVX2 and FMA, no AVX-512, no VNNI), "avx512" (an AMD EPYC
Zen 4: AVX512-VNNI, no AMX).
"""
from __future__ import annotations

import sys

# per kind: the CPU LLVM schedules for, the feature families it lacks (by name prefix), and
# the features it must have (the host must have them to run its code)
KINDS = {
    "avx2": ("znver3", ("avx512", "amx", "avx10", "avxvnni", "avxifma", "avxneconvert",
                        "gfni"), ("avx2", "fma")),
    "avx512": ("znver4", ("amx", "avx10", "avx512fp16"), ("avx512f", "avx512bw",
                                                           "avx512vnni")),
}


def host_features() -> dict[str, bool]:
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    return {name: bool(on) for name, on in llvm.get_host_cpu_features().items()}


def environment(kind: str) -> dict[str, str] | None:
    """The settings that make this machine run ``kind``'s kernels, or None where it cannot
    (a feature the kind has that this CPU lacks) or need not (this CPU is that kind)."""
    name, lacks, needs = KINDS[kind]
    host = host_features()
    if not all(host.get(f) for f in needs):
        return None
    masked = {f: on and not f.startswith(lacks) for f, on in host.items()}
    if masked == host:
        return None
    features = ",".join(("+" if on else "-") + f for f, on in sorted(masked.items()))
    return {"NUMBA_CPU_NAME": name, "NUMBA_CPU_FEATURES": features}


if __name__ == "__main__":
    env = environment(sys.argv[1])
    for key, value in (env or {}).items():
        print(f"export {key}='{value}'")
