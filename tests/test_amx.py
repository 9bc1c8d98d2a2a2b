"""The AMX tile GEMMs (runtime/kernels/amx.py): their code as LLVM compiles it for a CPU with AMX
(on any x86-64 host), which layers take them, and their bits where the CPU has AMX and Linux
grants the tiles (the kernel-path tests run every path the CPU has besides)."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eqquant.runtime.kernels import amx


def _compiled(epilogue: bool) -> str:
    """The assembly of a tile GEMM, through LLVM's -O3 pipeline (Numba's level) for a
    Sapphire Rapids CPU, whatever the host."""
    import llvmlite.binding as llvm
    from llvmlite import ir
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    module = ir.Module("amx")
    define = amx.define_tdpbusd("tile_gemm", epilogue)
    define(module)
    module.globals[define.symbol].linkage = ""      # kept: nothing here calls it
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    target = llvm.Target.from_triple("x86_64-unknown-linux-gnu")
    machine = target.create_target_machine(cpu="sapphirerapids", opt=3)
    tuning = llvm.create_pipeline_tuning_options(speed_level=3)
    builder = llvm.create_pass_builder(machine, tuning)
    builder.getModulePassManager().run(parsed, builder)
    return machine.emit_assembly(parsed)


@pytest.mark.parametrize("epilogue", [False, True])
def test_the_tile_gemms_keep_their_tiles_in_registers(epilogue):
    """Four sums, one tile of A and one of B: six of the eight tiles, configured once per
    group of pixels. A spill would store a tile to the stack and load it back in the loop
    over K (a loop tested at its top did so under -O3: three tiles spilled, 1 KB each)."""
    asm = _compiled(epilogue)
    dots, loads = asm.count("tdpbusd"), asm.count("tileloadd")
    assert dots >= 4 and dots % 4 == 0
    assert loads == dots // 4 * 5                 # A once and B four times a step of K
    assert asm.count("tilestored") == 4           # the four sums, once
    assert asm.count("ldtilecfg") == 1 and "tilerelease" in asm
    frame = max((int(n) for n in re.findall(r"subq\s+\$(\d+), %rsp", asm)), default=0)
    # the epilogue's one tile of sums on the stack (16 x 64 int32), nothing more tile-sized
    assert frame < (4096 + 1024 if epilogue else 1024), frame


def test_layers_take_the_tiles_where_they_pay():
    """Chosen by the lowering's costs, the tiles take layers of K a multiple of 64, 128 or
    more; the others (MobileNet's 1 x 1 layers of 24 or 144 inputs, a 7 x 7 stem of 3) go to
    the next path (and there, the narrow layers to the blocks of 16); a target that offers
    only the tiles puts every layer on them, one that offers only VNNI the blocks of 64."""
    from eqquant.runtime.lowering.plan import Site, choose
    from eqquant.runtime.target import INT8_PATHS, Target
    every = Target("every", INT8_PATHS, ("blas",))     # (as if this CPU had every path)

    def kernel(o, k, zero_points=False, target=every):
        return choose(Site("fused.qconv2d", o, k, 1, zero_points, False), target).kernel

    assert [amx.suits(k) for k in (64, 128, 147, 192, 256, 576, 4608)] == \
        [False, True, False, True, True, True, True]
    assert kernel(64, 576) == "x86.amx"
    assert kernel(192, 24) == "x86.vnni"
    assert kernel(24, 144) == "x86.vnni16"       # and VNNI's narrow rule
    assert [kernel(o, 64) for o in (16, 96, 144, 160, 192, 320, 1000)] == \
        ["x86.vnni16"] * 4 + ["x86.vnni"] * 3
    assert kernel(64, 576, zero_points=True) == "portable"
    assert kernel(144, 24, target=Target("tiles", ("amx",), ("blas",))) == "x86.amx"
    assert kernel(24, 64, target=Target("vnni", ("vnni",), ("blas",))) == "x86.vnni"


def test_the_tiles_are_asked_of_the_system_once():
    """``available`` is False without AMX-INT8, and asks Linux for the tiles only where the
    CPU has them (the answer kept: the permission is the process's)."""
    from eqquant.runtime.codegen.llvm_loops import cpu_has
    if not (cpu_has("amx-int8") and cpu_has("amx-tile")):
        assert not amx.available()
        return
    assert amx.available() == amx.tile_permission()
    assert amx.tile_permission.cache_info().currsize == 1


needs_amx = pytest.mark.skipif(not amx.available(),
                               reason="this CPU (or its system) gives no AMX tiles")


@needs_amx
@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 70), k=st.integers(1, 300), o=st.integers(1, 200),
       p0=st.integers(0, 20), seed=st.integers(0, 2 ** 16))
def test_tile_gemm_is_exact_on_any_shape(p, k, o, p0, seed):
    """C = A x B on the tiles for any rows (a last group of fewer than 16 pixels), any K
    (padded to 64 with zeros) and any channels (a last block padded to 64), from any first
    row, the extremes 255 x -128 in every product of a row and a channel: the exact int32
    sums, the padded channels 0, the rows outside p0..p untouched."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (o, k)).astype(np.int8)
    w[0] = -128
    a = rng.integers(0, 256, (p, k)).astype(np.uint8)
    a[-1] = 255
    packed, colsum128, kp = amx.pack(w)
    assert kp % 64 == 0 and kp - 64 < k <= kp
    np.testing.assert_array_equal(colsum128, 128 * w.astype(np.int64).sum(axis=1))
    rows = np.zeros((p, kp), np.uint8)
    rows[:, :k] = a
    out = np.full((p, packed.shape[0] * amx.BLOCK), 7, np.int32)
    start = min(p0, p - 1)
    amx.gemm(rows, packed, out, start)
    want = a.astype(np.int64) @ w.astype(np.int64).T
    np.testing.assert_array_equal(out[start:, :o], want[start:])
    assert not out[start:, o:].any() and (out[:start] == 7).all()
