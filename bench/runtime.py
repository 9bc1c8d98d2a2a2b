"""fp32 inference: eqquant (fused, Numba executor) against the reference interpreter and ONNX
Runtime, on the same zoo weights, in one run.

    python bench/runtime.py [--models resnet18_stem resnet18 resnet50 mobilenet_v2] [--runs 20]

Batch 1, both cores, idle threads sleeping in both runtimes. ONNX Runtime gets the original
fp32 program (batch norms included: it folds them itself), exported by
eqquant.interop.onnx_export, with 2 intra-op threads. After warm-up, eqquant and ONNX Runtime
are timed alternately, run by run, and we report medians and the median of the per-pair ratios;
the reference interpreter is timed a few times. Outputs are checked to agree. On a shared
machine absolute times drift, so the ratios are the figures; the script refuses to run when
other work keeps a core busy (--force overrides). It also reports the first inference of a
fresh process whose kernel cache is warm.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from eqquant.interop.onnx_export import to_onnx
from eqquant.ir.interp import run
from eqquant.ir.params import bind_params
from eqquant.optimizer import optimize
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build

SCHEDULE = "simplify; bn_fold; simplify; fusion"

FIRST_RUN = """
import time, sys
t0 = time.perf_counter()
from eqquant.zoo import build
from eqquant.optimizer import optimize
from eqquant.runtime.execution.executor import Executor
m = build(sys.argv[1])
r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"], "{schedule}")
ex = Executor(r.module)
t1 = time.perf_counter()
ex.run(m.inputs)
t2 = time.perf_counter()
print(f"{{(t2 - t1) * 1e3:.1f}} {{(t1 - t0) * 1e3:.1f}}")
""".format(schedule=SCHEDULE)


def busy_cores(seconds: float = 1.0) -> float:
    """How many cores were busy over a short window (from /proc/stat), this process idle."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    total = t1 - t0
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / total) if total else 0.0


def first_inference(name: str) -> tuple[float, float]:
    """(first-run ms, set-up ms) in a new process; the first call warms the disk cache."""
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", FIRST_RUN, name], capture_output=True,
                             text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+",
                    default=["resnet18_stem", "resnet18", "resnet50", "mobilenet_v2"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--force", action="store_true", help="run even if the machine is busy")
    args = ap.parse_args()
    busy = busy_cores()
    if busy > 0.3 and not args.force:
        sys.exit(f"refusing to benchmark: {busy:.2f} cores busy with other work (parallel "
                 "kernels would be measured against it). --force runs anyway.")
    import onnxruntime as ort
    print(f"{busy:.2f} cores busy before start; onnxruntime {ort.__version__}; medians of "
          f"{args.runs}")
    print(f"{'':13s} {'alternating':^26s} {'back to back':^26s}")
    print(f"{'model':13s} {'eqquant':>9s} {'ORT fp32':>9s} {'ratio':>6s} {'eqquant':>9s} "
          f"{'ORT fp32':>9s} {'ratio':>6s} {'reference':>10s} {'ref/eq':>7s} "
          f"{'max rel diff':>12s} {'1st run':>8s}")
    for name in args.models:
        m = build(name)
        bound = bind_params(m.module, m.params)
        r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"], SCHEDULE)
        ex = Executor(r.module)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.inter_op_num_threads = 1
        # the two runtimes take turns: threads spinning after one run would slow the other
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(to_onnx(bound).SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        x = m.inputs
        for _ in range(3):
            ours = ex.run(x)
            theirs = sess.run(None, x)[0]
        diff = float(np.max(np.abs(ours - theirs)) / np.max(np.abs(theirs)))
        eq_t, ort_t, ratios = [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ex.run(x)
            t1 = time.perf_counter()
            sess.run(None, x)
            t2 = time.perf_counter()
            eq_t.append(t1 - t0)
            ort_t.append(t2 - t1)
            ratios.append((t1 - t0) / (t2 - t1))
        # each runtime on its own, back to back (no hand-over between thread pools)
        eq_alone, ort_alone = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            ex.run(x)
            eq_alone.append(time.perf_counter() - t0)
        for _ in range(args.runs):
            t0 = time.perf_counter()
            sess.run(None, x)
            ort_alone.append(time.perf_counter() - t0)
        ref_t = []
        for _ in range(2 if name != "resnet50" else 1):
            t0 = time.perf_counter()
            run(bound, x)
            ref_t.append(time.perf_counter() - t0)
        first, _ = first_inference(name)
        e, o, rf, ea, oa = (statistics.median(v) * 1e3 for v in
                            (eq_t, ort_t, ref_t, eq_alone, ort_alone))
        print(f"{name:13s} {e:8.2f}ms {o:8.2f}ms {statistics.median(ratios):6.2f} "
              f"{ea:8.2f}ms {oa:8.2f}ms {ea / oa:6.2f} "
              f"{rf:9.1f}ms {rf / e:7.1f} {diff:12.1e} {first:6.1f}ms")
    print("ratio = eqquant / ONNX Runtime, per alternating pair, then with each run back to "
          "back (goal <= 1.0);\n1st run = first inference in a fresh process with a warm "
          "kernel cache")


if __name__ == "__main__":
    main()
