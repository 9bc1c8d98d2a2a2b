"""Throughput against batch size: images per second at batch 1, 8 and 32, each system in its
own process, and each process's peak resident memory.

    python bench/throughput.py [--models resnet18 mobilenet_v2] [--batches 1 8 32] [--rounds 5]

The model is torchvision's (random weights), exported to ONNX with a dynamic batch axis
(``dynamic_axes``). Systems: ONNX Runtime fp32 on that export and int8 on its own
quantize_static of it (QDQ, per-channel, u8/s8, MinMax, after quant_pre_process); PyTorch's
x86 int8 (FX, fbgemm/oneDNN) on the same torchvision model; eqquant fp32 (the export as
``eqquant run`` runs it) and int8 (per-channel minmax on the same calibration samples). Every
system gets 2 threads; the rounds alternate between the systems, each after one untimed
batch, and each figure is the median images/s over the rounds with its p10 and p90.

eqquant imports the export with its batch open (``?N``) and quantizes it once: one program,
and one library (as ``eqquant run`` opens it), takes every batch. The library holds its
launches at batch 1 and at batch 8 (``deploy/build.py: BATCHED``): a batch of 8 or 32 runs
as runs of 8, each sample's output the batch-1 run's bits.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import (ort_quantize_static, ort_session, peak_rss_mb, timed,  # noqa: E402
                     torch_int8, torchvision_models)
from peers import ENV, SETTLE, THREADS, cpu_model  # noqa: E402

SYSTEMS = ("eqquant int8", "ORT int8", "PyTorch int8", "eqquant fp32", "ORT fp32")


def export(name: str) -> bytes:
    import torch
    torch.manual_seed(0)
    net = getattr(torchvision_models(), name)(weights=None).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(1, 3, 224, 224),), buf, dynamo=False,
                          opset_version=17, input_names=["data"], output_names=["logits"],
                          dynamic_axes={"data": {0: "N"}, "logits": {0: "N"}})
    return buf.getvalue()


def worker(system: str, model: str, calib: str) -> None:
    """Load ``model`` on ``system``; for each line "run B N" on stdin, time N batches of B
    images and print the seconds as a JSON list; "rss" prints the peak resident memory."""
    warnings.filterwarnings("ignore")
    samples = [v for _, v in sorted(np.load(calib).items())]
    rng = np.random.default_rng(1)
    if system.startswith("PyTorch"):
        import torch
        torch.set_num_threads(int(THREADS))
        net = torch_int8(model, samples)

        def batch_runner(b):
            x = torch.from_numpy(rng.standard_normal((b, 3, 224, 224)).astype(np.float32))

            def run():
                with torch.inference_mode():
                    return net(x)
            return run
    elif system.startswith("eqquant"):
        from eqquant.deploy.cache import open_program
        program = open_program(model)

        def batch_runner(b):
            x = rng.standard_normal((b, 3, 224, 224)).astype(np.float32)
            return lambda: program.run(x)       # (one program, its batch open)
    else:
        sess = ort_session(model, threads=int(THREADS), spinning=True)
        name = sess.get_inputs()[0].name

        def batch_runner(b):
            x = rng.standard_normal((b, 3, 224, 224)).astype(np.float32)
            return lambda: sess.run(None, {name: x})
    print(json.dumps("ready"), flush=True)
    runners = {}
    for line in sys.stdin:
        words = line.split()
        if words[0] == "rss":
            print(json.dumps(peak_rss_mb()), flush=True)
            continue
        b, n = int(words[1]), int(words[2])
        run = runners.setdefault(b, batch_runner(b))
        run()
        print(json.dumps(timed(run, n)), flush=True)


class Worker:
    def __init__(self, system: str, model: str, calib: Path):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", system, model, str(calib)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
        if json.loads(self.proc.stdout.readline() or "null") != "ready":
            raise RuntimeError(f"{system} did not start")

    def ask(self, line: str):
        time.sleep(SETTLE)
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def prepare(name: str, calib: int, d: Path, weight_bits: int = 8) -> dict[str, str]:
    import eqquant
    from eqquant.ir.loader import save_program
    fp32 = export(name)
    (d / f"{name}.onnx").write_bytes(fp32)
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32) for _ in range(calib)]
    np.savez(d / "calib.npz", **{f"s{i:03d}": s for i, s in enumerate(samples)})
    (d / f"{name}.int8.onnx").write_bytes(
        ort_quantize_static(fp32, [{"data": s} for s in samples], pre_process=True))
    q = eqquant.quantize(d / f"{name}.onnx", samples, mode="minmax", per_channel=True,
                         weight_bits=weight_bits)
    save_program(d / f"{name}.int8.ir", q.module)
    # each program's library compiled and cached in a process of its own first: the timed
    # processes load it as a server would (no compiler, no Numba, in their memory)
    for program in (d / f"{name}.int8.ir", d / f"{name}.onnx"):
        subprocess.run([sys.executable, "-c", "import sys; from eqquant.deploy.cache import "
                        "open_program; p = open_program(sys.argv[1]); p.engine == 'library' "
                        "or print(sys.argv[1], 'runs on the executor:', p.note)",
                        str(program)], check=True, env=ENV)
    return {"eqquant int8": str(d / f"{name}.int8.ir"), "eqquant fp32": str(d / f"{name}.onnx"),
            "ORT int8": str(d / f"{name}.int8.onnx"), "ORT fp32": str(d / f"{name}.onnx"),
            "PyTorch int8": name}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calib", type=int, default=8)
    ap.add_argument("--weight-bits", type=int, default=8, choices=[8, 7],
                    help="eqquant's weights: 7 runs every convolution on the AVX2 byte kernel "
                         "on a CPU without VNNI (ONNX Runtime and PyTorch as they are)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker)
    from eqquant.runtime.lowering.fp32 import fp32_path
    from eqquant.runtime.lowering.int8 import int8_path
    print(f"CPU: {cpu_model()}; {os.cpu_count()} cores; {THREADS} threads per system; "
          f"eqquant kernel paths: int8 {int8_path()}, fp32 {fp32_path()}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            files = prepare(name, args.calib, Path(tmp), args.weight_bits)
            workers = {s: Worker(s, files[s], Path(tmp) / "calib.npz") for s in SYSTEMS}
            rates: dict[tuple[str, int], list[float]] = {}
            for b in args.batches:
                per = max(1, 3 // b)
                for _ in range(args.rounds):
                    for s, w in workers.items():
                        rates.setdefault((s, b), []).extend(b / t for t in
                                                            w.ask(f"run {b} {per}"))
            rss = {s: w.ask("rss") for s, w in workers.items()}
            for w in workers.values():
                w.close()
            print(f"{name}: images/s, median (p10-p90), over {args.rounds} rounds")
            for b in args.batches:
                row = []
                for s in SYSTEMS:
                    p10, p50, p90 = np.percentile(rates[(s, b)], [10, 50, 90])
                    row.append(f"{s} {p50:7.1f} ({p10:.0f}-{p90:.0f})")
                print(f"  batch {b:3d}: " + "  ".join(row))
                med = {s: float(np.median(rates[(s, b)])) for s in SYSTEMS}
                print(f"  batch {b:3d}: int8 eqquant/ORT {med['eqquant int8'] / med['ORT int8']:.2f}"
                      f"  eqquant/PyTorch {med['eqquant int8'] / med['PyTorch int8']:.2f}"
                      f"  fp32 eqquant/ORT {med['eqquant fp32'] / med['ORT fp32']:.2f}"
                      "   (throughput ratios: above 1, eqquant is faster)")
            print("  peak RSS: " + "  ".join(f"{s} {rss[s]:.0f} MB" for s in SYSTEMS))
            print(f"  peak RSS eqquant int8 / ORT int8: {rss['eqquant int8'] / rss['ORT int8']:.2f}")


if __name__ == "__main__":
    main()
