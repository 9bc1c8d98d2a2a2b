"""From an fp32 program and calibration data to a program the quantization rules can act on.

    table = calibrate(mod, params, samples, mode="kl_divergence")   # value name -> range
    annotated = annotate(bind_params(mod, params), table)

``calibrate`` runs the program on the CPU executor (the Numba kernels) for each sample and
feeds every float value an op computes (and every input) to an observer. ``annotate`` marks
each calibrated value ``v`` as ``annotation.calibrated(v, scale, zero_point, dtype=...)``,
which *is* fake quantization: ``dequantize(quantize(v, scale, zero_point))``.

**This is the one approximation of the quantization flow.** The annotated program computes
something else than the fp32 program (rounding to the grid, saturation outside the calibrated
range), and it is the program the quantization rules then preserve: every rule after this point
is an identity of the annotated program's semantics (or a rounding approximation bounded for
every input), so the extracted int8 program equals the annotated program whatever the input,
inside the calibrated range or not. The report measures what the annotation costs (SQNR).

Which values are marked, and with what parameters, follows what the integer kernels can do:
- a value read only by activations a quantized op can apply to its accumulator (relu, clip:
  the registry's ``epilogue`` set) is not marked when its op is a ``compute`` op (a
  convolution, its relu and the requantization become one op) or when activations are uint8
  (a uint8 quantization with zero point 0 is a relu already); the activation's output is;
- with uint8 activations (ONNX Runtime's convention), a value an op in the registry's
  ``selects`` set computes (max pooling: each output is one of its input's elements) takes its
  input's parameters, so it needs no requantization; TVM's int8 flow gives it its own scale
  and requantizes (as the seed's realize listing does).
"""
from __future__ import annotations

import gc
import itertools
import math
from typing import Any, Iterable, Mapping

import numpy as np

from ..errors import EqquantError
from ..core.nodes import (Call, Constant, Expr, Function, Module, Scalar, Var, freeze_attrs,
                          post_order, rewrite)
from ..ir.params import bind_params
from ..ops.numerics import range_params
from ..ops.qnn import dynamic_mark
from ..ir.printer import value_labels
from ..ir.typecheck import infer_types
from ..core.types import TensorType
from ..ops.fused import FUSED
from ..ops.registry import (ANNOTATION, BIAS, COMPUTE, EPILOGUE, QUANT, SELECTS, WEIGHT, OpDef,
                            get_op)
from ..passes.inline import inline_calls
from .calibrate import GUESSING, OBSERVERS, CalibrationTable, MinMax, Range

# A streamed calibration collects the cyclic garbage its loaders leave every COLLECT_EVERY
# samples (numpy's .npy header parse leaves reference cycles, which Python's collector may
# keep for many samples): its memory then stays that of a few samples, however many pass.
COLLECT_EVERY = 32


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


class Statistics:
    """What calibration gathers from the samples it is fed: an observer per float value, the
    values seen infinite or NaN (with the first sample where), each input's span. Two of
    parts of the data ``merge`` into the whole's, exactly (counts add, extremes reduce), so
    calibration runs in parts (``engine="ray"``) and gives the table one pass gives."""

    def __init__(self, fn: Function, mode: str, skip: Iterable[str]) -> None:
        if mode not in OBSERVERS:
            raise EqquantError(f"unknown calibration mode '{mode}' (there are: "
                               f"{', '.join(OBSERVERS)}; and quantize's dynamic, which "
                               f"calibrates nothing)")
        self.fn, self.mode, self.skip = fn, mode, set(skip)
        labels = value_labels(fn)
        self.wanted = _wanted(fn, self.skip, labels)
        self._other: tuple = (None, {})
        bounded = {id(n) for n in post_order(fn.body)
                   if isinstance(n, Call) and getattr(n.op, "bounds", None) is not None}
        self.observers = {label: (MinMax() if mode in GUESSING and key in bounded
                                  else OBSERVERS[mode]())
                          for key, label in self.wanted.items()}
        self.count = 0
        self.unbounded: dict[str, tuple[int, str]] = {}   # label -> (sample, what was seen)
        self.spans: dict[str, list[float]] = {}

    def __getstate__(self):          # (what crosses processes: no program, no registry ops)
        return {k: v for k, v in self.__dict__.items()
                if k not in ("fn", "wanted", "_other")}

    def _wanted_in(self, fn: Function) -> dict[int, str]:
        """The observed values of ``fn``, the program at other sizes than ``self.fn`` (an
        executor per size: ``SizedExecutor``), by the labels they share."""
        if fn is self.fn:
            return self.wanted
        if self._other[0] is not fn:
            wanted = _wanted(fn, self.skip, value_labels(fn))
            if set(wanted.values()) != set(self.wanted.values()):
                raise EqquantError("internal: the program at other sizes has other values to "
                                   "calibrate")
            self._other = (fn, wanted)
        return self._other[1]

    def feed(self, ex, sample: Mapping[str, np.ndarray], index: int) -> None:
        """Run ``sample`` (calibration sample ``index``) on the executor ``ex``, observing."""
        sample = as_inputs(sample, self.fn)
        ex = ex.for_inputs(sample) if hasattr(ex, "for_inputs") else ex
        fn, wanted = self.fn, self._wanted_in(ex.module.main)
        for p in fn.params:
            if p.name not in sample:
                raise EqquantError(f"calibration sample {index} has no value for input "
                                   f"%{p.name}")
            arr = np.asarray(sample[p.name])
            if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
                bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
                raise EqquantError(f"calibration sample {index}, input %{p.name}: {bad} "
                                   f"values are NaN or infinite")
            if arr.size:
                lo, hi = self.spans.setdefault(p.name, [math.inf, -math.inf])
                self.spans[p.name] = [min(lo, float(arr.min())), max(hi, float(arr.max()))]
            if id(p) in wanted:
                self.observers[wanted[id(p)]].update(arr)

        def observe(node, value):
            label = wanted.get(id(node))
            if label is None or label in self.unbounded:
                return
            value = np.array(value)          # (a copy: the executor reuses its buffers)
            if not np.all(np.isfinite(value)):
                kinds = sorted({"NaN" if v != v else f"{v:g}"
                                for v in value[~np.isfinite(value)].reshape(-1)[:64].tolist()})
                self.unbounded[label] = (index, f"computes {', '.join(kinds)} on "
                                                f"calibration sample {index}")
                return
            self.observers[label].update(value)
        ex.run(sample, observe=observe)
        self.count += 1
        if self.count % COLLECT_EVERY == 0:
            gc.collect()

    def merge(self, other: "Statistics") -> None:
        for label, obs in other.observers.items():
            self.observers[label].merge(obs)
        for label, seen in other.unbounded.items():     # (the first sample's word)
            if label not in self.unbounded or seen[0] < self.unbounded[label][0]:
                self.unbounded[label] = seen
        for name, (lo, hi) in other.spans.items():
            mine = self.spans.setdefault(name, [math.inf, -math.inf])
            self.spans[name] = [min(mine[0], lo), max(mine[1], hi)]
        self.count += other.count

    def table(self) -> CalibrationTable:
        if self.count == 0:
            raise EqquantError("the calibration set is empty")
        for name, (lo, hi) in self.spans.items():
            if not hi - lo > 1e-30 and self.wanted.get(
                    id(next(p for p in self.fn.params if p.name == name))):
                raise EqquantError(f"calibration input %{name} takes one value only ({lo:g}) "
                                   f"over all {self.count} samples: constant data cannot "
                                   f"calibrate a program (give representative inputs)")
        unbounded = {k: why for k, (_, why) in sorted(self.unbounded.items(),
                                                      key=lambda kv: kv[1][0])}
        return CalibrationTable(self.mode, {k: o.range() for k, o in self.observers.items()
                                            if k not in unbounded}, unbounded)


class _Part:
    """A Ray worker's part of a calibration: the program (its text IR and weights) loaded
    once, its statistics over the samples it is fed."""

    def __init__(self, text: str, weights: bytes, mode: str, skip: tuple) -> None:
        import io

        from ..ir.parser import parse
        from ..runtime.execution.sized import executor_for
        arrays = dict(np.load(io.BytesIO(weights), allow_pickle=False)) if weights else {}
        self.ex = executor_for(bind_params(parse(text), arrays) if arrays else parse(text))
        self.mode, self.skip, self.stats = mode, skip, None

    def feed(self, samples, start: int) -> int:
        for k, sample in enumerate(samples):
            if self.stats is None:
                self.stats = statistics_for(self.ex, sample, self.mode, self.skip)
            self.stats.feed(self.ex, sample, start + k)
        return len(samples)

    def finish(self) -> Statistics:
        return self.stats


def calibrate(mod: Module, params: Mapping[str, np.ndarray] | None,
              samples: Iterable[Mapping[str, np.ndarray]], mode: str = "kl_divergence",
              skip: Iterable[str] = (), progress=None, engine: str = "local",
              workers: int | None = None, chunk: int = 16) -> CalibrationTable:
    """Ranges of the program's float values over ``samples`` (dicts of input arrays, or plain
    arrays for a program with one input; streamed), run on the CPU executor. A value
    computed infinite or NaN on any sample (an attention mask's -inf) has no range: the
    table lists it as ``unbounded``, and it stays float. ``engine="ray"``: the samples go in
    chunks of ``chunk`` to ``workers`` Ray actors, each with the program loaded once, and
    their statistics are merged: the table is the local one."""
    from ..runtime.execution.sized import executor_for
    bound = bind_params(mod, params) if params else mod
    if engine == "ray":
        import io
        from functools import partial

        from ..ir.printer import print_module
        from ..parallel import on_ray
        from ..ir.params import constant_params
        text, arrays = print_module(bound), constant_params(bound)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        samples = iter(samples)
        first = next(samples, None)
        if first is None:
            raise EqquantError("the calibration set is empty")
        samples = itertools.chain([first], samples)
        here = statistics_for(executor_for(bound), first, mode, skip)
        _, parts = on_ray(partial(_Part, text, buf.getvalue() if arrays else b"", mode,
                                  tuple(skip)), samples, chunk, workers, progress, "finish")
        for part in parts:
            here.merge(part)
        return here.table()
    if engine != "local":
        raise EqquantError(f"unknown engine {engine!r} (local or ray)")
    ex, stats = executor_for(bound), None
    for sample in samples:
        if stats is None:
            stats = statistics_for(ex, sample, mode, skip)
        stats.feed(ex, sample, stats.count)
        if progress is not None:
            progress(stats.count)
    if stats is None:
        raise EqquantError("the calibration set is empty")
    return stats.table()


def statistics_for(ex, sample, mode: str, skip) -> Statistics:
    """The statistics of the program ``ex`` runs, made for its values at the first sample's
    sizes (where the program leaves sizes open, each size it meets runs an executor of its
    own, whose values share these labels)."""
    if hasattr(ex, "for_inputs"):
        ex = ex.for_inputs(as_inputs(sample, ex.module.main))
    return Statistics(ex.module.main, mode, skip)


def qparams(r: Range, dtype: str) -> tuple[float, int]:
    """(scale, zero point) of a calibrated range: symmetric for int8, asymmetric (covering
    zero) for uint8 (``numerics.range_params``, which dynamic quantization computes at run
    time too)."""
    if not (np.isfinite(r.lo) and np.isfinite(r.hi)):
        raise EqquantError(f"a calibrated range must be finite, got [{r.lo}, {r.hi}]")
    return range_params(float(r.lo), float(r.hi), dtype == "int8")


def _weight_scale(w: Constant, mode: str, per_channel: bool, counter: list[int],
                  qmax: int = 127) -> tuple[Expr, int]:
    """The weight's int8 scale: for ``max`` an IR expression over the weight, folded at
    compile time (max|w| / qmax, per output channel when asked: qmax 127, or 63 for 7-bit
    weights); for ``power2`` computed here (max|w| rounded up to a power of two). Returns
    (scale, axis)."""
    if mode == "power2":
        from .calibrate import weight_scale
        s = weight_scale(w.data, "power2", per_channel, qmax).astype(np.float32)
        if not per_channel:
            return Scalar(value=float(s[0]), dtype="float32"), 0
        counter[0] += 1
        return Constant(index=counter[0] - 1, type=TensorType(s.shape, "float32"), data=s), 0
    absmax = np.abs(w.data).reshape(w.data.shape[0], -1).max(axis=1) if per_channel else \
        np.abs(w.data).max(keepdims=True)
    if np.any(absmax == 0):  # an all-zero weight (channel): scale 1/qmax, as weight_scale gives
        from .calibrate import weight_scale
        s = weight_scale(w.data, "max", per_channel, qmax).astype(np.float32)
        if not per_channel:
            return Scalar(value=float(s[0]), dtype="float32"), 0
        counter[0] += 1
        return Constant(index=counter[0] - 1, type=TensorType(s.shape, "float32"), data=s), 0
    axes = list(range(1, w.type.rank)) if per_channel else None
    absmax = Call(op=get_op("max"), args=(Call(op=get_op("abs"), args=(w,)),),
                  attrs=freeze_attrs(get_op("max").canonical_attrs({"axis": axes})))
    scale = Call(op=get_op("divide"), args=(absmax, Scalar(value=float(qmax),
                                                           dtype="float32")))
    return scale, 0


WEIGHT_BITS = (8, 7)


def weight_qmax(bits: int) -> int:
    """The largest weight magnitude of ``bits``-bit symmetric weights: 127, or 63 for 7 bits
    (every weight within +-64: on a CPU without VNNI, each pair of products of bytes fits
    ``vpmaddubsw``'s int16, so every convolution runs on the AVX2 byte kernel, as ONNX
    Runtime's ``reduce_range`` does for its kernels)."""
    if bits not in WEIGHT_BITS:
        raise EqquantError(f"weight bits must be one of {', '.join(map(str, WEIGHT_BITS))}, "
                           f"not {bits}")
    return 2 ** (bits - 1) - 1


def annotate(mod: Module, table: CalibrationTable, dtype: str = "int8",
             weight_scale: str = "max", per_channel: bool = False,
             kept_float: list[str] | None = None, dynamic: bool = False,
             weight_bits: int = 8) -> Module:
    """Mark every value the table names with its scale and zero point, and every constant
    weight of a conv2d or dense with its weight scale, unless that layer's int32 accumulator
    could overflow (see :func:`accumulator_overflow`): its weight stays float, so the layer
    does, and why is appended to ``kept_float``. (``mark_labels`` names the marks.)

    ``dynamic`` (dynamic quantization, as ONNX Runtime's quantize_dynamic; the table is
    empty): the computed operands of the compute ops (convolutions, dense layers, attention's
    products) are marked with parameters computed from each input at run time
    (``qnn.dynamic_scale``, ``qnn.dynamic_zero_point`` of its ``qnn.dynamic_range``), and
    nothing else is. A fused op's
    bias is then added in float, after the integer product (its op unfused, as ONNX Runtime
    adds it): a scale computed at run time has no lower bound, so a bias in accumulator
    steps could pass the int32 range. ``weight_bits``: 8, or 7 (``weight_qmax``)."""
    qmax = weight_qmax(weight_bits)
    flat = inline_calls(mod)
    fn = flat.main
    labels = value_labels(fn)
    op = get_op("annotation.calibrated")
    types = infer_types(flat) if dynamic else {}
    dynamic_marks: dict[int, Expr] = {}

    def mark_dynamic(original: Expr, v: Expr) -> Expr:
        t = types.get(id(original))
        if isinstance(v, (Constant, Scalar)) or is_mark(v) or not isinstance(t, TensorType) \
                or t.dtype != "float32":
            return v
        if id(v) not in dynamic_marks:
            dynamic_marks[id(v)] = dynamic_mark(v, dtype)
        return dynamic_marks[id(v)]
    marked_weights: dict[int, Expr] = {}
    from ..ir.params import module_constants
    counter = [max(module_constants(flat), default=-1) + 1]

    def mark_weight(w: Expr) -> Expr:
        if not isinstance(w, Constant) or w.data is None or w.type.dtype != "float32":
            return w
        if not np.all(np.isfinite(w.data)):
            raise EqquantError(f"meta[relay.Constant][{w.index}] (a weight) holds NaN or "
                               f"infinite values: it cannot be quantized", w.loc)
        if id(w) not in marked_weights:
            scale, axis = _weight_scale(w, weight_scale, per_channel, counter, qmax)
            marked_weights[id(w)] = Call(op=op, args=(w, scale, Scalar(value=0, dtype="int32")),
                                         attrs=freeze_attrs({"dtype": "int8", "axis": axis}))
        return marked_weights[id(w)]

    readers = _readers(fn)

    def mark(original: Expr, node: Expr) -> Expr:
        r = table.ranges.get(labels.get(id(original), ""))
        if r is None:
            return node
        users = readers.get(id(original), [])
        absorbs = dtype == "uint8" or (isinstance(original, Call) and isinstance(
            original.op, OpDef) and COMPUTE in original.op.props)
        if absorbs and original is not fn.body and users and all(
                isinstance(u.op, OpDef) and EPILOGUE in u.op.props for u in users):
            return node          # read only by relu/clip: their output is marked instead
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
        from ..core.nodes import rebuild
        i = node.op.role(WEIGHT) if isinstance(node, Call) and \
            not isinstance(node.op, Expr) else None
        computes = isinstance(node, Call) and isinstance(node.op, OpDef) and \
            COMPUTE in node.op.props and QUANT not in node.op.props
        if dynamic and computes:
            fixed = {i, node.op.role(BIAS)}
            children = tuple(c if k in fixed else mark_dynamic(o, c)
                             for k, (o, c) in enumerate(zip(node.children(), children)))
        if i is not None and (computes or not dynamic):
            why = accumulator_overflow(node, children, weight_scale, per_channel, qmax)
            if why is None:
                children = children[:i] + (mark_weight(children[i]),) + children[i + 1:]
            elif kept_float is not None:
                kept_float.append(f"{labels.get(id(node), '?')} ({node.op.name}): {why}")
        changed = any(a is not b for a, b in zip(children, node.children()))
        if dynamic and changed and FUSED in node.op.props and node.op.unfuse:
            return node.op.unfuse(children, node.attrs)      # (the bias added in float)
        return mark(node, rebuild(node, children) if changed else node)

    body = rewrite(fn.body, visit)
    if dtype == "uint8" and not dynamic:
        body = _share_selected_params(body, op)
    return Module({"main": Function(params=fn.params, body=body, ret_type=fn.ret_type)},
                  version=flat.version)


def is_mark(node) -> bool:
    """A calibration mark: a call of an op that is an annotation and a quantization (its
    meaning is fake quantization)."""
    return isinstance(node, Call) and isinstance(node.op, OpDef) and \
        {ANNOTATION, QUANT} <= node.op.props


def mark_labels(marked: Module, mod: Module) -> dict[int, str]:
    """For each value mark of ``marked`` (by id), the label its value has in ``mod``, the
    program ``annotate`` marked: the two are walked side by side, a mark standing in
    ``marked`` where ``mod`` has its value."""
    labels = value_labels(mod.main)
    out: dict[int, str] = {}
    seen: set[int] = set()
    stack = [(marked.main.body, mod.main.body)]
    while stack:
        m, f = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        while is_mark(m) and not is_mark(f):
            if not isinstance(m.args[0], Constant) and id(f) in labels:
                out[id(m)] = labels[id(f)]
            m = m.args[0]
        kids, fkids = m.children(), f.children()
        if len(kids) == len(fkids):
            stack.extend(zip(kids, fkids))
    return out


def _readers(fn: Function) -> dict[int, list[Call]]:
    """For each node, the calls that read it."""
    from ..core.nodes import post_order
    out: dict[int, list[Call]] = {}
    for node in post_order(fn.body):
        if isinstance(node, Call):
            for a in node.args:
                out.setdefault(id(a), []).append(node)
    return out


def _share_selected_params(body: Expr, mark_op) -> Expr:
    """A marked value computed by a ``selects`` op (max pooling) from a marked value takes that
    value's scale and zero point: its elements are already on that grid, so marking it again
    at its own is a needless second rounding (and a requantization in the int8 program)."""
    def visit(node, kids):
        if not (isinstance(node, Call) and node.op is mark_op):
            return None
        inner = kids[0]
        if isinstance(inner, Call) and isinstance(inner.op, OpDef) and \
                SELECTS in inner.op.props and inner.args and isinstance(inner.args[0], Call) \
                and inner.args[0].op is mark_op:
            src = inner.args[0]
            return Call(op=mark_op, args=(inner, src.args[1], src.args[2]), attrs=src.attrs)
        return None
    return rewrite(body, visit)


INT32_MAX = 2 ** 31 - 1


def accumulator_overflow(node: Call, children, weight_scale: str, per_channel: bool,
                         qmax: int = 127) -> str | None:
    """Why the int32 accumulator of ``node`` (a conv2d or dense with a constant weight, its
    data marked for quantization) could overflow, or None when it cannot. The bound is exact
    for the known weights: max|x - zx| * sum over each output channel of |w_q|, plus that
    channel's bias in accumulator steps (for a fused op), against 2**31 - 1."""
    from ..ops.numerics import qrange
    from .calibrate import weight_scale as numeric_weight_scale
    data, w = children[0], children[node.op.role(WEIGHT)]      # data is an op's first input
    if not (isinstance(w, Constant) and w.data is not None and isinstance(data, Call)
            and data.op_name == "annotation.calibrated"):
        return None
    sx, zx = data.args[1], data.args[2]
    lo, hi = qrange(data.attrs["dtype"])
    # a zero point computed at run time (dynamic quantization) is one of the dtype's values
    xmax = max(abs(lo - int(zx.value)), abs(hi - int(zx.value))) if isinstance(zx, Scalar) \
        else hi - lo
    wd = w.data.astype(np.float64)
    sw = numeric_weight_scale(w.data, weight_scale, per_channel, qmax).astype(np.float64)
    wq = np.clip(np.rint(wd.reshape(wd.shape[0], -1) / sw.reshape(-1, 1)), -qmax, qmax)
    bound = xmax * np.abs(wq).sum(axis=1)
    if node.op.role(BIAS) is not None and isinstance(sx, Scalar):
        b = children[node.op.role(BIAS)]
        if isinstance(b, (Constant, Scalar)) and b.data is not None:
            bq = np.abs(np.asarray(b.data, np.float64)).reshape(-1) / (float(sx.value) * sw)
            bound = bound + (bq if bq.size in (1, bound.size) else bq.max())
    worst = float(np.max(bound))
    if worst <= INT32_MAX:
        return None
    k = wq.shape[1]
    return (f"its int32 accumulator could overflow: up to {worst:.4g} > 2**31 - 1 "
            f"({k} products of |x - zx| <= {xmax} and |w| <= {qmax}, plus the bias); "
            f"the layer stays in float")
