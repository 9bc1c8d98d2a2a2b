"""Kernel bindings: what runs a registry op on the CPU. An op's registry entry names its
binding by its class's name (``kernel="Conv2D"``: each class here is registered with
``@binding``); the executor builds one binding object per call site at load time (prepacking constant weights once) and then calls it with the input
arrays and the output buffer it planned.

A binding may decline a call site (``supports`` is False: another dtype, an unusual layout);
the executor then runs the op's reference semantics there. Views (``reshape`` and friends) and
identities alias their input instead of copying.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Mapping, Sequence

import numpy as np
from numba.core.registry import CPUDispatcher as Dispatcher

from ...core.types import TensorType, Type
from ...ops.fused import epilogue_bounds
from ...ops.numerics import from_nchw, to_nchw, to_oihw
from ...ops.registry import IDENTITY, get_op
from . import binding
from ..codegen import compiling
from ..codegen import memory
from ..kernels import fp32 as k
from ..kernels.depthwise import entry as sweep_entry
from ..codegen.launch import Parallel, in_order, launches_of, threads
from ..kernels.pools import KIND_OF
from ..codegen.serial import sized


def entry_point(kernel, args: tuple):
    """The Numba function ``kernel``'s compiled entry point for these arguments' types
    (compiled, or loaded from the cache, now where it is not yet; while the executor
    surveys what it compiles, ``compiling.entry_point``)."""
    return compiling.entry_point(kernel, tuple(kernel.typeof_pyval(a) for a in args))


def bound(kernel, args: tuple):
    """``kernel(*args)`` as a call with no arguments, ``kernel`` a Numba function: its
    compiled entry point for these arguments' types, called straight. Through the
    dispatcher, a call first types each argument and looks the overload up, at every run.
    The arrays are bound, so their types cannot change under the entry point. A kernel that
    is not a Numba function binds itself (its ``bind``): a ``launch.parallel`` kernel writes
    its argument block once, a ``launch.Driver`` makes its plan once."""
    if isinstance(kernel, Dispatcher):
        return functools.partial(entry_point(kernel, args), *args)
    return kernel.bind(args, entry_point)


def _is_f32(*types: Type) -> bool:
    return all(isinstance(t, TensorType) and t.dtype == "float32" for t in types)


class Binding:
    """Base: ``__call__(inputs, out)`` writes the result into ``out``."""

    view = False  # True: the result is a view of input 0 (no buffer)

    def __init__(self, op, attrs: Mapping[str, Any], in_types: Sequence[Type], out_type: Type,
                 consts: Mapping[int, np.ndarray]):
        self.op, self.attrs, self.in_types, self.out_type = op, attrs, in_types, out_type

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return _is_f32(*in_types, out_type)

    @property
    def path(self) -> str | None:
        """The kernel path this call site took where the binding chose among several (a
        convolution's GEMM: "amx", "vnni", ..., "fma", "blas"), for the kernel plan
        (``Executor.kernel_plan``); None where it chose none."""
        return None

    def kernel_call(self, ins, out):
        """(kernel, args): the one Numba call that does ``self(ins, out)`` on these arrays as
        they are (views of them, no copies), or None where the binding does more (the
        default)."""
        return None

    def call_contiguous(self, ins, out) -> None:
        """Make ``kernel_call``'s call on C-contiguous copies of the inputs that are not (a
        binding whose kernel call reads contiguous operands only)."""
        kernel, args = self.kernel_call([np.ascontiguousarray(v) for v in ins], out)
        kernel(*args)

    def call_kernel(self, ins, out) -> bool:
        """Make ``kernel_call``'s call where there is one; whether it was made."""
        call = self.kernel_call(ins, out)
        if call is None:
            return False
        call[0](*call[1])
        return True

    def prepare(self, ins, out):
        """A call with no arguments doing ``self(ins, out)``, for operands that are the same
        arrays at every run (``Executor._prepare``): the kernel's entry point bound to its
        arguments where the binding makes one kernel call (``kernel_call``), skipping its own
        Python and Numba's dispatcher at each run (a binding may bind its kernels its own
        way), else the binding itself."""
        call = self.kernel_call(ins, out)
        if call is not None:
            return bound(*call)
        return functools.partial(self, ins, out)

    def scratch(self, name: str, shape, dtype) -> np.ndarray:
        """An aligned buffer of this call site's, made on its first run and reused (the
        executor runs one op at a time): a fresh array per run pays its page faults anew."""
        buffers = self.__dict__.setdefault("_scratch", {})
        buf = buffers.get(name)
        if buf is None or buf.shape != tuple(shape) or buf.dtype != np.dtype(dtype):
            buf = buffers[name] = memory.empty(tuple(shape), dtype)
        return buf


class Launches(Binding):
    """A binding whose work is launches in order, ``calls(ins, out)``'s (kernel, arguments),
    made on C-contiguous operands (None where they are not): bound once where the operands
    are the same arrays at every run, else made on contiguous copies at each call."""

    def calls(self, ins, out) -> list | None:
        raise NotImplementedError

    def prepare(self, ins, out):
        calls = self.calls(ins, out)
        if calls is None:
            return super().prepare(ins, out)
        return in_order([bound(*call) for call in calls])

    def __call__(self, ins, out):
        res = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        for kernel, args in self.calls([np.ascontiguousarray(v) for v in ins], res):
            kernel(*args)
        if res is not out:
            out[...] = res


def _per_channel(bias_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """A bias that only varies along axis 1 of the output (and does not widen it)."""
    rank = len(out_shape)
    padded = (1,) * (rank - len(bias_shape)) + tuple(bias_shape)
    return len(bias_shape) <= rank and all(d == 1 for i, d in enumerate(padded) if i != 1) \
        and padded[1] in (1, out_shape[1])


def broadcast_view(x: np.ndarray, shape: tuple) -> np.ndarray:
    """``x`` as a view of the shape it broadcasts to (stride 0 along its broadcast axes),
    as a kernel on operands of the output's shape reads it."""
    return np.broadcast_to(x.reshape((1,) * (len(shape) - x.ndim) + x.shape), shape)


def moved(x: np.ndarray, to_last: bool = True, out: np.ndarray | None = None) -> np.ndarray:
    """A new, aligned copy of the image ``x`` moved channel-last ((N, C, H, W) -> (N, H, W,
    C)), or back with ``to_last=False``, as ``layout_transform`` moves it
    (``transpose_planes``): a kernel called at a call site in the layout it does not read then
    pays for its transposes what the layout phase's would cost (numpy's strided copy of a byte
    image is several times slower, and made NCHW sites of integer kernels look dear)."""
    n = x.shape[0]
    if out is None:
        out = memory.empty((n, *x.shape[2:], x.shape[1]) if to_last else
                           (n, x.shape[3], *x.shape[1:3]), x.dtype)
    move_into(x, out, to_last)
    return out


def move_into(src: np.ndarray, out: np.ndarray, to_last: bool = True) -> None:
    """``src`` written into ``out``, the same image in the other layout."""
    n = src.shape[0]
    a, b = (src.shape[1], src.size // (n * src.shape[1])) if to_last else \
        (src.size // (n * src.shape[3]), src.shape[3])
    k.transpose_planes(np.ascontiguousarray(src).reshape(n, a, b), out.reshape(n, b, a))


def nchw_calls(site: Binding, x: np.ndarray, out: np.ndarray, kernel, moves_in=None,
               to_last: bool = True):
    """A channel-last kernel at an NCHW call site as bound launches, as the site's own call
    makes them: the image (N, C, H, W) moved channel-last into the site's image (``moved``;
    or ``moves_in(x, image)``'s calls), ``kernel(image, result)``'s call into its result
    (N, oh, ow, O) (or its calls, a list), moved back into ``out`` (``move_into``). With
    ``to_last`` False the other way round: an NCHW kernel at a channel-last site. None where
    an array is not contiguous (a reshape would be a copy, bound in place of it)."""
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        return None
    first = 1 if to_last else 3       # the channels' axis
    n, c = x.shape[0], x.shape[first]
    o = out.shape[first]
    plane, oplane = x.size // (n * c), out.size // (n * o)
    image = site.scratch("image", _moved_shape(x.shape, to_last),
                         np.uint8 if moves_in else x.dtype)
    res = site.scratch("result", _moved_shape(out.shape, to_last), out.dtype)
    calls = moves_in(x, image) if moves_in else [k.transpose_call(
        *((x.reshape(n, c, plane), image.reshape(n, plane, c)) if to_last else
          (x.reshape(n, plane, c), image.reshape(n, c, plane))))]
    made = kernel(image, res)             # (a call, or a list of them: one per image)
    calls += [*(made if isinstance(made, list) else [made]), k.transpose_call(
        *((res.reshape(n, oplane, o), out.reshape(n, o, oplane)) if to_last else
          (res.reshape(n, o, oplane), out.reshape(n, oplane, o))))]
    if any(call is None for call in calls):
        return None
    return in_order([bound(*call) for call in calls])


def group_sets(w: np.ndarray, groups: int, together: int, block: int) -> tuple:
    """A grouped convolution's weights w (O, cg, kh, kw) for a GEMM of sets of ``together``
    groups (``gather.group_span``) on blocks of ``block`` channels: (each set's
    block-diagonal weights (sets, span_o, K) in (tap, channel) order, each output reading its
    own group's inputs, zeros elsewhere; the epilogue's slots: per set, its blocks'
    channels, a slot past the set's outputs repeating its last (never stored); sets;
    outputs a set). The int8 and float grouped drivers' (``vnni.grouped_requantize``,
    ``fma.grouped``)."""
    o, cg, kh, kw = w.shape
    og = o // groups
    sets, span_o = groups // together, together * og
    taps = w.transpose(0, 2, 3, 1).reshape(sets, together, og, kh * kw, cg)
    dense = np.zeros((sets, together, og, kh * kw, together, cg), w.dtype)
    for j in range(together):
        dense[:, j, :, :, j, :] = taps[:, j]
    width = -(-span_o // block) * block
    local = np.minimum(np.arange(width), span_o - 1)
    slots = (np.arange(sets)[:, None] * span_o + local).reshape(-1)
    return dense.reshape(sets, span_o, -1), slots, sets, span_o


def _moved_shape(shape: tuple, to_last: bool) -> tuple:
    """An image's shape moved channel-last (N, C, H, W) -> (N, H, W, C), or back."""
    n, a, b, c = shape
    return (n, b, c, a) if to_last else (n, c, a, b)


class _Spatial(Binding):
    """Convolutions and pools: the kernels work on NCHW; a channels-last call site (NHWC)
    runs them between two transposes (``compute`` is the NCHW body)."""

    layout_key = "layout"

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        self.nhwc = attrs[self.layout_key] == "NHWC"

    def __call__(self, ins, out):
        if not self.nhwc:
            return self.compute(ins, out)
        x = np.ascontiguousarray(to_nchw(ins[0], "NHWC"))
        tmp = np.empty(to_nchw(out.shape, "NHWC"), out.dtype)
        self.compute([x, *ins[1:]], tmp)
        out[...] = from_nchw(tmp, "NHWC")

    def compute(self, ins, out):
        raise NotImplementedError

    def geometry(self):
        """A pool's (kh, kw, sh, sw, pt, pl, pb, pr, dh, dw), a stride along an axis where
        the output has one element made 1: it never multiplies a nonzero index there, so any
        stride gives the same result (one of 2**40 sized the NCHW max pool's phase planes:
        an allocation failed inside the kernel)."""
        kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = _geometry(self.attrs)
        oh, ow = self.out_type.shape[1:3] if self.nhwc else self.out_type.shape[2:4]
        return kh, kw, sh if oh > 1 else 1, sw if ow > 1 else 1, pt, pl, pb, pr, dh, dw


def _as_nchw(in_types, out_type, consts):
    """A channels-last convolution's types and constants as the NCHW kernels see them: data
    and output NCHW, the weight OIHW, a per-channel bias along axis 1."""
    def nchw(t):
        return TensorType(to_nchw(t.shape, "NHWC"), t.dtype)
    types = [nchw(in_types[0]), TensorType(to_oihw(in_types[1].shape, "HWIO"),
                                           in_types[1].dtype), *in_types[2:]]
    consts = dict(consts)
    if 1 in consts:   # (a view: each kernel's packing copies it once, into its own layout)
        consts[1] = to_oihw(consts[1], "HWIO")
    if len(types) == 3:
        types[2] = TensorType((in_types[2].size, 1, 1), in_types[2].dtype)
        if 2 in consts:
            consts[2] = np.asarray(consts[2]).reshape(-1, 1, 1)
    return types, nchw(out_type), consts


def _per_channel_last(bias_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> bool:
    """A bias of an NHWC output that only varies along its last axis."""
    return all(d == 1 for d in bias_shape[:-1]) and len(bias_shape) <= len(out_shape) and \
        (not bias_shape or bias_shape[-1] in (1, out_shape[-1]))


def fp32_path() -> str:
    """The float convolution path: the fastest the process's target offers (``target.py``:
    "avx512" and "fma", the 512- and 256-bit FMA GEMMs of ``fma.py``; "blas", im2col and
    numpy's BLAS, everywhere)."""
    from ..target import current
    return current().fp32_path


@binding
class Conv2D(_Spatial):
    """nn.conv2d and fused.conv2d: the FMA GEMM with gather and epilogue fused (``fma.py``),
    or im2col + BLAS GEMM + fused epilogue on the "blas" path; depthwise and other grouped
    convolutions: the direct kernel (``kernels_fp32.grouped``; depthwise at a channel-last
    site, its channel-last twin). A dense or depthwise convolution at a channel-last call site
    (NHWC) runs as it is on its kernel; other NHWC call sites run between two transposes."""

    layout_key = "data_layout"

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from .plan import resolve          # the site's kernel (the plan's, ``plan.py``)
        kernel = resolve(op, attrs, in_types, out_type, consts)
        if self.nhwc:
            in_types, out_type, consts = _as_nchw(in_types, out_type, consts)
        w = consts[1] if 1 in consts else None
        o, cg, kh, kw = in_types[1].shape
        self.kh, self.kw = kh, kw
        self.groups = attrs["groups"]
        self.sh, self.sw = attrs["strides"]
        self.dh, self.dw = attrs["dilation"]
        self.pt, self.pl, self.pb, self.pr = attrs["padding"]
        self.lo, self.hi = epilogue_bounds(attrs)
        self.depthwise = self.groups == in_types[0].shape[1] == o and cg == 1
        self.direct = self.depthwise or self.groups > 1    # the direct kernel
        self.pointwise = (kh == kw == 1 and self.sh == self.sw == 1 and
                          attrs["padding"] == [0, 0, 0, 0] and self.groups == 1)
        self.bias_vec = None
        if len(in_types) == 3 and 2 in consts and _per_channel(in_types[2].shape,
                                                               out_type.shape):
            self.bias_vec = np.ascontiguousarray(np.broadcast_to(
                consts[2].reshape(-1), (o,)), dtype=np.float32)
        elif len(in_types) == 2:
            self.bias_vec = np.zeros(o, np.float32)
        # an FMA GEMM with the window gather and the epilogue in one parallel region,
        # im2col + BLAS, or the direct kernel (where the plan has none: weights not constant)
        self.kernel = kernel or ("direct" if self.direct else "blas")
        self.direct = self.kernel == "direct"     # (one channel in and out: a GEMM's too)
        self.depthwise = self.depthwise and self.direct
        self.fma = None
        self.sets = None        # (a grouped convolution's on the FMA GEMM: sets, outputs a set)
        if self.kernel in ("x86.avx512", "x86.fma"):
            from ..kernels import fma
            self.fma = fma
            path = self.kernel[4:]
            if self.groups > 1:       # sets of groups, each a GEMM of block-diagonal weights
                from ..kernels.gather import group_span
                block = fma.block_of(path)
                parts, slots, sets, span_o = group_sets(
                    np.asarray(w, np.float32), self.groups,
                    group_span(self.groups, o // self.groups, block), block)
                self.packed = memory.aligned(np.concatenate([fma.pack(part, path)
                                                             for part in parts]))
                self.sets = (sets, span_o)
                self.bias_vec = np.ascontiguousarray(self.bias_vec[slots])
            else:
                self.packed = fma.pack(np.ascontiguousarray(   # (tap, channel): as rows gather
                    w.transpose(0, 2, 3, 1).reshape(o, -1), dtype=np.float32), path)
        self.fp32_path = self.kernel[4:] if self.fma is not None else None if self.direct \
            else "blas"
        # the weights as the NCHW kernels read them, where those run (the FMA kernel reads
        # its panels only: ResNet-18's 47 MB were copied to no use at each load)
        self.w = self._pack(w) if w is not None and self.fma is None else None
        self.taps = None    # a channel-last depthwise convolution's (kh, kw, C) weights
        if self.nhwc and self.depthwise and self.bias_vec is not None:
            self.taps = memory.aligned(np.ascontiguousarray(self.w[:, 0].transpose(1, 2, 0)))

    def _pack(self, w: np.ndarray) -> np.ndarray:
        o = w.shape[0]
        if self.direct:     # (O, cg, kh, kw), as the direct kernel reads it
            return np.ascontiguousarray(w, dtype=np.float32)
        return np.ascontiguousarray(w.reshape(o, -1), dtype=np.float32)    # (O, taps)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if attrs["data_layout"] == "NHWC" and len(in_types) == 3 and \
                not _per_channel_last(in_types[2].shape, out_type.shape):
            return False
        return _is_f32(*in_types[:2], out_type) and 1 in consts

    def _depthwise_call(self, nhwc, res):
        """(the channel-last depthwise kernel, its arguments) on a batch into res (N, oh, ow,
        C): one launch."""
        return k.depthwise_channels_last, (nhwc, self.taps, self.bias_vec, self.sh, self.sw,
                                           self.pt, self.pl, self.dh, self.dw, self.lo,
                                           self.hi, res, sweep_entry("float"))

    def _fma_call(self, nhwc, out, residual=None, bounds=None):
        """(the FMA kernel, its arguments) on a channel-last batch into out (N, oh, ow, O),
        plus ``residual`` (shaped as out) summed in before the activation's clamp to
        ``bounds`` (fused.conv2d_add's; default: this op's own)."""
        n, oh, ow, o = out.shape
        flat = out.reshape(n, oh * ow, o)
        res = _NO_RESIDUAL if residual is None else residual.reshape(flat.shape)
        lo, hi = (self.lo, self.hi) if bounds is None else bounds
        if self.sets is not None:
            return self.fma.grouped, (nhwc, self.kh, self.kw, self.sh, self.sw, self.pt,
                                      self.pl, self.dh, self.dw, oh, ow, self.packed,
                                      *self.sets, self.bias_vec, np.float32(lo), np.float32(hi),
                                      flat, threads(), res)
        return self.fma.conv, (nhwc, self.kh, self.kw, self.sh, self.sw, self.pt, self.pl,
                               self.dh, self.dw, oh, ow, self.packed, self.bias_vec,
                               np.float32(lo), np.float32(hi), flat, threads(), res)

    def prepare(self, ins, out):
        """The kernel's entry point bound to this site's arrays, where it reads them as they
        are (channel-last, contiguous)."""
        if self.nhwc and ins[0].flags.c_contiguous:
            if self.taps is not None and out.flags.c_contiguous:
                return bound(*self._depthwise_call(ins[0], out))
            if self.taps is None and self.fma is not None:
                return bound(*self._fma_call(ins[0], out))
        if not self.nhwc and self.taps is None and self.fma is not None:
            calls = nchw_calls(self, ins[0], out, self._fma_call)   # (``compute``'s moves)
            if calls is not None:
                return calls
        if self.direct and self.taps is None and self.bias_vec is not None and \
                ins[0].flags.c_contiguous and out.flags.c_contiguous:
            if not self.nhwc:
                return in_order([bound(*call) for call in self._direct_calls(
                    ins[0], out, self.bias_vec, self.lo, self.hi)])
            calls = nchw_calls(self, ins[0], out, lambda image, res: self._direct_calls(
                image, res, self.bias_vec, self.lo, self.hi), to_last=False)
            if calls is not None:
                return calls
        return super().prepare(ins, out)

    def _direct_calls(self, x, out, bias, lo, hi) -> list:
        """(the NCHW direct kernel, its arguments) per image (``compute``'s)."""
        return [(k.grouped, (x[b], self.w, bias, self.sh, self.sw, self.pt, self.pl,
                             self.dh, self.dw, lo, hi, out[b]))
                for b in range(out.shape[0])]

    def __call__(self, ins, out):
        if self.taps is not None:       # depthwise, channel-last as its kernel reads
            kernel, args = self._depthwise_call(ins[0], out)
            kernel(*args)
            return
        if self.fma is None or not self.nhwc:
            return super().__call__(ins, out)
        kernel, args = self._fma_call(np.ascontiguousarray(ins[0]), out)
        kernel(*args)

    def compute(self, ins, out):
        x = ins[0]
        if self.fma is not None:   # channel-last, between two moves (``moved``)
            n, o, oh, ow = out.shape
            res = self.scratch("result", (n, oh, ow, o), np.float32)
            x = moved(x, out=self.scratch("image", (n, *x.shape[2:], x.shape[1]), x.dtype))
            kernel, args = self._fma_call(x, res)
            kernel(*args)
            move_into(res, out, to_last=False)
            return
        w = self.w if self.w is not None else self._pack(ins[1])
        bias, lo, hi = self.bias_vec, self.lo, self.hi
        if bias is None:   # the bias (then the activation) is added after, not per channel
            bias, lo, hi = np.zeros(out.shape[1], np.float32), -np.inf, np.inf
        if self.direct:
            for kernel, args in self._direct_calls(x, out, bias, lo, hi):
                kernel(*args)
        else:
            self._gemms(x, w, bias, lo, hi, out)
        if self.bias_vec is None and len(ins) == 3:  # a bias that is not per channel
            np.add(out, ins[2], out=out)
            np.clip(out, self.lo, self.hi, out=out)

    def _gemms(self, x, w, bias, lo, hi, out) -> None:
        """Per image (groups 1): its windows (im2col; a pointwise convolution reads the image),
        BLAS's product with the weights, the bias and activation."""
        n, c, h, wd = x.shape
        _, o, oh, ow = out.shape
        for b in range(n):
            y = out[b].reshape(o, oh * ow)
            if self.pointwise:
                col = x[b].reshape(c, h * wd)
            else:
                col = _scratch((c * self.kh * self.kw, oh * ow))
                k.im2col(x[b], self.kh, self.kw, self.sh, self.sw, self.pt, self.pl,
                         self.dh, self.dw, oh, ow, col)
            np.matmul(w, col, out=y)
            k.bias_act(y, bias, lo, hi)

    @property
    def path(self) -> str | None:
        """The float convolution's path (None: the direct kernel, depthwise or grouped)."""
        return self.fp32_path


_SCRATCH: list[np.ndarray] = [np.empty(0, np.float32)]
# the FMA convolution's residual operand where it has none
_NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)


@binding
class Conv2DAdd(Conv2D):
    """fused.conv2d_add: Conv2D's kernels for the convolution and its bias. On the FMA kernel
    at a channel-last call site, a residual of the output's shape is summed into each finished
    tile while it is in cache, then the activation taken (``fma._add_tile``); elsewhere
    (depthwise, the BLAS path, NCHW, a residual that broadcasts) the convolution runs as
    fused.conv2d does, then the sum and the activation follow."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        conv_attrs = dict(attrs, activation="none")
        self.conv_type = get_op("fused.conv2d").type_rel(in_types[:3], conv_attrs)
        super().__init__(op, conv_attrs, in_types[:3], self.conv_type, consts)
        # the activation, after the sum (the convolution's own clamp is none)
        self.act_bounds = self.act_lo, self.act_hi = epilogue_bounds(attrs)
        self.in_gemm = (self.nhwc and self.taps is None and self.fma is not None and
                        in_types[3] == out_type == self.conv_type)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        conv_type = get_op("fused.conv2d").type_rel(in_types[:3], dict(attrs))
        return (super().supports(op, attrs, in_types[:3], conv_type, consts) and
                _is_f32(in_types[3], out_type))

    def prepare(self, ins, out):
        if self.in_gemm and ins[0].flags.c_contiguous:
            return bound(*self._fma_call(ins[0], out, ins[3], self.act_bounds))
        res = ins[3]
        conv = super().prepare(ins[:3], out) if self.conv_type == self.out_type == \
            TensorType(res.shape, "float32") and res.flags.c_contiguous else None
        if launches_of(conv) is not None:
            # the convolution's own launches into out, then the sum and the activation
            # (where it has none, its fallback would call this binding: not taken)
            calls = [conv,
                     bound(sized(k.binary_same, out.size), (out.reshape(-1), res.reshape(-1),
                                                            0, 0, out.reshape(-1)))]
            if self.act_lo > -np.inf or self.act_hi < np.inf:
                calls.append(bound(sized(k.unary, out.size), (
                    out.reshape(-1), 2, np.float32(self.act_lo), np.float32(self.act_hi),
                    out.reshape(-1))))
            return in_order(calls)
        return functools.partial(self, ins, out)

    def __call__(self, ins, out):
        if self.in_gemm:
            kernel, args = self._fma_call(np.ascontiguousarray(ins[0]), out, ins[3],
                                          self.act_bounds)
            kernel(*args)
            return
        conv = out if self.conv_type == self.out_type else self.scratch(
            "conv", self.conv_type.shape, np.float32)
        super().__call__(ins[:3], conv)
        np.add(conv, ins[3], out=out)
        if self.act_lo > -np.inf or self.act_hi < np.inf:
            np.clip(out, self.act_lo, self.act_hi, out=out)


def _scratch(shape: tuple[int, int]) -> np.ndarray:
    """One im2col buffer for the process, grown when needed: a fresh 10 MB array per call
    would pay its page faults every time. (Calls run one at a time.)"""
    size = shape[0] * shape[1]
    if _SCRATCH[0].size < size:
        _SCRATCH[0] = np.empty(size, np.float32)
    return _SCRATCH[0][:size].reshape(shape)


@binding
class Dense(Binding):
    """nn.dense and fused.dense: the FMA GEMM with its epilogue (a 1x1 convolution of a
    one-row image), or BLAS GEMM (weight transposed once at load) + epilogue on the "blas"
    path. (The FMA GEMM keeps BLAS's own thread pool out of the program: OpenBLAS's threads
    spin for a tenth of a second after each call, and took half the cores from the
    convolutions that followed.)"""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        units = in_types[1].shape[0]
        self.lo, self.hi = epilogue_bounds(attrs)
        if len(in_types) == 3:      # (a vector, a (1, units) row as ONNX's Gemm has it, or one)
            self.bias = np.ascontiguousarray(np.broadcast_to(
                np.asarray(consts[2]).reshape(-1), (units,)), dtype=np.float32)
        else:
            self.bias = np.zeros(units, np.float32)
        from .plan import resolve          # the site's kernel (the plan's, ``plan.py``)
        self.kernel = resolve(op, attrs, in_types, out_type, consts) or "blas"
        self.fma = None
        if self.kernel in ("x86.avx512", "x86.fma"):
            from ..kernels import fma
            self.fma = fma
            self.packed = fma.pack(np.ascontiguousarray(consts[1], dtype=np.float32),
                                   self.kernel[4:])
        else:
            self.wt = np.ascontiguousarray(consts[1].T, dtype=np.float32)

    @property
    def path(self) -> str | None:
        return self.kernel[4:] if self.fma is not None else "blas"

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if not (_is_f32(*in_types, out_type) and 1 in consts and len(in_types[0].shape) == 2):
            return False
        if len(in_types) == 2:
            return True
        # a bias that is one value per unit, broadcast along the rows: (units,), (1, units)
        # (as ONNX's Gemm imports), or one value for all
        b, units = consts.get(2), in_types[1].shape[0]
        return b is not None and (b.size == 1 or (
            b.size == units and b.shape[-1] == units))

    def kernel_call(self, ins, out):
        """the FMA kernels' convolution, the batch its pixels (a 1 x 1 convolution)"""
        if self.fma is None or not ins[0].flags.c_contiguous:
            return None
        return self._conv(ins[0], out)

    def _conv(self, x, out):
        n = x.shape[0]
        return self.fma.conv, (x.reshape(1, 1, n, -1), 1, 1, 1, 1, 0, 0, 1, 1, 1, n,
                               self.packed, self.bias, np.float32(self.lo),
                               np.float32(self.hi), out.reshape(1, n, -1), threads(),
                               _NO_RESIDUAL)

    def __call__(self, ins, out):
        if self.fma is not None:
            kernel, args = self._conv(np.ascontiguousarray(ins[0]), out)
            kernel(*args)
            return
        np.matmul(ins[0], self.wt, out=out)
        # a row whose float32 sums overflowed (a product past 3.4e38, then inf - inf = NaN)
        # or met a NaN: again in float64, as the op is defined, so that its infinities and
        # NaNs are the reference's
        bad = ~np.isfinite(out).all(axis=1)
        if bad.any():
            out[bad] = np.asarray(ins[0])[bad].astype(np.float64) @ self.wt.astype(np.float64)
        out += self.bias
        np.clip(out, self.lo, self.hi, out=out)


def _geometry(attrs):
    (kh, kw), (sh, sw), (dh, dw) = attrs["pool_size"], attrs["strides"], attrs["dilation"]
    pt, pl, pb, pr = attrs["padding"]
    return kh, kw, sh, sw, pt, pl, pb, pr, dh, dw


def _same_dtype(in_types, out_type, dtypes=("float32", "int8", "uint8", "int32")) -> bool:
    return all(isinstance(t, TensorType) and t.dtype == out_type.dtype and t.dtype in dtypes
               for t in (*in_types, out_type))


class _PerImage(_Spatial):
    """A pool bound as the launches ``image_calls`` gives: one per image (NCHW), or one for
    the batch (its channel-last kernels)."""

    def image_calls(self, x, out) -> list | None:
        """(kernel, its arguments) per image, as the binding's own call runs them; None
        where its layout has no kernel of its own."""
        return None

    def prepare(self, ins, out):
        if ins[0].flags.c_contiguous and out.flags.c_contiguous:
            calls = self.image_calls(ins[0], out)
            if calls:
                return in_order([bound(*call) for call in calls])
        return super().prepare(ins, out)

    def __call__(self, ins, out):
        for kernel, args in self.image_calls(np.ascontiguousarray(ins[0]), out):
            kernel(*args)


@binding
class MaxPool2D(_PerImage):
    """max_pool2d on NCHW (phase planes per channel), or channel-last as it is (NHWC: a row of
    ``pool_simd`` per output row; its element types are ``_same_dtype``'s)."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return _same_dtype(in_types, out_type)

    def image_calls(self, x, out) -> list:
        kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = self.geometry()
        dtype = out.dtype
        if self.nhwc:
            kernel = k.max_pool_channels_last[KIND_OF[dtype.name]]
            return [(kernel, (x, kh, kw, sh, sw, pt, pl, dh, dw, out))]     # (the batch)
        lowest = dtype.type(-np.inf) if dtype.kind == "f" else np.iinfo(dtype).min
        return [(k.max_pool, (x[b], kh, kw, sh, sw, pt, pl, dh, dw, dtype.type(lowest),
                              out[b])) for b in range(x.shape[0])]


def _pool_dtypes(in_types, out_type) -> bool:
    """float32, or integers averaged exactly and truncated toward zero (as numpy's reference
    does: the float64 sum of 8- or 32-bit integers is exact)."""
    return _is_f32(*in_types, out_type) or (
        _same_dtype(in_types, out_type) and out_type.dtype in ("int8", "uint8", "int32"))


class _Averaging(_PerImage):
    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return _pool_dtypes(in_types, out_type)


@binding
class AvgPool2D(_Averaging):
    def image_calls(self, x, out) -> list:
        """Per image: NCHW each channel's plane, channel-last each output pixel's channels
        at once (the same sums in the same order)."""
        kh, kw, sh, sw, pt, pl, pb, pr, dh, dw = self.geometry()
        include_pad = bool(self.attrs["count_include_pad"])
        if self.nhwc:       # (the batch in one launch)
            return [(k.avg_pool_channels_last, (x, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw,
                                                include_pad, out))]
        return [(k.avg_pool, (x[b].transpose(1, 2, 0), kh, kw, sh, sw, pt, pl, pb, pr, dh,
                              dw, include_pad, out[b].transpose(1, 2, 0)))
                for b in range(x.shape[0])]


@binding
class GlobalAvgPool2D(_Averaging):
    def image_calls(self, x, out) -> list:
        """NCHW: each channel's plane summed; channel-last: each pixel's channels summed as
        a row (the same sums, in the same order)."""
        if not self.nhwc:
            return [(k.global_avg_pool, (x[b], out[b].reshape(-1))) for b in range(x.shape[0])]
        n = x.shape[0]      # (the batch in one launch: a mean down each image's rows)
        return [(sized(k.reduce_middle, x.size),
                 (x.reshape(n, -1, x.shape[3]), get_op("mean").kernel_params["code"],
                  out.reshape(n, -1)))]


@binding
class Reduce(Binding):
    """sum, mean, max and min over a run of adjacent axes of a float32 tensor (a global
    pool written as a mean, a sum over channels): the input read as (outer, reduced, inner),
    one launch (``kernels_fp32.reduce_middle``). Other axis sets run the reference."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        from ...ops.tensor import reduce_axes
        axes = reduce_axes(in_types[0].rank, attrs["axis"], attrs["exclude"])
        return _is_f32(in_types[0], out_type) and bool(axes) and \
            axes == tuple(range(axes[0], axes[-1] + 1)) and in_types[0].size > 0

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ...ops.tensor import reduce_axes
        shape = in_types[0].shape
        axes = reduce_axes(len(shape), attrs["axis"], attrs["exclude"])
        self.code = op.kernel_params["code"]
        self.split = (int(np.prod(shape[:axes[0]])), int(np.prod(shape[axes[0]:axes[-1] + 1])),
                      int(np.prod(shape[axes[-1] + 1:])))

    def kernel_call(self, ins, out):
        if not (ins[0].flags.c_contiguous and out.flags.c_contiguous):
            return None
        a, r, b = self.split
        return sized(k.reduce_middle, a * r * b), (ins[0].reshape(a, r, b), self.code,
                                                   out.reshape(a, b))

    def __call__(self, ins, out):
        self.call_contiguous(ins, out)


@binding
class BatchMatmul(Launches):
    """nn.batch_matmul of float32 stacks of one shape (attention's products in float), on
    the kernel the plan names (``plan.kernels_of``): "x86.fma" or "x86.avx512", b packed as
    that GEMM's panels at run time (``fma.pack_stack``), then its rows of a times them
    (``fma.stack_items``); or "portable", ``kernels_fp32.batch_matmul_rows`` on b's matrices
    as (K, N) (b transposed into the site's scratch first where the op reads it transposed,
    by the strided copy). The GEMMs read a's rows whole: a read transposed is copied so too;
    the portable rows read it through a transposed view."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from .plan import resolve
        self.kernel = resolve(op, attrs, in_types, out_type, consts) or "portable"

    @property
    def path(self) -> str:
        return self.kernel[4:] if self.kernel.startswith("x86.") else "portable"

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        a, b = in_types
        return _is_f32(a, b, out_type) and len(a.shape) == len(b.shape) >= 2 and \
            tuple(a.shape[:-2]) == tuple(b.shape[:-2]) and out_type.size > 0

    def calls(self, ins, out) -> list | None:
        a, b = ins
        if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            return None
        a3 = a.reshape((-1,) + a.shape[-2:])
        b3 = b.reshape((-1,) + b.shape[-2:])
        out3 = out.reshape((-1,) + out.shape[-2:])
        depth = a3.shape[1] if self.attrs["transpose_a"] else a3.shape[2]
        dot = bool(self.attrs["transpose_b"])
        calls = []
        if self.path != "portable":
            from ..kernels import fma
            if self.attrs["transpose_a"]:      # (the GEMM reads a's rows whole)
                a3 = self._copied("a", a3.transpose(0, 2, 1), calls)
            block = fma.block_of(self.path)
            n = out3.shape[2]
            panels = self.scratch("panels", (b3.shape[0], -(-n // block), depth, block),
                                  np.float32)
            zeros = self.scratch("zeros", (panels.shape[1] * block,), np.float32)
            zeros[...] = 0.0
            return calls + [(sized(fma.pack_stack, panels.size), (b3, dot, panels)),
                            (sized(fma.stack_items, out.size * depth),
                             (a3, panels, zeros, out3))]
        if self.attrs["transpose_a"]:
            a3 = a3.transpose(0, 2, 1)
        if dot:                             # (B, N, K): its rows of N made once
            b3 = self._copied("b", b3.transpose(0, 2, 1), calls)
        return calls + [(sized(k.batch_matmul_rows, out.size * depth), (a3, b3, out3))]

    def _copied(self, name: str, view, calls: list):
        """``view`` copied into the site's scratch by the strided copy (``_strided``), that
        copy appended to ``calls``; the scratch."""
        dst = self.scratch(name, view.shape, np.float32)
        calls.append(_strided(view, dst))
        return dst


@binding
class LayerNorm(Binding):
    """nn.layer_norm over the last axis of a float32 tensor (ViT's, ConvNeXt's): each row
    one work item of ``kernels_fp32.layer_norm_rows``."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        rank = in_types[0].rank
        return _is_f32(*in_types, out_type) and rank > 0 and attrs["axis"] % rank == rank - 1

    def kernel_call(self, ins, out):
        x, gamma, beta = ins
        if not all(v.flags.c_contiguous for v in (x, gamma, beta, out)):
            return None
        c = x.shape[-1]
        return sized(k.layer_norm_rows, x.size), (
            x.reshape(-1, c), gamma.reshape(-1), beta.reshape(-1),
            float(self.attrs["epsilon"]), bool(self.attrs["scale"]),
            bool(self.attrs["center"]), out.reshape(-1, c))

    def __call__(self, ins, out):
        self.call_contiguous(ins, out)


@binding
class Binary(Binding):
    """Elementwise add/subtract/multiply/divide/maximum/minimum: same shapes, or a
    per-channel operand;
    any other broadcast of up to four axes reads its operands as views of the output's
    shape (``binary_broadcast``); more axes broadcast through numpy. float32, or int32
    add/subtract/multiply."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if "code" not in op.kernel_params:
            return False
        return _is_f32(*in_types, out_type) or (
            op.kernel_params["int32"] and _same_dtype(in_types, out_type, ("int32",)))

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        self.code = op.kernel_params["code"]   # (ops.tensor: 0 add .. 3 divide, 4 max, 5 min)
        a, b = in_types
        self.same = a.shape == b.shape == out_type.shape

        def per_channel(full, other):
            return (full.shape == out_type.shape and len(full.shape) >= 2 and
                    _per_channel(other.shape, out_type.shape) and
                    int(np.prod(other.shape)) == out_type.shape[1])
        self.channel = per_channel(a, b)
        # a per-channel first operand of a sum or a product (a squeeze-excitation's scales
        # times the image): the operands swapped, the same values
        self.swap = not self.channel and self.code in (0, 2) and per_channel(b, a)
        self.channel = self.channel or self.swap
        if int(np.prod(out_type.shape[2:], dtype=np.int64)) == 1:
            # the channels are the last axis (a dense layer's (rows, units) and its bias):
            # one broadcast launch over rows, not a channel loop per row
            self.channel = self.swap = False
        rank = len(out_type.shape)
        self.shape4 = (1,) * (4 - rank) + tuple(out_type.shape) if rank <= 4 else None
        # the second operand a value per channel along the last axis of the first (a
        # channel-last image's scale or shift): rows of the channels (``binary_rows``)
        last = out_type.shape[-1] if rank else 0
        def along_last(full, other):
            return (full.shape == out_type.shape and last > 1 and
                    tuple(other.shape) in ((last,), (1,) * (rank - 1) + (last,)))
        self.rows = not self.same and not self.channel and rank >= 2 and along_last(a, b)
        # (a sum or a product the other way round: a channel-last squeeze-excitation's
        # scales times the image)
        self.rows_swap = (not self.same and not self.channel and not self.rows and rank >= 2
                          and self.code in (0, 2) and along_last(b, a))

    def kernel_call(self, ins, out):
        """Operands of one shape, or a per-channel one with one value per channel (a
        classifier's bias): one elementwise loop over the contiguous values (taken as a
        channel's loop of one value each, a classifier's bias was many times slower)."""
        a, b = ins
        per = a if self.swap else b            # the per-channel operand
        flat = self.same or (self.channel and per.size == out.size)
        if flat and a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous:
            return sized(k.binary_same, out.size), (a.reshape(-1), b.reshape(-1), self.code, 0,
                                                    out.reshape(-1))
        if (self.rows or self.rows_swap) and a.flags.c_contiguous and b.flags.c_contiguous \
                and out.flags.c_contiguous:
            last = out.shape[-1]
            full, vec = (b, a) if self.rows_swap else (a, b)
            return sized(k.binary_rows, out.size), (full.reshape(-1, last), vec.reshape(-1),
                                                    self.code, out.reshape(-1, last))
        if not self.channel and self.shape4 is not None and out.flags.c_contiguous:
            return sized(k.binary_broadcast, out.size), (
                broadcast_view(a, self.shape4), broadcast_view(b, self.shape4), self.code,
                out.reshape(self.shape4))
        return None

    def _channel_calls(self, a, b, out) -> list:
        """(binary_channel, its arguments) per image: the full operand's channels, each
        with its one value of the other (C-contiguous operands)."""
        a, b = (b, a) if self.swap else (a, b)
        n, c = out.shape[:2]
        return [(sized(k.binary_channel, out[i].size), (a[i].reshape(c, -1), b.reshape(-1),
                                                        self.code, out[i].reshape(c, -1)))
                for i in range(n)]

    def prepare(self, ins, out):
        if self.kernel_call(ins, out) is None and self.channel and \
                all(v.flags.c_contiguous for v in (*ins, out)):
            return in_order([bound(*call) for call in self._channel_calls(*ins, out)])
        return super().prepare(ins, out)

    def __call__(self, ins, out):
        a, b = ins
        if self.call_kernel(ins, out):
            return
        if self.channel:
            for kernel, args in self._channel_calls(np.ascontiguousarray(a),
                                                    np.ascontiguousarray(b), out):
                kernel(*args)
        else:
            (np.add, np.subtract, np.multiply, np.divide, np.maximum,
             np.minimum)[self.code](a, b, out=out)


@binding
class Activation(Binding):
    """The unary activations of the elementwise kernel, by the code the op's registry entry
    gives (``kernel_params``: ``code``, ``params(attrs) -> (p0, p1)``, ``integers`` when the
    kernel also takes same-dtype integers); float32 otherwise. An op without a code is not
    bound here, so an op can never silently compute another op's function."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if "code" not in op.kernel_params:
            return False
        if op.kernel_params.get("integers"):
            return _same_dtype(in_types, out_type)
        return _is_f32(*in_types, out_type)

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        self.code = op.kernel_params["code"]
        params = op.kernel_params.get("params")
        self.p0, self.p1 = (float(v) for v in params(attrs)) if params else (0.0, 0.0)

    def kernel_call(self, ins, out):
        """the elementwise loop over the contiguous values"""
        if not (ins[0].flags.c_contiguous and out.flags.c_contiguous):
            return None
        return sized(k.unary, out.size), (ins[0].reshape(-1), self.code, self.p0, self.p1,
                                          out.reshape(-1))

    def __call__(self, ins, out):
        sized(k.unary, out.size)(ins[0].reshape(-1), self.code, self.p0, self.p1,
                                 out.reshape(-1))


@binding
class Elementwise(Binding):
    """A float32 elementwise op with a kernel of its own: ``kernel_params["fn"](x, out,
    *params)`` on the flattened input and output, ``fn`` a function, the name of one in
    ``kernels/fp32.py``, or "module:name" (a Numba or numpy function; see the registry's
    OpDef), ``params`` from
    ``kernel_params["params"](attrs)`` (none by default)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        fn = op.kernel_params["fn"]
        if isinstance(fn, str):
            module, _, name = fn.rpartition(":")
            fn = getattr(importlib.import_module(module) if module else k, name)
        self.fn = fn
        params = op.kernel_params.get("params")
        self.params = tuple(np.float32(p) for p in params(attrs)) if params else ()

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return "fn" in op.kernel_params and _is_f32(*in_types, out_type) and \
            in_types[0].shape == out_type.shape

    def kernel_call(self, ins, out):
        """a launch kernel's loop over the contiguous values (a numpy function is called)"""
        if not (isinstance(self.fn, Parallel) and ins[0].flags.c_contiguous and
                out.flags.c_contiguous):
            return None
        return self.fn, (ins[0].reshape(-1), out.reshape(-1), *self.params)

    def __call__(self, ins, out):
        self.fn(np.ascontiguousarray(ins[0]).reshape(-1), out.reshape(-1), *self.params)


@binding
class Softmax(Binding):
    """nn.softmax and nn.log_softmax over the last axis: the entry's ``rows`` kernel
    (``kernels_fp32.softmax_rows``, ``log_softmax_rows``) on the rows."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return _is_f32(*in_types) and attrs["axis"] in (-1, len(in_types[0].shape) - 1)

    def kernel_call(self, ins, out):
        x = ins[0]
        if not (out.size and x.flags.c_contiguous and out.flags.c_contiguous):
            return None
        n = x.shape[-1]
        return sized(getattr(k, self.op.kernel_params["rows"]), out.size), (
            x.reshape(-1, n), out.reshape(-1, n))

    def __call__(self, ins, out):
        if out.size:                    # (no rows, or rows of nothing: nothing to write)
            self.call_contiguous(ins, out)


@binding
class View(Binding):
    """reshape, batch_flatten, expand_dims, squeeze and identity annotations: no copy."""

    view = True

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        # only ops that keep their input's elements in order: views and identities
        return isinstance(out_type, TensorType) and (not op.moves_data or
                                                     IDENTITY in op.props)

    def __call__(self, ins, out=None):
        return ins[0].reshape(self.out_type.shape)


@binding
class StridedCopy(Binding):
    """An op whose result is a view of its operand, copied (transpose, strided_slice): the
    registry entry's ``view(x, **attrs)`` (the reference copies the same view) copied in one
    launch (``kernels_fp32.copy_strided``) of up to six axes."""

    RANK = 6

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (isinstance(out_type, TensorType) and len(in_types[0].shape) <= cls.RANK and
                "view" in op.kernel_params)

    def kernel_call(self, ins, out):
        view = self.op.kernel_params["view"](ins[0], **self.attrs)
        if not out.flags.c_contiguous or view.shape != out.shape or \
                not np.shares_memory(view, ins[0]):
            return None
        return _strided(view, out)

    def __call__(self, ins, out):
        if not self.call_kernel(ins, out):
            np.copyto(out, self.op.kernel_params["view"](ins[0], **self.attrs))


def _strided(view, out):
    """(the strided copy of ``view`` into ``out``, its arguments), its axes merged
    (``kernels_fp32.strided_call``), or None where more than six remain."""
    call = k.strided_call(view, out, StridedCopy.RANK)
    return None if call is None else (sized(call[0], out.size), call[1])


@binding
class LayoutTransform(Binding):
    """layout_transform: channels moved last or first (NCHW <-> NHWC) as a tiled transpose
    of each image's (C, HW) plane; any other permutation of up to six axes one strided copy
    (``StridedCopy``'s kernel)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ...ops.tensor import layout_perm
        self.perm = layout_perm(attrs["src_layout"], attrs["dst_layout"])
        self.plane = None
        shape = in_types[0].shape
        if self.perm == [0, 2, 3, 1]:       # (N, C, HW) -> (N, HW, C)
            self.plane = (shape[0], shape[1], shape[2] * shape[3])
        elif self.perm == [0, 3, 1, 2]:     # (N, HW, C) -> (N, C, HW)
            self.plane = (shape[0], shape[1] * shape[2], shape[3])

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return isinstance(out_type, TensorType)

    def kernel_call(self, ins, out):
        if not out.flags.c_contiguous:
            return None
        if self.plane is None:
            return _strided(ins[0].transpose(self.perm), out)
        if not ins[0].flags.c_contiguous:
            return None
        n, a, b = self.plane
        return k.transpose_call(ins[0].reshape(n, a, b), out.reshape(n, b, a))

    def __call__(self, ins, out):
        if not self.call_kernel(ins, out):
            np.copyto(out, ins[0].transpose(self.perm))


@binding
class Concatenate(Binding):
    """concatenate (any one dtype): each input copied into its slice of the output, one
    launch each."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return isinstance(out_type, TensorType) and all(
            isinstance(t, TensorType) and t.dtype == out_type.dtype for t in in_types[0].fields)

    def _calls(self, parts, out) -> list:
        """(copy_rows, its arguments) per input: its rows into their columns of the output."""
        axis = self.attrs["axis"] % out.ndim
        lead = int(np.prod(out.shape[:axis], dtype=np.int64))
        dst = out.reshape(lead, -1)
        calls, start = [], 0
        for part in parts:
            width = int(np.prod(part.shape[axis:], dtype=np.int64))
            calls.append((sized(k.copy_rows, part.size), (part.reshape(lead, width),
                                                          dst[:, start:start + width])))
            start += width
        return calls

    def prepare(self, ins, out):
        if not (out.flags.c_contiguous and all(p.flags.c_contiguous for p in ins[0])):
            return super().prepare(ins, out)
        return in_order([bound(*call) for call in self._calls(ins[0], out)])

    def __call__(self, ins, out):
        for kernel, args in self._calls([np.ascontiguousarray(p) for p in ins[0]], out):
            kernel(*args)


@binding
class Pad(Binding):
    """nn.pad, constant mode, padding only the last two axes."""

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        pw = attrs["pad_width"]
        return (_is_f32(in_types[0], out_type) and attrs["pad_mode"] == "constant" and
                len(pw) >= 2 and all(p == [0, 0] for p in pw[:-2]))

    def __call__(self, ins, out):
        x, value = ins
        h, w = x.shape[-2:]
        (pt, _), (pl, _) = self.attrs["pad_width"][-2:]
        k.pad_planes(x.reshape(-1, h, w), float(value), pt, pl,
                     out.reshape(-1, *out.shape[-2:]))
