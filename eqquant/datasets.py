"""Input data for calibration and evaluation, streamed one sample at a time.

A source is any of:

- a dict of arrays keyed by input name (an evaluation's label under ``label``);
- an array (a model of one input);
- an iterable (a list, a generator, a ``torch.utils.data.DataLoader``) of such dicts or
  arrays, or of ``(inputs, label)`` pairs; for evaluation, one ``(inputs, labels)`` tuple;
- an ``.npz`` file (keys as a dict's), an ``.npy`` file (one input), or a folder of them,
  read in name order.

Each array is one sample of its input (the input's own shape), a stack of samples on a new
leading axis, or a batch of them on the input's own leading (batch) axis: ``(8, 3, 224,
224)`` is 8 samples of an input ``(1, 3, 224, 224)``. Files are read as the samples are
asked for, ``.npy`` files mapped and ``.npz`` entries row by row, so memory does not grow with
the size of the set; ``.npz`` and ``.npy`` files load with ``allow_pickle=False``.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .core.types import Dim, TensorType, is_static, match_shape
from .errors import EqquantError, EvalError

LABEL = "label"          # an evaluation's label in a dict or an .npz file ("labels" too)
_LABELS = (LABEL, "labels")
Spec = Mapping[str, tuple[tuple[int, ...], str]]    # input name -> (shape, dtype)


class Samples:
    """The samples of ``source`` for a model taking ``inputs``: each an input dict, or with
    ``labelled`` an ``(inputs, label)`` pair. Iterating reads the source again (a
    generator's items once); ``total`` is the number of samples where it is known without
    reading them (a list's, a file's), else None."""

    def __init__(self, source: Any, inputs: Spec, aliases: Mapping[str, str] | None = None,
                 labelled: bool = False, what: str = "calibration") -> None:
        self.source, self.inputs, self.labelled, self.what = source, dict(inputs), labelled, what
        self.aliases = dict(aliases or {})
        if isinstance(source, (str, Path)):
            path = Path(source)
            if not path.exists():
                raise EqquantError(f"{path}: no such file or folder")
            if path.is_dir() and not _files(path):
                raise EqquantError(f"{path}: the folder holds no .npy or .npz file")
            if path.is_file() and path.suffix not in (".npz", ".npy"):
                raise EqquantError(f"{path}: {what} data is an .npz or .npy file, or a folder "
                                   f"of them")
        elif not (isinstance(source, (Mapping, Iterable)) or _is_array(source)):
            raise EqquantError(f"{what} data must be arrays, dicts of arrays, an iterable "
                               f"of them, or a path, not {type(source).__name__}")

    @property
    def total(self) -> int | None:
        src = self.source
        try:
            if isinstance(src, (str, Path)):
                return sum(self._count(item) for item, _, _ in _file_items(Path(src)))
            if isinstance(src, Mapping) or _is_array(src):
                return self._count(src)
            if isinstance(src, (list, tuple)):
                return sum(self._count(_unpair(x)[0]) for x in src)
        except EqquantError:
            return None
        return None

    def _count(self, item) -> int:
        return _count(self._layout(self._arrays(item, ""), ""))

    def __iter__(self) -> Iterator:
        n = 0
        for item, label, where in self._items():
            for sample, lab in self._split(item, label, where or f"{self.what} item {n}"):
                yield (sample, lab) if self.labelled else sample
            n += 1

    def _items(self):
        src = self.source
        if isinstance(src, (str, Path)):
            yield from _file_items(Path(src))
        elif isinstance(src, Mapping) or _is_array(src):
            yield src, None, ""
        elif self.labelled and isinstance(src, tuple) and len(src) == 2 and \
                (isinstance(src[0], Mapping) or _is_array(src[0])):
            yield src[0], src[1], ""          # (inputs, labels): one labelled item
        else:
            for x in src:
                item, label = _unpair(x)
                yield item, label, ""

    def _arrays(self, item, where: str) -> dict[str, Any]:
        """``item``'s arrays by input name (a label not among them)."""
        names = list(self.inputs)
        if isinstance(item, Mapping):
            named = {self.aliases.get(k, k): v for k, v in item.items() if k not in _LABELS}
            extra = [k for k in named if k not in self.inputs]
            if extra:
                raise EqquantError(f"{where}{': ' if where else ''}{self.what} data names "
                                   f"{', '.join(map(str, extra))}, which the model does not "
                                   f"take (its inputs: {', '.join(names)})")
            missing = [n for n in names if n not in named]
            if missing:
                raise EqquantError(f"{where}{': ' if where else ''}{self.what} data has no "
                                   f"array for {', '.join(missing)}")
            return named
        if len(names) != 1:
            raise EqquantError(f"the model has {len(names)} inputs ({', '.join(names)}): give "
                               f"each {self.what} sample as a dict of arrays")
        return {names[0]: item}

    def _layout(self, arrays: dict[str, Any], where: str) -> dict[str, tuple[int, bool, int]]:
        """Per input: (rows per sample, whether a sample is one row of a stack, samples)."""
        out = {}
        for name, a in arrays.items():
            have = tuple(np.shape(a))
            want = tuple(self.inputs[name][0])
            if not is_static(TensorType(want, "float32")):
                out[name] = _open_layout(name, have, want, where, self.what)
            elif have == want:
                out[name] = (have[0] if have else 0, False, 1)
            elif len(have) == len(want) + 1 and have[1:] == want:
                out[name] = (1, True, have[0])
            elif want and len(have) == len(want) and have[1:] == want[1:] and want[0] and \
                    have[0] % want[0] == 0:
                out[name] = (want[0], False, have[0] // want[0])
            else:
                raise EqquantError(
                    f"{where}: {self.what} array {name!r} has shape {have}: the input's own "
                    f"shape {want} (one sample), that shape stacked on a new leading axis, "
                    f"or a batch of samples on its leading axis")
        counts = {c for _, _, c in out.values()}
        if len(counts) > 1:
            raise EqquantError(f"{where}: the {self.what} arrays hold different numbers of "
                               f"samples: " + ", ".join(f"{k} {c}" for k, (_, _, c)
                                                        in out.items()))
        return out

    def _split(self, item, label, where: str):
        arrays = self._arrays(item, where)
        if self.labelled and label is None and isinstance(item, Mapping):
            label = next((item[k] for k in _LABELS if k in item), None)
        if self.labelled and label is None:
            raise EqquantError(f"{where}: no label (give (inputs, label) pairs, or a "
                               f"{LABEL!r} entry beside the inputs)")
        if isinstance(label, _Entry):
            label = np.asarray(label)
        layout = self._layout(arrays, where)
        count = _count(layout)
        if self.labelled and count > 1 and np.shape(label)[:1] != (count,):
            raise EqquantError(f"{where}: {count} samples but labels of shape "
                               f"{np.shape(label)}: one label per sample on the leading axis")
        readers = {name: _rows(arrays[name], layout[name][0] or 1) for name in arrays}
        for i in range(count):
            sample = {}
            for name, rows in readers.items():
                stacked = layout[name][1]
                chunk = next(rows) if layout[name][0] else np.asarray(arrays[name])
                sample[name] = np.asarray(chunk[0] if stacked else chunk)
            yield sample, (label[i] if self.labelled and count > 1 else label)


def _open_layout(name, have, want, where, what) -> tuple[int, bool, int]:
    """An array for an input with sizes known only at run time: one sample at its own sizes,
    samples stacked on a new axis, or, where the leading size is open (a batch), that many
    samples of one row each."""
    for shape, stacked in ((have, False), (have[1:], True)):
        try:
            match_shape(name, shape, TensorType(want, "float32"), {})
        except EvalError:
            continue
        if stacked:
            return (1, True, have[0])
        if isinstance(want[0], Dim) and len(want[0].names) == 1 and have[0] > 1:
            return (1, False, have[0])
        return (have[0], False, 1)
    raise EqquantError(f"{where}: {what} array {name!r} has shape {have}, which does not fit "
                       f"the input's shape ({', '.join(map(str, want))})")


def _count(layout) -> int:
    """The number of samples an item holds (its inputs agree: ``Samples._layout``)."""
    return next(iter(layout.values()))[2]


def _rows(a, step: int) -> Iterator:
    """``a``'s leading-axis rows, ``step`` at a time (a file entry's read as asked)."""
    if isinstance(a, _Entry):
        return a.params.rows(a.key, step)
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    return (a[i:i + step] for i in range(0, len(a), step))


class _Entry:
    """An ``.npz`` entry not yet read: its shape, and its rows on demand."""

    def __init__(self, params, key: str) -> None:
        self.params, self.key = params, key
        self.shape = params.shape(key)

    def __array__(self, dtype=None, copy=None):
        a = self.params[self.key]
        return a if dtype is None else a.astype(dtype)


def _is_array(x) -> bool:
    return isinstance(x, (np.ndarray, _Entry)) or hasattr(x, "__array__") and \
        not isinstance(x, (Mapping, list, tuple, str, bytes))


def _unpair(x) -> tuple[Any, Any]:
    """An iterable's item: inputs alone, or an (inputs, label) pair."""
    if isinstance(x, (tuple, list)) and len(x) == 2 and \
            (isinstance(x[0], Mapping) or _is_array(x[0])):
        return x[0], x[1]
    if isinstance(x, Mapping) or _is_array(x):
        return x, None
    raise EqquantError(f"a data item must be an array, a dict of arrays or an (inputs, "
                       f"label) pair, not {type(x).__name__}")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".npy", ".npz") and p.is_file())


def _file_items(path: Path):
    """(item, label, where) of a file, or of each file of a folder."""
    from .ir.params import load_params
    for f in (_files(path) if path.is_dir() else [path]):
        if f.suffix == ".npy":
            try:
                yield np.load(f, mmap_mode="r", allow_pickle=False), None, str(f)
            except (ValueError, OSError) as e:
                raise EqquantError(f"{f}: not a readable .npy file ({e})") from None
        else:
            params = load_params(f)
            yield {k: _Entry(params, k) for k in params}, None, str(f)
