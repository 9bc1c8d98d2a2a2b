"""ONNX models to the text IR: ``eqquant import MODEL.onnx -o DIR``.

    mod, params, notes = import_onnx("resnet18.onnx", shapes={"input": (1, 3, 224, 224)})

Each ONNX node is read by the ONNX form (``OpDef.onnx``) of the registry op that claims its
op type, built through :class:`~eqquant.ir.builder.Builder`, so every node is type-checked as
it is made. Initializers become params (named as in the file); value names are kept, made valid
for the text IR where they are not (``input.1`` -> ``input_1``; purely numeric names are left
to the printer's numbering). A node whose inputs are all known constants (PyTorch's
``Shape -> Gather -> Concat`` chains feeding a Reshape, for example) is evaluated at import
with ONNX's own reference evaluator; ``Shape`` of a value is known from its type. A dimension
the file leaves symbolic stays open (``dim_param`` "batch" is the size ``?batch``, shared by
the inputs that name it); the shape arithmetic over such sizes is folded over them
(``_fold_sizes``), so a Reshape to them reads as ``reshape(x, newshape=[?batch, 4, ?seq, 64])``.

Every failure is an :class:`OnnxImportError` naming the file, the node (index, name, op) and
what was expected: an op without a converter, an attribute value eqquant cannot express, shape
arithmetic that holds at some sizes only, a malformed file.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import EqquantError
from ..ir.builder import Builder
from ..core.nodes import Call, Expr, Var
from ..core.types import DTYPES, Dim, SizeUnknown, TensorType
from ..ops.onnx_conventions import OnnxFormError
from ..ops.registry import onnx_forms


class OnnxImportError(EqquantError):
    kind = "import error"


_LOCAL = re.compile(r"[A-Za-z_]\w*(?:(?:(?:::|\.)\w+)*(?:::|\.)\d*[A-Za-z_]\w*)?")


def valid_name(name: str) -> str | None:
    """A text-IR name for an ONNX value name; None for a purely numeric one (numbered by the
    printer). ``input.1`` -> ``input_1``, ``/layer1/conv/Conv_output_0`` ->
    ``layer1_conv_Conv_output_0``, ``onnx::Conv_12`` -> ``onnx::Conv_12``."""
    if _LOCAL.fullmatch(name):
        return name
    if name.isdigit() or not name:
        return None
    out = re.sub(r"\W+", "_", name).strip("_") or "v"
    return out if _LOCAL.fullmatch(out) else "v_" + out


# ---------------------------------------------------------------------------------------------


class Importer:
    def __init__(self, model, source: str, shapes: Mapping[str, tuple[int, ...]] | None):
        from onnx import numpy_helper
        self.model = model
        self.source = source
        self.forms = onnx_forms()   # ONNX op type -> (op, form), from the registry
        self.n_outputs = 1          # the outputs of the node being read
        self.shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        self.b = Builder()
        self.values: dict[str, Expr] = {}            # ONNX name -> IR value
        self.consts: dict[str, np.ndarray] = {}      # ONNX name -> known constant
        self.missing: dict[str, str] = {}            # outputs eqquant does not produce
        self.used: set[str] = set()
        self.notes: list[str] = []
        self.input_names: dict[str, str] = {}         # ONNX input name -> text-IR name
        self.sizes: dict[str, Dim] = {}               # ONNX dim_param -> the size it names
        self.anonymous_sizes = 0
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          1)
        for init in model.graph.initializer:
            size = int(np.prod(list(init.dims), dtype=object))
            if size > MAX_INITIALIZER_ELEMENTS:
                raise OnnxImportError(f"{source}: initializer '{init.name[:80]}' has {size:.3g} "
                                      f"elements, more than {MAX_INITIALIZER_ELEMENTS:.3g}")
            try:
                arr = numpy_helper.to_array(init)
            except Exception as e:  # noqa: BLE001 - onnx raises many kinds on a bad tensor
                raise OnnxImportError(f"{source}: initializer '{init.name[:80]}' cannot be "
                                      f"read ({e})") from None
            _check_dtype(arr.dtype, f"{source}: initializer '{init.name[:80]}'")
            self.consts[init.name] = arr

    # -- names and values ---------------------------------------------------------------------

    def size(self, dim_param: str) -> Dim:
        """The size an input's symbolic dimension names: inputs that give one dim_param share
        it (``?batch``); a dimension with none is a size of its own (``?``)."""
        if not dim_param:
            self.anonymous_sizes += 1
            return Dim.named(f"_{self.anonymous_sizes}")
        if dim_param not in self.sizes:
            name = re.sub(r"\W", "_", dim_param)
            name = name if re.match(r"[A-Za-z_]", name) else "d" + name
            taken = {str(d) for d in self.sizes.values()}
            base, i = name, 1
            while f"?{name}" in taken:
                i += 1
                name = f"{base}_{i}"
            self.sizes[dim_param] = Dim.named(name)
        return self.sizes[dim_param]

    def fresh_name(self, onnx_name: str) -> str | None:
        name = valid_name(onnx_name)
        if name is None:
            return None
        base, i = name, 1
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name

    def value(self, name: str) -> Expr:
        """The IR value of an ONNX name; an initializer becomes a param on first use, or an
        inline literal when it holds one number of rank 0 (as Relay's frontend writes
        ``1.41421f``: rules match literals by value, and GELU's constants are such)."""
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            arr = self.consts[name]
            if arr.ndim == 0 and arr.dtype.kind in "iuf":
                v = self.values[name] = self.b.scalar(arr.item(), str(arr.dtype))
                return v
            v = self.b.param(self.fresh_name(name) or f"const_{len(self.values)}", arr)
            self.values[name] = v
            return v
        if name in self.missing:
            raise OnnxFormError(self.missing[name])
        raise OnnxFormError(f"input '{name}' is not produced by any node, initializer or input")

    def const(self, name: str, what: str) -> np.ndarray:
        if name not in self.consts:
            raise OnnxFormError(f"{what} ('{name}') must be a constant (an initializer, a "
                                "Constant node or computed from them), not a value computed "
                                "at run time")
        return self.consts[name]

    def const_ints(self, name: str, what: str) -> list[int]:
        """A constant that must be a vector (or a scalar) of integers."""
        v = np.asarray(self.const(name, what))
        if v.ndim > 1 or v.dtype.kind not in "iu":
            raise OnnxFormError(f"{what} must be a vector of integers, got {v.dtype} of shape "
                             f"{list(v.shape)}")
        return [int(x) for x in v.reshape(-1)]

    def const_sizes(self, name: str, what: str, data_shape) -> list:
        """A shape given as a constant whose sizes may be known only at run time (computed
        from a Shape of a value with open sizes): such a size becomes 0 where it is the
        data's own size at that axis (ONNX's and Relay's "copy"), or -1 (inferred) where it
        is the only other one; else it stays a size (a Dim: ``reshape(x, newshape=[?b, 4,
        ?s, 64])``)."""
        v = np.asarray(self.const(name, what))
        if v.dtype != object:
            return self.const_ints(name, what)
        out: list = []
        for i, d in enumerate(v.reshape(-1)):
            if isinstance(d, Dim):
                out.append(0 if i < len(data_shape) and data_shape[i] == d else d)
            else:
                out.append(int(d))
        open_ = [d for d in out if isinstance(d, Dim)]
        if len(open_) == 1 and -1 not in out:
            return [-1 if isinstance(d, Dim) else d for d in out]
        return out          # (the sizes themselves: reshape's newshape holds them)

    def const_scalar(self, name: str, what: str) -> float:
        """A constant that must hold one number."""
        v = np.asarray(self.const(name, what))
        if v.size != 1 or v.dtype.kind not in "iufb":
            raise OnnxFormError(f"{what} must be one number, got {v.dtype} of shape "
                             f"{list(v.shape)}")
        return float(v.reshape(()))

    def type(self, e: Expr) -> TensorType:
        t = self.b._types.expr(e)
        if not isinstance(t, TensorType):
            raise OnnxFormError(f"expected a tensor, got {t}")
        return t

    def dtype(self, onnx_type: int, what: str) -> str:
        """An ONNX element type (TensorProto enum) as an IR dtype, or a located error."""
        from onnx import helper
        try:
            dtype = str(helper.tensor_dtype_to_np_dtype(onnx_type))
        except (KeyError, ValueError, TypeError):
            raise OnnxFormError(f"{what}: unknown ONNX element type {onnx_type}") from None
        if dtype not in DTYPES:
            raise OnnxFormError(f"{what}: {dtype} is not a dtype eqquant has "
                                f"({', '.join(DTYPES)})")
        return dtype

    def call(self, op: str, *args: Expr, **attrs: Any) -> Call:
        return self.b.call(op, *args, **attrs)

    def scalar(self, value: float, like: Expr) -> Expr:
        return self.b.scalar(value, self.type(like).dtype)

    # -- the graph ----------------------------------------------------------------------------

    def inputs(self) -> None:
        from onnx import helper
        for vi in self.model.graph.input:
            if vi.name in self.consts:     # old exporters list initializers as inputs too
                continue
            tt = vi.type.tensor_type
            try:
                dtype = str(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            except Exception:  # noqa: BLE001 - onnx raises KeyError or ValueError
                raise OnnxImportError(f"{self.source}: input '{vi.name}' has an element type "
                                      f"eqquant cannot read ({tt.elem_type})") from None
            _check_dtype(dtype, f"{self.source}: input '{vi.name}'")
            if vi.name in self.shapes:
                shape = self.shapes[vi.name]
                declared = len(tt.shape.dim) if tt.HasField("shape") else None
                if declared is not None and len(shape) != declared:
                    raise OnnxImportError(
                        f"{self.source}: --shape {vi.name}=... gives {len(shape)} dimensions; "
                        f"the model's input '{vi.name}' has {declared}")
                for i, (d, given) in enumerate(zip(tt.shape.dim, shape)):
                    if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != given:
                        raise OnnxImportError(
                            f"{self.source}: --shape {vi.name}=... gives dimension {i} as "
                            f"{given}; the model fixes it at {d.dim_value}")
            else:
                shape = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                              else self.size(d.dim_param) for d in tt.shape.dim)
            name = self.fresh_name(vi.name) or f"input{len(self.b.params)}"
            self.values[vi.name] = self.b.input(name, shape, dtype)
            self.input_names[vi.name] = name
        unknown = sorted(set(self.shapes) - set(self.input_names))
        if unknown:
            raise OnnxImportError(f"{self.source}: --shape names {', '.join(unknown)}, which "
                                  f"the model does not take as an input (its inputs: "
                                  f"{', '.join(self.input_names) or 'none'})")

    def node(self, index: int, node) -> None:
        from onnx import helper
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        ins = list(node.input)
        domain_ok = node.domain in ("", "ai.onnx")
        if domain_ok and node.op_type == "Shape" and ins[0] in self.values:
            self.consts[node.output[0]] = _shape_slice(
                self.type(self.values[ins[0]]).shape, attrs)
            return
        if domain_ok and node.op_type == "Constant":
            self.consts[node.output[0]] = _constant_value(attrs)
            return
        if domain_ok and ins and all(not n or n in self.consts for n in ins):
            self._fold(node, ins)
            return
        form = self.forms.get(node.op_type) if domain_ok else None
        if form is None:
            raise OnnxFormError(f"op {node.op_type}"
                                + (f" of domain '{node.domain}'" if not domain_ok else "")
                                + " is not supported (supported: "
                                + ", ".join(sorted(self.forms)) + ")")
        op, how = form           # the op whose registry entry reads this ONNX op, and how
        self.n_outputs = len(node.output)
        outs = how.read(self, op, attrs, ins)
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for i, name in enumerate(node.output):
            if not name:
                continue
            if i >= len(outs) or outs[i] is None:
                self.missing[name] = (f"output {i} of {node.op_type} node '{node.name}' "
                                      "is not supported (only its first output is)")
                continue
            e = outs[i]
            label = None if isinstance(e, Var) or getattr(e, "name", None) else \
                self.fresh_name(name)
            if label and isinstance(e, Call):
                e = replace(e, name=label)
                self.type(e)
            self.values[name] = e

    def _fold(self, node, ins) -> None:
        """Evaluate a node whose inputs are all constants with ONNX's reference evaluator:
        only ops without control flow or subgraphs, and only when the result's size is known
        beforehand to be bounded (a tiny file must not make import allocate gigabytes)."""
        from onnx.reference import ReferenceEvaluator
        if node.op_type not in FOLDABLE:
            raise OnnxFormError(f"a constant {node.op_type} is not evaluated at import (only "
                             f"{', '.join(sorted(FOLDABLE))} are)")
        feeds = {n: self.consts[n] for n in ins if n}
        if any(np.asarray(a).dtype == object for a in feeds.values()):
            outs = _fold_sizes(node, [self.consts[n] if n else None for n in ins],
                               self.opset)
            self.consts.update((n, _settled(a)) for n, a in zip(node.output, outs) if n)
            return
        bound = _folded_size(node.op_type, [self.consts[n] if n else None for n in ins])
        if bound > MAX_CONST_ELEMENTS:
            raise OnnxFormError(f"the constant it computes would have {bound:.3g} elements, more "
                             f"than {MAX_CONST_ELEMENTS:.3g}")
        try:
            outs = ReferenceEvaluator(node).run(None, feeds)
        except Exception as e:  # noqa: BLE001 - any failure of the reference is reported
            raise OnnxFormError(f"cannot evaluate this constant node ({e})") from None
        for name, arr in zip(node.output, outs):
            if name:
                arr = np.asarray(arr)
                _check_dtype(arr.dtype, f"the constant '{name[:80]}' it computes")
                self.consts[name] = arr

    def run(self):
        graph = self.model.graph
        self.inputs()
        for index, node in enumerate(graph.node):
            try:
                self.node(index, node)
            except (OnnxFormError, EqquantError) as e:
                msg = e.args[0] if isinstance(e, OnnxFormError) else e.message
                raise OnnxImportError(f"{self.source}: node {index} '{node.name}' "
                                      f"({node.op_type}): {msg}") from None
        outs = []
        for vi in graph.output:
            if vi.name in self.consts and vi.name not in self.values:
                raise OnnxImportError(f"{self.source}: output '{vi.name}' is a constant; "
                                      "eqquant programs compute their outputs from inputs")
            try:
                outs.append(self.value(vi.name))
            except OnnxFormError as e:
                raise OnnxImportError(f"{self.source}: output '{vi.name}': {e.args[0]}") \
                    from None
        if not outs:
            raise OnnxImportError(f"{self.source}: the graph has no outputs")
        body = outs[0] if len(outs) == 1 else self.b.tuple(*outs)
        mod, params = self.b.finish(body)
        return mod, params


# Constant subgraphs (PyTorch's Shape -> Gather -> Concat -> Reshape chains) are evaluated at
# import. Only these ops, none with control flow; a result larger than this is refused.
MAX_CONST_ELEMENTS = 1 << 26
# An initializer's data is in the file; still, one of more than 1 GB of float32 is refused
# (VGG's first classifier layer, the largest of the torchvision zoo, holds 1.03e8).
MAX_INITIALIZER_ELEMENTS = 1 << 28
FOLDABLE = frozenset({
    "Abs", "Add", "And", "Cast", "Ceil", "Concat", "ConstantOfShape", "Div", "Equal", "Exp",
    "Expand", "Flatten", "Floor", "Gather", "Greater", "Identity", "Less", "Max", "Min",
    "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Range", "Reciprocal", "ReduceMax", "ReduceMin",
    "ReduceProd", "ReduceSum", "Relu", "Reshape", "Shape", "Sigmoid", "Size", "Slice",
    "Sqrt", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where"})


def _folded_size(op: str, ins: list) -> float:
    """An upper bound on the number of elements a constant op produces, from its inputs."""
    sizes = [np.size(a) for a in ins if a is not None]
    largest = float(max(sizes, default=1))
    try:
        if op == "ConstantOfShape":
            return float(np.prod(np.asarray(ins[0], np.float64)))
        if op == "Expand":
            shape = np.asarray(ins[1], np.float64).reshape(-1)
            return float(np.prod(np.maximum(shape, 1))) * largest
        if op == "Tile":
            return float(np.size(ins[0])) * float(np.prod(np.abs(np.asarray(ins[1],
                                                                              np.float64))))
        if op == "Range":
            start, limit, delta = (float(np.reshape(a, -1)[0]) for a in ins[:3])
            return abs((limit - start) / delta) + 1 if delta else math.inf
        if op == "Reshape":
            return float(np.size(ins[0]))
    except (TypeError, ValueError, IndexError, OverflowError):
        return math.inf
    return largest * max(len(sizes), 1) if op == "Concat" else largest


def _check_dtype(dtype, what: str) -> None:
    name = str(dtype)
    if name not in DTYPES:
        raise OnnxImportError(f"{what} has element type {name}, which eqquant cannot hold "
                              f"(it holds {', '.join(DTYPES)})")


def _fold_sizes(node, ins: list, opset: int) -> list[np.ndarray]:
    """A constant node over shapes holding sizes known only at run time (object arrays of
    ints and Dims: ``_shape_slice``), evaluated on them: the shape arithmetic an exporter
    writes between a Shape and the Reshape it feeds (Gather, Unsqueeze, Concat, Slice,
    Mul, Div, ...). Anything else, or a question whose answer depends on a size, is an
    OnnxFormError naming the op."""
    from onnx import helper
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    a = [np.asarray(x, dtype=object) if x is not None else None for x in ins]

    def axes_of(i: int):
        return [int(v) for v in (attrs["axes"] if "axes" in attrs else
                                 (np.asarray(ins[i]).reshape(-1) if len(ins) > i and
                                  ins[i] is not None else []))]
    try:
        if op == "Gather":
            return [np.take(a[0], np.asarray(ins[1], np.int64), axis=attrs.get("axis", 0))]
        if op == "Unsqueeze":
            out = a[0]
            for ax in sorted(x % (out.ndim + len(axes_of(1))) for x in axes_of(1)):
                out = np.expand_dims(out, ax)
            return [out]
        if op == "Squeeze":
            axes = axes_of(1)
            return [np.squeeze(a[0], axis=tuple(axes) if axes else None)]
        if op == "Concat":
            return [np.concatenate([x for x in a if x is not None], axis=attrs["axis"])]
        if op == "Slice":
            if a[0].ndim != 1:
                raise OnnxFormError("a Slice of sizes known only at run time is read on a "
                                    "vector only")
            start, end = (int(np.reshape(ins[k], -1)[0]) for k in (1, 2))
            step = int(np.reshape(ins[4], -1)[0]) if len(ins) > 4 and ins[4] is not None \
                else 1
            return [a[0][slice(start, min(end, len(a[0])) if end >= 0 else end, step)]]
        if op == "Cast":
            if np.dtype(helper.tensor_dtype_to_np_dtype(attrs["to"])).kind not in "iu":
                raise OnnxFormError("a size known only at run time cast to a non-integer")
            return [a[0]]
        if op in ("Identity",):
            return [a[0]]
        if op == "Reshape" and np.asarray(ins[1]).dtype != object:
            shape = [d if d != 0 else a[0].shape[i]
                     for i, d in enumerate(np.asarray(ins[1], np.int64).reshape(-1).tolist())]
            return [a[0].reshape(shape)]
        if op in _SIZE_ARITHMETIC:
            return [np.asarray(np.frompyfunc(_SIZE_ARITHMETIC[op], 2, 1)(a[0], a[1]),
                               dtype=object)]
        if op == "Equal":
            return [np.asarray(np.frompyfunc(_size_equal, 2, 1)(a[0], a[1]), dtype=bool)]
        if op == "Where":
            return [np.where(np.asarray(ins[0], bool), a[1], a[2])]
    except SizeUnknown as e:
        raise OnnxFormError(f"its value depends on a size known only at run time ({e})") \
            from None
    raise OnnxFormError(f"a {op} of sizes known only at run time is not evaluated at import "
                        f"(fix the sizes with --shape NAME=...)")


def _settled(x) -> np.ndarray:
    """A folded value over sizes: an object array while it holds a Dim, else int64 (or the
    truth values it is)."""
    arr = np.asarray(x, dtype=object)
    if any(isinstance(v, Dim) for v in arr.reshape(-1)):
        return arr
    return np.asarray(arr.tolist(), dtype=bool if arr.size and all(
        isinstance(v, (bool, np.bool_)) for v in arr.reshape(-1)) else np.int64)


def _int_div(x, y):
    if isinstance(x, Dim) or isinstance(y, Dim):
        return x // y                      # (exact, else SizeUnknown)
    return int(np.trunc(x / y)) if y else 0


_SIZE_ARITHMETIC = {"Add": lambda x, y: x + y, "Sub": lambda x, y: x - y,
                    "Mul": lambda x, y: x * y, "Div": _int_div,
                    "Mod": lambda x, y: x % y}


def _size_equal(x, y) -> bool:
    """Whether two sizes are equal for every value, or never (a size is at least 1: never
    0 or -1); SizeUnknown otherwise."""
    if isinstance(x, Dim) == isinstance(y, Dim):
        if isinstance(x, Dim) and x != y:
            raise SizeUnknown(f"whether {x} == {y} depends on the size")
        return x == y
    other = y if isinstance(x, Dim) else x
    if int(other) < 1:
        return False
    raise SizeUnknown(f"whether {x} == {y} depends on the size")


def _shape_slice(shape, attrs) -> np.ndarray:
    """A Shape node's value: int64, or an object array where a size is known only at run time
    (a Dim), which the shape arithmetic after it (Gather, Concat, Mul) carries along."""
    symbolic = any(isinstance(d, Dim) for d in shape)
    arr = np.array(list(shape), dtype=object) if symbolic else np.asarray(shape, np.int64)
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return arr[start:end]


def _constant_value(attrs) -> np.ndarray:
    from onnx import numpy_helper
    if "value" in attrs:
        return numpy_helper.to_array(attrs["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32),
                       ("value_int", np.int64), ("value_ints", np.int64)):
        if key in attrs:
            return np.asarray(attrs[key], dtype)
    raise OnnxFormError(f"a Constant with {', '.join(attrs) or 'no value'} is not supported "
                     "(value, value_float(s), value_int(s) are)")


# ---------------------------------------------------------------------------------------------
# Converters of ONNX ops that are not one registry op's ONNX form (see OpDef.onnx): an ONNX op
# read as several IR ops, or with checks of its own: (importer, attrs, input names) -> value(s)

# ---------------------------------------------------------------------------------------------


def external_data_files(path: str | Path) -> list[Path]:
    """The files ``path``'s tensors keep their data in (ONNX's external data: a location
    relative to the model's folder), as ``onnx.load`` would read them; none where the model
    cannot be read (its loading reports that)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    path = Path(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # noqa: BLE001 - read_onnx names what is wrong with it
        return []

    def tensors(graph):
        yield from graph.initializer
        for node in graph.node:
            for a in node.attribute:
                yield from ([a.t] if a.HasField("t") else []) + list(a.tensors)
                for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from tensors(g)
    found: dict[str, Path] = {}
    for tensor in tensors(model.graph):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            found.setdefault(location, path.parent / location)
    return list(found.values())


def read_onnx(path: str | Path):
    """Load and check an ONNX file; every failure is an OnnxImportError naming the file."""
    import onnx
    path = Path(path)
    try:
        model = onnx.load(str(path))
    except FileNotFoundError:
        raise OnnxImportError(f"{path}: no such file") from None
    except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError and others
        raise OnnxImportError(f"{path}: not a readable ONNX model "
                              f"({type(e).__name__}: {e})") from None
    try:
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - ValidationError and friends
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{path}: not a valid ONNX model ({first})") from None
    return model


def import_onnx(model, shapes: Mapping[str, tuple[int, ...]] | None = None,
                source: str | None = None):
    """An ONNX model (a path or a ModelProto) as ``(module, params, notes)``; ``shapes``
    fixes input shapes the file leaves symbolic (else they stay open: ``?batch``)."""
    mod, params, im = run_importer(model, shapes, source)
    return mod, params, im.notes


def run_importer(model, shapes=None, source: str | None = None):
    """``(module, params, importer)``: the importer keeps the notes and the input names."""
    if isinstance(model, (str, Path)):
        source = source or str(model)
        model = read_onnx(model)
    im = Importer(model, source or "<onnx model>", shapes)
    mod, params = im.run()
    return mod, params, im
