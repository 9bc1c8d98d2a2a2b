"""The cost model's int8 factor, measured: the executor's profile of resnet18's convolutions in
fp32 (fused.conv2d: im2col + OpenBLAS sgemm + epilogue) and in int8 (fused.qconv2d: pixel rows +
the VNNI GEMM + fused requantizing epilogue, uint8 activations), same model and input, taking
turns. Prints each precision's convolution time and the ratio that ``eqquant/extract/cost.py``
uses as int8 peak / fp32 peak.

    python bench/int8_factor.py [--model resnet18] [--runs 15]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from eqquant.quant.flow import quantize
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build

sys.path.insert(0, str(Path(__file__).parent))
from runtime import busy_cores  # noqa: E402


def conv_ms(ex: Executor, x, label: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        for st in ex.steps:
            st.seconds.clear()
        ex.run(x, profile=True)
        times.append(sum(sum(st.seconds) for st in ex.steps if st.label == label))
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    busy = busy_cores()
    if busy > 0.3 and not args.force:
        sys.exit(f"refusing to benchmark: {busy:.2f} cores busy (--force runs anyway)")
    m = build(args.model)
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=m.inputs["data"].shape).astype("float32")}
               for _ in range(4)]
    q = quantize(m.module, m.params, samples, "minmax", per_channel=True)
    ex8, ex32 = Executor(q.module), Executor(q.fp32)
    x = samples[0]
    for ex in (ex8, ex32):
        ex.run(x)
    t8, t32 = [], []
    for _ in range(3):       # take turns, so that a change in the machine's load hits both
        t8.append(conv_ms(ex8, x, "fused.qconv2d", args.runs // 3 or 1))
        t32.append(conv_ms(ex32, x, "fused.conv2d", args.runs // 3 or 1))
    a, b = statistics.median(t8), statistics.median(t32)
    print(f"{args.model}: convolutions fp32 {b:.2f} ms, int8 {a:.2f} ms; int8 factor "
          f"{b / a:.2f}")


if __name__ == "__main__":
    main()
