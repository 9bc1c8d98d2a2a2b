"""Elementwise, layout, reduction and annotation ops."""
from __future__ import annotations

import math

import warnings

import numpy as np

from ..core.types import Dim, SizeUnknown, TensorType, TupleType
from ..errors import EqquantError
from . import numerics
from .attrs import (BOOL, DTYPE_REQUIRED, FLOAT, FLOAT_F, INT, OPT_INT, OPT_INTS, REQUIRED,
                    SIZES, STR, Attr)
from .onnx_conventions import OnnxFormError, text
from .onnx_conventions import axes as onnx_axes
from .registry import (RelaxForm, ANNOTATION, BINARY, ELEMWISE, EPILOGUE, IDENTITY, LAYOUT, LOGIC,
                       REDUCE, UNARY, OnnxForm, OpDef, OpTypeError, register)
from .typerel import (broadcast, float_input, norm_axis, numeric_input, same_as_input,
                      tensor, tuple_of)


# The elementwise CPU kernel (runtime/lowering/fp32.py Activation) computes these by code.
RELU, CLIP, LEAKY_RELU, SIGMOID = 1, 2, 3, 4
_ACTIVATION = "Activation"


def _unary(name, fn, *, floats_only=False, doc="", kernel=None, props=frozenset(), onnx=(),
           kernel_params=None, subtracts=(), bounds=None):
    register(OpDef(name, inputs=("data",), props=frozenset({ELEMWISE, UNARY}) | props,
                   kernel=kernel, kernel_params=kernel_params or {}, onnx=onnx,
                   subtracts=subtracts, bounds=bounds,
                   type_rel=float_input if floats_only else numeric_input,
                   semantics=lambda x, _fn=fn: np.asarray(_fn(x)).astype(x.dtype, copy=False),
                   doc=doc))


def _relu_qdq(w, node):
    """ONNX's QDQ form: Relu of an int32 accumulator's real value (its scale is positive), or
    of an 8-bit value's (exact only where the zero point is 0: relu keeps the integers >= 0)."""
    x = node.args[0]
    scale = w.accumulator_scale(x)
    if scale is not None:
        return w.accumulate(node, scale, w.ex.emit("Relu", [w.ex.name_of(x)]))
    q = w.params(x)
    if q is None:
        raise w.unsupported(node)
    if q.zero != 0:
        raise EqquantError("ONNX export: relu of an 8-bit value with a zero point other than 0",
                           node.loc)
    return w.keep(node, q, w.quantize(w.ex.emit("Relu", [w.dq(x)]), q))


def _relu(x):
    """x where it is not below 0, else 0: -0.0 and NaN stay, as in the clamp to [0, inf] that
    a fused op's relu is (``fused.epilogue_bounds``: numpy's clip keeps a value equal to a
    bound), so that fusing a relu is an exact identity, and as ONNX Runtime's and PyTorch's
    relu keep them. (numpy's maximum(x, 0), this op's semantics before, made -0.0 +0.)"""
    return np.where(x < 0, x.dtype.type(0), x)


_unary("nn.relu", _relu, doc="max(x, 0)", props=frozenset({EPILOGUE}),
       kernel=_ACTIVATION, kernel_params={"code": RELU, "integers": True},
       onnx=(OnnxForm("Relu", qdq=_relu_qdq),))
_unary("negative", np.negative, doc="-x", onnx=(OnnxForm("Neg"),), subtracts=("data",))
_unary("abs", np.abs, doc="|x|", onnx=(OnnxForm("Abs"),))
_unary("sign", np.sign, doc="-1, 0 or 1 as x is below, at or above 0 (NaN stays NaN)",
       onnx=(OnnxForm("Sign"),))
_unary("sqrt", np.sqrt, floats_only=True, doc="sqrt(x)", onnx=(OnnxForm("Sqrt"),),
       kernel="Elementwise", kernel_params={"fn": "sqrt"})
_unary("rsqrt", lambda x: 1 / np.sqrt(x), floats_only=True, doc="1 / sqrt(x)")
def _sigmoid(x):
    with np.errstate(over="ignore"):   # exp(-x) = inf for x << 0 gives 0, as it should
        return 1 / (1 + np.exp(-x))


_unary("sigmoid", _sigmoid, floats_only=True, doc="1 / (1 + exp(-x))", bounds=(0.0, 1.0),
       kernel=_ACTIVATION, kernel_params={"code": SIGMOID}, onnx=(OnnxForm("Sigmoid"),))
_unary("tanh", np.tanh, floats_only=True, doc="tanh(x)", onnx=(OnnxForm("Tanh"),),
       bounds=(-1.0, 1.0), kernel="Elementwise", kernel_params={"fn": "tanh"})
_unary("exp", np.exp, floats_only=True, doc="exp(x)", onnx=(OnnxForm("Exp"),),
       kernel="Elementwise", kernel_params={"fn": "exp"})
# TVM lowers round to llvm.nearbyint: ties go to even, as numpy's round does.
_unary("round", np.round, floats_only=True, doc="round half to even")


# The binary elementwise kernel (runtime/lowering/fp32.py Binary) computes these by code.
ADD, SUBTRACT, MULTIPLY, DIVIDE, MAXIMUM, MINIMUM = 0, 1, 2, 3, 4, 5


def _add_qdq(w, node):
    """ONNX's QDQ form of an int32 accumulator plus a constant (a bias): the constant at the
    accumulator's scale, added to its real value."""
    scale = w.accumulator_scale(node.args[0])
    if scale is None:
        raise w.unsupported(node)
    b = w.ex.value(node.args[1])
    if b is None:
        raise EqquantError("ONNX export: an int32 accumulator plus a computed value", node.loc)
    real_b = (b.astype(np.float64) * scale).astype(np.float32)
    return w.accumulate(node, scale, w.ex.emit("Add", [w.ex.name_of(node.args[0]),
                                                      w.ex.const(real_b)]))


def _binary(name, fn, doc, onnx_type, code, qdq=None, subtracts=(), convert=None, more=()):
    """An elementwise op of two broadcast operands; ``more``: other ONNX ops read as it."""
    register(OpDef(name, inputs=("lhs", "rhs"), props=frozenset({ELEMWISE, BINARY}),
                   subtracts=subtracts,
                   kernel="Binary" if code is not None else None,
                   kernel_params={"code": code, "int32": code != DIVIDE}
                   if code is not None else {},
                   onnx=(OnnxForm(onnx_type, qdq=qdq, convert=convert),) + tuple(more),
                   type_rel=broadcast,
                   semantics=lambda a, b, _fn=fn: np.asarray(_fn(a, b)).astype(a.dtype,
                                                                                copy=False),
                   doc=doc))


def _variadic_from_onnx(op, mean=False):
    """ONNX Sum, Max, Min and Mean: any number of inputs, each broadcast; folded pairwise,
    in order (a mean: the sum, divided by the count)."""
    def convert(im, attrs, ins):
        values = [im.value(n) for n in ins if n]
        if not values:
            raise OnnxFormError("no inputs")
        out = values[0]
        for v in values[1:]:
            out = im.call(op, out, v)
        return im.call("divide", out, im.scalar(len(values), out)) if mean else out
    return convert


def _reciprocal_from_onnx(im, attrs, ins):
    x = im.value(ins[0])
    return im.call("divide", im.scalar(1.0, x), x)


_binary("add", np.add, "a + b with numpy broadcasting", "Add", ADD, qdq=_add_qdq,
        more=(OnnxForm("Sum", convert=_variadic_from_onnx("add")),))
_binary("subtract", np.subtract, "a - b with numpy broadcasting", "Sub", SUBTRACT,
        subtracts=("rhs",))
_binary("multiply", np.multiply, "a * b with numpy broadcasting", "Mul", MULTIPLY)
_binary("divide", lambda a, b: (np.divide(a, b) if a.dtype.kind == "f"
                                else numerics.trunc_divide(a, b)),
        "a / b; integers round toward zero", "Div", DIVIDE,
        more=(OnnxForm("Mean", convert=_variadic_from_onnx("add", mean=True)),
              OnnxForm("Reciprocal", convert=_reciprocal_from_onnx)))


# (numpy's maximum and minimum: a NaN in either operand is the result; of two equal values,
# the first: max(-0.0, 0.0) is -0.0)
_binary("maximum", np.maximum, "the larger of a and b, with numpy broadcasting (NaN if "
        "either is)", "Max", MAXIMUM, convert=_variadic_from_onnx("maximum"))
_binary("minimum", np.minimum, "the smaller of a and b, with numpy broadcasting (NaN if "
        "either is)", "Min", MINIMUM, convert=_variadic_from_onnx("minimum"))


def _power(a, b):
    """a ** b, computed in float64 and rounded once (ONNX Runtime's powf is within a
    float32 step of it); integers as numpy computes them."""
    if a.dtype.kind == "f":
        with np.errstate(all="ignore"):    # (0 ** -1 is inf, (-8) ** 0.5 NaN: as they should)
            return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    return np.power(a, b).astype(a.dtype)


def _power_from_onnx(im, attrs, ins):
    """Pow: an exponent of another type (an integer power of a float) is cast to the
    base's."""
    a, b = im.value(ins[0]), im.value(ins[1])
    if im.type(b).dtype != im.type(a).dtype:
        b = im.call("cast", b, dtype=im.type(a).dtype)
    return im.call("power", a, b)


_binary("power", _power, "a ** b with numpy broadcasting (float64 inside)", "Pow", None,
        convert=_power_from_onnx)


def _where_rel(types, attrs):
    cond, a, b = (tensor(types, i, n) for i, n in enumerate(("condition", "x", "y")))
    if cond.dtype != "bool":
        raise OpTypeError(f"the condition must be bool, not {cond.dtype}", arg=0)
    if a.dtype != b.dtype:
        raise OpTypeError(f"x and y have different dtypes: {a.dtype} and {b.dtype}", arg=2)
    try:
        shape = np.broadcast_shapes(cond.shape, a.shape, b.shape)
    except ValueError:
        raise OpTypeError(f"shapes {cond.shape}, {a.shape} and {b.shape} do not broadcast",
                          arg=2) from None
    return TensorType(tuple(int(d) for d in shape), a.dtype)


register(OpDef("where", inputs=("condition", "x", "y"), type_rel=_where_rel, kernel="Select",
               semantics=lambda c, a, b: np.where(c, a, b).astype(a.dtype, copy=False),
               onnx=(OnnxForm("Where"),),
               doc="x where the condition holds, else y (all three broadcast together)"))


# Comparisons and logic (attention masks: mask == 0, then a where): bool results. Elementwise,
# but not ``binary`` (that property says the result has its operands' dtype).

def _compare_rel(types, attrs):
    return TensorType(broadcast(types, attrs, numbers=False).shape, "bool")


def _logic_rel(types, attrs):
    for i in range(len(types)):
        if tensor(types, i).dtype != "bool":
            raise OpTypeError(f"argument {i + 1} must be bool, not {tensor(types, i).dtype}", i)
    if len(types) == 1:
        return tensor(types, 0)
    return _compare_rel(types, attrs)


def _not_equal_to_onnx(ex, node, ins):
    return ex.emit("Not", [ex.emit("Equal", ins)])


def _truth(name, fn, onnx_type, doc, logic=False, code=None):
    """A comparison of two numbers (``logic``: a connective of two truth values), with
    numpy broadcasting and a bool result; ``code``: the comparison's in the ``Compare``
    kernel (``kernels/indexing.compare``)."""
    register(OpDef(name, inputs=("lhs", "rhs"),
                   **({} if code is None else {"kernel": "Compare",
                                               "kernel_params": {"code": code}}),
                   props=frozenset({ELEMWISE, LOGIC} if logic else {ELEMWISE}),
                   type_rel=_logic_rel if logic else _compare_rel,
                   semantics=lambda a, b, _fn=fn: np.asarray(_fn(a, b), bool),
                   onnx=(OnnxForm(onnx_type),) if onnx_type else
                   (OnnxForm("Equal", reads=False, export=_not_equal_to_onnx),),
                   doc=doc + ", elementwise with numpy broadcasting: bool"
                   + ("" if logic else " (NaN compares unequal to everything)")))


_truth("equal", np.equal, "Equal", "a == b", code=0)
_truth("not_equal", np.not_equal, None, "a != b", code=1)
_truth("less", np.less, "Less", "a < b", code=2)
_truth("less_equal", np.less_equal, "LessOrEqual", "a <= b", code=3)
_truth("greater", np.greater, "Greater", "a > b", code=4)
_truth("greater_equal", np.greater_equal, "GreaterOrEqual", "a >= b", code=5)
_truth("logical_and", np.logical_and, "And", "a and b", logic=True)
_truth("logical_or", np.logical_or, "Or", "a or b", logic=True)
_truth("logical_xor", np.logical_xor, "Xor", "a xor b", logic=True)
register(OpDef("logical_not", inputs=("data",), props=frozenset({ELEMWISE, UNARY, LOGIC}),
               type_rel=_logic_rel, semantics=np.logical_not, onnx=(OnnxForm("Not"),),
               doc="not x, elementwise on bool"))


def _clip(x, *, a_min, a_max):
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        lo = max(info.min, math.ceil(a_min)) if math.isfinite(a_min) else info.min
        hi = min(info.max, math.floor(a_max)) if math.isfinite(a_max) else info.max
        return np.clip(x, lo, hi).astype(x.dtype)
    return np.clip(x, a_min, a_max).astype(x.dtype)


def _clip_from_onnx(im, attrs, ins):
    """ONNX Clip: bounds as attributes (before opset 11) or constant inputs; Clip(x, 0, inf)
    is a relu."""
    lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
    for i, what in ((1, "min"), (2, "max")):
        if len(ins) > i and ins[i]:
            bound = im.const_scalar(ins[i], f"Clip's {what}")
            lo, hi = (bound, hi) if what == "min" else (lo, bound)
    x = im.value(ins[0])
    if lo == 0 and hi == np.inf:
        return im.call("nn.relu", x)
    return im.call("clip", x, a_min=float(lo), a_max=float(hi))


def _clip_to_onnx(ex, node, ins):
    return ex.emit("Clip", [ins[0], ex.const(np.float32(node.attrs["a_min"])),
                            ex.const(np.float32(node.attrs["a_max"]))])


register(OpDef("clip", inputs=("data",), props=frozenset({ELEMWISE, UNARY, EPILOGUE}),
               kernel=_ACTIVATION, onnx=(OnnxForm("Clip", convert=_clip_from_onnx,
                                                  export=_clip_to_onnx),),
               kernel_params={"code": CLIP, "params": lambda a: (a["a_min"], a["a_max"])},
               attrs=(Attr("a_min", FLOAT_F, -math.inf), Attr("a_max", FLOAT_F, math.inf)),
               type_rel=same_as_input, semantics=_clip,
               doc="min(max(x, a_min), a_max); keeps the input dtype"))


register(OpDef("nn.leaky_relu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               kernel=_ACTIVATION, onnx=(OnnxForm("LeakyRelu", (("alpha", "alpha", 0.01),)),),
               kernel_params={"code": LEAKY_RELU, "params": lambda a: (a["alpha"], 0.0)},
               attrs=(Attr("alpha", FLOAT_F, 0.25),), type_rel=float_input,
               semantics=lambda x, *, alpha: np.where(x >= 0, x, x * np.asarray(alpha, x.dtype)),
               doc="x where x >= 0, alpha * x elsewhere (TVM's default alpha is 0.25)"))


def _cast_rel(types, attrs):
    t = tensor(types, 0, "data")
    return TensorType(t.shape, attrs["dtype"])


def _cast_to_onnx(ex, node, ins):
    from onnx import helper
    return ex.emit("Cast", ins, to=helper.np_dtype_to_tensor_dtype(np.dtype(node.attrs["dtype"])))


register(OpDef("cast", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
               attrs=(Attr("dtype", DTYPE_REQUIRED, REQUIRED),), kernel="Convert",
               onnx=(OnnxForm("Cast", export=_cast_to_onnx, convert=lambda im, attrs, ins:
                              im.call("cast", im.value(ins[0]),
                                      dtype=im.dtype(attrs["to"], "Cast's to"))),),
               type_rel=_cast_rel, semantics=lambda x, *, dtype: x.astype(dtype),
               doc="convert to dtype (floats to ints truncate toward zero)"))

# ---- annotations: the identity on their first input ----------------------------------------

register(OpDef("annotation.stop_fusion", inputs=("data",), moves_data=False,
               kernel="View",
               props=frozenset({IDENTITY, ANNOTATION}), type_rel=same_as_input,
               semantics=lambda x: x, doc="identity; marks a fusion boundary"))
register(OpDef("annotation.cast_hint", inputs=("data",), moves_data=False,
               kernel="View",
               props=frozenset({IDENTITY, ANNOTATION}),
               attrs=(Attr("dtype", DTYPE_REQUIRED, REQUIRED),),
               type_rel=same_as_input, semantics=lambda x, *, dtype: x,
               doc="identity; hints the dtype the value will be quantized to"))


def _dropout_rel(types, attrs):
    t = float_input(types, attrs)
    return tuple_of(t, t)


def _pass_from_onnx(im, attrs, ins):
    """ONNX Dropout (at inference) and Identity: the value itself (Dropout's mask output is
    not supported)."""
    return [im.value(ins[0]), None]


def _dropout_from_onnx(im, attrs, ins):
    """ONNX Dropout: the identity at inference; in training mode (its third input true, or
    computed at run time) it drops values at random, which no inference program does."""
    if len(ins) > 2 and ins[2]:
        training = im.const(ins[2], "Dropout's training_mode")
        if np.any(training):
            raise OnnxFormError("Dropout in training mode (training_mode true) drops values "
                                "at random: export the model for inference (model.eval())")
    return _pass_from_onnx(im, attrs, ins)


register(OpDef("nn.dropout", inputs=("data",), props=frozenset({ANNOTATION}), moves_data=False,
               onnx=(OnnxForm("Dropout", convert=_dropout_from_onnx,
                              export=lambda ex, node, ins: ins[0]),
                     OnnxForm("Identity", convert=_pass_from_onnx)),
               attrs=(Attr("rate", FLOAT, 0.5),), type_rel=_dropout_rel,
               semantics=lambda x, *, rate: (x, np.ones_like(x)),
               doc="inference: (data, mask of ones); .0 is the identity"))

# ---- layout ----------------------------------------------------------------------------------


def _reshape_target(shape, newshape, arg=0):
    out, infer = [], None
    for i, d in enumerate(newshape):
        if d == 0:
            if i >= len(shape):
                raise OpTypeError(f"newshape[{i}] = 0 copies a dimension the input lacks", arg)
            out.append(shape[i])
        elif d == -1:
            if infer is not None:
                raise OpTypeError("newshape has more than one -1", arg)
            infer = len(out)
            out.append(1)
        elif d > 0:
            out.append(d)
        else:
            raise OpTypeError(f"newshape value {d} is not supported (use positive, 0 or -1)",
                              arg)
    # (math.prod: a size known only at run time, a Dim, multiplies and divides exactly)
    total = math.prod(shape)
    known = math.prod(out)
    if infer is not None:
        if known == 0 or total % known:
            raise OpTypeError(f"cannot reshape {tuple(shape)} to {list(newshape)}", arg)
        out[infer] = total // known
    if math.prod(out) != total:
        raise OpTypeError(f"cannot reshape {tuple(shape)} ({total} elements) to "
                          f"{tuple(out)}", arg)
    return tuple(out)


def _reshape_rel(types, attrs):
    t = tensor(types, 0, "data")
    return TensorType(_reshape_target(t.shape, attrs["newshape"]), t.dtype)


def _reshape_canonical(types, attrs):
    """0 copies a dimension of the input: write that dimension instead (-1 stays)."""
    shape = types[0].shape
    return {**attrs, "newshape": [shape[i] if d == 0 and not isinstance(shape[i], Dim) else d
                                  for i, d in enumerate(attrs["newshape"])]}


def _reshape_from_onnx(im, attrs, ins):
    given = np.asarray(im.const(ins[1], "Reshape's shape")).reshape(-1).tolist()
    shape = im.const_sizes(ins[1], "Reshape's shape", im.type(im.value(ins[0])).shape)
    if attrs.get("allowzero", 0) and any(d == 0 and not isinstance(d, Dim) for d in given):
        raise OnnxFormError("allowzero=1 with a 0 in the shape (an empty tensor) is not "
                            "supported")
    return im.call("reshape", im.value(ins[0]), newshape=shape)


def _to_onnx_reshape(ex, node, ins):
    """Any op that only reshapes: ONNX Reshape to the result's shape; a size known only at
    run time as ONNX's 0 where it is the input's at that axis, or -1 where it is the only
    other one."""
    out, src = list(ex.type(node).shape), ex.type(node.args[0]).shape
    out = [0 if isinstance(d, Dim) and i < len(src) and src[i] == d else d
           for i, d in enumerate(out)]
    if sum(isinstance(d, Dim) for d in out) == 1 and -1 not in out:
        out = [-1 if isinstance(d, Dim) else d for d in out]
    return ex.reshape(ins[0], out)


def _reshape_from_relax(rx, args, kwargs):
    """``R.reshape(x, R.shape([1, 32]))``: the shape is the second argument."""
    shape = kwargs.pop("shape", None)
    if shape is None and len(args) == 2:
        shape, args = rx.constant(args[1], "R.reshape's shape"), args[:1]
    if len(args) != 1 or shape is None or kwargs:
        raise EqquantError("R.reshape takes a value and its new shape: "
                           "R.reshape(x, R.shape([d0, d1, ...]))")
    return rx.call("reshape", rx.value(args[0], "R.reshape's first argument"),
                   newshape=list(shape))


def _reshape_to_relax(node, types):
    return [f"R.shape({list(node.attrs['newshape'])})"], {}


register(OpDef("reshape", inputs=("data",), props=frozenset({LAYOUT}), moves_data=False,
               relax=RelaxForm(read=_reshape_from_relax, write=_reshape_to_relax),
               onnx=(OnnxForm("Reshape", convert=_reshape_from_onnx, export=_to_onnx_reshape),),
               kernel="View",
               attrs=(Attr("newshape", SIZES, REQUIRED),),
               type_rel=_reshape_rel, canonicalize=_reshape_canonical,
               semantics=lambda x, *, newshape: x.reshape(_reshape_target(x.shape, newshape)),
               doc="reshape; 0 copies a dimension, -1 infers one"))


def _reshape_like_target(shape, like, attrs, arg=0):
    """``shape`` with its axes [lhs_begin, lhs_end) replaced by ``like``'s [rhs_begin,
    rhs_end) (an end of None: the last axis included), the element count kept."""
    def span(n, begin, end):
        begin, end = begin % n if n else 0, n if end is None else end % n if end < 0 else end
        if not 0 <= begin <= end <= n:
            raise OpTypeError(f"axes [{begin}, {end}) are out of range for rank {n}", arg)
        return begin, end
    lb, le = span(len(shape), attrs["lhs_begin"], attrs["lhs_end"])
    rb, re_ = span(len(like), attrs["rhs_begin"], attrs["rhs_end"])
    out = tuple(shape[:lb]) + tuple(like[rb:re_]) + tuple(shape[le:])
    if math.prod(out) != math.prod(shape):
        raise OpTypeError(f"cannot reshape {tuple(shape)} to {out}", arg)
    return out


def _reshape_like_rel(types, attrs):
    t = tensor(types, 0, "data")
    like = tensor(types, 1, "shape_like")
    return TensorType(_reshape_like_target(t.shape, like.shape, attrs), t.dtype)


register(OpDef("reshape_like", inputs=("data", "shape_like"), props=frozenset({LAYOUT}),
               moves_data=False, kernel="View",
               attrs=(Attr("lhs_begin", INT, 0), Attr("lhs_end", OPT_INT, None),
                      Attr("rhs_begin", INT, 0), Attr("rhs_end", OPT_INT, None)),
               type_rel=_reshape_like_rel,
               semantics=lambda x, like, **a: x.reshape(_reshape_like_target(x.shape,
                                                                             like.shape, a)),
               doc="reshape data's axes [lhs_begin, lhs_end) to shape_like's [rhs_begin, "
                   "rhs_end), as Relay's: a shape whose sizes are known only at run time"))


def _expand_dims_rel(types, attrs):
    t = tensor(types, 0, "data")
    axis, num = attrs["axis"], attrs["num_newaxis"]
    if num < 0:
        raise OpTypeError("num_newaxis must be >= 0")
    if not -t.rank - 1 <= axis <= t.rank:
        raise OpTypeError(f"axis {axis} is out of range for rank {t.rank}", arg=0)
    axis = axis % (t.rank + 1)
    return TensorType(t.shape[:axis] + (1,) * num + t.shape[axis:], t.dtype)


def _unsqueeze_from_onnx(im, attrs, ins):
    x = im.value(ins[0])
    given = onnx_axes(im, attrs, ins, "Unsqueeze")
    if not given:
        raise OnnxFormError("Unsqueeze needs axes")
    shape = list(im.type(x).shape)
    rank = len(shape) + len(given)
    if any(not -rank <= a < rank for a in given) or len({a % rank for a in given}) != len(given):
        raise OnnxFormError(f"Unsqueeze axes {list(given)} are out of range or repeated for a "
                            f"result of rank {rank}")
    for a in sorted(a % rank for a in given):
        shape.insert(a, 1)
    if len(given) == 1:
        return im.call("expand_dims", x, axis=given[0] % rank)
    return im.call("reshape", x, newshape=shape)


def _expand_dims_from_relax(rx, args, kwargs):
    """Relax's expand_dims inserts an axis at each of a list of result positions: one run of
    consecutive positions is expand_dims(axis, num_newaxis); any other set is the reshape
    to the result's shape (-1 standing for the input's first dimension, so that a vector's
    channel form reads ``reshape(?k, newshape=[1, -1, 1, 1])``)."""
    x = rx.value(args[0] if len(args) == 1 else None, "R.expand_dims's argument")
    axis = kwargs.pop("axis", None)
    if len(args) != 1 or axis is None or kwargs:
        raise EqquantError("R.expand_dims takes a value and axis=[...]")
    given = [axis] if isinstance(axis, int) else list(axis)
    shape = list(rx.type(x).shape)
    rank = len(shape) + len(given)
    if not given or any(not isinstance(a, int) or not -rank <= a < rank for a in given) or \
            len({a % rank for a in given}) != len(given):
        raise EqquantError(f"R.expand_dims: axes {given} are out of range or repeated for a "
                           f"result of rank {rank}")
    axes = sorted(a % rank for a in given)
    if axes == list(range(axes[0], axes[0] + len(axes))):
        return rx.call("expand_dims", x, axis=axes[0], num_newaxis=len(axes))
    out: list[int] = []
    dims = iter([-1, *shape[1:]] if shape else [])
    for i in range(rank):
        out.append(1 if i in axes else next(dims))
    return rx.call("reshape", x, newshape=out)


def _expand_dims_to_relax(node, types):
    rank = types[id(node.args[0])].rank
    a, n = node.attrs["axis"] % (rank + 1), node.attrs["num_newaxis"]
    return [], {"axis": list(range(a, a + n))}


register(OpDef("expand_dims", inputs=("data",), props=frozenset({LAYOUT}), moves_data=False,
               relax=RelaxForm(read=_expand_dims_from_relax, write=_expand_dims_to_relax),
               onnx=(OnnxForm("Unsqueeze", convert=_unsqueeze_from_onnx,
                              export=_to_onnx_reshape),),
               kernel="View",
               attrs=(Attr("axis", INT, 0), Attr("num_newaxis", INT, 1)),
               type_rel=_expand_dims_rel,
               semantics=lambda x, *, axis, num_newaxis: x.reshape(
                   _expand_dims_rel([TensorType(x.shape, str(x.dtype))],
                                    {"axis": axis, "num_newaxis": num_newaxis}).shape),
               doc="insert num_newaxis axes of size 1 at axis"))


def _squeeze_axes(shape, axis):
    if axis is None:
        open_ = [d for d in shape if isinstance(d, Dim)]
        if open_:       # (which axes go depends on whether the size is 1)
            raise SizeUnknown(f"squeezing every axis of size 1 of a shape with {open_[0]}: "
                              f"name the axes")
        return [i for i, d in enumerate(shape) if d == 1]
    axes = [norm_axis(a, len(shape)) for a in axis]
    for a in axes:
        if shape[a] != 1:
            raise OpTypeError(f"cannot squeeze axis {a} of size {shape[a]}", arg=0)
    return axes


def _squeeze_rel(types, attrs):
    t = tensor(types, 0, "data")
    axes = _squeeze_axes(t.shape, attrs["axis"])
    return TensorType(tuple(d for i, d in enumerate(t.shape) if i not in axes), t.dtype)


register(OpDef("squeeze", inputs=("data",), props=frozenset({LAYOUT}), moves_data=False,
               onnx=(OnnxForm("Squeeze", export=_to_onnx_reshape, convert=lambda im, attrs, ins:
                              im.call("squeeze", im.value(ins[0]),
                                      axis=onnx_axes(im, attrs, ins, "Squeeze"))),),
               kernel="View",
               attrs=(Attr("axis", OPT_INTS, None),), type_rel=_squeeze_rel,
               semantics=lambda x, *, axis: np.squeeze(x, tuple(_squeeze_axes(x.shape, axis))),
               doc="drop axes of size 1 (all of them when axis is None)"))


def _perm(rank, axes):
    if axes is None:
        return list(range(rank))[::-1]
    perm = [norm_axis(a, rank) for a in axes]
    if sorted(perm) != list(range(rank)):
        raise OpTypeError(f"axes {axes} is not a permutation of {rank} axes", arg=0)
    return perm


def _transpose_view(x, *, axes):
    """The permuted axes as a view of ``x`` (the runtime copies it: ``bindings.StridedCopy``)."""
    return np.transpose(x, _perm(x.ndim, axes))


def _transpose_rel(types, attrs):
    t = tensor(types, 0, "data")
    return TensorType(tuple(t.shape[p] for p in _perm(t.rank, attrs["axes"])), t.dtype)


def _transpose_to_onnx(ex, node, ins):
    rank = ex.type(node.args[0]).rank
    return ex.emit("Transpose", ins, perm=_perm(rank, node.attrs["axes"]))


def _transpose_from_onnx(im, attrs, ins):
    perm = attrs.get("perm")
    return im.call("transpose", im.value(ins[0]), axes=list(perm) if perm is not None else None)


def _blocks_moved(to_depth: bool):
    """ONNX SpaceToDepth (``to_depth``) and DepthToSpace (DCR or CRD mode): blocks of pixels
    moved to channels or back, as a reshape to six axes, a transpose and a reshape (the
    layout kernels run them)."""
    def convert(im, attrs, ins):
        x = im.value(ins[0])
        t = im.type(x)
        b = int(attrs.get("blocksize", 0))
        if t.rank != 4 or b < 1:
            raise OnnxFormError(f"takes NCHW data and a blocksize of 1 or more, got rank "
                                f"{t.rank} and blocksize {b}")
        n, c, h, w = t.shape
        if to_depth:
            if h % b or w % b:
                raise OnnxFormError(f"{h}x{w} does not divide into blocks of {b}x{b}")
            six, perm, out = [n, c, h // b, b, w // b, b], [0, 3, 5, 1, 2, 4], \
                [n, c * b * b, h // b, w // b]
        else:
            if c % (b * b):
                raise OnnxFormError(f"{c} channels do not divide into blocks of {b}x{b}")
            mode = text(attrs.get("mode", "DCR"))
            if mode not in ("DCR", "CRD"):
                raise OnnxFormError(f"mode {mode!r} is not DCR or CRD")
            c2 = c // (b * b)
            six, perm = ([n, b, b, c2, h, w], [0, 3, 4, 1, 5, 2]) if mode == "DCR" else \
                ([n, c2, b, b, h, w], [0, 1, 4, 2, 5, 3])
            out = [n, c2, h * b, w * b]
        moved = im.call("transpose", im.call("reshape", x, newshape=six), axes=perm)
        return im.call("reshape", moved, newshape=out)
    return convert


register(OpDef("transpose", inputs=("data",), props=frozenset({LAYOUT}),
               onnx=(OnnxForm("Transpose", convert=_transpose_from_onnx,
                              export=_transpose_to_onnx),
                     OnnxForm("DepthToSpace", convert=_blocks_moved(False)),
                     OnnxForm("SpaceToDepth", convert=_blocks_moved(True))),
               attrs=(Attr("axes", OPT_INTS, None),), type_rel=_transpose_rel,
               semantics=lambda x, *, axes: _transpose_view(x, axes=axes).copy(),
               kernel="StridedCopy",
               kernel_params={"view": _transpose_view},
               doc="permute axes (reverse them when axes is None)"))


def layout_perm(src: str, dst: str) -> list[int]:
    """The axes of a ``src``-layout tensor in ``dst`` order ("NCHW" -> "NHWC": [0, 2, 3, 1]);
    a layout is a string of distinct axis letters (TVM's primal layouts; blocked ones such as
    NCHW8c are not supported)."""
    for name, layout in (("src_layout", src), ("dst_layout", dst)):
        if not layout.isalpha() or not layout.isupper() or len(set(layout)) != len(layout):
            raise OpTypeError(f"{name}={layout!r} is not a layout: distinct capital axis "
                              "letters, one per axis (blocked layouts such as NCHW8c are not "
                              "supported)")
    if sorted(src) != sorted(dst):
        raise OpTypeError(f"{src} and {dst} name different axes")
    return [src.index(a) for a in dst]


def _layout_transform_rel(types, attrs):
    t = tensor(types, 0, "data")
    perm = layout_perm(attrs["src_layout"], attrs["dst_layout"])
    if t.rank != len(perm):
        raise OpTypeError(f"src_layout={attrs['src_layout']} has {len(perm)} axes, the data "
                          f"{t.rank}", arg=0)
    return TensorType(tuple(t.shape[p] for p in perm), t.dtype)


def _layout_transform_to_onnx(ex, node, ins):
    return ex.emit("Transpose", ins, perm=layout_perm(node.attrs["src_layout"],
                                                      node.attrs["dst_layout"]))


register(OpDef("layout_transform", inputs=("data",), props=frozenset({LAYOUT}),
               onnx=(OnnxForm("Transpose", reads=False, export=_layout_transform_to_onnx),),
               kernel="LayoutTransform",
               attrs=(Attr("src_layout", STR, REQUIRED), Attr("dst_layout", STR, REQUIRED)),
               type_rel=_layout_transform_rel,
               semantics=lambda x, *, src_layout, dst_layout: np.ascontiguousarray(
                   np.transpose(x, layout_perm(src_layout, dst_layout))),
               doc="the same tensor with its axes in another order, named by layouts "
                   '(TVM\'s layout_transform): src_layout="NCHW", dst_layout="NHWC" moves the '
                   "channels last"))


def _batch_flatten_rel(types, attrs):
    t = tensor(types, 0, "data")
    if t.rank < 1:
        raise OpTypeError("batch_flatten needs rank >= 1", arg=0)
    return TensorType((t.shape[0], math.prod(t.shape[1:])), t.dtype)


def _flatten_from_onnx(im, attrs, ins):
    """Flatten at axis 1 is nn.batch_flatten; at any other axis, a reshape."""
    x = im.value(ins[0])
    shape = im.type(x).shape
    axis = attrs.get("axis", 1)
    axis = axis + len(shape) if axis < 0 else axis
    if axis == 1 and len(shape) >= 2:
        return im.call("nn.batch_flatten", x)
    lead = int(np.prod(shape[:axis], dtype=np.int64))
    return im.call("reshape", x, newshape=[lead, -1 if shape[axis:] else 1])


register(OpDef("nn.batch_flatten", inputs=("data",), props=frozenset({LAYOUT}), moves_data=False,
               onnx=(OnnxForm("Flatten", convert=_flatten_from_onnx, export=lambda ex, node, ins:
                              ex.emit("Flatten", ins, axis=1)),),
               kernel="View",
               type_rel=_batch_flatten_rel,
               semantics=lambda x: x.reshape(x.shape[0], -1), doc="(N, ...) -> (N, prod(...))"))


def _concat_rel(types, attrs):
    tup = types[0]
    if not isinstance(tup, TupleType) or not tup.fields:
        raise OpTypeError(f"concatenate takes a non-empty tuple of tensors, got {tup}", arg=0)
    first = tup.fields[0]
    if not isinstance(first, TensorType):
        raise OpTypeError("concatenate takes a tuple of tensors", arg=0)
    axis = norm_axis(attrs["axis"], first.rank)
    size = 0
    for f in tup.fields:
        if not isinstance(f, TensorType) or f.rank != first.rank or f.dtype != first.dtype or \
                f.shape[:axis] + f.shape[axis + 1:] != first.shape[:axis] + first.shape[axis + 1:]:
            raise OpTypeError(f"cannot concatenate {first} and {f} on axis {axis}", arg=0)
        size += f.shape[axis]
    return TensorType(first.shape[:axis] + (size,) + first.shape[axis + 1:], first.dtype)


def _concat_qdq(w, node):
    """ONNX's QDQ form: 8-bit tensors with one scale and zero point (the integer concat rules
    requantize every field to the join's) are joined as they are."""
    fields = getattr(node.args[0], "fields", ())
    # a constant field (ViT's class token, quantized when the program was compiled) was
    # quantized with the join's parameters by the same rule: it is written as it is
    params = [w.params(f) for f in fields if w.ex.value(f) is None]
    if not params or any(p is None or (p.step, p.zero) != (params[0].step, params[0].zero)
                         for p in params):
        raise w.unsupported(node)
    names = []
    for f in fields:
        value = w.ex.value(f)
        if value is not None and str(value.dtype) == "int8" != w.ex.activation_dtype:
            raise w.unsupported(node)     # (an int8 constant where uint8 is exported)
        names.append(w.ex.name_of(f))
    joined = w.ex.emit("Concat", names, axis=node.attrs["axis"])
    return w.keep(node, params[0], joined)


def _concat_from_onnx(im, attrs, ins):
    parts = [im.value(n) for n in ins if n]
    return im.call("concatenate", im.b.tuple(*parts), axis=attrs["axis"])


register(OpDef("concatenate", inputs=("data",), props=frozenset({LAYOUT}),
               relax=RelaxForm("R.concat"),
               onnx=(OnnxForm("Concat", convert=_concat_from_onnx, qdq=_concat_qdq,
                              export=lambda ex, node, ins: ex.emit("Concat", list(ins[0]),
                                                                   axis=node.attrs["axis"])),),
               kernel="Concatenate",
               attrs=(Attr("axis", INT, 0),), type_rel=_concat_rel,
               semantics=lambda xs, *, axis: np.concatenate(xs, axis=axis),
               doc="join a tuple of tensors along axis"))

# ---- reductions ------------------------------------------------------------------------------


def reduce_axes(rank, axis, exclude) -> tuple[int, ...]:
    """The axes a reduction's attributes (``axis``, ``exclude``) name, sorted, each once."""
    axes = list(range(rank)) if axis is None else [norm_axis(a, rank) for a in axis]
    if exclude:
        axes = [i for i in range(rank) if i not in axes]
    return tuple(sorted(set(axes)))


def _reduce_rel(types, attrs):
    t = tensor(types, 0, "data")
    axes = reduce_axes(t.rank, attrs["axis"], attrs["exclude"])
    if attrs["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    return TensorType(shape, t.dtype)


def _reduce_onnx(name: str, onnx_type: str, axes_input_from: int) -> OnnxForm:
    """ONNX's Reduce*: axes as an attribute, or as an input from opset ``axes_input_from``
    (13 for ReduceSum, 18 for the others); keepdims defaults to 1; no axes means all of them
    (or, with noop_with_empty_axes, none)."""
    def convert(im, attrs, ins):
        given = onnx_axes(im, attrs, ins, onnx_type)
        x = im.value(ins[0])
        if not given and attrs.get("noop_with_empty_axes", 0):
            return x
        return im.call(name, x, axis=given or None, keepdims=bool(attrs.get("keepdims", 1)))

    def export(ex, node, ins):
        rank = ex.type(node.args[0]).rank
        axes = list(reduce_axes(rank, node.attrs["axis"], node.attrs["exclude"]))
        keep = int(node.attrs["keepdims"])
        if axes_input_from <= ex.opset:
            return ex.emit(onnx_type, [ins[0], ex.const(np.asarray(axes, np.int64))],
                           keepdims=keep)
        return ex.emit(onnx_type, [ins[0]], axes=axes, keepdims=keep)
    return OnnxForm(onnx_type, convert=convert, export=export)


def _reduction(name, fn, doc, onnx_type, axes_input_from, code, of_nothing=True):
    """A reduction; ``of_nothing``: whether it has a value over no elements (a sum's 0, a
    mean's NaN): a maximum or minimum over an axis of length 0 is a type error. A float sum
    or mean adds in float64 and rounds once, as its kernel does."""
    def sem(x, *, axis, keepdims, exclude, _fn=fn):
        axes = reduce_axes(x.ndim, axis, exclude)
        wide = {"dtype": np.float64} if x.dtype.kind == "f" and code in (0, 1) else {}
        with warnings.catch_warnings():     # (a mean of nothing is NaN, as it should be)
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.asarray(_fn(x, axis=axes, keepdims=keepdims, **wide)).astype(x.dtype)

    def rel(types, attrs):
        t = tensor(types, 0, "data")
        empty = [i for i in reduce_axes(t.rank, attrs["axis"], attrs["exclude"])
                 if t.shape[i] == 0]
        if empty and not of_nothing:
            raise OpTypeError(f"{name} over axis {empty[0]}, of length 0, has no value", arg=0)
        return _reduce_rel(types, attrs)

    register(OpDef(name, inputs=("data",), props=frozenset({REDUCE}),
                   kernel="Reduce", kernel_params={"code": code},
                   attrs=(Attr("axis", OPT_INTS, None), Attr("keepdims", BOOL, False),
                          Attr("exclude", BOOL, False)),
                   onnx=(_reduce_onnx(name, onnx_type, axes_input_from),),
                   type_rel=rel, semantics=sem, doc=doc))


# (the kernel's code: kernels_fp32.reduce_middle)
_reduction("sum", np.sum, "sum over axis", "ReduceSum", 13, code=0)
_reduction("mean", np.mean, "mean over axis", "ReduceMean", 18, code=1)
_reduction("max", np.max, "maximum over axis", "ReduceMax", 18, code=2, of_nothing=False)
_reduction("min", np.min, "minimum over axis", "ReduceMin", 18, code=3, of_nothing=False)


def _softmax(x, *, axis):
    if not x.size:
        return x.copy()
    z = x.astype(np.float64)
    z = np.exp(z - z.max(axis=axis, keepdims=True))
    return (z / z.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _softmax_rel(types, attrs):
    t = float_input(types, attrs)
    norm_axis(attrs["axis"], t.rank)
    return t


def _softmax_from_onnx(op):
    def convert(im, attrs, ins):
        """Softmax (LogSoftmax) over one axis (opset >= 13); before opset 13 over the
        trailing axes from ``axis`` on, flattened into one."""
        x = im.value(ins[0])
        shape = im.type(x).shape
        axis = attrs.get("axis", -1 if im.opset >= 13 else 1)
        axis = axis + len(shape) if axis < 0 else axis
        if im.opset >= 13 or axis == len(shape) - 1:
            return im.call(op, x, axis=axis)
        flat = im.call("reshape", x, newshape=[int(np.prod(shape[:axis], dtype=np.int64)), -1])
        return im.call("reshape", im.call(op, flat, axis=-1), newshape=list(shape))
    return convert


register(OpDef("nn.softmax", inputs=("data",), attrs=(Attr("axis", INT, -1),),
               bounds=(0.0, 1.0),
               onnx=(OnnxForm("Softmax", convert=_softmax_from_onnx("nn.softmax"),
                              export=lambda ex, node, ins:
                              ex.emit("Softmax", ins, axis=node.attrs["axis"])),),
               kernel="Softmax",
               kernel_params={"rows": "softmax_rows"},
               type_rel=_softmax_rel, semantics=_softmax, doc="exp(x) / sum(exp(x)) over axis"))


def _log_softmax(x, *, axis):
    if not x.size:
        return x.copy()
    z = x.astype(np.float64)
    z = z - z.max(axis=axis, keepdims=True)
    return (z - np.log(np.exp(z).sum(axis=axis, keepdims=True))).astype(x.dtype)


register(OpDef("nn.log_softmax", inputs=("data",), attrs=(Attr("axis", INT, -1),),
               onnx=(OnnxForm("LogSoftmax", convert=_softmax_from_onnx("nn.log_softmax"),
                              export=lambda ex, node, ins:
                              ex.emit("LogSoftmax", ins, axis=node.attrs["axis"])),),
               kernel="Softmax",
               kernel_params={"rows": "log_softmax_rows"},
               type_rel=_softmax_rel, semantics=_log_softmax,
               doc="x - log(sum(exp(x))) over axis, in float64 (a classifier's log-probabilities)"))
