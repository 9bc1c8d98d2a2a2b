"""eqquant against its peers, int8 and fp32, each system in its own process.

    python bench/peers.py [--models resnet18 resnet50 mobilenet_v2] [--rounds 7] [--calib 8]

For each model (the zoo's, random weights with batch norms folded as eqquant folds them): the
fp32 program and eqquant's int8 program (per-channel minmax, uint8 activations, int8 weights),
ONNX Runtime on eqquant's fp32 ONNX export and on its own static QDQ quantization of it (the
same calibration data, per-channel, u8/s8, MinMax), and PyTorch when it is installed (an
optional extra for this bench: its column is skipped otherwise). Every system runs in a
process of its own (two runtimes in one process fight over threads), with 2 threads and its
own threading defaults; the rounds alternate between the systems, so that the machine's
changing load hits all of them alike, half a second apart (so that one system's spinning
threads have stopped before the next one runs), each after one untimed run, and each figure
is the median over the rounds; the runs' 10th, 50th and 90th percentiles are printed beside
it, per system, with p90/p50 (a system whose runs are bimodal shows it there; eqquant's is
flagged above 1.3). The CPU model and eqquant's kernel paths are printed first,
the ratios eqquant / ONNX Runtime (and / PyTorch) last.

On a CPU without VNNI, ONNX Runtime's int8 convolutions add pairs of uint8 x int8 products in
int16 with saturation (``vpmaddubsw``), so their sums are not exact (``ort_exactness.py``
shows by how much), while eqquant's kernels are bit-exact. There ONNX Runtime also runs
with ``session.x64quantprecision`` set ("ORT int8 exact", its own exact mode), and the
ratio eqquant / ORT-exact compares like with like. There eqquant also runs with 7-bit weights
("eqquant int8-w7": ``weight_bits=7``, every convolution on the AVX2 byte kernel, exact, for
some accuracy); each int8 program's output SQNR against the fp32 one on the timed input is
printed beside its times.

eqquant runs each program as ``eqquant run`` does: on its library saved ahead of time
(``eqquant.deploy``, made by the worker's first start), or on the Numba executor where the
library cannot hold it; which one is printed per model. ``EQQUANT_DEPLOY=0`` measures the
executor.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

THREADS = "2"
# seconds between two systems' rounds: OpenMP (libgomp, PyTorch's Intel OpenMP: 200 ms) and ONNX
# Runtime workers spin a while after a run, and would take the cores from the next system
SETTLE = 0.5
ENV = {**os.environ, "OMP_NUM_THREADS": THREADS, "NUMBA_NUM_THREADS": THREADS,
       "MKL_NUM_THREADS": THREADS, "OPENBLAS_NUM_THREADS": THREADS}


EXACT = "ORT int8 exact"   # ONNX Runtime with exact int8 sums (CPUs without VNNI only)
SEVEN = "eqquant int8-w7"  # eqquant with 7-bit weights, on the AVX2 byte kernel (likewise)


# -- a worker: one system, one model, timed on request ------------------------------------------

def worker(system: str, model: str, inputs: str) -> None:
    """Load ``model`` on ``system``; then for each line "run N" on stdin, run N times and print
    the times (ms) as a JSON list."""
    import warnings
    warnings.filterwarnings("ignore")     # (PyTorch's deprecation notes on its quantized ops)
    x = dict(np.load(inputs))
    engine = system.split()[0]
    if system.startswith("PyTorch"):
        import torch
        torch.set_num_threads(int(THREADS))
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import torch_int8
        calib = np.load(Path(inputs).with_suffix(".calib.npz"))
        net = torch_int8(model, [calib[k] for k in calib.files])
        value = torch.from_numpy(next(iter(x.values())))

        def run():
            with torch.inference_mode():
                return net(value)
    elif system.startswith("eqquant"):
        # as `eqquant run` runs it: the program's library (saved at its first run, run
        # without Numba), or the executor where the library cannot hold the program (or
        # EQQUANT_DEPLOY=0)
        from eqquant.deploy.cache import open_program
        program = open_program(model)
        engine = program.engine if program.engine == "library" else \
            f"executor ({program.note or 'no library'})"
        run = lambda: program.run(x)  # noqa: E731
    else:
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import ort_session
        # ONNX Runtime's defaults otherwise: its workers spin while a run waits for work, as
        # eqquant's OpenMP workers spin a moment between the ops of a program
        sess = ort_session(model, threads=int(THREADS), spinning=True, exact=system == EXACT)
        names = [i.name for i in sess.get_inputs()]
        # the inputs by ONNX name, or (named as eqquant names them) in order
        feed = {n: x[n] for n in names} if set(names) <= set(x) else \
            dict(zip(names, x.values()))
        run = lambda: sess.run(None, feed)  # noqa: E731
    run()
    print(json.dumps(["ready", engine]), flush=True)
    for line in sys.stdin:
        n = int(line.split()[1])
        run()       # wakes this system's threads, untimed
        sys.path.insert(0, str(Path(__file__).parent))
        from _common import timed
        print(json.dumps([t * 1e3 for t in timed(run, n)]), flush=True)


class Worker:
    def __init__(self, system: str, model: Path, inputs: Path):
        self.system = system
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", system, str(model), str(inputs)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
        ready = json.loads(self.proc.stdout.readline() or "null")
        if not (isinstance(ready, list) and ready[0] == "ready"):
            raise RuntimeError(f"{system} did not start")
        self.engine = ready[1]

    def run(self, n: int) -> list[float]:
        """N timed runs, SETTLE seconds after whatever ran before (another system's workers
        spin a while after its runs: ONNX Runtime's, run just before, made every other run
        of eqquant's ShuffleNet-v2 three times as long)."""
        time.sleep(SETTLE)
        self.proc.stdin.write(f"run {n}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# -- the parent: prepare every system's files, then alternate ----------------------------------

def cpu_model() -> str:
    from eqquant.runtime.execution.measured_cost import cpu_model as model
    return model()


def prepare(name: str, calib: int, d: Path, seven: bool = False
            ) -> tuple[dict[str, Path], dict[str, float]]:
    """Every system's files for model ``name``, and the int8 programs' output SQNR (dB)
    against the fp32 program on the timed input (eqquant's, ONNX Runtime's; with ``seven``,
    eqquant's with 7-bit weights too)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import ort_quantize_static, ort_session
    from eqquant.interop.onnx_export import to_onnx
    from eqquant.ir.loader import save_program
    from eqquant.quant.flow import compile_layouts, quantize, sqnr_db
    from eqquant.runtime.execution.executor import Executor
    from eqquant.zoo import build
    m = build(name)
    rng = np.random.default_rng(0)
    shape = m.module.main.params[0].type.shape
    samples = [{"data": rng.normal(size=shape).astype("float32")} for _ in range(calib)]
    x = {"data": rng.normal(size=shape).astype("float32")}
    q = quantize(m.module, m.params, samples, "minmax", per_channel=True)
    files = {"inputs": d / f"{name}.input.npz"}
    np.savez(files["inputs"], **x)
    np.savez(d / f"{name}.input.calib.npz", *[s["data"] for s in samples])
    save_program(d / f"{name}.int8.ir", q.runnable)   # its layouts chosen for the kernels
    save_program(d / f"{name}.fp32.ir", compile_layouts(q.fp32).module)   # likewise
    fp32_onnx = to_onnx(q.fp32).SerializeToString()
    (d / f"{name}.fp32.onnx").write_bytes(fp32_onnx)
    ort8 = ort_quantize_static(fp32_onnx, samples)
    (d / f"{name}.int8.onnx").write_bytes(ort8)
    files.update({"eqquant int8": d / f"{name}.int8.ir", "eqquant fp32": d / f"{name}.fp32.ir",
                  "ORT int8": d / f"{name}.int8.onnx", EXACT: d / f"{name}.int8.onnx",
                  "ORT fp32": d / f"{name}.fp32.onnx",
                  "PyTorch int8": name})   # torchvision's model of that name
    def ort_run(model: bytes) -> np.ndarray:
        sess = ort_session(model)
        return sess.run(None, {sess.get_inputs()[0].name: x["data"]})[0]
    ref = ort_run(fp32_onnx)
    sqnr = {"eqquant int8": sqnr_db(ref, Executor(q.runnable).run(x)),
            "ORT int8": sqnr_db(ref, ort_run(ort8))}
    if seven:
        q7 = quantize(m.module, m.params, samples, "minmax", per_channel=True, weight_bits=7)
        save_program(d / f"{name}.int8w7.ir", q7.runnable)
        files[SEVEN] = d / f"{name}.int8w7.ir"
        sqnr[SEVEN] = sqnr_db(ref, Executor(q7.runnable).run(x))
    return files, sqnr


SPREAD = 1.3        # eqquant's p90/p50 above this: its runs are not stable (flagged)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--worker", nargs=3, metavar=("SYSTEM", "MODEL", "INPUT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    from eqquant.runtime.codegen.llvm_loops import cpu_has
    systems = ["eqquant int8", "ORT int8", "eqquant fp32", "ORT fp32"]
    if not (cpu_has("avx512vnni") or cpu_has("avxvnni")):
        # ONNX Runtime's default int8 is then not exact (bench/ort_exactness.py): its exact
        # mode too, for a comparison of like with like
        systems.insert(2, EXACT)
        systems.insert(1, SEVEN)
    try:
        import torch
        torch_note = (f"PyTorch {torch.__version__}: FX int8 with the x86 qconfig on "
                      "torchvision's model of the same name (random weights; latency only)")
        systems.insert(2, "PyTorch int8")
    except ImportError:
        torch_note = "PyTorch: not installed (an optional extra of this bench): column skipped"
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; {THREADS} threads per system; "
          f"eqquant kernel paths: int8 {int8_path()}, fp32 {fp32_path()}")
    print(torch_note)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            files, sqnr = prepare(name, args.calib, Path(tmp), SEVEN in systems)
            workers = {s: Worker(s, files[s], files["inputs"]) for s in systems}
            print(f"{name}: eqquant runs on its " + ", ".join(
                f"{w.engine} ({s.split()[1]})" for s, w in workers.items()
                if s.startswith("eqquant")), flush=True)
            times: dict[str, list[float]] = {s: [] for s in systems}
            for _ in range(args.rounds):
                for s, w in workers.items():         # rounds alternate between the systems
                    times[s] += w.run(args.per_round)
            for w in workers.values():
                w.close()
            results[name] = {s: statistics.median(v) for s, v in times.items()}
            row = "  ".join(f"{s} {results[name][s]:7.2f} ms" for s in systems)
            print(f"{name:13s} {row}", flush=True)
            print(f"{'':13s} output SQNR against fp32 (dB): " + ", ".join(
                f"{s} {db:.1f}" for s, db in sqnr.items()), flush=True)
            for s, v in times.items():
                p10, p50, p90 = np.percentile(v, [10, 50, 90])
                flag = "  (unstable: above 1.3)" if s.startswith("eqquant") and \
                    p90 / p50 > SPREAD else ""
                print(f"{'':13s} {s:14s} p10/p50/p90 {p10:7.2f} {p50:7.2f} {p90:7.2f} ms, "
                      f"p90/p50 {p90 / p50:4.2f}{flag}")
    print("ratios (below 1: eqquant is faster)")
    for name, r in results.items():
        torch_ratio = (f"int8 eqquant/PyTorch {r['eqquant int8'] / r['PyTorch int8']:5.2f}   "
                       if "PyTorch int8" in r else "")
        exact_ratio = (f"int8 eqquant/ORT-exact {r['eqquant int8'] / r[EXACT]:5.2f}   "
                       if EXACT in r else "")
        exact_ratio += (f"int8-w7 eqquant/ORT {r[SEVEN] / r['ORT int8']:5.2f}   "
                        if SEVEN in r else "")
        print(f"{name:13s} int8 eqquant/ORT {r['eqquant int8'] / r['ORT int8']:5.2f}   "
              f"{exact_ratio}{torch_ratio}"
              f"fp32 eqquant/ORT {r['eqquant fp32'] / r['ORT fp32']:5.2f}   "
              f"eqquant int8/fp32 {r['eqquant int8'] / r['eqquant fp32']:5.2f}")


if __name__ == "__main__":
    main()
