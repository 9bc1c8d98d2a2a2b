"""What a saved library's ``plan.json`` may hold (``build._plan`` writes it): every field's
type, and every index, offset, size, dtype and thread count within what the files it names
allow. ``check`` runs before the loader forms any address from the plan, so a plan that is
not one eqquant could have written is refused with the field named, never followed into a
crash."""
from __future__ import annotations

import math
import re

import numpy as np

MAX_BYTES = 1 << 40        # a root's size: beyond any program's
MAX_THREADS = 1 << 12
MAX_COUNT = 1 << 31        # a launch's work items
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64")
_NAME = re.compile(r"[A-Za-z_.$][\w.$:-]*\Z")


class PlanError(ValueError):
    """Where the plan differs from what eqquant writes, and how."""


def _int(value, where: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise PlanError(f"{where} is {value!r}, not an integer in [{low}, {high}]")
    return value


def _of(value, kind, where: str):
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise PlanError(f"{where} is {type(value).__name__}, not {name}")
    return value


def _index(value, where: str, size: int) -> int:
    if not size:
        raise PlanError(f"{where} is {value!r}, an index into a list that is empty")
    return _int(value, where, 0, size - 1)


def check(plan, data_bytes: int, format_: int) -> None:
    """Raise PlanError at the first field of ``plan`` (parsed plan.json) that eqquant would
    not write for a data.bin of ``data_bytes`` bytes."""
    _of(plan, dict, "the plan")
    _int(plan.get("format"), "format", format_, format_)
    phase = _int(plan.get("phase"), "phase", 1, 1 << 21)
    if phase & (phase - 1):
        raise PlanError(f"phase is {phase}, not a power of two")
    _int(plan.get("threads"), "threads", 1, MAX_THREADS)
    for field, kind in (("cpu", str), ("key", str), ("tiles", bool), ("aliases", dict),
                        ("ops", list)):
        _of(plan.get(field), kind, field)
    for k, v in plan["aliases"].items():
        _of(v, str, f"aliases[{k!r}]")

    roots = _of(plan.get("roots"), list, "roots")
    sizes = []
    for r, e in enumerate(roots):
        where = f"roots[{r}]"
        _of(e, dict, where)
        size = _int(e.get("bytes"), f"{where}.bytes", 0, MAX_BYTES)
        _int(e.get("phase"), f"{where}.phase", 0, phase - 1)
        if e.get("at") is not None:
            at = _int(e["at"], f"{where}.at", 0, MAX_BYTES)
            if size and at + size > data_bytes:
                raise PlanError(f"{where} lies at bytes {at}..{at + size} of a data.bin of "
                                f"{data_bytes}")
            _of(e.get("state", False), bool, f"{where}.state")
        sizes.append(size)

    functions = _of(plan.get("functions"), list, "functions")
    for j, name in enumerate(functions):
        if not isinstance(name, str) or not _NAME.match(name):
            raise PlanError(f"functions[{j}] is {name!r}, not a C function's name")

    for j, t in enumerate(_of(plan.get("tables"), list, "tables")):
        _of(t, dict, f"tables[{j}]")
        _index(t.get("function"), f"tables[{j}].function", len(functions))
        _int(t.get("length"), f"tables[{j}].length", 1, 1 << 16)
    slots = set()
    for j, s in enumerate(_of(plan.get("slots"), list, "slots")):
        where = f"slots[{j}]"
        _of(s, dict, where)
        name = _of(s.get("name"), str, f"{where}.name")
        if not _NAME.match(name):
            raise PlanError(f"{where}.name is {name!r}, not a slot's name")
        slots.add(name)
        if s.get("function") is not None:
            _index(s["function"], f"{where}.function", len(functions))
        if s.get("index") is not None:
            _int(s["index"], f"{where}.index", 0, 1 << 16)   # (in its table: the loader)

    _launch_table(plan, "", sizes, len(functions), slots)
    if "batched" in plan:       # (a second table of launches, at a batch of its own)
        batched = _of(plan["batched"], dict, "batched")
        _launch_table(batched, "batched.", sizes, len(functions), slots)
        want = [[v["name"], v["dtype"], v["shape"][1:]] for v in plan["inputs"]]
        if [[v["name"], v["dtype"], v["shape"][1:]] for v in batched["inputs"]] != want or \
                len({tuple(v["shape"][:1]) for v in batched["inputs"]}) != 1 or \
                not all(v["shape"] for v in batched["inputs"]):
            raise PlanError("batched.inputs are not the plan's inputs at one batch size")


def _launch_table(table: dict, prefix: str, sizes: list[int], functions: int,
                  slots: set) -> None:
    """A table of launches (the plan's own, or its batched one, ``prefix`` "batched."): its
    inputs, output and launches, within the plan's roots, functions and slots."""
    names = set()
    for j, v in enumerate(_of(table.get("inputs"), list, f"{prefix}inputs")):
        where = f"{prefix}inputs[{j}]"
        _value(v, where, sizes)
        names.add(_of(v.get("name"), str, f"{where}.name"))
        if "bounds" in v:       # (lowest, highest, why): what the input's values must be
            b = _of(v["bounds"], list, f"{where}.bounds")
            if len(b) != 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                      for x in b[:2]) or not isinstance(b[2], str):
                raise PlanError(f"{where}.bounds is {b!r}, not [lowest, highest, why]")
    if len(names) != len(table["inputs"]):
        raise PlanError(f"{prefix}inputs name one input twice")
    _value(table.get("output"), f"{prefix}output", sizes)

    for j, launch in enumerate(_of(table.get("launches"), list, f"{prefix}launches")):
        where = f"{prefix}launches[{j}]"
        _of(launch, dict, where)
        _index(launch.get("function"), f"{where}.function", functions)
        _int(launch.get("count"), f"{where}.count", 0, MAX_COUNT)
        _of(launch.get("op"), str, f"{where}.op")
        _of(launch.get("step"), int, f"{where}.step")
        words = _of(launch.get("words"), list, f"{where}.words")
        for k, w in enumerate(words):
            _int(w, f"{where}.words[{k}]", -(1 << 63), (1 << 63) - 1)
        for k, ref in enumerate(_of(launch.get("refs"), list, f"{where}.refs")):
            at = f"{where}.refs[{k}]"
            if not isinstance(ref, list) or len(ref) not in (3, 4):
                raise PlanError(f"{at} is {ref!r}, not [word, kind, what(, offset)]")
            _index(ref[0], f"{at}[0]", len(words))
            kind, what = ref[1], ref[2]
            if kind == "root" and len(ref) == 4:
                r = _index(what, f"{at}[2]", len(sizes))
                _int(ref[3], f"{at}[3]", 0, sizes[r])
            elif kind == "function" and len(ref) == 3:
                _index(what, f"{at}[2]", functions)
            elif kind == "slot" and len(ref) == 3:
                if what not in slots:
                    raise PlanError(f"{at} names slot {what!r}, which the plan lacks")
            else:
                raise PlanError(f"{at} is {ref!r}, not a root, function or slot reference")


def _value(v, where: str, sizes: list[int]) -> None:
    """An input's or the output's array: a dtype, a shape, bytes inside its root."""
    _of(v, dict, where)
    r = _index(v.get("root"), f"{where}.root", len(sizes))
    offset = _int(v.get("offset"), f"{where}.offset", 0, sizes[r])
    if v.get("dtype") not in DTYPES:
        raise PlanError(f"{where}.dtype is {v.get('dtype')!r}, not one of {', '.join(DTYPES)}")
    shape = _of(v.get("shape"), list, f"{where}.shape")
    for k, n in enumerate(shape):
        _int(n, f"{where}.shape[{k}]", 0, MAX_BYTES)
    size = math.prod(shape) * np.dtype(v["dtype"]).itemsize
    if offset + size > sizes[r]:
        raise PlanError(f"{where} takes bytes {offset}..{offset + size} of roots[{r}], which "
                        f"has {sizes[r]}")
