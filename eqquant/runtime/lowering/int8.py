"""Kernel bindings of the integer ops: quantize, dequantize, requantize, qnn.conv2d,
qnn.dense, qnn.add, qnn.clip and the fused int8 convolution. Convolutions and dense layers run
on the kernel each site names (``kernel="x86.vnni"``, the lowering's plan for the target:
``plan.py``): AMX tiles (``kernels/amx.py``), the VNNI GEMMs (``kernels/vnni.py``'s rows:
512-bit on blocks of 64 or of 16, 256-bit), AVX2 (``kernels/avx2.py``), the direct depthwise
kernel, or portable Numba loops (``kernels/int8.py``); every kernel gives the reference's
bits. See ``fp32.py`` for what a binding is.
"""
from __future__ import annotations

import functools

import numpy as np

from ...core.types import TensorType
from ...ops.fused import epilogue_bounds
from ...ops.fixed_point import quantize_multiplier
from ...ops.numerics import qrange
from ...ops.qnn import INT8_KERNELS
from ...ops.registry import get_op
from . import binding
from ..codegen import epilogue_table
from ..codegen import memory
from ..kernels.depthwise import entry as sweep_entry
from .fp32 import (Binding, Launches, _per_channel, _per_channel_last, bound, broadcast_view,
                   group_sets, move_into, moved, nchw_calls, threads)
from ..codegen.launch import in_order, launches_of
from ..codegen.serial import sized
from ..kernels import simd_module


def _const_scalar(consts, i):
    """The value of constant operand i when it is one number, else None."""
    v = consts.get(i)
    if v is None or np.asarray(v).size != 1:
        return None
    return np.asarray(v).reshape(())


def _param(consts, in_types, i, dtype):
    """Operand i, a scale or a zero point, as the one-element array a kernel reads: the
    constant's value, or None where it is one number computed at run time (dynamic
    quantization's ``qnn.dynamic_scale``: the run's operand is read, ``_at_run``); False
    where it is neither (a binding that reads parameters this way does not support it)."""
    v = _const_scalar(consts, i)
    if v is not None:
        return np.array([v], dtype)
    if i not in consts and int(np.prod(in_types[i].shape, dtype=np.int64)) == 1:
        return None
    return False


def _at_run(param, ins, i) -> np.ndarray:
    """A parameter ``_param`` gave: its constant's array, or the operand's buffer as one."""
    return param if param is not None else ins[i].reshape(1)


def int8_path() -> str:
    """The fastest int8 GEMM path the process's target offers (``target.current``)."""
    from ..target import current
    return current().int8_path


def _gemm(kernel: str):
    """(the SIMD GEMM module, its path) of a kernel name, or (None, "portable")."""
    from ..target import gemm_path
    path = gemm_path(kernel)
    return (simd_module(path), path) if path else (None, "portable")


class _Launches(Binding):
    """A binding whose work is a list of kernel calls (``calls(x, out)``, each (kernel, args))
    on its first operand and its output, both C-contiguous: made in order by a call, bound as
    launches by ``prepare``."""

    def calls(self, x, out, ins) -> list:
        """The calls on ``x`` (operand 0) into ``out``; ``ins``: every operand."""
        raise NotImplementedError

    def __call__(self, ins, out):
        res = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
        for kernel, args in self.calls(np.ascontiguousarray(ins[0]), res, ins):
            kernel(*args)
        if res is not out:
            out[...] = res

    def prepare(self, ins, out):
        """The site's calls, bound to its arrays."""
        if ins[0].flags.c_contiguous and out.flags.c_contiguous:
            return in_order([bound(*call) for call in self.calls(ins[0], out, ins)])
        return super().prepare(ins, out)


@binding
class QConv2D(_Launches):
    """qnn.conv2d: on a SIMD path (VNNI, AVX2), pixel rows (uint8) times packed weights;
    otherwise int8 im2col + a portable int32 GEMM. Weights and zero points are prepacked
    once. The kernels read images channel-last; an NCHW call site has each image transposed
    on the way in (the SIMD GEMMs) and the result on the way out, an NHWC one (HWIO weights)
    is read and written as it is by the fused kernels (``FusedQConv2D``); this unfused op runs
    an NHWC call site between two transposes on the portable path."""

    @classmethod
    def reads_channels_last(cls, attrs, in_types, fused: bool = False) -> bool:
        """This machine's refinement of the registry's claim: the depthwise kernel and the
        SIMD GEMMs read channel-last images, the portable GEMM (no SIMD path, or one forced)
        NCHW ones. A grouped convolution runs on a SIMD GEMM where the target has a grouped
        one and the op is ``fused`` (its sums requantized to 8 bits), else on the portable GEMM."""
        if attrs.get("kernel"):
            return attrs["kernel"] != "portable"
        if attrs["groups"] == 1:
            return int8_path() != "portable"
        w = in_types[1].shape
        if (w[2] if attrs["kernel_layout"] == "HWIO" else w[1]) == 1:
            return True                   # the depthwise kernel, on every target
        from ..target import current, gemm_path
        target = current()
        return fused and any(target.offers(k) and
                             getattr(simd_module(gemm_path(k)), "GROUPED", False)
                             for k in INT8_KERNELS if gemm_path(k))

    def __init__(self, op, attrs, in_types, out_type, consts, kernel: str | None = None):
        """``kernel``: the site's kernel (``lowering.resolve``'s), where the caller resolved
        it (a fused op's, on its own constants)."""
        super().__init__(op, attrs, in_types, out_type, consts)
        from .plan import resolve
        self.kernel = kernel if kernel is not None else resolve(op, attrs, in_types, out_type,
                                                                consts)
        from ..kernels import int8 as k8
        from ...ops.numerics import to_oihw
        self.k8 = k8
        self.channels_last = attrs["data_layout"] == "NHWC"
        w = np.ascontiguousarray(to_oihw(np.asarray(consts[1]), attrs["kernel_layout"]))
        o, cg, kh, kw = w.shape
        self.kh, self.kw, self.groups = kh, kw, attrs["groups"]
        self.w = np.ascontiguousarray(w.reshape(self.groups, o // self.groups, -1))
        zw = np.broadcast_to(np.asarray(consts[3], np.int32).reshape(-1), (o,))
        self.zw = np.ascontiguousarray(zw, dtype=np.int32).reshape(self.groups, -1)
        self.zx = int(_const_scalar(consts, 2))
        self.sh, self.sw = attrs["strides"]
        self.dh, self.dw = attrs["dilation"]
        self.pt, self.pl, _, _ = attrs["padding"]
        # depthwise (one input channel per group, any channel multiplier): a direct kernel,
        # whose sweep takes the taps (weight minus zero point) as 16-bit numbers
        self.depthwise = self.kernel == "depthwise"
        if self.depthwise:
            self.mult = o // self.groups
            self.wdw = memory.aligned(np.ascontiguousarray(   # (kh, kw, O): taps along
                (w.reshape(o, kh, kw).astype(np.int32) - self.zw.reshape(o, 1, 1))   # channels
                .transpose(1, 2, 0)))
        # a SIMD GEMM: uint8 activations (int8 shifted by 128) times int8 weights
        self.simd, self.gemm_path = _gemm(self.kernel)
        self.slots = None      # (a grouped convolution's on a SIMD GEMM: see ``_sets``)
        if self.simd is not None:
            self.shift = 128 if in_types[0].dtype == "int8" else 0
            if self.groups > 1:
                parts, self.slots, sets, span_o = self._sets(w)
                packs = [self.simd.pack(part) for part in parts]
                self.packed = memory.aligned(np.concatenate([p[0] for p in packs]))
                colsum128, self.kp = np.concatenate([p[1] for p in packs]), packs[0][2]
                self.conv_kernel, self.more_args = self.simd.grouped_kernel(sets, span_o)
            else:
                # (tap, channel) order, so that each tap of a window is contiguous in NHWC
                # rows
                w_tap = np.ascontiguousarray(w.transpose(0, 2, 3, 1).reshape(o, -1))
                self.packed, colsum128, self.kp = self.simd.pack(w_tap)
                # the fused convolution of this layer's shape, its arguments besides packed
                self.conv_kernel, self.more_args = self.simd.conv_kernel(w_tap, self.kp,
                                                                         self.kernel)
            colsum = colsum128 // 128
            self.correction = (colsum * (self.shift + self.zx)).astype(np.int32)
            self.out_hw = tuple(out_type.shape[1:3] if self.channels_last else
                                out_type.shape[2:])
            self.pointwise = (kh, kw) == (1, 1) and (self.sh, self.sw) == (1, 1) and \
                not any(attrs["padding"])

    def _sets(self, w: np.ndarray) -> tuple:
        """A grouped convolution on a SIMD GEMM (``vnni.grouped_requantize``): its groups
        taken in sets (``group_span``), each set one GEMM of block-diagonal weights. Returns
        (each set's weights (set outputs, K) in (tap, channel) order, the epilogue's slots
        (per set, its blocks' channels: a slot past the set's outputs repeats its last,
        never stored), sets, outputs a set)."""
        og = w.shape[0] // self.groups
        return group_sets(w, self.groups, self.simd.group_span(self.groups, og),
                          self.simd.BLOCK)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (attrs["data_layout"] in ("NCHW", "NHWC") and 1 in consts and 3 in consts and
                _const_scalar(consts, 2) is not None and in_types[1].dtype == "int8" and
                in_types[0].dtype in ("int8", "uint8") and out_type.dtype == "int32")

    def calls(self, x, out, ins=()) -> list:
        """The calls computing the int32 sums ``out`` of the batch ``x`` (both C-contiguous,
        in the site's layout): the SIMD GEMM's (``simd_calls``), or the portable kernels'
        (``portable_calls``: NCHW; at a channel-last site between two transposes)."""
        if self.simd is not None:
            return self.simd_calls(x, out)
        if not self.channels_last:
            return self.portable_calls(x, out)
        from ..kernels.fp32 import transpose_call
        n, h, w, c = x.shape
        o = out.shape[3]
        image = self.scratch("nchw", (n, c, h, w), x.dtype)
        acc = self.scratch("acc", (n, o, *out.shape[1:3]), np.int32)
        return [transpose_call(x.reshape(n, h * w, c), image.reshape(n, c, h * w)),
                *self.portable_calls(image, acc),
                transpose_call(acc.reshape(n, o, -1), out.reshape(n, -1, o))]

    def unsigned_calls(self, x) -> tuple:
        """(the batch ``x`` (C-contiguous, in the site's layout) channel-last as the unsigned
        bytes the SIMD GEMM reads, the calls making it): ``x`` itself where it is that, else
        the site's scratch image (int8 + 128 as a byte is its bits with the top one
        flipped)."""
        if self.channels_last:
            if not self.shift:
                return x, []
            flat = x.view(np.uint8).reshape(-1)
            image = self.scratch("image", x.shape, np.uint8)
            return image, [(sized(self.k8.flip_top_bits, flat.size), (flat, image.reshape(-1)))]
        n, c = x.shape[:2]
        image = self.scratch("image", (n, *x.shape[2:], c), np.uint8)
        if not self.shift:          # unsigned already: moved as it is
            from ..kernels.fp32 import transpose_call
            return image, [transpose_call(x.reshape(n, c, -1), image.reshape(n, -1, c))]
        return image, [(self.k8.to_hwc, (x[b], self.shift, image[b])) for b in range(n)]

    def nhwc(self, x: np.ndarray) -> np.ndarray:
        """``unsigned_calls``' image, its calls made."""
        image, calls = self.unsigned_calls(np.ascontiguousarray(x))
        for kernel, args in calls:
            kernel(*args)
        return image

    def simd_calls(self, x, out) -> list:
        """The SIMD path's calls: the batch made unsigned and channel-last where it is not
        (the site's scratch image), then per image its windows gathered into pixel rows (a 1x1
        layer with stride 1 and no padding reads the image itself), their GEMM, and the sums
        less the zero points' correction written into ``out`` in the site's layout."""
        if self.slots is not None:
            raise ValueError("a grouped convolution's SIMD GEMM is fused.qconv2d's (its sets "
                             "are requantized in registers): the plan offers it nowhere else")
        n = x.shape[0]
        image, calls = self.unsigned_calls(x)
        h, w, c = image.shape[1:]
        oh, ow = self.out_hw
        o = out.shape[3] if self.channels_last else out.shape[1]
        reads_image = self.pointwise and c == self.kp
        rows = None if reads_image else self.scratch("rows", (oh * ow, self.kp), np.uint8)
        acc = self.scratch("sums", (oh * ow, self.packed.shape[0] * self.simd.BLOCK),
                           np.int32)
        for b in range(n):
            if not reads_image:
                calls.append((self.simd.windows, (
                    image[b], self.kh, self.kw, self.sh, self.sw, self.pt, self.pl, self.dh,
                    self.dw, self.zx + self.shift, ow, rows)))
            calls.append(self.simd.gemm_call(image[b].reshape(h * w, c) if reads_image
                                             else rows, self.packed, acc))
            calls.append((self.k8.finish_rows, (acc, self.correction, out[b].reshape(-1, o)))
                         if self.channels_last else
                         (self.k8.finish_gemm, (acc, self.correction, out[b].reshape(o, -1))))
        return calls

    def portable_calls(self, x, out) -> list:
        """The portable kernels' calls on an NCHW batch x into the int32 sums out (N, O, oh,
        ow), both C-contiguous: per image the direct depthwise kernel, or per image and
        group its windows gathered (im2col, into the site's scratch) and multiplied."""
        n, c = x.shape[:2]
        _, o, oh, ow = out.shape
        if self.depthwise:
            return [(self.k8.depthwise_i8, (x[b], self.zx, self.wdw, self.mult, self.sh,
                                            self.sw, self.pt, self.pl, self.dh, self.dw, oh,
                                            ow, out[b].reshape(o, -1))) for b in range(n)]
        g = self.groups
        cg, og = c // g, o // g
        col = self.scratch("columns", (cg * self.kh * self.kw, oh * ow), x.dtype)
        calls = []
        for b in range(n):
            for gi in range(g):
                calls += [(self.k8.im2col_i8, (x[b, gi * cg:(gi + 1) * cg], self.zx, self.kh,
                                               self.kw, self.sh, self.sw, self.pt, self.pl,
                                               self.dh, self.dw, oh, ow, col)),
                          (self.k8.gemm_i8, (self.w[gi], self.zw[gi], col, np.int32(self.zx),
                                             out[b, gi * og:(gi + 1) * og].reshape(og, -1)))]
        return calls

    @property
    def path(self) -> str | None:
        """The site's kernel (``lowering``'s name: "x86.vnni", "depthwise", "portable")."""
        return self.kernel


@binding
class QClip(Binding):
    """qnn.clip: integer bounds worked out once from the constant scale and zero point."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ...ops.qnn import clip_bounds
        from ..kernels import int8 as k8
        self.k8 = k8
        self.lo, self.hi = (np.ascontiguousarray(b, np.int64) for b in clip_bounds(
            consts[1], consts[2], attrs["a_min"], attrs["a_max"], out_type.dtype))
        shape = in_types[0].shape
        axis = attrs["axis"] % len(shape) if shape else 0
        n = self.lo.size
        self.shape3 = (int(np.prod(shape[:axis], dtype=np.int64)), n, -1) if n > 1 \
            else (1, 1, -1)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if 1 not in consts or 2 not in consts or not in_types[0].shape:
            return False
        n = max(np.asarray(consts[1]).size, np.asarray(consts[2]).size)
        shape = in_types[0].shape
        return n == 1 or shape[attrs["axis"] % len(shape)] == n

    def __call__(self, ins, out):
        self.k8.clip_channels(ins[0].reshape(self.shape3), self.lo, self.hi,
                              out.reshape(self.shape3))


@binding
class QDense(_Launches):
    """qnn.dense: (N, K) int8/uint8 times (units, K) int8 weights, int32 out, zero points
    folded in: the SIMD GEMM (rows of unsigned bytes, as for convolutions) when the CPU has
    one, the weights' zero points are 0, the units a multiple of its block (or padded) and
    the batch fills the GEMM's tile of rows; else one dot product along K per output
    (``dense_i8``). A batch of fewer rows than the tile (a classifier at batch 1) left
    the tile mostly idle and read the AVX2 kernel's 16-bit panels, twice the weights' bytes:
    about twice the dot products' time."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        self.w = np.ascontiguousarray(consts[1])
        units = self.w.shape[0]
        self.zw = np.ascontiguousarray(
            np.broadcast_to(np.asarray(consts[3], np.int32).reshape(-1), (units,)))
        # the image's zero point: a constant, or computed at run time (dynamic quantization)
        self.zx = _param(consts, in_types, 2, np.int32)
        from .plan import resolve
        self.kernel = resolve(op, attrs, in_types, out_type, consts)
        self.simd, self.gemm_path = _gemm(self.kernel)
        if self.simd is not None:
            self.shift = 128 if in_types[0].dtype == "int8" else 0
            self.packed, colsum128, self.kp = self.simd.pack(self.w)
            self.column_sums = (colsum128 // 128).astype(np.int32)
            if self.zx is not None:
                self.correction = (self.column_sums * (self.shift + int(self.zx[0]))
                                   ).astype(np.int32)
        else:      # the image less its zero point, in 16 bits where the differences fit
            # (a zero point computed at run time is a dynamic 8-bit one: in [0, 255])
            wide = self.zx is not None and abs(int(self.zx[0])) > 32000
            self.shifted = np.empty((0, 0), np.int32 if wide else np.int16)   # (its type)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (1 in consts and 3 in consts and
                _param(consts, in_types, 2, np.int32) is not False and
                in_types[1].dtype == "int8" and in_types[0].dtype in ("int8", "uint8") and
                out_type.dtype == "int32" and len(in_types[0].shape) >= 2)

    def calls(self, x, out, ins) -> list:
        """The calls on the rows of ``x`` (..., K) into ``out`` (..., units): on a SIMD path
        the rows made unsigned and padded to the packed depth, their GEMM (into ``out`` where
        the blocks cover the units exactly) and the correction for the zero points
        subtracted; else the dot products (``dense_i8``). A zero point computed at run time
        makes its correction first (``offset_correction``)."""
        k = x.shape[-1]
        zx = _at_run(self.zx, ins, 2)
        x, out = x.reshape(-1, k), out.reshape(-1, out.shape[-1])
        if self.simd is None:
            return [(self.k8.dense_i8, (x, zx, self.w, self.zw, self.shifted, out))]
        calls = []
        correction = self.correction if self.zx is not None else \
            self.scratch("correction", self.column_sums.shape, np.int32)
        if self.zx is None:
            calls.append((self.k8.offset_correction, (self.column_sums, self.shift, zx,
                                                      correction)))
        rows = x
        if self.shift or k != self.kp:
            rows = self.scratch("rows", (x.shape[0], self.kp), np.uint8)
            calls.append((self.k8.shifted_rows, (x, self.shift, rows)))
        width = self.packed.shape[0] * self.simd.BLOCK
        acc = out if width == out.shape[1] else self.scratch("sums", (x.shape[0], width),
                                                             np.int32)
        return calls + [self.simd.gemm_call(rows, self.packed, acc),
                        (self.k8.finish_rows, (acc, correction, out))]

    @property
    def path(self) -> str | None:
        return self.kernel


class _OneCall(Binding):
    """A binding whose work is its one kernel call (``kernel_call``) on its operand made
    contiguous."""

    def __call__(self, ins, out):
        if not self.call_kernel([np.ascontiguousarray(ins[0]), *ins[1:]], out):
            raise ValueError(f"{type(self).__name__}: the output must be C-contiguous")


@binding
class Lut(_OneCall):
    """qnn.lut: one look-up per element, in a table, or in its channel's table (flat tables
    at channel * 256 + code), on the 8-bit codes as bytes."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        table = np.asarray(consts[1])
        self.table = np.ascontiguousarray(table.reshape(-1)).view(np.uint8)
        shape = in_types[0].shape
        self.flip = 0x80 if in_types[0].dtype == "int8" else 0
        self.channels, self.inner = 1, max(int(np.prod(shape, dtype=np.int64)), 1)
        if table.ndim == 2:
            axis = attrs["axis"] % len(shape)
            self.channels = table.shape[0]
            self.inner = int(np.prod(shape[axis + 1:], dtype=np.int64))

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return 1 in consts

    def kernel_call(self, ins, out):
        if not (ins[0].flags.c_contiguous and out.flags.c_contiguous):
            return None
        return sized(self.k8.lut, out.size), (ins[0].reshape(-1).view(np.uint8), self.flip,
                                              self.table, self.channels, self.inner,
                                              out.reshape(-1).view(np.uint8))



@binding
class Requantize(_OneCall):
    """qnn.requantize: per-tensor parameters, or per-channel input scales along axis 1."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        z1, s2, z2 = (_const_scalar(consts, i) for i in (2, 3, 4))
        s1 = np.asarray(consts[1], np.float64).reshape(-1)
        pairs = [quantize_multiplier(float(v) / float(s2)) for v in s1]
        self.m = np.array([p[0] for p in pairs], np.int64)
        self.shift = np.array([p[1] for p in pairs], np.int64)
        self.per_channel = s1.size > 1
        self.zin, self.zout = int(z1), int(z2)
        self.lo, self.hi = qrange(out_type.dtype)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if attrs["rounding"] != "UPWARD" or 1 not in consts or \
                not all(_const_scalar(consts, i) is not None for i in (2, 3, 4)):
            return False
        s1 = np.asarray(consts[1]).reshape(-1)
        return s1.size == 1 or (attrs["axis"] % len(in_types[0].shape) == 1 and
                                len(in_types[0].shape) >= 2 and
                                s1.size == in_types[0].shape[1])

    def kernel_call(self, ins, out):
        q = ins[0]
        if not (q.flags.c_contiguous and out.flags.c_contiguous):
            return None
        if self.per_channel:
            n, c = q.shape[:2]
            if q.size == n * c:          # (rows, channels): a row at a time
                return sized(self.k8.requantize_channels_last, q.size), (
                    q.reshape(n, c), self.zin, self.m, self.shift, self.zout, self.lo,
                    self.hi, out.reshape(n, c))
            return sized(self.k8.requantize_channels, q.size), (
                q.reshape(n, c, -1), self.zin, self.m, self.shift, self.zout, self.lo, self.hi,
                out.reshape(n, c, -1))
        return sized(self.k8.requantize, q.size), (q.reshape(-1), self.zin,
                                                   np.int64(self.m[0]), int(self.shift[0]),
                                                   self.zout, self.lo, self.hi,
                                                   out.reshape(-1))



@binding
class Quantize(Binding):
    """qnn.quantize with one scale (operand 1) and zero point (operand 2), constants or
    computed at run time (dynamic quantization)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        self.scale = _param(consts, in_types, 1, np.float32)
        self.zero = _param(consts, in_types, 2, np.int32)
        self.lo, self.hi = qrange(out_type.dtype)
        # 8 bits out: the float32 lanes' form (``kernels_int8.quantize_narrow``); a zero
        # point computed at run time is an 8-bit one
        self.narrow = out_type.dtype in ("int8", "uint8") and (
            self.zero is None or abs(int(self.zero[0])) < 1 << 24)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (_param(consts, in_types, 1, np.float32) is not False and
                _param(consts, in_types, 2, np.int32) is not False and
                in_types[0].dtype == "float32" and out_type.shape == in_types[0].shape)

    def kernel_call(self, ins, out):
        if not ins[0].flags.c_contiguous:       # (its flat view would be a copy)
            return None
        return self._call(ins, ins[0].reshape(-1), out.reshape(-1))

    def _call(self, ins, x, o):
        kernel = self.k8.quantize_narrow if self.narrow else self.k8.quantize
        return sized(kernel, o.size), (x, _at_run(self.scale, ins, 1),
                                       _at_run(self.zero, ins, 2), self.lo, self.hi, o)

    def __call__(self, ins, out):
        kernel, args = self._call(ins, ins[0].reshape(-1), out.reshape(-1))
        kernel(*args)


@binding
class Dequantize(_OneCall):
    """(q - z) * s with one scale, or one per channel along ``axis`` (an int32 accumulator
    read back at the scales sx * sw); the zero point is per tensor."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        shape = in_types[0].shape
        # the scales and zero point: constants, or computed at run time (dynamic
        # quantization: a dense layer's result read back at sx * sw, sx the input's)
        self.scales = np.ascontiguousarray(np.asarray(consts[1], np.float32).reshape(-1)) \
            if 1 in consts else None
        self.zero = _param(consts, in_types, 2, np.int32)
        axis = attrs["axis"] % len(shape) if shape else 0
        self.inner = max(1, int(np.prod(shape[axis + 1:], dtype=np.int64)))   # channel stride

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        if _param(consts, in_types, 2, np.int32) is False or \
                (1 not in consts and in_types[1].dtype != "float32"):
            return False
        n = np.asarray(consts[1]).size if 1 in consts else \
            int(np.prod(in_types[1].shape, dtype=np.int64))
        shape = in_types[0].shape
        return n == 1 or (bool(shape) and len(in_types[1].shape) <= 1 and
                          shape[attrs["axis"] % len(shape)] == n)

    def kernel_call(self, ins, out):
        x = ins[0]
        if not (x.flags.c_contiguous and out.flags.c_contiguous):
            return None
        scales = self.scales if self.scales is not None else ins[1].reshape(-1)
        return sized(self.k8.dequantize, out.size), (x.reshape(-1), _at_run(self.zero, ins, 2),
                                                     scales, self.inner, out.reshape(-1))



@binding
class QMul(Binding):
    """qnn.mul with per-tensor parameters, any broadcast of up to four axes (a
    squeeze-excitation's per-channel scales times the image): ``kernels_int8.qmul``, the
    reference's integer product and rounding."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        sa, za, sb, zb, so, zo = (_const_scalar(consts, i) for i in range(2, 8))
        self.za, self.zb, self.zo = np.int64(za), np.int64(zb), np.int64(zo)
        self.m, self.shift = quantize_multiplier(float(np.float64(sa) * np.float64(sb) /
                                                       np.float64(so)))
        self.lo, self.hi = (np.int64(v) for v in qrange(out_type.dtype))
        self.shape4 = (1,) * (4 - len(out_type.shape)) + tuple(out_type.shape)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (all(_const_scalar(consts, i) is not None for i in range(2, 8)) and
                isinstance(out_type, TensorType) and len(out_type.shape) <= 4 and
                all(t.dtype in ("int8", "uint8") for t in in_types[:2]))

    def kernel_call(self, ins, out):
        if not out.flags.c_contiguous:
            return None
        return sized(self.k8.qmul, out.size), (
            broadcast_view(ins[0], self.shape4), broadcast_view(ins[1], self.shape4), self.za,
            self.zb, np.int64(self.m), int(self.shift), self.zo, self.lo, self.hi,
            out.reshape(self.shape4))

    def __call__(self, ins, out):
        if not self.call_kernel(ins, out):
            raise ValueError(f"{type(self).__name__}: the output must be C-contiguous")


@binding
class QAdd(Binding):
    """qnn.add with per-tensor parameters (see eqquant.ops.qnn for the arithmetic); method
    "once" on 8-bit operands in int32 lanes (``kernels_int8.qadd_once_split``) unless a scale
    ratio is 64 or more."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        sa, za, sb, zb, so, zo = (float(_const_scalar(consts, i)) for i in range(2, 8))
        self.mb, self.shb = quantize_multiplier(sb / sa)
        self.mo, self.sho = quantize_multiplier(sa / so)
        self.za, self.zb, self.zo = int(za), int(zb), int(zo)
        self.lo, self.hi = qrange(out_type.dtype)
        self.once = attrs["method"] == "once"
        if self.once:
            from ...ops.qnn import ADD_FRACTION_BITS, add_multiplier
            self.ma, self.mb2 = add_multiplier(sa, so), add_multiplier(sb, so)
            self.bits = ADD_FRACTION_BITS
            # in int32 lanes where the multipliers and the operands' differences allow it
            # (8-bit operands, zero points in their range): the same bits, twice the lanes
            eight = all(t.dtype in ("int8", "uint8") and qrange(t.dtype)[0] <= z <=
                        qrange(t.dtype)[1] for t, z in zip(in_types[:2], (self.za, self.zb)))
            self.split = k8.split_multipliers(self.ma, self.mb2) if eight else None

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return all(_const_scalar(consts, i) is not None for i in range(2, 8))

    def _call(self, ins, out):
        """(kernel, its arguments) for these operands."""
        a, b, o = ins[0].reshape(-1), ins[1].reshape(-1), out.reshape(-1)
        if self.once and self.split is not None:
            return sized(self.k8.qadd_once_split, o.size), (
                a, np.int32(self.za), b, np.int32(self.zb), *self.split, self.zo, self.lo,
                self.hi, o)
        if self.once:
            return sized(self.k8.qadd_once, o.size), (
                a, self.za, b, self.zb, np.int64(self.ma), np.int64(self.mb2), self.bits,
                self.zo, self.lo, self.hi, o)
        return sized(self.k8.qadd, o.size), (
            a, self.za, b, self.zb, np.int64(self.mb), self.shb, np.int64(self.mo), self.sho,
            self.zo, self.lo, self.hi, o)

    def prepare(self, ins, out):
        """The kernel's entry point bound to this site's arrays."""
        return bound(*self._call(ins, out))

    def __call__(self, ins, out):
        kernel, args = self._call(ins, out)
        kernel(*args)


@binding
class FusedQConv2D(Binding):
    """fused.qconv2d: the qnn.conv2d kernel (a SIMD path, the depthwise kernel or portable
    loops) with one pass adding the bias, applying relu or clip and requantizing per channel
    to 8 bits (inside the same parallel region on the SIMD and depthwise paths)."""

    @classmethod
    def reads_channels_last(cls, attrs, in_types) -> bool:
        return QConv2D.reads_channels_last(attrs, in_types, fused=True)

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        self.channels_last = attrs["data_layout"] == "NHWC"
        o = out_type.shape[3 if self.channels_last else 1]
        acc_type = TensorType(out_type.shape, "int32")
        from .plan import resolve
        kernel = resolve(op, attrs, in_types, out_type, consts)
        self.conv = QConv2D(op, attrs, [in_types[0], in_types[1], in_types[3], in_types[4]],
                            acc_type, {1: consts[1], 2: consts[3], 3: consts[4]}, kernel)
        # (fresh writable copies, whatever the constants' shapes: a read-only view is
        # another type to Numba, and the parameters' kernels would be compiled again)
        self.bias = np.array(np.broadcast_to(np.asarray(consts[2], np.int64).reshape(-1),
                                             (o,)))
        s1 = np.broadcast_to(np.asarray(consts[7], np.float64).reshape(-1), (o,))
        s2 = float(_const_scalar(consts, 9))
        pairs = [quantize_multiplier(float(v) / s2) for v in s1]
        self.m = np.array([p[0] for p in pairs], np.int64)
        self.sh = np.array([p[1] for p in pairs], np.int64)
        self.zin, self.zout = int(_const_scalar(consts, 8)), int(_const_scalar(consts, 10))
        # the activation as a clamp of the int32 accumulator, per channel
        i32 = np.iinfo(np.int32)
        if attrs["activation"] == "clip":
            from ...ops.qnn import clip_bounds
            lo_c, hi_c = clip_bounds(consts[7], consts[8], attrs["a_min"], attrs["a_max"],
                                     "int32")
        else:     # none or relu: its clamp's lower bound (0 or -inf) in the int32 range
            lo_c = np.array([max(epilogue_bounds(attrs)[0], i32.min)], np.int64)
            hi_c = np.array([i32.max], np.int64)
        self.clamp_lo = np.array(np.broadcast_to(lo_c, (o,)), np.int64)
        self.clamp_hi = np.array(np.broadcast_to(hi_c, (o,)), np.int64)
        self.lo, self.hi = qrange(out_type.dtype)
        # the epilogue's per-channel constants, derived once (``epilogue_table``)
        c = self.conv
        args = (self.clamp_lo, self.clamp_hi, self.m, self.sh, self.zin, self.zout, self.lo,
                self.hi)
        if c.simd is not None:
            table = (self.bias, c.correction, *args)
            if c.slots is not None:     # a grouped convolution's: its sets' blocks' slots
                table = tuple(a[c.slots] if isinstance(a, np.ndarray) else a for a in table)
            self.params = c.simd.requantize_params(*table, c.kp)
            # the kernel's arguments that are the same at every call (a conv's Python around
            # its kernel was a visible share of MobileNet-v2's int8 run)
            self.fixed_args = (c.kh, c.kw, c.sh, c.sw, c.pt, c.pl, c.dh, c.dw, c.zx + c.shift,
                               *c.out_hw, c.packed, *c.more_args, self.params, self.lo,
                               self.hi)
        elif c.depthwise:
            self.params = epilogue_table.depthwise_params(c.wdw, self.bias, *args)
            self.inits = epilogue_table.depthwise_inits(c.wdw, c.zx)
            self.fixed_args = (c.zx, c.wdw, c.mult, c.sh, c.sw, c.pt, c.pl, c.dh, c.dw)
        # the portable path's int32 accumulator, NCHW (its kernels' layout; made at its
        # first run, as the other paths never need it)
        n, *spatial = out_type.shape
        self.acc_shape = (n, o, *(spatial[:2] if self.channels_last else spatial[1:]))

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        o = out_type.shape[3 if attrs["data_layout"] == "NHWC" else 1]
        if not all(i in consts for i in (1, 2, 3, 4, 7, 8, 9, 10)):
            return False
        if not QConv2D.supports(op, attrs, [in_types[0], in_types[1], in_types[3],
                                            in_types[4]], TensorType(out_type.shape, "int32"),
                                {1: consts[1], 2: consts[3], 3: consts[4]}):
            return False
        last = attrs["data_layout"] == "NHWC"
        per_channel = ((_per_channel_last if last else _per_channel)(in_types[2].shape,
                                                                      out_type.shape) and
                       int(np.prod(in_types[2].shape)) in (1, o))
        s1 = np.asarray(consts[7]).reshape(-1)
        return (per_channel and s1.size in (1, o) and attrs["rounding"] == "UPWARD" and
                (s1.size == 1 or attrs["axis"] % 4 == (3 if last else 1)) and
                all(_const_scalar(consts, i) is not None for i in (8, 9, 10)))

    def _simd_call(self, nhwc, res, residual=None):
        """(the SIMD kernel, its arguments) on a channel-last unsigned batch into res (N, oh,
        ow, O), plus ``residual`` (shaped as res) summed in (fused.qconv2d_add's)."""
        flat = res.reshape(res.shape[0], -1, res.shape[3])
        if residual is None:
            extra = (np.zeros((0, 0, 0), res.dtype), np.zeros(0, np.int32))
        else:
            extra = (residual.reshape(flat.shape), self.residual_params)
        return self.conv.conv_kernel, (nhwc, *self.fixed_args, flat, threads(), *extra)

    def _depthwise_call(self, nhwc, res):
        """(the depthwise kernel, its arguments) on a channel-last batch into res (N, oh, ow,
        O): one launch."""
        sweep = (sweep_entry("i8" if nhwc.dtype == np.int8 else "u8") if self.conv.mult == 1
                 else 0)     # (with a channel multiplier the kernel never calls the sweep)
        n, oh, ow, o = res.shape
        return self.k8.depthwise_channels_last, (
            nhwc, *self.fixed_args, oh, ow, self.params, self.inits, self.lo, self.hi,
            res.reshape(n, oh * ow, o), sweep)

    def prepare(self, ins, out):
        """The kernel call itself, bound to this site's arrays, where the image is read as it
        is (channel-last, and unsigned on a SIMD path); at an NCHW site on a SIMD path, the
        moves in and out bound with it (``bindings.nchw_calls``)."""
        c = self.conv
        if self.channels_last and c.simd is not None and (ins[0].flags.c_contiguous or
                                                          not c.shift):
            image, calls = c.unsigned_calls(ins[0])
            return in_order([bound(*call) for call in [*calls, self._simd_call(image, out)]])
        if self.channels_last and c.depthwise and ins[0].flags.c_contiguous:
            return bound(*self._depthwise_call(ins[0], out))
        if c.simd is None and not (self.channels_last and c.depthwise) and \
                ins[0].flags.c_contiguous and out.flags.c_contiguous:
            return in_order([bound(*call) for call in self._portable_calls(ins[0], out)])
        if not self.channels_last and (c.simd is not None or c.depthwise):   # (moves too)
            calls = nchw_calls(self, ins[0], out, self._simd_call if c.simd is not None else
                               self._depthwise_call,
                               self._unsigned_moves if getattr(c, "shift", 0) else None)
            if calls is not None:
                return calls
        return super().prepare(ins, out)

    def _portable_calls(self, x, out) -> list:
        """The portable path's calls (``__call__``'s): at a channel-last site the image moved
        NCHW, the sums (NCHW, the site's scratch), each image's bias, clamp and
        requantization, the result moved back."""
        from ..kernels.fp32 import transpose_call
        last, n = self.channels_last, out.shape[0]
        calls = []
        if last:
            h, w, c = x.shape[1:]
            image = self.scratch("nchw", (n, c, h, w), x.dtype)
            calls.append(transpose_call(x.reshape(n, h * w, c), image.reshape(n, c, h * w)))
            x = image
        acc = self.scratch("acc", self.acc_shape, np.int32)
        calls += self.conv.portable_calls(x, acc)
        o = acc.shape[1]
        res = self.scratch("result", acc.shape, out.dtype) if last else out
        calls += [(self.k8.bias_clamp_requantize, (
            acc[b].reshape(o, -1), self.bias, self.clamp_lo, self.clamp_hi, self.m, self.sh,
            self.zin, self.zout, self.lo, self.hi, res[b].reshape(o, -1))) for b in range(n)]
        if last:
            calls.append(transpose_call(res.reshape(n, o, -1), out.reshape(n, -1, o)))
        return calls

    def _unsigned_moves(self, x, image):
        """Each signed image (C, H, W) of ``x`` made unsigned as it moves channel-last into
        ``image`` (``to_hwc``, as ``c.nhwc``): the calls."""
        return [(self.k8.to_hwc, (x[b], self.conv.shift, image[b])) for b in range(x.shape[0])]

    def __call__(self, ins, out):
        c = self.conv
        last = self.channels_last
        n = out.shape[0]
        o = out.shape[3] if last else out.shape[1]
        if c.simd is not None:   # the batch's windows, GEMM and epilogue in one region
            oh, ow = c.out_hw
            # (channel-last: an NCHW call site moves its result out, as the layout phase's
            # layout_transform would, so that the site costs the channel-last one and moves)
            res = out if last else self.scratch("result", (n, oh, ow, o), out.dtype)
            kernel, args = self._simd_call(c.nhwc(ins[0]), res)
            kernel(*args)
            if not last:
                move_into(res, out, to_last=False)
            return
        if c.depthwise:      # the sum, bias, clamp and requantization channel by channel
            # (channel-last: an NCHW call site moves its 8-bit image in and its result out)
            x = ins[0] if last else moved(ins[0], out=self.scratch(
                "image", (n, *ins[0].shape[2:], ins[0].shape[1]), ins[0].dtype))
            res = out if last else self.scratch("result", (n, *out.shape[2:], o), out.dtype)
            kernel, args = self._depthwise_call(x, res)
            kernel(*args)
            if not last:
                move_into(res, out, to_last=False)
            return
        # the portable GEMM (grouped convolutions, weight zero points, no SIMD path) runs
        # NCHW: a channel-last call site transposes its image in and its result out
        for kernel, args in self._portable_calls(np.ascontiguousarray(ins[0]), out):
            kernel(*args)

    @property
    def path(self) -> str | None:
        return self.conv.path


@binding
class FusedQConv2DAdd(FusedQConv2D):
    """fused.qconv2d_add: fused.qconv2d's kernel, then the residual sum (qnn.add, rounding
    once). On a SIMD path at a channel-last call site each work item's finished tile is
    summed with the residual's in place, in the same parallel region, while it is in cache
    (``kernels_int8.add_tile``); elsewhere (depthwise, portable, NCHW, a scale ratio of 64 or
    more) the convolution runs as fused.qconv2d does and qnn.add's kernel follows: the same
    bits either way."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types[:11], out_type, consts)
        # the sum: qnn.add(conv, residual, sa, za, sr, zr, so, zo, method="once")
        self.add = QAdd(get_op("qnn.add"), {"method": "once"}, [out_type, *in_types[11:]],
                        out_type, {i - 10: v for i, v in consts.items() if i >= 12})
        a = self.add
        self.in_tile = (self.channels_last and self.conv.simd is not None and
                        self.conv.slots is None and
                        a.split is not None)
        if self.in_tile:
            self.residual_params = self.k8.residual_params(a.za, a.zb, a.split, a.zo)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (FusedQConv2D.supports(op, attrs, in_types[:11], out_type, consts) and
                all(_const_scalar(consts, i) is not None for i in range(12, 18)))

    def prepare(self, ins, out):
        c = self.conv
        if self.in_tile and (ins[0].flags.c_contiguous or not c.shift):
            image, calls = c.unsigned_calls(ins[0])
            return in_order([bound(*call) for call in
                             [*calls, self._simd_call(image, out, ins[11])]])
        # the convolution's launches into out, then the sum's in place (where either has
        # none, its fallback would call this binding: not taken)
        calls = [FusedQConv2D.prepare(self, ins[:11], out), self.add.prepare([out, ins[11]], out)]
        if all(launches_of(call) is not None for call in calls):
            return in_order(calls)
        return functools.partial(self, ins, out)

    def __call__(self, ins, out):
        if self.in_tile:
            kernel, args = self._simd_call(self.conv.nhwc(ins[0]), out, ins[11])
            kernel(*args)
            return
        super().__call__(ins[:11], out)        # the convolution, then the sum in place
        self.add([out, ins[11]], out)


@binding
class QAvgPool2D(Binding):
    """qnn.avg_pool2d with one scale and zero point in and out, as the op is defined:
    dequantize, the float pool, quantize, three launches through the float buffers of the
    site (the pool's float64 sums of dequantized 8-bit values are exact: the reference's
    bits)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from .fp32 import AvgPool2D
        pool_attrs = {k: v for k, v in attrs.items() if k != "out_dtype"}
        real_in = TensorType(in_types[0].shape, "float32")
        real_out = TensorType(out_type.shape, "float32")
        self.steps = (
            Dequantize(get_op("qnn.dequantize"), {"axis": -1}, [in_types[0], *in_types[1:3]],
                       real_in, {1: consts[1], 2: consts[2]}),
            AvgPool2D(get_op("nn.avg_pool2d"), pool_attrs, [real_in], real_out, {}),
            Quantize(get_op("qnn.quantize"), {"axis": -1, "out_dtype": out_type.dtype},
                     [real_out, *in_types[3:5]], out_type, {1: consts[3], 2: consts[4]}))

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return (in_types[0].dtype in ("int8", "uint8") and len(in_types[0].shape) == 4 and
                all(_const_scalar(consts, i) is not None for i in (1, 2, 3, 4)))

    def _buffers(self, out):
        return (self.scratch("real", self.in_types[0].shape, np.float32),
                self.scratch("pooled", out.shape, np.float32))

    def prepare(self, ins, out):
        real, pooled = self._buffers(out)
        deq, pool, quant = self.steps
        return in_order([deq.prepare([ins[0]], real), pool.prepare([real], pooled),
                         quant.prepare([pooled], out)])

    def __call__(self, ins, out):
        real, pooled = self._buffers(out)
        deq, pool, quant = self.steps
        deq([ins[0]], real)
        pool([real], pooled)
        quant([pooled], out)


@binding
class GlobalAverage(Binding):
    """qnn.global_avg_pool2d with one scale and zero point in and out: one pass summing each
    channel's dequantized values (``kernels_int8.global_average``: the same bits as the
    reference's float64 mean), NHWC read as it is, NCHW through a transpose of its
    (N, C, P) view."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        self.nhwc = attrs["layout"] == "NHWC"
        self.s = np.float32(_const_scalar(consts, 1))
        self.z = np.int64(_const_scalar(consts, 2))
        self.so = np.float32(_const_scalar(consts, 3))
        self.zo = np.int64(_const_scalar(consts, 4))
        self.lo, self.hi = (np.int64(v) for v in qrange(out_type.dtype))

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        shape = in_types[0].shape
        pixels = shape[1] * shape[2] if attrs["layout"] == "NHWC" else shape[2] * shape[3]
        return (attrs["layout"] in ("NCHW", "NHWC") and len(shape) == 4 and
                in_types[0].dtype in ("int8", "uint8") and pixels < 1 << 20 and
                all(_const_scalar(consts, i) is not None for i in (1, 2, 3, 4)))

    def kernel_call(self, ins, out):
        """Channel-last, the image read as it is (bound, half the time of a call through
        this binding and Numba's dispatcher); NCHW goes
        through a transpose (``__call__``)."""
        x = ins[0]
        if not (self.nhwc and x.flags.c_contiguous):
            return None
        n, c = x.shape[0], x.shape[3]
        return self.k8.global_average, (x.reshape(n, -1, c), self.s, self.z, self.so, self.zo,
                                        self.lo, self.hi, out.reshape(n, c), self._parts(c))

    @staticmethod
    def _parts(c: int) -> int:
        """the tasks a batch's image is summed in: a worker sums 128 channels at least"""
        return max(1, min(threads(), c // 128))

    def prepare(self, ins, out):
        """NCHW: the image's (C, P) planes transposed into (P, C) rows of the site's, then
        summed, two launches."""
        x = ins[0]
        if self.nhwc or not (x.flags.c_contiguous and out.flags.c_contiguous):
            return super().prepare(ins, out)
        from ..kernels.fp32 import transpose_call
        n, c = x.shape[:2]
        npc = self.scratch("pixels", (n, x[0, 0].size, c), x.dtype)
        return in_order([bound(*transpose_call(x.reshape(n, c, -1), npc)), bound(
            self.k8.global_average, (npc, self.s, self.z, self.so, self.zo, self.lo, self.hi,
                                     out.reshape(n, c), self._parts(c)))])

    def __call__(self, ins, out):
        if self.call_kernel(ins, out):
            return
        x = ins[0]
        n = x.shape[0]
        c = x.shape[3] if self.nhwc else x.shape[1]
        npc = np.ascontiguousarray(x).reshape(n, -1, c) if self.nhwc else \
            np.ascontiguousarray(x.reshape(n, c, -1).transpose(0, 2, 1))
        self.k8.global_average(npc, self.s, self.z, self.so, self.zo, self.lo, self.hi,
                               out.reshape(n, c), self._parts(c))


@binding
class QBatchMatmul(Launches):
    """qnn.batch_matmul (attention's products of two 8-bit activations), on the kernel the
    plan names (``plan.kernels_of``): "x86.avx2", two launches, b less its zero point packed
    as the 16-bit GEMM's panels (``avx2.pair_pack``), then the rows of a less its zero point
    times them (``avx2.pair_products``); or "portable", one launch of
    ``kernels.int8.qbatch_matmul`` over the output's rows, on views of the operands (a's
    rows; b's rows where it is transposed, the dot form, else its columns a row at a time),
    their stacks of matrices of one shape."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        from .plan import PAIR_ZERO_POINT, resolve
        self.kernel = resolve(op, attrs, in_types, out_type, consts) or "portable"
        # the zero points: constants, or computed at run time (dynamic quantization)
        self.za = _param(consts, in_types, 2, np.int32)
        self.zb = _param(consts, in_types, 3, np.int32)
        # the operands less their zero points in 16 bits where they fit (a zero point
        # computed at run time is an 8-bit one)
        wide = any(z is not None and abs(int(z[0])) > PAIR_ZERO_POINT
                   for z in (self.za, self.zb))
        self.like = np.empty(0, np.int32 if wide else np.int16)

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        a, b = in_types[0].shape, in_types[1].shape
        return all(_param(consts, in_types, i, np.int32) is not False for i in (2, 3)) and \
            out_type.dtype == "int32" and len(a) == len(b) >= 2 and a[:-2] == b[:-2]

    @property
    def path(self) -> str:
        return "avx2" if self.kernel == "x86.avx2" else "portable"

    def calls(self, ins, out) -> list | None:
        """The site's launches on these arrays (None where one is not C-contiguous)."""
        a, b = ins[0], ins[1]
        if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            return None
        a3 = a.reshape((-1,) + a.shape[-2:])
        b3 = b.reshape((-1,) + b.shape[-2:])
        if self.attrs["transpose_a"]:
            a3 = a3.transpose(0, 2, 1)
        # b as (B, N, K) in the dot form (transpose_b), (B, K, N) in the other
        out3 = out.reshape((-1,) + out.shape[-2:])
        depth = a3.shape[2]
        za, zb = _at_run(self.za, ins, 2), _at_run(self.zb, ins, 3)
        dot = bool(self.attrs["transpose_b"])
        if self.kernel == "x86.avx2":
            from ..kernels import avx2
            nb, _, n = out3.shape
            panels = self.scratch("panels", (nb, -(-n // avx2.BLOCK), -(-depth // 4) * 2,
                                             avx2.BLOCK, 2), np.int16)
            return [(sized(avx2.pair_pack, panels.size), (b3, zb, dot, panels)),
                    (sized(avx2.pair_products, out.size * depth), (a3, za, panels, out3))]
        return [(sized(self.k8.qbatch_matmul, out.size * depth),
                 (a3, b3, za, zb, dot, self.like, out3))]


@binding
class DynamicRange(Launches):
    """qnn.dynamic_range: the operand's finite range, computed at each run: in shares, one a
    thread (``kernels.int8.range_parts``), then put together (``range_of_parts``)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return in_types[0].dtype == "float32"

    def calls(self, ins, out) -> list | None:
        if not ins[0].flags.c_contiguous:
            return None
        parts = self.scratch("parts", (max(threads(), 1), 2), np.float32)
        return [(sized(self.k8.range_parts, ins[0].size), (ins[0].reshape(-1), parts)),
                (sized(self.k8.range_of_parts, 1), (parts, out))]


@binding
class DynamicParams(Launches):
    """qnn.dynamic_scale and qnn.dynamic_zero_point: the parameters of a range
    (qnn.dynamic_range's), computed at each run on one thread
    (``kernels.int8.params_of_range``; the site's scratch holds the one it does not give)."""

    def __init__(self, op, attrs, in_types, out_type, consts):
        super().__init__(op, attrs, in_types, out_type, consts)
        from ..kernels import int8 as k8
        self.k8 = k8
        self.symmetric = attrs["dtype"] == "int8"
        self.gives_scale = out_type.dtype == "float32"

    @classmethod
    def supports(cls, op, attrs, in_types, out_type, consts) -> bool:
        return in_types[0].dtype == "float32" and out_type.shape == ()

    def calls(self, ins, out) -> list | None:
        scale = out.reshape(1) if self.gives_scale else self.scratch("scale", (1,), np.float32)
        zero = self.scratch("zero", (1,), np.int32) if self.gives_scale else out.reshape(1)
        return [(sized(self.k8.params_of_range, 1), (ins[0], self.symmetric, scale, zero))]
