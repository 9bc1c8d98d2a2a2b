"""The main job, stage by stage, on a zoo model: what ``eqquant demo`` runs.

Stages so far: build the model, write it as text IR + params, parse it back, type-check,
check the round trip, run the reference interpreter, optimize (saturate with the simplify,
bn_fold and fusion rules, extract under the CPU cost model, fold constants), write the result,
run it on the Numba executor and check it against the original; then quantize it (calibrate,
mark the values, saturate with the quantize rules, extract the int8 program), write it and its
realize view, and report its accuracy. Each stage reports what it did and how long it took.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import EqquantError
from .ir.interp import run
from .ir.loader import load_program, save_program
from .ir.nodes import Call, post_order
from .ir.params import load_params
from .ir.parser import parse
from .ir.printer import print_module
from .ir.typecheck import check_module
from .optimizer import optimize
from .quant.annotate import annotate, calibrate
from .quant.realize import realize_view
from .runtime.executor import Executor
from .zoo import build, write


class _Stages:
    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo

    def __call__(self, label: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.echo(f"  {label:<34s} {1e3 * (time.perf_counter() - t0):9.1f} ms")
        return out


def demo(model: str, out_dir: str | Path, echo: Callable[[str], None] = print) -> dict:
    stage = _Stages(echo)
    echo(f"eqquant demo: {model}")
    zoo_model = stage("build zoo model", build, model)
    paths = stage(f"write {Path(out_dir)}/", write, zoo_model, out_dir)
    mod, params = stage("parse text IR + params", load_program, paths["ir"])
    types = stage("type-check", check_module, mod)
    text = print_module(mod)
    if stage("round trip print -> parse", lambda: parse(text)) != mod:
        raise EqquantError("internal: the printed program does not parse back to itself")
    inputs = load_params(paths["input"])
    ref = stage("run (reference interpreter)", run, mod, inputs, params)
    result = stage("saturate + extract + fold", optimize, mod, params,
                   ["simplify", "bn_fold", "fusion"], "simplify; bn_fold; simplify; fusion")
    opt_paths = stage("write optimized program", save_program,
                      Path(out_dir) / f"{model}.opt.ir", result.module)
    ex = stage("load on the CPU executor", Executor, result.module)
    stage("run on the executor (first)", ex.run, inputs)
    out = stage("run on the executor (warm)", ex.run, inputs)
    err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    echo(f"  program: output {types[id(mod.main.body)]}")
    echo("")
    for line in result.explain().splitlines():
        echo("  " + line)
    echo("")
    echo(f"  executor (fused, Numba) vs reference interpreter on the original: max relative "
         f"difference {err:.2e}")
    echo(f"  wrote {opt_paths[0]}")
    if err > 1e-4:
        raise EqquantError(f"the optimized program differs from the original ({err:.2e})")

    # int8: calibrate the fused program, mark its values, saturate with the quantize rules
    rng = np.random.default_rng(1)
    shape = mod.main.params[0].type.shape
    samples = [{mod.main.params[0].name: rng.normal(size=shape).astype("float32")}
               for _ in range(4)]
    echo("")
    table = stage("calibrate (minmax, 4 samples)", calibrate, result.module, None, samples,
                  "minmax")
    quant = stage("saturate + extract (quantize)", optimize, annotate(result.module, table),
                  None, ["quantize"])
    q_paths = stage("write int8 program + realize view", save_program,
                    Path(out_dir) / f"{model}.int8.ir", quant.module)
    save_program(Path(out_dir) / f"{model}.int8.realize.ir", realize_view(quant.module))
    q_out = stage("run int8 (reference interpreter)", run, quant.module, inputs)
    sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) /
                         max(np.sum((ref.astype(np.float64) - q_out) ** 2), 1e-30))
    counts: dict[str, int] = {}
    for n in post_order(quant.module.main.body):
        if isinstance(n, Call) and n.op_name:
            counts[n.op_name] = counts.get(n.op_name, 0) + 1
    echo("  int8 program: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    echo(f"  int8 vs fp32 output: SQNR {sqnr:.1f} dB; estimated cost "
         f"{quant.before.total * 1e3:.3f} -> {quant.after.total * 1e3:.3f} ms (cpu model)")
    echo(f"  wrote {q_paths[0]} and its realize view")
    return {"module": mod, "optimized": result, "output": out, "paths": paths,
            "int8": quant, "sqnr": sqnr}
