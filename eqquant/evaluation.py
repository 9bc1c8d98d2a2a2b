"""A model's metric over a labelled set: each sample run, scored against its label, and the
scores averaged; locally, or over Ray workers (the ``ray`` extra), with the same bits.

The data are any source :class:`eqquant.datasets.Samples` streams, each sample with its label
((inputs, label) pairs, a ``label`` entry beside the inputs). A metric is a name in
``metrics.METRICS`` or a function ``f(output, label) -> float``, higher is better, one score a sample.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .errors import EqquantError
from .metrics import metric_function, score_all


@dataclass
class Evaluation:
    """``value``: the mean of ``scores`` (one per sample, in the data's order)."""

    metric: str
    value: float
    scores: np.ndarray
    engine: str

    @property
    def samples(self) -> int:
        return int(self.scores.size)

    def __str__(self) -> str:
        return (f"{self.metric}: {self.value:.6g} over {self.samples} samples "
                f"({self.engine})")


# what runs a model, as a worker opens it: ("library", folder) for a folder eqquant compile
# wrote; ("program", path) for a file opened as `eqquant run` opens it (optimized, its library
# cached); ("saved", name, text, weights) for a model given in memory, run as it is (its
# executor), carried as its text IR and .npz bytes (a worker on another machine has no file)
Opener = tuple


def open_runner(how: Opener):
    kind = how[0]
    if kind == "library":
        from .deploy.loader import Library
        return Library(how[1])
    if kind == "program":
        from .deploy.cache import open_program
        return open_program(how[1]).runner
    import atexit
    import shutil
    from .api import load
    folder = Path(tempfile.mkdtemp(prefix="eqquant-worker-"))
    atexit.register(shutil.rmtree, folder, True)
    _, name, text, weights = how
    ir = folder / name
    ir.write_text(text, encoding="utf-8")
    if weights:
        ir.with_suffix(".npz").write_bytes(weights)
    return load(ir)


def _packed(model) -> Opener:
    with tempfile.TemporaryDirectory(prefix="eqquant-eval-") as tmp:
        ir = model.save(tmp)
        npz = ir.with_suffix(".npz")
        return ("saved", ir.name, ir.read_text(encoding="utf-8"),
                npz.read_bytes() if npz.exists() else b"")


class _Scorer:
    """A worker's part: the model opened once, a chunk of samples scored at a time."""

    def __init__(self, how: Opener, score) -> None:
        self.runner, self.score = open_runner(how), score

    def feed(self, items, start: int) -> list[float]:
        return score_all(self.runner.run, items, self.score)


def evaluate(model: Any, data: Any, metric: str | Callable = "top1", engine: str = "local",
             workers: int | None = None, chunk: int = 16, progress=None) -> Evaluation:
    """``metric`` of ``model`` over the labelled ``data``. ``model``: a path (text IR or
    .onnx, opened as ``eqquant run`` opens it; a folder ``eqquant compile`` wrote) or anything
    :func:`eqquant.load` takes. ``engine="ray"``: the samples go in chunks of ``chunk`` to
    ``workers`` Ray actors (default: the cluster's CPUs), each opening the model once; the
    scores come back in order, so the result is the local one bit for bit. ``progress``:
    called with the number of samples scored so far."""
    from functools import partial

    from .api import Model, load
    from .datasets import Samples
    from .parallel import on_ray
    name, score = metric_function(metric)
    if engine not in ("local", "ray"):
        raise EqquantError(f"unknown engine {engine!r} (local or ray)")
    if isinstance(model, (str, os.PathLike)):
        how: Opener = ("library" if Path(model).is_dir() else "program", str(model))
        runner = open_runner(how)
    else:
        runner = model if isinstance(model, Model) else load(model)
        how = _packed(runner) if engine == "ray" else ()
    spec = {k: (tuple(v.shape), v.dtype) if hasattr(v, "shape") else v
            for k, v in runner.inputs.items()}
    samples = Samples(data, spec, getattr(runner, "aliases", None), labelled=True,
                      what="evaluation")
    if engine == "local":
        scores: list[float] = []
        for item in samples:
            scores += score_all(runner.run, [item], score)
            if progress is not None:
                progress(len(scores))
    else:
        parts, _ = on_ray(partial(_Scorer, how, score), samples, chunk, workers, progress)
        scores = [x for part in parts for x in part]
    if not scores:
        raise EqquantError("the evaluation set is empty")
    values = np.asarray(scores, np.float64)
    return Evaluation(name, float(np.mean(values)), values, engine)
