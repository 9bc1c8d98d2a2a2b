"""The executor: runs a module on the CPU kernels, with a memory plan made once at load.

    ex = Executor(module)            # bound module: constants carry their data
    y = ex.run({"data": x})
    print(ex.profile_table())        # after run(..., profile=True)
    t = ex.trace({"data": x})        # every value of a run, kept
    y2 = ex.rerun(t, {ex.slot(v): v2})   # one value changed: only what reads it runs again
    ex.compiled                      # what making it compiled (units, the helper's share)

At load, calls are inlined and put in dependency order; each op gets the binding its registry
entry names (weights prepacked once), or its reference semantics where no binding fits. The
kernels the bindings call are loaded from Numba's cache, or compiled, before the executor is
made (with an empty cache, on several processes: ``compiling``). Each intermediate value gets a
block of bytes from a pool, whatever its shape and dtype: a block returns to the pool after
the last use of every value stored in it (views share their input's storage), and the next
output takes the block freed last, so a few blocks serve the whole program. The result is
copied out, so callers may keep it.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ...errors import EvalError
from ...core.nodes import (Call, Constant, Expr, Module, Scalar, Tuple, TupleGetItem, Var,
                          post_order, rebuild)
from ...ir.typecheck import infer_types
from ...core.timing import time_table
from ...core.types import TensorType, check_bounds, check_input, type_of_array
from ...passes.inline import inline_calls
from ..codegen import compiling
from ..lowering import binding_class
from ..codegen import memory


@dataclass
class Step:
    label: str
    fn: Any                     # binding object, or a reference function
    inputs: list[int]           # value slots
    output: int
    kind: str                   # "kernel", "view", "reference", "tuple", "getitem"
    extra: Any = None
    seconds: list[float] = field(default_factory=list)
    node: Any = None            # the IR node whose value the step computes


class Executor:
    def __init__(self, module: Module, target=None, refit: bool = False):
        """``target``: the kernels the program may run on (``target.Target``; default: the
        process's, ``target.current``). Each site with kernels to choose from (convolutions and
        dense layers, int8 and float) runs the kernel its program names, or
        the one the target's plan gives it (``lowering.plan_kernels``), before any binding
        is made: ``kernel_plan`` shows it. ``refit``: a kernel the program names that does
        not run its site at this program's sizes is replaced by the target's choice (a
        program with open sizes run at one: ``SizedExecutor``; ``lowering.plan_kernels``)."""
        from ..target import current, using
        self.target = target or current()   # (a path pinned that this CPU lacks: an error)
        with using(self.target), compiling.session:   # (one executor at a time surveys
                                                      # and shares)
            with compiling.deferring():     # (slot modules imported here load at its end)
                self._build(module, refit)
                # what binding the steps compiles, found first, then compiled on several
                # processes where it can be (compiling.share): most of a first start
                self.compiled = compiling.share(compiling.survey(self._bind_ahead))
            self._prepare()

    def _build(self, module: Module, refit: bool = False) -> None:
        from ..lowering.plan import plan_kernels
        planned: dict[int, Expr] = {}      # a node of ``module`` -> its planned form
        flat, self.kernel_decisions = plan_kernels(inline_calls(module), self.target,
                                                   new=planned, refit=refit)
        self.module = flat
        types = infer_types(flat)
        body = flat.main.body
        order = post_order(body)
        slot: dict[int, int] = {}
        self.fixed: dict[int, Any] = {}      # slot -> constant value
        self.inputs: dict[str, tuple[int, TensorType]] = {}
        # input name -> (lowest, highest, why): values a kernel needs of it, checked as it
        # enters (a kernel cannot raise: take_at's indices)
        self.bounds: dict[str, tuple[int, int, str]] = {}
        self.steps: list[Step] = []
        for node in order:
            s = slot[id(node)] = len(slot)
            if isinstance(node, Var):
                self.inputs[node.name] = (s, node.type)
            elif isinstance(node, Constant):
                if node.data is None:
                    raise EvalError(f"meta[relay.Constant][{node.index}] has no value: load "
                                    "the params with the program", node.loc)
                self.fixed[s] = _contiguous(node.data)
            elif isinstance(node, Scalar):
                self.fixed[s] = node.data
            elif isinstance(node, Tuple):
                self.steps.append(Step("tuple", None, [slot[id(f)] for f in node.fields], s,
                                       "tuple", node=node))
            elif isinstance(node, TupleGetItem):
                self.steps.append(Step("getitem", None, [slot[id(node.tuple)]], s, "getitem",
                                       node.index, node=node))
            elif isinstance(node, Call) and not isinstance(node.op, Expr):
                self.steps.append(self._step(node, slot, types))
            else:
                raise EvalError(f"cannot run a {type(node).__name__}", getattr(node, "loc",
                                                                                None))
        self.out_slot = slot[id(body)]
        self.types = {slot[id(n)]: types[id(n)] for n in order}
        # id(node of self.module, or of the module given) -> its value's slot
        self.slots = {**{i: slot[id(n)] for i, n in planned.items() if id(n) in slot},
                      **slot}
        self.step_of = {st.output: i for i, st in enumerate(self.steps)}
        self._extra_slots = itertools.count(len(self.types))   # with_constant's constants
        self._plan()

    def _step(self, node: Call, slot: dict[int, int], types, fixed=None) -> Step:
        op = node.op
        fixed = self.fixed if fixed is None else fixed
        ins = [slot[id(a)] for a in node.args]
        in_types = [types[id(a)] for a in node.args]
        out_type = types[id(node)]
        consts = {i: fixed[s] for i, s in enumerate(ins) if s in fixed}
        if op.kernel:
            cls = binding_class(op.kernel)
            if cls.supports(op, node.attrs, in_types, out_type, consts):
                b = cls(op, node.attrs, in_types, out_type, consts)
                self._bound_on_entry(b, ins)
                return Step(op.name, b, ins, slot[id(node)], "view" if b.view else "kernel",
                            node=node)
        attrs = dict(node.attrs)
        return Step(op.name + " (reference)", lambda *a, _f=op.semantics: _f(*a, **attrs), ins,
                    slot[id(node)], "reference", node=node)

    def _bound_on_entry(self, b, ins: list[int]) -> None:
        """A binding whose operands must lie in bounds (``index_bounds``): where each such
        operand is a program input, its bounds join the input's (``self.bounds``, checked
        as it enters) and the binding is told so (``entry_checked``: its kernel may run
        unchecked, as a launch)."""
        bounds = getattr(b, "index_bounds", None)
        if not bounds:
            return
        names = {s: name for name, (s, _) in self.inputs.items()}
        if not all(ins[i] in names for i in bounds):
            return
        for i, (lo, hi, why) in bounds.items():
            name = names[ins[i]]
            if name in self.bounds:
                old = self.bounds[name]
                lo, hi = max(lo, old[0]), min(hi, old[1])
                why = why if (lo, hi) != old[:2] else old[2]
            self.bounds[name] = (lo, hi, why)
        b.entry_checked = True

    def _plan(self) -> None:
        """Give each kernel output a buffer, reusing buffers whose values are dead.

        Buffers are blocks of bytes, whatever the shapes stored in them: an output takes the
        free block that was freed last (its lines most likely still in cache: often the
        previous step's input), grown to fit when it is too small, or a new block when none
        is free. The blocks are allocated once the plan is made, each at the largest size it
        was given, so a program touches as many blocks as it ever has values alive at once
        (with one block per shape, MobileNet-v2 int8 touched 42 buffers, 5.2 MB, for at most
        1.5 MB alive). A value that may alias others (a view, a tuple and its fields, a
        reference op's result) keeps their blocks alive while it lives."""
        last_use: dict[int, int] = {}
        for i, st in enumerate(self.steps):
            for s in st.inputs:
                last_use[s] = i
        last_use[self.out_slot] = len(self.steps)
        # slot -> the blocks its value lies in (a view, its input's; a tuple, its fields';
        # a field taken out of a tuple, the tuple's)
        storage: dict[int, list[int]] = {}
        alive: dict[int, int] = {}            # block -> number of live slots stored in it
        sizes: list[int] = []                 # block -> the most bytes stored in it
        free: list[int] = []                  # blocks free now, the last freed last
        placed: dict[int, tuple[int, TensorType]] = {}   # step index -> its block, its type
        held: dict[int, int] = {}             # block -> the bytes of the value in it now
        self.peak_bytes = 0
        live_bytes = 0
        for i, st in enumerate(self.steps):
            t = self.types[st.output]
            if st.kind == "kernel" and isinstance(t, TensorType):
                need = _nbytes(t)
                if free:
                    block = free.pop()
                    sizes[block] = max(sizes[block], need)
                else:
                    block = len(sizes)
                    sizes.append(need)
                placed[i] = (block, t)
                storage[st.output] = [block]
                alive[block] = 1
                held[block] = need
                live_bytes += need
                self.peak_bytes = max(self.peak_bytes, live_bytes)
            else:
                # a value that may alias its operands (a view, a field of a tuple; a tuple; a
                # reference op's or a tuple-valued kernel's result, which may be a view of
                # one) keeps the blocks they lie in alive as long as it lives itself
                reads = st.inputs[:1] if st.kind in ("view", "getitem") else st.inputs
                shared = sorted({b for s in reads for b in storage.get(s, [])})
                if shared:
                    storage[st.output] = shared
                    for block in shared:
                        alive[block] += 1
            # values whose last use is this step release their storage
            for s in set(st.inputs) | {st.output}:
                if last_use.get(s, -1) <= i and s in storage:
                    for block in storage.pop(s):
                        alive[block] -= 1
                        if alive[block] == 0:
                            free.append(block)
                            live_bytes -= held.pop(block)
        self.blocks = [memory.empty((n,), np.uint8) for n in sizes]
        self.buffers: dict[int, np.ndarray] = {}  # step index -> preallocated output
        for i, (block, t) in placed.items():
            self.buffers[i] = self.blocks[block][:_nbytes(t)].view(t.dtype).reshape(t.shape)

    def _bind_ahead(self) -> None:
        """Bind every kernel step as ``_prepare`` does, and those reading the program's
        input too (on arrays standing in for it, of its types), so that every kernel a run
        calls is compiled before it. The bound calls are dropped (under
        ``compiling.survey``, those of kernels still to compile are incomplete)."""
        stand_ins = {s: np.empty(t.shape, t.dtype) for s, t in self.inputs.values()
                     if isinstance(t, TensorType)}
        self.bind_steps(stand_ins)

    def _prepare(self) -> None:
        """Bind each step whose operands are the same arrays at every run (constants, planned
        buffers, views of them) to those arrays once (``Binding.prepare``): a plain run then
        calls it with no arguments: gathering a step's operands and a binding's Python around
        its kernel at every run was a visible share of a small model's time. Bound again when the
        thread pool's size has changed (a convolution's work split is bound with it)."""
        from ..lowering.fp32 import threads
        self._threads = threads()
        self._prepared = self.bind_steps({})

    def bind_steps(self, inputs: dict) -> list[tuple | None]:
        """Each step bound where its operands are known now (constants, planned buffers,
        ``inputs``: slot -> array, views of them): (its call, its value), else None."""
        stable: list[Any] = [None] * len(self.types)
        for s, v in itertools.chain(self.fixed.items(), inputs.items()):
            stable[s] = v
        bound: list[tuple | None] = []
        for i, st in enumerate(self.steps):
            ins = [stable[s] for s in st.inputs]
            prepared = None
            if st.kind == "kernel" and i in self.buffers:
                stable[st.output] = self.buffers[i]       # whichever way it is computed
                if all(v is not None for v in ins):
                    prepared = (st.fn.prepare(ins, self.buffers[i]), self.buffers[i])
            elif st.kind in ("view", "tuple", "getitem") and all(v is not None for v in ins):
                # a view of its operand, a tuple of its fields' buffers, a field: no copy
                stable[st.output] = st.fn(ins) if st.kind == "view" else tuple(ins) \
                    if st.kind == "tuple" else ins[0][st.extra]
                prepared = (_nothing, stable[st.output])
            # (the rest, and steps reading the program's input or a view of it, gather their
            # operands at each run)
            bound.append(prepared)
        return bound

    def run(self, inputs: Mapping[str, np.ndarray], profile: bool = False,
            observe=None) -> Any:
        """The program's output for ``inputs``; ``observe(node, value)`` sees every value a
        step computes, as it is computed (nodes of ``self.module``; the array may be a buffer
        a later step reuses: copy what you keep)."""
        values: list[Any] = [None] * len(self.types)
        for s, v in self.fixed.items():
            values[s] = v
        for name, (s, t) in self.inputs.items():
            if name not in inputs:
                raise EvalError(f"no value for input %{name}")
            values[s] = _contiguous(check_input(name, inputs[name], t))
            if name in self.bounds:
                check_bounds(name, values[s], self.bounds[name])
        if not profile and observe is None:       # the steps bound once (``_prepare``)
            from ..lowering.fp32 import threads
            if threads() != self._threads:
                self._prepare()
            for i, (st, prepared) in enumerate(zip(self.steps, self._prepared)):
                if prepared is None:
                    values[st.output] = self._compute(i, st, values)
                else:
                    prepared[0]()
                    values[st.output] = prepared[1]
            return _copy_out(values[self.out_slot])
        for i, st in enumerate(self.steps):
            t0 = time.perf_counter() if profile else 0.0
            out = values[st.output] = self._compute(i, st, values)
            if observe is not None:
                observe(st.node, out)
            if profile:
                st.seconds.append(time.perf_counter() - t0)
        return _copy_out(values[self.out_slot])

    def _compute(self, i: int, st: Step, values: list) -> Any:
        args = [values[s] for s in st.inputs]
        if st.kind == "kernel":
            out = self.buffers[i]
            st.fn(args, out)
            return out
        if st.kind == "view":
            return st.fn(args)
        if st.kind == "tuple":
            return tuple(args)
        if st.kind == "getitem":
            return args[0][st.extra]
        return st.fn(*args)

    # -- partial runs: a run's values kept, one changed, only what reads it run again --------

    def slot(self, node: Expr) -> int:
        """The slot of ``node``'s value (a node of the module the executor was made from, or
        of its planned form)."""
        if id(node) not in self.slots:
            raise EvalError(f"{type(node).__name__} is not a value of this executor's program",
                            getattr(node, "loc", None))
        return self.slots[id(node)]

    def trace(self, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        """Every value of a run on ``inputs``, by slot (copied: the buffers are reused)."""
        kept: list[Any] = [None] * len(self.types)
        for s, v in self.fixed.items():
            kept[s] = v

        def keep(node, value):
            kept[self.slots[id(node)]] = _copy_out(value)
        self.run(inputs, observe=keep)
        for name, (s, _) in self.inputs.items():
            kept[s] = _contiguous(inputs[name])
        return kept

    def rerun(self, trace: list[Any], values: Mapping[int, Any] | None = None,
              steps: Mapping[int, Step] | None = None) -> Any:
        """The output of the run ``trace`` kept with the slots in ``values`` holding other
        values and the steps in ``steps`` (index -> a step computing the same value another
        way: ``with_constant``) replaced: those steps and every step reading a changed value
        run again, the rest is read from the trace. Equal to a full run of the program so
        changed, bit for bit (the same kernels on the same operands)."""
        values, steps = values or {}, steps or {}
        vals = list(trace)
        vals += [None] * (max(values, default=-1) + 1 - len(vals))
        changed = set()
        for s, v in values.items():
            vals[s] = v
            changed.add(s)
        for i, st in enumerate(self.steps):
            st = steps.get(i, st)
            if i in steps or not changed.isdisjoint(st.inputs):
                vals[st.output] = self._compute(i, st, vals)
                changed.add(st.output)
        return _copy_out(vals[self.out_slot])

    def with_constant(self, node: Call, position: int,
                      value: np.ndarray) -> tuple[int, Step, dict[int, np.ndarray]]:
        """The step computing ``node`` with its operand ``position`` the constant ``value``
        (bound and prepacked as at load): its index, the step, and the new constant's slot
        (one of its own, past the program's) with its value, for ``rerun``'s ``steps`` and
        ``values``."""
        value = _contiguous(value)
        const = Constant(index=-1, type=type_of_array(value), data=value)
        args = list(node.args)
        args[position] = const
        call = rebuild(node, tuple(args))
        extra = next(self._extra_slots)
        slots = {id(a): self.slot(a) for a in node.args}
        slots[id(const)], slots[id(call)] = extra, self.slot(node)
        types = {id(a): self.types[slots[id(a)]] for a in node.args}
        types[id(const)], types[id(call)] = const.type, self.types[self.slot(node)]
        step = self._step(call, slots, types, {**self.fixed, extra: value})
        return self.step_of[self.slot(node)], step, {extra: value}

    def stand_ins(self) -> dict[int, np.ndarray]:
        """An empty array for each tensor input (slot -> array), to bind the steps reading
        the program's input on (``bind_steps``)."""
        return {s: memory.empty(t.shape, t.dtype) for s, t in self.inputs.values()
                if isinstance(t, TensorType)}

    def kernel_plan(self, bound: list | None = None) -> list[dict]:
        """What runs each op of the program, in order, as this executor bound it (``bound``:
        ``bind_steps``' answer; by default its steps bound on stand-ins for the inputs): the
        kernels its launches run ("vnni._conv_items"), or why none (reference semantics, a
        view, a Numba function of its own); the path its binding chose (a GEMM's); its
        layout, the dtypes of its first input and its output, the threads. Rows of plain
        data (``core.timing.plan_table`` prints them; a saved library keeps them)."""
        from ..lowering.fp32 import threads
        from ..codegen.compiling import made
        from ..codegen.launch import kernel_of
        if bound is None:
            bound = self.bind_steps(self.stand_ins())
        entries = made()
        rows = []
        for i, (st, prepared) in enumerate(zip(self.steps, bound)):
            if st.kind in ("tuple", "getitem"):
                continue
            calls = prepared[0].launches() if prepared is not None and \
                hasattr(prepared[0], "launches") else None
            if st.kind == "reference":
                kernels = ["reference semantics (numpy)"]
            elif st.kind == "view":
                kernels = ["a view (nothing runs)"]
            elif calls is None:
                kernels = [f"{type(st.fn).__name__} (a Numba function of its own)"]
            else:
                kernels = list(dict.fromkeys(
                    kernel_of(entries[c.address]) if c.address in entries else "?"
                    for c in calls))
            attrs = st.node.attrs if st.node is not None else {}
            first = self.types[st.inputs[0]] if st.inputs else None
            rows.append({
                "step": i, "op": st.label, "kernels": kernels,
                "path": st.fn.path if st.kind == "kernel" else None,
                "layout": next((attrs[k] for k in ("data_layout", "layout", "dst_layout")
                                if k in attrs), None),
                "dtypes": f"{getattr(first, 'dtype', '-')} -> "
                          f"{getattr(self.types[st.output], 'dtype', 'tuple')}",
                "threads": max((c.count or threads() for c in calls), default=1)
                if calls else 1})
        return rows

    def profile_table(self) -> str:
        """The time per op of the profiled runs (each step's median)."""
        rows: dict[str, list[float]] = {}
        for st in self.steps:
            if st.seconds:
                rows.setdefault(st.label, []).append(float(np.median(st.seconds)))
        return time_table(rows)


def _nbytes(t: TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def _nothing() -> None:
    """A view's prepared step: its value was made once (``Executor._prepare``)."""


def _copy_out(value):
    """The result, copied out of the executor's buffers (tuples kept, nested or not)."""
    if isinstance(value, tuple):
        return tuple(_copy_out(v) for v in value)
    return np.array(value)


def _contiguous(value) -> np.ndarray:
    """A C-contiguous array (np.ascontiguousarray would turn a 0-d array into a 1-d one)."""
    arr = np.asarray(value)
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")
