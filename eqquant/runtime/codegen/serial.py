"""Small ops on one thread. A parallel kernel wakes the pool's workers and waits for them,
which costs more than a flat op over a few thousand elements takes on one thread. Every kernel of ``launch.parallel`` has ``kernel.serial``, its same compiled entry
run on the calling thread as thread 0 of 1, and a binding calls ``sized(kernel, n)``: the
serial call below ``SERIAL_BELOW`` elements, the parallel kernel from there.

    sized(k8.qadd, out.size)(a, ...)      # 7 x 7 x 160 values: on the calling thread

Both give the same bits (an elementwise loop's iterations are independent). The crossover
was measured on a 2-core machine (``qadd_once``, warm caches; docs/measurements.md).

``twin``, a copy of a function's source under a name of its own, gives a kernel one variant
per element type, each with its own intrinsic bound (``kernels_fp32.max_pool_channels_last``),
and ``launch`` one entry per kernel and argument types.
"""
from __future__ import annotations

import types

SERIAL_BELOW = 16384   # elements: below, one thread is the faster (the crossover: 20-30,000)


def twin(fn, suffix: str, **names):
    """A copy of the Python function ``fn`` named with ``suffix`` (its own entry in Numba's
    disk cache, which is keyed by the qualified name), the global ``names`` given bound to
    other values (a kernel's variant per element type: each compiled only where used). With
    ``names``, the copy reads a copy of ``fn``'s globals taken now: what it calls must be
    defined before it is made."""
    globals_ = {**fn.__globals__, **names} if names else fn.__globals__
    copy = types.FunctionType(fn.__code__, globals_, fn.__name__ + suffix, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + suffix
    copy.__module__, copy.__doc__ = fn.__module__, fn.__doc__
    return copy


def sized(kernel, n: int):
    """The call of ``kernel`` (a ``launch.parallel`` kernel) for an op over ``n`` elements."""
    return kernel.serial if n < SERIAL_BELOW else kernel
