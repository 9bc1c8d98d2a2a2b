"""The inner sweep of a channel-last depthwise convolution in LLVM IR (llvmlite), emitted into
the Numba kernels through an intrinsic, for every CPU: the IR uses LLVM's generic vectors of
16 lanes, which the backend splits into what the CPU has (one AVX-512 register, two AVX2
registers, four SSE registers), so there is no per-path variant to choose or test.

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
"""
from __future__ import annotations

LANES = 16    # channels a step
PIXELS = 4    # pixels a step: each tap's weights loaded once for four sums
TAP_MAX = 2**15 - 1   # the integer taps' bound: the sweep multiplies them as int16
UNROLLED = 3  # a 3 x 3 kernel with its three rows inside the image: the taps unrolled


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
      ``epilogue_params``, rows ``stride`` apart);
    - zrow: C values a border pixel (b0..x0, x1..b1; none when b0 = x0 and x1 = b1) reads in
      place of a tap outside the row;
    - off: the input column of pixel 0's first tap; lo and hi: the float clamp; qlo and qhi:
      the 8-bit range; the rest int64.

    Channels outermost: for each 16 channels, their init, their epilogue's constants and
    (3 x 3 kernels inside the image) their nine taps' weights are loaded once into registers
    for the whole row of pixels."""
    def define(mod):
        from llvmlite import ir
        from .llvm_loops import counted_loop, splat
        from .requantize_ir import with_epilogue
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
            pre = builder.block
            head = fn.append_basic_block(f"{name}.head")
            work = fn.append_basic_block(f"{name}.body")
            done = fn.append_basic_block(f"{name}.done")
            builder.branch(head)
            builder.position_at_end(head)
            v = builder.phi(i64)
            accs = [builder.phi(a.type) for a in inits]
            v.add_incoming(c64(0), pre)
            for acc, a in zip(accs, inits):
                acc.add_incoming(a, pre)
            builder.cbranch(builder.icmp_signed("<", v, count), work, done)
            builder.position_at_end(work)
            new = body(builder, v, accs)
            v.add_incoming(builder.add(v, c64(1)), builder.block)
            for acc, a in zip(accs, new):
                acc.add_incoming(a, builder.block)
            builder.branch(head)
            builder.position_at_end(done)
            return accs

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

        def w_at(bd, c0, i, j):
            return bd.add(bd.mul(bd.add(bd.mul(i, kw), j), c_n), c0)

        def strip(bd, c0, lanes, taps):
            """channels c0..c0+lanes of pixels x0..x1 (``taps``: UNROLLED when rows and kw
            are both UNROLLED, the taps unrolled and their weights held in registers; None:
            loops of rows and kw)"""
            vt = ir.VectorType(acc_t, lanes)
            et = ir.VectorType(elem, lanes)
            init = load(bd, initp, c0, vt)
            held = None
            if taps is not None:
                held = {(i, j): taps_at(bd, w_at(bd, c0, c64(i), c64(j)), vt)
                        for i in range(taps) for j in range(taps)}

            def pixels(bd, x, n, finish, guarded=False):
                """pixels x..x+n: n sums, each tap's weights used for all n (``guarded``: a
                tap outside the row reads zrow)"""
                base = bd.mul(bd.add(bd.mul(x, sw), off), c_n)
                step = bd.mul(sw, c_n)

                def tap(bd, i, j, accs):
                    at = bd.add(bd.add(bd.mul(i, rstride), bd.add(base, c0)),
                                bd.mul(bd.mul(j, dw), c_n))
                    wv = held[i.constant, j.constant] if held is not None else \
                        taps_at(bd, w_at(bd, c0, i, j), vt)
                    new = []
                    for p, acc in enumerate(accs):
                        ptr = bd.gep(xp, [bd.add(at, bd.mul(step, c64(p)))])
                        if guarded:
                            col = bd.add(bd.add(bd.mul(bd.add(x, c64(p)), sw), off),
                                         bd.mul(j, dw))
                            ptr = bd.select(bd.icmp_unsigned("<", col, win), ptr,
                                            bd.gep(zp, [c0]))
                        xv = bd.load(bd.bitcast(ptr, et.as_pointer()), align=1)
                        if kind == "float":
                            new.append(bd.fadd(acc, bd.fmul(xv, wv)))
                        else:
                            wide = bd.zext(xv, vt) if kind == "u8" else bd.sext(xv, vt)
                            new.append(bd.add(acc, bd.mul(wide, wv)))
                    return new
                if taps is None:
                    accs = carried(bd, rows, [init] * n, "i", lambda bd, i, accs: carried(
                        bd, kw, accs, "j", lambda bd, j, accs: tap(bd, i, j, accs)))
                else:
                    accs = [init] * n
                    for i in range(taps):
                        for j in range(taps):
                            accs = tap(bd, c64(i), c64(j), accs)
                for p, acc in enumerate(accs):
                    v = finish(bd, acc)
                    at = bd.add(bd.mul(bd.add(x, c64(p)), c_n), c0)
                    bd.store(v, bd.bitcast(bd.gep(outp, [at]), v.type.as_pointer()), align=1)

            def sweep(bd, finish):
                """the left border pixels one at a time, the inside ones PIXELS at a time
                then one at a time, the right border pixels one at a time"""
                counted_loop(fn, bd, b0, x0, 1, "xl",
                             lambda bd, x: pixels(bd, x, 1, finish, True))
                rest = counted_loop(fn, bd, x0, x1, PIXELS, "x",
                                    lambda bd, x: pixels(bd, x, PIXELS, finish))
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
    define = _define(kind)

    def sweep(typingctx, x, w, init, out, table, zrow, x0, x1, c_n, rows, rstride, kw, sw, dw,
              off, lo, hi, stride, qlo, qhi, b0, b1, win):
        sig = types.void(*([types.intp] * 15), types.float32, types.float32,
                         *([types.intp] * 6))

        def codegen(context, builder, signature, args):
            fn = define(builder.module)
            ptrs = [builder.inttoptr(a, t) for a, t in zip(args[:6], fn.ftype.args[:6])]
            builder.call(fn, ptrs + list(args[6:]))
            return context.get_dummy_value()
        return sig, codegen
    sweep.__name__ = f"depthwise_sweep_{kind}"
    return intrinsic(sweep)


sweep_float = _intrinsic("float")
sweep_u8 = _intrinsic("u8")
sweep_i8 = _intrinsic("i8")
