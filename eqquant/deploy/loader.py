"""A program saved ahead of time (``build.py``), loaded and run with numpy and ctypes only:
no Numba, no parser, no executor.

    lib = Library("out/resnet18.eqq")
    y = lib.run({"data": x})            # the same bits as the executor it was saved from

Loading maps ``data.bin`` copy-on-write (pages read as the first run touches them), makes
the empty roots, opens ``program.so``, fills the slots' cells and writes each launch's
argument block with the addresses of this process: a few milliseconds. A run copies the
inputs into their arrays, makes every launch in C (``eqq_run``: no Python between two
kernels) and copies the output out.
"""
from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..core.types import TensorType, check_input
from ..errors import EvalError

FORMAT = 1
PHASE = 64


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


class _Launch(ctypes.Structure):
    _fields_ = [("entry", ctypes.c_void_p), ("block", ctypes.c_int64),
                ("count", ctypes.c_int64)]


class Library:
    """A saved program, loaded (``run``)."""

    def __init__(self, folder: str | os.PathLike):
        folder = Path(folder)
        self.folder = folder
        try:
            plan = json.loads((folder / "plan.json").read_text())
        except (OSError, ValueError) as e:
            raise EvalError(f"{folder}: not a library `eqquant compile` wrote (its plan.json: "
                            f"{e.strerror if isinstance(e, OSError) else e})") from None
        if plan.get("format") != FORMAT:
            raise EvalError(f"{folder}: a saved program of format {plan.get('format')}, "
                            f"this eqquant reads {FORMAT}")
        self.plan = plan
        self.threads = plan["threads"]
        self._lib = lib = ctypes.CDLL(str(folder / "program.so"))
        if plan["tiles"] and not lib.eqq_request_tiles():
            raise EvalError(f"{folder}: its kernels use AMX tiles, which Linux refused this "
                            "process")
        self.roots = self._roots(folder / "data.bin", plan["roots"])
        functions = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                     for name in plan["functions"]]
        tables: dict = {}           # a GEMM table's function -> the addresses it gives
        for s in plan["slots"]:
            if s["index"] is not None:
                tables[s["function"]] = max(tables.get(s["function"], 0), s["index"] + 1)
        for f, count in tables.items():
            out = (ctypes.c_int64 * count)()
            ctypes.CFUNCTYPE(None, ctypes.c_int64)(functions[f])(ctypes.addressof(out))
            tables[f] = list(out)
        cells = {}
        for s in plan["slots"]:
            cell = ctypes.c_void_p.in_dll(lib, "eqquant_slot." + s["name"])
            cells[s["name"]] = ctypes.addressof(cell)
            if s["function"] is not None:   # a C function's, or the index-th of a table's
                cell.value = (functions[s["function"]] if s["index"] is None
                              else tables[s["function"]][s["index"]])
        self.blocks = []
        table = (_Launch * len(plan["launches"]))()
        for j, launch in enumerate(plan["launches"]):
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
        self._table = table
        self._run = lib.eqq_run
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._run.restype = None
        self._arrays = {i["name"]: self._array(i) for i in plan["inputs"]}
        self.inputs = {i["name"]: TensorType(tuple(i["shape"]), i["dtype"])
                       for i in plan["inputs"]}            # name -> type
        self.aliases = plan.get("aliases", {})             # another name -> name
        self.output = self._array(plan["output"])

    @staticmethod
    def _roots(path: Path, entries: list) -> list[np.ndarray]:
        data = None
        if any(e["at"] is not None for e in entries) and path.stat().st_size:
            data = np.memmap(path, np.uint8, mode="c")
        roots = []
        for e in entries:
            if e["at"] is None:         # filled at a run: made empty, at the same phase
                raw = np.empty(e["bytes"] + PHASE, np.uint8)
                start = (e["phase"] - raw.ctypes.data) % PHASE
                roots.append(raw[start:start + e["bytes"]])
            else:
                roots.append(data[e["at"]:e["at"] + e["bytes"]])
        return roots

    def _array(self, v: dict) -> np.ndarray:
        root = self.roots[v["root"]]
        dtype = np.dtype(v["dtype"])
        count = int(np.prod(v["shape"], dtype=np.int64))
        flat = root[v["offset"]:v["offset"] + count * dtype.itemsize]
        return flat.view(dtype).reshape(v["shape"])

    def run(self, inputs) -> np.ndarray:
        """The program's output for ``inputs`` (name -> array, or the one input's array)."""
        if not isinstance(inputs, Mapping):
            if len(self.inputs) != 1:
                raise EvalError(f"the program takes {len(self.inputs)} inputs: give them "
                                "by name")
            inputs = {next(iter(self.inputs)): inputs}
        inputs = {self.aliases.get(k, k): v for k, v in inputs.items()}
        for name, t in self.inputs.items():
            if name not in inputs:
                raise EvalError(f"no value for input %{name}")
            self._arrays[name][...] = check_input(name, inputs[name], t)
        self._run(ctypes.addressof(self._table), len(self._table), self.threads)
        return np.array(self.output)
