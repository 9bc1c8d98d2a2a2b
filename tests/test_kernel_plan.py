"""The kernel plan: each int8 site's kernel chosen for a target by the lowering's table, named
in the extracted program (``kernel="x86.vnni16"``), shown by ``run -v`` and ``--explain``, and
honoured or refused, with the site's location, where a program names one."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from conftest import cli_exit
from eqquant.errors import EqquantError, KernelError
from eqquant.ir.interp import run
from eqquant.ir.loader import save_program
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.lowering.plan import (Site, choose, contenders, options, plan_kernels,
                                          timed, unplanned)
from eqquant.runtime.target import (INT8_PATHS, KINDS, Target, current, gemm_kernel, gemm_path,
                                    int8_paths)

# a 3x3 convolution of 32 channels, a depthwise one and a dense layer of one row
PROGRAM = """
def @main(%x: Tensor[(1, 8, 8, 32), uint8]) {{
  %0 = fused.qconv2d(%x, {w0}, {b}, 3, 0, 0.05f, {s}, {s}, 0, 0.1f, 5,
                     padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="HWIO", axis=3,
                     activation="relu", out_dtype="uint8"{k0});
  %1 = fused.qconv2d(%0, {w1}, {b}, 5, 0, 0.1f, {s}, {s}, 0, 0.1f, 2,
                     padding=[1, 1, 1, 1], groups=32, data_layout="NHWC",
                     kernel_layout="HWIO", axis=3, out_dtype="uint8"{k1});
  %2 = reshape(%1, newshape=[1, 2048]);
  qnn.dense(%2, {w2}, 2, 0, 0.1f, 0.02f{k2})
}}
"""


def _program(k0="", k1="", k2=""):
    """PROGRAM with its weights, the sites' kernels as given (none: the target chooses)."""
    rng = np.random.default_rng(0)
    from eqquant.ir.params import bind_params, meta_key
    data = {"w0": rng.integers(-60, 60, (3, 3, 32, 32)).astype(np.int8),
            "b": rng.integers(-2000, 2000, 32).astype(np.int32),
            "s": (rng.random(32) * 0.01 + 0.001).astype(np.float32),
            "w1": rng.integers(-60, 60, (3, 3, 1, 32)).astype(np.int8),
            "w2": rng.integers(-60, 60, (10, 2048)).astype(np.int8)}
    meta = {name: f"meta[relay.Constant][{i}] /* ty=Tensor[{tuple(a.shape)}, {a.dtype}] */"
            .replace(",)", ")") for i, (name, a) in enumerate(data.items())}
    text = PROGRAM.format(**meta, **{k: f', kernel="{v}"' if v else "" for k, v in
                                     (("k0", k0), ("k1", k1), ("k2", k2))})
    mod = parse(text)
    return bind_params(mod, {meta_key(i): a for i, a in enumerate(data.values())}), text


def _x(seed=1):
    return {"x": np.random.default_rng(seed).integers(0, 256, (1, 8, 8, 32)).astype(np.uint8)}


def _kernels(text: str) -> list[str]:
    return re.findall(r'kernel="([a-z0-9.]*)"', text)


def test_the_plan_names_every_sites_kernel_and_the_executor_runs_it():
    mod, _ = _program()
    planned, decisions = plan_kernels(mod)
    named = _kernels(print_module(planned))
    assert len(named) == 3 == len(decisions)
    # the 3x3 layer (32 channels, K 288: no multiple of 64, which the tiles want) takes a
    # GEMM, the narrow blocks of 16 where the CPU has them; the depthwise one the direct
    # kernel, the one-row dense layer the dot products (no GEMM tile fills with one row)
    assert named[1:] == ["depthwise", "portable"]
    offered = current().int8      # (the host's, less what EQQUANT_INT8_KERNEL pins away)
    gemms = [k for k in current().int8_kernels() if gemm_path(k) not in (None, "amx")]
    assert named[0] in gemms if gemms else named[0] == "portable"
    from eqquant.runtime.lowering.plan import speed
    narrow = [gemm_kernel(p) for p in offered if p in ("vnni16", "avxvnni")]
    if narrow:      # (32 channels: a narrow block pads none; the cheaper per the CPU's table)
        assert named[0] == min(narrow, key=lambda k: speed(k, current()))
    ex = Executor(mod)
    assert [r["path"] for r in ex.kernel_plan() if r["op"] in ("fused.qconv2d", "qnn.dense")] \
        == named
    x = _x()
    np.testing.assert_array_equal(ex.run(x), run(mod, x))
    # the plan is the program's: planned again it is the same
    assert print_module(plan_kernels(planned)[0]) == print_module(planned)


@pytest.mark.parametrize("kind", ["host", *KINDS])
def test_each_target_plans_only_kernels_it_offers_and_gives_the_same_bits(kind):
    try:
        target = Target.named(kind)
    except EqquantError as e:             # a kind whose kernels this CPU lacks: refused
        assert "this CPU does not run" in e.message
        assert not set(KINDS[kind][0]) <= set(int8_paths()) or kind == "avx512"
        return
    mod, _ = _program()
    planned, decisions = plan_kernels(mod, target)
    for d in decisions:
        assert target.offers(d.chosen.kernel)
        assert d.chosen.cost == min(o.cost for o in d.options if o.cost is not None)
    ex = Executor(planned, target)
    x = _x(2)
    np.testing.assert_array_equal(ex.run(x), run(mod, x))


@pytest.mark.parametrize("kernel", ["portable", *(gemm_kernel(p) for p in INT8_PATHS)])
def test_a_kernel_pinned_in_the_program_is_honoured(kernel):
    if kernel != "portable" and not current().offers(kernel):
        with pytest.raises(KernelError, match="does not offer it"):
            Executor(_program(k0=kernel)[0])
        return
    mod, _ = _program(k0=kernel)
    ex = Executor(mod)
    step = next(s for s in ex.steps if s.label == "fused.qconv2d")
    assert step.fn.path == kernel
    x = _x(3)
    np.testing.assert_array_equal(ex.run(x), run(mod, x))


def test_a_pinned_kernel_that_cannot_run_its_site_is_refused_where_it_is_written(tmp_path):
    mod, text = _program(k0="depthwise")
    with pytest.raises(KernelError) as e:
        Executor(mod)
    assert e.value.loc is not None and e.value.loc.line == 3     # the line of %0
    assert "not a depthwise convolution" in e.value.message and "--replan" in e.value.message
    # the command line says it the same way, exit status 2, nothing run
    save_program(tmp_path / "p.ir", mod)
    np.savez(tmp_path / "x.npz", **_x())
    assert cli_exit(["run", str(tmp_path / "p.ir"), "-x", str(tmp_path / "x.npz")]) == 2


def test_a_dense_layer_pinned_to_a_gemm_its_batch_cannot_fill_is_refused():
    if not current().int8:
        pytest.skip("this target offers no SIMD GEMM to pin (a CPU without one, or "
                    "EQQUANT_INT8_KERNEL=portable)")
    mod, _ = _program(k2=gemm_kernel(current().int8[-1]))
    with pytest.raises(KernelError, match="a batch of 1 rows fills no tile"):
        Executor(mod)


def test_a_plan_made_for_another_target_is_refused_until_planned_again():
    mod, _ = _program(k0="x86.vnni")
    portable = Target.named("portable")
    with pytest.raises(KernelError, match="target portable does not offer it"):
        Executor(mod, portable)
    ex = Executor(unplanned(mod), portable)
    assert [r["path"] for r in ex.kernel_plan() if r["path"]] == \
        ["portable", "depthwise", "portable"]
    x = _x(4)
    np.testing.assert_array_equal(ex.run(x), run(mod, x))


def test_the_cheapest_kernel_follows_the_tables_costs():
    every = Target("every", INT8_PATHS, ("blas",))
    site = Site("fused.qconv2d", 24, 144, 1, False, False)
    by_kernel = {o.kernel: o for o in options(site, every)}
    assert by_kernel["depthwise"].cost is None
    assert by_kernel["x86.vnni"].cost == pytest.approx(64 / 24)
    assert by_kernel["x86.vnni16"].cost == pytest.approx(1.15 * 32 / 24)
    assert choose(site, every).kernel == "x86.vnni16"
    # weight zero points keep every GEMM out, groups too; a pin that cannot run is refused
    assert choose(Site("qnn.conv2d", 64, 576, 1, True, False), every).kernel == "portable"
    with pytest.raises(KernelError, match="zero points"):
        choose(Site("qnn.conv2d", 64, 576, 1, True, False), every, "x86.vnni")
    assert choose(Site("qnn.conv2d", 64, 9, 64, False, True), every).kernel == "depthwise"


def test_the_avx2_byte_driver_is_planned_where_its_rows_are_long(tmp_path):
    """x86.avx2.bytes (the byte driver, launches like the 16-bit one: a library holds either)
    is offered wherever the avx2 path is, and planned on a convolution's rows of BYTES_FROM
    bytes or more; a pin of it where the target does not offer it is refused; a target
    name the CLI does not know is a usage error (exit 2), nothing run."""
    from eqquant.runtime.kernels import avx2
    site = Site("fused.qconv2d", 32, 288, 1, False, False, eight_bit=True)
    cpu, none = Target("t", ("avx2",), ("blas",)), Target("t", (), ("blas",))
    assert cpu.offers("x86.avx2.bytes") and not none.offers("x86.avx2.bytes")
    assert choose(site, cpu).kernel == "x86.avx2.bytes"
    short = {o.kernel: o for o in options(Site("fused.qconv2d", 32, 64, 1, False, False,
                                               eight_bit=True), cpu)}["x86.avx2.bytes"]
    assert short.cost is None and str(avx2.BYTES_FROM) in short.why
    dense = Site("qnn.dense", 32, 2048, 1, False, False, 64)
    assert choose(dense, cpu).kernel == "x86.avx2"
    assert Target.from_json(cpu.to_json()) == cpu
    with pytest.raises(KernelError, match="does not offer it"):
        Executor(_program(k0="x86.avx2.bytes")[0], Target.named("portable"))
    mod, _ = _program(k0="x86.avx2.bytes")
    x = _x(5)
    np.testing.assert_array_equal(Executor(mod, Target.named("avx2")).run(x), run(mod, x))
    save_program(tmp_path / "p.ir", mod)
    assert cli_exit(["extract", str(tmp_path / "p.ir"), "--target", "avx9000"]) == 2


def test_targets_are_checked_against_this_cpu_and_round_trip():
    host = Target.named("host")
    pinned = os.environ.get("EQQUANT_INT8_KERNEL")      # (CI's runs with a path forced)
    assert host.int8 == (int8_paths() if not pinned else
                         tuple(p for p in int8_paths() if p == pinned))
    assert ("EQQUANT_INT8_KERNEL" in host.name) == bool(pinned)
    assert Target.from_json(host.to_json()) == host
    with pytest.raises(EqquantError, match="no target 'avx1024'"):
        Target.named("avx1024")
    lacking = [p for p in INT8_PATHS if p not in int8_paths()]
    if lacking:
        with pytest.raises(EqquantError, match="this CPU does not run"):
            Target.from_json({"name": "x", "int8": lacking, "fp32": ["blas"]})
    assert Target.named("portable").int8_kernels() == ("depthwise", "portable")


def test_extract_prints_the_plan_and_explains_it(tmp_path, capsys):
    mod, _ = _program()
    save_program(tmp_path / "p.ir", mod)
    assert cli_exit(["extract", str(tmp_path / "p.ir"), "-r", "layout", "--explain",
                     "--target", "portable"]) == 0
    out = capsys.readouterr().out
    assert _kernels(out) == ["portable", "depthwise", "portable"]
    assert "target portable" in out and "kernel plan" in out
    assert "not x86.amx" not in out                  # (not offered: not a reason to list)
    assert "a batch of 1 rows" not in out
    # a pinned program keeps its pin through extraction, and says so
    save_program(tmp_path / "q.ir", _program(k0="portable")[0])
    assert cli_exit(["extract", str(tmp_path / "q.ir"), "-r", "layout", "--explain"]) == 0
    out = capsys.readouterr().out
    assert _kernels(out)[0] == "portable" and "pinned in the program" in out


def test_run_verbose_shows_each_sites_kernel(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EQQUANT_DEPLOY", "0")
    mod, _ = _program()
    save_program(tmp_path / "p.ir", mod)
    np.savez(tmp_path / "x.npz", **_x())
    assert cli_exit(["run", str(tmp_path / "p.ir"), "-x", str(tmp_path / "x.npz"), "-v",
                     "--target", "portable"]) == 0
    err = capsys.readouterr().err
    rows = [line.split() for line in err.splitlines() if "fused.qconv2d" in line or
            "qnn.dense" in line]
    # (the columns after the path: layout, "dtype -> dtype", threads)
    assert [r[-6] for r in rows] == ["portable", "depthwise", "portable"]


def test_the_tables_costs_follow_the_targets_cpu():
    """A Zen 4 (LLVM's "znver4") runs AVX-512 on 256-bit units: there the 256-bit VNNI kernel
    costs what the 512-bit one does per multiply-add and wins wherever it pads less; elsewhere
    the table ranks as before. The CPU is part of the target, printed and round-tripped."""
    generic = Target("every", INT8_PATHS, ("blas",))
    zen4 = Target("every", INT8_PATHS, ("blas",), cpu="znver4")
    narrow, wide = (Site("fused.qconv2d", c, 144, 1, False, False) for c in (16, 256))
    assert choose(narrow, generic).kernel == "x86.vnni16"
    assert choose(narrow, zen4).kernel == "x86.avxvnni"
    assert choose(Site("fused.qconv2d", 96, 144, 1, False, False), zen4).kernel == \
        "x86.avxvnni"
    assert choose(wide, generic).kernel == choose(wide, zen4).kernel == "x86.vnni"
    assert "on znver4" in zen4.describe()
    here = Target("t", int8_paths(), ("blas",), cpu="znver4")
    assert Target.from_json(here.to_json()) == here


class _Stopwatch:
    """A measured cost model's face to the plan: a time per kernel, None where it has none."""

    def __init__(self, seconds):
        self.seconds, self.asked = seconds, []

    def measured_seconds(self, op, attrs, in_types, out_type, consts=frozenset()):
        self.asked.append(attrs["kernel"])
        return self.seconds.get(attrs["kernel"])


def test_a_measured_plan_takes_the_fastest_contender_timed_at_the_site():
    """With a measured cost model the table only names the contenders (within CONTENDERS
    times its cheapest: never the portable loops beside a GEMM); the fastest of them timed
    at the site is taken and the plan prints the times. Where one contender has no time the
    table decides."""
    every = Target("every", INT8_PATHS, ("blas",))
    site = Site("fused.qconv2d", 24, 144, 1, False, False)
    rivals = [o.kernel for o in contenders(options(site, every))]
    assert "portable" not in rivals and "x86.vnni16" in rivals
    times = {k: 1e-4 for k in rivals} | {"x86.avx2": 5e-5}
    assert choose(site, every, opts=timed(options(site, every), times)).kernel == "x86.avx2"
    del times["x86.vnni"]
    assert choose(site, every, opts=timed(options(site, every), times)).kernel == \
        "x86.vnni16"                                          # (the table's choice)
    mod, _ = _program()
    host = current()
    watch = _Stopwatch({k: 1e-4 for k in host.int8_kernels()} | {"portable": 1e-6})
    planned, decisions = plan_kernels(mod, host, watch)
    first = decisions[0]
    if host.int8:      # a GEMM runs the 3x3 convolution: the portable loops are not timed
        assert next(o for o in first.options if o.kernel == "portable").seconds is None
        timed_here = [o.kernel for o in first.options if o.seconds is not None]
        assert first.chosen.kernel == timed_here[0]     # (all tie: the table's order)
        assert all(k.startswith("x86.") for k in timed_here)
        assert "fastest measured" in first.lines()[0] and "(100.0 us)" in first.lines()[1]
    x = _x(6)
    np.testing.assert_array_equal(Executor(planned, host).run(x), run(mod, x))


def test_a_measured_plan_times_the_real_kernels(tmp_path, monkeypatch):
    """With ``MeasuredCost`` the contenders are the executor's own kernels, timed at the site
    and cached per CPU: the plan takes the fastest of those times and runs with the
    reference's bits."""
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(tmp_path))
    from eqquant.runtime.execution.measured_cost import KernelTimes, MeasuredCost
    mod, _ = _program()
    model = MeasuredCost(KernelTimes(tmp_path / "times.json"))
    planned, decisions = plan_kernels(mod, current(), model)
    for d in decisions:
        measured = [o for o in d.options if o.seconds is not None]
        assert measured, d.lines()
        assert d.chosen.seconds == min(o.seconds for o in measured)
    x = _x(7)
    np.testing.assert_array_equal(Executor(planned).run(x), run(mod, x))
    model.flush()
    again = MeasuredCost(KernelTimes(tmp_path / "times.json"), measure=False)
    assert [d.chosen.kernel for d in plan_kernels(mod, current(), again)[1]] == \
        [d.chosen.kernel for d in decisions]          # the times come back from the cache
