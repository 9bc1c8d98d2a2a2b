"""Kernel bindings of look-ups and masks: ``take_at`` (an embedding's rows at token IDs),
the comparisons, ``where``, ``cast`` and ``broadcast_to`` (an attention mask). See ``fp32.py`` for what a
binding is."""
from __future__ import annotations

import numpy as np

from ...core.types import check_bounds
from . import binding
from .fp32 import Binding, broadcast_view
from ..codegen.serial import sized
from ..kernels import indexing as kx

# what the kernels read and write (Numba compiles one form per dtype met)
DTYPES = ("float32", "int8", "uint8", "int32", "int64", "bool")
INDICES = ("int32", "int64")


def _shape4(shape: tuple) -> tuple | None:
    """``shape`` as the 4-D one the broadcast kernels read (None: more than 4 axes)."""
    return (1,) * (4 - len(shape)) + tuple(shape) if len(shape) <= 4 else None


@binding
class TakeAt(Binding):
    """take_at: slices of a table at indices computed at run time (an embedding look-up),
    one launch of ``take_rows``. A kernel cannot raise, and an index outside the axis is an
    error: where the indices are a program input, the executor (and a saved library) check
    them as they enter (``index_bounds``, ``entry_checked``), and the step is a launch;
    where they are computed, each run checks them in Python before the kernel (a step a
    library cannot hold)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        shape = in_types[0].shape
        axis = attrs["axis"] % len(shape)
        self.n = shape[axis]
        self.table3 = (int(np.prod(shape[:axis], dtype=np.int64)), self.n,
                       int(np.prod(shape[axis + 1:], dtype=np.int64)))
        self.entry_checked = False      # set by the executor: the indices are an input

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return in_types[0].dtype in DTYPES and in_types[1].dtype in INDICES and \
            len(in_types[0].shape) >= 1

    @property
    def index_bounds(self) -> dict[int, tuple[int, int, str]]:
        """Operand -> (lowest, highest, why): what its values must be."""
        return {1: (-self.n, self.n - 1, f"take_at's indices into an axis of {self.n}")}

    def _call(self, ins, out):
        table, indices = ins
        a, _, b = self.table3
        return sized(kx.take_rows, out.size), (
            table.reshape(self.table3), indices.reshape(-1), out.reshape(a, -1, b))

    def kernel_call(self, ins, out):
        if not (self.entry_checked and all(v.flags.c_contiguous for v in (*ins, out))):
            return None
        return self._call(ins, out)

    def __call__(self, ins, out):
        ins = [np.ascontiguousarray(v) for v in ins]
        check_bounds("indices", ins[1], self.index_bounds[1])
        kernel, args = self._call(ins, out)
        kernel(*args)


class _Broadcast(Binding):
    """A kernel (``KERNEL``) on 4-D views of the operands broadcast to the output's shape,
    the op's ``extra`` arguments between them and the output; the operand ``DATA`` gives
    the dtype the kernels read."""

    KERNEL: str
    DATA = 0

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return in_types[cls.DATA].dtype in DTYPES and _shape4(out_type.shape) is not None

    def extra(self) -> tuple:
        return ()

    def kernel_call(self, ins, out):
        if not out.flags.c_contiguous:
            return None
        shape4 = _shape4(out.shape)
        views = tuple(broadcast_view(np.asarray(v), shape4) for v in ins)
        return sized(getattr(kx, self.KERNEL), out.size), (
            *views, *self.extra(), out.reshape(shape4))

    def __call__(self, ins, out):
        if not self.call_kernel(ins, out):      # (an output that is not contiguous)
            res = np.empty(out.shape, out.dtype)
            self.call_kernel(ins, res)
            out[...] = res


@binding
class Compare(_Broadcast):
    """equal, not_equal, less, less_equal, greater, greater_equal: bool results
    (``kernel_params["code"]``), operands of one dtype broadcast together."""

    KERNEL = "compare"

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return "code" in op.kernel_params and in_types[0].dtype == in_types[1].dtype and \
            super().supports(op, attrs, in_types, out_type, consts)

    def extra(self) -> tuple:
        return (self.op.kernel_params["code"],)


@binding
class Select(_Broadcast):
    """where(condition, x, y), the three broadcast together."""

    KERNEL, DATA = "select", 1


@binding
class Spread(_Broadcast):
    """broadcast_to: the data copied to every place of the output it broadcasts over."""

    KERNEL = "spread"


@binding
class Convert(Binding):
    """cast, where numpy's conversion is defined for every value and the kernel's is the
    same: integers and truth values to any dtype, floats to floats. A float to an integer is
    left to the reference (numpy gives NaN and values out of range one answer, compiled code
    another)."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        src, dst = in_types[0].dtype, out_type.dtype
        return src in DTYPES and dst in DTYPES and not (
            np.dtype(src).kind == "f" and np.dtype(dst).kind != "f")

    def kernel_call(self, ins, out):
        if not (ins[0].flags.c_contiguous and out.flags.c_contiguous):
            return None
        return sized(kx.convert, out.size), (ins[0].reshape(-1), out.reshape(-1))

    def __call__(self, ins, out):
        if not self.call_kernel(ins, out):
            res = np.empty(out.shape, out.dtype)
            self.call_kernel([np.ascontiguousarray(ins[0])], res)
            out[...] = res
