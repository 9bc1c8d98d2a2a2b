"""From an fp32 program and calibration data to a program the quantization rules can act on.

    table = calibrate(mod, params, samples, mode="kl_divergence")   # value name -> range
    annotated = annotate(bind_params(mod, params), table)

``calibrate`` runs the program on the CPU executor (the Numba kernels) for each sample and
feeds every float value an op computes (and every input) to an observer. ``annotate`` marks
each calibrated value ``v`` as ``annotation.calibrated(v, scale, zero_point, dtype=...)``: an
identity that carries the value's quantization parameters as data, so that one generic approx
rule (``rules/quantize.rules``) can offer the quantized value as an alternative.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import EqquantError
from ..ir.nodes import Call, Constant, Expr, Function, Module, Scalar, Var, freeze_attrs, rewrite
from ..ir.params import bind_params
from ..ir.printer import value_labels
from ..ir.typecheck import infer_types
from ..ir.types import TensorType
from ..ops.registry import get_op
from ..passes.inline import inline_calls
from .calibrate import OBSERVERS, CalibrationTable, Range


def as_inputs(sample: Any, fn: Function) -> Mapping[str, np.ndarray]:
    """A calibration sample as a dict of inputs: a dict, or an array for a one-input program."""
    if isinstance(sample, Mapping):
        return sample
    names = [p.name for p in fn.params]
    if len(names) != 1:
        raise EqquantError(f"calibration samples must be dicts: the program has {len(names)} "
                           f"inputs ({', '.join(names)})")
    return {names[0]: sample}


def _wanted(fn: Function, skip: set[str], labels: dict[int, str]) -> dict[int, str]:
    from ..ir.nodes import post_order
    types = infer_types(Module({"main": fn}))
    out = {}
    for node in [*fn.params, *post_order(fn.body)]:
        t = types.get(id(node))
        if not isinstance(t, TensorType) or t.dtype != "float32":
            continue
        if isinstance(node, Call) and (isinstance(node.op, Expr) or not node.op.moves_data):
            continue  # views and annotations share their input's range
        if isinstance(node, (Var, Call)) and labels[id(node)] not in skip:
            out[id(node)] = labels[id(node)]
    return out


def calibrate(mod: Module, params: Mapping[str, np.ndarray] | None,
              samples: Iterable[Mapping[str, np.ndarray]], mode: str = "kl_divergence",
              skip: Iterable[str] = (), progress=None) -> CalibrationTable:
    """Ranges of the program's float values over ``samples`` (dicts of input arrays, or plain
    arrays for a program with one input), run on the CPU executor."""
    from ..runtime.executor import Executor
    if mode not in OBSERVERS:
        raise EqquantError(f"unknown calibration mode '{mode}' (there are: "
                           f"{', '.join(OBSERVERS)})")
    ex = Executor(bind_params(mod, params) if params else mod)
    fn = ex.module.main
    labels = value_labels(fn)
    wanted = _wanted(fn, set(skip), labels)
    observers = {label: OBSERVERS[mode]() for label in wanted.values()}

    def observe(node, value):
        label = wanted.get(id(node))
        if label is not None:            # (a copy: the executor reuses its buffers)
            observers[label].update(np.array(value))

    count = 0
    for sample in samples:
        sample = as_inputs(sample, fn)
        for p in fn.params:
            if id(p) in wanted:
                observers[wanted[id(p)]].update(sample[p.name])
        ex.run(sample, observe=observe)
        count += 1
        if progress is not None:
            progress(count)
    if count == 0:
        raise EqquantError("the calibration set is empty")
    return CalibrationTable(mode, {k: o.range() for k, o in observers.items()})


def qparams(r: Range, dtype: str) -> tuple[float, int]:
    """(scale, zero point): symmetric for int8, asymmetric (covering zero) for uint8."""
    if dtype == "int8":
        return float(np.float32(r.scale(127))), 0
    lo, hi = min(r.lo, 0.0), max(r.hi, 0.0)
    scale = float(np.float32((hi - lo) / 255 if hi > lo else 1.0))
    return scale, int(np.clip(round(-lo / scale), 0, 255))


def _weight_scale(w: Constant, mode: str, per_channel: bool, counter: list[int]
                  ) -> tuple[Expr, int]:
    """The weight's int8 scale: for ``max`` an IR expression over the weight, folded at
    compile time (max|w| / 127, per output channel when asked); for ``power2`` computed here
    (max|w| rounded up to a power of two). Returns (scale, axis)."""
    if mode == "power2":
        from .calibrate import weight_scale
        s = weight_scale(w.data, "power2", per_channel).astype(np.float32)
        if not per_channel:
            return Scalar(value=float(s[0]), dtype="float32"), 0
        counter[0] += 1
        return Constant(index=counter[0] - 1, type=TensorType(s.shape, "float32"), data=s), 0
    axes = list(range(1, w.type.rank)) if per_channel else None
    absmax = Call(op=get_op("max"), args=(Call(op=get_op("abs"), args=(w,)),),
                  attrs=freeze_attrs(get_op("max").canonical_attrs({"axis": axes})))
    scale = Call(op=get_op("divide"), args=(absmax, Scalar(value=127.0, dtype="float32")))
    return scale, 0


def annotate(mod: Module, table: CalibrationTable, dtype: str = "int8",
             weight_scale: str = "max", per_channel: bool = False) -> Module:
    """Mark every value the table names with its scale and zero point, and every constant
    weight of a conv2d or dense with its weight scale."""
    flat = inline_calls(mod)
    fn = flat.main
    labels = value_labels(fn)
    op = get_op("annotation.calibrated")
    marked_weights: dict[int, Expr] = {}
    from ..ir.params import module_constants
    counter = [max(module_constants(flat), default=-1) + 1]

    def mark_weight(w: Expr) -> Expr:
        if not isinstance(w, Constant) or w.data is None or w.type.dtype != "float32":
            return w
        if id(w) not in marked_weights:
            scale, axis = _weight_scale(w, weight_scale, per_channel, counter)
            marked_weights[id(w)] = Call(op=op, args=(w, scale, Scalar(value=0, dtype="int32")),
                                         attrs=freeze_attrs({"dtype": "int8", "axis": axis}))
        return marked_weights[id(w)]

    def mark(original: Expr, node: Expr) -> Expr:
        r = table.ranges.get(labels.get(id(original), ""))
        if r is None:
            return node
        scale, zp = qparams(r, dtype)
        return Call(op=op, args=(node, Scalar(value=scale, dtype="float32"),
                                 Scalar(value=zp, dtype="int32")),
                    attrs=freeze_attrs({"dtype": dtype, "axis": -1}))

    marked_params = {id(p): mark(p, p) for p in fn.params}

    def visit(node, children):
        if isinstance(node, Var):
            return marked_params[id(node)]
        if isinstance(node, (Constant, Scalar)):
            return None
        from ..ir.nodes import rebuild
        if isinstance(node, Call) and not isinstance(node.op, Expr) and \
                "weight" in node.op.inputs:
            i = node.op.inputs.index("weight")
            children = children[:i] + (mark_weight(children[i]),) + children[i + 1:]
        changed = any(a is not b for a, b in zip(children, node.children()))
        return mark(node, rebuild(node, children) if changed else node)

    body = rewrite(fn.body, visit)
    return Module({"main": Function(params=fn.params, body=body, ret_type=fn.ret_type)},
                  version=flat.version)
