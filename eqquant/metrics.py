"""Metrics: a score per sample of a model's output against its label, higher is better,
averaged over a labelled set (``evaluation.evaluate``; mixed precision's ``max_drop``)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .errors import EqquantError


def _top(k: int):
    def score(output, label) -> float:
        out = np.asarray(output).reshape(-1)
        want = int(np.asarray(label).reshape(-1)[0])
        if not 0 <= want < out.size:
            raise EqquantError(f"label {want} is not a class of an output of {out.size}")
        # (ties broken toward the lower class, as argmax does)
        better = np.count_nonzero(out > out[want]) + np.count_nonzero(out[:want] == out[want])
        return float(better < k)
    score.__name__ = f"top{k}"
    return score


def _mse(output, label) -> float:
    out, ref = np.asarray(output, np.float64), np.asarray(label, np.float64)
    if out.shape != ref.shape:
        raise EqquantError(f"mse compares an output of shape {out.shape} with a label of "
                           f"shape {ref.shape}")
    return -float(np.mean((out - ref) ** 2))


METRICS: dict[str, Callable[[Any, Any], float]] = {
    "top1": _top(1),        # 1.0 where the label is the highest output, else 0.0
    "top5": _top(5),        # ... among the five highest
    "neg_mse": _mse,        # minus the mean squared error against a reference output
}


def metric_function(metric: str | Callable) -> tuple[str, Callable]:
    if callable(metric):
        return getattr(metric, "__name__", "metric"), metric
    if metric not in METRICS:
        raise EqquantError(f"unknown metric {metric!r} (there are: {', '.join(METRICS)}; or "
                           f"give a function of (output, label))")
    return metric, METRICS[metric]


def score_all(run, items, score) -> list[float]:
    out = []
    for inputs, label in items:
        y = run(inputs)
        out.append(float(score(y[0] if isinstance(y, tuple) else y, label)))
    return out


def mean_score(run: Callable, inputs: dict, data: Any, metric: str | Callable) -> float:
    """``metric`` averaged over the labelled ``data``, each sample's output ``run(inputs)``
    (a program taking ``inputs``: name -> (shape, dtype)); mixed precision's metric."""
    from .datasets import Samples
    _, score = metric_function(metric)
    scores = score_all(run, Samples(data, inputs, labelled=True, what="evaluation"), score)
    if not scores:
        raise EqquantError("the evaluation set is empty")
    return float(np.mean(np.asarray(scores, np.float64)))




def over(data: Any, inputs: dict, metric: str | Callable) -> Callable[[Callable], float]:
    """Mixed precision's metric: a program's ``run`` to ``metric`` averaged over the labelled
    ``data`` (``mean_score``); an unknown metric is an error now, not at the first program."""
    metric_function(metric)
    return lambda run: mean_score(run, inputs, data, metric)
