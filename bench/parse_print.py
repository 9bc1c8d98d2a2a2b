"""Parse + print time of a large program (the issue's goal: a 2,000-op program in < 0.5 s).

    python bench/parse_print.py [--ops 2000] [--repeat 5]

The program is a chain of ResNet-style blocks (conv2d, batch_norm, relu, add, pools) built
with the zoo's builder, printed once; we then time parse(text) and print_module(module)
separately and report the medians. Absolute times on a shared machine are indicative only.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from eqquant.ir.builder import Builder
from eqquant.ir.parser import parse
from eqquant.ir.printer import print_module


def big_program(n_ops: int):
    b = Builder()
    x = b.input("data", (1, 16, 32, 32))
    ops = 0
    i = 0
    while ops < n_ops:
        w = b.input(f"layer{i}.conv.weight", (16, 16, 3, 3))
        stats = [b.input(f"layer{i}.bn.{k}", (16,)) for k in ("weight", "bias", "mean", "var")]
        y = b.call("nn.conv2d", x, w, padding=[1, 1], channels=16, kernel_size=[3, 3])
        y = b.get(b.call("nn.batch_norm", y, *stats), 0)
        y = b.call("nn.relu", y)
        x = b.call("add", y, x)  # residual: keeps the graph a DAG, not a tree
        ops += 5
        i += 1
    return b.finish(x)[0], ops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    mod, ops = big_program(args.ops)
    measure("weights as parameters", mod, ops, args.repeat)
    # the same program with its weights bound: every constant carries a /* ty=... */ comment,
    # which makes the parser record positions (slower)
    import numpy as np
    from eqquant.ir.params import bind_params
    values = {p.name: np.zeros(p.type.shape, np.float32) for p in mod.main.params[1:]}
    measure("weights bound (meta constants with ty= comments)", bind_params(mod, values), ops,
            args.repeat)


def measure(label, mod, ops, repeat) -> None:
    text = print_module(mod)
    parse(text)  # warm: grammar compiled once per process
    parse_t, print_t = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        m = parse(text)
        t1 = time.perf_counter()
        out = print_module(m)
        t2 = time.perf_counter()
        assert out == text
        parse_t.append(t1 - t0)
        print_t.append(t2 - t1)
    p, q = statistics.median(parse_t), statistics.median(print_t)
    print(f"{label}: {ops} ops, {len(text.splitlines())} lines, {len(text) / 1e3:.0f} kB")
    print(f"parse  median {p * 1e3:7.1f} ms  (min {min(parse_t) * 1e3:.1f})")
    print(f"print  median {q * 1e3:7.1f} ms  (min {min(print_t) * 1e3:.1f})")
    print(f"parse + print {1e3 * (p + q):7.1f} ms  (goal < 500 ms): "
          f"{'met' if p + q < 0.5 else 'NOT met'}")
    _ = np  # numpy is imported by the builder anyway


if __name__ == "__main__":
    main()
