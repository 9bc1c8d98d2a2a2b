"""A program saved ahead of time (``build.py``), loaded and run with numpy and ctypes only:
no Numba, no parser, no executor.

    lib = Library("out/resnet18.eqq")
    y = lib.run({"data": x})            # the same bits as the executor it was saved from

Loading maps ``data.bin`` (the weights: their pages found as the first run reads them),
puts the arrays a run writes in one region of memory (``Library._roots``), opens
``program.so``, fills the slots' cells and writes each launch's argument block with the
addresses of this process: a few milliseconds. A run copies the inputs into their arrays,
makes every launch in C (``eqq_run``: no Python between two kernels) and copies the output
out.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..core.timing import time_table
from ..core.types import Dim, TensorType, check_bounds, check_input
from ..errors import EvalError

FORMAT = 4          # plan.json's (``build.py`` writes it; 2: each GEMM table's length;
                    # 3: sums.json, the digest of each file; 4: a batched table of launches)
FILES = ("plan.json", "data.bin", "program.so")     # a library's, each in sums.json


def pool_threads() -> int:
    """The threads a launch of the pool's runs as: Numba's pool size in a process that
    would run the program with Numba (``NUMBA_NUM_THREADS``, else the CPUs this process
    may run on)."""
    value = os.environ.get("NUMBA_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_digest() -> str:
    """A digest of this CPU's model name and feature flags (Linux's /proc/cpuinfo;
    elsewhere, what Python says of the machine): a library's code is compiled for them."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            lines = f.read().split(b"\n\n", 1)[0].splitlines()
        seen = b"\n".join(line for line in lines if line.startswith((b"model name", b"flags")))
    except OSError:
        import platform
        seen = (platform.processor() + platform.machine()).encode()
    return hashlib.sha256(seen).hexdigest()[:16]


HUGE = 1 << 21    # a huge page's bytes (x86-64)


def _region(size: int) -> np.ndarray:
    """``size`` writable bytes, HUGE-aligned, of anonymous memory the kernel is asked to
    back with huge pages (where it does: Linux's transparent huge pages, "madvise" or
    "always")."""
    import mmap
    room = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    base = np.frombuffer(room, np.uint8)
    start = -base.ctypes.data % HUGE
    if hasattr(room, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            room.madvise(mmap.MADV_HUGEPAGE, start, size)
        except (OSError, ValueError):
            pass
    return base[start:start + size]


class _Launch(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("block", ctypes.c_int64),
                ("count", ctypes.c_int64)]


def verify(folder: Path) -> dict:
    """``folder``'s plan, once each of its files has the digest recorded as it was saved
    (``sums.json``) and the plan is one eqquant writes (``plan_schema``): else EvalError,
    naming what differs. Nothing of a library is used before this."""
    from .digests import file_digest
    from .plan_schema import PlanError, check
    try:
        sums = json.loads((folder / "sums.json").read_text())
        if not isinstance(sums, dict) or set(sums) != set(FILES):
            raise ValueError(f"it records {sorted(sums) if isinstance(sums, dict) else sums}")
    except (OSError, ValueError) as e:
        raise EvalError(f"{folder}: not a library this eqquant saved (its sums.json: "
                        f"{e.strerror if isinstance(e, OSError) else e})") from None
    for name in FILES:
        path = folder / name
        try:
            if path.is_symlink() or not path.is_file():
                raise OSError(0, "not a file")
            same = file_digest(path) == sums[name]
        except OSError as e:
            raise EvalError(f"{folder}: its {name} cannot be read ({e.strerror}): compile "
                            "the program again") from None
        if not same:
            raise EvalError(f"{folder}: its {name} is not the file it was saved with (damaged "
                            "or changed since): compile the program again")
    try:
        plan = json.loads((folder / "plan.json").read_text())
        check(plan, (folder / "data.bin").stat().st_size, FORMAT)
    except (OSError, ValueError) as e:         # (PlanError is a ValueError)
        what = "a plan eqquant does not write" if isinstance(e, PlanError) else "unreadable"
        raise EvalError(f"{folder}: its plan.json is {what} ({e}): compile the program "
                        "again") from None
    return plan


class Library:
    """A saved program, loaded (``run``): ``folder``'s files verified first (``verify``);
    ``key``: the cache's digest it must have been saved under (None: any)."""

    def __init__(self, folder: str | os.PathLike, key: str | None = None):
        folder = Path(folder)
        self.folder = folder
        plan = verify(folder)
        if key is not None and plan["key"] != key:
            raise EvalError(f"{folder}: the library of another program than the one it is "
                            "found for")
        if plan["cpu"] != cpu_digest():     # (its code may use what this CPU lacks)
            raise EvalError(f"{folder}: compiled for another CPU than this one (its model or "
                            "features differ): compile the program again here")
        self.plan = plan
        self.threads = plan["threads"]
        try:
            self._lib = lib = ctypes.CDLL(str(folder / "program.so"))
        except OSError as e:      # (damaged, or a kernel calling what the library lacks)
            raise EvalError(f"{folder}: its program.so does not load ({e}): compile the "
                            "program again") from None
        if plan["tiles"] and not lib.eqq_request_tiles():
            raise EvalError(f"{folder}: its kernels use AMX tiles, which Linux refused this "
                            "process")
        self.roots = self._roots(folder / "data.bin", plan["roots"], plan["phase"])
        try:
            functions = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                         for name in plan["functions"]]
        except AttributeError as e:
            raise EvalError(f"{folder}: its library lacks a C function its plan names "
                            f"({e})") from None
        # a GEMM table's function -> the addresses it gives: it writes all of its module's,
        # so its buffer has the room its plan says (not just for the ones the program uses)
        lengths = {t["function"]: t["length"] for t in plan["tables"]}
        for s in plan["slots"]:
            if s["index"] is not None and not 0 <= s["index"] < lengths.get(s["function"], 0):
                raise EvalError(f"{folder}: its plan names address {s['index']} of a GEMM "
                                "table it gives no such length")
        tables: dict = {}
        for f, count in lengths.items():
            out = (ctypes.c_int64 * count)()
            ctypes.CFUNCTYPE(None, ctypes.c_int64)(functions[f])(ctypes.addressof(out))
            tables[f] = list(out)
        cells = {}
        for s in plan["slots"]:
            try:
                cell = ctypes.c_void_p.in_dll(lib, "eqquant_slot." + s["name"])
            except ValueError:
                raise EvalError(f"{folder}: its library lacks the slot {s['name']} its plan "
                                "names") from None
            cells[s["name"]] = ctypes.addressof(cell)
            if s["function"] is not None:   # a C function's, or the index-th of a table's
                cell.value = (functions[s["function"]] if s["index"] is None
                              else tables[s["function"]][s["index"]])
        self.blocks = []        # (each launch's argument block, kept alive)
        self._table = self._launches(plan["launches"], functions, cells)
        self._lock = threading.Lock()   # (one run at a time: they share the buffers)
        self._run = lib.eqq_run
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._run.restype = None
        self._run_timed = lib.eqq_run_timed
        self._run_timed.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                    ctypes.c_void_p]
        self._run_timed.restype = None
        self._arrays = {i["name"]: self._array(i) for i in plan["inputs"]}
        # a library saved at batch 1 of a program whose batch is open (``build.per_sample``)
        # takes any batch: in runs of ``batched``'s size (its table of launches, made at
        # that batch), then of one sample
        self.batch = plan.get("batch")
        batched = plan.get("batched")
        self.batched = None if batched is None else (
            batched["inputs"][0]["shape"][0] if batched["inputs"] else 1,
            self._launches(batched["launches"], functions, cells),
            {i["name"]: self._array(i) for i in batched["inputs"]},
            self._array(batched["output"]))
        lead = (Dim.named(self.batch),) if self.batch else ()
        self.inputs = {i["name"]: TensorType(lead + tuple(i["shape"][len(lead):]),
                                             i["dtype"])
                       for i in plan["inputs"]}            # name -> type
        self.bounds = {i["name"]: tuple(i["bounds"]) for i in plan["inputs"]
                       if "bounds" in i}                   # name -> (lo, hi, why)
        self.aliases = plan.get("aliases", {})             # another name -> name
        self.output = self._array(plan["output"])

    def _launches(self, launches: list, functions: list, cells: dict):
        """A table of launches for ``eqq_run``: each launch's argument block written with
        this process's addresses (kept in ``blocks``)."""
        table = (_Launch * len(launches))()
        for j, launch in enumerate(launches):
            words = np.array(launch["words"], np.int64)
            for at, kind, what, *offset in launch["refs"]:
                if kind == "root":
                    words[at] = self.roots[what].ctypes.data + offset[0]
                elif kind == "function":
                    words[at] = functions[what]
                else:
                    words[at] = cells[what]
            self.blocks.append(words)
            table[j] = _Launch(functions[launch["function"]], words.ctypes.data,
                               launch["count"])
        return table

    @staticmethod
    def _roots(path: Path, entries: list, phase: int) -> list[np.ndarray]:
        """The roots: those a run only reads (the weights) mapped from data.bin, where
        their pages are found as the first run reads them; those it writes (activations,
        inputs, scratch, counters) in one region of memory asked for huge pages, the
        stored ones copied in, all touched now, so that a run's first write to a page
        (a fault; for a stored page, a copy) is not paid at the first run: loading
        costs a little more, the first run less (docs/measurements.md). Each root keeps its address modulo ``phase`` (the kernels' alignment)."""
        data = None
        if any(e["at"] is not None for e in entries) and path.stat().st_size:
            data = np.memmap(path, np.uint8, mode="c")
        places, at = [], 0
        for e in entries:
            if e["at"] is None or e.get("state"):
                at += (e["phase"] - at) % phase
                places.append(at)
                at += e["bytes"]
            else:
                places.append(None)
        region = _region(at)
        region[...] = 0                    # (its pages faulted in now, not at a run)
        roots = []
        for e, place in zip(entries, places):
            if place is None:
                roots.append(data[e["at"]:e["at"] + e["bytes"]])
                continue
            root = region[place:place + e["bytes"]]
            if e["at"] is not None:
                root[...] = data[e["at"]:e["at"] + e["bytes"]]
            roots.append(root)
        return roots

    def _array(self, v: dict) -> np.ndarray:
        root = self.roots[v["root"]]
        dtype = np.dtype(v["dtype"])
        count = int(np.prod(v["shape"], dtype=np.int64))
        flat = root[v["offset"]:v["offset"] + count * dtype.itemsize]
        return flat.view(dtype).reshape(v["shape"])

    def run(self, inputs) -> np.ndarray:
        """The program's output for ``inputs`` (name -> array, or the one input's array); a
        library whose batch is open runs a batch in runs of its batched table's size, then
        one sample at a time (into one result)."""
        values = self._values(inputs)
        count = len(next(iter(values.values()))) if self.batch and values else 1
        with self._lock:
            if not self.batch or count == 1:
                self._put(values)
                self._run(ctypes.addressof(self._table), len(self._table), self.threads)
                return np.array(self.output)
            out = np.empty((count,) + self.output.shape[1:], self.output.dtype)
            i = 0
            if self.batched is not None:
                size, table, arrays, output = self.batched
                while count - i >= size:
                    for name, value in values.items():
                        arrays[name][...] = value[i:i + size]
                    self._run(ctypes.addressof(table), len(table), self.threads)
                    out[i:i + size] = output
                    i += size
            for i in range(i, count):
                self._put({k: v[i:i + 1] for k, v in values.items()})
                self._run(ctypes.addressof(self._table), len(self._table), self.threads)
                out[i:i + 1] = self.output
            return out

    def profile(self, inputs, runs: int = 20) -> str:
        """``runs`` runs of ``inputs`` after as many untimed (a process's first runs are
        slower, its second thread settling), each launch timed in C around it: the time
        per op (``core.timing.time_table``), each step's mean."""
        values = self._values(inputs)
        seconds = np.zeros(len(self._table))
        with self._lock:
            self._put(values)
            for _ in range(runs):
                self._run(ctypes.addressof(self._table), len(self._table), self.threads)
            for _ in range(runs):
                self._run_timed(ctypes.addressof(self._table), len(self._table),
                                self.threads, seconds.ctypes.data)
        steps: dict[tuple, float] = {}
        for launch, t in zip(self.plan["launches"], seconds / runs):
            key = (launch["step"], launch["op"])
            steps[key] = steps.get(key, 0.0) + float(t)
        rows: dict[str, list[float]] = {}
        for (_, op), t in steps.items():
            rows.setdefault(op, []).append(t)
        return time_table(rows)

    def _values(self, inputs) -> dict:
        """``inputs`` checked against the program's (``check_input``), by its names."""
        if not isinstance(inputs, Mapping):
            if len(self.inputs) != 1:
                raise EvalError(f"the program takes {len(self.inputs)} inputs: give them "
                                "by name")
            inputs = {next(iter(self.inputs)): inputs}
        inputs = {self.aliases.get(k, k): v for k, v in inputs.items()}
        values, sizes = {}, {}
        for name, t in self.inputs.items():
            if name not in inputs:
                raise EvalError(f"no value for input %{name}")
            values[name] = check_input(name, inputs[name], t, sizes)
            if name in self.bounds:
                check_bounds(name, values[name], self.bounds[name])
        return values

    def _put(self, values: dict) -> None:
        for name, value in values.items():
            self._arrays[name][...] = value
