"""The inner sweep of a channel-last depthwise convolution in LLVM IR (llvmlite), compiled once
as a C function (``entry``) that the Numba kernels call by its address (``call_sweep``), for
every CPU: the IR uses LLVM's generic vectors of 16 lanes, which the backend splits into what
the CPU has (one AVX-512 register, two AVX2 registers, four SSE registers). One piece is
chosen by the CPU's features when the IR is emitted: the multiply-add of 16-bit pairs
(``madd``: the x86 instruction on AVX2 and AVX-512, LLVM's multiplies and adds elsewhere),
each form tested on its own.

One call computes one output row's pixels b0..b1, for every channel (the caller says which
kernel rows lie inside the image):

    acc[x, c] = init[c] + sum_i sum_j tap(x_in[i, x * sw + j * dw + off, c]) * w[i, j, c]

The pixels x0..x1 have all their taps inside the image along the row; the border pixels
b0..x0 and x1..b1 read, for a tap left or right of the image, the row ``zrow`` in its place
(the padding's value: the input's zero point, whose tap then adds (zx - zx) * w = 0 to the
integer sum), one pixel at a time.

taken 16 channels at a time with the sum in a register across the taps (a tail of fewer
than 16 channels one at a time). Numba's own loops kept the sums in memory and paid the
loop's set-up for every (pixel, tap): 22 cycles per 32 channels, five times what the
arithmetic needs. Two element types:

- ``float``: x and w float32, init = the bias, the sum then clamped to [lo, hi] as
  ``kernels_fp32.clamp`` does (NaN stays NaN); a multiply then an add, never fused, in
  the taps' order (i, then j): the same bits as the Numba kernel's loop.
- ``u8`` / ``i8``: x 8-bit, w int32 (weights minus their zero point), tap(x) = x, init
  = -zx * the sum of the inside kernel rows' taps (so the sum is that of (x - zx) * w, one
  subtraction a tap fewer), integer sums (exact in any order, wrapping or not) requantized
  in registers (``requantize_ir``, the bits of ``kernels_int8.requantize_rows``) and
  stored as 8 bits.

Integer taps in pairs (16 channels, a 3 x 3 kernel inside the image): two taps' pixels and
weights, as 16-bit numbers, interleaved channel by channel so that one multiply-add of
16-bit pairs (``pmaddwd``, ``madd``) gives x1 * w1 + x2 * w2 in each channel's 32-bit lane,
where a tap alone took a multiply-add and an add per 8 channels (the other half of each
pair 0). The ninth tap is paired with zeros. Exact: a pair's sum is at most
2 * 255 * ``TAP_MAX`` in magnitude.
"""
from __future__ import annotations

LANES = 16    # channels a step
PIXELS = 4    # pixels a step: each tap's weights loaded once for four sums
# taps in pairs: one pixel a step (the pairs' weights, 16-bit, take 10 AVX2 registers; 4 a
# step had LLVM spill the interleaved inputs, 1.3x the time of unpaired taps; 1, 2 and 3 a
# step: 0.73-0.81x, alike)
PAIRED_PIXELS = 1
TAP_MAX = 2**15 - 1   # the integer taps' bound: the sweep multiplies them as int16
# The output lines of the pixel WRITE_AHEAD pixels on are asked for (for writing) as a
# pixel's sums are stored. A convolution's output lies in a block of the executor's pool
# that other values held since, its lines in no cache or in the other core's: each store
# waited for its line. 16 pixels ahead was the best distance measured (8 and 32 were
# no better) on MobileNet-v2's layers in the model's run.
WRITE_AHEAD = 16
UNROLLED = 3  # a 3 x 3 kernel with its three rows inside the image: the taps unrolled
# two taps' 16 channels interleaved, channel by channel (the second tap's lanes numbered
# from 16)
INTERLEAVE = [v for c in range(16) for v in (c, c + 16)]


def madd(builder, xs, ws, form: str | None = None):
    """pmaddwd on the concatenation of the <16 x i16> vectors ``xs`` and ``ws``: a <8n x i32>
    vector (n = len(xs)), lane k = x[2k] * w[2k] + x[2k+1] * w[2k+1] (exact, short of both
    pairs being -32768 * -32768). One instruction per 256 bits on AVX2, per 512 on AVX-512
    (BW); LLVM's multiplies and adds elsewhere. The halves stay apart until the products:
    given one <32 x i16> made of two interleaved byte vectors, LLVM shuffled across the
    AVX2 register halves (three times the shuffles of two unpacks). ``form``: "avx512bw",
    "avx2" or "generic" (a test's choice; by default the best the CPU has)."""
    from llvmlite import ir
    from ..codegen.llvm_loops import cpu_has, declare
    i16, i32 = ir.IntType(16), ir.IntType(32)
    if form is None:
        form = next((f for f in ("avx512bw", "avx2") if cpu_has(f)), "generic")

    def joined(parts):
        while len(parts) > 1:
            a, b = parts[0], parts[1]
            parts = [builder.shuffle_vector(a, b, ir.Constant(
                ir.VectorType(i32, 2 * a.type.count), list(range(2 * a.type.count))))
            ] + parts[2:]
        return parts[0]

    def call(name, width, x, w):
        vt = ir.VectorType(i16, width)
        fn = declare(builder.module, name,
                     ir.FunctionType(ir.VectorType(i32, width // 2), [vt, vt]))
        return builder.call(fn, [x, w])
    if form == "avx512bw" and len(xs) % 2 == 0:
        return joined([call("llvm.x86.avx512.pmaddw.d.512", 32, joined(xs[k:k + 2]),
                            joined(ws[k:k + 2])) for k in range(0, len(xs), 2)])
    if form in ("avx2", "avx512bw"):
        return joined([call("llvm.x86.avx2.pmadd.wd", 16, x, w) for x, w in zip(xs, ws)])
    half = ir.VectorType(i32, 8)

    def lanes(v, odd):
        return builder.sext(builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                                                   ir.Constant(half, list(range(odd, 16, 2)))),
                            half)
    return joined([builder.add(builder.mul(lanes(x, 0), lanes(w, 0)),
                               builder.mul(lanes(x, 1), lanes(w, 1)))
                   for x, w in zip(xs, ws)])


def _define(kind: str):
    """``define(mod)``: the function ``eqquant_dw_<kind>(x, w, init, out, table, zrow, x0, x1,
    c_n, rows, rstride, kw, sw, dw, off, lo, hi, stride, qlo, qhi, b0, b1, win)``:

    - x: the address of the first inside kernel row's input row; rstride the elements from
      one inside kernel row's input row to the next; win the pixels of an input row;
    - w: the address of that kernel row's taps (kh, kw, C);
    - init: what each sum starts from (C values: the bias, float; for integers minus zx times
      the sum of the inside kernel rows' taps, so that a tap adds x * w: the sum of
      (x - zx) * w);
    - out: the output row (ow, C); table: the requantization's constants (integers:
      ``epilogue_table.epilogue_params``, rows ``stride`` apart);
    - zrow: C values a border pixel (b0..x0, x1..b1; none when b0 = x0 and x1 = b1) reads in
      place of a tap outside the row;
    - off: the input column of pixel 0's first tap; lo and hi: the float clamp; qlo and qhi:
      the 8-bit range; the rest int64.

    Channels outermost: for each 16 channels, their init, their epilogue's constants and
    (3 x 3 kernels inside the image) their nine taps' weights are loaded once into registers
    for the whole row of pixels."""
    def define(mod):
        from llvmlite import ir
        from ..codegen.llvm_loops import carried_loop, counted_loop, prefetch_line, splat
        from ..codegen.requantize_ir import with_epilogue
        name = f"eqquant_dw_{kind}"
        if name in mod.globals:
            return mod.globals[name]
        i64, i32, f32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
        elem = f32 if kind == "float" else ir.IntType(8)
        acc_t = f32 if kind == "float" else i32
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [
            elem.as_pointer(), acc_t.as_pointer(), acc_t.as_pointer(), elem.as_pointer(),
            ir.IntType(8).as_pointer(), elem.as_pointer()] + [i64] * 9 + [f32, f32] +
            [i64] * 6), name=name)
        fn.linkage = "linkonce_odr"
        (xp, wp, initp, outp, table, zp, x0, x1, c_n, rows, rstride, kw, sw, dw, off, lo,
         hi, stride, qlo, qhi, b0, b1, win) = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def carried(builder, count, inits, name, body):
            """accs = inits; for (v = 0; v < count; v++) accs = body(builder, v, accs)"""
            return carried_loop(fn, builder, c64(0), count, inits, body, name)

        def load(bd, ptr, at, t):
            return bd.load(bd.bitcast(bd.gep(ptr, [at]), t.as_pointer()), align=1)

        def taps_at(bd, at, vt):
            """the taps' weights of ``vt``'s lanes at ``at``; integers narrowed to 16 bits and
            widened back (their values, w - zw, lie within 16 bits), which tells LLVM that a
            product of an unsigned byte and a tap fits ``vpmaddwd`` (one int16 product a lane,
            its other half 0) instead of the slower 32-bit multiply ``vpmulld``"""
            v = load(bd, wp, at, vt)
            if kind != "u8":
                return v
            return bd.sext(bd.trunc(v, ir.VectorType(ir.IntType(16), vt.count)), vt)

        half16 = ir.VectorType(ir.IntType(16), 16)

        def interleaved(bd, a, b_):
            """two taps' 16 lanes of one type (None: zeros), interleaved channel by channel
            (``INTERLEAVE``), as two 16-lane vectors (channels 0-7, 8-15)"""
            zero = ir.Constant((a if a is not None else b_).type, None)
            a, b_ = (zero if v is None else v for v in (a, b_))
            return [bd.shuffle_vector(a, b_, ir.Constant(ir.VectorType(i32, 16),
                                                         INTERLEAVE[h:h + 16]))
                    for h in (0, 16)]

        def widened(bd, halves):
            """interleaved 8-bit inputs as 16-bit numbers: inputs are interleaved as bytes,
            then widened (on AVX2 two unpacks of 128 bits, vpunpck[lh]bw, then a widening
            each, vpmovzxbw)"""
            return [bd.zext(v, half16) if kind == "u8" else bd.sext(v, half16)
                    for v in halves]

        def w_at(bd, c0, i, j):
            return bd.add(bd.mul(bd.add(bd.mul(i, kw), j), c_n), c0)

        def strip(bd, c0, lanes, taps):
            """channels c0..c0+lanes of pixels x0..x1 (``taps``: UNROLLED when rows and kw
            are both UNROLLED, the taps unrolled and their weights held in registers; None:
            loops of rows and kw)"""
            vt = ir.VectorType(acc_t, lanes)
            et = ir.VectorType(elem, lanes)
            init = load(bd, initp, c0, vt)
            held = pairs = None
            paired = kind != "float" and taps is not None and 2 * lanes == len(INTERLEAVE)
            if paired:        # ((tap, tap or None), their weights interleaved)
                order = [(i, j) for i in range(taps) for j in range(taps)]
                order += [None] * (len(order) % 2)
                pairs = [((a, b_), interleaved(bd, *(
                    None if t is None else
                    bd.trunc(load(bd, wp, w_at(bd, c0, c64(t[0]), c64(t[1])), vt), half16)
                    for t in (a, b_)))) for a, b_ in zip(order[::2], order[1::2])]
            elif taps is not None:
                held = {(i, j): taps_at(bd, w_at(bd, c0, c64(i), c64(j)), vt)
                        for i in range(taps) for j in range(taps)}

            def pixels(bd, x, n, finish, guarded=False):
                """pixels x..x+n: n sums, each tap's weights used for all n (``guarded``: a
                tap outside the row reads zrow)"""
                base = bd.mul(bd.add(bd.mul(x, sw), off), c_n)
                step = bd.mul(sw, c_n)

                def pixel(bd, i, j, p):
                    """tap (i, j)'s input of pixel x + p (lanes channels from c0)"""
                    at = bd.add(bd.add(bd.mul(i, rstride), bd.add(base, c0)),
                                bd.mul(bd.mul(j, dw), c_n))
                    ptr = bd.gep(xp, [bd.add(at, bd.mul(step, c64(p)))])
                    if guarded:
                        col = bd.add(bd.add(bd.mul(bd.add(x, c64(p)), sw), off),
                                     bd.mul(j, dw))
                        ptr = bd.select(bd.icmp_unsigned("<", col, win), ptr,
                                        bd.gep(zp, [c0]))
                    return bd.load(bd.bitcast(ptr, et.as_pointer()), align=1)

                def tap(bd, i, j, accs):
                    wv = held[i.constant, j.constant] if held is not None else \
                        taps_at(bd, w_at(bd, c0, i, j), vt)
                    new = []
                    for p, acc in enumerate(accs):
                        xv = pixel(bd, i, j, p)
                        if kind == "float":
                            new.append(bd.fadd(acc, bd.fmul(xv, wv)))
                        else:
                            wide = bd.zext(xv, vt) if kind == "u8" else bd.sext(xv, vt)
                            new.append(bd.add(acc, bd.mul(wide, wv)))
                    return new

                def pair(bd, taps2, wv, accs):
                    return [bd.add(acc, madd(bd, widened(bd, interleaved(bd, *(
                        None if t is None else pixel(bd, c64(t[0]), c64(t[1]), p)
                        for t in taps2))), wv)) for p, acc in enumerate(accs)]
                if taps is None:
                    accs = carried(bd, rows, [init] * n, "i", lambda bd, i, accs: carried(
                        bd, kw, accs, "j", lambda bd, j, accs: tap(bd, i, j, accs)))
                elif paired:
                    accs = [init] * n
                    for taps2, wv in pairs:
                        accs = pair(bd, taps2, wv, accs)
                else:
                    accs = [init] * n
                    for i in range(taps):
                        for j in range(taps):
                            accs = tap(bd, c64(i), c64(j), accs)
                if not guarded:
                    for p in range(n):
                        at = bd.add(bd.mul(bd.add(x, c64(p + WRITE_AHEAD)), c_n), c0)
                        prefetch_line(bd, bd.gep(outp, [at]), write=True)
                for p, acc in enumerate(accs):
                    v = finish(bd, acc)
                    at = bd.add(bd.mul(bd.add(x, c64(p)), c_n), c0)
                    bd.store(v, bd.bitcast(bd.gep(outp, [at]), v.type.as_pointer()), align=1)

            def sweep(bd, finish):
                """the left border pixels one at a time, the inside ones PIXELS (taps in
                pairs: PAIRED_PIXELS) at a time then one at a time, the right border pixels
                one at a time"""
                counted_loop(fn, bd, b0, x0, 1, "xl",
                             lambda bd, x: pixels(bd, x, 1, finish, True))
                many = PAIRED_PIXELS if paired else PIXELS
                rest = counted_loop(fn, bd, x0, x1, many, "x",
                                    lambda bd, x: pixels(bd, x, many, finish))
                counted_loop(fn, bd, rest, x1, 1, "x1", lambda bd, x: pixels(bd, x, 1, finish))
                counted_loop(fn, bd, x1, b1, 1, "xr",
                             lambda bd, x: pixels(bd, x, 1, finish, True))
            if kind != "float":
                with_epilogue(bd, table, stride, c0, lanes, qlo, qhi, sweep)
                return
            lo_v, hi_v = splat(bd, lo, vt), splat(bd, hi, vt)

            def clamp(bd, acc):     # max(v, lo) then min(., hi), as Numba's clamp
                acc = bd.select(bd.fcmp_ordered(">", lo_v, acc), lo_v, acc)
                return bd.select(bd.fcmp_ordered("<", hi_v, acc), hi_v, acc)
            sweep(bd, clamp)

        def row(bd, taps):
            """every channel: 16 at a time, then one at a time"""
            last = counted_loop(fn, bd, c64(0), c_n, LANES, "c",
                                lambda bd, c0: strip(bd, c0, LANES, taps))
            counted_loop(fn, bd, last, c_n, 1, "c1", lambda bd, c0: strip(bd, c0, 1, taps))

        square = b.and_(b.icmp_signed("==", kw, c64(UNROLLED)),
                        b.icmp_signed("==", rows, c64(UNROLLED)))
        with b.if_else(square) as (known, other):
            with known:
                row(b, UNROLLED)
            with other:
                row(b, None)
        b.ret_void()
        return fn
    return define


def _intrinsic(kind: str):
    """The Numba intrinsic ``sweep(x, w, init, out, table, zrow, x0, x1, c_n, rows, rstride, kw,
    sw, dw, off, lo, hi, stride, qlo, qhi, b0, b1, win)`` calling ``eqquant_dw_<kind>``
    (addresses as integers)."""
    from numba import types
    from numba.extending import intrinsic
    from ..codegen.llvm_loops import direct_call
    codegen = direct_call(_define(kind), 6)
    sig = types.void(*([types.intp] * 15), types.float32, types.float32, *([types.intp] * 6))

    def sweep(typingctx, x, w, init, out, table, zrow, x0, x1, c_n, rows, rstride, kw, sw, dw,
              off, lo, hi, stride, qlo, qhi, b0, b1, win):
        return sig, codegen
    sweep.__name__ = f"depthwise_sweep_{kind}"
    return intrinsic(sweep)


sweep_float = _intrinsic("float")
sweep_u8 = _intrinsic("u8")
sweep_i8 = _intrinsic("i8")


# One sweep compiled once, called through its address. Emitted into a parallel kernel, the
# sweep's code went through LLVM four times, optimised and emitted (the parallel loop's
# function, its two wrappers, the kernel), and LLVM's work was most of compiling
# MobileNet-v2's int8 depthwise kernel with an empty cache.

def _entry(x, w, init, out, table, zrow, x0, x1, c_n, rows, rstride, kw, sw, dw, off, lo, hi,
           stride, qlo, qhi, b0, b1, win):
    """The sweep (``sweep``: bound to one kind's intrinsic in each of ``entry``'s copies) as
    a C function."""
    sweep(x, w, init, out, table, zrow, x0, x1, c_n, rows, rstride, kw, sw, dw, off, lo, hi,
          stride, qlo, qhi, b0, b1, win)


sweep = None   # (the placeholder ``_entry``'s copies bind)
_INTRINSICS = {"float": sweep_float, "u8": sweep_u8, "i8": sweep_i8}
_entries: dict = {}


def _signature():
    from numba import types
    return types.void(*([types.intp] * 15), types.float32, types.float32, *([types.intp] * 6))


def entry(kind: str) -> int:
    """The address of the sweep of ``kind`` ("float", "u8", "i8") compiled as a C function
    (a Numba ``cfunc`` in Numba's disk cache, compiled or loaded on first use), for
    ``call_sweep``, as a ``compiling.Address``. (Passed as an argument, not read from a
    slot as the GEMMs and the gather are, ``llvm_loops.slot``: so a program without
    depthwise layers never compiles it.)"""
    if kind not in _entries:
        from ..codegen.compiling import c_function
        from ..codegen.serial import twin
        c = c_function(twin(_entry, f"_{kind}", sweep=_INTRINSICS[kind]), _signature())
        if c is None:                       # (recorded by compiling.survey)
            return 0
        _entries[kind] = c
    from ..codegen.compiling import Address
    return Address(_entries[kind].address, function=_entries[kind])


def _call_intrinsic():
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    def call_sweep(typingctx, address, x, w, init, out, table, zrow, x0, x1, c_n, rows,
                   rstride, kw, sw, dw, off, lo, hi, stride, qlo, qhi, b0, b1, win):
        """``call_sweep(address, *sweep's arguments)``: the sweep at ``address``
        (``entry``'s) called on the arguments, addresses as integers."""
        sig = types.void(types.intp, *_signature().args)

        def codegen(context, builder, signature, args):
            i64, f32 = ir.IntType(64), ir.FloatType()
            fnty = ir.FunctionType(ir.VoidType(), [i64] * 15 + [f32, f32] + [i64] * 6)
            builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
            return context.get_dummy_value()
        return sig, codegen
    return intrinsic(call_sweep)


call_sweep = _call_intrinsic()
