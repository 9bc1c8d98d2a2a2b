"""Cost models: what a call of an op costs, seen with its attributes, input and output types.

    model = cost_model("cpu")
    model.op_cost(op, attrs, in_types, out_type)   # seconds (an estimate)

Extraction adds these up over the chosen program, counting a shared value once; a value that
is a constant subexpression costs nothing (it is folded at compile time), and so do leaves.

- ``nodes``: one per op call, zero for ops that do nothing at run time (annotations, views).
- ``measured`` and ``auto``: this machine's kernel times (``runtime/execution/measured_cost.py``: they
  time the kernels, so they live with them).
- ``cpu``: a roofline-style latency estimate: arithmetic at a peak that depends on the dtype,
  plus the bytes the op reads and writes at memory bandwidth. The int8 peak is 2.4x the fp32
  one: what eqquant's own kernels measured on a VNNI machine (``bench/int8_factor.py``; run
  it to see this machine's). The factor follows the kernels as they improve.
  An op whose kernels read channel-last data at a call site (``channels_last`` in its
  registry entry) pays the transposes of its input and output at any other layout, and one
  whose kernels do not pays them at a channel-last call site.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import EqquantError
from ..core.types import TensorType, TupleType, Type, bind_type, is_static
from ..ops.registry import OpDef, site_layout


def nbytes(t: Type) -> float:
    if isinstance(t, TensorType):
        import numpy as np
        return float(t.size * (np.dtype(t.dtype).itemsize if t.dtype != "weak" else 4))
    if isinstance(t, TupleType):
        return sum(nbytes(f) for f in t.fields)
    return 0.0


def constant_bytes(mod) -> int:
    """The bytes of a program's constants (its weights), each counted once."""
    from ..core.nodes import Constant, post_order
    return int(sum(nbytes(n.type) for n in post_order(mod.main.body)
                   if isinstance(n, Constant)))


def output_size(t: Type) -> float:
    if isinstance(t, TensorType):
        return float(t.size)
    if isinstance(t, TupleType):
        return sum(output_size(f) for f in t.fields)
    return 0.0


class CostModel:
    name = "base"

    def op_cost(self, op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type],
                out_type: Type) -> float:
        raise NotImplementedError

    def instance_cost(self, op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type],
                      out_type: Type, consts: frozenset[int] = frozenset()) -> float:
        """The cost of a call whose inputs ``consts`` are compile-time constants (a measured
        model times such a call as the executor runs it: weights prepacked)."""
        return self.op_cost(op, attrs, in_types, out_type)

    def reads_channels_last(self, op: OpDef, attrs: Mapping[str, Any],
                            in_types: Sequence[Type]) -> bool | None:
        """Whether the kernels this model prices read ``op``'s image channel-last (None:
        layouts do not matter to them): the registry's word (``channels_last``), unless the
        model knows the machine's kernels better."""
        return None if op.channels_last is None else op.channels_last(attrs, in_types)

    def for_weights(self, weight_bytes: int, int8_bytes: int | None = None) -> "CostModel":
        """This model for a program holding ``weight_bytes`` of weights (``constant_bytes``;
        ``int8_bytes`` in its integer form): a measured model times its kernels with them in
        the last-level cache where they fit there; other models do not care."""
        return self

    def summary(self) -> str:
        """One line on where the costs came from (for reports)."""
        return f"cost model: {self.name}"

    def flush(self) -> None:
        """Keep what was learnt (a measured model saves its cache)."""


class NodeCount(CostModel):
    name = "nodes"

    def op_cost(self, op, attrs, in_types, out_type) -> float:
        return 1.0 if op.moves_data else 0.0


@dataclass
class CpuLatency(CostModel):
    """Seconds: flops / peak(dtype) + bytes / bandwidth (times ``reference_factor`` for an op
    with no kernel)."""

    name: str = "cpu"
    peak: dict[str, float] = field(default_factory=lambda: {
        "float32": 100e9, "float64": 50e9, "float16": 50e9,
        "int8": 240e9, "uint8": 240e9, "int32": 50e9, "int64": 25e9, "int16": 100e9})
    bandwidth: float = 10e9
    call_overhead: float = 2e-6
    # an op with no kernel runs its reference semantics (numpy, float64 inside, temporaries
    # allocated): priced this many times its roofline, so that where the rules offer a form
    # with kernels (a lone batch norm as a multiply and an add) extraction takes it
    reference_factor: float = 8.0

    def op_cost(self, op, attrs, in_types, out_type) -> float:
        if not op.moves_data:
            return 0.0
        flops = op.flops(in_types, out_type, attrs) if op.flops else output_size(out_type)
        dtype = next((t.dtype for t in in_types if isinstance(t, TensorType)), "float32")
        rate = self.peak.get(dtype, 50e9)
        moved = sum(nbytes(t) for t in in_types) + nbytes(out_type)
        if op.channels_last is not None and site_layout(attrs) in ("NCHW", "NHWC") and \
                (site_layout(attrs) == "NHWC") != op.channels_last(attrs, in_types):
            # the kernels transpose the image on the way in and the result on the way out:
            # each a read and a write
            moved += 2 * (nbytes(in_types[0]) + nbytes(out_type))
        cost = self.call_overhead + flops / rate + moved / self.bandwidth
        return cost if op.kernel else cost * self.reference_factor


def channels_last_instance(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type],
                           out_type: Type):
    """(attrs, in_types, out_type) of an NCHW call site written channel-last as
    ``rules/layout.rules`` writes it: the image and result NHWC, an OIHW weight HWIO, a
    per-channel (C, 1, 1) operand (C), a channel ``axis`` 1 -> 3; None when the op's type
    relation does not take that call (then the site is priced as written, less its moves)."""
    from ..ops.tensor import layout_perm
    if not isinstance(out_type, TensorType) or len(out_type.shape) != 4:
        return None
    to_last = layout_perm("NCHW", "NHWC")
    key = "data_layout" if "data_layout" in attrs else "layout"
    new = dict(attrs, **{key: "NHWC"})
    if attrs.get("kernel_layout") == "OIHW":
        new["kernel_layout"] = "HWIO"
    if attrs.get("axis") == 1:
        new["axis"] = 3
    channels = out_type.shape[1]
    types = []
    for i, t in enumerate(in_types):
        if i == 0:
            t = TensorType(tuple(t.shape[a] for a in to_last), t.dtype)
        elif i == 1 and new.get("kernel_layout") == "HWIO":
            t = TensorType(tuple(t.shape[a] for a in layout_perm("OIHW", "HWIO")), t.dtype)
        elif isinstance(t, TensorType) and t.shape == (channels, 1, 1):
            t = TensorType((channels,), t.dtype)
        types.append(t)
    out = TensorType(tuple(out_type.shape[a] for a in to_last), out_type.dtype)
    try:
        new = op.canonical_attrs(new)
        if op.type_rel(types, new) != out:
            return None
    except Exception:  # noqa: BLE001 - any refusal of the type relation: not this way
        return None
    return new, types, out


class LaidOut(CostModel):
    """``model``'s costs for a program whose layouts are chosen after extraction (the layout
    phase, ``rules/layout.rules``): a call site in a layout its kernels do not read
    (``channels_last`` in its registry entry) costs what it will cost once the layout phase
    has put it in the one they read: ``model``'s cost of that call (``channels_last_instance``;
    where the op's type relation refuses it, ``model``'s cost as written less its own cost of
    the two layout changes the kernels make). Float and integer alternatives are weighed this
    way before the layouts are chosen: an NCHW float convolution's transposes move four times
    the bytes of an int8 one's, and measured NCHW sites (kernels between two moves, timed
    cold) cost two to four times their channel-last call: priced as written, MobileNet-v2's
    default extraction left up to 28 convolutions in float, 1.5-2x slower than all-int8."""

    def __init__(self, model: CostModel):
        self.model = model
        self.name = model.name

    def op_cost(self, op, attrs, in_types, out_type) -> float:
        return self.instance_cost(op, attrs, in_types, out_type)

    def instance_cost(self, op, attrs, in_types, out_type, consts=frozenset()) -> float:
        cost = self.model.instance_cost(op, attrs, in_types, out_type, consts)
        layout = site_layout(attrs)
        if layout not in ("NCHW", "NHWC") or not isinstance(in_types[0], TensorType) or \
                len(in_types[0].shape) != 4:
            return cost
        reads = self.model.reads_channels_last(op, attrs, in_types)
        if reads is None or (layout == "NHWC") == reads:
            return cost
        if layout == "NCHW":
            relaid = channels_last_instance(op, attrs, in_types, out_type)
            if relaid is not None:      # the call the layout phase will make, priced as such
                return self.model.instance_cost(op, *relaid, consts)
        other = "NCHW" if layout == "NHWC" else "NHWC"
        moves = sum(self._change(t, layout, other) for t in (in_types[0], out_type))
        return max(cost - moves, 0.0)

    def _change(self, t: Type, src: str, dst: str) -> float:
        """``model``'s cost of moving a value of type ``t`` from layout src to dst."""
        from ..ops.registry import get_op
        from ..ops.tensor import layout_perm
        op = get_op("layout_transform")
        attrs = op.canonical_attrs({"src_layout": src, "dst_layout": dst})
        moved = TensorType(tuple(t.shape[i] for i in layout_perm(src, dst)), t.dtype)
        return self.model.instance_cost(op, attrs, [t], moved, frozenset())

    def reads_channels_last(self, op, attrs, in_types) -> bool | None:
        return self.model.reads_channels_last(op, attrs, in_types)

    def for_weights(self, weight_bytes: int, int8_bytes: int | None = None) -> CostModel:
        placed = self.model.for_weights(weight_bytes, int8_bytes)
        return self if placed is self.model else LaidOut(placed)

    def summary(self) -> str:
        return self.model.summary() + " (each op costed in the layout it will run in)"

    def flush(self) -> None:
        self.model.flush()


class AtSizes(CostModel):
    """``model``'s costs for a program with sizes known only at run time (``?n``), priced at
    the sizes the user serves (``sizes``: name -> size; a name not there is priced at 1):
    the same program may extract differently for batch 32 than for batch 1."""

    def __init__(self, model: CostModel, sizes: Mapping[str, int]):
        self.model, self.sizes = model, dict(sizes)
        self.name = model.name
        self._values = _DefaultOne(self.sizes)

    def _bound(self, t):
        return bind_type(t, self._values)

    def op_cost(self, op, attrs, in_types, out_type) -> float:
        return self.instance_cost(op, attrs, in_types, out_type)

    def instance_cost(self, op, attrs, in_types, out_type, consts=frozenset()) -> float:
        return self.model.instance_cost(op, attrs, [self._bound(t) for t in in_types],
                                        self._bound(out_type), consts)

    def reads_channels_last(self, op, attrs, in_types) -> bool | None:
        return self.model.reads_channels_last(op, attrs, [self._bound(t) for t in in_types])

    def for_weights(self, weight_bytes: int, int8_bytes: int | None = None) -> CostModel:
        return AtSizes(self.model.for_weights(weight_bytes, int8_bytes), self.sizes)

    def summary(self) -> str:
        at = ", ".join(f"?{k}={v}" for k, v in sorted(self.sizes.items())) or "every size 1"
        return f"{self.model.summary()} (priced at {at})"

    def flush(self) -> None:
        self.model.flush()

    def __getattr__(self, name):        # (what else the model offers: measured_seconds)
        if name in ("model", "sizes", "_values"):
            raise AttributeError(name)
        return getattr(self.model, name)


def priced_types(types: dict, cost: CostModel | None) -> dict:
    """``types`` (node id -> type) at the sizes ``cost`` prices (every open size at 1 where
    it is not an :class:`AtSizes` model): what a decision made per call site (a kernel)
    is made on."""
    if all(map(is_static, types.values())):
        return types
    at = priced_at(cost)
    values = at._values if at is not None else _DefaultOne()
    return {k: bind_type(t, values) for k, t in types.items()}


class _DefaultOne(dict):
    def __missing__(self, key):
        return 1


def priced_at(model: CostModel | None) -> AtSizes | None:
    """The :class:`AtSizes` inside ``model`` (a LaidOut wraps one), or None."""
    while model is not None and not isinstance(model, AtSizes):
        model = getattr(model, "model", None)
    return model


def at_sizes(model: CostModel, sizes: Mapping[str, int] | None) -> CostModel:
    """``model`` pricing sizes known at run time at ``sizes`` (see :class:`AtSizes`); a model
    that prices them already, as it does, unless ``sizes`` are given."""
    if sizes is None and priced_at(model) is not None:
        return model
    return AtSizes(model, sizes or {})


_UNFUSED: dict[tuple, list] = {}


def unfused_calls(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type]) -> list:
    """The calls of an annotation's unfused form (a calibration mark extraction keeps is
    written out as its quantize/dequantize pair): (op, attrs, input types, output type,
    which inputs are the annotation's constant-able inputs, by their position there)."""
    key = (op.name, tuple(sorted((k, repr(v)) for k, v in attrs.items())), tuple(in_types))
    if key not in _UNFUSED:
        from ..core.nodes import Call, Function, Module, Var, post_order
        from ..ir.typecheck import infer_types
        params = [Var(name=f"in{i}", type=t) for i, t in enumerate(in_types)]
        body = op.unfuse(params, attrs)
        types = infer_types(Module({"main": Function(params=params, body=body)}))
        where = {id(p): i for i, p in enumerate(params)}
        _UNFUSED[key] = [(c.op, c.attrs, [types[id(a)] for a in c.args], types[id(c)],
                          {j: where[id(a)] for j, a in enumerate(c.args) if id(a) in where})
                         for c in post_order(body) if isinstance(c, Call)]
    return _UNFUSED[key]


MODELS = {"nodes": NodeCount, "cpu": CpuLatency}


def cost_model(name: str | CostModel) -> CostModel:
    """A cost model by name: ``nodes`` or ``cpu`` (roofline); ``runtime.execution.measured_cost`` adds
    ``measured`` and ``auto`` (this machine's kernel times), which need the kernels."""
    if isinstance(name, CostModel):
        return name
    if name not in MODELS:
        raise EqquantError(f"unknown cost model '{name}' (there are: {', '.join(MODELS)}; "
                           f"measured and auto: runtime.execution.measured_cost.resolve_cost)")
    return MODELS[name]()
