"""Quantization in one call: the fp32 optimizations, calibration, annotation, the quantize
rules, extraction, and an accuracy report.

    result = quantize(mod, params, samples, mode="kl_divergence", per_channel=False)

Activations are uint8 by default (asymmetric, as ONNX Runtime's quantize_static does: a relu
output gets all 256 levels and the relu disappears into the quantization); ``dtype="int8"``
gives TVM's symmetric int8 (the seed-004 flow). Weights are always symmetric int8.
    result.module            # the int8 program (QNN ops)
    print(result.report())   # SQNR per layer and at the output, cosine, max abs error
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..errors import EqquantError
from ..core.nodes import Call, Expr, Function, Module, Scalar, post_order, rewrite
from ..ir.params import bind_params
from ..ir.printer import value_labels
from ..ops.registry import ANNOTATION, OUTPUT_SCALE, OUTPUT_ZERO_POINT, QUANT
from ..extract.cost import CostModel, LaidOut, at_sizes, constant_bytes
from ..passes.sizes import input_sizes, is_symbolic
from ..optimizer import OptimizeResult, optimize
from .annotate import annotate, as_inputs, calibrate, qparams
from .calibrate import CalibrationTable

# quantize's mode that calibrates nothing: the compute ops' operands are quantized with
# parameters computed from each input as it runs (``annotate``'s ``dynamic``)
DYNAMIC = "dynamic"
HEAD = 8        # calibration samples kept in memory (the rest stream through): the report's
                # figures over them when no held-out input is given, the mixed search's too
FP32_RULES = ("simplify", "bn_fold", "fusion")
FP32_SCHEDULE = "simplify; bn_fold; simplify; fusion"
# the marked program: quantize's rules, with simplify's identities beside them (a constant
# operand written first, GELU written out) so that what a float phase left is found again
INT8_RULES = ("simplify", "quantize")
# the int8 program's layouts, chosen for the CPU kernels (exact rules, a phase of its own on
# the extracted program: the interchange program stays NCHW for ONNX and TVM); the float
# fusions first, so that a convolution an earlier extraction left apart from its bias (two
# timings within their noise) is found fused again, and laid out as such; the residual sums
# (rules/residual.rules) last, so that they join the channel-last convolutions the layout
# rules wrote
LAYOUT_RULES = ("fusion", "layout", "residual")


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    noise = np.sum((ref - np.asarray(out, np.float64)) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))


def expand_calibration(mod: Module) -> Module:
    """Write the calibration marks extraction kept (values it left in float) as what they
    mean (their registry entry's unfused form): ``qnn.dequantize(qnn.quantize(x, s, z), s,
    z)``."""
    def visit(node, kids):
        if isinstance(node, Call) and not isinstance(node.op, Expr) and node.op.unfuse and \
                {ANNOTATION, QUANT} <= node.op.props:
            return node.op.unfuse(kids, node.attrs)
        return None
    fn = mod.main
    return Module({"main": Function(params=fn.params, body=rewrite(fn.body, visit),
                                    ret_type=fn.ret_type)}, version=mod.version)


SQNR_FLOOR = 20.0      # dB: an output below it is warned of: the int8 program has lost the
                       # float one (a collapsed range gave 0.7 dB), not merely rounded it


@dataclass
class QuantizeResult:
    module: Module                 # int8 program, NCHW (the interchange form: ONNX, realize)
    fp32: Module                   # the optimized fp32 program it was made from
    table: CalibrationTable
    optimized: OptimizeResult
    layers: list[tuple[str, float]] = field(default_factory=list)  # (value, SQNR dB)
    output: dict[str, float] = field(default_factory=dict)
    dtype: str = "uint8"           # the activations' dtype
    kept_float: list[str] = field(default_factory=list)   # layers left in float, and why
    # the same program with its layouts chosen for the CPU kernels (layout.rules): what runs
    compiled: Module | None = None
    layouts: OptimizeResult | None = None
    cost_summary: str = ""         # the cost model, and where its costs came from
    mixed: object = None           # quant.mixed.MixedResult, for a mixed-precision program
    pareto: list = field(default_factory=list)   # quant.mixed.Round per budget (--pareto)
    weight_bits: int = 8           # the weights' bits (7: ``annotate.weight_qmax``)

    @property
    def runnable(self) -> Module:
        return self.compiled if self.compiled is not None else self.module

    def report(self) -> str:
        from ..core.nodes import post_order
        from ..ir.typecheck import infer_types
        types = infer_types(self.module)
        calls = [n for n in post_order(self.module.main.body) if isinstance(n, Call)]
        integer = sum(1 for c in calls if getattr(types[id(c)], "dtype", "").startswith(
            ("int", "uint")))
        lines = [f"calibration {self.table.mode}; {len(self.table.ranges)} values calibrated"
                 + (f"; {self.weight_bits}-bit weights" if self.weight_bits != 8 else ""),
                 f"extracted program: {integer} of {len(calls)} ops compute integers "
                 f"(the cost model chose, {self.optimized.extractor} extraction; cost "
                 f"{self.optimized.before.total * 1e3:.3f} -> "
                 f"{self.optimized.after.total * 1e3:.3f} ms)",
                 *([self.cost_summary] if self.cost_summary else []),
                 *(self.mixed.report() if self.mixed is not None else []),
                 *(["latency against SQNR (one saturation):"] +
                   [f"  {r}" for r in self.pareto] if self.pareto else []),
                 *[f"kept in float: {why}" for why in self.kept_float],
                 f"{'value':12s} {'SQNR dB':>8s}"]
        lines += [f"{name:12s} {db:8.1f}" for name, db in self.layers]
        o = self.output
        where = (f" (on {o['samples']} calibration samples: no held-out input was given)"
                 if "samples" in o else "")
        lines.append(f"output: SQNR {o['sqnr']:.1f} dB, cosine {o['cosine']:.6f}, "
                     f"max abs error {o['max_abs_error']:.4g}{where}")
        if self.layouts is not None:
            lines.append(layout_summary(self.layouts))
        lines += [f"warning: {w}" for w in self.warnings()]
        return "\n".join(lines)

    def why(self, label: str) -> str:
        """Where the value ``label`` (``%12``) of the program that runs came from (``explain
        .why``): the rules of every phase, in order, and what each extraction rejected."""
        from ..extract.provenance import why
        return why(self.runnable, label, self.layouts.kernel_plan if self.layouts else ())

    def warnings(self) -> list[str]:
        """What makes this program's accuracy suspect: ranges that leave out most of what
        calibration saw, an output SQNR below SQNR_FLOOR."""
        out = self.table.warnings()
        if self.output.get("sqnr", math.inf) < SQNR_FLOOR:
            other = "" if self.table.mode == "minmax" else "--mode minmax, "
            out.append(f"the output's SQNR is {self.output['sqnr']:.1f} dB, below "
                       f"{SQNR_FLOOR:g} dB: the int8 program is far from the float one "
                       f"(calibrated with {self.table.mode}; try {other}more calibration "
                       f"samples, or --min-sqnr to keep the worst layers in float)")
        return out


def layout_summary(result: OptimizeResult) -> str:
    """One line on the layouts extraction chose: convolutions channel-last, layout changes."""
    calls = [n for n in post_order(result.module.main.body) if isinstance(n, Call)]
    convs = [c for c in calls if getattr(c.op, "channels_last", None) is not None]
    last = sum(1 for c in convs if c.attrs.get("data_layout") == "NHWC")
    changes = sum(1 for c in calls if c.op_name == "layout_transform")
    return (f"layouts (layout.rules, cost {result.before.total * 1e3:.3f} -> "
            f"{result.after.total * 1e3:.3f} ms): {last} of {len(convs)} convolutions "
            f"channel-last, {changes} layout changes")


def _flat(out) -> np.ndarray:
    """A program's result (a tensor, or a tuple of them) as one float64 vector."""
    parts = out if isinstance(out, tuple) else (out,)
    return np.concatenate([np.asarray(p, np.float64).ravel() for p in parts])


def evaluate(fp32: Module, int8: Module, table: CalibrationTable, dtype: str,
             inputs: Mapping[str, np.ndarray], extra: Sequence[Mapping[str, np.ndarray]] = ()
             ) -> tuple[list[tuple[str, float]], dict]:
    """SQNR of each quantized value (matched to the calibrated value whose scale it takes)
    on ``inputs``, and of the output over ``inputs`` and ``extra``; both programs run on the
    CPU executor."""
    from ..passes.sizes import bind_sizes, input_sizes, is_symbolic
    from ..runtime.execution.executor import Executor
    from ..runtime.execution.sized import executor_for
    # (a program with sizes open runs its layers at the sizes of ``inputs``)
    sizes = input_sizes(fp32.main, inputs) if is_symbolic(fp32) else {}
    ex32 = Executor(bind_sizes(fp32, sizes))
    labels = value_labels(ex32.module.main)
    fp_values: dict[str, np.ndarray] = {}

    def keep_fp(node, value):
        label = labels.get(id(node))
        if label in table.ranges:
            fp_values[label] = np.array(value)      # (the executor reuses its buffers)
    ref = ex32.run(inputs, observe=keep_fp)
    by_scale: dict[float, list[str]] = {}
    for label, r in table.ranges.items():
        by_scale.setdefault(round(qparams(r, dtype)[0], 9), []).append(label)
    layers: dict[str, float] = {}

    def keep_int(node, value):
        # a quantized value: an op whose result has an output scale and zero point (its
        # quantization roles)
        op = node.op if isinstance(node, Call) and not isinstance(node.op, Expr) else None
        at = op.role(OUTPUT_SCALE) if op is not None else None
        if at is not None and op.role(OUTPUT_ZERO_POINT) is not None and \
                isinstance(node.args[at], Scalar):
            scale = float(node.args[at].value)
            names = by_scale.get(round(scale, 9), [])
            # (a join's inputs are requantized to its scale too: the shape tells them apart)
            if len(names) == 1 and names[0] in fp_values and \
                    np.shape(fp_values[names[0]]) == np.shape(value):
                zero = float(node.args[op.role(OUTPUT_ZERO_POINT)].value)
                deq = (value.astype(np.float64) - zero) * scale
                layers[names[0]] = sqnr_db(fp_values[names[0]], deq)
    ex8 = Executor(bind_sizes(int8, sizes))
    out = ex8.run(inputs, observe=keep_int)
    refs, outs = [_flat(ref)], [_flat(out)]
    if sizes and extra:
        ex32, ex8 = executor_for(fp32), executor_for(int8)
    for more in extra:             # the output's figures over every sample given
        refs.append(_flat(ex32.run(more)))
        outs.append(_flat(ex8.run(more)))
    r, o = np.concatenate(refs), np.concatenate(outs)
    cosine = float(r @ o / (np.linalg.norm(r) * np.linalg.norm(o) or 1.0))
    order = [labels[k] for k in labels if labels[k] in layers]
    return ([(name, layers[name]) for name in dict.fromkeys(order)],
            {"sqnr": sqnr_db(r, o), "cosine": cosine,
             "max_abs_error": float(np.max(np.abs(r - o)))})


def quantize(mod: Module, params: Mapping[str, np.ndarray] | None,
             samples: Iterable[Mapping[str, np.ndarray]], mode: str = "kl_divergence",
             weight_scale: str = "max", per_channel: bool = False, dtype: str = "uint8",
             skip: Sequence[str] = (), cost: str | CostModel = "auto", progress=None,
             check_input: Mapping[str, np.ndarray] | None = None,
             layouts: bool = True, min_sqnr: float | None = None,
             budget_ms: float | None = None, keep_fp32: Sequence[str] = (),
             metric=None, max_drop: float | None = None, pareto: bool = False,
             why: bool = True, engine: str = "local",
             sizes: Mapping[str, int] | None = None,
             weight_bits: int = 8) -> QuantizeResult:
    """The int8 program of ``mod``. With ``min_sqnr`` (dB), ``budget_ms``, ``keep_fp32``
    (values to leave in float) or ``metric`` and ``max_drop``, a mixed-precision program:
    which values are quantized is chosen by extraction from one saturated e-graph
    (``quant.mixed``), and the report gives each round of the search; ``pareto`` adds the
    latency/SQNR points of a range of budgets, from the same saturated e-graph. ``why``: each
    op of the programs carries its ``origin`` (the rules that made it, phase after phase, and
    what each extraction rejected: ``extract.provenance``; a mixed program's int8 phase is
    the search's, without one). ``engine``: where calibration runs (``calibrate``'s).
    ``sizes``: where the program has sizes known only at run time (``?n``), those its
    kernels and layouts are chosen for (by default the first calibration sample's).
    ``weight_bits``: 8, or 7 (weights within +-63: on a CPU without VNNI every convolution
    then runs on the AVX2 byte kernel, ``x86.avx2.w7``, at some cost in accuracy)."""
    from ..runtime.execution.measured_cost import resolve_cost
    from .annotate import weight_qmax
    weight_qmax(weight_bits)            # (a bad value refused before calibrating)
    cost = resolve_cost(cost)        # the model of every phase that chooses kernels
    # The float phase is structural (batch norms folded, epilogues fused: each rule takes a
    # pass over memory away), so the roofline model, whose byte counts never tie a fused op
    # with its parts, chooses it: measured times did tie them, within their noise, and left
    # a third of resnet18's convolutions apart from their bias or relu, each part then
    # marked and quantized on its own.
    fp = optimize(bind_params(mod, params) if params else mod, None, FP32_RULES,
                  FP32_SCHEDULE, cost="cpu", why=why).module
    # a measured model times each kernel with its weights where a program of that precision
    # holds them: in the last-level cache if they fit there (int8: a quarter of the bytes)
    cost = cost.for_weights(constant_bytes(fp), constant_bytes(fp) // 4)
    # the samples stream through calibration; the first few are kept for the report and
    # the mixed search's sensitivities
    stream = (as_inputs(x, fp.main) for x in samples)
    head = list(itertools.islice(stream, HEAD))
    if not head:
        raise EqquantError("the calibration set is empty")
    if is_symbolic(fp):
        # sizes known only at run time are priced at those of the data calibrated on, unless
        # the user names the ones served (``sizes``: --batch, --size)
        cost = at_sizes(cost, {**input_sizes(fp.main, head[0]), **(sizes or {})})
    dynamic = mode == DYNAMIC
    if dynamic:     # no ranges: each input's are computed as it runs (the samples: the report)
        table = CalibrationTable(DYNAMIC, {})
    else:
        table = calibrate(fp, None, itertools.chain(head, stream), mode, skip, progress,
                          engine)
    kept_float: list[str] = [f"{name}: {why}: it has no range to quantize"
                             for name, why in table.unbounded.items()]
    marked = annotate(fp, table, dtype, weight_scale, per_channel, kept_float, dynamic,
                      weight_bits)
    mixed = None
    front = []
    # float or integer, each op costed as the layout phase will lay it out (LaidOut)
    weigh = LaidOut(cost) if layouts else cost
    if min_sqnr is not None or budget_ms is not None or keep_fp32 or metric is not None or \
            pareto:
        from .annotate import mark_labels
        from .mixed import MixedSpace, search
        from .mixed import pareto as pareto_points
        space = MixedSpace(marked, weigh, names=mark_labels(marked, fp))
        space.measure_sensitivity(head)
        mixed = search(space, min_sqnr, None if budget_ms is None else budget_ms / 1e3,
                       keep_fp32, metric=metric, max_drop=max_drop)
        front = pareto_points(space) if pareto else []
        result = _mixed_as_optimized(space, mixed.program, marked, weigh)
        int8 = mixed.program
    else:
        result = optimize(marked, None, INT8_RULES, cost=weigh, extractor="best", why=why)
        int8 = expand_calibration(result.module)
    if check_input is not None:
        layers, output = evaluate(fp, int8, table, dtype, as_inputs(check_input, fp.main))
    else:   # no held-out input: the output's figures over (up to 8 of) the calibration set
        layers, output = evaluate(fp, int8, table, dtype, head[0], head[1:])
        output["samples"] = len(head)
    chosen = compile_layouts(int8, cost, why=why) if layouts else None
    return QuantizeResult(int8, fp, table, result, layers, output, dtype, kept_float,
                          chosen.module if chosen else None, chosen, cost.summary(), mixed,
                          front, weight_bits)


def cpu_program(mod: Module, cost: str | CostModel = "auto", target=None) -> OptimizeResult:
    """What ``eqquant run`` runs of a program as it was given (an ONNX import, a float text
    IR): its batch norms folded and epilogues fused (``FP32_RULES``, chosen by the roofline
    model as ``quantize``'s float phase is), then its layouts and kernels chosen
    (``compile_layouts``). A program already in that form comes back the same."""
    fp = optimize(mod, None, FP32_RULES, FP32_SCHEDULE, cost="cpu").module
    return compile_layouts(fp, cost, target)


def compile_layouts(mod: Module, cost: str | CostModel = "auto", target=None,
                    why: bool = True) -> OptimizeResult:
    """``mod`` (float or integer) with its layouts chosen for the CPU kernels by
    ``rules/layout.rules`` (exact rules: the same numbers): convolutions channel-last where
    their kernels read it, layout changes where they pay; and each int8 site's kernel named
    for ``target`` (default: the process's, ``runtime.target.current``). What runs; the
    NCHW form stays the interchange one (ONNX)."""
    from ..runtime.lowering.plan import planned
    from ..runtime.execution.measured_cost import resolve_cost
    model = resolve_cost(cost)      # (a measured one also times each site's kernels)
    return planned(optimize(mod, None, LAYOUT_RULES, cost=model, why=why), target, model)


def _mixed_as_optimized(space, program: Module, marked: Module, cost) -> OptimizeResult:
    """The mixed search's outcome in the form the report reads (costs before and after)."""
    from ..optimizer import program_costs
    from ..ir.params import constant_params
    enodes = space.session.enodes()
    return OptimizeResult(program, constant_params(program), space.report,
                          program_costs(marked, cost), program_costs(program, cost),
                          cost.name, "mixed (ilp)", space.session.rule_locations(), {},
                          enodes, 0, cost.summary() if cost.name == "measured" else "")

