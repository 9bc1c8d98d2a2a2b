"""Mixed precision under an accuracy budget: eqquant's one-saturation search against an
NNCF-style greedy revert loop.

    python bench/mixed_precision.py [--models digits resnet18] [--retrain-digits]

For each model: the all-int8 program, the fp32 program, and for several budgets the mixed
program eqquant extracts (``quantize(..., min_sqnr=...)``, or ``metric=..., max_drop=...`` for
the digits CNN's top-1 accuracy) beside the greedy baseline's (NNCF's
``quantize_with_accuracy_control``: start from all int8, revert the most sensitive quantized
value to float, evaluate the whole program, repeat until the budget holds): each with its
measured latency (executor, 2 threads; all programs of a model timed in turns, 5 rounds,
each program's least round median; its layouts chosen for the kernels first, as ``quantize``
does), its accuracy (output SQNR against fp32 on
the calibration inputs, or top-1), and the number of full evaluations it needed. Both use the
same per-value sensitivities and the same extraction of each program's kernels.

- ``digits``: a small CNN trained here with PyTorch on scikit-learn's bundled digits set
  (8x8 images, no download) and committed as ``tests/data/digits_cnn.onnx`` with its
  calibration and validation images (``tests/data/digits.npz``); ``--retrain-digits``
  trains it again (needs torch and scikit-learn). It reads batches of 50 images: one image
  is too little work for any kernel to be timed apart from the cost of calling it.
- ``resnet18``: the zoo's (random weights), per-tensor int8 (where full int8 loses most);
  budgets between the full-int8 SQNR and 50 dB.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _common import latencies_alternating  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
BATCH = 50


def train_digits(seed: int = 0) -> None:
    """Train the digits CNN (PyTorch), export it to ONNX, save its data."""
    import torch
    from sklearn.datasets import load_digits
    torch.manual_seed(seed)
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(images))
    train, val = order[:1297], order[1297:]
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(64 * 4 * 4, 10))
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    x = torch.from_numpy(images[train][:, None])
    y = torch.from_numpy(labels[train])
    for epoch in range(25):
        net.train()
        for i in torch.randperm(len(x)).split(64):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x[i]), y[i])
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        acc = (net(torch.from_numpy(images[val][:, None])).argmax(1).numpy() ==
               labels[val]).mean()
    print(f"digits CNN trained: validation top-1 {acc * 100:.2f}% ({len(val)} images)")
    torch.onnx.export(net, torch.zeros(BATCH, 1, 8, 8), str(DATA / "digits_cnn.onnx"),
                      input_names=["image"], output_names=["logits"], opset_version=17,
                      dynamo=False)
    np.savez_compressed(DATA / "digits.npz", calib=digits.images[train[:100]].astype(np.uint8),
                        val=digits.images[val].astype(np.uint8), val_labels=labels[val])


def digits_data():
    """(calibration batches, validation batches, their labels): batches of BATCH images."""
    d = np.load(DATA / "digits.npz", allow_pickle=False)

    def batches(images):
        x = (images.astype(np.float32) / 16.0)[:, None]
        return [{"image": x[i:i + BATCH]} for i in range(0, len(x) - BATCH + 1, BATCH)]
    labels = d["val_labels"]
    return batches(d["calib"]), batches(d["val"]), [labels[i:i + BATCH] for i in range(
        0, len(labels) - BATCH + 1, BATCH)]


def latencies(programs, x, cost) -> dict[str, float]:
    """ms per run of each program with its layouts chosen for the kernels by ``cost`` (as
    ``quantize`` runs it), the programs timed in turns (``latencies_alternating``)."""
    from eqquant.quant.flow import compile_layouts
    from eqquant.runtime.execution.executor import Executor
    runners = {}
    for label, program in programs.items():
        ex = Executor(compile_layouts(program, cost).module)
        runners[label] = lambda ex=ex: ex.run(x)
    return {k: v * 1e3 for k, v in latencies_alternating(runners).items()}


def greedy(space, evaluate, ok):
    """NNCF's loop: all int8; while the budget fails, revert the most sensitive quantized
    value to float and evaluate again. Returns (program, evaluations)."""
    order = sorted((r for r in space.regions if r.mark is not None),
                   key=lambda r: -(r.noise + r.weight_noise))
    dropped: list[str] = []
    evaluations = 0
    while True:
        program = space.program(space.solve(keep_fp32=dropped))
        score = evaluate(program)
        evaluations += 1
        if ok(score) or len(dropped) == len(order):
            return program, score, evaluations
        dropped.append(order[len(dropped)].label)


def run_model(name: str) -> None:
    from eqquant.api import load
    from eqquant.extract.cost import LaidOut
    from eqquant.quant.annotate import annotate, mark_labels
    from eqquant.quant.flow import _flat, quantize, sqnr_db
    from eqquant.quant.mixed import MixedSpace, search
    from eqquant.runtime.execution.executor import Executor
    from eqquant.runtime.execution.measured_cost import MeasuredCost
    cost = MeasuredCost()
    if name == "digits":
        m = load(DATA / "digits_cnn.onnx")
        calib, val, labels = digits_data()
        per_channel = True
    else:
        from eqquant.zoo import build
        z = build(name)
        m = load((z.module, z.params))
        rng = np.random.default_rng(0)
        calib = [{"data": rng.standard_normal((1, 3, 224, 224)).astype("float32")}
                 for _ in range(4)]
        per_channel = False
    t = time.perf_counter()
    full = quantize(m.module, m.params, calib, "minmax", per_channel=per_channel, cost=cost)
    fp32 = full.fp32
    marked = annotate(fp32, full.table, "uint8", "max", per_channel)
    space = MixedSpace(marked, LaidOut(cost), names=mark_labels(marked, fp32))   # as quantize
    space.measure_sensitivity(calib[:8])
    print(f"{name}: {len(space.marked_values())} marked values; one saturation and the "
          f"sensitivities took {time.perf_counter() - t:.1f} s ({cost.summary()})")
    x = calib[0]
    if name == "digits":
        def accuracy(run) -> float:
            return float(np.mean(np.concatenate([np.argmax(run(v), axis=1) == t
                                                 for v, t in zip(val, labels)])))

        def top1(program) -> float:
            return accuracy(Executor(program).run)
        base = top1(fp32)
        rows = [("fp32", fp32, base * 100, 1),
                ("int8 (all)", full.module, top1(full.module) * 100, 1)]
        for drop in (0.001, 0.005, 0.02):
            res = search(space, metric=accuracy, max_drop=drop)
            rows.append((f"eqquant, drop <= {drop * 100:.1f} pt", res.program,
                         top1(res.program) * 100, res.evaluations))
            program, score, n = greedy(space, top1, lambda s: base - s <= drop)
            rows.append((f"greedy,  drop <= {drop * 100:.1f} pt", program, score * 100, n + 1))
        unit = "top-1 %"
    else:
        refs = [_flat(Executor(fp32).run(v)) for v in calib]

        def sqnr(program) -> float:
            ex = Executor(program)
            return sqnr_db(np.concatenate(refs), np.concatenate([_flat(ex.run(v))
                                                                 for v in calib]))
        low = sqnr(full.module)
        rows = [("fp32", fp32, float("inf"), 0), ("int8 (all)", full.module, low, 1)]
        for target in np.linspace(low + (50 - low) / 4, 50, 3):
            res = search(space, min_sqnr=float(target))
            rows.append((f"eqquant, SQNR >= {target:.1f}", res.program, sqnr(res.program),
                         res.evaluations))
            program, score, n = greedy(space, sqnr, lambda s: s >= target)
            rows.append((f"greedy,  SQNR >= {target:.1f}", program, score, n))
        unit = "SQNR dB"
    ms = latencies({label: program for label, program, _, _ in rows}, x, cost)
    cost.flush()
    print(f"{'program':28s} {'latency ms':>10s} {unit:>9s} {'evaluations':>12s}")
    for label, _, acc, n in rows:
        print(f"{label:28s} {ms[label]:10.3f} {acc:9.2f} {n:12d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["digits", "resnet18"])
    ap.add_argument("--retrain-digits", action="store_true")
    args = ap.parse_args()
    from eqquant.runtime.lowering.int8 import int8_path
    from eqquant.runtime.execution.measured_cost import cpu_model
    print(f"CPU: {cpu_model()}; int8 kernel path: {int8_path()}; "
          f"{os.environ['NUMBA_NUM_THREADS']} threads")
    if args.retrain_digits or not (DATA / "digits_cnn.onnx").exists():
        train_digits()
    for name in args.models:
        run_model(name)
        sys.stdout.flush()


if __name__ == "__main__":
    main()
