"""Small ONNX models built with onnx.helper for the import/export tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper



class G:
    """A tiny graph builder: g.node("Conv", [x, w], pads=[...]) -> output name."""

    def __init__(self, opset: int = 17):
        self.nodes, self.inits, self.opset, self.n = [], [], opset, 0
        # one generator per model: a model's weights do not depend on which tests ran first
        self.rng = np.random.default_rng(7)

    def init(self, arr, name=None) -> str:
        self.n += 1
        name = name or f"w{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def weight(self, *shape, scale=0.2) -> str:
        return self.init((self.rng.standard_normal(shape) * scale).astype(np.float32))

    def node(self, op, ins, n_out=1, name=None, **attrs):
        self.n += 1
        outs = [f"{op.lower()}_{self.n}" + (f"_{i}" if i else "") for i in range(n_out)]
        self.nodes.append(helper.make_node(op, ins, outs, name=name or f"{op}_{self.n}",
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def bn(self, x, c) -> str:
        return self.node("BatchNormalization", [
            x, self.init(self.rng.uniform(0.5, 1.5, c).astype(np.float32)),
            self.init(self.rng.normal(0, 0.1, c).astype(np.float32)),
            self.init(self.rng.normal(0, 0.1, c).astype(np.float32)),
            self.init(self.rng.uniform(0.5, 1.5, c).astype(np.float32))], epsilon=1e-5)

    def model(self, inputs, outputs, name="m"):
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs]
        graph = helper.make_graph(self.nodes, name, ins, [], initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        m.ir_version = 8
        inferred = {v.name: v for v in
                    onnx.shape_inference.infer_shapes(m).graph.value_info}
        m.graph.output.extend([inferred[n] for n in outputs])
        onnx.checker.check_model(m)
        return m


def resnet_block(c: int = 16) -> onnx.ModelProto:
    """conv-BN-relu, conv-BN, identity shortcut add, relu (explicit BatchNormalization)."""
    g = G()
    x = "input.1"
    y = g.node("Relu", [g.bn(g.node("Conv", [x, g.weight(c, c, 3, 3)], pads=[1, 1, 1, 1]), c)])
    y = g.bn(g.node("Conv", [y, g.weight(c, c, 3, 3)], pads=[1, 1, 1, 1]), c)
    out = g.node("Relu", [g.node("Add", [y, x])])
    return g.model([(x, [1, c, 14, 14])], [out])


def resnet_downsample_block() -> onnx.ModelProto:
    """A stem (7x7/2 conv, BN, relu, 3x3/2 max pool) then a strided block with a 1x1
    projection shortcut."""
    g = G()
    x = "data"
    y = g.node("Relu", [g.bn(g.node("Conv", [x, g.weight(8, 3, 7, 7, scale=0.1)],
                                    strides=[2, 2], pads=[3, 3, 3, 3]), 8)])
    y = g.node("MaxPool", [y], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    a = g.node("Relu", [g.bn(g.node("Conv", [y, g.weight(16, 8, 3, 3)], strides=[2, 2],
                                    pads=[1, 1, 1, 1]), 16)])
    a = g.bn(g.node("Conv", [a, g.weight(16, 16, 3, 3)], pads=[1, 1, 1, 1]), 16)
    s = g.bn(g.node("Conv", [y, g.weight(16, 8, 1, 1)], strides=[2, 2]), 16)
    out = g.node("Relu", [g.node("Add", [a, s])])
    return g.model([(x, [1, 3, 32, 32])], [out])


def mobilenet_block(c: int = 8, t: int = 4) -> onnx.ModelProto:
    """Inverted residual: 1x1 expand, ReLU6 (Clip), 3x3 depthwise, ReLU6, 1x1 project, add."""
    g = G()
    x = "x"
    e = c * t
    y = g.node("Clip", [g.bn(g.node("Conv", [x, g.weight(e, c, 1, 1)]), e),
                        g.init(np.float32(0), "zero"), g.init(np.float32(6), "six")])
    y = g.node("Clip", [g.bn(g.node("Conv", [y, g.weight(e, 1, 3, 3)], group=e,
                                    pads=[1, 1, 1, 1]), e), "zero", "six"])
    y = g.bn(g.node("Conv", [y, g.weight(c, e, 1, 1)]), c)
    out = g.node("Add", [x, y])
    return g.model([(x, [1, c, 16, 16])], [out])


def classifier_head(c: int = 32, classes: int = 10) -> onnx.ModelProto:
    """Global average pool, Flatten, Gemm (transB=1, bias), Softmax: a ResNet's head."""
    g = G()
    x = "features"
    y = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    y = g.node("Gemm", [y, g.weight(classes, c), g.weight(classes)], transB=1)
    out = g.node("Softmax", [y], axis=-1)
    return g.model([(x, [1, c, 7, 7])], [out])


def many_ops() -> onnx.ModelProto:
    """Every other supported op once: LeakyRelu, Sigmoid, Clip (attribute form via opset 17's
    inputs), AveragePool, auto_pad, Pad, Transpose, Squeeze/Unsqueeze, Reshape, Concat, MatMul,
    Gemm with alpha/beta/transA, Sub/Mul/Div broadcasting, Identity, Dropout, Constant, and a
    PyTorch-style Shape -> Gather -> Concat chain feeding a Reshape."""
    g = G()
    x = "img"
    y = g.node("Conv", [x, g.weight(6, 3, 3, 3), g.weight(6)], auto_pad="SAME_UPPER",
               strides=[2, 2])
    y = g.node("LeakyRelu", [y], alpha=0.1)
    y = g.node("AveragePool", [y], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
               count_include_pad=1)
    y = g.node("Pad", [y, g.init(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))],
               mode="constant")
    s = g.node("Sigmoid", [y])
    c = g.node("Constant", [], value=numpy_helper.from_array(
        np.linspace(-1, 1, 6).astype(np.float32).reshape(1, 6, 1, 1)))
    y = g.node("Mul", [g.node("Sub", [y, c]), s])
    y = g.node("Div", [y, g.init(np.float32(2.0))])
    y = g.node("Clip", [y, g.init(np.float32(-1.5)), ""])
    y = g.node("Identity", [g.node("Dropout", [y])])
    t = g.node("Transpose", [y], perm=[0, 2, 3, 1])                # (1, 12, 12, 6)
    shape = g.node("Shape", [t])
    n = g.node("Gather", [shape, g.init(np.array([0], np.int64))], axis=0)
    flat = g.node("Reshape", [t, g.node("Concat", [n, g.init(np.array([-1, 6], np.int64))],
                                          axis=0)])             # (1, 144, 6)
    m = g.node("MatMul", [flat, g.weight(6, 4)])                  # (1, 144, 4)
    m = g.node("Squeeze", [m, g.init(np.array([0], np.int64))])   # (144, 4)
    a = g.node("Gemm", [m, g.weight(144, 5), g.weight(4, 5)], transA=1, alpha=0.5, beta=2.0)
    u = g.node("Unsqueeze", [a, g.init(np.array([0, 3], np.int64))])  # (1, 4, 5, 1)
    cat = g.node("Concat", [u, u], axis=3)                         # (1, 4, 5, 2)
    out = g.node("Reshape", [cat, g.init(np.array([0, -1], np.int64))])
    return g.model([(x, [1, 3, 20, 20])], [out])


ALL = {"resnet_block": resnet_block, "resnet_downsample_block": resnet_downsample_block,
       "mobilenet_block": mobilenet_block, "classifier_head": classifier_head,
       "many_ops": many_ops}


def input_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def tiny_resnet() -> onnx.ModelProto:
    """Stem, one residual block and a classifier, with a symbolic batch dimension: the model
    behind tests/data/tiny_resnet.onnx (``python tests/onnx_models.py`` writes it)."""
    g = G(opset=13)
    x = "input.1"
    y = g.node("Relu", [g.bn(g.node("Conv", [x, g.weight(8, 3, 3, 3)], strides=[2, 2],
                                    pads=[1, 1, 1, 1]), 8)])
    y = g.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    a = g.node("Relu", [g.bn(g.node("Conv", [y, g.weight(8, 8, 3, 3)], pads=[1, 1, 1, 1]), 8)])
    a = g.bn(g.node("Conv", [a, g.weight(8, 8, 3, 3)], pads=[1, 1, 1, 1]), 8)
    y = g.node("Relu", [g.node("Add", [a, y])])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y])])
    out = g.node("Gemm", [y, g.weight(5, 8), g.weight(5)], transB=1)
    return g.model([(x, ["N", 3, 16, 16])], [out], name="tiny_resnet")


if __name__ == "__main__":
    from pathlib import Path
    path = Path(__file__).parent / "data" / "tiny_resnet.onnx"
    onnx.save(tiny_resnet(), str(path))
    print(f"wrote {path}")
