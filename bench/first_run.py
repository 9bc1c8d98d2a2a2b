"""The first inference in a fresh process: with eqquant's caches warm, and the first ever
(the caches empty), and where the time goes.

    python bench/first_run.py [--models resnet18] [--warm 5] [--no-cold]

For each model, int8 and fp32 (prepared as ``bench/peers.py`` prepares them: the zoo's model,
per-channel minmax int8, layouts chosen for the kernels), a new Python process opens the
program and runs it once, as a user's ``eqquant run`` does (``deploy.cache.open_program``),
and reports its stages:

- imports: numpy and eqquant's program cache (with the caches empty, Numba and the executor
  are imported by the next stage);
- read: the input's .npz;
- open: with the program's library saved (``eqquant.deploy``), finding it (a digest of the
  program's files) and loading it, without Numba; else the text IR parsed, the executor
  made (the kernels loaded from Numba's cache, or compiled with an empty one, shared with
  helper processes, ``runtime/codegen/compiling.py``; weights packed) and the library saved (linked
  and checked against the executor);
- first run: the program's first inference;
- to result: from the process's start (Python's own start-up included) to its result;
- process: the whole process, its exit included.

Python's bytecode of eqquant is compiled first (``compileall``), as installing a package
compiles it: where ``PYTHONDONTWRITEBYTECODE`` is set (as on some build hosts), each process
would otherwise compile eqquant's source again (0.07 s). Caches empty: ``NUMBA_CACHE_DIR``
and ``EQQUANT_CACHE_DIR`` a new empty folder, once per program (every kernel the program
uses is compiled, its library saved), and once more with ``EQQUANT_COMPILE_JOBS=1`` (this
process alone compiling). Caches warm: ``--warm`` processes on the folder the cold one
filled (medians and ranges), with the library, and with libraries off
(``EQQUANT_DEPLOY=0``: the executor, its kernels loaded from Numba's cache). ONNX Runtime's
first inference on the same program's ONNX form (a new process: import, session, first run)
is measured beside it for scale. Each process runs with 2 threads. The CPU model and
eqquant's kernel paths are printed first.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THREADS = "2"


def child(program: str, inputs: str) -> None:
    """One fresh process's first inference of ``program`` (eqquant's text IR, or .onnx for
    ONNX Runtime), its stages printed as JSON (seconds)."""
    t0 = time.perf_counter()
    import numpy as np
    if program.endswith(".onnx"):
        importlib.import_module("onnxruntime")
        t1 = time.perf_counter()
        x = next(iter(np.load(inputs).values()))
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import ort_session
        t2 = time.perf_counter()
        sess = ort_session(program, threads=int(THREADS), spinning=True)
        t3 = time.perf_counter()
        sess.run(None, {sess.get_inputs()[0].name: x})
        compiled, engine = None, "onnxruntime"
    else:
        from eqquant.deploy.cache import open_program       # (as `eqquant run` does)
        t1 = time.perf_counter()
        x = dict(np.load(inputs))
        t2 = time.perf_counter()
        program = open_program(program)
        t3 = time.perf_counter()
        program.run(x)
        compiled = program.compiled    # (where the executor was made: what it compiled)
        engine = program.engine
    t4 = time.perf_counter()
    print(json.dumps({"imports": t1 - t0, "read": t2 - t1, "open": t3 - t2,
                      "first run": t4 - t3, "done at": time.time(), "engine": engine,
                      "compiled": [compiled.units, compiled.by_helpers] if compiled else None}))


def measure(program: Path, inputs: Path, cache: Path, **more: str) -> dict[str, float]:
    """A fresh process's stages, the time from its start to its result, and its whole wall
    time (seconds); ``more``: environment variables."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "EQQUANT_CACHE_DIR": str(cache),
           "NUMBA_NUM_THREADS": THREADS, "OMP_NUM_THREADS": THREADS, **more}
    started, t0 = time.time(), time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", str(program), str(inputs)],
                         env=env, capture_output=True, text=True)
    whole = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{program.name}: the process failed:\n{out.stderr[-2000:]}")
    stages = json.loads(out.stdout.strip().splitlines()[-1])
    return {**stages, "to result": stages.pop("done at") - started, "process": whole}


STAGES = ("imports", "read", "open", "first run", "to result", "process")


def summary(runs: list[dict[str, float]]) -> str:
    def one(key):
        v = [r[key] for r in runs]
        if len(v) == 1:
            return f"{key} {v[0]:.2f}"
        return f"{key} {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
    text = ", ".join(one(k) for k in STAGES) + " s"
    engines = sorted({r["engine"] for r in runs})
    text += f" [{', '.join(engines)}]"
    compiled = runs[0].get("compiled")
    if len(runs) == 1 and compiled and compiled[0]:
        text += (f"; {compiled[0]} C functions compiled, {compiled[1]} of them by helper "
                 "processes")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["resnet18"])
    ap.add_argument("--warm", type=int, default=5, help="warm-cache processes per program")
    ap.add_argument("--no-cold", action="store_true",
                    help="skip the empty-cache runs (the warm ones then fill a cache first)")
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, str(Path(__file__).parent))
    import compileall
    import eqquant
    compileall.compile_dir(str(Path(eqquant.__file__).parent), quiet=1)
    from peers import cpu_model, prepare
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; {THREADS} threads; eqquant kernel "
          f"paths: int8 {int8_path()}, fp32 {fp32_path()}")
    with tempfile.TemporaryDirectory(prefix="eqquant-first-") as tmp:
        d = Path(tmp)
        for name in args.models:
            files = prepare(name, args.calib, d)
            for precision in ("int8", "fp32"):
                program = files[f"eqquant {precision}"]
                cache = d / f"cache-{name}-{precision}"
                cache.mkdir()
                cold = measure(program, files["inputs"], cache)
                if not args.no_cold:
                    print(f"{name} {precision}, cache empty: {summary([cold])}", flush=True)
                    alone = d / f"cache-{name}-{precision}-alone"
                    alone.mkdir()
                    one = measure(program, files["inputs"], alone, EQQUANT_COMPILE_JOBS="1")
                    print(f"{name} {precision}, cache empty, compiled by this process "
                          f"alone (EQQUANT_COMPILE_JOBS=1): {summary([one])}", flush=True)
                warm = [measure(program, files["inputs"], cache) for _ in range(args.warm)]
                print(f"{name} {precision}, cache warm (the saved library): "
                      f"{summary(warm)}", flush=True)
                numba = [measure(program, files["inputs"], cache, EQQUANT_DEPLOY="0")
                         for _ in range(args.warm)]
                print(f"{name} {precision}, cache warm, libraries off (EQQUANT_DEPLOY=0: "
                      f"the executor, its kernels from Numba's cache): {summary(numba)}",
                      flush=True)
                ort = [measure(files[f"ORT {precision}"], files["inputs"], cache)
                       for _ in range(args.warm)]
                print(f"{name} {precision}, ONNX Runtime (import, session, first run): "
                      f"{summary(ort)}", flush=True)


if __name__ == "__main__":
    main()
