"""How tests/data/tiny_encoder.onnx was made (not run by the tests; needs torch and
onnxscript): PyTorch's nn.TransformerEncoder (2 layers, d_model 32, 2 heads, feed-forward
64, GELU, batch first, random weights), exported by torch.export with the batch and the
sequence length left open (dim_param "batch" and "seq"), as a user serving variable-length
batches would export it. (PyTorch's older TorchScript exporter writes the traced sequence
length into the attention's reshapes: its file runs at one length only.)

    python tests/data/make_tiny_encoder.py
"""
from pathlib import Path

import torch
from torch import nn


def main() -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, activation="gelu",
                                       batch_first=True)
    net = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    seq = torch.export.Dim("seq", min=2, max=512)
    out = Path(__file__).with_name("tiny_encoder.onnx")
    torch.onnx.export(net, (torch.randn(2, 8, 32),), str(out), input_names=["input"],
                      output_names=["output"], dynamic_shapes={"src": {0: batch, 1: seq}},
                      opset_version=18, dynamo=True, external_data=False)
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
