"""Numba kernels of look-ups and masks: ``take_at``'s rows of a table (an embedding), the
comparisons (``equal``, ``less``, ...: bool results), ``where``, ``cast`` (a mask's
integers to floats) and ``broadcast_to`` (a mask spread over the heads); launches like every kernel, so that a transformer with token-ID and mask
inputs saves in a library."""
from __future__ import annotations

from ..codegen.launch import parallel, share


@parallel
def take_rows(thread, threads, args):
    """out (A, M, B) = table (A, N, B) at ``indices`` (M,) along its middle axis, a negative
    index counting from the end. A kernel cannot raise: the indices are checked before the
    launch (``lowering.indexing.TakeAt``), every one in [-N, N)."""
    table, indices, out = args
    a_n, n, b_n = table.shape
    m_n = indices.size
    for r in range(*share(a_n * m_n, thread, threads)):
        a, m = r // m_n, r % m_n
        i = indices[m]
        if i < 0:
            i += n
        src, dst = table[a, i], out[a, m]
        for b in range(b_n):
            dst[b] = src[b]


@parallel
def compare(thread, threads, args):
    """4-D operands of the output's shape (broadcast views), out (bool) = a op b: op 0 ==,
    1 !=, 2 <, 3 <=, 4 >, 5 >= (NaN compares unequal to everything, as numpy's); one output
    row of the last axis a unit."""
    a, b, op, out = args
    d0, d1, d2, d3 = out.shape
    for r in range(*share(d0 * d1 * d2, thread, threads)):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        x, y, z = a[i0, i1, i2], b[i0, i1, i2], out[i0, i1, i2]
        for j in range(d3):
            if op == 0:
                z[j] = x[j] == y[j]
            elif op == 1:
                z[j] = x[j] != y[j]
            elif op == 2:
                z[j] = x[j] < y[j]
            elif op == 3:
                z[j] = x[j] <= y[j]
            elif op == 4:
                z[j] = x[j] > y[j]
            else:
                z[j] = x[j] >= y[j]


@parallel
def select(thread, threads, args):
    """4-D operands of the output's shape (broadcast views): out = x where cond, else y."""
    cond, x, y, out = args
    d0, d1, d2, d3 = out.shape
    for r in range(*share(d0 * d1 * d2, thread, threads)):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        c, a, b, z = cond[i0, i1, i2], x[i0, i1, i2], y[i0, i1, i2], out[i0, i1, i2]
        for j in range(d3):
            z[j] = a[j] if c[j] else b[j]


@parallel
def spread(thread, threads, args):
    """out = x, a 4-D view of out's shape (stride 0 along the axes it is broadcast on)."""
    x, out = args
    d0, d1, d2, d3 = out.shape
    for r in range(*share(d0 * d1 * d2, thread, threads)):
        i0, i1, i2 = r // (d1 * d2), (r // d2) % d1, r % d2
        a, z = x[i0, i1, i2], out[i0, i1, i2]
        for j in range(d3):
            z[j] = a[j]


@parallel
def convert(thread, threads, args):
    """out = x in out's dtype, element by element (both flat): integers and truth values to
    floats rounded to nearest, integers to narrower ones wrapped, floats widened or
    narrowed; never floats to integers (``lowering.indexing.Convert``)."""
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = x[i]
