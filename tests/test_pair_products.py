"""Attention's products of two computed operands (``qnn.batch_matmul``) as the kernel plan
chooses them: the 16-bit GEMM ("x86.avx2": b less its zero point packed as panels at run
time, then a's rows less theirs times them) or the portable loops, each the reference's
exact int32 sums, in the dot form (q @ k^T) and the other (softmax @ v), transposed or not,
with zero points from 0 to 255 and computed at run time; named in the program, refused where
it cannot run, and held by a library saved ahead of time."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import eqquant
from eqquant.errors import KernelError
from eqquant.ir.interp import run
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.lowering.plan import plan_kernels
from eqquant.runtime.target import Target, current

avx2 = pytest.importorskip("eqquant.runtime.kernels.avx2")


def _program(batch, m, n, k, ta, tb, za, zb, pin=""):
    a = (*batch, k, m) if ta else (*batch, m, k)
    b = (*batch, n, k) if tb else (*batch, k, n)
    kernel = f', kernel="{pin}"' if pin else ""
    return eqquant.parse(
        f"def @main(%a: Tensor[{a}, uint8], %b: Tensor[{b}, uint8]) {{\n"
        f"  qnn.batch_matmul(%a, %b, {za}, {zb}, 0.1f, 0.2f, transpose_a={ta}, "
        f"transpose_b={tb}{kernel})\n}}\n"), a, b


@settings(max_examples=30, deadline=None)
@given(batch=st.sampled_from([(1,), (2,), (1, 3), (2, 2)]), m=st.integers(1, 60),
       n=st.integers(1, 40), k=st.integers(1, 70), ta=st.booleans(), tb=st.booleans(),
       za=st.integers(0, 255), zb=st.integers(0, 255), seed=st.integers(0, 999))
@example(batch=(1, 2), m=128, n=128, k=64, ta=False, tb=True, za=120, zb=124, seed=0)  # q k^T
@example(batch=(1, 2), m=128, n=64, k=128, ta=False, tb=False, za=0, zb=138, seed=1)  # p v
def test_both_kernels_give_the_references_sums(batch, m, n, k, ta, tb, za, zb, seed):
    rng = np.random.default_rng(seed)
    kernels = ["portable"] + (["x86.avx2"] if current().offers("x86.avx2") else [])
    for kernel in kernels:
        mod, a, b = _program(batch, m, n, k, ta, tb, za, zb, pin=kernel)
        ex = Executor(mod)
        assert [d.chosen.kernel for d in ex.kernel_decisions] == [kernel]
        xs = [{"a": rng.integers(0, 256, a).astype(np.uint8),
               "b": rng.integers(0, 256, b).astype(np.uint8)},
              {"a": np.full(a, 255, np.uint8), "b": np.zeros(b, np.uint8)}]   # the extremes
        for x in xs:
            np.testing.assert_array_equal(ex.run(x), run(mod, x), err_msg=kernel)


def test_the_plan_names_the_gemm_where_the_target_offers_it_and_says_why_not_elsewhere():
    mod, _, _ = _program((1, 2), 16, 16, 8, False, True, 3, 4)
    planned, (d,) = plan_kernels(mod, current())
    want = "x86.avx2" if current().offers("x86.avx2") else "portable"
    assert d.chosen.kernel == want and f'kernel="{want}"' in eqquant.print_module(planned)
    assert "two computed operands" in d.lines()[0]
    _, (p,) = plan_kernels(mod, Target.named("portable"))
    assert p.chosen.kernel == "portable"
    wide, _, _ = _program((1,), 8, 8, 8, False, True, 40000, 4)
    _, (w,) = plan_kernels(wide, current())
    opt = {o.kernel: o for o in w.options}["x86.avx2"]
    assert w.chosen.kernel == "portable" and opt.cost is None
    assert "leaves int16" in opt.why or "does not offer" in opt.why
    if current().offers("x86.avx2"):
        pinned, _, _ = _program((1,), 8, 8, 8, False, True, 40000, 4, pin="x86.avx2")
        with pytest.raises(KernelError, match="cannot run this site"):
            plan_kernels(pinned, current())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libraries are built on Linux")
def test_a_library_holds_the_gemms_launches(tmp_path):
    from eqquant.deploy.build import build, not_launches
    from eqquant.deploy.loader import Library
    if not current().offers("x86.avx2"):
        pytest.skip("this CPU has no AVX2: the 16-bit GEMM cannot run here")
    mod, a, b = _program((1, 2), 40, 24, 20, False, True, 7, 200)
    ex = Executor(mod)
    assert [d.chosen.kernel for d in ex.kernel_decisions] == ["x86.avx2"]
    assert not_launches(ex) == []
    build(ex, tmp_path / "lib")
    rng = np.random.default_rng(3)
    x = {"a": rng.integers(0, 256, a).astype(np.uint8),
         "b": rng.integers(0, 256, b).astype(np.uint8)}
    np.testing.assert_array_equal(Library(tmp_path / "lib").run(x), run(mod, x))
