"""The hand-written GEMMs (``llvm_loops.load_gemms``) and the window gather
(``gather.copy_windows``) are compiled once, as C functions, and every kernel calls them
through a slot that holds their address in this process: a kernel carries no copy of their
code, and one loaded from Numba's disk cache in another process links to that process's
slot."""
import os
import subprocess
import sys

import numpy as np
import pytest

from eqquant.runtime.codegen import llvm_loops
from eqquant.runtime.codegen.llvm_loops import cpu_has

# (module, a kernel calling its GEMM, that kernel's arguments, the GEMM symbol it calls)
AVX2 = "eqquant.runtime.kernels.avx2"
FMA = "eqquant.runtime.kernels.fma"


def _avx2_tile_args():
    rows = np.arange(8 * 64, dtype=np.int16).reshape(8, 64) % 100
    packed = np.ones((1, 32, 16, 2), np.int16)
    params = np.zeros((19, 16), np.int64)
    return rows, packed, 0, 1, 16, params, 0, 255, 0, np.zeros((8, 16), np.uint8)


def _fma_sgemm_args():
    a = np.ones((6, 5), np.float32)
    return a, np.ones((1, 5, 16), np.float32), np.zeros((6, 16), np.float32)


CALLERS = [
    pytest.param(AVX2, "_tile", _avx2_tile_args, "eqquant_avx2_gemm_requantize", id="avx2",
                 marks=pytest.mark.skipif(not cpu_has("avx2"), reason="no AVX2 here")),
    pytest.param(FMA, "sgemm", _fma_sgemm_args, "eqquant_fma_sgemm", id="fma",
                 marks=pytest.mark.skipif(not (cpu_has("avx2") and cpu_has("fma")),
                                          reason="no FMA here")),
]


@pytest.mark.parametrize("module, kernel, args, symbol", CALLERS)
def test_a_kernel_calls_its_gemm_through_the_slot_and_holds_no_copy(module, kernel, args,
                                                                     symbol):
    import importlib
    from numba import njit
    mod = importlib.import_module(module)
    fn = njit(getattr(mod, kernel).py_func)     # compiled here (a cached kernel shows no IR)
    fn(*args())
    ir = "\n".join(fn.inspect_llvm().values())
    defined = [line for line in ir.splitlines()
               if line.startswith("define") and f"@{symbol}(" in line]
    assert not defined, defined
    assert f"@eqquant_slot.{symbol} = external" in ir
    assert llvm_loops._SLOTS[symbol].value, "the slot was never filled"


@pytest.mark.parametrize("module, kernel, args, symbol", CALLERS)
def test_every_gemm_the_cpu_runs_is_in_its_slot(module, kernel, args, symbol):
    import importlib
    importlib.import_module(module)
    owners = {"eqquant_avx2": "avx2", "eqquant_fma": "fma"}
    owner = next(o for prefix, o in owners.items() if symbol.startswith(prefix))
    filled = {s for s, cell in llvm_loops._SLOTS.items() if cell.value}
    assert {s for s in llvm_loops._SLOTS if s.startswith(f"eqquant_{owner}_")} <= filled
    assert owner in llvm_loops._TABLES


_ROUND_TRIP = """
import numpy as np
from eqquant.runtime.kernels import {name} as m
from eqquant.runtime.codegen.llvm_loops import _SLOTS
rng = np.random.default_rng(3)
{body}
print(_SLOTS["{symbol}"].value)
"""

BODIES = {
    "avx2": ("eqquant_avx2_gemm", """
a = rng.integers(0, 256, (13, 40)).astype(np.uint8)
w = rng.integers(-128, 128, (21, 40)).astype(np.int8)
packed, _, kp = m.pack(w)
a = np.pad(a, ((0, 0), (0, kp - a.shape[1])))
out = np.zeros((13, packed.shape[0] * m.BLOCK), np.int32)
m.gemm(a, packed, out)
assert (out[:, :21] == a[:, :40].astype(np.int64) @ w.T.astype(np.int64)).all()
"""),
    "fma": ("eqquant_fma_sgemm", """
a = rng.integers(-8, 8, (13, 7)).astype(np.float32)
w = rng.integers(-8, 8, (21, 7)).astype(np.float32)
packed = m.pack(w)
out = np.zeros((13, packed.shape[0] * m.block_of("fma")), np.float32)
m.sgemm(a, packed, out)
assert (out[:, :21] == a @ w.T).all()
"""),
}


@pytest.mark.parametrize("name", [
    pytest.param("avx2", marks=pytest.mark.skipif(not cpu_has("avx2"), reason="no AVX2")),
    pytest.param("fma", marks=pytest.mark.skipif(not (cpu_has("avx2") and cpu_has("fma")),
                                                 reason="no FMA")),
])
def test_a_kernel_from_the_disk_cache_calls_the_gemm_of_its_own_process(name, tmp_path):
    """Compiled in one process and loaded from the cache in the next, a kernel's call goes
    to the second process's GEMM (its slot resolved again at load), and gives exact sums."""
    symbol, body = BODIES[name]
    code = _ROUND_TRIP.format(name=name, body=body, symbol=symbol)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"))
    slots = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr
        slots.append(int(done.stdout.split()[-1]))
    assert any((tmp_path / "numba").rglob(f"*{name}*.nbi")), "nothing was cached"
    assert all(slots)


def test_the_gather_is_called_through_its_slot_too():
    """The window gather (``gather._windows``) is one C function per element type as well:
    a kernel that gathers (``_rows``) holds a call through the slot, not the gather's code,
    and gives the gather's rows."""
    from numba import njit

    from eqquant.runtime.kernels import gather
    gather.load_entry("uint8")      # (as the modules whose kernels gather bytes do)
    gather.load_entry("float32")    # (as fma.py does, whichever tests ran before here)
    rows_of = njit(gather._rows.py_func)     # compiled here (a cached kernel shows no IR)
    hwc = np.arange(5 * 6 * 4, dtype=np.uint8).reshape(5, 6, 4)
    got = rows_of(hwc, 3, 3, 1, 1, 1, 1, 1, 1, 7, 6, 2, 20, 40)
    want = np.empty((20, 40), np.uint8)
    gather._windows(hwc, 3, 3, 1, 1, 1, 1, 1, 1, 7, 6, 2, want)
    np.testing.assert_array_equal(got, want)
    ir = "\n".join(rows_of.inspect_llvm().values())
    assert "@eqquant_slot.eqquant_windows_u8 = external" in ir
    assert not [line for line in ir.splitlines()
                if line.startswith("define") and "gather8_windows" in line]
    assert llvm_loops._SLOTS["eqquant_windows_u8"].value
    assert llvm_loops._SLOTS["eqquant_windows_f32"].value
