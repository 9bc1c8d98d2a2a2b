"""Calibration's memory against the number of samples: a zoo model calibrated on N samples
streamed from a folder (one .npy file each), for each N, each run in a process of its own
(peak resident memory, VmHWM); and the same samples held in memory as a list, whose
table must be the one the folder gave.

    python bench/calibration_memory.py --model resnet18 --size 64 --counts 20 2000
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def child(args) -> None:
    from eqquant.datasets import Samples
    from eqquant.quant.annotate import calibrate
    from eqquant.zoo import build
    zoo = build(args.model, image_size=args.size)
    shape = (1, 3, args.size, args.size)
    warm = [np.zeros(shape, np.float32) + 0.5, np.ones(shape, np.float32)]
    calibrate(zoo.module, zoo.params, warm, args.mode)          # (kernels compiled)
    sys.path.insert(0, str(Path(__file__).parent))
    from _common import peak_rss_mb
    base = peak_rss_mb()
    source = Samples(Path(args.folder), {"data": (shape, "float32")})
    if args.in_memory:
        source = list(source)
    start = time.perf_counter()
    table = calibrate(zoo.module, zoo.params, iter(source), args.mode)
    took = time.perf_counter() - start
    peak = peak_rss_mb()
    print(json.dumps({"peak_mb": peak, "before_mb": base, "seconds": took,
                      "table": {k: [r.lo, r.hi] for k, r in table.ranges.items()}}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--counts", type=int, nargs="+", default=[20, 2000])
    ap.add_argument("--mode", default="percentile")
    ap.add_argument("--folder"), ap.add_argument("--in-memory", action="store_true")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    from eqquant.runtime.execution.measured_cost import cpu_model
    print(f"CPU: {cpu_model()}; {args.model} at {args.size}x{args.size}, {args.mode} calibration")
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.counts:
            folder = Path(tmp) / f"n{n}"
            folder.mkdir()
            for i in range(n):
                np.save(folder / f"{i:05d}.npy",
                        rng.standard_normal((1, 3, args.size, args.size)).astype(np.float32))
            runs = {}
            for how in ("folder", "list"):
                cmd = [sys.executable, __file__, "--child", "--model", args.model, "--size",
                       str(args.size), "--mode", args.mode, "--folder", str(folder)]
                out = subprocess.run(cmd + (["--in-memory"] if how == "list" else []),
                                     capture_output=True, text=True, check=True)
                runs[how] = json.loads(out.stdout.strip().splitlines()[-1])
            same = runs["folder"]["table"] == runs["list"]["table"]
            rows.append((n, runs, same))
            for how, r in runs.items():
                print(f"{n:6d} samples, {how:6s}: peak RSS {r['peak_mb']:7.1f} MB "
                      f"(before calibrating {r['before_mb']:7.1f} MB), "
                      f"{r['seconds']:.1f} s")
            print(f"{n:6d} samples: the folder's table {'equals' if same else 'DIFFERS FROM'} "
                  f"the in-memory list's")
    first, last = rows[0][1]["folder"]["peak_mb"], rows[-1][1]["folder"]["peak_mb"]
    print(f"streamed: peak RSS at {rows[-1][0]} samples / at {rows[0][0]}: {last / first:.3f}")


if __name__ == "__main__":
    main()
