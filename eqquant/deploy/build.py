"""A program saved ahead of time: an executor's bound launches written into a folder that
``loader.Library`` runs without Numba.

    ex = Executor(module)                      # the kernels compiled or loaded by Numba
    build(ex, "out/resnet18.eqq")              # program.so, data.bin, plan.json

What is saved: every step of the executor bound to its operands (``Executor.bind_steps``,
the program's inputs on arrays of their own), each a table of launches of kernels' C entries
on argument blocks (``runtime/codegen/launch.py``). The entries, and the C functions they reach
(the GEMMs' tables, the gather, the depthwise sweeps), are compiled again from the LLVM
modules Numba made for them (the same optimised IR, as position-independent code) and
linked with ``library.c`` (the run loop, Numba's runtime functions the kernels call) into
``program.so`` by the C compiler; a first start compiles those objects as its kernels
compile, on its helper processes too, into the cache (``keeping_objects``). Each array an
argument block points into (weights packed for the kernels, tables, buffers) is one of a few
allocations, a root: those the executor fills at a run (activations, inputs) are made empty
by the loader; the rest are written to ``data.bin``, each at an offset with the same
remainder modulo 64 as its address had (the kernels' aligned loads stay aligned), and
marked where a run writes them (scratch, work counters: the loader copies those into
memory). ``plan.json`` says where each word of each block points: a root and an offset, a
C function, a slot's cell.

What cannot be saved is refused with the reason (``NotDeployable``): a step that is not
launches (a reference op, a kernel bound as a Numba function of its own, the AVX2 byte
driver's), a tuple output, an integer argument that looks like an address nothing names.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..core.types import TensorType
from ..errors import EqquantError
from ..resources import cache_dir, cache_write
from ..runtime.codegen import compiling
from ..runtime.codegen import launch
from ..runtime.codegen import llvm_loops
from ..runtime.codegen import memory
from ..runtime.lowering.fp32 import threads as pool_threads
from .digests import file_digest
from .loader import FILES, FORMAT, cpu_digest

PHASE = memory.ALIGN          # a root keeps its address modulo this
ALIASES = ("view", "tuple", "getitem")   # steps that name their operands' arrays: no launch
# A library of a program whose batch is open holds its launches at batch 1 and, by default,
# at BATCHED (``build``'s ``batched``, ``eqquant compile --batched``): a batch of n runs as
# n // BATCHED runs of BATCHED samples, then the rest one by one.
BATCHED = 8
_C_SOURCE = Path(__file__).with_name("library.c")


class NotDeployable(EqquantError):
    """The executor's program cannot be saved ahead of time: why."""


class NotBuiltHere(NotDeployable):
    """The library could not be built in this setting (no C compiler, the compiler or the
    linker failing): a cause that may pass, so the cache tries again next time."""


def build(executor, folder: str | os.PathLike, key: str = "",
          aliases: dict | None = None, batched: int = BATCHED) -> Path:
    """Save ``executor``'s program into ``folder`` (made, or an earlier library there
    replaced whole: written beside it first, so a failure leaves what was there; any other
    folder that is not empty is refused); ``key``: what it was made from
    (``cache.key``), kept in its plan; ``aliases``: other names its inputs answer to (an
    imported model's, ``api.Model.aliases``); ``batched``: the batch of the second table of
    launches of a program whose batch is open (``per_sample``; 1: none). Raises
    NotDeployable with the reason."""
    folder = Path(folder).absolute()    # (the compiler runs inside the work folder)
    if folder.exists() and not (folder / "plan.json").is_file() and \
            (not folder.is_dir() or any(folder.iterdir())):
        raise EqquantError(f"{folder}: exists and is not a library eqquant saved: not "
                           "replaced (give a new folder, or an old library's)")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise NotBuiltHere("no C compiler (cc) to link the library with")
    single, batch = per_sample(executor)
    tables = [single]
    if batched < 1:
        raise EqquantError(f"a batched table of {batched} samples: give 1 (none) or more")
    if batch is not None and batched > 1:
        tables.append(executor.at({batch: batched}))
    plan, roots, functions, runs = _plan(tables)
    plan["batch"] = batch
    plan["key"] = key
    plan["aliases"] = dict(aliases or {})
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _link(functions, plan, work, cc)
        roots.state = _written(roots, runs)
        _write_data(roots, plan, work / "data.bin")
        (work / "plan.json").write_text(json.dumps(plan))
        (work / "sums.json").write_text(json.dumps(     # (what loader.verify checks)
            {name: file_digest(work / name, remember=False) for name in FILES}))
        if folder.exists():
            old = folder.with_name(f".{folder.name}.old{os.getpid()}")
            folder.rename(old)
            work.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            work.rename(folder)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return folder


def per_sample(executor) -> tuple[object, str | None]:
    """The executor a library is planned from, and the size it runs over one sample at a
    time (None: the program's shape is fixed). A program whose sizes are open
    (``SizedExecutor``) is saved at batch 1 when it runs its batch sample by sample
    (``passes.sizes.per_sample_problem``): the library then takes any batch, in runs of
    BATCHED samples (a second table of launches, made at that batch: ``build``'s
    ``batched``) and of one,
    each run the executor's bits at its batch. Any other open size: NotDeployable, saying
    which."""
    if not hasattr(executor, "for_inputs"):
        return executor, None
    from ..ir.typecheck import infer_types
    from ..passes.sizes import batch_size, per_sample_problem
    mod = executor.module
    name = batch_size(mod, infer_types(mod)[id(mod.main.body)])
    if name is None:
        raise NotDeployable("the program's sizes " + ", ".join(
            f"?{n}" for n in executor.sizes) + " are known only at run time and are not "
            "one batch on the leading axis of its inputs and output: a library holds one "
            "shape (the executor runs it, made for each size it meets)")
    problem = per_sample_problem(mod, name)
    if problem is not None:
        raise NotDeployable(f"the program does not run its batch ?{name} sample by sample "
                            f"({problem}): a library holds one shape")
    return executor.at({name: 1}), name


# -- the plan: launches, roots, C functions -----------------------------------------------

def _root(a: np.ndarray) -> np.ndarray:
    """The array whose allocation ``a`` lies in (following views to their base)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _span(a: np.ndarray) -> tuple[int, int]:
    """The bytes ``a`` may touch: [first, last) addresses."""
    lo = hi = a.ctypes.data
    if a.size == 0:
        return lo, lo
    for n, stride in zip(a.shape, a.strides):
        if stride < 0:
            lo += (n - 1) * stride
        else:
            hi += (n - 1) * stride
    return lo, hi + a.itemsize


class _Roots:
    """The roots met so far, by identity, and which of them the loader makes empty."""

    def __init__(self):
        self.arrays: list[np.ndarray] = []
        self.index: dict[int, int] = {}
        self.fresh: set[int] = set()        # made empty by the loader
        self.state: set[int] = set()        # stored, and written by a run

    def place(self, a: np.ndarray, where: str) -> tuple[int, int]:
        """(root index, byte offset) of ``a``'s data."""
        root = _root(a)
        if not root.flags.c_contiguous:
            raise NotDeployable(f"{where}: an operand lies in an array that is not one "
                                "contiguous allocation")
        r = self.index.get(id(root))
        if r is None:
            r = self.index[id(root)] = len(self.arrays)
            self.arrays.append(root)
        base = root.ctypes.data
        lo, hi = _span(a)
        if lo < base or hi > base + root.nbytes:
            raise NotDeployable(f"{where}: an operand reaches past its allocation")
        return r, a.ctypes.data - base


@functools.lru_cache(maxsize=None)
def _runtime_provided() -> frozenset[str]:
    """The functions of Numba's runtime that ``library.c`` defines."""
    return frozenset(re.findall(r"^\w[\w \t*]*?\b((?:NRT|numba)_\w+)\s*\(",
                                _C_SOURCE.read_text(), re.M))


_MISSING: dict[int, tuple] = {}     # id of a CFunc -> (it, kept alive; what it lacks)


def _runtime_missing(c) -> list[str]:
    """The functions of Numba's runtime (``NRT_*``, ``numba_*``) that the code of ``c`` (a
    CFunc) calls and ``library.c`` does not define: a library holding it would not load."""
    if id(c) not in _MISSING:
        module = c._library._get_module_for_linking()
        _MISSING[id(c)] = (c, sorted(
            f.name for f in module.functions if f.is_declaration and
            f.name.startswith(("NRT_", "numba_")) and f.name not in _runtime_provided()))
    return _MISSING[id(c)][1]


def _launches(step, prepared, where: str) -> list:
    """The launches ``step`` makes, bound (``prepared``: ``Executor.bind_steps``'s), or
    NotDeployable saying why it makes none."""
    if prepared is None or step.kind != "kernel":
        raise NotDeployable(f"{where}: computed by Python at each run ({step.kind}), not by "
                            "kernels' launches")
    calls = launch.launches_of(prepared[0])
    if calls is None:
        raise NotDeployable(f"{where}: its binding ({type(step.fn).__name__}) calls a Numba "
                            "function of its own, not launches of C entries")
    return calls


def not_launches(executor) -> list[str]:
    """Every step of ``executor`` that stops its program being saved, with why (``build``
    raises at the first): what a kernel still needs to become launches."""
    why = []
    bound = executor.bind_steps(executor.stand_ins())
    for i, (st, prepared) in enumerate(zip(executor.steps, bound)):
        if st.kind in ALIASES and prepared is not None:
            continue
        try:
            _launches(st, prepared, f"step {i} ({st.label})")
        except NotDeployable as e:
            why.append(str(e))
    return why


def _plan(executors: list) -> tuple[dict, _Roots, list, list]:
    """The plan (the first executor's launches, inputs and output; each other one's as a
    table of its own under "batched", made at its batch; slots; roots filled in by
    ``_write_data``), the roots, the C functions, and each table's (steps bound, inputs'
    arrays) for ``_written``."""
    roots = _Roots()
    functions: list = []                 # CFuncs, in the library's order
    function_index: dict[int, int] = {}

    def function(c) -> int:
        if id(c) not in function_index:
            function_index[id(c)] = len(functions)
            functions.append(c)
        return function_index[id(c)]

    named: set[str] = set()              # slots whose cells blocks hold
    tables, runs = [], []
    for executor in executors:
        table, bound, inputs = _table(executor, roots, function, named)
        tables.append(table)
        runs.append((bound, inputs))

    # the slots the functions use (named in their blocks, or read by their code), and the
    # C functions that fill them, until none is new: only those go into the library (a
    # process may have loaded other paths' GEMMs)
    used: dict[str, tuple | None] = {name: None for name in named}
    done = 0
    while done < len(functions):
        for name in _slots_read(functions[done]):
            used.setdefault(name, None)
        done += 1
        for name in list(used):
            if used[name] is None and name in llvm_loops.FILLED:
                source, index = llvm_loops.FILLED[name]
                used[name] = (function(source), index)
    slot_sources = []
    lengths: dict[int, int] = {}         # a table's function -> the addresses it writes
    for name in llvm_loops.slot_names():    # (every cell defined: a module may name it)
        source, index = used.get(name) or (None, None)
        slot_sources.append({"name": name, "function": source, "index": index})
        if index is not None:
            lengths[source] = llvm_loops.table_length(functions[source])
    plan = {
        "format": FORMAT,
        "phase": PHASE,
        "threads": pool_threads(),
        "cpu": cpu_digest(),            # (the CPU its code is compiled for)
        "tiles": _tiles(),             # (the kernels may use AMX: ask Linux at load)
        **tables[0],
        **({"batched": tables[1]} if len(tables) > 1 else {}),
        "slots": slot_sources,
        # (all of a table's addresses, however few the program uses: the loader gives the
        # table room for each, or it writes past its buffer)
        "tables": [{"function": f, "length": n} for f, n in sorted(lengths.items())],
        "functions": [c._wrapper_name for c in functions],
        "ops": executors[0].kernel_plan(runs[0][0]),     # (what runs each op: run -v)
    }
    return plan, roots, functions, runs


def _table(executor, roots: _Roots, function, named: set) -> tuple:
    """One executor's launches, inputs and output, as the plan holds them (its arrays placed
    in ``roots``, its C functions numbered by ``function``, the slots its blocks name added
    to ``named``); its steps bound; its inputs' arrays."""
    for name, (_, t) in executor.inputs.items():
        if not isinstance(t, TensorType):
            raise NotDeployable(f"input %{name} is not a tensor")
    inputs = executor.stand_ins()
    bound = executor.bind_steps(inputs)
    # (the C functions as they are once bound: a binding compiles what no helper compiled
    # before it, where another process was compiling the same kernels into the cache)
    made = compiling.made()
    for a in list(executor.blocks) + list(inputs.values()):
        roots.fresh.add(roots.place(a, "buffers")[0])
    launches = []
    for i, (st, prepared) in enumerate(zip(executor.steps, bound)):
        where = f"step {i} ({st.label})"
        if st.kind in ALIASES and prepared is not None:
            continue
        for call in _launches(st, prepared, where):
            entry = made.get(call.address)
            if entry is None:
                raise NotDeployable(f"{where}: its entry is not a C function of "
                                    "compiling.c_function's")
            missing = _runtime_missing(entry)
            if missing:
                raise NotDeployable(f"{where}: its kernel ({entry._pyfunc.__qualname__}) calls "
                                    f"{', '.join(missing)} of Numba's runtime, which a "
                                    "library does not hold (library.c)")
            words = list(call.block)
            refs = []
            pointers, integers = launch.references(call.args, call.plan)
            for at, value in pointers:
                if isinstance(value, np.ndarray):
                    r, offset = roots.place(value, where)
                    refs.append([at, "root", r, offset])
                elif value.slot is not None:
                    named.add(value.slot)
                    refs.append([at, "slot", value.slot])
                elif value.function is not None:
                    refs.append([at, "function", function(value.function)])
                else:
                    raise NotDeployable(f"{where}: an address of nothing known")
                words[at] = 0
            for at in integers:
                if abs(words[at]) >= 1 << 32:
                    raise NotDeployable(f"{where}: argument word {at} ({words[at]:#x}) "
                                        "looks like an address that no argument names")
            count = call.count or 0      # (a serial call's: 1; None: the pool's threads)
            launches.append({"step": i, "op": st.label, "function": function(entry),
                             "count": count, "words": words, "refs": refs})

    def value_of(array, what):
        r, offset = roots.place(array, what)
        return {"root": r, "offset": offset, "shape": list(array.shape),
                "dtype": str(array.dtype)}
    out_step = executor.step_of.get(executor.out_slot)
    if out_step is None or bound[out_step] is None or \
            not isinstance(bound[out_step][1], np.ndarray):
        raise NotDeployable("the program's output is not an array a step computes")
    table = {
        "inputs": [{"name": name, **value_of(inputs[slot], f"input %{name}"),
                    # (values its kernels need: checked as it enters, ``check_bounds``)
                    **({"bounds": list(executor.bounds[name])} if name in executor.bounds
                       else {})}
                   for name, (slot, _) in executor.inputs.items()],
        "output": value_of(bound[out_step][1], "the output"),
        "launches": launches,
    }
    return table, bound, inputs


def _written(roots: _Roots, runs: list) -> set[int]:
    """The stored roots a run writes (scratch, work counters): their bytes compared before
    and after one run of each table's bound steps (``runs``: (bound, inputs) each), on zero
    inputs. (They are left as that run left them, as a run leaves them for the next.)"""
    before = {r: np.array(_bytes(a)) for r, a in enumerate(roots.arrays)
              if r not in roots.fresh}
    for bound, inputs in runs:
        for a in inputs.values():
            a[...] = 0
        for prepared in bound:
            if prepared is not None:
                prepared[0]()
    return {r for r, b in before.items() if not np.array_equal(b, _bytes(roots.arrays[r]))}


def _bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _tiles() -> bool:
    """Whether this process's kernels may use the AMX tiles: only where their module was
    imported (importing it here would compile its GEMMs) and Linux granted them."""
    amx = sys.modules.get("eqquant.runtime.kernels.amx")
    return amx is not None and amx.available()


def _slots_read(c) -> list[str]:
    """The slots the code of ``c`` (a CFunc) reads (``llvm_loops.call_slot``'s globals)."""
    module = c._library._get_module_for_linking()     # (Numba's; eqquant pins its version)
    prefix = "eqquant_slot."
    return [g.name[len(prefix):] for g in module.global_variables
            if g.name.startswith(prefix)]


def _write_data(roots: _Roots, plan: dict, path: Path) -> None:
    """The roots' bytes, each at an offset with its address's remainder modulo PHASE (the
    empty ones: their size and remainder only), and whether a run writes them."""
    entries = []
    stored: dict[tuple, int] = {}       # (phase, size, digest) of a root only read -> at
    with open(path, "wb") as f:
        at = 0
        for r, a in enumerate(roots.arrays):
            phase = a.ctypes.data % PHASE
            if r in roots.fresh:
                entries.append({"bytes": a.nbytes, "phase": phase, "at": None})
                continue
            state = r in roots.state
            # (weights each table packed alike are stored once: a run only reads them)
            same = None if state else \
                (phase, a.nbytes, hashlib.sha256(_bytes(a).data).hexdigest())
            if same in stored:
                entries.append({"bytes": a.nbytes, "phase": phase, "at": stored[same],
                                "state": False})
                continue
            at += (phase - at) % PHASE
            f.seek(at)
            f.write(_bytes(a).data)
            if same is not None:
                stored[same] = at
            entries.append({"bytes": a.nbytes, "phase": phase, "at": at, "state": state})
            at += a.nbytes
    plan["roots"] = entries


# -- the library: the C functions' code, again, and library.c ----------------------------

def _link(functions: list, plan: dict, work: Path, cc: str) -> None:
    """program.so: each C function's module (as Numba optimised it) compiled to
    position-independent code (``_emit``: kept by the first start's compiling, or
    compiled now), the slots' cells, ``library.c`` (compiled by ``cc`` meanwhile)."""
    cells = work / "slots.c"
    cells.write_text("".join(
        f'void *eqq_slot_{j} __asm__("eqquant_slot.{s["name"]}") = 0;\n'
        for j, s in enumerate(plan["slots"])) or "int eqq_no_slots;\n")
    c_side = subprocess.Popen([cc, "-c", "-fPIC", "-O2", "-fopenmp", str(_C_SOURCE),
                               str(cells)], cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        objects = [_emit(j, c, work) for j, c in enumerate(functions)]
    finally:
        said = c_side.communicate()[0]
    if c_side.returncode != 0:
        raise NotBuiltHere("compiling library.c failed: " + said.strip()[-2000:])
    done = subprocess.run([cc, "-shared", "-fopenmp", "-Wl,-Bsymbolic", "-o",
                           str(work / "program.so"), str(work / "library.o"),
                           str(work / "slots.o"), *objects], capture_output=True, text=True)
    if done.returncode != 0:
        raise NotBuiltHere("linking the library failed: " + done.stderr.strip()[-2000:])
    for path in [*objects, work / "library.o", work / "slots.o", cells]:
        os.unlink(path)


_MACHINES: dict = {}
OBJECTS_KEPT = 512          # objects in the cache, the newest (``prune_objects``)


def _emit(j: int, c, work: Path) -> Path:
    """The C function ``c``'s module compiled to ``f{j}.o`` (``_object``), from the object
    cache where a first start's compiling put it (``keeping_objects``)."""
    path = work / f"f{j}.o"
    digest, module = _object_key(c)
    kept = objects_dir() / f"{digest}.o"
    try:
        shutil.copyfile(kept, path)
        return path
    except OSError:
        pass
    code = _object(c, module)
    path.write_bytes(code)
    _keep(kept, code)
    return path


def _object_key(c) -> tuple[str, bytes]:
    """(the digest an object of ``c`` is kept under, its module's bitcode). The digest is
    what Numba's cache keys the C function by (its Python function's module and name, its
    signature; the runtime's source, which stamps every kernel, ``runtime.source_digest``;
    Numba's version), with its entry's symbol (numbered anew at each compile: an object
    kept from another Numba cache's compile names another), the CPU it is compiled for and
    LLVM's version: the same in the helper that compiled it and in the process that loaded
    it from Numba's cache (their modules' bitcode is not, byte for byte)."""
    import llvmlite.binding as ll
    import numba
    from ..runtime import source_digest
    library = c._library                         # (Numba's; eqquant pins its version)
    bitcode = library._get_module_for_linking().as_bitcode()
    fn = c._pyfunc
    what = (FORMAT, fn.__module__, fn.__qualname__, str(c._sig), c._wrapper_name,
            source_digest(), numba.__version__, ll.llvm_version_info, _machine(c))
    return hashlib.sha256(repr(what).encode()).hexdigest()[:32], bitcode


def _machine(c) -> tuple[str, str]:
    codegen = c._library.codegen
    return codegen._get_host_cpu_name(), codegen._get_host_cpu_features()


def _object(c, bitcode: bytes) -> bytes:
    """The module ``bitcode`` of ``c`` compiled, its entry exported, as Numba's codegen
    compiles for this CPU (its name and features, the same optimisation level), as
    position-independent code."""
    import llvmlite.binding as ll
    machine = _machine(c)
    tm = _MACHINES.get(machine)
    if tm is None:
        target = ll.Target.from_triple(ll.get_process_triple())
        tm = _MACHINES[machine] = target.create_target_machine(
            cpu=machine[0], features=machine[1], opt=3, reloc="pic", codemodel="default")
    module = ll.parse_bitcode(bitcode)
    module.get_function(c._wrapper_name).linkage = ll.Linkage.external
    return tm.emit_object(module)


def objects_dir() -> Path:
    return cache_dir() / "objects"


def _keep(path: Path, code: bytes) -> None:
    """Put an object in the cache, whole or not at all (a cache: a failure is ignored)."""
    cache_write(path, code)


def keep_object(c) -> None:
    """``compiling.compiled_hooks``' hook: compile ``c``'s object for a library now, where
    its compiling ran (on a first start, shared with the helper processes: LLVM's code
    generation is most of saving a library, and it runs one module at a time per
    process), and keep it in the cache."""
    try:
        digest, bitcode = _object_key(c)
        kept = objects_dir() / f"{digest}.o"
        if not kept.exists():
            _keep(kept, _object(c, bitcode))
    except Exception:           # noqa: BLE001 (a cache: the library compiles it again)
        pass


@contextmanager
def keeping_objects():
    """While open, each C function compiled gets its library object too (``keep_object``)."""
    compiling.compiled_hooks.append(keep_object)
    try:
        yield
    finally:
        compiling.compiled_hooks.remove(keep_object)


def prune_objects() -> None:
    """Keep the OBJECTS_KEPT objects made last."""
    try:
        kept = sorted(objects_dir().glob("*.o"), key=lambda p: p.stat().st_mtime,
                      reverse=True)
    except OSError:
        return
    for old in kept[OBJECTS_KEPT:]:
        old.unlink(missing_ok=True)
