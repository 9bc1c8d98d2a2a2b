"""Int8 programs to ONNX's QDQ form: what ONNX Runtime's ``quantize_static`` writes.

This module is the machinery (parameters, dequantized operands, weights); what each op becomes
is its registry entry's QDQ form (``OnnxForm.qdq``, in ``eqquant/ops/qnn.py`` for the QNN ops)
or follows from its properties. Each 8-bit value of the program becomes an ONNX uint8 tensor
(or int8, on request) carrying the same real numbers: an int8 value q with zero point z is
written as q + 128 with zero point z + 128, which ``DequantizeLinear`` reads back exactly.
Each integer op becomes the float op between DequantizeLinear and QuantizeLinear, the pattern
ONNX Runtime fuses back into QLinearConv, QLinearAdd and friends:

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
from ..core.nodes import Call, Constant, Scalar, Tuple
from ..core.types import is_int
from ..ops.registry import ANNOTATION, IDENTITY, LAYOUT, POOL, QUANT



@dataclass(frozen=True)
class Q8:
    """An 8-bit ONNX tensor's quantization: its scale and zero-point initializers."""

    scale: str
    zero_point: str
    zero: int            # the zero point in the program's own dtype
    step: float = 0.0    # the scale's value


@dataclass(frozen=True)
class Acc:
    """An int32 accumulator exported as a float tensor of its real value (acc * scale)."""

    scale: np.ndarray   # broadcastable against the accumulator (per channel: (C, 1, 1))


class QDQ:
    def __init__(self, exporter):
        self.ex = exporter
        self.info: dict[int, Q8 | Acc] = {}

    def handles(self, node: Call) -> bool:
        """An op on exported integer values (a tuple's fields too: concatenate's)."""
        values = [f for a in node.args for f in (a.fields if isinstance(a, Tuple) else (a,))]
        return QUANT in node.op.props or any(
            is_int(getattr(self.ex.type(a), "dtype", "float32")) and id(a) in self.info
            for a in values)

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
        return Q8(self.ex.const(s, "scale"), self.ex.const(zp, "zero_point"), int(z), float(s))

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
            if not isinstance(b, (Constant, Scalar)) or b.data is None:
                raise EqquantError("ONNX export: the bias must be an int32 constant", node.loc)
            # (a scalar, such as the zero bias of a convolution that had none: one per
            # output channel)
            flat = np.broadcast_to(np.asarray(b.data).reshape(-1),
                                   (w_t.shape[0],) if isinstance(b, Scalar) else
                                   (np.asarray(b.data).size,)).astype(np.int32)
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

    # -- results ---------------------------------------------------------------------------------

    def keep(self, node: Call, q: Q8, name: str) -> str:
        """``node``'s ONNX value ``name`` is 8-bit with the parameters ``q``."""
        self.info[id(node)] = q
        return name

    def accumulate(self, node: Call, scale: np.ndarray, name: str) -> str:
        """``node``'s ONNX value ``name`` is an int32 accumulator's real value (acc * scale)."""
        self.info[id(node)] = Acc(np.asarray(scale, np.float32))
        return name

    def accumulator_scale(self, arg) -> np.ndarray | None:
        """The scale of ``arg`` if it is an exported int32 accumulator, else None."""
        info = self.info.get(id(arg))
        return info.scale if isinstance(info, Acc) else None

    def params(self, arg) -> Q8 | None:
        """The 8-bit parameters of ``arg`` if it is an exported 8-bit value, else None."""
        info = self.info.get(id(arg))
        return info if isinstance(info, Q8) else None

    def unsupported(self, node: Call) -> EqquantError:
        why = ("a dynamic program's parameters are computed at run time; the QDQ export "
               "takes programs quantized with a calibration mode" if node.op.name.startswith(
                   "qnn.dynamic_") else
               "export the program eqquant quantize wrote, not its realize view")
        return EqquantError(f"ONNX export: {node.op.name} on {self.ex.type(node.args[0])} has "
                            f"no QDQ form ({why})", node.loc)

    # -- ops -------------------------------------------------------------------------------------

    def call(self, node: Call) -> str:
        """An op on 8-bit values or int32 accumulators: its registry entry's QDQ form
        (``OnnxForm.qdq``) where it has one; else by its properties, on an 8-bit value: an
        annotation passes it through, a layout op moves its bytes, a pool (which commutes
        with dequantization) runs on its real value and is quantized with its parameters."""
        self.ex.quantized = True
        form = node.op.onnx[0] if node.op.onnx else None
        if form is not None and form.qdq is not None:
            return form.qdq(self, node)
        props = node.op.props
        q = self.params(node.args[0])
        if q is not None:
            x = self.ex.name_of(node.args[0])
            if IDENTITY in props or (ANNOTATION in props and QUANT not in props):
                return self.keep(node, q, x)
            if LAYOUT in props:          # moves bytes: runs on the 8-bit tensor itself
                return self.keep(node, q, self.ex.call_on(node, x))
            if POOL in props and form is not None:
                real = form.write(self.ex, node, [self.dq(node.args[0])])
                return self.keep(node, q, self.quantize(real, q))
        raise self.unsupported(node)
