"""The op registry: one entry per op, the single source of truth.

An entry gives the op's inputs, its attributes with kinds and defaults, its type relation
(shapes and dtypes of the result from those of the inputs), its reference semantics in numpy and
the property sets rules and cost models use to cover many ops at once. The parser, the type
checker, the interpreter, the e-graph schema, the runtime, the cost models, the ONNX importer and
exporter (float and QDQ), the quantization flow and the realize view all read it; adding an op is
one ``register(OpDef(...))`` call in ``eqquant/ops/*.py`` (plus its kernel function, if it has
one) and nothing else: ``tests/test_one_entry_op.py`` does it from a test file.

Worked example (``eqquant/ops/tensor.py``)::

    register(OpDef(
        "nn.leaky_relu", inputs=("data",), props=frozenset({ELEMWISE, UNARY}),
        attrs=(Attr("alpha", FLOAT_F, 0.25),), type_rel=float_input,
        semantics=lambda x, *, alpha: np.where(x >= 0, x, x * np.asarray(alpha, x.dtype)),
        kernel="Activation",          # the CPU kernel binding
        kernel_params={"code": LEAKY_RELU, "params": lambda a: (a["alpha"], 0.0)},
        onnx=(OnnxForm("LeakyRelu", (("alpha", "alpha", 0.01),)),),   # import and export
        doc="x where x >= 0, alpha * x elsewhere"))

Quantization roles are input names (``WEIGHT``, ``BIAS``, ``OUTPUT_SCALE``...); an op's QDQ
export is ``OnnxForm.qdq`` and its realize form ``OpDef.realize``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import AttrError, UnknownOpError
from ..core.types import Type
from .attrs import REQUIRED, Attr, AttrValueError

# Property sets: a rule or a cost model may name a set instead of listing ops.
ELEMWISE = "elementwise"   # output element i depends only on input element(s) i
UNARY = "unary"
BINARY = "binary"          # two inputs, numpy broadcasting
IDENTITY = "identity"      # semantically the identity on its first input (annotations)
ANNOTATION = "annotation"
POOL = "pool"
REDUCE = "reduce"
LAYOUT = "layout"          # moves data without arithmetic (reshape, transpose...)
COMPUTE = "compute"        # heavy ops: conv2d, dense
EPILOGUE = "epilogue"      # an activation a quantized op applies to its accumulator (relu, clip)
SELECTS = "selects"        # every output element is one of the input's elements (max pools)
QUANT = "quant"
LOGIC = "logic"            # takes truth values (bool) and gives them: logical_not, logical_and
# the attribute naming the kernel a call site runs on (an op that has one lists its kernels'
# names as the attribute's choices): it says how the op runs, never what it computes, so the
# reference semantics never see it (``register``)
KERNEL = "kernel"


# Quantization roles: an input with one of these names plays that part, whatever its
# position (the quantization flow, the annotator and the ONNX export read them by role).
WEIGHT = "weight"                        # a constant the annotator quantizes per channel
BIAS = "bias"                            # added to the accumulator (bounds its overflow)
OUTPUT_SCALE = "output_scale"            # the scale and zero point of an 8-bit result
OUTPUT_ZERO_POINT = "output_zero_point"
INPUT_SCALE = "input_scale"              # the scale of a quantized input (a QNN op)


def is_scale(input_name: str) -> bool:
    """Whether an input so named is a quantization scale ("scale", "*_scale"): a positive,
    finite number (each, per channel) wherever it is a literal; the type checker holds it,
    so that no engine divides by a zero scale."""
    return input_name == "scale" or input_name.endswith("_scale")


class OpTypeError(Exception):
    """Raised by a type relation; ``arg`` is the index of the offending input, if one is."""

    def __init__(self, message: str, arg: int | None = None):
        super().__init__(message)
        self.message = message
        self.arg = arg


TypeRel = Callable[[Sequence[Type], Mapping[str, Any]], Type]


@dataclass(frozen=True)
class RelaxForm:
    """How TVM Relax's TVMScript writes an op, where it differs from the default: the name
    ``R.<op name>`` (``R.nn.conv2d``, ``R.add``), the op's inputs as positional arguments and
    its attributes as keywords of the same names. ``name`` renames (``R.concat`` for
    concatenate); ``ignore`` lists Relax keywords with no meaning at inference (a max pool's
    ``count_include_pad``); ``read(rx, args, kwargs) -> Expr`` builds the op from the call
    as written (through the reader's ``rx.call`` and ``rx.type``) and ``write(node, types) ->
    (extra positional texts, keywords)`` prints it back.

        RelaxForm("R.concat")
    """

    name: str | None = None
    ignore: tuple[str, ...] = ()
    read: Callable[..., Any] | None = None
    write: Callable[..., Any] | None = None


@dataclass(frozen=True)
class OnnxForm:
    """How an op is read from ONNX and written back: one ONNX op (``op_type``) whose inputs
    are the op's inputs, and ``attrs`` carried over as they are, each (IR name, ONNX name,
    ONNX default). ``convert`` and ``export`` replace that one-to-one reading where the forms
    differ; they get the importer or the exporter, whose helpers they call (``im.value``,
    ``im.call``, ``ex.emit``, ``ex.const``), so nothing here imports onnx. ``reads=False``
    makes a form export-only (a fused op is written as Conv but Conv reads as nn.conv2d);
    ``qdq`` writes the op on 8-bit values in ONNX's QuantizeLinear/DequantizeLinear form,
    through the QDQ writer's helpers (``w.dq``, ``w.q8``, ``w.quantize``, ``w.keep``).

        OnnxForm("LeakyRelu", attrs=(("alpha", "alpha", 0.01),))
    """

    op_type: str
    attrs: tuple[tuple[str, str, Any], ...] = ()
    convert: Callable[..., Any] | None = None   # (importer, onnx attrs, input names) -> value(s)
    export: Callable[..., str] | None = None    # (exporter, node, input names) -> output name
    reads: bool = True
    qdq: Callable[..., str] | None = None       # (QDQ writer, node) -> output name

    def read(self, im, op: "OpDef", attrs: Mapping[str, Any], ins: Sequence[str]):
        if self.convert is not None:
            return self.convert(im, attrs, ins)
        given = {}
        for ir, onnx, default in self.attrs:
            value = attrs.get(onnx, default)
            given[ir] = type(default)(value.decode() if isinstance(value, bytes) else value)
        return im.call(op.name, *[im.value(n) for n in ins[:len(op.inputs)]], **given)

    def write(self, ex, node, ins: Sequence[str]) -> str:
        if self.export is not None:
            return self.export(ex, node, ins)
        return ex.emit(self.op_type, list(ins),
                       **{onnx: node.attrs[ir] for ir, onnx, _ in self.attrs})


@dataclass(frozen=True, eq=False)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    type_rel: TypeRel
    semantics: Callable[..., Any]  # semantics(*arrays, **attrs) -> array or tuple of arrays
    attrs: tuple[Attr, ...] = ()
    props: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""
    # cost: arithmetic per call (default: one per output element), and whether the op moves
    # data at all (a reshape is a view, an annotation is nothing at run time)
    flops: Callable[..., float] | None = None   # flops(in_types, out_type, attrs)
    moves_data: bool = True
    # attributes in the form the e-graph keeps, given the input types (e.g. reshape's 0s
    # resolved to the dimensions they copy, so that reshape chains collapse)
    canonicalize: Callable[..., dict] | None = None
    # a fused op's unfused form: unfuse(args, attrs) -> Expr (the partition view prints it)
    unfuse: Callable[..., Any] | None = None
    # the CPU kernel binding, by the name it is registered under in runtime/lowering/
    # ("Conv2D"; "module:Class" for a binding defined outside eqquant), and what that binding
    # needs from this op (e.g. the elementwise kernel's function): the binding reads it
    # here, it keeps no table of op names
    kernel: str | None = None
    kernel_params: Mapping[str, Any] = field(default_factory=dict)
    # whether its kernels read and write channel-last data at a call site of these attributes
    # and input types: channels_last(attrs, in_types) -> bool (None: layouts do not matter to
    # them). A call site in the other layout (``site_layout``) pays the transposes of its
    # input and output (the cost models charge them; rules/layout.rules offers the other)
    channels_last: Callable[..., bool] | None = None
    # the realize view's form (TVM's realize output: casts, multiplies, fixed-point
    # arithmetic): realize(args, attrs, in_types, out_type) -> Expr
    realize: Callable[..., Any] | None = None
    # how ONNX writes this op: the first form is the export (float and QDQ); every form
    # with reads=True imports its op_type
    onnx: tuple[OnnxForm, ...] = ()
    # how TVMScript (TVM Relax) writes the op, when not as R.<name> with the same keywords
    relax: RelaxForm | None = None
    # the inputs its result falls as they grow (subtract's rhs, a batch norm's mean): the
    # magnitude of a computation's terms counts them with the other sign (``rules.check``:
    # an approx rule's bound in units of its terms, as rounding errors are)
    subtracts: tuple[str, ...] = ()
    # the interval every output lies in, whatever the input (sigmoid's [0, 1]): calibration
    # takes such a value's range as seen (minmax), never a histogram's guess inside it
    bounds: tuple[float, float] | None = None

    @property
    def relax_name(self) -> str:
        return (self.relax.name if self.relax and self.relax.name else None) or f"R.{self.name}"

    def __repr__(self) -> str:
        return f"<op {self.name}>"

    def role(self, name: str) -> int | None:
        """The position of the input that plays the quantization role ``name`` (WEIGHT,
        OUTPUT_SCALE, ...), or None."""
        return self.inputs.index(name) if name in self.inputs else None

    @property
    def attr_map(self) -> dict[str, Attr]:
        return {a.name: a for a in self.attrs}

    def canonical_attrs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Check and canonicalise ``given`` and fill in defaults. Raises AttrError with the
        attribute's name in ``.attr`` for the caller to locate."""
        known = self.attr_map
        out: dict[str, Any] = {}
        for key, value in given.items():
            spec = known.get(key)
            if spec is None:
                err = AttrError(f"{self.name} has no attribute '{key}'"
                                + (f" (it has: {', '.join(known)})" if known else
                                   " (it takes no attributes)"))
                err.attr = key  # type: ignore[attr-defined]
                raise err
            try:
                out[key] = spec.kind.canonical(value)
            except AttrValueError as e:
                err = AttrError(f"{self.name}: attribute '{key}' expects {e}, got {value!r}")
                err.attr = key  # type: ignore[attr-defined]
                raise err from None
        missing = [a.name for a in self.attrs if a.default is REQUIRED and a.name not in out]
        if missing:
            raise AttrError(f"{self.name} needs the attribute{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)}")
        return {a.name: out.get(a.name, a.default) for a in self.attrs}

    def printed_attrs(self, attrs: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Attributes that differ from their defaults, in declaration order, as text."""
        from ..core.nodes import _values_equal
        return [(a.name, a.kind.format(attrs[a.name])) for a in self.attrs
                if a.name in attrs and (a.default is REQUIRED
                                        or not _values_equal(attrs[a.name], a.default))]


_OPS: dict[str, OpDef] = {}


def site_layout(attrs: Mapping[str, Any]) -> str | None:
    """The layout of a call site's image: a convolution's ``data_layout``, a pool's
    ``layout`` (None for an op that has neither)."""
    return attrs.get("data_layout", attrs.get("layout"))


def register(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise ValueError(f"op {op.name} registered twice")
    if KERNEL in op.attr_map:     # (how it runs: not an argument of what it computes)
        semantics = op.semantics

        def what(*args, _semantics=semantics, **attrs):
            attrs.pop(KERNEL, None)
            return _semantics(*args, **attrs)
        what.__doc__ = semantics.__doc__
        object.__setattr__(op, "semantics", what)
    _OPS[op.name] = op
    return op


_LOADED: list[bool] = []


def _ensure_loaded() -> None:
    """Import every op family once (their registrations), whichever module asked first: a
    family imported on its own (the runtime imports ops.fused) must not hide the others."""
    if not _LOADED:
        _LOADED.append(True)
        # (registration order is the e-graph schema's order: the first families first)
        from . import nn, tensor, fused, qnn, quant  # noqa: F401  (registration side effects)
        from . import activation, indexing, image, volume  # noqa: F401


def get_op(name: str) -> OpDef:
    _ensure_loaded()
    op = _OPS.get(name)
    if op is None:
        import difflib
        close = difflib.get_close_matches(name, _OPS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise UnknownOpError(f"unknown op '{name}'{hint}")
    return op


def has_op(name: str) -> bool:
    _ensure_loaded()
    return name in _OPS


def all_ops() -> dict[str, OpDef]:
    _ensure_loaded()
    return dict(_OPS)


def relax_ops() -> dict[str, OpDef]:
    """TVMScript call name (``R.nn.conv2d``) -> the op it reads as."""
    _ensure_loaded()
    return {op.relax_name: op for op in _OPS.values()}


def onnx_forms() -> dict[str, tuple[OpDef, OnnxForm]]:
    """ONNX op type -> the op and form that read it."""
    _ensure_loaded()
    out: dict[str, tuple[OpDef, OnnxForm]] = {}
    for op in _OPS.values():
        for form in (f for f in op.onnx if f.reads):
            if form.op_type in out:
                raise ValueError(f"ONNX {form.op_type} is read by both "
                                 f"{out[form.op_type][0].name} and {op.name}")
            out[form.op_type] = (op, form)
    return out


def ops_with(prop: str) -> list[OpDef]:
    _ensure_loaded()
    return [op for op in _OPS.values() if prop in op.props]
