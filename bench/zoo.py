"""The torchvision zoo end to end: each model (random weights, non-trivial batch-norm
statistics) exported by PyTorch to ONNX, imported by eqquant, checked against ONNX Runtime fp32,
then (with --int8) quantized by eqquant and by ONNX Runtime's quantize_static from the same
samples, and the two int8 programs set side by side.

    pip install torch==2.13.0 torchvision     # not eqquant dependencies (see the README)
    python bench/zoo.py [--models resnet18 mobilenet_v3_small ...] [--int8] [--calib 4]

Per model it prints: whether it imports (or the first error), the imported program's max
relative error against ONNX Runtime fp32 on one N(0, 1) input, and with --int8: the output SQNR
(dB, against ONNX Runtime fp32) of eqquant's int8 program and of ONNX Runtime's quantize_static
(QDQ, per-channel, uint8/int8, MinMax), the fraction of conv/dense/matmul MACs eqquant runs in
integers, the quantize/dequantize pairs left inside the network (not counting the input's
quantize and the outputs' dequantize; the pairs around ops that stay float by design, such as
LayerNorm, counted apart: FLOAT_BY_DESIGN), and the share of outputs of eqquant's QDQ export that
ONNX Runtime computes within one output step; with --latency also the int8 latency ratio
eqquant / ONNX Runtime (each system in its own process, rounds alternating, 2 threads, medians;
bench/peers.py's workers; ``--weight-bits 7``: eqquant's weights within +-63, ONNX Runtime's as
they are), or without --int8 the fp32 one: the exported file run as `eqquant
run model.onnx` runs it (optimized once and cached, on its library) against ONNX Runtime.
"""
from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import (ort_integer_products, ort_quantize_dynamic,  # noqa: E402
                     ort_quantize_static, ort_session, torchvision_models)

MODELS = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
          "shufflenet_v2_x1_0", "mnasnet1_0", "squeezenet1_1", "googlenet", "inception_v3",
          "densenet121", "vgg11_bn", "efficientnet_b0", "regnet_y_400mf", "convnext_tiny",
          "vit_b_16", "alexnet", "resnext50_32x4d"]
# Transformers with a sequence input (--seq tokens): a BERT-style encoder whose inputs are
# token IDs and an attention mask, and PyTorch's own nn.TransformerEncoder on float vectors
SEQUENCE_MODELS = ["bert_tiny", "transformer_encoder"]


# Ops that stay float by design, with why; the pair around each is counted apart.
FLOAT_BY_DESIGN = {
    "nn.layer_norm": "a normalization over a whole row: no 8-bit rule expresses it",
    "nn.softmax": "an exponential normalized over a row (ViT's attention; the issue allows it)",
}


def _sequence_model(name: str):
    """bert_tiny: BERT's embeddings (word, position, token type; LayerNorm), 2 layers of
    PyTorch's TransformerEncoderLayer (hidden 128, 2 heads, GELU, feed-forward 512) with
    the attention mask as a key padding mask, and the pooler; transformer_encoder: PyTorch's
    nn.TransformerEncoder (4 layers, d_model 256, 4 heads, GELU, batch first) on float
    vectors. Weights N(0, 0.02^2) as BERT's, LayerNorms near 1."""
    import torch
    from torch import nn

    def layers(d, heads, ffn, n):
        layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu",
                                           batch_first=True)
        return nn.TransformerEncoder(layer, n, enable_nested_tensor=False)

    class Bert(nn.Module):
        def __init__(self, vocab=1000, hidden=128):
            super().__init__()
            self.word, self.position = nn.Embedding(vocab, hidden), nn.Embedding(512, hidden)
            self.token_type = nn.Embedding(2, hidden)
            self.norm = nn.LayerNorm(hidden)
            self.encoder = layers(hidden, 2, 4 * hidden, 2)
            self.pooler = nn.Linear(hidden, hidden)

        def forward(self, input_ids, attention_mask):
            positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
            x = self.norm(self.word(input_ids) + self.position(positions)
                          + self.token_type(torch.zeros_like(input_ids)))
            x = self.encoder(x, src_key_padding_mask=attention_mask == 0)
            return torch.tanh(self.pooler(x[:, 0]))

    net = Bert() if name == "bert_tiny" else layers(256, 4, 1024, 4)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p_name, p in net.named_parameters():
            if "norm" in p_name and p_name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return net.eval()


def example(name: str, rng: np.random.Generator, size: int, seq: int) -> dict:
    """One input of model ``name`` by ONNX input name: an N(0, 1) image; for bert_tiny
    token IDs and a mask whose last quarter or less is padding; N(0, 1) vectors for the
    encoder."""
    if name == "bert_tiny":
        mask = np.ones((1, seq), np.int64)
        mask[:, seq - int(rng.integers(0, seq // 4 + 1)):] = 0
        return {"input_ids": rng.integers(0, 1000, (1, seq)).astype(np.int64),
                "attention_mask": mask}
    if name == "transformer_encoder":
        return {"input": rng.standard_normal((1, seq, 256)).astype(np.float32)}
    return {"input": rng.standard_normal((1, 3, size, size)).astype(np.float32)}


def build(name: str, seed: int = 0):
    import torch
    torch.manual_seed(seed)
    if name in SEQUENCE_MODELS:
        return _sequence_model(name)
    models = torchvision_models()
    kwargs = {"aux_logits": False, "init_weights": True} if name in ("googlenet",
                                                                     "inception_v3") else {}
    net = getattr(models, name)(weights=None, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
            elif isinstance(m, torch.nn.Linear) and not m.weight.any():
                # (ViT's head starts at zero: its output would be all zeros)
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.02)
    return net.eval()


def export(net, inputs: dict) -> bytes:
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, tuple(torch.from_numpy(v) for v in inputs.values()), buf,
                          dynamo=False, opset_version=17,
                          training=torch.onnx.TrainingMode.PRESERVE,
                          do_constant_folding=False, input_names=list(inputs),
                          output_names=["logits"])
    return buf.getvalue()


def _macs(module) -> tuple[float, float]:
    """(integer MACs, all MACs) of the program's heavy ops (COMPUTE), from their cost hooks."""
    from eqquant.core.nodes import Call, post_order
    from eqquant.ir.typecheck import infer_types
    from eqquant.ops.registry import COMPUTE
    types = infer_types(module)
    done = total = 0.0
    for n in post_order(module.main.body):
        if isinstance(n, Call) and not hasattr(n.op, "body") and COMPUTE in n.op.props \
                and n.op.flops is not None:
            f = n.op.flops([types[id(a)] for a in n.args], types[id(n)], n.attrs) / 2
            total += f
            if str(getattr(types[id(n.args[0])], "dtype", "")).startswith(("int", "uint")):
                done += f
    return done, total


def one(name: str, args) -> str:
    import eqquant
    from eqquant.core.nodes import Call, post_order
    from eqquant.errors import EqquantError
    from eqquant.quant.flow import sqnr_db
    size = 299 if name == "inception_v3" else args.size
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    check = example(name, rng, size, args.seq)
    src = export(build(name), check)
    ref = ort_session(src).run(None, check)[0]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"{name}.onnx"
        path.write_bytes(src)
        try:
            model = eqquant.load(path)
        except EqquantError as e:
            return f"{name:20s} no import: {str(e).splitlines()[0][:110]}"
        got = model.run(check)
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        row = f"{name:20s} imports; fp32 max rel err {err:.1e}"
        inputs = Path(d) / "latency.input.npz"
        np.savez(inputs, **model.named(check))
        if not args.int8:
            if args.latency:      # `eqquant run model.onnx` (optimized once, its library)
                ratio = _latency_ratio(path, path, inputs, args.rounds, "fp32")
                row += f"; fp32 latency eq/ORT {ratio:.2f}"
            return row + f"  ({time.perf_counter() - t0:.0f} s)"
        samples = [example(name, rng, size, args.seq) for _ in range(args.calib)]
        try:
            q = eqquant.quantize(model, samples, mode="dynamic" if args.dynamic else
                                 "minmax", per_channel=True, weight_bits=args.weight_bits)
        except EqquantError as e:
            return row + f"; no int8: {str(e).splitlines()[0][:90]}"
        eq8 = sqnr_db(ref, q.run(check))
        ort8_bytes = ort_quantize_dynamic(src) if args.dynamic else \
            ort_quantize_static(src, samples)
        ort8 = ort_session(ort8_bytes)
        theirs = sqnr_db(ref, ort8.run(None, check)[0])
        module = q.quantized.module
        calls = [n for n in post_order(module.main.body) if isinstance(n, Call)]
        quantizes = [n for n in calls if n.op_name == "qnn.quantize"]
        # the pairs around ops that stay float by design (no 8-bit rule: see FLOAT_BY_DESIGN)
        around = sum(isinstance(n.args[0], Call) and n.args[0].op_name in FLOAT_BY_DESIGN
                     for n in quantizes)
        inside = len(quantizes) - 1 - around
        done, total = _macs(module)
        qdq_note = "QDQ export (static only)"
        if not args.dynamic:
            qdq = q.export_onnx(Path(d) / f"{name}.int8.onnx")
            s = ort_session(qdq.read_bytes())
            theirs_of_ours = s.run(None, {i.name: check[i.name] for i in s.get_inputs()})[0]
            ours = q.run(check)
            step = float(np.max(np.abs(ours))) / 127
            agree = float(np.mean(np.abs(ours - theirs_of_ours) <= step))
            qdq_note = f"QDQ export within one step {100 * agree:.1f}%"
        latency = ""
        if args.latency:
            from eqquant.ir.loader import save_program
            ir, _ = save_program(Path(d) / "eq.int8.ir", q.quantized.runnable)
            ort_path = Path(d) / "ort.int8.onnx"
            ort_path.write_bytes(ort8_bytes)
            ratio = _latency_ratio(ir, ort_path, inputs, args.rounds, "int8")
            latency = f"; int8 latency eq/ORT {ratio:.2f}"
        kind = "dynamic" if args.dynamic else "static"
        ort_int, ort_all = ort_integer_products(ort8_bytes)
        return (row + f"; int8 {kind} SQNR {eq8:.1f} dB (ORT {theirs:.1f}, its products in "
                f"integers {ort_int} of {ort_all}); integer MACs "
                f"{100 * done / max(total, 1):.0f}%; q/dq pairs inside {inside} (+{around} around "
                f"ops float by design); {qdq_note}{latency}  "
                f"({time.perf_counter() - t0:.0f} s)")


def _latency_ratio(ours: Path, theirs: Path, inputs: Path, rounds: int, precision: str) -> float:
    """Median latency of eqquant's program ``ours`` (as ``eqquant run`` runs it: its library)
    over ONNX Runtime's ``theirs`` (int8: its quantize_static model; fp32: the same ONNX file),
    each in its own worker process (bench/peers.py: a round SETTLE seconds after the other's),
    rounds alternating between the two."""
    import statistics
    from peers import Worker
    workers = {"eq": Worker(f"eqquant {precision}", ours, inputs),
               "ort": Worker(f"ORT {precision}", theirs, inputs)}
    print(f"  ({ours.name}: eqquant runs on its {workers['eq'].engine})", flush=True)
    times: dict[str, list[float]] = {k: [] for k in workers}
    try:
        for _ in range(rounds):
            for k, w in workers.items():
                times[k] += w.run(2)
    finally:
        for w in workers.values():
            w.close()
    return statistics.median(times["eq"]) / statistics.median(times["ort"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS + SEQUENCE_MODELS)
    ap.add_argument("--seq", type=int, default=128, help="the transformers' tokens")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--calib", type=int, default=4)
    ap.add_argument("--dynamic", action="store_true",
                    help="with --int8: dynamic quantization for both (eqquant --mode dynamic, "
                         "ONNX Runtime's quantize_dynamic), the samples only checking")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--weight-bits", type=int, default=8, choices=[8, 7],
                    help="eqquant's weights: 7 runs every convolution on the AVX2 byte kernel "
                         "on a CPU without VNNI (ONNX Runtime stays at its defaults)")
    ap.add_argument("--latency", action="store_true",
                    help="time eqquant's and ONNX Runtime's programs: int8 with --int8, else "
                         "fp32 (`eqquant run model.onnx` against ONNX Runtime on the file)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("this benchmark needs PyTorch: pip install torch==2.13.0 torchvision")
    torch.set_num_threads(2)
    from peers import THREADS, cpu_model
    from eqquant.runtime.lowering.int8 import int8_path
    print(f"CPU: {cpu_model()}; {THREADS} threads per system; eqquant int8 kernel path: "
          f"{int8_path()}; PyTorch {torch.__version__}")
    for name in args.models:
        try:
            print(one(name, args), flush=True)
        except Exception as e:  # noqa: BLE001 - a sweep reports and goes on
            print(f"{name:20s} failed: {type(e).__name__}: {(str(e) or '-').splitlines()[0][:100]}",
                  flush=True)


if __name__ == "__main__":
    main()
