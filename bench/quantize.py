"""int8: eqquant against ONNX Runtime's static QDQ quantization, on the same model, weights,
calibration data and check input, in one run.

    python bench/quantize.py [--models seed004 resnet18] [--calib 16] [--runs 10]

eqquant: the quantize flow (per-channel minmax, int8 activations), run on the executor's
integer kernels (the portable Numba path: no VNNI kernel yet). ONNX Runtime:
``quantize_static`` on eqquant's fp32 ONNX export, QDQ format, per-channel, uint8
activations and int8 weights, MinMax, 2 intra-op threads. Both are compared with the fp32
program on one held-out N(0, 1) input (SQNR) and timed alternately; ratios are the figures on
a shared machine. Refuses to run when other work keeps a core busy (--force overrides).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from eqquant.interop.onnx_export import to_onnx
from eqquant.quant.flow import quantize, sqnr_db
from eqquant.runtime.executor import Executor
from eqquant.zoo import build

sys.path.insert(0, str(Path(__file__).parent))
from runtime import busy_cores  # noqa: E402


def ort_session(model_bytes, ort):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["seed004", "resnet18"])
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    busy = busy_cores()
    if busy > 0.3 and not args.force:
        sys.exit(f"refusing to benchmark: {busy:.2f} cores busy (--force runs anyway)")
    import onnx
    import onnxruntime as ort
    ort.set_default_logger_severity(3)  # the quantizer's notes on unused initializers
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    print(f"{'model':10s} {'eq int8':>9s} {'eq fp32':>9s} {'ORT int8':>9s} {'ORT fp32':>9s} "
          f"{'eq8/ORT8':>9s} {'eq8/eq32':>9s} {'SQNR eq8':>9s} {'SQNR ORT8':>10s}")
    for name in args.models:
        m = build(name)
        rng = np.random.default_rng(0)
        shape = m.module.main.params[0].type.shape
        samples = [{"data": rng.normal(size=shape).astype("float32")}
                   for _ in range(args.calib)]
        check = {"data": rng.normal(size=shape).astype("float32")}
        q = quantize(m.module, m.params, samples, "minmax", per_channel=True,
                     check_input=check)
        ex8, ex32 = Executor(q.module), Executor(q.fp32)
        fp32_bytes = to_onnx(q.fp32).SerializeToString()

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter(samples)

            def get_next(self):
                return next(self.it, None)

        with tempfile.TemporaryDirectory() as d:
            src, dst = Path(d) / "fp32.onnx", Path(d) / "int8.onnx"
            src.write_bytes(fp32_bytes)
            quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
            ort8 = ort_session(onnx.load(str(dst)).SerializeToString(), ort)
        ort32 = ort_session(fp32_bytes, ort)
        ref = ex32.run(check)
        sq_eq = sqnr_db(ref, ex8.run(check))
        sq_ort = sqnr_db(ref, ort8.run(None, check)[0])
        times = {k: [] for k in ("eq8", "eq32", "ort8", "ort32")}
        runners = {"eq8": lambda: ex8.run(check), "eq32": lambda: ex32.run(check),
                   "ort8": lambda: ort8.run(None, check), "ort32": lambda: ort32.run(None, check)}
        for f in runners.values():
            f()
        for _ in range(args.runs):
            for k, f in runners.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{name:10s} {med['eq8']:8.2f}ms {med['eq32']:8.2f}ms {med['ort8']:8.2f}ms "
              f"{med['ort32']:8.2f}ms {med['eq8'] / med['ort8']:9.2f} "
              f"{med['eq8'] / med['eq32']:9.2f} {sq_eq:8.1f}dB {sq_ort:9.1f}dB")


if __name__ == "__main__":
    main()
