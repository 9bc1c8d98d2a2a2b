"""One program for every batch and every sequence length (issue 52's acceptance, checked by
hand on real exports; the tests check the same on small files).

    python bench/open_sizes.py [--batches 1 3 8 32] [--lengths 16 64 128]

1. torchvision's resnet18 (random weights) exported with a dynamic batch (``dynamic_axes``)
   imports with ``?N``; quantized once (per-channel minmax, 8 samples), saved, and compiled
   into one library: that library runs batch 1, 3, 8 and 32, each output equal bit for bit
   to the batch-1 runs of its images, and to the executor's run of the whole batch (its
   kernels at that batch size).
2. nn.TransformerEncoder (4 layers, d_model 256, 4 heads, GELU, batch first), exported by
   torch.export with the batch and the sequence length open: one imported program runs
   lengths 16, 64 and 128 within 1e-4 of ONNX Runtime.

Prints the CPU, the kernel paths, and each check's figure; exits 1 if one fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from peers import cpu_model  # noqa: E402
from throughput import export  # noqa: E402


def encoder_dynamic(path: Path) -> None:
    import torch
    from zoo import _sequence_model
    net = _sequence_model("transformer_encoder")
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = torch.export.Dim("seq", min=2, max=512)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.randn(2, 16, 256),), str(path), input_names=["input"],
                          output_names=["output"], opset_version=18, dynamo=True,
                          dynamic_shapes={"src": {0: batch, 1: seq}}, external_data=False,
                          verbose=False)


def check_batches(d: Path, batches: list[int]) -> bool:
    import eqquant
    from eqquant.deploy.build import build
    from eqquant.deploy.check import Checker
    from eqquant.deploy.loader import Library
    from eqquant.ir.loader import save_program
    (d / "resnet18.onnx").write_bytes(export("resnet18"))     # (its batch open: dynamic_axes)
    m = eqquant.load(d / "resnet18.onnx")
    print(f"resnet18 imported: input {m.inputs}")
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(8)]
    q = eqquant.quantize(m, samples, mode="minmax", per_channel=True)
    save_program(d / "resnet18.int8.ir", q.module)
    q = eqquant.load(d / "resnet18.int8.ir")          # the saved program
    t = time.perf_counter()
    with Checker() as checker:
        build(q.executor(), d / "resnet18.eqq")
        refused = checker.check(q.executor(), d / "resnet18.eqq")
    if refused:
        print(f"  the library was refused: {refused}")
        return False
    lib = Library(d / "resnet18.eqq")
    print(f"  one library, batch {lib.batch} open, built and checked in "
          f"{time.perf_counter() - t:.1f} s: {d / 'resnet18.eqq'}")
    x = rng.standard_normal((max(batches), 3, 224, 224)).astype(np.float32)
    ones = np.concatenate([lib.run(x[i:i + 1]) for i in range(len(x))])
    ok = True
    for b in batches:
        got = lib.run(x[:b])
        same = np.array_equal(got, ones[:b])
        batched = np.array_equal(got, q.run(x[:b]))
        ok &= same and batched
        print(f"  batch {b:2d}: output {got.shape}, equal to the batch-1 runs bit for bit: "
              f"{same}; to the executor's batch-{b} run: {batched}")
    return ok


def check_lengths(d: Path, lengths: list[int]) -> bool:
    import eqquant
    import onnxruntime as ort
    path = d / "encoder.onnx"
    encoder_dynamic(path)
    m = eqquant.load(path)
    print(f"transformer encoder imported: input {m.inputs}")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    ok = True
    for s in lengths:
        x = rng.standard_normal((1, s, 256)).astype(np.float32)
        diff = float(np.max(np.abs(m.run(x) - sess.run(None, {"input": x})[0])))
        ok &= diff <= 1e-4
        print(f"  length {s:3d}: max |eqquant - ONNX Runtime| = {diff:.2e}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 3, 8, 32])
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 128])
    args = ap.parse_args()
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    print(f"CPU: {cpu_model()}; eqquant kernel paths: int8 {int8_path()}, fp32 {fp32_path()}")
    with tempfile.TemporaryDirectory(prefix="eqquant-open-sizes.") as work:
        ok = check_batches(Path(work), args.batches)
        ok &= check_lengths(Path(work), args.lengths)
    print("all checks hold" if ok else "A CHECK FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
