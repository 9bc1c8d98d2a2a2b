"""Mixed precision chosen by measured kernel times where the integer kernels are slow.

    python bench/portable_mixed.py [--models vgg_small mobilenet_v2] [--path portable]

With ``EQQUANT_INT8_KERNEL`` forced (``portable`` by default: integer convolutions on plain
loops, several times slower than the float ones), for each zoo model: the program the measured
cost model extracts (``quantize(..., cost=MeasuredCost())``, per-channel minmax), the
all-int8 program and the fp32 program, each laid out as it runs. For each: the measured
model's prediction (the sum of its kernels' measured times, placed as its weights sit in the
caches), the executor's latency (all programs of a model timed in turns, 5 rounds, each its
least round median, 2 threads), its integer layers and its output SQNR against fp32 on the
calibration input. The last lines give the ratios mixed / all-int8 and mixed / fp32.
The kernel-time cache is the user's (``EQQUANT_CACHE_DIR`` to keep it apart).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _common import latencies_alternating  # noqa: E402

LAYERS = {"fused.qconv2d": True, "qnn.dense": True, "fused.conv2d": False,
          "nn.conv2d": False, "fused.dense": False, "nn.dense": False}


def integer_layers(mod) -> str:
    from eqquant.core.nodes import Call, post_order
    kinds = [LAYERS[n.op_name] for n in post_order(mod.main.body)
             if isinstance(n, Call) and n.op_name in LAYERS]
    return f"{sum(kinds)}/{len(kinds)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vgg_small", "mobilenet_v2"])
    ap.add_argument("--path", default="portable", help="EQQUANT_INT8_KERNEL to force")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.environ["EQQUANT_INT8_KERNEL"] = args.path
    from eqquant.extract.cost import constant_bytes
    from eqquant.optimizer import program_costs
    from eqquant.quant.flow import compile_layouts, quantize, sqnr_db
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    from eqquant.runtime.execution.executor import Executor
    from eqquant.runtime.execution.measured_cost import MeasuredCost, cpu_model
    from eqquant.zoo import build
    print(f"CPU: {cpu_model()}; kernel paths: int8 {int8_path()} (forced), fp32 "
          f"{fp32_path()}; {os.environ['NUMBA_NUM_THREADS']} threads")
    measured = MeasuredCost()
    ratios = []
    for name in args.models:
        m = build(name)
        rng = np.random.default_rng(0)
        x = {p.name: rng.standard_normal(p.type.shape).astype("float32")
             for p in m.module.main.params if p.name not in m.params}
        mixed = quantize(m.module, m.params, [x], "minmax", per_channel=True, cost=measured)
        full = quantize(m.module, m.params, [x], "minmax", per_channel=True, cost="cpu")
        placed = measured.for_weights(constant_bytes(full.fp32),
                                      constant_bytes(full.fp32) // 4)
        programs = {"mixed": mixed.runnable, "all-int8": full.runnable,
                    "fp32": compile_layouts(full.fp32, placed).module}
        ex = {k: Executor(p) for k, p in programs.items()}
        ref = ex["fp32"].run(x)
        real = latencies_alternating({k: (lambda e=e: e.run(x)) for k, e in ex.items()},
                                     args.runs, args.rounds)
        print(f"\n{name}")
        print(f"  {'program':10s} {'predicted':>10s} {'executor':>10s} {'integer layers':>15s}"
              f" {'SQNR':>9s}")
        for k, p in programs.items():
            predicted = program_costs(p, placed).total
            print(f"  {k:10s} {predicted * 1e3:8.3f}ms {real[k] * 1e3:8.3f}ms "
                  f"{integer_layers(p):>15s} {sqnr_db(ref, ex[k].run(x)):7.2f}dB")
        ratios.append((name, real["mixed"] / real["all-int8"], real["mixed"] / real["fp32"]))
    print()
    for name, to_int8, to_fp32 in ratios:
        print(f"{name}: mixed/all-int8 {to_int8:.2f}, mixed/fp32 {to_fp32:.2f}")


if __name__ == "__main__":
    main()
