"""The main job, stage by stage, on a zoo model: what ``eqquant demo`` runs.

Stages so far: build the model, write it as text IR + params, parse it back, type-check,
check the round trip, run the reference interpreter, optimize (saturate with the simplify,
bn_fold and fusion rules, extract under the CPU cost model, fold constants), write the result,
run it on the Numba executor and check it against the original; then quantize it (calibrate,
mark the values, saturate with the quantize rules, extract the int8 program), write it and its
realize view, run it on the int8 kernels (bit for bit against the int8 reference), report its
accuracy per layer, and, with the optional extras, export it as ONNX QDQ and check it with ONNX
Runtime, and draw the SQNR chart. Each stage reports what it did and how long it took.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import EqquantError
from .ir.interp import run
from .ir.loader import load_program, save_program
from .core.nodes import Call, post_order
from .ir.params import load_params
from .ir.parser import parse
from .ir.printer import print_module
from .ir.typecheck import check_module
from .optimizer import optimize
from .quant.realize import realize_view
from .runtime.execution.executor import Executor
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
    from .quant.flow import compile_layouts, layout_summary
    runnable = stage("choose layouts (layout.rules)", compile_layouts, result.module, "cpu")
    ex = stage("load on the CPU executor", Executor, runnable.module)
    stage("run on the executor (first)", ex.run, inputs)
    out = stage("run on the executor (warm)", ex.run, inputs)
    err = float(np.max(np.abs(out - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
    echo(f"  program: output {types[id(mod.main.body)]}")
    echo("")
    for line in result.explain().splitlines():
        echo("  " + line)
    echo("")
    echo(f"  {layout_summary(runnable)}")
    echo(f"  executor (fused, Numba) vs reference interpreter on the original: max relative "
         f"difference {err:.2e}")
    echo(f"  wrote {opt_paths[0]}")
    if err > 1e-4:
        raise EqquantError(f"the optimized program differs from the original ({err:.2e})")

    # int8: calibrate, mark the values, saturate with the quantize rules, extract (the
    # seed's flow: symmetric int8 activations, so that TVM's realize view exists)
    from .api import load, quantize
    rng = np.random.default_rng(1)
    shape = mod.main.params[0].type.shape
    samples = [rng.normal(size=shape).astype("float32") for _ in range(4)]
    echo("")
    q = stage("quantize (minmax, 4 samples)", quantize, load(result.module), samples,
              "minmax", "max", False, "int8")
    q_paths = stage("write int8 program + realize view", save_program,
                    Path(out_dir) / f"{model}.int8.ir", q.module)
    save_program(Path(out_dir) / f"{model}.int8.realize.ir", realize_view(q.quantized.module))
    q_ref = stage("run int8 (reference interpreter)", run, q.module, inputs)
    q_out = stage("run int8 on the executor (first)", q.run, inputs)
    if not np.array_equal(q_out, q_ref):
        raise EqquantError("internal: the int8 kernels differ from the int8 reference")
    warm8 = _median_ms(lambda: q.run(inputs))
    warm32 = _median_ms(lambda: ex.run(inputs))
    counts: dict[str, int] = {}
    for n in post_order(q.module.main.body):
        if isinstance(n, Call) and n.op_name:
            counts[n.op_name] = counts.get(n.op_name, 0) + 1
    echo("  int8 program: " + ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    for line in str(q.report()).splitlines():
        echo("  " + line)
    from .runtime.lowering.int8 import int8_path
    echo(f"  int8 kernels ({int8_path()}) equal the int8 reference bit for bit; warm run "
         f"{warm8:.2f} ms int8 vs {warm32:.2f} ms fp32 (medians of 5; a shared machine)")
    echo(f"  wrote {q_paths[0]} and its realize view")
    _library(q, inputs, q_out, Path(out_dir) / f"{model}.int8.eqq", stage, echo)
    _exports(q, inputs, q_out, Path(out_dir) / model, echo)
    return {"module": mod, "optimized": result, "output": out, "paths": paths,
            "int8": q, "sqnr": q.report().output["sqnr"]}


def _library(q, inputs, q_out, folder: Path, stage, echo) -> None:
    """The int8 program compiled ahead of time (``eqquant.deploy``): its kernels linked into
    one library, checked in a child process (``deploy.check``), then loaded and run here
    without Numba, bit for bit the executor's. A program the library cannot hold on this
    CPU runs on the executor: a note, with the reason."""
    from .deploy.build import NotDeployable, build as build_library
    from .deploy.check import Checker
    from .deploy.loader import Library
    with Checker() as checker:
        try:
            stage("compile the int8 program ahead of time", build_library, q.executor(),
                  folder)
        except NotDeployable as e:
            echo(f"  runs on the executor: {e.message}")
            return
        reason = stage("check the library in a child process", checker.check,
                       q.executor(), folder)
    if reason is not None:
        raise EqquantError(f"internal: {folder}: {reason}")
    library = stage("load its library (no Numba)", Library, folder)
    out = stage("run the library (first)", library.run, inputs)
    if not np.array_equal(out, q_out):
        raise EqquantError("internal: the library's output differs from the executor's")
    warm = _median_ms(lambda: library.run(inputs))
    echo(f"  wrote {folder}/: {len(library.plan['launches'])} launches, the executor's bits; "
         f"warm run {warm:.2f} ms (`eqquant run {folder} -x ...` runs it)")


def _median_ms(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _exports(q, inputs, q_out, stem: Path, echo) -> None:
    """With the optional extras: the int8 program as ONNX QDQ, run by ONNX Runtime; the
    per-layer SQNR chart; the program's graph (DOT)."""
    q.graph(stem.with_suffix(".int8.dot"))
    echo(f"  wrote {stem.with_suffix('.int8.dot')} (the int8 program as a Graphviz graph)")
    try:
        import onnxruntime as ort
    except ImportError:
        echo("  (ONNX export skipped: pip install 'eqquant[onnx]')")
    else:
        path = q.export_onnx(stem.with_suffix(".int8.onnx"))
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        theirs = sess.run(None, {sess.get_inputs()[0].name: next(iter(inputs.values()))})[0]
        step = float(np.max(np.asarray(q.module.main.body.args[1].data)))
        share = float(np.mean(np.abs(theirs - q_out) <= step * 1.0001))
        echo(f"  wrote {path} (QDQ); ONNX Runtime runs it: {100 * share:.2f}% of outputs "
             "within one step of eqquant's")
    try:
        q.report().plot(stem.with_suffix(".sqnr.png"))
        echo(f"  wrote {stem.with_suffix('.sqnr.png')} (SQNR per layer)")
    except EqquantError as e:
        echo(f"  (chart skipped: {e.message})")
