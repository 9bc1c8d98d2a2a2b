"""How `eqquant opt` scales with the program's size: time and peak memory for 1,000 to
5,000-op programs (residual conv/batch-norm/relu blocks), each in its own process; then ONNX
import of 1,000 to 8,000-node graphs and reading text with a ty= annotation on every value.

    python bench/opt_scale.py [--sizes 1000,2000,3000,5000]

The last lines give time per op relative to the smallest program (1.0 = linear growth) and
the peak memory. The program is `bench/parse_print.py`'s big_program; the schedule is the
fp32 one (simplify; bn_fold; simplify; fusion)."""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from parse_print import big_program  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,3000,5000")
    args = ap.parse_args()
    from eqquant.ir.loader import save_program
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in (int(s) for s in args.sizes.split(",")):
            mod, ops = big_program(n)
            path = Path(d) / f"p{n}.ir"
            save_program(path, mod)
            t0 = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            proc = subprocess.run(
                [sys.executable, "-m", "eqquant.cli.main", "opt", str(path), "-r", "simplify",
                 "-r", "bn_fold", "-r", "fusion", "-s", "simplify; bn_fold; simplify; fusion",
                 "-o", str(Path(d) / f"o{n}.ir")], capture_output=True, text=True)
            seconds = time.perf_counter() - t0
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            if proc.returncode:
                sys.exit(proc.stderr)
            # (ru_maxrss of children is the largest so far: sizes run in increasing order)
            rows.append((ops, seconds, max(peak, before) / 1024))
            print(f"{ops:6d} ops: {seconds:6.2f} s, peak {rows[-1][2]:7.0f} MB", flush=True)
    base = rows[0][1] / rows[0][0]
    print("ops     s/op relative to the smallest (1.0 = linear)   peak MB")
    for ops, seconds, mb in rows:
        print(f"{ops:6d}  {seconds / ops / base:5.2f}  {mb:8.0f}")
    _import_and_read()


def _import_and_read() -> None:
    from eqquant.ir.parser import parse
    from eqquant.ir.printer import print_module
    try:
        from onnx import TensorProto, helper

        from eqquant.interop.onnx_import import import_onnx
    except ImportError:
        print("(ONNX import: the onnx extra is not installed)")
        import_onnx = None
    if import_onnx is not None:
        for n in (1000, 4000, 8000):
            nodes, prev = [], "x"
            for i in range(n):
                nodes.append(helper.make_node("Relu", [prev], [f"r{i}"], name=f"n{i}"))
                prev = f"r{i}"
            graph = helper.make_graph(
                nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 8])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8
            t0 = time.perf_counter()
            import_onnx(model)
            print(f"ONNX import, {n:5d} nodes: {time.perf_counter() - t0:6.2f} s")
    for n in (5000, 20000):
        text = print_module(big_program(n)[0], show_types=True)
        t0 = time.perf_counter()
        parse(text)
        print(f"read {n:5d} ops with ty= annotations ({len(text) / 1e6:.1f} MB): "
              f"{time.perf_counter() - t0:6.2f} s")


if __name__ == "__main__":
    main()
