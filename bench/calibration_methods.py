"""Calibration methods side by side: eqquant's (minmax, percentile, kl_divergence) and ONNX
Runtime's quantize_static (MinMax, Entropy, Percentile; each as is and after
quant_pre_process), each system's int8 program scored by its output SQNR against ONNX
Runtime fp32 on held-out inputs.

    python bench/calibration_methods.py [--models vit_b_16] [--calib 16] [--test 4]

A model is bench/zoo.py's (torchvision, random weights, exported at opset 17); calibration
and test inputs are N(0, 1) images, the same for both systems. Every int8 program is
per-channel (int8 weights, uint8 activations). The SQNR is over the test outputs together,
with each one's in brackets. Each system's methods run in this process, one after the
other, with the time each quantization took.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import ort_quantize_static, ort_session  # noqa: E402
from zoo import build, example, export  # noqa: E402

EQQUANT = ("minmax", "percentile", "kl_divergence")
ORT = ("MinMax", "Entropy", "Percentile")


def _sqnr(refs: list, outs: list) -> str:
    from eqquant.quant.flow import sqnr_db
    whole = sqnr_db(np.concatenate(refs), np.concatenate(outs))
    each = ", ".join(f"{sqnr_db(r, o):.2f}" for r, o in zip(refs, outs))
    return f"{whole:6.2f} dB  [{each}]"


def one(name: str, args) -> None:
    import eqquant
    rng = np.random.default_rng(0)
    first = example(name, rng, args.size, 128)
    src = export(build(name), first)
    calib = [example(name, rng, args.size, 128) for _ in range(args.calib)]
    test = [example(name, rng, args.size, 128) for _ in range(args.test)]
    fp32 = ort_session(src)
    refs = [fp32.run(None, x)[0] for x in test]
    print(f"{name}: {args.calib} calibration inputs, {args.test} test inputs, N(0, 1)",
          flush=True)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{name}.onnx"
        path.write_bytes(src)
        model = eqquant.load(path)
        for mode in EQQUANT:
            t = time.perf_counter()
            q = eqquant.quantize(model, calib, mode=mode, per_channel=True)
            took = time.perf_counter() - t
            print(f"  eqquant {mode:22s} {_sqnr(refs, [q.run(x) for x in test])}"
                  f"  ({took:.0f} s)", flush=True)
    for pre in (False, True):
        for method in ORT:
            t = time.perf_counter()
            try:
                int8 = ort_quantize_static(src, calib, pre_process=pre, method=method)
            except Exception as e:      # noqa: BLE001 (a peer's failure is a row, not a stop)
                print(f"  ORT {method + (' (pre)' if pre else ''):26s} failed: "
                      f"{str(e).splitlines()[0][:80]}", flush=True)
                continue
            took = time.perf_counter() - t
            sess = ort_session(int8)
            print(f"  ORT {method + (' (pre)' if pre else ''):26s} "
                  f"{_sqnr(refs, [sess.run(None, x)[0] for x in test])}  ({took:.0f} s)",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["vit_b_16"])
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--test", type=int, default=4)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    from peers import cpu_model
    print(f"CPU: {cpu_model()}")
    for name in args.models:
        one(name, args)


if __name__ == "__main__":
    main()
