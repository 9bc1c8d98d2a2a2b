"""Small ops on one thread (``runtime/codegen/serial.py``): each elementwise kernel's one-thread call
gives the parallel kernel's bits through the same compiled entry, and a small op's step calls
it while a large one's calls the parallel kernel."""
from __future__ import annotations

import numpy as np
import pytest

from eqquant.ir.parser import parse
from eqquant.runtime.kernels import fp32 as k
from eqquant.runtime.kernels import int8 as k8
from eqquant.runtime.codegen import launch
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.codegen.serial import SERIAL_BELOW, sized


def _cases(rng, n):
    u8 = lambda: rng.integers(0, 256, n).astype(np.uint8)  # noqa: E731
    f32 = lambda: rng.normal(scale=50, size=n).astype(np.float32)  # noqa: E731
    i32 = rng.integers(-2 ** 20, 2 ** 20, n).astype(np.int32)
    return {
        "qadd": (k8.qadd, lambda o: (u8(), 3, u8(), 250, np.int64(1 << 30), -1,
                                     np.int64(1_500_000_000), 0, 7, 0, 255, o), np.uint8),
        "qadd_once": (k8.qadd_once, lambda o: (u8(), 3, u8(), 250, np.int64(3 << 20),
                                               np.int64(5 << 19), 22, 7, 0, 255, o), np.uint8),
        "qadd_once_split": (k8.qadd_once_split, lambda o: (
            u8(), np.int32(3), u8(), np.int32(250), *k8.split_multipliers(3 << 20, 5 << 19), 7,
            0, 255, o), np.uint8),
        "requantize": (k8.requantize, lambda o: (i32, 5, np.int64(1_300_000_000), -9, 3,
                                                 -128, 127, o), np.int8),
        "quantize": (k8.quantize, lambda o: (f32(), np.full(1, 0.37, np.float32),
                                              np.full(1, 5, np.int32), 0, 255, o), np.uint8),
        "dequantize": (k8.dequantize, lambda o: (u8(), np.full(1, 9, np.int32),
                                                  np.full(1, 0.05, np.float32), 1, o),
                       np.float32),
        "binary_same": (k.binary_same, lambda o: (f32(), f32(), 2, 1, o), np.float32),
        "unary": (k.unary, lambda o: (f32(), 2, np.float32(-3), np.float32(40), o),
                  np.float32),
    }


@pytest.mark.parametrize("name", ["qadd", "qadd_once", "qadd_once_split", "requantize",
                                  "quantize", "dequantize", "binary_same", "unary"])
def test_each_twin_gives_the_parallel_kernels_bits(name):
    rng = np.random.default_rng(0)
    kernel, args, dtype = _cases(rng, 40_000)[name]
    par, ser = np.zeros(40_000, dtype), np.zeros(40_000, dtype)
    values = args(par)
    kernel(*values)
    kernel.serial(*values[:-1], ser)
    np.testing.assert_array_equal(ser, par)
    assert par.any()
    # one compiled entry serves both: the serial call runs it as thread 0 of 1
    assert kernel._launch_args(values)[0] == kernel._launch_args((*values[:-1], ser))[0]
    assert sized(kernel, SERIAL_BELOW - 1) is kernel.serial
    assert sized(kernel, SERIAL_BELOW) is kernel


@pytest.mark.parametrize("side, serial", [(7, True), (56, False)])
def test_a_small_sum_runs_on_the_calling_thread(side, serial):
    """qnn.add over 7 x 7 x 64 values is bound to the one-thread twin, over 56 x 56 x 64 to
    the parallel kernel; both give the reference's bits (the first sum, reading the program's
    inputs, takes the same variant at each run)."""
    from eqquant.ir.interp import run
    text = f"""def @main(%a: Tensor[(1, {side}, {side}, 64), uint8],
                    %b: Tensor[(1, {side}, {side}, 64), uint8]) {{
      %0 = qnn.add(%a, %b, 0.05f, 3, 0.07f, 250, 0.09f, 7, method="once");
      qnn.add(%0, %0, 0.09f, 7, 0.09f, 7, 0.1f, 2, method="once")
    }}"""
    mod = parse(text)
    ex = Executor(mod)
    # (the second sum reads no program input: bound once, to its kernel's entry)
    call = ex._prepared[1][0]
    assert type(call) is (launch._BoundSerial if serial else launch._BoundLaunch)
    assert call.address in {e.address for e in k8.qadd_once_split._entries.values()}
    rng = np.random.default_rng(1)
    x = {n: rng.integers(0, 256, (1, side, side, 64)).astype(np.uint8) for n in "ab"}
    np.testing.assert_array_equal(ex.run(x), run(mod, x))
