"""How long the quantize saturation takes: load the marked program into the e-graph, run the
quantize rules to saturation (their dtype guards need types), and read the e-graph back for
extraction. Programs: ResNet-50 (the zoo's) and a 2,000-op residual conv/batch-norm/relu
program, each marked as `eqquant quantize` marks it (minmax, per-channel, uint8).

    python bench/saturation.py [--repeat 3] [--ops 2000]

Prints the median of each stage over the repeats, and the e-graph's size. Compare runs of
this script before and after a change to the engine on the same machine, in the same
session (it prints absolute times, which are only comparable that way).
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from parse_print import big_program  # noqa: E402


def marked(name: str, ops: int):
    from eqquant.ir.params import bind_params
    from eqquant.optimizer import optimize
    from eqquant.quant.annotate import annotate
    from eqquant.quant.annotate import calibrate
    from eqquant.quant.flow import FP32_RULES, FP32_SCHEDULE
    from eqquant.zoo.models import build
    rng = np.random.default_rng(0)
    if name == "resnet50":
        z = build("resnet50")
        mod, params = z.module, z.params
    else:
        mod, _ = big_program(ops)
        params = {p.name: (rng.standard_normal(p.type.shape) * 0.1).astype(np.float32)
                  for p in mod.main.params[1:]}
        for p in mod.main.params:   # batch-norm variances must be positive
            if p.name.endswith(".var"):
                params[p.name] = np.abs(params[p.name]) + 0.5
    fp = optimize(bind_params(mod, params), None, FP32_RULES, FP32_SCHEDULE).module
    x = {fp.main.params[0].name: rng.standard_normal(fp.main.params[0].type.shape)
         .astype(np.float32)}
    table = calibrate(fp, None, [x], "minmax")
    return annotate(fp, table, "uint8", "max", True, [])


def measure(mod, repeat: int) -> dict[str, float]:
    from eqquant.egraph.engine import EGraphSession, Phase
    from eqquant.extract.view import EGraphView
    from eqquant.rules.compile import compile_ruleset
    from eqquant.rules.loader import load_rules
    rules = load_rules("quantize")
    rows: dict[str, list[float]] = {"load": [], "saturate": [], "view": []}
    for _ in range(repeat):
        t0 = time.perf_counter()
        s = EGraphSession(mod)
        s.add_ruleset(compile_ruleset(rules))
        t1 = time.perf_counter()
        rep = s.run([Phase("quantize")])
        t2 = time.perf_counter()
        view = EGraphView.of(s)
        t3 = time.perf_counter()
        rows["load"].append(t1 - t0)
        rows["saturate"].append(t2 - t1)
        rows["view"].append(t3 - t2)
    out = {k: statistics.median(v) for k, v in rows.items()}
    out["enodes"], out["eclasses"] = view.size()
    out["stop"] = rep.phases[-1].stop
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ops", type=int, default=2000)
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}")
    for name in ("resnet50", f"{args.ops}-op program"):
        r = measure(marked(name, args.ops), args.repeat)
        print(f"{name:18s} load {r['load']:6.2f} s  saturate {r['saturate']:6.2f} s  "
              f"read back {r['view']:6.2f} s  total {r['load'] + r['saturate'] + r['view']:6.2f} s"
              f"  ({r['enodes']} e-nodes, {r['eclasses']} classes, {r['stop']})", flush=True)


if __name__ == "__main__":
    main()
