"""Which zoo CNNs `eqquant compile` can save ahead of time, int8 and fp32, for a target: each
torchvision model (random weights, bench/zoo.py's) exported to ONNX, optimised as `eqquant run`
runs it (fp32) and quantized (per-channel minmax, uint8 activations), its executor made, the
library saved and run against the executor on two inputs: "saved, same bits", or the reason it
was refused (the first step that is not launches of C entries).

    python bench/deployable.py [--target avx2] [--models resnet18 ...] [--size 64]

A refusal here is a kernel still outside the plan's launches (issue 51, item 2).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from zoo import MODELS, build, example, export  # noqa: E402


# the input size below which PyTorch's export refuses the model (an adaptive pool to 7 x 7 or
# 6 x 6 of a smaller map; inception's stem)
MIN_SIZE = {"inception_v3": 75, "vgg11_bn": 224, "alexnet": 224}


def _saved(ex, folder: Path, shape) -> str:
    from eqquant.deploy.build import NotDeployable
    from eqquant.deploy.build import build as save
    from eqquant.deploy.loader import Library
    try:
        save(ex, folder)
    except NotDeployable:
        import re
        from collections import Counter
        from eqquant.deploy.build import not_launches
        pattern = r"^(?:error: )?step \d+ \((.*?)\): (.{0,48}).*"     # (the op, the reason)
        steps = Counter(re.sub(pattern, r"\1: \2", why) for why in not_launches(ex))
        return "refused: " + "; ".join(f"{n} x {what}" for what, n in steps.items())
    library = Library(folder)
    rng = np.random.default_rng(1)
    name = next(iter(ex.inputs))
    for _ in range(2):
        x = {name: rng.standard_normal(shape).astype(np.float32)}
        want, got = ex.run(x), library.run(x)
        want, got = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
        if not np.array_equal(want, got):
            return f"saved, DIFFERENT bits (max diff {np.max(np.abs(want - got)):.3g})"
    return "saved, same bits"


def one(name: str, size: int, d: Path) -> tuple[str, str]:
    import eqquant
    from eqquant.deploy.build import keeping_objects
    from eqquant.deploy.cache import prepare
    size = max(size, MIN_SIZE.get(name, 0))
    shape = (1, 3, size, size)
    path = d / f"{name}.onnx"
    path.write_bytes(export(build(name), example(name, np.random.default_rng(0), size, 0)))
    fp32, _, _ = prepare(path, None, optimize=True)
    with keeping_objects():
        fp = _saved(fp32.executor(), d / f"{name}.fp32", shape)
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    q = eqquant.quantize(eqquant.load(path), samples, mode="minmax", per_channel=True)
    with keeping_objects():
        i8 = _saved(q.executor(), d / f"{name}.int8", shape)
    return fp, i8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=[m for m in MODELS if m != "vit_b_16"])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--target", default=None, help="a target name (runtime.target.KINDS)")
    args = ap.parse_args()
    from eqquant.runtime.target import Target, use
    use(Target.named(args.target) if args.target else Target.host())
    from eqquant.runtime.target import current
    print(f"target {current().name}; int8 paths {current().int8}; fp32 {current().fp32}")
    counts = {"fp32": 0, "int8": 0}
    for name in args.models:
        with tempfile.TemporaryDirectory() as d:
            try:
                fp, i8 = one(name, args.size, Path(d))
            except Exception as e:      # (a bench: report the model's failure, go on)
                fp = i8 = f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
        counts["fp32"] += fp.endswith("same bits")
        counts["int8"] += i8.endswith("same bits")
        print(f"{name:20s} fp32 {fp}\n{'':20s} int8 {i8}", flush=True)
    n = len(args.models)
    print(f"saved with the executor's bits: fp32 {counts['fp32']}/{n}, int8 {counts['int8']}/{n}")


if __name__ == "__main__":
    main()
