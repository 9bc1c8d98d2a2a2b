"""Params: ``.npz`` files of named arrays, and binding them into a program.

Keys are either a parameter's name (``conv1.weight``: a value for ``%conv1.weight``) or
``meta[relay.Constant][i]`` (the value of that constant). Files are read with
``allow_pickle=False`` and written atomically (a failed write leaves the old file).
"""
from __future__ import annotations

from collections import abc
import re
import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import ParamsError
from ..core.nodes import Constant, Expr, Function, Module, iter_functions, post_order, rewrite
from ..core.types import TensorType

_META = re.compile(r"^meta\[relay\.Constant\]\[(\d+)\]$")


def meta_key(index: int) -> str:
    return f"meta[relay.Constant][{index}]"


MAX_ARRAY_BYTES = 1 << 34      # 16 GiB: the largest array a params file may declare


def load_params(path: str | Path) -> "NpzParams":
    """The arrays of an ``.npz`` file, read lazily (an array is read when it is first looked
    up, so a huge entry the program never uses costs nothing) and with ``allow_pickle=False``.
    Each entry's header is checked when the file is opened: a non-array or an entry declaring
    more than MAX_ARRAY_BYTES is a clear error, not an allocation."""
    return NpzParams(Path(path))


class NpzParams(abc.Mapping):
    def __init__(self, path: Path):
        self.path = path
        self._cache: dict[str, np.ndarray] = {}
        self._npz = None
        try:
            if not zipfile.is_zipfile(path):
                hint = (" (an .npy holds one array; a params or input file with names is an "
                        ".npz: np.savez(path, name=array))" if path.suffix == ".npy" else "")
                raise ParamsError(f"{path}: not an .npz file{hint}")
            with zipfile.ZipFile(path) as zf:
                self._names = {}
                self._shapes: dict[str, tuple[int, ...]] = {}
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        raise ParamsError(f"{path}: entry '{info.filename[:80]}' is not an "
                                          f"array (.npy)")
                    with zf.open(info) as f:
                        shape, dtype = _npy_header(f, path, info.filename)
                    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    if size > MAX_ARRAY_BYTES:
                        raise ParamsError(f"{path}: entry '{info.filename[:-4][:80]}' declares "
                                          f"{size:.3g} bytes (shape {shape}), more than "
                                          f"{MAX_ARRAY_BYTES:.3g}")
                    self._names[info.filename[:-4]] = info.filename
                    self._shapes[info.filename[:-4]] = shape
        except FileNotFoundError:
            raise ParamsError(f"{path}: no such params file") from None
        except IsADirectoryError:
            raise ParamsError(f"{path}: is a folder, not an .npz file") from None
        except (ValueError, OSError, zipfile.BadZipFile, EOFError, RuntimeError) as e:
            raise ParamsError(f"{path}: not a readable .npz file ({e})") from None

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._cache:
            if key not in self._names:
                raise KeyError(key)
            try:
                if self._npz is None:     # opened once, on the first entry read
                    self._npz = np.load(self.path, allow_pickle=False)
                self._cache[key] = self._npz[key]
                if len(self._cache) == len(self._names):
                    self.close()
            except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
                raise ParamsError(f"{self.path}: entry '{key}' is not readable ({e})") \
                    from None
        return self._cache[key]

    def shape(self, key: str) -> tuple[int, ...]:
        """Entry ``key``'s shape, from its header (nothing read)."""
        return self._shapes[key]

    def rows(self, key: str, step: int):
        """Entry ``key``'s leading-axis rows, ``step`` at a time, each read from the file as
        it is asked for: a stack of samples larger than memory streams (an entry stored
        column-major is read whole)."""
        from numpy.lib import format as npy
        shape = self._shapes[key]
        if not shape:
            raise ParamsError(f"{self.path}: entry '{key}' is a scalar, not rows")
        try:
            with zipfile.ZipFile(self.path) as zf, zf.open(self._names[key]) as f:
                version = npy.read_magic(f)
                _, fortran, dtype = (npy.read_array_header_1_0(f) if version == (1, 0) else
                                     npy.read_array_header_2_0(f))
                whole = self[key] if fortran else None
                per = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
                for i in range(0, shape[0], step):
                    k = min(step, shape[0] - i)
                    if whole is not None:
                        yield whole[i:i + k]
                        continue
                    data = f.read(per * k)
                    if len(data) != per * k:
                        raise ParamsError(f"{self.path}: entry '{key}' ends after "
                                          f"{i + len(data) // max(per, 1)} of its "
                                          f"{shape[0]} rows")
                    yield np.frombuffer(bytearray(data), dtype).reshape((k, *shape[1:]))
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise ParamsError(f"{self.path}: entry '{key}' is not readable ({e})") from None

    def close(self) -> None:
        if self._npz is not None:
            self._npz.close()
            self._npz = None

    def __del__(self) -> None:
        self.close()

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _npy_header(f, path: Path, name: str) -> tuple[tuple[int, ...], np.dtype]:
    from numpy.lib import format as npy
    try:
        version = npy.read_magic(f)
        shape, _, dtype = (npy.read_array_header_1_0(f) if version == (1, 0) else
                           npy.read_array_header_2_0(f))
    except Exception as e:  # noqa: BLE001 - a damaged header fails in many ways (tokenize...)
        raise ParamsError(f"{path}: entry '{name[:80]}' is not an array "
                          f"({type(e).__name__})") from None
    if dtype.hasobject:
        raise ParamsError(f"{path}: entry '{name[:-4][:80]}' holds Python objects (refused: "
                          f"files are read with allow_pickle=False)")
    return tuple(shape), dtype


def meta_constants(params: Mapping[str, np.ndarray]) -> dict[int, np.ndarray]:
    out = {}
    for k in params:            # (keys first: a lazy file reads only the arrays asked for)
        m = _META.match(k)
        if m:
            out[int(m.group(1))] = params[k]
    return out


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp_path)`` then move the result over ``path``; ``path`` is untouched
    if anything fails (see :mod:`eqquant.ir.outputs`)."""
    from .outputs import write_file
    write_file(path, write)


def params_writer(params: Mapping[str, np.ndarray]):
    def write(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, **{k: np.asarray(v) for k, v in params.items()})
    return write


def save_params(path: str | Path, params: Mapping[str, np.ndarray]) -> None:
    atomic_write(path, params_writer(params))


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


def load_inputs(path: str | Path, free: list[str]) -> dict[str, np.ndarray]:
    """A program's inputs, whose names are ``free``: an ``.npy`` (the one input the program
    has) or an ``.npz`` keyed by input name."""
    path = Path(path)
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise ParamsError(f"{path}: no such input file") from None
        except (ValueError, OSError) as e:
            raise ParamsError(f"{path}: not a readable .npy file ({e})") from None
        if len(free) != 1:
            raise ParamsError(f"{path}: an .npy gives one input, but the program has "
                              f"{len(free)} ({', '.join('%' + f for f in free)}); use an .npz")
        return {free[0]: arr}
    return load_params(path)
