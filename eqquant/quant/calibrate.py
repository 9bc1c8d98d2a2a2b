"""Calibration: the range of each value over a calibration set, and the scales that follow.

Observers (one per value, fed batch by batch, their memory fixed however many batches come;
two observers of parts of the data merge into the whole's):

- ``minmax``: the smallest and largest value seen.
- ``percentile``: the given percentile (default 99.999) of |x|, as a symmetric range, from a
  histogram of the magnitudes (``Magnitudes``: exact counts in bins 1/4096 of the largest
  magnitude wide at most).
- ``global_scale``: TVM's fixed range (+-8.0 by default) for every value.
- ``kl_divergence``: TVM's (and MXNet's) threshold search: an 8001-bin histogram of x over
  [-max|x|, max|x|], then for each candidate threshold the clipped distribution p is compared
  with its 255-level quantization q (both smoothed) and the threshold of least KL(p || q) wins.
  The 8001 bins are made at the end from a finer histogram (``Magnitudes``, signed).

Weight scales (``weight_scale``): ``max`` (max|w| / 127) or ``power2`` (rounded up to a power of
two), per tensor or per output channel.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
import math
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
    """KL(p || q) of the normalised distributions, over the bins where both are positive
    (a bin equal to the one before it in p and q adds the same term: computed once a run,
    as in a histogram's empty stretches)."""
    sp, sq = p.sum(), q.sum()
    total = 0.0
    last_p, last_q, term = np.nan, np.nan, 0.0
    for k in range(p.size):
        if p[k] != last_p or q[k] != last_q:
            last_p, last_q = p[k], q[k]
            a, b = p[k] / sp, q[k] / sq
            term = a * np.log(a / b) if a > 0 and b > 0 else 0.0
        total += term
    return total


@njit(cache=True, parallel=True)
def _kl_sweep(hist, num_quantized_bins):
    """The end (an index into the edges) of the window of least KL divergence (the first such
    window, as a sequential sweep finds it; the windows are scored in parallel, a small one
    and a large one in turn, so that each thread's equal share of them is as much work)."""
    num_bins = hist.size
    zero = num_bins // 2
    first = num_quantized_bins // 2
    cumulative = np.zeros(num_bins + 1)
    for k in range(num_bins):
        cumulative[k + 1] = cumulative[k] + hist[k]
    windows = zero + 1 - first
    divs = np.full(windows, np.inf)
    for u in prange(windows):
        t = u // 2 if u % 2 == 0 else windows - 1 - u // 2
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


HIST_BINS = 8192    # bins of a streaming histogram, over [0, R): R/HIST_BINS is at most
                    # 1/4096 of the largest magnitude seen


@njit(cache=True)
def _largest(x):
    m = 0.0
    for v in x:
        a = abs(np.float64(v))
        if a > m:
            m = a
    return m


@njit(cache=True)
def _count(x, counts, scale):
    """Count each |x| into bin floor(|x| * scale) (the last bin at most), a negative value
    into the second row where there is one."""
    last, signed = counts.shape[1] - 1, counts.shape[0] == 2
    for v in x:
        a = abs(np.float64(v))
        j = min(int(a * scale), last)
        counts[1 if signed and v < 0 else 0, j] += 1


def _coarsened(counts: np.ndarray, times: int) -> np.ndarray:
    """``counts`` with R doubled ``times`` times: bins merged in pairs, each time."""
    for _ in range(times):
        half = counts.reshape(len(counts), HIST_BINS // 2, 2).sum(axis=2)
        counts = np.concatenate([half, np.zeros_like(half)], axis=1)
    return counts


class Magnitudes:
    """Counts of |x| in HIST_BINS equal bins over [0, R), R the least power of two above
    every |x| seen; with ``signed``, negative and non-negative values counted apart (two
    rows). A larger value doubles R, merging the bins in pairs, so the counts are exactly
    those one pass over all the data at once would give, however it came in batches, and two
    histograms of parts of the data add up to the whole's (``merge``): memory stays fixed
    whatever the number of samples."""

    def __init__(self, signed: bool = False) -> None:
        self.counts = np.zeros((2 if signed else 1, HIST_BINS), np.int64)
        self.top = 0            # R = 2**top, once a nonzero value was seen (zeros: bin 0)
        self.seen = False
        self.max = 0.0          # the largest |x| exactly

    def _grow(self, top: int) -> None:
        self.counts = _coarsened(self.counts, top - self.top)
        self.top = max(self.top, top)

    def add(self, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x).ravel()
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        if not x.size:
            return
        m = _largest(x)
        self.max = max(self.max, m)
        if m > 0:
            top = math.frexp(m)[1]             # m < 2**top
            if not self.seen:
                self.top, self.seen = top, True
            self._grow(top)
        # (a power of two: |x| times it is exact, its integer part the bin)
        _count(x, self.counts, HIST_BINS / 2.0 ** self.top)

    def merge(self, other: "Magnitudes") -> None:
        """Add ``other``'s counts (of other data) to these."""
        if other.seen:
            if not self.seen:
                self.top, self.seen = other.top, True
            self._grow(other.top)
            self.counts += _coarsened(other.counts, self.top - other.top)
        else:
            self.counts[:, 0] += other.counts[:, 0]
        self.max = max(self.max, other.max)

    @property
    def width(self) -> float:
        return 2.0 ** self.top / HIST_BINS

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the magnitudes as ``np.quantile`` interpolates it between
        the two values of ranks around q * (n - 1), each value taken at its place among its
        bin's (spread evenly over the bin), the largest exactly."""
        counts = self.counts.sum(axis=0)
        cum = np.cumsum(counts)
        n = int(cum[-1])
        if n == 0:
            return 0.0

        def value(k: int) -> float:          # the value of rank k (from 0)
            if k >= n - 1:
                return self.max
            j = int(np.searchsorted(cum, k, side="right"))
            inside = (k - (cum[j - 1] if j else 0) + 0.5) / counts[j]
            return min((j + inside) * self.width, self.max)
        at = q * (n - 1)
        k = int(math.floor(at))
        return value(k) + (at - k) * (value(k + 1) - value(k))

    def clipped(self, t: float) -> float:
        """The share of the energy (sum of x*x) clipping to +-t cuts off, each bin's values
        taken at its centre (from the counts alone: parts merged give the whole's)."""
        counts = self.counts.sum(axis=0).astype(np.float64)
        centres = (np.arange(HIST_BINS) + 0.5) * self.width
        energy = float(counts @ (centres * centres))
        over = np.maximum(centres - t, 0.0)
        return min(float(counts @ (over * over)) / energy, 1.0) if energy else 0.0

    def symmetric(self, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
        """The histogram of x in ``num_bins`` equal bins over [-max, max] (a signed one's),
        each fine bin's count spread evenly over its width; and its edges."""
        edges = np.linspace(-self.max, self.max, num_bins + 1)
        fine = np.minimum(np.arange(HIST_BINS + 1) * self.width, self.max)
        pos = np.concatenate([[0], np.cumsum(self.counts[0])]).astype(np.float64)
        neg = np.concatenate([[0], np.cumsum(self.counts[-1])]).astype(np.float64) \
            if len(self.counts) == 2 else np.zeros(HIST_BINS + 1)
        below = np.where(edges < 0, neg[-1] - np.interp(-edges, fine, neg),
                         neg[-1] + np.interp(edges, fine, pos))
        return np.diff(below), edges


class Observer:
    """One value's statistics over the calibration set, fed batch by batch in memory that
    does not grow with the number of batches; ``merge`` adds another observer's (of other
    batches: calibration's parts run apart) as if it had seen them itself."""

    def update(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def merge(self, other: "Observer") -> None:
        raise NotImplementedError

    def range(self) -> Range:
        raise NotImplementedError


class MinMax(Observer):
    def __init__(self) -> None:
        self.lo, self.hi = np.inf, -np.inf

    def update(self, x):
        self.lo = min(self.lo, float(np.min(x)))
        self.hi = max(self.hi, float(np.max(x)))

    def merge(self, other):
        self.lo, self.hi = min(self.lo, other.lo), max(self.hi, other.hi)

    def range(self):
        return Range(self.lo, self.hi)


class Percentile(Observer):
    """The percentile of |x|, from a histogram of the magnitudes (``Magnitudes``): within
    one of its bins (1/4096 of the largest magnitude at most) of the exact one."""

    def __init__(self, percentile: float = 99.999) -> None:
        self.percentile = percentile
        self.seen = Magnitudes()

    def update(self, x):
        self.seen.add(x)

    def merge(self, other):
        self.seen.merge(other.seen)

    def range(self):
        t = self.seen.quantile(self.percentile / 100)
        return Range(-t, t, self.seen.clipped(t))


class KLDivergence(Observer):
    """TVM's threshold search (``kl_threshold``) on the NUM_BINS-bin histogram of x over
    [-max|x|, max|x|], made at the end from a finer one kept as the batches come
    (``Magnitudes``, signed): TVM keeps every sample instead."""

    def __init__(self) -> None:
        self.seen = Magnitudes(signed=True)

    def update(self, x):
        self.seen.add(x)

    def merge(self, other):
        self.seen.merge(other.seen)

    def range(self):
        if self.seen.max == 0.0:
            return Range(0.0, 0.0)
        hist, edges = self.seen.symmetric(NUM_BINS)
        t = kl_threshold(hist, edges)
        return Range(-t, t, self.seen.clipped(t))


class GlobalScale(Observer):
    """TVM's ``global_scale``: one fixed range, +-scale (default 8.0), for every value; the
    data only confirm that the value exists."""

    def __init__(self, scale: float = 8.0) -> None:
        self.scale = scale
        self.seen = Magnitudes()

    def update(self, x):
        self.seen.add(x)

    def merge(self, other):
        self.seen.merge(other.seen)

    def range(self):
        return Range(-self.scale, self.scale, self.seen.clipped(self.scale))


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
