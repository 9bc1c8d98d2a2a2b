"""Lowering: the kernel each call site runs on, chosen for a target and written into the program.

    mod, plan = plan_kernels(mod)          # every site given a kernel: kernel="x86.vnni16"
    print(plan_table(plan))                # per site: the kernels, their costs, why not
    resolve(op, attrs, in_types, out_type, consts)    # one site's kernel (a binding asks)

An op whose registry entry has a ``kernel`` attribute (the int8 convolutions and dense layers:
``ops.qnn.INT8_KERNELS``; the float ones: ``ops.nn.FP32_KERNELS``) names at each call
site the kernel it runs on. Every int8 kernel gives the same bits (the tests check each, bit
for bit), every float one the reference's numbers to float32 rounding; they differ in where
they apply and in what they cost. These tables are where both are said, and the only place a
kernel is chosen. The int8 kernels:

==============  =============================================  ==================================
kernel          applies to                                     relative cost
==============  =============================================  ==================================
x86.amx         groups 1 and no weight zero points (dense: a   0.1 where K is a multiple of 64
                batch of at least the tile's rows)             and at least 128 (``amx.suits``),
                                                               else 10; times the padding
x86.vnni        as x86.amx, and grouped fused convolutions     1 times the padding to 64 channels
                (a set of groups a GEMM of block-diagonal      (grouped: the set's blocks'
                weights: ``vnni.group_span``)                  channels over a group's outputs)
x86.vnni16      as x86.vnni                                    1.15 times the padding to 16
x86.avxvnni     as x86.vnni, grouped where a set's outputs     2 times the padding to 16 (1 on
                fill whole vectors of 8                        an AMD Zen 4: ``SPEED_ON_CPU``)
x86.avx2        as x86.avxvnni                                 4 times the padding to 16
x86.avx2.bytes  as x86.amx, a convolution's rows of BYTES_FROM  3.7 times the padding to 16
                bytes or more (chunk by chunk, the 16-bit
                kernel's where a chunk's high bits are many)
x86.avx2.w7     as x86.amx, a convolution whose weights are    2.5 times the padding to 16
                within +-64 (7-bit weights: ``quantize``'s
                ``weight_bits=7``; every byte on the byte
                kernel, nothing split)
depthwise       a depthwise convolution (one input channel     1
                per group) whose taps fit 16 bits
portable        every site                                     1000: the last resort
==============  =============================================  ==================================

Attention's products of two computed operands (``qnn.batch_matmul``: ``ops.qnn.PAIR_KERNELS``):
``x86.avx2``, both operands less their zero points in int16 (zero points within
``PAIR_ZERO_POINT``), b packed as the 16-bit GEMM's panels at run time (``avx2.pair_pack``),
at the 16-bit GEMM's cost times the padding of N to 16; else ``portable`` (1000). In float
(``nn.batch_matmul``: ``ops.nn.FLOAT_PAIR_KERNELS``), ``x86.avx512`` and ``x86.fma``, b
packed as the FMA GEMM's panels at run time (``fma.pack_stack``), at the float GEMMs' costs
below times the padding of N; else ``portable`` (1000: rows of FMAs, ``batch_matmul_rows``).

The float convolutions' and dense layers' kernels:

==============  =============================================  ==================================
kernel          applies to                                     relative cost
==============  =============================================  ==================================
x86.avx512      the bias constant and one per channel (or      1 times the padding to 32 channels
                none); grouped convolutions in sets of groups  (grouped: the set's blocks'
                whose outputs fill vectors of 16 (``fma.       channels over a group's outputs)
                grouped``), not depthwise ones
x86.fma         as x86.avx512, sets filling vectors of 8       1.3 times the padding to 16
blas            groups 1 (im2col and numpy's BLAS: not         100: the last resort where a GEMM
                launches, so a library cannot hold it)         runs the site
direct          grouped and depthwise convolutions             1 depthwise, else 10
==============  =============================================  ==================================

With a measured cost model (``--cost measured``, or ``auto`` once this CPU has times for the
site's kernels), the table's costs only say which kernels contend (those within
``CONTENDERS`` times the cheapest): each contender is timed at the site, as the executor runs
it (``execution/timing.py``, cached per CPU with the other kernel times), and the fastest
is taken; the plan prints the times. Where any contender has no time, the table decides.

A cost is a time per useful multiply-add relative to the 512-bit VNNI kernel on whole blocks;
the padding is the channels a kernel computes over those the layer has. The factors are
measured rankings: on an Intel Xeon (AMX, AVX512-VNNI; MobileNet-v2 int8, layer by layer) a
layer without padding either way ran 1.04-1.16x slower on vnni16 than on vnni, 96 channels
(padded to 128) 0.84x and 144 (to 192) 0.9x; on an AMD EPYC with AVX512-VNNI, 16 and 24
channels ran 1.3-1.5x faster on avxvnni than padded to 64, 96-160 channels 1.2-1.35x slower;
the tiles' sums pass through memory, which pays only on deep layers (``amx.suits``); the
AVX2 byte driver ran ResNets 0.91-0.98x the time of the 16-bit one on an AMD EPYC (Zen 3),
MobileNet-v2 level (``avx2.py``). A site
takes the cheapest kernel its target offers (``target.py``); a kernel named in the program (a
plan made earlier, or a user's pin) is kept, or refused with the site's location and the
reason (``KernelError``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ...core.nodes import Call, Constant, Expr, Function, Module, Scalar, freeze_attrs, rewrite
from ...core.types import Type
from ...errors import KernelError
from ...ops.registry import KERNEL, OpDef
from ..target import Target, current, gemm_path

SPEED = {"amx": 0.1, "vnni": 1.0, "vnni16": 1.15, "avxvnni": 2.0, "avx2": 4.0,
         "x86.avx2.bytes": 3.7, "x86.avx2.w7": 2.5}
# where a CPU ranks them otherwise (by the target's CPU, LLVM's name for it): an AMD Zen 4
# runs AVX-512 on 256-bit units, so the 256-bit VNNI kernel does as many multiply-adds a
# cycle as the 512-bit one (MobileNet-v2's layers of 192 to 1280 channels within 1.5% of
# each other, timed at the site) and pads less; the 512-bit kernel on blocks of 16 ran
# 1.1-1.3x the 512-bit one's time on whole blocks
SPEED_ON_CPU = {"znver4": {"avxvnni": 1.0, "vnni16": 1.2}}
AMX_UNSUITED = 10.0     # the tiles on a layer they do not suit
CONTENDERS = 8.0        # timed, with a measured cost model: the kernels within this factor of
                        # the table's cheapest (the portable loops, at 1000, are not timed)
DEPTHWISE = 1.0
PORTABLE = 1000.0
FP32_SPEED = {"avx512": 1.0, "fma": 1.3}    # the float GEMMs, per multiply-add
BLAS = 100.0      # (numpy's BLAS is not launches: no library saved ahead of time holds it)
DIRECT = 1.0            # the direct kernel at a depthwise convolution
GROUPED_DIRECT = 10.0   # at another grouped one: it multiplies a pixel's few channels a group
                        # at a time (RegNet's groups of 8, 2.6 on the FMA GEMM here, took
                        # 3.7-7.6 times its time on an AMD EPYC Zen 3)


@dataclass(frozen=True)
class Site:
    """What the kernel choice of one call site depends on."""

    op: str
    channels: int            # outputs per pixel (O; a dense layer's units)
    depth: int               # products summed per output (K)
    groups: int
    zero_points: bool        # the weights have zero points other than 0
    depthwise: bool          # one input channel per group, the taps within 16 bits
    rows: int | None = None  # a dense layer's batch (the GEMM's rows)
    float: bool = False      # a float convolution (``FP32_KERNELS``), else an int8 site
    bias: bool = True        # (float) the bias constant and per channel, or none
    eight_bit: bool = False  # (int8) its result requantized to 8 bits (a fused convolution)
    narrow: bool = False     # (int8) its weights within +-64 (``avx2.narrow``: 7 bits)
    pair: bool = False       # two computed operands (attention's products)

    def describe(self) -> str:
        shape = f"{self.channels} outputs x K {self.depth}"
        if self.rows is not None:
            shape += f", {self.rows} rows"
        if self.float:
            shape = "float, " + shape + ("" if self.bias else ", a bias that is not one "
                                         "constant per channel")
        if self.depthwise:
            shape += ", depthwise"
        elif self.groups > 1:
            shape += f", {self.groups} groups"
        if self.narrow and not self.float and self.rows is None:
            shape += ", 7-bit weights"
        if self.pair:
            return "two computed operands, " + shape + (
                f", zero points beyond {PAIR_ZERO_POINT}" if self.zero_points else "")
        return shape + (", weight zero points" if self.zero_points else "")


@dataclass(frozen=True)
class Option:
    kernel: str
    cost: float | None       # relative (see the table); None: it does not run this site
    why: str = ""            # why not, where it does not
    seconds: float | None = None   # its time at the site on this CPU, where it was measured


def site_of(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type], out_type: Type,
            consts: Mapping[int, Any]) -> Site | None:
    """The site of a call of ``op`` whose constant inputs are ``consts`` (index -> value), or
    None where it has no kernel to choose (the op has none, or its weights or their zero
    points are not constants: it runs on its reference semantics)."""
    if KERNEL not in op.attr_map:
        return None
    if "tensor_b" in op.inputs:
        return _pair_site(op, attrs, in_types, out_type, consts)
    if "kernel_zero_point" not in op.inputs:
        return _float_site(op, attrs, in_types, out_type, consts)
    wi, zi = op.inputs.index("weight"), op.inputs.index("kernel_zero_point")
    if wi not in consts or zi not in consts:
        return None
    w = np.asarray(consts[wi])
    zw = np.asarray(consts[zi], np.int64).reshape(-1)
    if "groups" not in attrs:          # a dense layer: (units, K)
        return Site(op.name, w.shape[0], w.shape[1], 1, bool(zw.any()), False,
                    int(np.prod(in_types[0].shape[:-1])))
    from ...ops.numerics import to_oihw
    from ..kernels.depthwise import TAP_MAX
    w = to_oihw(w, attrs["kernel_layout"])
    o, cg, kh, kw = w.shape
    groups = attrs["groups"]
    channels = in_types[0].shape[3 if attrs["data_layout"] == "NHWC" else 1]
    depthwise = cg == 1 and groups == channels and groups > 1
    if depthwise:
        taps = w.astype(np.int64).reshape(o, -1) - np.broadcast_to(zw, (o,)).reshape(o, 1)
        depthwise = int(np.abs(taps).max(initial=0)) <= TAP_MAX
    from ..kernels.avx2 import narrow
    return Site(op.name, o, cg * kh * kw, groups, bool(zw.any()), depthwise,
                eight_bit=out_type.dtype in ("int8", "uint8"), narrow=narrow(w))


PAIR_ZERO_POINT = 32000   # an operand less a zero point of this size or less fits int16


def _pair_site(op: OpDef, attrs, in_types, out_type, consts) -> Site:
    """qnn.batch_matmul's site: B x M rows of products, N outputs a row, K deep; its zero
    points (constants, or 8-bit ones computed at run time) beyond PAIR_ZERO_POINT noted as
    ``zero_points``."""
    a, out = in_types[0].shape, out_type.shape
    depth = a[-2] if attrs["transpose_a"] else a[-1]
    wide = any(abs(int(np.asarray(consts[i]).reshape(-1)[0])) > PAIR_ZERO_POINT
               for i in (2, 3) if i in consts)
    return Site(op.name, out[-1], depth, 1, wide, False,
                int(np.prod(out[:-1], dtype=np.int64)), pair=True,
                float=str(out_type.dtype).startswith("float"))


def _pair_option(kernel: str, site: Site, target: Target) -> Option:
    """A kernel at attention's products: the 16-bit GEMM, both operands less their zero
    points in int16 (b packed at run time: ``avx2.pair_pack``), or the portable loops."""
    if kernel == "portable":
        return Option(kernel, PORTABLE)
    if site.float:                 # the FMA GEMMs (b packed as their panels at run time)
        return _float_option(kernel, site, target)
    if site.zero_points:
        return Option(kernel, None, f"zero points beyond {PAIR_ZERO_POINT}: an operand less "
                                    "its zero point leaves int16")
    from ..kernels import simd_module
    simd = simd_module(gemm_path(kernel))
    padding = -(-site.channels // simd.BLOCK) * simd.BLOCK / site.channels
    return Option(kernel, speed(kernel, target) * padding)


def _float_site(op: OpDef, attrs, in_types, out_type, consts) -> Site | None:
    """A float convolution's or dense layer's site (None where its weights are not a
    constant: the binding runs BLAS or the direct kernel on them as they come)."""
    from ...ops.numerics import to_oihw
    from .fp32 import _per_channel, _per_channel_last
    wi = op.inputs.index("weight")
    if wi not in consts:
        return None
    if "groups" not in attrs:          # a dense layer: (units, K); any bias its binding takes
        units, depth = np.shape(consts[wi])
        return Site(op.name, units, depth, 1, False, False,
                    int(np.prod(in_types[0].shape[:-1])), float=True)
    o, cg, kh, kw = to_oihw(np.asarray(consts[wi]), attrs["kernel_layout"]).shape
    groups = attrs["groups"]
    last = attrs["data_layout"] == "NHWC"
    channels = in_types[0].shape[3 if last else 1]
    along = _per_channel_last if last else _per_channel
    bi = op.inputs.index("bias") if "bias" in op.inputs else None
    bias = bi is None or (bi in consts and along(tuple(np.shape(consts[bi])), out_type.shape))
    return Site(op.name, o, cg * kh * kw, groups, False,
                cg == 1 and groups == channels and groups > 1, float=True, bias=bias)


def _float_option(kernel: str, site: Site, target: Target) -> Option:
    if kernel == "direct":
        if site.groups == 1:
            return Option(kernel, None, "the direct kernel runs grouped convolutions (groups "
                                        "1 here)" if site.rows is None else "a dense layer")
        return Option(kernel, DIRECT if site.depthwise else GROUPED_DIRECT)
    if kernel == "blas":
        return Option(kernel, BLAS) if site.groups == 1 else Option(
            kernel, None, f"im2col and BLAS run groups 1 ({site.groups} groups here)")
    if not site.bias:
        return Option(kernel, None, "the FMA GEMM's epilogue adds one constant bias per "
                                    "channel")
    from ..kernels.fma import block_of, stores_set
    path = kernel[4:]
    block = block_of(path)
    if site.depthwise:
        return Option(kernel, None, "a depthwise convolution (the direct kernel's)")
    if site.groups > 1:
        # a set of groups a GEMM of block-diagonal weights (``fma.grouped``): the products
        # its blocks compute over the useful ones
        from ..kernels.gather import group_span
        per_group = site.channels // site.groups
        span = group_span(site.groups, per_group, block) * per_group
        if not stores_set(span, path):
            return Option(kernel, None, f"sets of {span} outputs end inside a vector this "
                                        "kernel stores whole")
        return Option(kernel, FP32_SPEED[path] * -(-span // block) * block / per_group)
    padding = -(-site.channels // block) * block / site.channels
    return Option(kernel, FP32_SPEED[path] * padding)


def speed(kernel: str, target: Target) -> float:
    """A SIMD GEMM kernel's cost per useful multiply-add on the target's CPU (the table)."""
    path = gemm_path(kernel)
    ranks = SPEED_ON_CPU.get(target.cpu, {})
    return ranks.get(kernel, ranks.get(path, SPEED.get(kernel, SPEED[path])))


def _gemm_option(kernel: str, site: Site, target: Target) -> Option:
    from ..kernels import simd_module
    path = gemm_path(kernel)
    simd = simd_module(path)
    if site.zero_points:
        return Option(kernel, None, "a GEMM takes weights without zero points")
    if site.groups > 1:
        return _grouped_option(kernel, site, target, simd)
    if site.rows is not None and site.rows < simd.ROWS:
        return Option(kernel, None, f"a batch of {site.rows} rows fills no tile of "
                                    f"{simd.ROWS}")
    if site.channels % simd.BLOCK and not simd.PADS:
        return Option(kernel, None, f"{site.channels} channels are no multiple of "
                                    f"{simd.BLOCK}")
    padding = -(-site.channels // simd.BLOCK) * simd.BLOCK / site.channels
    per_mac = speed(kernel, target)
    if kernel == "x86.avx2.w7" and not site.narrow:
        return Option(kernel, None, "weights beyond +-64 (7-bit weights: quantize's "
                                    "weight_bits=7)")
    if kernel in ("x86.avx2.bytes", "x86.avx2.w7") and (site.rows is not None or
                                                         not site.eight_bit):
        return Option(kernel, None, "a fused convolution's driver (its sums requantized to "
                                    "8 bits); " + ("a dense layer here" if site.rows is not None
                                                   else "int32 sums here"))
    if kernel == "x86.avx2.bytes" and -(-site.depth // 4) * 4 < simd.BYTES_FROM:
        return Option(kernel, None, f"rows of {site.depth} bytes: the byte kernel pays from "
                                    f"{simd.BYTES_FROM}")
    if path == "amx" and not simd.suits(site.depth):
        per_mac = AMX_UNSUITED
    return Option(kernel, per_mac * padding)


def _grouped_option(kernel: str, site: Site, target: Target, simd) -> Option:
    """A SIMD GEMM at a grouped convolution: a set of groups a GEMM of block-diagonal
    weights (``vnni.group_span``), on the paths that have that driver, in a fused
    convolution (the sets requantized in registers); its cost is that of the products the
    blocks compute over the useful ones."""
    if not getattr(simd, "GROUPED", False):
        return Option(kernel, None, f"this path's GEMM runs groups 1 ({site.groups} groups "
                                    "here)")
    if kernel in ("x86.avx2.bytes", "x86.avx2.w7"):
        return Option(kernel, None, "the byte driver runs groups 1 (x86.avx2 runs the sets)")
    if not site.eight_bit:
        return Option(kernel, None, "a grouped GEMM requantizes its sets in registers: "
                                    "a fused convolution's, not int32 sums")
    per_group = site.channels // site.groups
    span = simd.group_span(site.groups, per_group) * per_group
    if not simd.stores_set(span):
        return Option(kernel, None, f"sets of {span} outputs end inside a vector this "
                                    "kernel stores whole")
    padding = -(-span // simd.BLOCK) * simd.BLOCK / per_group
    return Option(kernel, speed(kernel, target) * padding)


def kernels_of(op_name: str) -> tuple[str, ...]:
    """The kernels an op's call sites may name: its ``kernel`` attribute's choices (the int8
    convolutions' and dense layers' ``INT8_KERNELS``, the float ones' ``FP32_KERNELS``,
    attention's products' ``PAIR_KERNELS``)."""
    from ...ops.registry import get_op
    return tuple(k for k in get_op(op_name).attr_map[KERNEL].kind.choices if k)


def options(site: Site, target: Target) -> list[Option]:
    """Every kernel of the site's op, in the table's order: its cost, or why it does not run
    the site."""
    out = []
    for kernel in kernels_of(site.op):
        if not target.offers(kernel):
            out.append(Option(kernel, None, f"target {target.name} does not offer it"))
        elif site.pair:
            out.append(_pair_option(kernel, site, target))
        elif site.float:
            out.append(_float_option(kernel, site, target))
        elif gemm_path(kernel):
            out.append(_gemm_option(kernel, site, target))
        elif kernel == "depthwise":
            out.append(Option(kernel, DEPTHWISE) if site.depthwise else Option(
                kernel, None, "not a depthwise convolution with 16-bit taps"
                if site.rows is None else "a dense layer"))
        else:
            out.append(Option(kernel, PORTABLE))
    return out


def contenders(opts: Sequence[Option]) -> list[Option]:
    """The options worth timing: those that run the site at most CONTENDERS times the table's
    cheapest."""
    running = [o for o in opts if o.cost is not None]
    best = min(o.cost for o in running)
    return [o for o in running if o.cost <= CONTENDERS * best]


def timed(opts: Sequence[Option], seconds: Mapping[str, float | None]) -> list[Option]:
    """``opts`` with their measured ``seconds`` (kernel -> time, None where not measured)."""
    import dataclasses
    return [dataclasses.replace(o, seconds=seconds.get(o.kernel)) for o in opts]


def choose(site: Site, target: Target, pinned: str = "",
           opts: Sequence[Option] | None = None) -> Option:
    """The option the target offers for ``site``: the fastest measured where every contender
    has a time (``timed``), else the cheapest by the table (the first in the table's order on a
    tie); or the ``pinned`` one, which must run it (``KernelError`` says why not)."""
    opts = list(opts) if opts is not None else options(site, target)
    if pinned:
        chosen = next(o for o in opts if o.kernel == pinned)
        if chosen.cost is None:
            raise KernelError(f'{site.op}: kernel="{pinned}" cannot run this site '
                              f"({site.describe()}): {chosen.why}")
        return chosen
    rivals = contenders(opts)
    if all(o.seconds is not None for o in rivals):
        return min(rivals, key=lambda o: o.seconds)
    return min((o for o in opts if o.cost is not None), key=lambda o: o.cost)


def resolve(op: OpDef, attrs: Mapping[str, Any], in_types: Sequence[Type], out_type: Type,
            consts: Mapping[int, Any], target: Target | None = None) -> str:
    """The kernel a call site runs on: its own (checked), else the target's choice; "" where
    it has none to choose (``site_of``)."""
    site = site_of(op, attrs, in_types, out_type, consts)
    if site is None:
        return attrs.get(KERNEL, "")
    return choose(site, target or current(), attrs[KERNEL]).kernel


@dataclass(frozen=True)
class Decision:
    label: str               # the value's name in the printed program (%12)
    site: Site
    chosen: Option
    pinned: bool             # the program named the kernel
    options: tuple[Option, ...]
    refitted: str = ""       # why the program's kernel was replaced at these sizes

    def lines(self) -> list[str]:
        """The decision as the kernel plan's table prints it: the kernel and why (the costs of
        the kernels that run the site, what keeps the others out)."""
        how = ("pinned in the program" if self.pinned else
               "fastest measured" if self.chosen.seconds is not None else "cheapest")
        if self.refitted:
            how += f"; {self.refitted}"
        out = [f"  {self.label} = {self.site.op} ({self.site.describe()}): "
               f"{self.chosen.kernel} ({how})"]
        runs = [f"{o.kernel} {o.cost:.3g}" + (f" ({o.seconds * 1e6:.1f} us)"
                                               if o.seconds is not None else "")
                for o in self.options if o.cost is not None]
        out.append(f"      runs it: {', '.join(runs)}")
        kept_out: dict[str, list[str]] = {}     # why -> the kernels it keeps out
        for o in self.options:
            if o.cost is None and "does not offer" not in o.why:
                kept_out.setdefault(o.why, []).append(o.kernel)
        for why, kernels in kept_out.items():
            out.append(f"      not {', '.join(kernels)}: {why}")
        return out


def plan_kernels(mod: Module, target: Target | None = None, cost: Any = None,
                 new: dict[int, Expr] | None = None,
                 refit: bool = False) -> tuple[Module, list[Decision]]:
    """``mod`` with a kernel named at every call site that has one to choose (the cheapest its
    target offers, or with a measured ``cost`` model the fastest of the contenders timed at
    the site; one already named is kept where it runs the site, else a ``KernelError``
    located at the site), and the decisions, in program order. ``new``, where given,
    receives each node's id -> the node standing for it in the planned program. ``refit``:
    a named kernel that does not run its site is replaced by the target's choice, the
    decision saying so (a program whose sizes are open, planned at the sizes it was priced
    at, run at others: ``SizedExecutor``), instead of a ``KernelError``."""
    from ...ir.printer import value_labels
    from ...ir.typecheck import infer_types
    from ...extract.cost import priced_types
    target = target or current()
    fn = mod.main
    # (a program with sizes open is planned at the sizes its cost model prices: AtSizes)
    from ...extract.cost import priced_at
    open_types = infer_types(mod)
    types = priced_types(open_types, cost)
    # (a program whose sizes are open, planned with no sizes to price: the kernels it names
    # were chosen at the sizes it was priced at, and are checked where it runs, per size)
    unpriced = types is not open_types and priced_at(cost) is None
    labels = value_labels(fn)
    decisions: list[Decision] = []

    def visit(node: Expr, children):
        if not (isinstance(node, Call) and not isinstance(node.op, Expr) and
                KERNEL in node.op.attr_map):
            return None
        consts = {i: (a.data if isinstance(a, Constant) else a.value)
                  for i, a in enumerate(node.args) if isinstance(a, (Constant, Scalar))}
        site = site_of(node.op, node.attrs, [types[id(a)] for a in node.args],
                       types[id(node)], consts)
        if site is None:
            return None
        pinned = node.attrs[KERNEL]
        label = labels.get(id(node), node.op.name)
        opts = options(site, target)

        measured = getattr(cost, "measured_seconds", None)
        if measured is not None and not pinned:
            in_types = [types[id(a)] for a in node.args]
            opts = timed(opts, {o.kernel: measured(
                node.op, {**node.attrs, KERNEL: o.kernel}, in_types, types[id(node)],
                frozenset(consts)) for o in contenders(opts)})
        refitted = ""
        try:
            chosen = choose(site, target, pinned, opts)
        except KernelError as e:
            if unpriced and not refit:
                decisions.append(Decision(label, site, next(o for o in opts
                                                            if o.kernel == pinned),
                                          True, tuple(opts), "checked per size as it runs"))
                return None
            if not refit:
                raise KernelError(f"{label} = {e.message} (a plan made for another CPU or "
                                  "target: --replan plans it again here)", node.loc) from None
            # (a program whose sizes are open, run at sizes its plan was not made for)
            refitted = next(o.why for o in opts if o.kernel == pinned)
            chosen, pinned = choose(site, target, "", opts), ""
        decisions.append(Decision(label, site, chosen, bool(pinned), tuple(opts),
                                  f"{node.attrs[KERNEL]}, the program's, does not run it at "
                                  f"these sizes ({refitted})" if refitted else ""))
        if pinned:
            return None
        attrs = freeze_attrs({**node.attrs, KERNEL: chosen.kernel})
        return Call(op=node.op, args=children, attrs=attrs, name=node.name, loc=node.loc,
                    origin=node.origin)

    body = rewrite(fn.body, visit, new)
    main = Function(params=fn.params, body=body, ret_type=fn.ret_type, attrs=fn.attrs,
                    name=fn.name, loc=fn.loc)
    return Module({**mod.functions, "main": main}, version=mod.version), decisions


def unplanned(mod: Module) -> Module:
    """``mod`` with every kernel it names forgotten (``kernel=""``): a program planned for
    another CPU, or for another target, planned again where it runs (``--replan``)."""
    def visit(node: Expr, children):
        if isinstance(node, Call) and not isinstance(node.op, Expr) and \
                node.attrs.get(KERNEL):
            return Call(op=node.op, args=children, attrs=freeze_attrs(
                {**node.attrs, KERNEL: ""}), name=node.name, loc=node.loc,
                    origin=node.origin)
        return None
    functions = {name: Function(params=fn.params, body=rewrite(fn.body, visit),
                                ret_type=fn.ret_type, attrs=fn.attrs, name=fn.name,
                                loc=fn.loc)
                 for name, fn in mod.functions.items()}
    return Module(functions, version=mod.version)


def planned(result, target: Target | None = None, cost: Any = None):
    """An ``optimizer.OptimizeResult`` with its program's kernels planned for ``target``
    (``plan_kernels``, timing the contenders with a measured ``cost`` model), the decisions
    and their table kept for ``explain()``."""
    import dataclasses
    import time
    target = target or current()
    t = time.perf_counter()
    mod, decisions = plan_kernels(result.module, target, cost)
    if hasattr(cost, "flush"):
        cost.flush()            # (the kernels it timed, kept for the next plan)
    seconds = {**result.seconds, "kernels": time.perf_counter() - t}
    return dataclasses.replace(result, module=mod, kernel_plan=decisions, seconds=seconds,
                               kernel_table=plan_table(decisions, target))


def plan_table(decisions: Sequence[Decision], target: Target | None = None) -> str:
    """The kernel plan as ``extract --explain`` prints it: per site, the kernel and why (the
    costs of the kernels that run it, what keeps the others out)."""
    lines = [(target or current()).describe(), "kernel plan (relative cost per multiply-add, "
             "and the time at the site where measured; runtime/lowering/plan.py):"]
    if not decisions:
        lines.append("  (no site chooses a kernel)")
    for d in decisions:
        lines += d.lines()
    return "\n".join(lines)
