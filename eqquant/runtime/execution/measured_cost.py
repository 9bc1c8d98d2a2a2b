"""The measured cost model: each kernel instance's time on this machine, timed once and cached.

    model = MeasuredCost()                 # times what the cache lacks (on the real kernels)
    model = MeasuredCost(measure=False)    # the cache only: the rest from the roofline model
    resolve_cost("auto")                   # measured (cache only) once this machine has a
                                           # cache entry, the roofline model before

A kernel instance is an op with its attributes, input and output types and which inputs are
compile-time constants (``runtime.execution.timing``). Its time is the median of a few warm calls of the
executor's own kernel. The times live in one JSON file per user (``EQQUANT_CACHE_DIR``, else
``$XDG_CACHE_HOME/eqquant``, else ``~/.cache/eqquant``): ``kernel-times.json``, keyed by the
machine (CPU model, int8 and fp32 kernel paths, threads, eqquant version, a digest of the
kernels' source), so a second compile on the same machine times nothing, and a new CPU, path,
release or kernel starts afresh.

Instances never timed (a cache-only model, or an instance whose timing failed) cost what the
roofline model (``CpuLatency``) estimates; ``summary()`` says how many did, and the quantize
and optimize reports print it.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ...core.types import TensorType, Type
from ...extract.cost import CostModel, CpuLatency, constant_bytes, cost_model, unfused_calls
from ...ops.registry import ANNOTATION, OpDef
from ...resources import cache_dir

CACHE_FILE = "kernel-times.json"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=None)
def kernels_digest() -> str:
    """A digest of the runtime's source (every file under ``runtime/``, ``source_digest``):
    a kernel changed since a time was cached, in a release or in a working tree, makes that
    time another machine's."""
    from .. import source_digest
    return source_digest(str(Path(__file__).parent.parent))


def machine_key() -> str:
    """What a kernel time depends on besides the instance: CPU, int8 and fp32 paths, threads,
    release and the kernels' source."""
    import numba
    from importlib.metadata import PackageNotFoundError, version
    from ..lowering.fp32 import fp32_path
    from ..lowering.int8 import int8_path
    try:
        release = version("eqquant")
    except PackageNotFoundError:      # (run from a source tree that was never installed)
        release = "unknown"
    return (f"{cpu_model()} | int8 {int8_path()} | fp32 {fp32_path()} | "
            f"{numba.get_num_threads()} threads | "
            f"eqquant {release} | kernels {kernels_digest()}")


def instance_key(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type], out_type: Type,
                 consts: frozenset[int]) -> str:
    shown = ", ".join(f"{k}={attrs[k]!r}" for k in sorted(attrs))
    kinds = ", ".join(("const " if i in consts else "") + str(t) for i, t in enumerate(in_types))
    return f"{op.name}[{shown}]({kinds}) -> {out_type}"


class KernelTimes:
    """The cache file: {machine key: {instance key: seconds}}; this machine's table in
    ``times``. ``save()`` merges into the file as it is now and replaces it atomically."""

    def __init__(self, path: Path | None = None, machine: str | None = None):
        self.path = path or cache_dir() / CACHE_FILE
        self.machine = machine or machine_key()
        self.times: dict[str, float] = dict(self._read().get(self.machine, {}))
        self.dirty = False

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}     # no cache yet, or a damaged one: it is rebuilt

    def put(self, key: str, seconds: float) -> None:
        self.times[key] = seconds
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        data = self._read()
        data.setdefault(self.machine, {}).update(self.times)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=0, sort_keys=True))
        os.replace(tmp, self.path)
        self.dirty = False


RESIDENT_SHARE = 4   # weights up to a quarter of the last-level cache stay in it


def weights_resident(mod) -> bool:
    """Whether a program's constants (its weights) take at most 1 / RESIDENT_SHARE of the
    last-level cache, so that between two runs, with the activations passing through too,
    they stay in it: MobileNet-v2 int8 (3.5 MB in 32 MB) does, its fp32 program (14 MB) and
    resnet18 int8 (11 MB) do not, as their measured times show."""
    return fits_last_level_cache(constant_bytes(mod))


def fits_last_level_cache(weight_bytes: int) -> bool:
    """Whether ``weight_bytes`` of weights take at most 1 / RESIDENT_SHARE of that cache."""
    from .timing import last_level_cache_bytes
    return weight_bytes * RESIDENT_SHARE <= last_level_cache_bytes()


class MeasuredCost(CostModel):
    """Seconds: the instance's measured time (``KernelTimes``), timed now when ``measure`` and
    the cache lacks it, else the roofline estimate. Each instance is timed with its weights
    out of the caches, as in a network whose weights exceed the last-level cache; with
    ``resident`` (for a program whose weights fit in it: ``weights_resident``) with them in
    that cache, a time of its own in the cache."""

    name = "measured"

    def __init__(self, times: KernelTimes | None = None, measure: bool = True,
                 fallback: CostModel | None = None, progress=None, resident: bool = False):
        self.resident = resident
        self.resident_by: dict[str, bool] = {}    # by weight kind, once placed (for_weights)
        self.times = times if times is not None else KernelTimes()
        self.measure = measure
        self.fallback = fallback or CpuLatency()
        self.progress = progress           # called with each instance key timed
        self.cached: set[str] = set()      # instances read from the cache
        self.timed: set[str] = set()       # timed by this model
        self.estimated: dict[str, str] = {}  # instance -> why it was estimated
        self._saved = time.monotonic()

    def for_weights(self, weight_bytes: int, int8_bytes: int | None = None) -> "MeasuredCost":
        """A model sharing this one's times and counts whose kernels are timed as a program
        of ``weight_bytes`` of weights runs (``fits_last_level_cache``); with ``int8_bytes``,
        a kernel with integer weights as the integer program of that many bytes runs (a mixed
        extraction weighs both: MobileNet-v2's int8 weights stay in the cache between runs,
        its float ones do not)."""
        placed = copy.copy(self)
        placed.resident_by = {
            "float": fits_last_level_cache(weight_bytes),
            "int": fits_last_level_cache(weight_bytes if int8_bytes is None else int8_bytes)}
        return placed

    def _resident(self, in_types, consts) -> bool:
        """Whether this instance is timed with its weights (its constant tensors of rank 2
        and more) in the last-level cache."""
        if not self.resident_by:
            return self.resident
        kinds = {"float" if t.dtype.startswith("float") else "int"
                 for i, t in enumerate(in_types) if i in consts and
                 isinstance(t, TensorType) and len(t.shape) >= 2}
        return self.resident_by["int" if kinds == {"int"} else "float"]

    def op_cost(self, op, attrs, in_types, out_type) -> float:
        return self.instance_cost(op, attrs, in_types, out_type, frozenset())

    def reads_channels_last(self, op, attrs, in_types) -> bool | None:
        """The registry's word, or the binding's where it knows this machine's kernels
        better (``reads_channels_last`` on its class: an integer convolution on the portable
        path reads NCHW)."""
        reads = super().reads_channels_last(op, attrs, in_types)
        if reads and op.kernel:
            from ..lowering import binding_class
            claim = getattr(binding_class(op.kernel), "reads_channels_last", None)
            if claim is not None:
                return claim(attrs, in_types)
        return reads

    def instance_cost(self, op, attrs, in_types, out_type, consts=frozenset()) -> float:
        if not op.moves_data:
            return 0.0
        if op.unfuse is not None and ANNOTATION in op.props:
            # a mark kept in float runs as its unfused form (quantize, dequantize): its cost
            return sum(self.instance_cost(o, a, ins, out, frozenset(
                j for j, i in where.items() if i in consts))
                for o, a, ins, out, where in unfused_calls(op, attrs, in_types))
        t = self.measured_seconds(op, attrs, in_types, out_type, consts)
        if t is not None:
            return t
        return self.fallback.op_cost(op, attrs, in_types, out_type)

    def measured_seconds(self, op, attrs, in_types, out_type,
                         consts=frozenset()) -> float | None:
        """The instance's time on this CPU: from the cache, or timed now (``measure``); None
        where it has none (not in a cache-only model's cache, or not runnable alone: why is
        in ``estimated``). The kernel plan times each contending kernel of a site so
        (``lowering/plan.py``)."""
        key = instance_key(op, attrs, in_types, out_type, frozenset(consts))
        resident = self._resident(in_types, consts)
        if resident:
            key += " | weights resident"
        t = self.times.times.get(key)
        if t is not None:
            if key not in self.timed:
                self.cached.add(key)
            return t
        if self.measure and key not in self.estimated:
            from .timing import time_instance
            try:
                t = time_instance(op, attrs, in_types, out_type, consts, resident=resident)
            except Exception as e:  # noqa: BLE001 - an instance that cannot run alone
                self.estimated[key] = f"not timed: {type(e).__name__}: {e}"
            else:
                self.times.put(key, t)
                self.timed.add(key)
                if self.progress is not None:
                    self.progress(key)
                if time.monotonic() - self._saved > 2.0:
                    self.flush()
                return t
        self.estimated.setdefault(key, "not in the cache")
        return None

    def flush(self) -> None:
        self.times.save()
        self._saved = time.monotonic()

    def summary(self) -> str:
        return (f"cost model: measured kernel times ({self.times.path}): {len(self.cached)} "
                f"instances "
                f"from the cache, {len(self.timed)} timed now, {len(self.estimated)} estimated "
                f"by the roofline model")


def auto_model() -> CostModel:
    """The measured model (cache only) once this machine has kernel times, else the roofline
    model."""
    times = KernelTimes()
    return MeasuredCost(times, measure=False) if times.times else CpuLatency()


COST_NAMES = ("auto", "measured", "cpu", "nodes")


def resolve_cost(name: str | CostModel) -> CostModel:
    """A cost model by name: ``measured`` (timing what the cache lacks), ``auto``
    (``auto_model``), or one of ``extract.cost``'s (``cpu``, ``nodes``); a model as it is."""
    if name == "measured":
        return MeasuredCost()
    if name == "auto":
        return auto_model()
    return cost_model(name)


def cost_table(module, model: CostModel, inputs, runs: int = 10) -> str:
    """Per op of ``module``: its calls, the cost model's predicted time and the executor's
    measured one (median over ``runs`` profiled runs), side by side."""
    import numpy as np
    from ...core.nodes import Constant, Scalar
    from ...ir.typecheck import infer_types
    from ...passes.sizes import bind_sizes, input_sizes, is_symbolic
    from .executor import Executor
    symbolic = is_symbolic(module)
    if symbolic:     # (timed at the sizes of ``inputs``)
        module = bind_sizes(module, input_sizes(module.main, inputs))
    ex = Executor(module, refit=symbolic)
    ex.run(inputs)
    for _ in range(runs):
        ex.run(inputs, profile=True)
    types = infer_types(ex.module)
    rows: dict[str, list[float]] = {}
    for st in ex.steps:
        node = st.node
        op = getattr(node, "op", None)
        if not isinstance(op, OpDef) or not st.seconds:
            continue
        consts = frozenset(i for i, a in enumerate(node.args)
                           if isinstance(a, (Constant, Scalar)))
        predicted = model.instance_cost(op, node.attrs, [types[id(a)] for a in node.args],
                                        types[id(node)], consts)
        row = rows.setdefault(op.name, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += predicted
        row[2] += float(np.median(st.seconds))
    model.flush()
    lines = [f"{'op':28s} {'calls':>5s} {'predicted ms':>13s} {'measured ms':>12s}"]
    for name, (n, pred, meas) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{name:28s} {n:5d} {pred * 1e3:13.3f} {meas * 1e3:12.3f}")
    total_p = sum(r[1] for r in rows.values())
    total_m = sum(r[2] for r in rows.values())
    lines.append(f"{'total':28s} {'':5s} {total_p * 1e3:13.3f} {total_m * 1e3:12.3f}  "
                 f"({model.name} model)")
    return "\n".join(lines)
