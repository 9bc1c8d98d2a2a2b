"""Are ONNX Runtime's int8 convolutions exact on this CPU? One QLinearConv against int64 numpy.

    python bench/ort_exactness.py [--models resnet18 ...]

A 3x3 convolution of 64 uint8 channels by int8 weights (per-channel scales, zero points 0,
as the QDQ models of ``peers.py`` have them), its output requantized to uint8, run by ONNX
Runtime with its defaults and with ``session.x64quantprecision`` set, against the same
convolution summed exactly in int64 and requantized in float64 (round half to even, as
QLinearConv specifies). On x86-64 CPUs without VNNI, ONNX Runtime's default kernels add each
pair of uint8 x int8 products in int16 with saturation (``vpmaddubsw``: 255 x 127 x 2
exceeds 32,767), so outputs move by several steps where activations of 128 and more meet
large weights; its exact mode converts such weights to uint8 and is exact, and slower
(``peers.py`` times both). Outputs off by one step are rounding; by more, saturation.

With ``--models``, each zoo model's int8 QDQ program (``peers.py``'s) is also run both ways
and the share of its outputs that differ printed.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import ort_session  # noqa: E402

C, O, H = 64, 64, 14        # channels in and out, image size


def layer_model(w: np.ndarray, sy: float, zy: int) -> bytes:
    """QLinearConv (3x3, padding 1) of a (1, C, H, H) uint8 image, input scale 1 and zero
    point 0, weights ``w`` at scale 1, output scale ``sy`` and zero point ``zy``."""
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in [
        ("sx", 1.0, np.float32), ("zx", 0, np.uint8), ("sw", np.ones(O), np.float32),
        ("zw", np.zeros(O), np.int8), ("sy", sy, np.float32), ("zy", zy, np.uint8)]]
    inits.append(numpy_helper.from_array(w, "w"))
    node = helper.make_node("QLinearConv", ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"],
                            ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node], "layer", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, C, H, H])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, O, H, H])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]) \
        .SerializeToString()


def exact_sums(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The convolution's sums (O, H, H), int64."""
    xp = np.pad(x[0].astype(np.int64), ((0, 0), (1, 1), (1, 1)))
    acc = np.zeros((O, H, H), np.int64)
    for i in range(3):
        for j in range(3):
            acc += np.einsum("oc,chw->ohw", w[:, :, i, j].astype(np.int64),
                             xp[:, i:i + H, j:j + H])
    return acc


def layer() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (O, C, 3, 3)).astype(np.int8)
    shape = (1, C, H, H)
    relu_like = np.where(rng.random(shape) < 0.1, rng.integers(128, 256, shape),
                         rng.integers(0, 40, shape))
    print(f"one QLinearConv, 3x3, {C} -> {O} channels, {H} x {H}: outputs off the exact ones "
          "by more than one step (saturation), share and largest")
    for name, x in [("every byte 255", np.full(shape, 255)),
                    ("bytes uniform in 0..255", rng.integers(0, 256, shape)),
                    ("10% of bytes 128..255, the rest below 40", relu_like)]:
        x = x.astype(np.uint8)
        acc = exact_sums(x, w)
        sy = float(np.abs(acc).max()) / 127
        want = np.clip(np.rint(acc / sy) + 128, 0, 255)
        row = []
        for exact in (False, True):
            got = ort_session(layer_model(w, sy, 128), exact=exact).run(None, {"x": x})[0][0]
            off = np.abs(got.astype(np.int64) - want)
            row.append(f"{'exact mode' if exact else 'default'} {(off > 1).mean():6.1%} "
                       f"(max {int(off.max()):2d})")
        print(f"  {name:42s} " + "   ".join(row))


def models(names: list[str]) -> None:
    from peers import prepare
    print("whole int8 QDQ programs (peers.py's): outputs where the default and the exact "
          "mode differ")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            files = prepare(name, 8, Path(tmp))
            x = next(iter(np.load(files["inputs"]).values()))
            outs = []
            for exact in (False, True):
                s = ort_session(str(files["ORT int8"]), exact=exact)
                outs.append(s.run(None, {s.get_inputs()[0].name: x})[0])
            diff = np.abs(outs[0] - outs[1])
            print(f"  {name:13s} {np.mean(diff > 0):6.1%} of outputs differ, by up to "
                  f"{diff.max() / np.abs(outs[1]).max():.1%} of the largest")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=[])
    args = ap.parse_args()
    from eqquant.runtime.execution.measured_cost import cpu_model
    print(f"CPU: {cpu_model()}")
    layer()
    if args.models:
        models(args.models)


if __name__ == "__main__":
    main()
