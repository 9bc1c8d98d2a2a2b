"""A real model in and out: ResNet-18 built in PyTorch with explicit BatchNormalization,
exported to ONNX, imported by eqquant, checked against ONNX Runtime fp32, quantized, and its
int8 accuracy and speed set beside ONNX Runtime's own static quantization, in one run.

    pip install torch==2.13.0        # not an eqquant dependency (see the README)
    python bench/onnx_resnet18.py [--calib 16] [--runs 10] [--keep DIR]

The network is torchvision's ResNet-18 layout written out here (torchvision is not needed),
with random weights and random batch-norm statistics, in eval mode, exported with the
TorchScript exporter keeping BatchNormalization nodes (training=PRESERVE, no constant folding),
and a dynamic batch axis, as PyTorch writes them.
eqquant: import, per-channel minmax, uint8 activations. ONNX Runtime: quantize_static on the
same ONNX file (QDQ, per-channel, uint8/int8, MinMax) with the same 16 N(0, 1) samples, once
as is and once after its recommended quant_pre_process (which folds the batch norms).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import ort_quantize_static, ort_session, time_alternating  # noqa: E402
from runtime import busy_cores  # noqa: E402


def torch_resnet18(seed: int = 0):
    import torch
    from torch import nn
    torch.manual_seed(seed)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return self.relu(y + (x if self.downsample is None else self.downsample(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            blocks, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                blocks += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            return self.fc(torch.flatten(self.avgpool(self.layers(x)), 1))

    model = ResNet18()
    with torch.no_grad():        # batch-norm statistics as a trained network has them
        for mod in model.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.normal_(0, 0.1)
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return model.eval()


def export(model, path: Path) -> None:
    import torch
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the TorchScript exporter's deprecation
        torch.onnx.export(model, (torch.randn(1, 3, 224, 224),), str(path), dynamo=False,
                          training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--keep", type=Path, help="keep the ONNX files and eqquant's outputs here")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("this benchmark needs PyTorch: pip install torch==2.13.0")
    busy = busy_cores()
    if busy > 0.3 and not args.force:
        sys.exit(f"refusing to benchmark: {busy:.2f} cores busy (--force runs anyway)")
    import onnx

    import eqquant
    from eqquant.quant.flow import sqnr_db

    work = args.keep or Path(tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    src = work / "resnet18_torch.onnx"
    net = torch_resnet18()
    export(net, src)
    kinds = [n.op_type for n in onnx.load(str(src)).graph.node]
    print(f"PyTorch {torch.__version__} export: {len(kinds)} nodes, "
          f"{kinds.count('BatchNormalization')} BatchNormalization, "
          f"{kinds.count('Identity')} Identity")

    model = eqquant.load(src)
    for note in model.notes:
        print(f"  import note: {note}")
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
               for _ in range(args.calib)]
    check = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    fp32_bytes = src.read_bytes()
    ort32 = ort_session(fp32_bytes)
    ref = ort32.run(None, {"input": check})[0]
    with torch.no_grad():
        ref_torch = net(torch.from_numpy(check)).numpy()
    eq_import = model.run(check)
    rel = lambda a, b: float(np.max(np.abs(a - b)) / np.max(np.abs(b)))  # noqa: E731
    print(f"imported program vs ONNX Runtime fp32: max rel. error {rel(eq_import, ref):.2e} "
          f"(vs PyTorch {rel(eq_import, ref_torch):.2e})")

    q = eqquant.quantize(model, samples, mode="minmax", per_channel=True)
    fp32 = eqquant.load(q.quantized.fp32)            # bn folded and fused, fp32
    print(f"optimized fp32 vs ONNX Runtime fp32: max rel. error {rel(fp32.run(check), ref):.2e}")
    eq8_out = q.run(check)
    qdq_path = q.export_onnx(work / "resnet18_eqquant_int8.onnx")
    ortq = ort_session(qdq_path.read_bytes())
    ortq_out = ortq.run(None, {ortq.get_inputs()[0].name: check})[0]
    # one step of the output's 8-bit quantization (its calibrated range; the program itself
    # reads the output straight from the classifier's int32 accumulator)
    from eqquant.ir.printer import value_labels
    from eqquant.quant.annotate import qparams
    fp = q.quantized.fp32
    label = value_labels(fp.main)[id(fp.main.body)]
    step = qparams(q.quantized.table.ranges[label], "uint8")[0]
    within = float(np.mean(np.abs(ortq_out - eq8_out) <= step * 1.0001))
    calib = [{"input": s} for s in samples]
    ort8 = ort_session(ort_quantize_static(fp32_bytes, calib, pre_process=True))
    ort8_out = ort8.run(None, {"input": check})[0]
    ort8raw = ort_session(ort_quantize_static(fp32_bytes, calib))
    ort8raw_out = ort8raw.run(None, {"input": check})[0]
    if args.keep:
        q.save(work / "eqquant")
    print(f"SQNR against fp32 (held-out N(0,1) input): eqquant int8 {sqnr_db(ref, eq8_out):.1f} dB"
          f", ONNX Runtime int8 {sqnr_db(ref, ort8_out):.1f} dB (pre-processed), "
          f"{sqnr_db(ref, ort8raw_out):.1f} dB (as is)")
    print(f"ONNX Runtime running eqquant's QDQ export: within one output step of eqquant's own "
          f"int8 result on {within * 100:.2f}% of outputs; SQNR {sqnr_db(ref, ortq_out):.1f} dB")
    iname = ortq.get_inputs()[0].name
    med = time_alternating({
        "eq int8": lambda: q.run(check), "eq fp32": lambda: fp32.run(check),
        "ORT int8": lambda: ort8.run(None, {"input": check}),
        "ORT int8 raw": lambda: ort8raw.run(None, {"input": check}),
        "ORT fp32": lambda: ort32.run(None, {"input": check}),
        "ORT(eq QDQ)": lambda: ortq.run(None, {iname: check})}, args.runs)
    print("latency, medians of alternating runs (batch 1, 2 threads; ORT int8 pre-processed, "
          "ORT int8 raw as is):")
    for k, v in med.items():
        print(f"  {k:12s} {v:8.2f} ms   {v / med['ORT int8']:6.2f}x ORT int8")


if __name__ == "__main__":
    main()
