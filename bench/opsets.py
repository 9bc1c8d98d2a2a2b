"""The torchvision CNNs (bench/zoo.py's 18, random weights) exported by PyTorch at several
opsets and imported as they are: does each import, and does `eqquant`'s run match ONNX
Runtime's on the same file? A conformance check of the importer across opsets (attribute-form
axes, Upsample, ceil mode written as padding...), not a timing.

    python bench/opsets.py [--opsets 9 13 17] [--models resnet18 googlenet ...]

Prints, per model and opset, the largest difference from ONNX Runtime relative to its
largest output, or why the model did not import (PyTorch itself exports some models only
from some opset on: ViT's attention needs opset 14).
"""
from __future__ import annotations

import argparse
import io
import tempfile
import warnings
from pathlib import Path

import numpy as np

from zoo import MODELS, build

TOLERANCE = 1e-4


def export(net, size: int, opset: int) -> bytes:
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(1, 3, size, size),), buf, dynamo=False,
                          opset_version=opset, input_names=["input"],
                          output_names=["logits"])
    return buf.getvalue()


def check(name: str, opset: int, folder: Path) -> str:
    import onnxruntime as ort
    import eqquant
    size = 299 if name == "inception_v3" else 224
    try:
        data = export(build(name), size, opset)
    except Exception as e:  # noqa: BLE001 - PyTorch's exporter refuses some opsets
        return f"not exported by PyTorch: {str(e).splitlines()[0][:120]}"
    path = folder / f"{name}.{opset}.onnx"
    path.write_bytes(data)
    x = np.random.default_rng(0).normal(size=(1, 3, size, size)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {"input": x})[0]
    try:
        got = np.asarray(eqquant.load(str(path)).run({"input": x}))
    except eqquant.EqquantError as e:
        return f"REFUSED: {str(e).splitlines()[0][:160]}"
    err = float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30))
    return f"{err:.1e}" + ("" if err <= TOLERANCE else f"  OVER {TOLERANCE:g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opsets", nargs="+", type=int, default=[9, 13, 17])
    ap.add_argument("--models", nargs="+", default=MODELS)
    args = ap.parse_args()
    from eqquant.runtime.execution.measured_cost import cpu_model
    print(f"CPU: {cpu_model()}")
    print(f"{'model':20s} " + " ".join(f"{'opset ' + str(o):>12s}" for o in args.opsets))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            cells = [check(name, o, Path(tmp)) for o in args.opsets]
            if all(len(c) <= 12 for c in cells):
                print(f"{name:20s} " + " ".join(f"{c:>12s}" for c in cells), flush=True)
            else:
                print(name, flush=True)
                for o, c in zip(args.opsets, cells):
                    print(f"    opset {o}: {c}", flush=True)


if __name__ == "__main__":
    main()
