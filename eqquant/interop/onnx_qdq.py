"""Int8 programs to ONNX's QDQ form: what ONNX Runtime's ``quantize_static`` writes.

Each 8-bit value of the program becomes an ONNX uint8 tensor (or int8, on request) carrying the
same real numbers: an int8 value q with zero point z is written as q + 128 with zero point
z + 128, which ``DequantizeLinear`` reads back exactly. Each integer op becomes the float op
between DequantizeLinear and QuantizeLinear, the pattern ONNX Runtime fuses back into
QLinearConv, QLinearAdd and friends:

    fused.qconv2d(x, w, b, ..., s2, z2, activation="relu")
      =>  QuantizeLinear(Relu(Conv(DQ(x), DQ(w int8, sw, axis=0), DQ(b int32, sx*sw))), s2, z2)
    qnn.add(a, b, ..., so, zo)            =>  QuantizeLinear(Add(DQ(a), DQ(b)), so, zo)
    nn.max_pool2d(q)                      =>  QuantizeLinear(MaxPool(DQ(q)), s, z)
    qnn.requantize(q, s1, z1, s2, z2)     =>  QuantizeLinear(DQ(q), s2, z2)

An int32 accumulator (``qnn.conv2d`` not fused) is kept as a float tensor holding its real
value, acc * sx * sw; an int32 bias added to it is that bias times the same scale.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import EqquantError
from ..core.nodes import Call, Constant
from ..core.types import is_int

LAYOUT_OPS = ("reshape", "expand_dims", "squeeze", "nn.batch_flatten", "transpose")
PASS = ("annotation.stop_fusion", "annotation.cast_hint", "nn.dropout")


@dataclass(frozen=True)
class Q8:
    """An 8-bit ONNX tensor's quantization: its scale and zero-point initializers."""

    scale: str
    zero_point: str
    zero: int            # the zero point in the program's own dtype


@dataclass(frozen=True)
class Acc:
    """An int32 accumulator exported as a float tensor of its real value (acc * scale)."""

    scale: np.ndarray   # broadcastable against the accumulator (per channel: (C, 1, 1))


class QDQ:
    def __init__(self, exporter):
        self.ex = exporter
        self.info: dict[int, Q8 | Acc] = {}

    def handles(self, node: Call) -> bool:
        from ..ops.registry import QUANT
        return QUANT in node.op.props or any(
            is_int(getattr(self.ex.type(a), "dtype", "float32")) and id(a) in self.info
            for a in node.args)

    # -- helpers ------------------------------------------------------------------------------

    def scalar(self, node: Call, i: int, what: str) -> np.ndarray:
        v = self.ex.value(node.args[i])
        if v is None:
            raise EqquantError(f"ONNX export: {node.op.name}'s {what} must be a constant",
                               node.loc)
        return v

    def q8(self, node: Call, scale_i: int, zp_i: int, ir_dtype: str) -> Q8:
        """Quantization parameters for an 8-bit output of ``node``, in the exported dtype."""
        s = self.scalar(node, scale_i, "scale").astype(np.float32)
        z = self.scalar(node, zp_i, "zero point").astype(np.int64)
        if s.ndim != 0 or z.ndim != 0:
            raise EqquantError(f"ONNX export: {node.op.name}: per-channel activation scales "
                               "have no QDQ form here", node.loc)
        dtype = self.ex.activation_dtype if ir_dtype == "int8" else ir_dtype
        if ir_dtype not in ("int8", "uint8"):
            raise EqquantError(f"ONNX export: {node.op.name} produces {ir_dtype}; only 8-bit "
                               "activations have a QDQ form", node.loc)
        shift = 128 if (ir_dtype, dtype) == ("int8", "uint8") else 0
        zp = np.asarray(int(z) + shift, dtype)
        return Q8(self.ex.const(s, "scale"), self.ex.const(zp, "zero_point"), int(z))

    def dq(self, arg) -> str:
        """The real value of an exported integer value."""
        info = self.info.get(id(arg))
        name = self.ex.name_of(arg)
        if isinstance(info, Q8):
            return self.ex.emit("DequantizeLinear", [name, info.scale, info.zero_point])
        if isinstance(info, Acc):
            return name
        raise EqquantError("ONNX export: an integer value whose scale is not known "
                           f"({self.ex.type(arg)}); export the program eqquant quantize wrote",
                           getattr(arg, "loc", None))

    def quantize(self, real: str, q: Q8) -> str:
        return self.ex.emit("QuantizeLinear", [real, q.scale, q.zero_point])

    def weight(self, node: Call, w_i: int, sw_i: int, zw_i: int) -> tuple[str, np.ndarray]:
        w = node.args[w_i]
        if not isinstance(w, Constant) or w.data is None or str(w.data.dtype) != "int8":
            raise EqquantError(f"ONNX export: {node.op.name}'s weight must be an int8 constant",
                               node.loc)
        sw = self.scalar(node, sw_i, "kernel scale").astype(np.float32)
        zw = self.scalar(node, zw_i, "kernel zero point")
        if np.any(zw != 0):
            raise EqquantError("ONNX export: int8 weights with a zero point other than 0",
                               node.loc)
        axis = {"axis": 0} if sw.ndim == 1 else {}
        zeros = np.zeros(sw.shape, np.int8)
        name = self.ex.emit("DequantizeLinear", [self.ex.const(w.data, "w"), self.ex.const(sw),
                                                 self.ex.const(zeros)], **axis)
        return name, sw

    def conv(self, node: Call, bias: int | None) -> tuple[str, np.ndarray]:
        """Conv of the dequantized operands (x, w first; then zx, zw, sx, sw at the offsets
        qnn.conv2d and fused.qconv2d use), with the int32 bias dequantized at sx * sw."""
        a = node.attrs
        off = 1 if bias is not None else 0
        x = self.dq(node.args[0])
        w, sw = self.weight(node, 1, 5 + off, 3 + off)
        sx = self.scalar(node, 4 + off, "input scale").astype(np.float32)
        w_t = self.ex.type(node.args[1])
        ins = [x, w]
        acc_scale = (sx * sw).astype(np.float32)
        if bias is not None:
            b = node.args[bias]
            if not isinstance(b, Constant) or b.data is None:
                raise EqquantError("ONNX export: the bias must be an int32 constant", node.loc)
            flat = np.asarray(b.data).reshape(-1).astype(np.int32)
            s_b = np.broadcast_to(acc_scale, flat.shape).astype(np.float32) \
                if acc_scale.ndim else acc_scale
            axis = {"axis": 0} if s_b.ndim else {}
            ins.append(self.ex.emit("DequantizeLinear", [
                self.ex.const(flat, "bias"), self.ex.const(s_b),
                self.ex.const(np.zeros(s_b.shape, np.int32))], **axis))
        y = self.ex.emit("Conv", ins, strides=list(a["strides"]), pads=list(a["padding"]),
                         dilations=list(a["dilation"]), group=a["groups"],
                         kernel_shape=list(w_t.shape[2:]))
        return y, acc_scale.reshape(-1, 1, 1) if acc_scale.ndim else acc_scale

    # -- ops -------------------------------------------------------------------------------------

    def call(self, node: Call) -> str:
        self.ex.quantized = True
        op, a, args = node.op.name, node.attrs, node.args
        out_t = self.ex.type(node)
        if op == "qnn.quantize":
            q = self.q8(node, 1, 2, a["out_dtype"])
            return self._set(node, q, self.quantize(self.ex.name_of(args[0]), q))
        if op == "qnn.dequantize":
            real = self.dq(args[0])
            return real
        if op == "fused.qconv2d":
            y, _ = self.conv(node, bias=2)
            if a["activation"] in ("relu", "clip"):
                y = self.ex.act(y, a)
            q = self.q8(node, 9, 10, a["out_dtype"])
            return self._set(node, q, self.quantize(y, q))
        if op == "qnn.conv2d":
            y, scale = self.conv(node, bias=None)
            self.info[id(node)] = Acc(scale)
            return y
        if op == "qnn.dense":
            w, sw = self.weight(node, 1, 5, 3)
            sx = self.scalar(node, 4, "input scale").astype(np.float32)
            self.info[id(node)] = Acc((sx * sw).astype(np.float32))
            return self.ex.emit("Gemm", [self.dq(args[0]), w], transB=1)
        if op == "qnn.requantize":
            q = self.q8(node, 3, 4, a["out_dtype"])
            return self._set(node, q, self.quantize(self.dq(args[0]), q))
        if op == "qnn.add":
            q = self.q8(node, 6, 7, out_t.dtype)
            real = self.ex.emit("Add", [self.dq(args[0]), self.dq(args[1])])
            return self._set(node, q, self.quantize(real, q))
        first = self.info.get(id(args[0]))
        if op == "add" and isinstance(first, Acc):
            b = self.ex.value(args[1])
            if b is None:
                raise EqquantError("ONNX export: an int32 accumulator plus a computed value",
                                   node.loc)
            self.info[id(node)] = first
            real_b = (b.astype(np.float64) * first.scale).astype(np.float32)
            return self.ex.emit("Add", [self.ex.name_of(args[0]), self.ex.const(real_b)])
        if op == "qnn.clip" and isinstance(first, Acc):
            self.info[id(node)] = first
            return self.ex.act(self.ex.name_of(args[0]), {**a, "activation": "clip"})
        if op == "nn.relu" and isinstance(first, Acc):
            self.info[id(node)] = first
            return self.ex.emit("Relu", [self.ex.name_of(args[0])])
        if isinstance(first, Q8):
            x = self.ex.name_of(args[0])
            if op in LAYOUT_OPS:          # moves bytes: runs on the 8-bit tensor itself
                return self._set(node, first, self.ex.call_on(node, x))
            if op in PASS:
                return self._set(node, first, x)
            if op == "qnn.clip":
                y = self.ex.act(self.dq(args[0]), {**a, "activation": "clip"})
                return self._set(node, first, self.quantize(y, first))
            if op in ("nn.max_pool2d", "nn.avg_pool2d", "nn.relu", "nn.global_avg_pool2d"):
                real = self.dq(args[0])
                if op == "nn.relu" and first.zero != 0:
                    raise EqquantError("ONNX export: relu of an 8-bit value with a zero "
                                       "point other than 0", node.loc)
                if op == "nn.relu":
                    y = self.ex.emit("Relu", [real])
                elif op == "nn.global_avg_pool2d":
                    y = self.ex.emit("GlobalAveragePool", [real])
                else:
                    y = self.ex.pool(op, real, a)
                return self._set(node, first, self.quantize(y, first))
        raise EqquantError(f"ONNX export: {op} on {self.ex.type(args[0])} has no QDQ form "
                           "(export the program eqquant quantize wrote, not its realize view)",
                           node.loc)

    def _set(self, node: Call, q: Q8, name: str) -> str:
        self.info[id(node)] = q
        return name
