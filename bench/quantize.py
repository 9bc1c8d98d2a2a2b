"""int8: eqquant against ONNX Runtime's static QDQ quantization, on the same model, weights,
calibration data and check input, in one run.

    python bench/quantize.py [--models resnet18_stem resnet18] [--calib 16] [--runs 10]
                             [--activations uint8|int8]

eqquant: the quantize flow (per-channel minmax, uint8 activations by default), run on the
executor's integer kernels (AVX512-VNNI where the CPU has it). ONNX Runtime: ``quantize_static``
on eqquant's fp32 ONNX export, QDQ format, per-channel, uint8 activations and int8 weights,
MinMax, 2 intra-op threads. Both are compared with the fp32 program on one held-out N(0, 1)
input (SQNR) and timed alternately, with ONNX Runtime also running eqquant's int8 program
exported as QDQ (ORT(eqQDQ)); ratios are the figures on a shared machine. Refuses to run when
other work keeps a core busy (--force overrides).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from eqquant.interop.onnx_export import to_onnx
from eqquant.quant.flow import quantize, sqnr_db
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build

sys.path.insert(0, str(Path(__file__).parent))
from _common import ort_quantize_static, ort_session, time_alternating  # noqa: E402
from runtime import busy_cores  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18_stem", "resnet18"])
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--activations", choices=["uint8", "int8"], default="uint8")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    busy = busy_cores()
    if busy > 0.3 and not args.force:
        sys.exit(f"refusing to benchmark: {busy:.2f} cores busy (--force runs anyway)")
    print(f"{'model':10s} {'eq int8':>9s} {'eq fp32':>9s} {'ORT int8':>9s} {'ORT fp32':>9s} "
          f"{'ORT(eqQDQ)':>10s} {'eq8/ORT8':>9s} {'eq8/eq32':>9s} {'SQNR eq8':>9s} "
          f"{'SQNR ORT8':>10s}")
    for name in args.models:
        m = build(name)
        rng = np.random.default_rng(0)
        shape = m.module.main.params[0].type.shape
        samples = [{"data": rng.normal(size=shape).astype("float32")}
                   for _ in range(args.calib)]
        check = {"data": rng.normal(size=shape).astype("float32")}
        q = quantize(m.module, m.params, samples, "minmax", per_channel=True,
                     check_input=check, dtype=args.activations)
        ex8, ex32 = Executor(q.runnable), Executor(q.fp32)
        fp32_bytes = to_onnx(q.fp32).SerializeToString()
        ort8 = ort_session(ort_quantize_static(fp32_bytes, samples))
        ort32 = ort_session(fp32_bytes)
        ortq = ort_session(to_onnx(q.module).SerializeToString())   # our int8 program, QDQ
        ref = ex32.run(check)
        sq_eq = sqnr_db(ref, ex8.run(check))
        sq_ort = sqnr_db(ref, ort8.run(None, check)[0])
        med = time_alternating({"eq8": lambda: ex8.run(check), "eq32": lambda: ex32.run(check),
                                "ort8": lambda: ort8.run(None, check),
                                "ort32": lambda: ort32.run(None, check),
                                "ortq": lambda: ortq.run(None, check)}, args.runs)
        print(f"{name:10s} {med['eq8']:8.2f}ms {med['eq32']:8.2f}ms {med['ort8']:8.2f}ms "
              f"{med['ort32']:8.2f}ms {med['ortq']:8.2f}ms {med['eq8'] / med['ort8']:9.2f} "
              f"{med['eq8'] / med['eq32']:9.2f} {sq_eq:8.1f}dB {sq_ort:9.1f}dB")


if __name__ == "__main__":
    main()
