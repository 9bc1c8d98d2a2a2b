"""Timing one kernel instance on this machine: what the measured cost model reads.

    seconds = time_instance(op, attrs, in_types, out_type, consts={1, 2})

An instance is an op with its attributes and its input and output types, and which of its
inputs are compile-time constants (weights, scales, zero points: the executor prepacks them
at load, so they are not part of a call's time). It runs exactly as the executor would run it
(the binding its registry entry names, prepacked once, or its reference semantics where no
binding fits) on inputs of the right types, warm, and the median of a few calls is its time.

The constants are drawn by the name of the input they feed: a zero point is 0 (the common
case, and the one the SIMD kernels take), a scale a positive number, a weight or bias random
values of its dtype. The data inputs are random values of their dtype. Timing depends on
shapes, dtypes and kernel paths, not on these values.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
from numba import njit, prange

from ...core.types import TensorType, Type
from ...ops.registry import OpDef
from ..codegen import memory


def sample_value(name: str, t: TensorType, rng: np.random.Generator) -> np.ndarray:
    """A value of type ``t`` for the input called ``name``."""
    shape, dtype = t.shape, np.dtype(t.dtype if t.dtype != "weak" else "float32")
    if "zero_point" in name:
        return np.zeros(shape, dtype)
    if dtype.kind == "f":
        if "scale" in name:
            return rng.uniform(0.01, 0.02, shape).astype(dtype)
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    info = np.iinfo(dtype)
    lo, hi = max(int(info.min), -128), min(int(info.max), 127)
    if name == "weight" and dtype == np.int8:
        # within +-64, so that every int8 kernel runs the sample (x86.avx2.w7 takes no
        # wider weights); no kernel's speed depends on a weight's values
        lo, hi = -64, 64
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def runner(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type], out_type: Type,
           consts: frozenset[int] | set[int], seed: int = 0):
    """(a function making one call of the instance, the arrays it reads that a program would
    have warm: its data inputs, the values not among ``consts``; the buffers it writes)."""
    from ..lowering import binding_class
    rng = np.random.default_rng(seed)
    names = list(op.inputs) + [f"input{i}" for i in range(len(op.inputs), len(in_types))]
    # on 64-byte lines, as the executor's buffers are (``memory``): a kernel reading or
    # writing arrays 16 bytes off a line runs up to half again slower
    values = [memory.aligned(sample_value(names[i], t, rng)) if isinstance(t, TensorType)
              else None for i, t in enumerate(in_types)]
    fixed = {i: np.ascontiguousarray(values[i]) for i in consts if values[i] is not None}
    if op.kernel:
        cls = binding_class(op.kernel)
        if isinstance(out_type, TensorType) and cls.supports(op, attrs, in_types, out_type,
                                                             fixed):
            binding = cls(op, attrs, in_types, out_type, fixed)
            out = memory.empty(out_type.shape, out_type.dtype)
            return (lambda: binding(values, out)), _data_inputs(values, consts), [out]
    kwargs = dict(attrs)
    return (lambda: op.semantics(*values, **kwargs)), _data_inputs(values, consts), []


def _data_inputs(values: Sequence[Any], consts) -> list[np.ndarray]:
    return [v for i, v in enumerate(values) if i not in consts and isinstance(v, np.ndarray)]


_FLUSH: dict[bool, np.ndarray] = {}   # resident -> the buffer written to evict
_SCRATCH = np.zeros(64, np.int64)


def _cache_size(index: int, default: int) -> int:
    try:
        text = open(f"/sys/devices/system/cpu/cpu0/cache/index{index}/size").read().strip()
        return int(text[:-1]) << (10 if text.endswith("K") else 20)
    except (OSError, ValueError):
        return default


@njit(parallel=True, cache=True)
def _touch(buf):
    """Each worker writes its share of ``buf`` (on a small one: a parallel region that
    does little but leave the workers awake, spinning, as they are between a program's
    layers)."""
    for i in prange(buf.shape[0]):
        buf[i] += 1


def evict_caches(resident: bool = False) -> None:
    """The workers write as many bytes as the last-level cache holds, each its share: what
    the previous calls left in the caches (the instance's prepacked weights among them) is
    gone from the cores' own caches and mostly from the shared one, as it is when a program's
    other layers have run in between (a network's weights and activations together pass
    about that much through the cache between two uses of one layer's weights). With
    ``resident``, only four times a core's own cache: a program whose weights fit well in
    the last-level cache (MobileNet-v2's 3.5 MB of int8 weights in 32 MB) finds them there
    at each layer, and timing its small layers with their weights in memory overstated each
    (``MeasuredCost``'s ``resident``)."""
    if resident not in _FLUSH:
        size = 4 * _cache_size(2, 1 << 20) if resident else last_level_cache_bytes()
        _FLUSH[resident] = np.zeros(size // 8, np.int64)
    _touch(_FLUSH[resident])


def last_level_cache_bytes() -> int:
    """The size of the last-level cache (32 MB where the system does not say)."""
    return _cache_size(3, 32 << 20)


def time_instance(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type],
                  out_type: Type, consts: frozenset[int] | set[int] = frozenset(),
                  min_calls: int = 5, budget: float = 0.05, resident: bool = False) -> float:
    """Seconds per call of the instance on a quiet machine: at least ``min_calls`` calls
    (more while the whole timing stays under ``budget`` seconds, up to 50), in consecutive
    groups of 5; the least of the groups' medians (a neighbour's burst of load inflates the
    groups it overlaps, as it does the rounds ``bench/cost_model.py`` takes the least of).
    ``resident``: the weights found in the last-level cache (``evict_caches``)."""
    with np.errstate(all="ignore"):          # (random values: a variance may be negative)
        call, reads, writes = runner(op, attrs, in_types, out_type, consts)
        call()                               # compile (or load) the kernel
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < min_calls or (time.perf_counter() - start < budget and
                                         len(times) < 50):
            # as in a program: the weights cold (other layers ran since), the data inputs
            # warm (the layer before has just written them), the output buffer too (the
            # executor's pool hands out the buffer freed last)
            evict_caches(resident)
            for a in reads:
                a.sum()
            for a in writes:
                a.fill(0)
            _touch(_SCRATCH)     # last: the workers still spin when the call starts
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
    groups = [times[i:i + 5] for i in range(0, len(times) - 4, 5)] or [times]
    return float(min(np.median(g) for g in groups))
