"""How well each cost model predicts a whole program's latency on this machine.

    python bench/cost_model.py [--models resnet18 resnet50 mobilenet_v2]

For each zoo model, its optimized fp32 program and its int8 program (per-channel minmax, the
layouts chosen for the CPU kernels): the executor's latency (the least of 5 rounds' medians of
warm runs, 2 threads: the machine is shared), the measured cost model's prediction (the sum of
its kernel instances' times, timing what the cache lacks) and the roofline model's, each with
its error. A program whose weights fit in a quarter of the last-level cache has its kernels
timed with the weights in that cache (``weights_resident``). The kernel-time cache is the
user's (``EQQUANT_CACHE_DIR`` to keep it apart).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _common import executor_latency  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from eqquant.extract.cost import CpuLatency
    from eqquant.runtime.execution.measured_cost import MeasuredCost, cpu_model, weights_resident
    from eqquant.optimizer import program_costs
    from eqquant.quant.flow import compile_layouts, quantize
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    from eqquant.runtime.execution.executor import Executor
    from eqquant.zoo import build
    print(f"CPU: {cpu_model()}; kernel paths: int8 {int8_path()}, fp32 {fp32_path()}; "
          f"{os.environ['NUMBA_NUM_THREADS']} threads")
    measured, roofline = MeasuredCost(), CpuLatency()
    resident = MeasuredCost(measured.times, resident=True)
    print(f"{'program':22s} {'executor':>10s} {'measured model':>22s} {'roofline model':>22s}")
    for name in args.models:
        m = build(name)
        rng = np.random.default_rng(0)
        x = {p.name: rng.standard_normal(p.type.shape).astype("float32")
             for p in m.module.main.params}
        r = quantize(m.module, m.params, [x], "minmax", per_channel=True, cost="cpu")
        fp32 = compile_layouts(r.fp32, "cpu").module    # the layouts that run, as int8's
        for label, prog in (("fp32", fp32), ("int8", r.runnable)):
            ex = Executor(prog)
            ex.run(x)
            # weights that fit in the last-level cache are timed there (weights_resident)
            model = resident if weights_resident(prog) else measured
            predicted = [program_costs(prog, m).total for m in (model, roofline)]
            real = executor_latency(ex, x, args.runs, args.rounds)   # on a quiet machine
            cells = []
            for pred in predicted:
                cells.append(f"{pred * 1e3:9.2f} ms ({(pred / real - 1) * 100:+5.0f}%)")
            print(f"{name + ' ' + label:22s} {real * 1e3:7.2f} ms {cells[0]:>22s} "
                  f"{cells[1]:>22s}{'  (weights resident)' if model is resident else ''}",
                  flush=True)
    measured.flush()
    print(measured.summary())
    print(resident.summary().replace("cost model:", "with weights resident:"))


if __name__ == "__main__":
    main()
