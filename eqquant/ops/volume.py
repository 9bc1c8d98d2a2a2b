"""Ops over three spatial axes (video and volumetric images): nn.conv3d, nn.max_pool3d and
nn.avg_pool3d, NCDHW data and OIDHW weights, as TVM Relay writes them. Their reference
semantics are the windowed numerics of any rank (``numerics.conv``, ``max_pool``,
``avg_pool``); 1-d convolutions and pools need no op of their own: ONNX's are read as 2-d
ones a row high (``onnx_conventions.one_d_as_rows``)."""
from __future__ import annotations

import numpy as np

from ..core.types import TensorType
from . import numerics
from .attrs import BOOL, DTYPE, INT, OPT_INT, PADDING3D, TRIPLE, Attr, OptionalKind, StrKind
from .nn import check_groups, conv_from_onnx
from .onnx_conventions import conv_to_onnx, window_to_onnx
from .registry import COMPUTE, POOL, SELECTS, OnnxForm, OpDef, OpTypeError, register
from .typerel import compute_dtypes, tensor

NCDHW = StrKind("layout", choices=("NCDHW",))


def _sizes(name: str, values, least: int) -> list[int]:
    if min(values) < least:
        raise OpTypeError(f"{name} {list(values)} must be >= {least}")
    return list(values)


def _out_sizes(x_shape, kernel, attrs, ceil_mode=False) -> tuple[int, ...]:
    """The output's (D, H, W) for a window of ``kernel`` swept over (D, H, W) of ``x``."""
    strides = _sizes("strides", attrs["strides"], 1)
    dilation = _sizes("dilation", attrs["dilation"], 1)
    pad = attrs["padding"]
    out = tuple(numerics.out_size(n, k, s, d, pad[i], pad[i + 3], ceil_mode)
                for i, (n, k, s, d) in enumerate(zip(x_shape, kernel, strides, dilation)))
    if min(out) < 1:
        raise OpTypeError(f"the {'x'.join(map(str, kernel))} window does not fit the "
                          f"{'x'.join(map(str, x_shape))} input", arg=0)
    return out


def _conv3d_rel(types, attrs):
    x = tensor(types, 0, "data", rank=5)
    w = tensor(types, 1, "weight", rank=5)
    n, c = x.shape[:2]
    o, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    check_groups(c, o, cg, w, attrs)
    if attrs["kernel_size"] is not None and tuple(attrs["kernel_size"]) != kernel:
        raise OpTypeError(f"kernel_size={attrs['kernel_size']} but the weight's window is "
                          f"{list(kernel)}", 1)
    return TensorType((n, o) + _out_sizes(x.shape[2:], kernel, attrs),
                      compute_dtypes(types, attrs, x, w))


register(OpDef(
    "nn.conv3d", inputs=("data", "weight"), props=frozenset({COMPUTE}),
    attrs=(Attr("strides", TRIPLE, [1, 1, 1]), Attr("padding", PADDING3D, [0] * 6),
           Attr("dilation", TRIPLE, [1, 1, 1]), Attr("groups", INT, 1),
           Attr("channels", OPT_INT, None),
           Attr("kernel_size", OptionalKind("triple?", TRIPLE), None),
           Attr("data_layout", NCDHW, "NCDHW"),
           Attr("kernel_layout", StrKind("layout", choices=("OIDHW",)), "OIDHW"),
           Attr("out_dtype", DTYPE, "")),
    # ONNX's Conv reads as nn.conv2d's form, which takes 5-d inputs to this op
    onnx=(OnnxForm("Conv", reads=False, convert=lambda im, attrs, ins: conv_from_onnx(
              im, attrs, ins, "nn.conv3d"),
          export=lambda ex, node, ins: ex.emit("Conv", ins, **conv_to_onnx(
              node.attrs, ex.type(node.args[1]).shape))),),
    type_rel=_conv3d_rel, semantics=numerics.conv,
    flops=lambda ins, out, a: 2.0 * out.size * ins[1].size // out.shape[1],
    doc="3-D convolution: NCDHW data and OIDHW weight (video and volumetric images); "
        "padding is [front, top, left, back, bottom, right]"))


_POOL3D_ATTRS = (Attr("pool_size", TRIPLE, [1, 1, 1]), Attr("strides", TRIPLE, [1, 1, 1]),
                 Attr("dilation", TRIPLE, [1, 1, 1]), Attr("padding", PADDING3D, [0] * 6),
                 Attr("layout", NCDHW, "NCDHW"), Attr("ceil_mode", BOOL, False))


def _pool3d_rel(types, attrs):
    x = tensor(types, 0, "data", rank=5)
    kernel = _sizes("pool_size", attrs["pool_size"], 1)
    dilation = attrs["dilation"]
    pad = attrs["padding"]
    out = _out_sizes(x.shape[2:], kernel, attrs, attrs["ceil_mode"])
    for i, (n, k, s, d) in enumerate(zip(x.shape[2:], kernel, attrs["strides"], dilation)):
        o = numerics.padding_only_window(n, k, s, d, pad[i], pad[i + 3], attrs["ceil_mode"])
        if o is not None:
            raise OpTypeError(f"the window at output {o} of spatial axis {i} reads only "
                              f"padding (its dilated taps miss the input)", 0)
    return TensorType(x.shape[:2] + out, x.dtype)


def _pool_flops(ins, out, attrs) -> float:
    return float(out.size * int(np.prod(attrs["pool_size"])))


register(OpDef("nn.max_pool3d", inputs=("data",), props=frozenset({POOL, SELECTS}),
               attrs=_POOL3D_ATTRS,
               onnx=(OnnxForm("MaxPool", reads=False, export=lambda ex, node, ins: ex.emit(
                   "MaxPool", ins[:1], dilations=list(node.attrs["dilation"]),
                   **window_to_onnx(node.attrs))),),
               type_rel=_pool3d_rel, semantics=numerics.max_pool, flops=_pool_flops,
               doc="maximum over each 3-D window (padding never wins)"))
register(OpDef("nn.avg_pool3d", inputs=("data",), props=frozenset({POOL}),
               attrs=_POOL3D_ATTRS + (Attr("count_include_pad", BOOL, False),),
               onnx=(OnnxForm("AveragePool", reads=False, export=lambda ex, node, ins: ex.emit(
                   "AveragePool", ins[:1], **window_to_onnx(node.attrs),
                   count_include_pad=int(node.attrs["count_include_pad"]))),),
               type_rel=_pool3d_rel, semantics=numerics.avg_pool, flops=_pool_flops,
               doc="mean over each 3-D window"))
