"""Params: ``.npz`` files of named arrays, and binding them into a program.

Keys are either a parameter's name (``conv1.weight``: a value for ``%conv1.weight``) or
``meta[relay.Constant][i]`` (the value of that constant). Files are read with
``allow_pickle=False`` and written atomically (a failed write leaves the old file).
"""
from __future__ import annotations

import os
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import ParamsError
from .nodes import Constant, Expr, Function, Module, iter_functions, post_order, rewrite
from .types import TensorType

_META = re.compile(r"^meta\[relay\.Constant\]\[(\d+)\]$")


def meta_key(index: int) -> str:
    return f"meta[relay.Constant][{index}]"


def load_params(path: str | Path) -> dict[str, np.ndarray]:
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such params file") from None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise ParamsError(f"{path}: not a readable .npz file ({e})") from None


def meta_constants(params: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    out = {}
    for k, v in params.items():
        m = _META.match(k)
        if m:
            out[int(m.group(1))] = v
    return out


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)`` then move the result over ``path``; ``path`` is untouched
    if anything fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_params(path: str | Path, params: Mapping[str, np.ndarray]) -> None:
    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in params.items()})
    atomic_write(path, write)


def module_constants(mod: Module) -> dict[int, Constant]:
    out: dict[int, Constant] = {}
    for fn in mod.functions.values():
        for f in [fn, *iter_functions(fn.body)]:
            for node in post_order(f.body):
                if isinstance(node, Constant):
                    out[node.index] = node
    return out


def constant_params(mod: Module) -> dict[str, np.ndarray]:
    """The data of the module's constants, keyed ``meta[relay.Constant][i]``."""
    return {meta_key(i): c.data for i, c in sorted(module_constants(mod).items())
            if c.data is not None}


def _check(name: str, value: np.ndarray, ty: TensorType) -> np.ndarray:
    if tuple(value.shape) != ty.shape or str(value.dtype) != ty.dtype:
        raise ParamsError(f"param '{name}' is {value.dtype}{list(value.shape)} but the program "
                          f"declares {ty}")
    return value


def bind_params(mod: Module, params: Mapping[str, np.ndarray],
                entry: str = "main") -> Module:
    """Turn ``entry``'s parameters named in ``params`` into constants (TVM's BindParams) and
    give data to ``meta`` constants keyed in ``params``. New constants are numbered after the
    existing ones, in parameter order."""
    existing = module_constants(mod)
    meta = meta_constants(params)
    next_index = max(existing, default=-1) + 1
    fn = mod.functions[entry]
    replace: dict[int, Expr] = {}
    for p in fn.params:
        if p.name in params:
            if not isinstance(p.type, TensorType):
                raise ParamsError(f"param '{p.name}' has type {p.type}; only tensors bind")
            data = _check(p.name, np.asarray(params[p.name]), p.type)
            replace[id(p)] = Constant(index=next_index, type=p.type, data=data, loc=p.loc)
            next_index += 1

    def visit(node, children):
        if id(node) in replace:
            return replace[id(node)]
        if isinstance(node, Constant) and node.index in meta and node.data is None:
            return Constant(index=node.index, type=node.type, loc=node.loc,
                            data=_check(meta_key(node.index), meta[node.index], node.type))
        return None

    functions = {}
    for name, f in mod.functions.items():
        body = rewrite(f.body, visit)
        keep = tuple(p for p in f.params if id(p) not in replace)
        functions[name] = Function(params=keep, body=body, ret_type=f.ret_type, attrs=f.attrs,
                                   name=f.name, loc=f.loc)
    return Module(functions, version=mod.version)

