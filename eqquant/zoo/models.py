"""The model zoo: programs and weights generated deterministically from a seed.

    model = build("resnet18", seed=0)          # ZooModel(module, params, inputs)
    write(model, "out/")                       # out/resnet18.ir, .npz, .input.npz

Weights are He-normal; batch norms get non-trivial statistics (gamma in [0.5, 1.5), beta and
mean ~ N(0, 0.1^2) and N(0, 0.2^2), var in [0.5, 2)), so folding them is a real test. Parameter
names follow PyTorch's (``layer1.0.conv1.weight``) except the seed-004 block, which keeps the
names of the seed's listing (``aten::_convolution_0.weight``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..ir.builder import Builder
from ..core.nodes import Expr, Module
from ..ir.params import atomic_write, save_params
from ..ir.printer import print_module


@dataclass
class ZooModel:
    name: str
    module: Module
    params: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]  # one sample input: images N(0, 1); token IDs and a mask


RESIDUAL_GAMMA = (0.1, 0.5)


class _Net:
    """Layers with PyTorch-style names over a Builder."""

    def __init__(self, seed: int):
        self.b = Builder()
        self.rng = np.random.default_rng(seed)

    def f32(self, a) -> np.ndarray:
        return np.asarray(a, dtype=np.float32)

    def conv(self, x: Expr, name: str, cin: int, cout: int, k: int, stride: int = 1,
             pad: int = 0, groups: int = 1, **attrs) -> Expr:
        fan_in = cin // groups * k * k
        w = self.f32(self.rng.normal(0, np.sqrt(2.0 / fan_in), (cout, cin // groups, k, k)))
        return self.b.call("nn.conv2d", x, self.b.param(name, w), strides=[stride, stride],
                           padding=[pad, pad], groups=groups, **attrs)

    def bn_params(self, prefix: str, c: int, names=("weight", "bias", "running_mean",
                                                     "running_var"), gamma=(0.5, 1.5)):
        r = self.rng
        values = (r.uniform(*gamma, c), r.normal(0, 0.1, c), r.normal(0, 0.2, c),
                  r.uniform(0.5, 2.0, c))
        return [self.b.param(f"{prefix}.{n}", self.f32(v)) for n, v in zip(names, values)]

    def bn(self, x: Expr, prefix: str, c: int, gamma=(0.5, 1.5)) -> Expr:
        """``gamma`` is smaller for the last norm of a residual branch, as in trained nets
        (and zero-init-residual training), so activations stay bounded through depth."""
        return self.b.get(self.b.call("nn.batch_norm", x, *self.bn_params(prefix, c,
                                                                           gamma=gamma)), 0)

    def relu(self, x: Expr) -> Expr:
        return self.b.call("nn.relu", x)

    def head(self, x: Expr, name: str, cin: int, classes: int) -> Expr:
        x = self.b.call("nn.global_avg_pool2d", x)
        x = self.b.call("nn.batch_flatten", x)
        w = self.f32(self.rng.normal(0, np.sqrt(1.0 / cin), (classes, cin)))
        x = self.b.call("nn.dense", x, self.b.param(f"{name}.weight", w), units=classes)
        bias = self.f32(self.rng.normal(0, 0.01, classes))
        return self.b.call("nn.bias_add", x, self.b.param(f"{name}.bias", bias))

    def finish(self, name: str, out: Expr, seed: int) -> ZooModel:
        mod, params = self.b.finish(out)
        rng = np.random.default_rng(seed + 1)
        inputs = {v.name: self.f32(rng.normal(size=v.type.shape))
                  for v in mod.main.params if v.name not in params}
        return ZooModel(name, mod, params, inputs)


def conv_bn(seed: int = 0, image_size: int = 224, batch: int = 1) -> ZooModel:
    """TVM's FoldBatchnormToConv2D example (the seed document 000): conv2d (3 -> 32, 3x3,
    padding 1) then batch_norm; params uniform in [0, 1)."""
    n = _Net(seed)
    b, r = n.b, n.rng
    x = b.input("data", (batch, 3, image_size, image_size))
    w = b.param("weight", n.f32(r.random((32, 3, 3, 3))))
    y = b.call("nn.conv2d", x, w, strides=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1)
    stats = [b.param(k, n.f32(r.random(32))) for k in ("gamma", "beta", "mean", "variance")]
    y = b.get(b.call("nn.batch_norm", y, *stats, axis=1, epsilon=1e-5), 0)
    return n.finish("conv_bn", y, seed)


def resnet18_stem(seed: int = 0, image_size: int = 224, batch: int = 1) -> ZooModel:
    """ResNet-18's stem and first basic block, the program of TVM's auto-quantization
    example (the seed document 004), its values named as in that listing."""
    n = _Net(seed)
    b = n.b
    x = b.input("data", (batch, 3, image_size, image_size))

    def conv(x, i, cin, k, stride, pad):
        return n.conv(x, f"aten::_convolution_{i}.weight", cin, 64, k, stride, pad,
                      channels=64, kernel_size=[k, k])

    def bn(x, i):
        return b.get(b.call("nn.batch_norm", x, *n.bn_params(f"aten::batch_norm_{i}", 64)), 0)

    y = n.relu(bn(conv(x, 0, 3, 7, 2, 3), 0))
    pool = b.call("nn.max_pool2d", y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])
    y = n.relu(bn(conv(pool, 1, 64, 3, 1, 1), 1))
    y = bn(conv(y, 2, 64, 3, 1, 1), 2)
    return n.finish("resnet18_stem", b.call("add", y, pool), seed)


def _stem(n: _Net, batch: int, image_size: int) -> Expr:
    x = n.b.input("data", (batch, 3, image_size, image_size))
    y = n.relu(n.bn(n.conv(x, "conv1.weight", 3, 64, 7, 2, 3), "bn1", 64))
    return n.b.call("nn.max_pool2d", y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])


def _basic(n: _Net, x: Expr, p: str, cin: int, cout: int, stride: int) -> Expr:
    y = n.relu(n.bn(n.conv(x, f"{p}.conv1.weight", cin, cout, 3, stride, 1), f"{p}.bn1", cout))
    y = n.bn(n.conv(y, f"{p}.conv2.weight", cout, cout, 3, 1, 1), f"{p}.bn2", cout, RESIDUAL_GAMMA)
    if stride != 1 or cin != cout:
        x = n.bn(n.conv(x, f"{p}.downsample.0.weight", cin, cout, 1, stride),
                 f"{p}.downsample.1", cout)
    return n.relu(n.b.call("add", y, x))


def _bottleneck(n: _Net, x: Expr, p: str, cin: int, width: int, stride: int) -> Expr:
    cout = width * 4
    y = n.relu(n.bn(n.conv(x, f"{p}.conv1.weight", cin, width, 1), f"{p}.bn1", width))
    y = n.relu(n.bn(n.conv(y, f"{p}.conv2.weight", width, width, 3, stride, 1),
                    f"{p}.bn2", width))
    y = n.bn(n.conv(y, f"{p}.conv3.weight", width, cout, 1), f"{p}.bn3", cout, RESIDUAL_GAMMA)
    if stride != 1 or cin != cout:
        x = n.bn(n.conv(x, f"{p}.downsample.0.weight", cin, cout, 1, stride),
                 f"{p}.downsample.1", cout)
    return n.relu(n.b.call("add", y, x))


def resnet18(seed: int = 0, image_size: int = 224, batch: int = 1,
             classes: int = 1000) -> ZooModel:
    n = _Net(seed)
    x, cin = _stem(n, batch, image_size), 64
    for i, (c, s) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
        for j in range(2):
            x = _basic(n, x, f"layer{i}.{j}", cin, c, s if j == 0 else 1)
            cin = c
    return n.finish("resnet18", n.head(x, "fc", 512, classes), seed)


def resnet50(seed: int = 0, image_size: int = 224, batch: int = 1,
             classes: int = 1000) -> ZooModel:
    n = _Net(seed)
    x, cin = _stem(n, batch, image_size), 64
    for i, (w, blocks, s) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)],
                                       start=1):
        for j in range(blocks):
            x = _bottleneck(n, x, f"layer{i}.{j}", cin, w, s if j == 0 else 1)
            cin = w * 4
    return n.finish("resnet50", n.head(x, "fc", 2048, classes), seed)


def mobilenet_v2(seed: int = 0, image_size: int = 224, batch: int = 1,
                 classes: int = 1000) -> ZooModel:
    n = _Net(seed)
    b = n.b

    def cbr(x, p, cin, cout, k, stride=1, groups=1, act=True):
        y = n.bn(n.conv(x, f"{p}.0.weight", cin, cout, k, stride, k // 2, groups), f"{p}.1",
                 cout)
        return b.call("clip", y, a_min=0.0, a_max=6.0) if act else y  # ReLU6

    x = b.input("data", (batch, 3, image_size, image_size))
    x = cbr(x, "features.0", 3, 32, 3, 2)
    cin, idx = 32, 1
    for t, c, reps, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]:
        for j in range(reps):
            stride = s if j == 0 else 1
            p, hidden, y, k = f"features.{idx}.conv", cin * t, x, 0
            if t != 1:
                y = cbr(y, f"{p}.{k}", cin, hidden, 1)
                k += 1
            y = cbr(y, f"{p}.{k}", hidden, hidden, 3, stride, groups=hidden)  # depthwise
            y = n.bn(n.conv(y, f"{p}.{k + 1}.weight", hidden, c, 1), f"{p}.{k + 2}", c)
            x = b.call("add", x, y) if stride == 1 and cin == c else y
            cin, idx = c, idx + 1
    x = cbr(x, f"features.{idx}", cin, 1280, 1)
    x = b.call("nn.global_avg_pool2d", x)
    x = b.get(b.call("nn.dropout", b.call("nn.batch_flatten", x), rate=0.2), 0)
    w = n.f32(n.rng.normal(0, np.sqrt(1.0 / 1280), (classes, 1280)))
    x = b.call("nn.dense", x, b.param("classifier.1.weight", w), units=classes)
    x = b.call("nn.bias_add", x, b.param("classifier.1.bias",
                                         n.f32(n.rng.normal(0, 0.01, classes))))
    return n.finish("mobilenet_v2", x, seed)


def vgg_small(seed: int = 0, image_size: int = 64, batch: int = 1, classes: int = 10,
              hidden: int = 2048) -> ZooModel:
    """VGG's shape at a small scale: three stages of a 3x3 convolution, batch norm, relu and
    a 2x2 max pool, then a fully-connected classifier that holds most of the weights (as
    VGG-16's holds nine tenths of its). At the default 64x64, 4096 -> hidden -> hidden ->
    classes: 48 MB of float weights, a batch-1 network bound by memory in its classifier
    and by arithmetic in its convolutions."""
    n = _Net(seed)
    b = n.b
    x = b.input("data", (batch, 3, image_size, image_size))
    cin = 3
    for i, c in enumerate((32, 64, 64)):
        x = n.relu(n.bn(n.conv(x, f"features.{i}.conv.weight", cin, c, 3, 1, 1),
                        f"features.{i}.bn", c))
        x = b.call("nn.max_pool2d", x, pool_size=[2, 2], strides=[2, 2])
        cin = c
    x = b.call("nn.batch_flatten", x)
    k = cin * (image_size // 8) ** 2
    for i, units in enumerate((hidden, hidden, classes)):
        w = n.f32(n.rng.normal(0, np.sqrt(2.0 / k), (units, k)))
        x = b.call("nn.dense", x, b.param(f"classifier.{i}.weight", w), units=units)
        x = b.call("nn.bias_add", x, b.param(f"classifier.{i}.bias",
                                             n.f32(n.rng.normal(0, 0.01, units))))
        if i < 2:
            x = n.relu(x)
        k = units
    return n.finish("vgg_small", x, seed)


def bert_tiny(seed: int = 0, seq: int = 128, batch: int = 1, vocab: int = 1000,
              hidden: int = 128, layers: int = 2, heads: int = 2, ffn: int = 512) -> ZooModel:
    """A BERT-style encoder of bert-tiny's shape (2 layers, hidden 128, 2 heads), as
    Hugging Face's BERT computes it: token IDs and an attention mask as inputs (int64); word,
    position and token-type embeddings summed and normalized; per layer, self-attention (the
    scores q @ k^T divided by sqrt of the head size, -inf added where the mask is 0, softmax,
    times the values), a residual add and LayerNorm, a GELU feed-forward, a residual add and
    LayerNorm; the pooler's tanh of a dense layer on the first token. Weights N(0, 0.02^2),
    as BERT initializes them; the sample input's last quarter is padding."""
    n = _Net(seed)
    b, r = n.b, n.rng
    head = hidden // heads
    ids = b.input("input_ids", (batch, seq), "int64")
    mask = b.input("attention_mask", (batch, seq), "int64")

    def table(name, rows):
        return b.param(name, n.f32(r.normal(0, 0.02, (rows, hidden))))

    def dense(x, name, cin, cout):
        w = b.param(f"{name}.weight", n.f32(r.normal(0, 0.02, (cout, cin))))
        y = b.call("nn.dense", x, w, units=cout)
        return b.call("add", y, b.param(f"{name}.bias", n.f32(r.normal(0, 0.02, cout))))

    def layer_norm(x, name):
        return b.call("nn.layer_norm", x, b.param(f"{name}.weight", n.f32(r.uniform(0.8, 1.2,
                                                                                 hidden))),
                      b.param(f"{name}.bias", n.f32(r.normal(0, 0.02, hidden))), axis=-1,
                      epsilon=1e-12)

    x = b.call("take_at", table("embeddings.word_embeddings.weight", vocab), ids)
    positions = b.call("take", table("embeddings.position_embeddings.weight", 512),
                       indices=list(range(seq)))
    token_type = b.call("take", table("embeddings.token_type_embeddings.weight", 2),
                        indices=[0])
    x = b.call("add", b.call("add", x, positions), token_type)
    x = b.call("reshape", layer_norm(x, "embeddings.LayerNorm"), newshape=[batch * seq, hidden])
    # the additive mask: 0 where a token is attended to, -inf where it is padding
    padding = b.call("equal", mask, b.scalar(0, "int64"))
    bias = b.call("where", padding, b.scalar(float("-inf"), "float32"),
                  b.scalar(0.0, "float32"))
    bias = b.call("reshape", bias, newshape=[batch, 1, 1, seq])

    def split_heads(v):               # (batch * seq, hidden) -> (batch, heads, seq, head)
        v = b.call("reshape", v, newshape=[batch, seq, heads, head])
        return b.call("transpose", v, axes=[0, 2, 1, 3])

    for i in range(layers):
        p = f"encoder.layer.{i}"
        q = split_heads(dense(x, f"{p}.attention.self.query", hidden, hidden))
        k = split_heads(dense(x, f"{p}.attention.self.key", hidden, hidden))
        v = split_heads(dense(x, f"{p}.attention.self.value", hidden, hidden))
        scores = b.call("nn.batch_matmul", q, k, transpose_b=True)
        scores = b.call("divide", scores, b.scalar(float(np.sqrt(head)), "float32"))
        probs = b.call("nn.softmax", b.call("add", scores, bias), axis=-1)
        ctx = b.call("nn.batch_matmul", probs, v, transpose_b=False)
        ctx = b.call("reshape", b.call("transpose", ctx, axes=[0, 2, 1, 3]),
                     newshape=[batch * seq, hidden])
        out = dense(ctx, f"{p}.attention.output.dense", hidden, hidden)
        x = layer_norm(b.call("add", out, x), f"{p}.attention.output.LayerNorm")
        h = b.call("nn.gelu", dense(x, f"{p}.intermediate.dense", hidden, ffn))
        out = dense(h, f"{p}.output.dense", ffn, hidden)
        x = layer_norm(b.call("add", out, x), f"{p}.output.LayerNorm")
    first = b.call("strided_slice", b.call("reshape", x, newshape=[batch, seq, hidden]),
                   begin=[0], end=[1], axes=[1])
    first = b.call("reshape", first, newshape=[batch, hidden])
    pooled = b.call("tanh", dense(first, "pooler.dense", hidden, hidden))
    mod, params = b.finish(pooled)
    rng = np.random.default_rng(seed + 1)
    sample_ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    sample_mask = np.ones((batch, seq), np.int64)
    sample_mask[:, seq - seq // 4:] = 0
    return ZooModel("bert_tiny", mod, params, {"input_ids": sample_ids,
                                               "attention_mask": sample_mask})


MODELS: dict[str, Callable[..., ZooModel]] = {
    "conv_bn": conv_bn, "resnet18_stem": resnet18_stem, "resnet18": resnet18,
    "resnet50": resnet50, "mobilenet_v2": mobilenet_v2, "vgg_small": vgg_small,
    "bert_tiny": bert_tiny,
}
# the names of the seed documents' programs, kept for the demo and old scripts
ALIASES = {"seed000": "conv_bn", "seed004": "resnet18_stem"}


def build(name: str, **kwargs) -> ZooModel:
    name = ALIASES.get(name, name)
    if name not in MODELS:
        from ..errors import EqquantError
        raise EqquantError(f"no zoo model '{name}' (there are: {', '.join(MODELS)}; "
                           f"aliases: {', '.join(ALIASES)})")
    return MODELS[name](**kwargs)


def write(model: ZooModel, out_dir: str | Path) -> dict[str, Path]:
    """Write NAME.ir, NAME.npz (weights) and NAME.input.npz (a sample input) into out_dir."""
    out = Path(out_dir)
    paths = {"ir": out / f"{model.name}.ir", "params": out / f"{model.name}.npz",
             "input": out / f"{model.name}.input.npz"}
    text = print_module(model.module)
    atomic_write(paths["ir"], lambda tmp: Path(tmp).write_text(text))
    save_params(paths["params"], model.params)
    save_params(paths["input"], model.inputs)
    return paths
