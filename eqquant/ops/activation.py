"""Smooth and piecewise activations of mobile and transformer networks: hardswish,
hardsigmoid, silu, erf, gelu, elu, selu, softplus, softsign, prelu. Each is one entry: reference
semantics, type relation, its fp32 kernel (by name, in ``eqquant/runtime/kernels/fp32.py``)
where it has one, and its ONNX forms."""
from __future__ import annotations

import math

import numpy as np

from .attrs import FLOAT_F, INT, Attr, StrKind
from .onnx_conventions import OnnxFormError
from .registry import ELEMWISE, UNARY, OnnxForm, OpDef, OpTypeError, register
from .typerel import float_input, norm_axis, tensor

_KERNEL = "Elementwise"


def _hardswish(x):
    """x * hardsigmoid(x) with alpha 1/6 and beta 0.5, in the input's float type (ONNX's
    definition, which ONNX Runtime computes in this order)."""
    t = x.dtype.type
    return (x * np.clip(x * t(1 / 6) + t(0.5), t(0), t(1))).astype(x.dtype)


register(OpDef("nn.hardswish", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               type_rel=float_input, semantics=_hardswish,
               kernel=_KERNEL, kernel_params={"fn": "hardswish"},
               onnx=(OnnxForm("HardSwish"),),
               doc="x * relu6(x + 3) / 6 (MobileNet-v3's activation)"))


def _hardsigmoid(x, *, alpha, beta):
    t = x.dtype.type
    return np.clip(x * t(alpha) + t(beta), t(0), t(1)).astype(x.dtype)


register(OpDef("nn.hardsigmoid", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               attrs=(Attr("alpha", FLOAT_F, 0.2), Attr("beta", FLOAT_F, 0.5)),
               type_rel=float_input, semantics=_hardsigmoid,
               kernel=_KERNEL, kernel_params={"fn": "hardsigmoid",
                                              "params": lambda a: (a["alpha"], a["beta"])},
               onnx=(OnnxForm("HardSigmoid", (("alpha", "alpha", 0.2),
                                              ("beta", "beta", 0.5))),),
               doc="max(0, min(1, alpha * x + beta)); ONNX's defaults (PyTorch exports "
                   "alpha = 1/6)"))

def _silu(x):
    """x * sigmoid(x), the two steps as the reference computes them (``tensor._sigmoid``, then
    the product in the input's float type): the same numbers as multiply(x, sigmoid(x))."""
    from .tensor import _sigmoid
    return (x * _sigmoid(x)).astype(x.dtype)


def _silu_to_onnx(ex, node, ins):
    """ONNX (opset 17) has no SiLU: x * Sigmoid(x), as PyTorch exports it."""
    return ex.emit("Mul", [ins[0], ex.emit("Sigmoid", [ins[0]])])


register(OpDef("nn.silu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               type_rel=float_input, semantics=_silu,
               kernel=_KERNEL, kernel_params={"fn": "silu"},
               onnx=(OnnxForm("Mul", reads=False, export=_silu_to_onnx),),
               doc="x * sigmoid(x) (SiLU, swish: EfficientNet's activation), in one pass"))

_erf_objects = np.frompyfunc(math.erf, 1, 1)


def _erf64(v: np.ndarray) -> np.ndarray:
    """math.erf elementwise, as a float64 array (0-d arrays too)."""
    return np.asarray(_erf_objects(np.asarray(v, np.float64)), np.float64)


def _erf(x):
    return _erf64(x).astype(x.dtype)


_erfc_objects = np.frompyfunc(math.erfc, 1, 1)


def _erfc64(v: np.ndarray) -> np.ndarray:
    """math.erfc elementwise, as a float64 array: 1 - erf without the cancellation."""
    return np.asarray(_erfc_objects(np.asarray(v, np.float64)), np.float64)


register(OpDef("erf", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               type_rel=float_input, semantics=_erf,
               kernel=_KERNEL, kernel_params={"fn": "erf"},
               onnx=(OnnxForm("Erf"),), doc="the error function (computed in float64)"))

APPROXIMATE = StrKind("approximate", ("none", "tanh"))


def _gelu(x, *, approximate):
    v = x.astype(np.float64)
    if approximate == "tanh":
        out = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    else:
        # Phi(x) = erfc(-x / sqrt 2) / 2: as 1 + erf(x / sqrt 2), without its cancellation
        # where x is far below 0 (there 1 + erf keeps a few digits, even in float64)
        out = 0.5 * v * _erfc64(-v / math.sqrt(2))
    return out.astype(x.dtype)


def _gelu_to_onnx(ex, node, ins):
    """Opset 17 has no Gelu: the erf form as PyTorch exports it (x * 0.5 * (1 + erf(x /
    sqrt 2))), or the tanh form op by op."""
    x = ins[0]
    c = lambda v: ex.const(np.float32(v))  # noqa: E731
    if node.attrs["approximate"] == "tanh":
        cube = ex.emit("Mul", [ex.emit("Mul", [x, x]), x])
        inner = ex.emit("Add", [x, ex.emit("Mul", [cube, c(0.044715)])])
        t = ex.emit("Tanh", [ex.emit("Mul", [inner, c(math.sqrt(2 / math.pi))])])
    else:
        t = ex.emit("Erf", [ex.emit("Div", [x, c(math.sqrt(2))])])
    return ex.emit("Mul", [ex.emit("Mul", [x, c(0.5)]), ex.emit("Add", [t, c(1.0)])])


register(OpDef("nn.gelu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               attrs=(Attr("approximate", APPROXIMATE, "none"),),
               type_rel=float_input, semantics=_gelu,
               kernel=_KERNEL, kernel_params={
                   "fn": "gelu",
                   "params": lambda a: (1.0 if a["approximate"] == "tanh" else 0.0,)},
               onnx=(OnnxForm("Gelu", (("approximate", "approximate", "none"),),
                              export=_gelu_to_onnx),),
               doc="x * Phi(x) (Phi(x) = erfc(-x / sqrt 2) / 2), or its tanh approximation; "
                   "computed in float64"))


# Exponential and smooth activations of ONNX (Elu, Selu, Softplus, Softsign): each computed
# in float64 and rounded, by the reference and by its kernel alike. ONNX Runtime computes
# them in float32, within a few float32 steps of these.

def _elu64(v, alpha):
    return np.where(v < 0, alpha * np.expm1(v), v)


def _elu(x, *, alpha):
    return _elu64(np.asarray(x, np.float64), alpha).astype(x.dtype)


register(OpDef("nn.elu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               attrs=(Attr("alpha", FLOAT_F, 1.0),), type_rel=float_input, semantics=_elu,
               kernel=_KERNEL, kernel_params={"fn": "elu",
                                              "params": lambda a: (a["alpha"], 1.0)},
               onnx=(OnnxForm("Elu", (("alpha", "alpha", 1.0),)),),
               doc="x where x >= 0, else alpha * (exp(x) - 1)"))

SELU_ALPHA = 1.67326319217681884765625      # ONNX's defaults (float32 values of the
SELU_GAMMA = 1.05070102214813232421875      # self-normalising constants)


def _selu(x, *, alpha, gamma):
    return (gamma * _elu64(np.asarray(x, np.float64), alpha)).astype(x.dtype)


register(OpDef("nn.selu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               attrs=(Attr("alpha", FLOAT_F, SELU_ALPHA), Attr("gamma", FLOAT_F, SELU_GAMMA)),
               type_rel=float_input, semantics=_selu,
               kernel=_KERNEL, kernel_params={"fn": "elu",
                                              "params": lambda a: (a["alpha"], a["gamma"])},
               onnx=(OnnxForm("Selu", (("alpha", "alpha", SELU_ALPHA),
                                       ("gamma", "gamma", SELU_GAMMA))),),
               doc="gamma * elu(x, alpha): the self-normalising activation"))


def _softplus(x):
    v = np.asarray(x, np.float64)
    # log(1 + exp(x)) without overflow: x + log(1 + exp(-x)) where x > 0
    return np.where(v > 0, v + np.log1p(np.exp(-np.abs(v))),
                    np.log1p(np.exp(np.minimum(v, 0)))).astype(x.dtype)


register(OpDef("nn.softplus", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               type_rel=float_input, semantics=_softplus,
               kernel=_KERNEL, kernel_params={"fn": "softplus"},
               onnx=(OnnxForm("Softplus"),), doc="log(1 + exp(x)), a smooth relu"))


def _softsign(x):
    v = np.asarray(x, np.float64)
    return (v / (1 + np.abs(v))).astype(x.dtype)


register(OpDef("nn.softsign", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               type_rel=float_input, semantics=_softsign,
               kernel=_KERNEL, kernel_params={"fn": "softsign"},
               onnx=(OnnxForm("Softsign"),), doc="x / (1 + |x|)"))


# PReLU: a leaky relu whose slope is learned per channel (Relay's nn.prelu: one slope per
# channel along ``axis``, or one for all).

def _prelu_rel(types, attrs):
    x = float_input(types, attrs)
    a = tensor(types, 1, "alpha", rank=1)
    axis = norm_axis(attrs["axis"], x.rank)
    if a.dtype != x.dtype:
        raise OpTypeError(f"alpha is {a.dtype}, the data {x.dtype}", arg=1)
    if a.shape[0] not in (1, x.shape[axis]):
        raise OpTypeError(f"alpha has {a.shape[0]} slopes; axis {axis} has "
                          f"{x.shape[axis]} channels (give one slope, or one per channel)", 1)
    return x


def _prelu(x, alpha, *, axis):
    axis %= x.ndim
    slope = alpha.reshape((-1,) + (1,) * (x.ndim - 1 - axis))
    return np.where(x < 0, x * slope, x).astype(x.dtype)


def _prelu_from_onnx(im, attrs, ins):
    """PRelu's slope broadcasts to X as numpy does (opset >= 7), or is one value or one per
    channel of axis 1 (opset 6 and before). A slope that varies along one axis is nn.prelu
    over that axis; one that varies along more has no such form and is refused."""
    x, slope = im.value(ins[0]), im.value(ins[1])
    rank, shape = im.type(x).rank, tuple(im.type(slope).shape)
    if im.opset < 7 and len(shape) == 1 and rank >= 2:
        aligned = (1, shape[0]) + (1,) * (rank - 2)       # the legacy per-channel form
    else:
        if len(shape) > rank:
            raise OnnxFormError(f"the slope has rank {len(shape)}, more than X's {rank}")
        aligned = (1,) * (rank - len(shape)) + shape
    varies = [i for i, d in enumerate(aligned) if d != 1]
    if len(varies) > 1:
        raise OnnxFormError(f"the slope of shape {list(shape)} varies along {len(varies)} "
                            "axes; nn.prelu takes one slope per channel of one axis")
    axis = varies[0] if varies else 1 % rank
    if tuple(im.type(slope).shape) != (aligned[axis],):
        slope = im.call("reshape", slope, newshape=[-1])
    return im.call("nn.prelu", x, slope, axis=axis)


def _prelu_to_onnx(ex, node, ins):
    x = ex.type(node.args[0])
    axis, n = node.attrs["axis"] % x.rank, ex.type(node.args[1]).shape[0]
    shape = [n] + [1] * (x.rank - 1 - axis)
    return ex.emit("PRelu", [ins[0], ex.emit("Reshape", [ins[1], ex.const(
        np.asarray(shape, np.int64))])])


register(OpDef("nn.prelu", inputs=("data", "alpha"), attrs=(Attr("axis", INT, 1),),
               type_rel=_prelu_rel, semantics=_prelu,
               onnx=(OnnxForm("PRelu", convert=_prelu_from_onnx, export=_prelu_to_onnx),),
               doc="x where x >= 0, alpha * x elsewhere, with one alpha per channel of axis "
                   "(or one for all)"))
