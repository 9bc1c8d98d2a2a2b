"""Ops that select, split and repeat: strided_slice, split, broadcast_to, tile, take (Relay's
names and semantics) and take_at (take at run-time indices), each with its ONNX forms (Slice,
Split, Expand, Tile, Gather)."""
from __future__ import annotations

import numpy as np

from ..core.types import Dim, SizeUnknown, TensorType, TupleType
from ..errors import EvalError
from .attrs import INT, INTS, OPT_INTS, REQUIRED, Attr
from .onnx_conventions import OnnxFormError
from .registry import LAYOUT, OnnxForm, OpDef, OpTypeError, register
from .typerel import broadcast_shapes, norm_axis, tensor

INT64_MAX = 2 ** 63 - 1


# ---- strided_slice ---------------------------------------------------------------------------

def _slices(shape, begin, end, strides, axes):
    """One Python slice per axis (Python's and ONNX's clamping rules are the same)."""
    rank = len(shape)
    if axes is None and len(begin) > rank:
        raise OpTypeError(f"{len(begin)} begin values for a tensor of rank {rank}", 0)
    axes = list(range(len(begin))) if axes is None else [norm_axis(a, rank) for a in axes]
    strides = [1] * len(begin) if strides is None else list(strides)
    if not len(begin) == len(end) == len(strides) == len(axes) or len(set(axes)) != len(axes):
        raise OpTypeError(f"begin {list(begin)}, end {list(end)}, strides {strides} and axes "
                          f"{axes} must have one entry per axis, each axis once", 0)
    if any(s == 0 for s in strides):
        raise OpTypeError("a stride of 0", 0)
    out = [slice(None)] * rank
    for a, b, e, s in zip(axes, begin, end, strides):
        out[a] = slice(b, e, s)
    return tuple(out)


def _strided_slice_rel(types, attrs):
    t = tensor(types, 0, "data")
    cut = _slices(t.shape, attrs["begin"], attrs["end"], attrs["strides"], attrs["axes"])
    return TensorType(tuple(_sliced(s, d) for s, d in zip(cut, t.shape)), t.dtype)


def _sliced(s: slice, d):
    """The length of ``range(d)[s]``; for a size known only at run time (a Dim), where it
    is the same expression for every size: the axis untouched, or cut with step 1 from a
    start to an end that are both counted from the same side (else SizeUnknown)."""
    if not isinstance(d, Dim):
        return len(range(*s.indices(d)))
    if s == slice(None) or (s.start in (None, 0) and s.step in (None, 1) and
                            (s.stop is None or s.stop >= INT64_MAX)):
        return d
    start, stop, step = s.start or 0, s.stop, s.step or 1
    if step == 1 and stop is not None and start >= 0 and stop >= 0 and stop < INT64_MAX:
        return max(min(stop, d) - start, 0)       # (decided where d >= stop holds always)
    if step == 1 and start < 0 and (stop is None or stop >= INT64_MAX):
        return min(-start, d)
    if step == 1 and start >= 0 and stop is not None and stop < 0:
        return max(d + stop - start, 0)
    raise SizeUnknown(f"a slice {start}:{stop}:{step} of {d}")


def _strided_slice_view(x, *, begin, end, strides, axes):
    """The slice as a view of ``x`` (the runtime copies it: ``bindings.StridedCopy``)."""
    return x[_slices(x.shape, begin, end, strides, axes)]


def _strided_slice(x, **attrs):
    return np.ascontiguousarray(_strided_slice_view(x, **attrs))


def _slice_from_onnx(im, attrs, ins):
    """Slice (opset >= 10: starts, ends, axes, steps as constant inputs)."""
    if im.opset < 10:
        begin, end = list(attrs["starts"]), list(attrs["ends"])
        axes, steps = attrs.get("axes"), None
        axes = list(axes) if axes is not None else None
    else:
        begin = im.const_ints(ins[1], "Slice's starts")
        end = im.const_ints(ins[2], "Slice's ends")
        axes = im.const_ints(ins[3], "Slice's axes") if len(ins) > 3 and ins[3] else None
        steps = im.const_ints(ins[4], "Slice's steps") if len(ins) > 4 and ins[4] else None
    clamp = lambda v: [max(min(int(i), INT64_MAX), -INT64_MAX) for i in v]  # noqa: E731
    return im.call("strided_slice", im.value(ins[0]), begin=clamp(begin), end=clamp(end),
                   strides=steps, axes=axes)


def _slice_to_onnx(ex, node, ins):
    a = node.attrs
    n = len(a["begin"])
    axes = a["axes"] if a["axes"] is not None else list(range(n))
    steps = a["strides"] if a["strides"] is not None else [1] * n
    const = lambda v: ex.const(np.asarray(v, np.int64))  # noqa: E731
    return ex.emit("Slice", [ins[0], const(a["begin"]), const(a["end"]), const(axes),
                             const(steps)])


register(OpDef("strided_slice", inputs=("data",), props=frozenset({LAYOUT}),
               attrs=(Attr("begin", INTS, REQUIRED), Attr("end", INTS, REQUIRED),
                      Attr("strides", OPT_INTS, None), Attr("axes", OPT_INTS, None)),
               type_rel=_strided_slice_rel, semantics=_strided_slice,
               kernel="StridedCopy",
               kernel_params={"view": _strided_slice_view},
               onnx=(OnnxForm("Slice", convert=_slice_from_onnx, export=_slice_to_onnx),),
               doc="x[begin:end:strides] on axes (all leading axes when axes is None); "
                   "indices clamp as Python's and ONNX's do"))


# ---- split -----------------------------------------------------------------------------------

def _pieces(dim: int, indices) -> list[tuple[int, int]]:
    bounds = [0, *indices, dim]
    if any(b < 0 or b > dim for b in indices) or any(x > y for x, y in zip(bounds, bounds[1:])):
        raise OpTypeError(f"split points {list(indices)} must rise within 0..{dim}", 0)
    return list(zip(bounds, bounds[1:]))


def _split_rel(types, attrs):
    t = tensor(types, 0, "data")
    axis = norm_axis(attrs["axis"], t.rank)
    return TupleType(tuple(
        TensorType(t.shape[:axis] + (hi - lo,) + t.shape[axis + 1:], t.dtype)
        for lo, hi in _pieces(t.shape[axis], attrs["indices"])))


def _split(x, *, indices, axis):
    axis = axis % x.ndim
    return tuple(np.ascontiguousarray(np.take(x, range(lo, hi), axis=axis))
                 for lo, hi in _pieces(x.shape[axis], indices))


def _split_from_onnx(im, attrs, ins):
    """Split into the sizes given (input from opset 13, attribute before), or into as many
    equal parts as the node has outputs (num_outputs from opset 18)."""
    x = im.value(ins[0])
    shape = im.type(x).shape
    axis = attrs.get("axis", 0)
    if not -len(shape) <= axis < len(shape):
        raise OnnxFormError(f"axis {axis} is out of range for rank {len(shape)}")
    axis %= len(shape)
    if len(ins) > 1 and ins[1]:
        sizes = im.const_ints(ins[1], "Split's split")
    elif "split" in attrs:
        sizes = list(attrs["split"])
    else:
        n = attrs.get("num_outputs", im.n_outputs)
        step = -(-shape[axis] // n)
        sizes = [min(step, shape[axis] - i * step) for i in range(n)]
    if sum(sizes) != shape[axis] or any(s < 0 for s in sizes):
        raise OnnxFormError(f"split sizes {sizes} do not add up to the axis' {shape[axis]}")
    parts = im.call("split", x, indices=[int(v) for v in np.cumsum(sizes[:-1])],
                    axis=axis)
    return [im.b.get(parts, i) for i in range(len(sizes))]


def _split_to_onnx(ex, node, ins):
    shape = ex.type(node.args[0]).shape
    axis = node.attrs["axis"] % len(shape)
    sizes = [hi - lo for lo, hi in _pieces(shape[axis], node.attrs["indices"])]
    return ex.emit_many("Split", [ins[0], ex.const(np.asarray(sizes, np.int64))], len(sizes),
                        axis=axis)


register(OpDef("split", inputs=("data",),
               attrs=(Attr("indices", INTS, REQUIRED), Attr("axis", INT, 0)),
               type_rel=_split_rel, semantics=_split,
               onnx=(OnnxForm("Split", convert=_split_from_onnx, export=_split_to_onnx),),
               doc="a tuple of the pieces between the split points indices along axis"))


# ---- broadcast_to, tile ----------------------------------------------------------------------

def _broadcast_to_rel(types, attrs):
    t = tensor(types, 0, "data")
    shape = tuple(attrs["shape"])
    if any(d < 0 for d in shape) or broadcast_shapes(t.shape, shape) != shape:
        raise OpTypeError(f"{t.shape} does not broadcast to {shape}", 0)
    return TensorType(shape, t.dtype)


def _expand_from_onnx(im, attrs, ins):
    """Expand broadcasts both ways: the result's shape is the broadcast of the two."""
    x = im.value(ins[0])
    want = im.const_ints(ins[1], "Expand's shape")
    shape = broadcast_shapes(im.type(x).shape, tuple(want))
    if shape is None:
        raise OnnxFormError(f"{im.type(x).shape} and {tuple(want)} do not broadcast")
    return im.call("broadcast_to", x, shape=list(shape))


register(OpDef("broadcast_to", inputs=("data",), props=frozenset({LAYOUT}),
               attrs=(Attr("shape", INTS, REQUIRED),), type_rel=_broadcast_to_rel,
               kernel="Spread",
               semantics=lambda x, *, shape: np.ascontiguousarray(np.broadcast_to(x, shape)),
               onnx=(OnnxForm("Expand", convert=_expand_from_onnx, export=lambda ex, node, ins:
                              ex.emit("Expand", [ins[0], ex.const(np.asarray(
                                  node.attrs["shape"], np.int64))])),),
               doc="numpy broadcasting of data to shape"))


def _tile_rel(types, attrs):
    t = tensor(types, 0, "data")
    reps = list(attrs["reps"])
    if len(reps) != t.rank or any(r < 0 for r in reps):
        raise OpTypeError(f"reps {reps} needs one non-negative count per axis of {t}", 0)
    return TensorType(tuple(d * r for d, r in zip(t.shape, reps)), t.dtype)


register(OpDef("tile", inputs=("data",), props=frozenset({LAYOUT}),
               attrs=(Attr("reps", INTS, REQUIRED),), type_rel=_tile_rel,
               semantics=lambda x, *, reps: np.tile(x, reps),
               onnx=(OnnxForm("Tile", convert=lambda im, attrs, ins: im.call(
                   "tile", im.value(ins[0]), reps=im.const_ints(ins[1], "Tile's repeats")),
                   export=lambda ex, node, ins: ex.emit("Tile", [ins[0], ex.const(
                       np.asarray(node.attrs["reps"], np.int64))])),),
               doc="repeat data reps[i] times along each axis i"))


# ---- take (ONNX Gather with constant indices) ------------------------------------------------

def _take_rel(types, attrs):
    t = tensor(types, 0, "data")
    axis = norm_axis(attrs["axis"], t.rank)
    n = t.shape[axis]
    if any(not -n <= i < n for i in attrs["indices"]):
        raise OpTypeError(f"indices {list(attrs['indices'])} out of range for axis {axis} "
                          f"of size {n}", 0)
    return TensorType(t.shape[:axis] + (len(attrs["indices"]),) + t.shape[axis + 1:], t.dtype)


def _gather_from_onnx(im, attrs, ins):
    """Gather with constant indices: a scalar index is a one-element slice with its axis
    squeezed away (ViT's class token), a vector of indices is take. Indices computed at run
    time (token IDs into an embedding table) are take_at."""
    x = im.value(ins[0])
    rank = im.type(x).rank
    axis = attrs.get("axis", 0)
    if not -rank <= axis < rank:
        raise OnnxFormError(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    if ins[1] not in im.consts:
        return im.call("take_at", x, im.value(ins[1]), axis=axis)
    idx = np.asarray(im.const(ins[1], "Gather's indices"))
    if idx.dtype.kind not in "iu" or idx.ndim > 1:
        raise OnnxFormError(f"Gather's indices must be an integer scalar or vector, got "
                            f"{idx.dtype} of shape {idx.shape}")
    if idx.ndim == 0:
        i = int(idx) % im.type(x).shape[axis] if im.type(x).shape[axis] else int(idx)
        part = im.call("strided_slice", x, begin=[i], end=[i + 1], axes=[axis])
        return im.call("squeeze", part, axis=[axis])
    return im.call("take", x, indices=[int(v) for v in idx], axis=axis)


register(OpDef("take", inputs=("data",), attrs=(Attr("indices", INTS, REQUIRED),
                                                Attr("axis", INT, 0)),
               type_rel=_take_rel,
               semantics=lambda x, *, indices, axis: np.take(x, indices, axis=axis),
               onnx=(OnnxForm("Gather", convert=_gather_from_onnx, export=lambda ex, node, ins:
                              ex.emit("Gather", [ins[0], ex.const(np.asarray(
                                  node.attrs["indices"], np.int64))], axis=node.attrs["axis"])),),
               doc="the slices at indices along axis (constant indices; negative count from "
                   "the end)"))


# ---- take_at (ONNX Gather with run-time indices: an embedding look-up) -------------------------

def _indexed(types, attrs) -> tuple[TensorType, TensorType, int]:
    """The data, the run-time indices (int32 or int64) and the axis of take_at and gather."""
    t = tensor(types, 0, "data")
    idx = tensor(types, 1, "indices")
    if idx.dtype not in ("int32", "int64"):
        raise OpTypeError(f"indices must be int32 or int64, not {idx.dtype}", 1)
    return t, idx, norm_axis(attrs["axis"], t.rank)


def _in_range(indices: np.ndarray, n: int, op: str, axis: int) -> np.ndarray:
    """Run-time indices into an axis of ``n``, negative ones counted from its end, as int64;
    one outside [-n, n) is an error, as ONNX says (numpy would raise an IndexError, or wrap
    with mode="wrap")."""
    bad = (indices < -n) | (indices >= n)
    if bad.any():
        raise EvalError(f"{op}: index {int(indices[bad].reshape(-1)[0])} is out of range "
                        f"for axis {axis} of size {n}")
    return np.where(indices < 0, indices + n, indices).astype(np.int64)


def _take_at_rel(types, attrs):
    t, idx, axis = _indexed(types, attrs)
    if t.shape[axis] == 0:
        raise OpTypeError(f"axis {axis} has no elements to take", 0)
    return TensorType(t.shape[:axis] + idx.shape + t.shape[axis + 1:], t.dtype)


def _take_at(x, indices, *, axis):
    """np.take, each index checked (``_in_range``)."""
    axis %= x.ndim
    return np.take(x, _in_range(indices, x.shape[axis], "take_at", axis), axis=axis)


register(OpDef("take_at", inputs=("data", "indices"), attrs=(Attr("axis", INT, 0),),
               type_rel=_take_at_rel, semantics=_take_at, kernel="TakeAt",
               onnx=(OnnxForm("Gather", reads=False, export=lambda ex, node, ins: ex.emit(
                   "Gather", ins, axis=node.attrs["axis"])),),
               doc="the slices of data at indices computed at run time, along axis (an "
                   "embedding look-up; the result's axis is the indices' shape; negative "
                   "indices count from the end, others outside the axis are an error)"))


# ---- gather (ONNX GatherElements; Relay's gather, PyTorch's torch.gather) -----------------

def _gather_rel(types, attrs):
    t, idx, axis = _indexed(types, attrs)
    if idx.rank != t.rank or any(i > d for k, (i, d) in enumerate(zip(idx.shape, t.shape))
                                 if k != axis):
        raise OpTypeError(f"indices {idx} must have data's rank and no larger a size on "
                          f"any axis but {axis}; data is {t}", 1)
    return TensorType(idx.shape, t.dtype)


def _gather(x, indices, *, axis):
    """out[..., i, ...] = data[..., indices[..., i, ...], ...] along ``axis`` (numpy's
    take_along_axis over data cut to the indices' shape on the other axes), each index
    checked (``_in_range``)."""
    axis %= x.ndim
    cut = x[tuple(slice(None) if k == axis else slice(0, d)
                  for k, d in enumerate(indices.shape))]
    return np.take_along_axis(cut, _in_range(indices, x.shape[axis], "gather", axis),
                              axis=axis)


register(OpDef("gather", inputs=("data", "indices"), attrs=(Attr("axis", INT, 0),),
               type_rel=_gather_rel, semantics=_gather,
               onnx=(OnnxForm("GatherElements", (("axis", "axis", 0),)),),
               doc="the elements of data at indices along axis, the other axes as they are "
                   "(torch.gather; ONNX GatherElements)"))
