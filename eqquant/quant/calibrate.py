"""Calibration: the range of each value over a calibration set, and the scales that follow.

Observers (one per value, fed batch by batch):

- ``minmax``: the smallest and largest value seen.
- ``percentile``: the given percentile (default 99.999) of |x|, as a symmetric range.
- ``global_scale``: TVM's fixed range (+-8.0 by default) for every value.
- ``kl_divergence``: TVM's (and MXNet's) threshold search: an 8001-bin histogram of x over
  [-max|x|, max|x|], then for each candidate threshold the clipped distribution p is compared
  with its 255-level quantization q (both smoothed) and the threshold of least KL(p || q) wins.

Weight scales (``weight_scale``): ``max`` (max|w| / 127) or ``power2`` (rounded up to a power of
two), per tensor or per output channel.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from numba import njit, prange

NUM_BINS = 8001
NUM_QUANTIZED_BINS = 255


@njit(cache=True)
def _smooth(p, eps, out):
    """``out`` = p with a little mass (eps) moved onto its empty bins, taken evenly from the
    others; False when it cannot (all empty, or too few non-empty bins to give it)."""
    n_zero = 0
    for v in p:
        if v == 0:
            n_zero += 1
    n_nonzero = p.size - n_zero
    if n_nonzero == 0:
        return False
    eps1 = eps * n_zero / n_nonzero
    if eps1 >= 1.0:
        return False
    for k in range(p.size):
        out[k] = p[k] + eps if p[k] == 0 else p[k] - eps1
    return True


@njit(cache=True)
def _kl(p, q):
    """KL(p || q) of the normalised distributions, over the bins where both are positive."""
    sp, sq = p.sum(), q.sum()
    total = 0.0
    for k in range(p.size):
        a, b = p[k] / sp, q[k] / sq
        if a > 0 and b > 0:
            total += a * np.log(a / b)
    return total


@njit(cache=True, parallel=True)
def _kl_sweep(hist, num_quantized_bins):
    """The end (an index into the edges) of the window of least KL divergence (the first such
    window, as a sequential sweep finds it; the windows are scored in parallel)."""
    num_bins = hist.size
    zero = num_bins // 2
    first = num_quantized_bins // 2
    cumulative = np.zeros(num_bins + 1)
    for k in range(num_bins):
        cumulative[k + 1] = cumulative[k] + hist[k]
    divs = np.full(zero + 1 - first, np.inf)
    for t in prange(zero + 1 - first):
        i = first + t
        start, stop = zero - i, zero + i + 1
        n = stop - start
        sliced = hist[start:stop]
        p = sliced.copy()
        p[0] = cumulative[start + 1]                    # everything left of the window
        p[n - 1] = cumulative[num_bins] - cumulative[stop - 1]   # and right of it
        # merge the window into num_quantized_bins levels (the last takes the remainder) and
        # spread each level's mass evenly over its non-empty bins, where p is not empty
        merged = n // num_quantized_bins
        q = np.zeros(n)
        for j in range(num_quantized_bins):
            lo = j * merged
            hi = lo + merged if j < num_quantized_bins - 1 else n
            total, count = 0.0, 0
            for k in range(lo, hi):
                total += sliced[k]
                if sliced[k] != 0:
                    count += 1
            level = total / count if count > 0 else 0.0
            for k in range(lo, hi):
                q[k] = level if p[k] != 0 else 0.0
        ps, qs = np.empty(n), np.empty(n)
        if _smooth(p, 1e-4, ps) and _smooth(q, 1e-4, qs):
            divs[t] = _kl(ps, qs)
    best, best_stop = np.inf, num_bins
    for t in range(divs.size):
        if divs[t] < best:
            best, best_stop = divs[t], zero + first + t + 1
    return best_stop


def kl_threshold(hist: np.ndarray, edges: np.ndarray,
                 num_quantized_bins: int = NUM_QUANTIZED_BINS) -> float:
    """The threshold of least KL divergence over a symmetric histogram (TVM's MinimizeKL):
    for each window [-t, t] around zero, p is the histogram clipped to it (the outside mass
    on its end bins), q its merge into num_quantized_bins levels spread back over p's
    non-empty bins, both smoothed; the t of least KL(p || q) wins."""
    return float(edges[_kl_sweep(hist.astype(np.float64), num_quantized_bins)])


def find_scale_by_kl(x: np.ndarray, num_bins: int = NUM_BINS,
                     num_quantized_bins: int = NUM_QUANTIZED_BINS) -> float:
    """The KL threshold of a sample (TVM's _find_scale_by_kl)."""
    thres = float(np.max(np.abs(x)))
    if thres == 0.0:
        return 0.0
    hist, edges = np.histogram(x, bins=num_bins, range=(-thres, thres))
    return kl_threshold(hist, edges, num_quantized_bins)


@dataclass
class Range:
    """A value's calibrated range; ``scale`` for symmetric int8 is max(|lo|, |hi|) / 127.
    ``clipped``: the share of the value's energy (its calibration values' sum of squares)
    that the range cuts off: 0.01 alone limits its SQNR to 20 dB."""

    lo: float
    hi: float
    clipped: float = 0.0

    @property
    def absmax(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    def scale(self, qmax: int = 127) -> float:
        return self.absmax / qmax if self.absmax else 1.0


class Observer:
    def update(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def range(self) -> Range:
        raise NotImplementedError


class MinMax(Observer):
    def __init__(self) -> None:
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x):
        self.lo = min(self.lo, float(np.min(x)))
        self.hi = max(self.hi, float(np.max(x)))

    def range(self):
        return Range(self.lo, self.hi)


class Percentile(Observer):
    def __init__(self, percentile: float = 99.999) -> None:
        self.percentile = percentile
        self.samples: list[np.ndarray] = []

    def update(self, x):
        self.samples.append(np.abs(np.asarray(x, np.float32)).ravel())

    def range(self):
        seen = np.concatenate(self.samples)
        t = float(np.percentile(seen, self.percentile))
        return Range(-t, t, _cut(seen, t))


class KLDivergence(Observer):
    """Keeps the samples (TVM keeps every output of the calibration runs too) and searches
    the threshold once, over all of them."""

    def __init__(self) -> None:
        self.samples: list[np.ndarray] = []

    def update(self, x):
        self.samples.append(np.asarray(x, np.float32).ravel())

    def range(self):
        seen = np.concatenate(self.samples)
        t = find_scale_by_kl(seen)
        return Range(-t, t, _cut(seen, t))


class GlobalScale(Observer):
    """TVM's ``global_scale``: one fixed range, +-scale (default 8.0), for every value; the
    data only confirm that the value exists."""

    def __init__(self, scale: float = 8.0) -> None:
        self.scale = scale
        self.energy, self.cut = 0.0, 0.0

    def update(self, x):
        x = np.abs(np.asarray(x, np.float64))
        self.energy += float(np.sum(x * x))
        self.cut += float(np.sum(np.maximum(x - self.scale, 0.0) ** 2))

    def range(self):
        return Range(-self.scale, self.scale, self.cut / self.energy if self.energy else 0.0)


def _cut(seen: np.ndarray, t: float) -> float:
    """The share of ``seen``'s energy (sum of squares) that clipping to +-t cuts off."""
    x = np.abs(seen.astype(np.float64))
    energy = float(np.sum(x * x))
    return float(np.sum(np.maximum(x - t, 0.0) ** 2)) / energy if energy else 0.0


OBSERVERS = {"minmax": MinMax, "percentile": Percentile, "kl_divergence": KLDivergence,
             "global_scale": GlobalScale}
# modes that guess a range inside what they saw (a histogram's threshold): a value whose op
# bounds it (``OpDef.bounds``: sigmoid, tanh, softmax) takes its range as seen instead, as
# its distribution is no bell with tails to cut (a sigmoid's outputs near 0.5 all fall
# outside a threshold fit to their spread)
GUESSING = ("kl_divergence", "percentile")
CLIPPED_WARNING = 0.01  # a range cutting off more of a value's energy (its SQNR below 20 dB
                        # from clipping alone): warned


def weight_scale(w: np.ndarray, mode: str = "max", per_channel: bool = False,
                 qmax: int = 127) -> np.ndarray:
    """Symmetric int8 weight scales: one, or one per output channel (axis 0)."""
    a = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) if per_channel else \
        np.array([np.abs(w).max()])
    a = np.where(a == 0, 1.0, a).astype(np.float64)
    if mode == "power2":
        a = 2.0 ** np.ceil(np.log2(a))
    elif mode != "max":
        raise ValueError(f"weight_scale must be max or power2, not {mode!r}")
    return a / qmax


@dataclass
class CalibrationTable:
    """Value name -> range, with how they were found; saved as JSON beside the program."""

    mode: str
    ranges: dict[str, Range]
    # values calibration saw infinite or NaN (an attention mask's -inf, the scores it is added
    # to): they have no range, so they stay float; value name -> what was seen, and where
    unbounded: dict[str, str] = field(default_factory=dict)

    def write(self, path: str | Path) -> None:
        """Write the table as JSON to ``path`` (a plain write: see ``save``)."""
        data = {"mode": self.mode, "ranges": {k: asdict(v) for k, v in self.ranges.items()},
                "unbounded": self.unbounded}
        Path(path).write_text(json.dumps(data, indent=1))

    def save(self, path: str | Path) -> None:
        from ..ir.params import atomic_write
        atomic_write(path, self.write)

    def warnings(self) -> list[str]:
        """One line per value whose range cuts off more than CLIPPED_WARNING of its
        energy."""
        return [f"{name}: the {self.mode} range [{r.lo:.4g}, {r.hi:.4g}] cuts off "
                f"{r.clipped:.0%} of the energy of the values calibration saw there (its "
                f"SQNR {-10 * np.log10(r.clipped):.1f} dB at best; --mode minmax keeps them "
                f"all)" for name, r in self.ranges.items() if r.clipped > CLIPPED_WARNING]

    @classmethod
    def load(cls, path: str | Path) -> "CalibrationTable":
        data = json.loads(Path(path).read_text())
        return cls(data["mode"], {k: Range(**v) for k, v in data["ranges"].items()},
                   dict(data.get("unbounded", {})))
