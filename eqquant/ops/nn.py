"""Neural-network ops: convolution, batch norm, pools, dense, bias_add, pad."""
from __future__ import annotations

import functools

import numpy as np

from ..core.types import Dim, TensorType, default_compute_dtype
from ..errors import EqquantError
from . import numerics
from .attrs import (BOOL, DTYPE, FLOAT, INT, OPT_INT, OPT_PAIR, PAD_WIDTH, PADDING2D, PAIR, Attr,
                    StrKind)
from .onnx_conventions import (OnnxFormError, conv_to_onnx, one_d_as_rows, pads, rank4,
                               spatial_axes, text, window, window_to_onnx)
from .registry import (COMPUTE, KERNEL, POOL, SELECTS, OnnxForm, OpDef, OpTypeError, RelaxForm,
                       register)
from .typerel import broadcast_shapes, compute_dtypes, float_input, norm_axis, tensor, tuple_of

DATA_LAYOUT = StrKind("layout", choices=("NCHW", "NHWC"))
KERNEL_LAYOUT = StrKind("layout", choices=("OIHW", "HWIO"))
OUT_LAYOUT = StrKind("layout", choices=("", "NCHW", "NHWC"))


def data_layout(attrs, key: str = "layout") -> str:
    """The data layout of a call site, checked: out_layout, where given, is the same."""
    layout = attrs[key]
    if attrs.get("out_layout", "") not in ("", layout):
        raise OpTypeError(f"out_layout={attrs['out_layout']} differs from {key}={layout} "
                          f"(layout changes are not part of this op)")
    return layout


def channel_axis(attrs, key: str = "layout") -> int:
    return 1 if attrs[key] == "NCHW" else 3


def check_groups(c: int, o: int, cg: int, w, attrs) -> None:
    """A convolution's channels: ``groups`` divides the ``c`` input and ``o`` output
    channels, the weight ``w`` takes ``cg`` input channels a group, ``channels`` (if given)
    is ``o``."""
    g = attrs["groups"]
    if g < 1 or c % g or o % g:
        raise OpTypeError(f"groups={g} must divide the {c} input and {o} output channels", 1)
    if cg * g != c:
        raise OpTypeError(f"weight {w} expects {cg * g} input channels (groups={g}), "
                          f"data has {c}", arg=1)
    if attrs["channels"] is not None and attrs["channels"] != o:
        raise OpTypeError(f"channels={attrs['channels']} but the weight has {o} outputs", 1)


def conv2d_rel(types, attrs):
    x = tensor(types, 0, "data", rank=4)
    w = tensor(types, 1, "weight", rank=4)
    layout, klayout = data_layout(attrs, "data_layout"), attrs["kernel_layout"]
    if numerics.KERNEL_LAYOUT_OF[layout] != klayout:
        raise OpTypeError(f"data_layout={layout} takes kernel_layout="
                          f"{numerics.KERNEL_LAYOUT_OF[layout]}, not {klayout}")
    n, c, h, wd = numerics.to_nchw(x.shape, layout)
    o, cg, kh, kw = numerics.to_oihw(w.shape, klayout)
    check_groups(c, o, cg, w, attrs)
    if attrs["kernel_size"] is not None and list(attrs["kernel_size"]) != [kh, kw]:
        raise OpTypeError(f"kernel_size={attrs['kernel_size']} but the weight is {kh}x{kw}", 1)
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    if min(sh, sw, dh, dw) < 1:
        raise OpTypeError("strides and dilation must be >= 1")
    pt, pl, pb, pr = attrs["padding"]
    oh = numerics.out_size(h, kh, sh, dh, pt, pb)
    ow = numerics.out_size(wd, kw, sw, dw, pl, pr)
    if oh < 1 or ow < 1:
        raise OpTypeError(f"the {kh}x{kw} kernel does not fit the {h}x{wd} input", arg=1)
    return TensorType(numerics.from_nchw((n, o, oh, ow), layout),
                      compute_dtypes(types, attrs, x, w))


CONV2D_ATTRS = (Attr("strides", PAIR, [1, 1]), Attr("padding", PADDING2D, [0, 0, 0, 0]),
                Attr("dilation", PAIR, [1, 1]), Attr("groups", INT, 1),
                Attr("channels", OPT_INT, None), Attr("kernel_size", OPT_PAIR, None),
                Attr("data_layout", DATA_LAYOUT, "NCHW"),
                Attr("kernel_layout", KERNEL_LAYOUT, "OIHW"),
                Attr("out_layout", OUT_LAYOUT, ""), Attr("out_dtype", DTYPE, ""))

# The kernels a float convolution or dense layer may run on (``kernel="x86.avx512"``): the FMA
# GEMMs, 512- and 256-bit, with the window gather and the epilogue fused; im2col and numpy's BLAS; the
# direct kernel of grouped and depthwise convolutions. As for the int8 ones
# (``qnn.INT8_KERNELS``), which apply, what each costs and which a CPU runs is the
# lowering's (``runtime/lowering/plan.py``); "" leaves the choice to the target's plan. The
# FMA GEMMs sum in another order than BLAS: the kernels agree to float32 rounding.
FP32_KERNELS = ("x86.avx512", "x86.fma", "blas", "direct")
FP32_KERNEL_ATTR = Attr(KERNEL, StrKind("kernel", ("",) + FP32_KERNELS), "")
# float products of two computed operands (attention's, in float): the FMA GEMMs on b packed
# at run time, or the portable rows (``runtime/lowering/plan.py``)
FLOAT_PAIR_KERNELS = ("x86.avx512", "x86.fma", "portable")


def conv2d_flops(ins, out, attrs) -> float:
    """Two per multiply-add: each output element reads one weight row (weight / O)."""
    return 2.0 * out.size * ins[1].size // out.shape[channel_axis(attrs, "data_layout")]


def conv_from_onnx(im, attrs, ins, op: str = "nn.conv2d"):
    """Conv (NCHW, or NCDHW for ``nn.conv3d``) is the convolution op, then nn.bias_add where
    it has a bias."""
    x, w = im.value(ins[0]), im.value(ins[1])
    xt, wt = im.type(x), im.type(w)
    if wt.rank != xt.rank:
        raise OnnxFormError(f"the weight has rank {wt.rank}, the input {xt.rank}")
    n = xt.rank - 2
    kernel = list(attrs.get("kernel_shape", wt.shape[2:]))
    if tuple(kernel) != tuple(wt.shape[2:]):
        raise OnnxFormError(f"kernel_shape {kernel} disagrees with the weight's shape "
                            f"{list(wt.shape)}")
    strides = list(attrs.get("strides", [1] * n))
    dil = list(attrs.get("dilations", [1] * n))
    y = im.call(op, x, w, strides=strides, dilation=dil, groups=attrs.get("group", 1),
                padding=pads(attrs, xt.shape[2:], kernel, strides, dil))
    if len(ins) > 2 and ins[2]:
        y = im.call("nn.bias_add", y, im.value(ins[2]), axis=1)
    return y


@functools.partial(one_d_as_rows, lifted=2)
def _conv_from_onnx(im, attrs, ins):
    """Conv over 1 (as 2-d, a row high), 2 or 3 spatial axes."""
    dims = spatial_axes(im, im.value(ins[0]), "convolutions", (2, 3))
    return conv_from_onnx(im, attrs, ins, "nn.conv2d" if dims == 2 else "nn.conv3d")


def _conv_to_onnx(ex, node, ins):
    return ex.emit("Conv", ins, **conv_to_onnx(node.attrs, ex.type(node.args[1]).shape))


def conv_channels_last(attrs, in_types) -> bool:
    """The float convolution kernels read and write channel-last images: the FMA GEMMs, on
    every CPU with AVX2 (groups 1, and grouped ones in sets of groups whose outputs fill
    whole vectors), and the direct depthwise kernel. (The direct kernel at another grouped
    convolution runs NCHW: the runtime says where a site takes it, as for the integer
    convolutions.)"""
    return True


register(OpDef(
    "nn.conv2d", inputs=("data", "weight"), props=frozenset({COMPUTE}),
    kernel="Conv2D", attrs=CONV2D_ATTRS + (FP32_KERNEL_ATTR,),
    channels_last=conv_channels_last,
    onnx=(OnnxForm("Conv", convert=_conv_from_onnx, export=_conv_to_onnx),),
    type_rel=conv2d_rel, semantics=numerics.conv2d, flops=conv2d_flops,
    doc="2-D convolution: NCHW data and OIHW weight, or NHWC data and HWIO weight; "
        "groups=C is depthwise"))


# ---- conv2d_transpose (ONNX ConvTranspose) -----------------------------------------------------

def conv2d_transpose_rel(types, attrs):
    x = tensor(types, 0, "data", rank=4)
    w = tensor(types, 1, "weight", rank=4)
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape          # IOHW: (input channels, outputs per group, kh, kw)
    g = attrs["groups"]
    if g < 1 or c % g or ci != c:
        raise OpTypeError(f"the weight {w} needs {ci} input channels divisible by groups={g}; "
                          f"data has {c}", arg=1)
    (sh, sw), (dh, dw) = attrs["strides"], attrs["dilation"]
    (oph, opw), (pt, pl, pb, pr) = attrs["output_padding"], attrs["padding"]
    if min(sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr, oph, opw) < 0:
        raise OpTypeError("strides and dilation must be >= 1, padding >= 0")
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise OpTypeError(f"output_padding {[oph, opw]} must be smaller than the stride or "
                          f"the dilation")
    oh = (h - 1) * sh - pt - pb + dh * (kh - 1) + oph + 1
    ow = (wd - 1) * sw - pl - pr + dw * (kw - 1) + opw + 1
    if oh < 1 or ow < 1:
        raise OpTypeError(f"padding {attrs['padding']} leaves no output", arg=0)
    return TensorType((n, og * g, oh, ow), compute_dtypes(types, attrs, x, w))


@functools.partial(one_d_as_rows, lifted=2)
def _conv_transpose_from_onnx(im, attrs, ins):
    """ConvTranspose (2-d, NCHW, IOHW weight; 1-d as 2-d a row high), then nn.bias_add where it has a bias. Padding
    is given (pads) or none (VALID); output_shape and SAME padding are not read."""
    x, w = im.value(ins[0]), im.value(ins[1])
    rank4(im, x, "transposed convolutions")
    wt = im.type(w)
    if wt.rank != 4:
        raise OnnxFormError(f"the weight has rank {wt.rank}; only 2-d transposed "
                            "convolutions are supported")
    if "output_shape" in attrs:
        raise OnnxFormError("ConvTranspose with output_shape is not supported: give pads and "
                            "output_padding")
    auto = text(attrs.get("auto_pad", "NOTSET"))
    if auto not in ("NOTSET", "", "VALID"):
        raise OnnxFormError(f"ConvTranspose auto_pad={auto} is not supported: give pads")
    if list(attrs.get("kernel_shape", wt.shape[2:])) != list(wt.shape[2:]):
        raise OnnxFormError(f"kernel_shape {list(attrs['kernel_shape'])} disagrees with the "
                            f"weight's shape {list(wt.shape)}")
    padding = list(attrs.get("pads", [0, 0, 0, 0])) if auto != "VALID" else [0, 0, 0, 0]
    y = im.call("nn.conv2d_transpose", x, w, strides=list(attrs.get("strides", [1, 1])),
                padding=padding, dilation=list(attrs.get("dilations", [1, 1])),
                groups=attrs.get("group", 1),
                output_padding=list(attrs.get("output_padding", [0, 0])))
    if len(ins) > 2 and ins[2]:
        y = im.call("nn.bias_add", y, im.value(ins[2]), axis=1)
    return y


def _conv_transpose_to_onnx(ex, node, ins):
    a = node.attrs
    return ex.emit("ConvTranspose", ins, strides=list(a["strides"]), pads=list(a["padding"]),
                   dilations=list(a["dilation"]), group=a["groups"],
                   output_padding=list(a["output_padding"]),
                   kernel_shape=list(ex.type(node.args[1]).shape[2:]))


register(OpDef(
    "nn.conv2d_transpose", inputs=("data", "weight"), props=frozenset({COMPUTE}),
    attrs=(Attr("strides", PAIR, [1, 1]), Attr("padding", PADDING2D, [0, 0, 0, 0]),
           Attr("dilation", PAIR, [1, 1]), Attr("groups", INT, 1),
           Attr("output_padding", PAIR, [0, 0]), Attr("channels", OPT_INT, None),
           Attr("kernel_size", OPT_PAIR, None),
           Attr("data_layout", StrKind("layout", choices=("NCHW",)), "NCHW"),
           Attr("kernel_layout", StrKind("layout", choices=("IOHW",)), "IOHW"),
           Attr("out_dtype", DTYPE, "")),
    onnx=(OnnxForm("ConvTranspose", convert=_conv_transpose_from_onnx,
                   export=_conv_transpose_to_onnx),),
    type_rel=conv2d_transpose_rel, semantics=numerics.conv2d_transpose,
    flops=lambda ins, out, a: 2.0 * ins[0].size * ins[1].size // ins[1].shape[0],
    doc="transposed 2-D convolution (the gradient of conv2d; ONNX ConvTranspose): NCHW data, "
        "IOHW weight, output_padding extends the bottom and right edges"))


def _batch_norm_rel(types, attrs):
    x = tensor(types, 0, "data")
    if not x.dtype.startswith("float"):
        raise OpTypeError(f"argument 1 ('data') must be a float tensor, got {x.dtype}", 0)
    axis = norm_axis(attrs["axis"], x.rank)
    c = x.shape[axis]
    for i, name in enumerate(("gamma", "beta", "moving_mean", "moving_var"), start=1):
        t = tensor(types, i, name)
        if t.shape != (c,) or t.dtype != x.dtype:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be Tensor[({c}), {x.dtype}] "
                              f"for axis {attrs['axis']}, got {t}", arg=i)
    vec = TensorType((c,), x.dtype)
    return tuple_of(x, vec, vec)


def _batch_norm(x, gamma, beta, mean, var, *, axis, epsilon, center, scale):
    shape = [1] * x.ndim
    shape[axis] = -1
    acc = x.astype(np.float64)
    k = 1 / np.sqrt(var.astype(np.float64) + epsilon)
    if scale:
        k = k * gamma
    out = (acc - mean.reshape(shape)) * k.reshape(shape)
    if center:
        out = out + beta.reshape(shape)
    return out.astype(x.dtype), mean, var


def _batch_norm_from_onnx(im, attrs, ins):
    """BatchNormalization in inference mode. Before opset 9 ``spatial=0`` gave one statistic
    per element of an image (the parameters shaped as x without its batch axis): that form is
    an affine map per element, x * k + (B - mean * k) with k = scale / sqrt(var + epsilon),
    its constants computed here in float64."""
    for key, training in (("training_mode", 1), ("is_test", 0)):
        if key in attrs and attrs[key] == training:
            raise OnnxFormError(f"{key}={training} (training) is not supported: export the "
                                "model in eval mode")
    if attrs.get("spatial", 1) == 0:
        gamma, beta, mean, var = (np.asarray(im.const(n, f"BatchNormalization's {what}"),
                                             np.float64)
                                  for n, what in zip(ins[1:5], ("scale", "B", "mean", "var")))
        k = gamma / np.sqrt(var + float(attrs.get("epsilon", 1e-5)))
        x = im.value(ins[0])
        dtype = im.type(x).dtype
        scaled = im.call("multiply", x, im.b.param(im.fresh_name(ins[1] + "_k") or "bn_k",
                                                   k.astype(dtype)))
        shift = (beta - mean * k).astype(dtype)
        return im.call("add", scaled, im.b.param(im.fresh_name(ins[2] + "_shift") or
                                                 "bn_shift", shift))
    bn = im.call("nn.batch_norm", *[im.value(n) for n in ins[:5]], axis=1,
                 epsilon=float(attrs.get("epsilon", 1e-5)))
    return im.b.get(bn, 0)


def _batch_norm_from_relax(rx, args, kwargs):
    """Relax's batch norm also says whether it trains (then it would use the batch's own
    statistics) and its momentum (which only training uses)."""
    kwargs.pop("momentum", None)
    if kwargs.pop("training", False):
        raise EqquantError("R.nn.batch_norm(training=True) normalizes by the batch's own "
                           "statistics; eqquant runs inference (training=False)")
    return rx.call("nn.batch_norm", *[rx.value(a, "a batch norm operand") for a in args],
                   **kwargs)


register(OpDef(
    "nn.batch_norm", inputs=("data", "gamma", "beta", "moving_mean", "moving_var"),
    subtracts=("moving_mean",),
    relax=RelaxForm(read=_batch_norm_from_relax),
    onnx=(OnnxForm("BatchNormalization", convert=_batch_norm_from_onnx,
                   export=lambda ex, node, ins: ex.emit("BatchNormalization", ins, epsilon=float(
                       node.attrs["epsilon"]))),),
    attrs=(Attr("axis", INT, 1), Attr("epsilon", FLOAT, 1e-5), Attr("center", BOOL, True),
           Attr("scale", BOOL, True)),
    type_rel=_batch_norm_rel, semantics=_batch_norm,
    flops=lambda ins, out, a: 4.0 * ins[0].size,
    doc="inference batch norm; returns (out, moving_mean, moving_var), use .0"))

_POOL_ATTRS = (Attr("pool_size", PAIR, [1, 1]), Attr("strides", PAIR, [1, 1]),
               Attr("dilation", PAIR, [1, 1]), Attr("padding", PADDING2D, [0, 0, 0, 0]),
               Attr("layout", DATA_LAYOUT, "NCHW"), Attr("out_layout", OUT_LAYOUT, ""),
               Attr("ceil_mode", BOOL, False))


def _pool_rel(types, attrs):
    x = tensor(types, 0, "data", rank=4)
    layout = data_layout(attrs)
    n, c, h, w = numerics.to_nchw(x.shape, layout)
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    if min(kh, kw, sh, sw, dh, dw) < 1:
        raise OpTypeError("pool_size, strides and dilation must be >= 1")
    pt, pl, pb, pr = attrs["padding"]
    oh = numerics.out_size(h, kh, sh, dh, pt, pb, attrs["ceil_mode"])
    ow = numerics.out_size(w, kw, sw, dw, pl, pr, attrs["ceil_mode"])
    if oh < 1 or ow < 1:
        raise OpTypeError(f"the {kh}x{kw} window does not fit the {h}x{w} input", arg=0)
    for axis, args in (("row", (h, kh, sh, dh, pt, pb)), ("column", (w, kw, sw, dw, pl, pr))):
        o = numerics.padding_only_window(*args, attrs["ceil_mode"])
        if o is not None:
            raise OpTypeError(f"the window at output {axis} {o} reads only padding (its "
                              f"dilated taps miss the input)", 0)
    return TensorType(numerics.from_nchw((n, c, oh, ow), layout), x.dtype)


@one_d_as_rows
def _max_pool_from_onnx(im, attrs, ins):
    """MaxPool over 1 (as 2-d, a row high), 2 or 3 spatial axes; its indices are not
    produced."""
    if attrs.get("storage_order", 0):
        raise OnnxFormError("storage_order=1 (column major indices) is not supported")
    x = im.value(ins[0])
    w = window(im, attrs, x, (2, 3))
    return [im.call("nn.max_pool2d" if len(w["pool_size"]) == 2 else "nn.max_pool3d", x, **w),
            None]   # no indices


@one_d_as_rows
def _avg_pool_from_onnx(im, attrs, ins):
    """AveragePool over 1 (as 2-d, a row high), 2 or 3 spatial axes."""
    x = im.value(ins[0])
    w = window(im, attrs, x, (2, 3))
    return im.call("nn.avg_pool2d" if len(w["pool_size"]) == 2 else "nn.avg_pool3d", x, **w,
                   count_include_pad=bool(attrs.get("count_include_pad", 0)))


def _max_pool_channels_last(attrs, in_types) -> bool:
    """The channel-last max-pool kernel (every loop along the contiguous channels) is the
    fast one; the NCHW one sweeps each channel's plane, several times slower."""
    return True


register(OpDef("nn.max_pool2d", inputs=("data",), props=frozenset({POOL, SELECTS}),
               channels_last=_max_pool_channels_last,
               relax=RelaxForm(ignore=("count_include_pad",)),  # padding never wins
               kernel="MaxPool2D", attrs=_POOL_ATTRS,
               onnx=(OnnxForm("MaxPool", convert=_max_pool_from_onnx, export=lambda ex, node, ins:
                              ex.emit("MaxPool", ins[:1], dilations=list(node.attrs["dilation"]),
                                      **window_to_onnx(node.attrs))),),
               type_rel=_pool_rel, semantics=numerics.max_pool2d,
               flops=lambda ins, out, a: float(out.size * a["pool_size"][0] * a["pool_size"][1]),
               doc="maximum over each window (padding never wins)"))
register(OpDef("nn.avg_pool2d", inputs=("data",), props=frozenset({POOL}),
               kernel="AvgPool2D",
               attrs=_POOL_ATTRS + (Attr("count_include_pad", BOOL, False),),
               onnx=(OnnxForm("AveragePool", convert=_avg_pool_from_onnx,
                              export=lambda ex, node, ins: ex.emit(
                                  "AveragePool", ins[:1], **window_to_onnx(node.attrs),
                                  count_include_pad=int(node.attrs["count_include_pad"]))),),
               type_rel=_pool_rel, semantics=numerics.avg_pool2d,
               flops=lambda ins, out, a: float(out.size * a["pool_size"][0] * a["pool_size"][1]),
               doc="mean over each window"))


def _global_pool_rel(types, attrs):
    x = tensor(types, 0, "data", rank=4)
    layout = data_layout(attrs)
    n, c, h, w = numerics.to_nchw(x.shape, layout)
    if h * w == 0:              # (a mean of nothing: no value, on any engine)
        raise OpTypeError(f"averages an empty image ({h} x {w} pixels)", 0)
    return TensorType(numerics.from_nchw((n, c, 1, 1), layout), x.dtype)


def _global_avg_pool(x, *, layout, out_layout):
    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    acc = x.astype(numerics.acc_dtype(x.dtype)).mean(axis=spatial, keepdims=True)
    return (acc if x.dtype.kind == "f" else np.trunc(acc)).astype(x.dtype)


def _global_avg_from_onnx(im, attrs, ins):
    x = im.value(ins[0])
    rank4(im, x, "pooling")
    return im.call("nn.global_avg_pool2d", x)


register(OpDef("nn.global_avg_pool2d", inputs=("data",), props=frozenset({POOL}),
               onnx=(OnnxForm("GlobalAveragePool", convert=_global_avg_from_onnx),),
               kernel="GlobalAvgPool2D",
               attrs=(Attr("layout", DATA_LAYOUT, "NCHW"), Attr("out_layout", OUT_LAYOUT, "")),
               type_rel=_global_pool_rel, semantics=_global_avg_pool,
               flops=lambda ins, out, a: float(ins[0].size),
               doc="mean over H and W: (N, C, H, W) -> (N, C, 1, 1)"))


def dense_rel(types, attrs):
    x = tensor(types, 0, "data")
    w = tensor(types, 1, "weight", rank=2)
    if x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise OpTypeError(f"data {x} and weight {w} disagree on the reduced dimension", 1)
    if attrs["units"] is not None and attrs["units"] != w.shape[0]:
        raise OpTypeError(f"units={attrs['units']} but the weight has {w.shape[0]} rows", 1)
    return TensorType(x.shape[:-1] + (w.shape[0],), compute_dtypes(types, attrs, x, w))


def dense(x, w, *, units, out_dtype, **_ignored):
    acc = numerics.acc_dtype(np.result_type(x.dtype, w.dtype))
    return np.matmul(x.astype(acc), w.astype(acc).T).astype(
        out_dtype or default_compute_dtype(str(x.dtype), str(w.dtype)))


def _t2(im, x):
    return im.call("transpose", x, axes=[1, 0])


def _gemm_from_onnx(im, attrs, ins):
    """Gemm: alpha * A' @ B' + beta * C, as nn.dense (B' transposed to (units, K)), times
    alpha, plus beta * C."""
    a, b = im.value(ins[0]), im.value(ins[1])
    for e, what in ((a, "A"), (b, "B")):
        if im.type(e).rank != 2:
            raise OnnxFormError(f"{what} has rank {im.type(e).rank}; Gemm takes matrices")
    if attrs.get("transA", 0):
        a = _t2(im, a)
    y = im.call("nn.dense", a, b if attrs.get("transB", 0) else _t2(im, b))
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = im.call("multiply", y, im.scalar(alpha, y))
    if len(ins) > 2 and ins[2] and beta != 0.0:
        c = im.value(ins[2])
        if beta != 1.0:
            c = im.call("multiply", c, im.scalar(beta, c))
        y = im.call("add", y, c)
    return y


def _matmul_from_onnx(im, attrs, ins):
    """MatMul (..., K) x (K, N): nn.dense on the rows, reshaped back; (..., M, K) x (..., K,
    N): nn.batch_matmul."""
    a, b = im.value(ins[0]), im.value(ins[1])
    at, bt = im.type(a), im.type(b)
    if at.rank < 2 or bt.rank < 2:
        raise OnnxFormError(f"MatMul of ranks {at.rank} and {bt.rank}: vectors (rank 1) are "
                            "not supported")
    if bt.rank > 2:             # two stacks of matrices (attention): batched, broadcast
        return im.call("nn.batch_matmul", a, b, transpose_b=False)
    if at.rank == 2:
        return im.call("nn.dense", a, _t2(im, b))
    flat = im.call("reshape", a, newshape=[-1, at.shape[-1]])
    y = im.call("nn.dense", flat, _t2(im, b))
    if any(isinstance(d, Dim) for d in at.shape):     # (sizes known only at run time)
        return im.call("reshape_like", y, a, lhs_begin=0, lhs_end=1, rhs_begin=0, rhs_end=-1)
    return im.call("reshape", y, newshape=list(at.shape[:-1]) + [bt.shape[1]])


register(OpDef("nn.dense", inputs=("data", "weight"), props=frozenset({COMPUTE}),
               onnx=(OnnxForm("Gemm", convert=_gemm_from_onnx, export=lambda ex, node, ins:
                              ex.emit("Gemm", ins[:2], transB=1)),
                     OnnxForm("MatMul", convert=_matmul_from_onnx)),
               kernel="Dense",
               attrs=(Attr("units", OPT_INT, None), Attr("out_dtype", DTYPE, ""),
                      FP32_KERNEL_ATTR),
               type_rel=dense_rel, semantics=dense, doc="x @ weight.T, weight is (units, K)",
               flops=lambda ins, out, a: 2.0 * out.size * ins[1].shape[1]))


def _bias_add_rel(types, attrs):
    x = tensor(types, 0, "data")
    b = tensor(types, 1, "bias", rank=1)
    axis = norm_axis(attrs["axis"], x.rank)
    if b.shape[0] != x.shape[axis] or b.dtype != x.dtype:
        raise OpTypeError(f"bias must be Tensor[({x.shape[axis]}), {x.dtype}], got {b}", 1)
    return x


def _bias_add(x, b, *, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x + b.reshape(shape)).astype(x.dtype)


def _bias_add_to_onnx(ex, node, ins):
    rank = ex.type(node.args[0]).rank
    shape = [1] * rank
    shape[node.attrs["axis"] % rank] = -1
    return ex.emit("Add", [ins[0], ex.reshape(ins[1], shape)])


register(OpDef("nn.bias_add", inputs=("data", "bias"), attrs=(Attr("axis", INT, 1),),
               onnx=(OnnxForm("Add", reads=False, export=_bias_add_to_onnx),),
               type_rel=_bias_add_rel, semantics=_bias_add, doc="add a vector along axis"))


def _pad_rel(types, attrs):
    x = tensor(types, 0, "data")
    v = tensor(types, 1, "pad_value", rank=0)
    if v.dtype != x.dtype:
        raise OpTypeError(f"pad_value is {v.dtype} but data is {x.dtype}", arg=1)
    pw = attrs["pad_width"]
    if len(pw) != x.rank or any(p < 0 for pair in pw for p in pair):
        raise OpTypeError(f"pad_width needs {x.rank} non-negative [before, after] pairs")
    return TensorType(tuple(d + a + b for d, (a, b) in zip(x.shape, pw)), x.dtype)


def _pad(x, value, *, pad_width, pad_mode):
    if pad_mode == "constant":
        return np.pad(x, pad_width, constant_values=value)
    return np.pad(x, pad_width, mode=pad_mode)


def _pad_from_onnx(im, attrs, ins):
    x = im.value(ins[0])
    rank = im.type(x).rank
    mode = text(attrs.get("mode", "constant"))
    if mode not in ("constant", "edge", "reflect"):
        raise OnnxFormError(f"mode '{mode}' is not one of constant, edge, reflect")
    if im.opset >= 11:
        given = im.const_ints(ins[1], "Pad's pads")
        value = im.const_scalar(ins[2], "Pad's constant_value") if len(ins) > 2 and ins[2] \
            else 0.0
        axes = [a % rank for a in im.const_ints(ins[3], "Pad's axes")] \
            if len(ins) > 3 and ins[3] else list(range(rank))
    else:
        given, value, axes = list(attrs["pads"]), float(attrs.get("value", 0.0)), \
            list(range(rank))
    if len(given) != 2 * len(axes):
        raise OnnxFormError(f"pads has {len(given)} values for {len(axes)} axes")
    width = [[0, 0] for _ in range(rank)]
    for i, a in enumerate(axes):
        width[a] = [given[i], given[i + len(axes)]]
    if any(p < 0 for pair in width for p in pair):
        raise OnnxFormError(f"negative pads (cropping) are not supported: {given}")
    return im.call("nn.pad", x, im.scalar(value, x), pad_width=width, pad_mode=mode)


def _pad_to_onnx(ex, node, ins):
    width = [list(p) for p in node.attrs["pad_width"]]
    begin_end = [p[0] for p in width] + [p[1] for p in width]
    return ex.emit("Pad", [ins[0], ex.const(np.asarray(begin_end, np.int64)), ins[1]],
                   mode=node.attrs["pad_mode"])


register(OpDef("nn.pad", inputs=("data", "pad_value"), kernel="Pad",
               onnx=(OnnxForm("Pad", convert=_pad_from_onnx, export=_pad_to_onnx),),
               attrs=(Attr("pad_width", PAD_WIDTH, []),
                      Attr("pad_mode", StrKind("mode", ("constant", "edge", "reflect")),
                           "constant")),
               type_rel=_pad_rel, semantics=_pad, doc="pad each axis by [before, after]"))


# ---- layer norm, batched matmul (transformers) --------------------------------------------

def _layer_norm_rel(types, attrs):
    x = tensor(types, 0, "data")
    if not x.dtype.startswith("float"):
        raise OpTypeError(f"argument 1 ('data') must be a float tensor, got {x.dtype}", 0)
    c = x.shape[norm_axis(attrs["axis"], x.rank)]
    for i, name in ((1, "gamma"), (2, "beta")):
        t = tensor(types, i, name)
        if t.shape != (c,) or t.dtype != x.dtype:
            raise OpTypeError(f"argument {i + 1} ('{name}') must be Tensor[({c}), {x.dtype}], "
                              f"got {t}", arg=i)
    return x


def _layer_norm(x, gamma, beta, *, axis, epsilon, center, scale):
    shape = [1] * x.ndim
    shape[axis] = -1
    out = _normalized(x.astype(np.float64), axis, epsilon)
    if scale:
        out = out * gamma.astype(np.float64).reshape(shape)
    if center:
        out = out + beta.astype(np.float64).reshape(shape)
    return out.astype(x.dtype)


def _layer_norm_from_onnx(im, attrs, ins):
    """LayerNormalization over the last axis (ViT, ConvNeXt); without a bias B, center is off
    (the scale stands in for the unused beta)."""
    x = im.value(ins[0])
    rank = im.type(x).rank
    axis = attrs.get("axis", -1)
    if rank == 0 or axis % rank != rank - 1:
        raise OnnxFormError(f"LayerNormalization over axes {axis}..{rank - 1}: only the last "
                            "axis is supported")
    gamma = im.value(ins[1])
    has_bias = len(ins) > 2 and bool(ins[2])
    y = im.call("nn.layer_norm", x, gamma, im.value(ins[2]) if has_bias else gamma,
                axis=rank - 1, epsilon=float(attrs.get("epsilon", 1e-5)), center=has_bias)
    return [y, None, None]


def _layer_norm_to_onnx(ex, node, ins):
    a = node.attrs
    if not a["scale"]:
        raise OnnxFormError("nn.layer_norm with scale=False has no ONNX form here")
    return ex.emit("LayerNormalization", ins if a["center"] else ins[:2], axis=a["axis"],
                   epsilon=float(a["epsilon"]))


register(OpDef("nn.layer_norm", inputs=("data", "gamma", "beta"),
               kernel="LayerNorm",
               attrs=(Attr("axis", INT, -1), Attr("epsilon", FLOAT, 1e-5),
                      Attr("center", BOOL, True), Attr("scale", BOOL, True)),
               type_rel=_layer_norm_rel, semantics=_layer_norm,
               flops=lambda ins, out, a: 8.0 * ins[0].size,
               onnx=(OnnxForm("LayerNormalization", convert=_layer_norm_from_onnx,
                              export=_layer_norm_to_onnx),),
               doc="(x - mean) / sqrt(var + epsilon) * gamma + beta over axis (float64 inside)"))


def _normalized(v, axes, epsilon):
    """(v - mean) / sqrt(var + epsilon) over ``axes``, in v's (float64) precision."""
    mean = v.mean(axis=axes, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
    return (v - mean) / np.sqrt(var + epsilon)


def _instance_norm(x, gamma, beta, *, axis, epsilon, center, scale):
    """Each image's channel normalized over its own spatial positions (the axes after the
    first other than ``axis``), then scaled and shifted per channel; float64 inside."""
    axis %= x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1
    out = _normalized(x.astype(np.float64),
                      tuple(i for i in range(1, x.ndim) if i != axis), epsilon)
    if scale:
        out = out * gamma.astype(np.float64).reshape(shape)
    if center:
        out = out + beta.astype(np.float64).reshape(shape)
    return out.astype(x.dtype)


def _instance_norm_rel(types, attrs):
    x = tensor(types, 0, "data")
    if x.rank < 3:
        raise OpTypeError(f"instance_norm takes (N, C, spatial...) data, got rank {x.rank}", 0)
    return _layer_norm_rel(types, attrs)


def _instance_norm_to_onnx(ex, node, ins):
    a = node.attrs
    if a["axis"] != 1 or not (a["center"] and a["scale"]):
        raise OnnxFormError("InstanceNormalization normalizes axis 1 with a scale and a bias; "
                            f"this nn.instance_norm has axis={a['axis']}, "
                            f"center={a['center']}, scale={a['scale']}")
    return ex.emit("InstanceNormalization", ins, epsilon=float(a["epsilon"]))


register(OpDef("nn.instance_norm", inputs=("data", "gamma", "beta"),
               attrs=(Attr("axis", INT, 1), Attr("epsilon", FLOAT, 1e-5),
                      Attr("center", BOOL, True), Attr("scale", BOOL, True)),
               type_rel=_instance_norm_rel, semantics=_instance_norm,
               flops=lambda ins, out, a: 8.0 * ins[0].size,
               onnx=(OnnxForm("InstanceNormalization", convert=lambda im, attrs, ins: im.call(
                   "nn.instance_norm", *[im.value(n) for n in ins[:3]], axis=1,
                   epsilon=float(attrs.get("epsilon", 1e-5))),
                   export=_instance_norm_to_onnx),),
               doc="(x - mean) / sqrt(var + epsilon) * gamma + beta, the mean and variance "
                   "of each image's channel over its spatial positions (float64 inside)"))


def _lrn(x, *, size, axis, bias, alpha, beta):
    """Local response normalization (AlexNet's; ONNX LRN, Relay's nn.lrn): each value over
    (bias + alpha / size * the sum of the squares of the ``size`` values around it along
    ``axis``) ** beta, the window (size - 1) // 2 before it and size // 2 after; float64
    inside."""
    axis %= x.ndim
    v = np.moveaxis(x.astype(np.float64), axis, -1)
    sq = np.pad(v * v, [(0, 0)] * (v.ndim - 1) + [((size - 1) // 2, size // 2)])
    sums = sum(sq[..., i:i + v.shape[-1]] for i in range(size))
    out = v / (bias + alpha / size * sums) ** beta
    return np.ascontiguousarray(np.moveaxis(out, -1, axis)).astype(x.dtype)


def _lrn_rel(types, attrs):
    x = float_input(types, attrs)
    norm_axis(attrs["axis"], x.rank)
    if attrs["size"] < 1:
        raise OpTypeError(f"size must be 1 or more, got {attrs['size']}")
    return x


register(OpDef("nn.lrn", inputs=("data",),
               attrs=(Attr("size", INT, 5), Attr("axis", INT, 1), Attr("bias", FLOAT, 2.0),
                      Attr("alpha", FLOAT, 1e-4), Attr("beta", FLOAT, 0.75)),
               type_rel=_lrn_rel, semantics=_lrn,
               flops=lambda ins, out, a: float(out.size * (a["size"] + 4)),
               onnx=(OnnxForm("LRN", convert=lambda im, attrs, ins: im.call(
                   "nn.lrn", im.value(ins[0]), size=int(attrs["size"]), axis=1,
                   bias=float(attrs.get("bias", 1.0)), alpha=float(attrs.get("alpha", 1e-4)),
                   beta=float(attrs.get("beta", 0.75))),
                   export=lambda ex, node, ins: ex.emit(
                       "LRN", ins, size=node.attrs["size"], bias=float(node.attrs["bias"]),
                       alpha=float(node.attrs["alpha"]), beta=float(node.attrs["beta"]))
                   if node.attrs["axis"] == 1 else _lrn_axis_refused(node)),),
               doc="x / (bias + alpha / size * sum of squares over size channels) ** beta"))


def _lrn_axis_refused(node):
    raise OnnxFormError(f"ONNX's LRN works along axis 1; this nn.lrn along axis "
                        f"{node.attrs['axis']}")


def matmul_shapes(a, b, ta: bool, tb: bool):
    """The (.., M, K) x (.., K, N) shapes after the transposes, and the result's."""
    if a.rank < 2 or b.rank < 2:
        raise OpTypeError(f"batch_matmul takes rank >= 2 operands, got {a} and {b}", 1)
    m, k = a.shape[-2:][::-1] if ta else a.shape[-2:]
    k2, n = b.shape[-2:][::-1] if tb else b.shape[-2:]
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    if k != k2 or batch is None:
        raise OpTypeError(f"batch_matmul of {a} and {b} (transpose_a={ta}, transpose_b={tb}):"
                          " the reduced dimensions or the batch dimensions disagree", 1)
    return batch + (m, n)


def _batch_matmul_rel(types, attrs):
    a, b = tensor(types, 0, "tensor_a"), tensor(types, 1, "tensor_b")
    shape = matmul_shapes(a, b, attrs["transpose_a"], attrs["transpose_b"])
    return TensorType(shape, compute_dtypes(types, attrs, a, b))


def _batch_matmul(a, b, *, transpose_a, transpose_b, out_dtype):
    acc = numerics.acc_dtype(np.result_type(a.dtype, b.dtype))
    x, y = a.astype(acc), b.astype(acc)
    x = np.swapaxes(x, -1, -2) if transpose_a else x
    y = np.swapaxes(y, -1, -2) if transpose_b else y
    return np.matmul(x, y).astype(out_dtype or default_compute_dtype(str(a.dtype),
                                                                     str(b.dtype)))


def _batch_matmul_to_onnx(ex, node, ins):
    def t(name, rank):
        perm = list(range(rank))
        perm[-2:] = perm[-2:][::-1]
        return ex.emit("Transpose", [name], perm=perm)
    a, b = ins
    if node.attrs["transpose_a"]:
        a = t(a, ex.type(node.args[0]).rank)
    if node.attrs["transpose_b"]:
        b = t(b, ex.type(node.args[1]).rank)
    return ex.emit("MatMul", [a, b])


register(OpDef("nn.batch_matmul", inputs=("tensor_a", "tensor_b"), props=frozenset({COMPUTE}),
               attrs=(Attr("transpose_a", BOOL, False), Attr("transpose_b", BOOL, True),
                      Attr("out_dtype", DTYPE, ""),
                      Attr(KERNEL, StrKind("kernel", ("",) + FLOAT_PAIR_KERNELS), "")),
               type_rel=_batch_matmul_rel, semantics=_batch_matmul, kernel="BatchMatmul",
               flops=lambda ins, out, a: 2.0 * out.size * (
                   ins[0].shape[-2] if a["transpose_a"] else ins[0].shape[-1]),
               onnx=(OnnxForm("MatMul", reads=False, export=_batch_matmul_to_onnx),),
               doc="a @ b over the last two axes (transposed first where asked), the "
                   "leading axes broadcast as numpy's matmul; Relay's default transpose_b"))
