"""Batch-norm folding time: load + saturate + extract + fold, per zoo model (the issue's goal
for resnet50: under 1 s).

    python bench/bn_fold.py [--models resnet50 resnet18 ...] [--repeat 5] [--extractor greedy]

Each run builds a fresh e-graph. We report the median of each stage and of the total, and check
that every batch norm folded and the result matches the reference interpreter. The first run
in a process pays one-time costs (grammar compilation, egglog warm-up) and is reported apart.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from eqquant.ir.interp import run
from eqquant.core.nodes import Call, post_order
from eqquant.optimizer import optimize
from eqquant.zoo import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet50", "resnet18", "mobilenet_v2",
                                                    "resnet18_stem", "conv_bn"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--extractor", default="greedy", choices=["greedy", "ilp"])
    args = ap.parse_args()
    print(f"{'model':14s} {'first':>8s} {'median':>8s}   stages (median ms)")
    for name in args.models:
        m = build(name)
        totals, stages = [], {}
        for i in range(args.repeat + 1):
            t0 = time.perf_counter()
            r = optimize(m.module, m.params, ["simplify", "bn_fold"],
                         "simplify; bn_fold; simplify", extractor=args.extractor)
            totals.append(time.perf_counter() - t0)
            if i:
                for k, v in r.seconds.items():
                    stages.setdefault(k, []).append(v)
        left = sum(isinstance(n, Call) and n.op_name == "nn.batch_norm"
                   for n in post_order(r.module.main.body))
        ref = run(m.module, m.inputs, m.params)
        out = run(r.module, m.inputs)
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        detail = ", ".join(f"{k} {1e3 * statistics.median(v):.0f}" for k, v in stages.items())
        print(f"{name:14s} {1e3 * totals[0]:7.0f}ms {1e3 * statistics.median(totals[1:]):7.0f}ms"
              f"   {detail}; batch norms left {left}, max rel err {err:.1e}")


if __name__ == "__main__":
    main()
