"""The inner sweep of a channel-last depthwise convolution in LLVM IR (llvmlite), emitted into
the Numba kernels through an intrinsic, for every CPU: the IR uses LLVM's generic vectors of
16 lanes, which the backend splits into what the CPU has (one AVX-512 register, two AVX2
registers, four SSE registers), so there is no per-path variant to choose or test.

One call computes one output row's pixels x0..x1, all of whose taps lie inside the image
along the row (the caller does the border pixels and says which kernel rows lie inside the
image), for every channel:

    acc[x, c] = init[c] + sum_i sum_j tap(x_in[i, x * sw + j * dw + off, c]) * w[i, j, c]

taken 16 channels at a time with the sum in a register across the taps (a tail of fewer
than 16 channels one at a time). Numba's own loops kept the sums in memory and paid the
loop's set-up for every (pixel, tap): 22 cycles per 32 channels, five times what the
arithmetic needs. Two element types:

- ``float``: x and w float32, init = the bias, the sum then clamped to [lo, hi] as
  ``kernels_fp32.clamp`` does (NaN stays NaN); a multiply then an add, never fused, in
  the taps' order (i, then j): the same bits as the Numba kernel's loop.
- ``u8`` / ``i8``: x 8-bit, w int32 (weights minus their zero point), init 0, tap(x) =
  x - zx, integer sums (exact in any order) requantized in registers (``requantize_ir``,
  the bits of ``kernels_int8.requantize_rows``; init: the constants' table) and stored as
  8 bits.
"""
from __future__ import annotations

LANES = 16    # channels a step
PIXELS = 4    # pixels a step: each tap's weights loaded once for four sums
UNROLLED = 3  # a 3 x 3 kernel with its three rows inside the image: the taps unrolled


def _define(kind: str):
    """``define(mod)``: the function ``eqquant_dw_<kind>(x, w, init, out, x0, x1, c_n,
    rows, rstride, kw, sw, dw, off, zx, lo, hi, stride, qlo, qhi)``: x the address of the
    first inside kernel row's input row, rstride the elements from one inside kernel row's
    input row to the next, w the address of that kernel row's taps (kh, kw, C), init the
    bias (float) or the requantization's constants (integers: ``epilogue_params``, rows
    ``stride`` apart), out the output row (ow, C), off the input column of pixel 0's first
    tap; zx the input zero point (integers); lo and hi the float clamp, qlo and qhi the 8-bit
    range; the rest int64."""
    def define(mod):
        from llvmlite import ir
        from .requantize_ir import requantize_vectors
        name = f"eqquant_dw_{kind}"
        if name in mod.globals:
            return mod.globals[name]
        i64, i32, f32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
        elem = f32 if kind == "float" else ir.IntType(8)
        acc_t = f32 if kind == "float" else i32
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [
            elem.as_pointer(), acc_t.as_pointer(), acc_t.as_pointer(), elem.as_pointer()]
            + [i64] * 10 + [f32, f32] + [i64] * 3), name=name)
        fn.linkage = "linkonce_odr"
        (xp, wp, initp, outp, x0, x1, c_n, rows, rstride, kw, sw, dw, off, zx, lo,
         hi, stride, qlo, qhi) = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def loop(builder, start, stop, step, name, body):
            """for (v = start; v + step <= stop; v += step) body(builder, v); -> final v"""
            from .llvm_loops import counted_loop
            return counted_loop(fn, builder, start, stop, step, name, body)

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

        def pixels(bd, x, n, c0, lanes, taps):
            """channels c0..c0+lanes of pixels x..x+n: n sums, each tap's weights loaded once
            for all (``taps``: UNROLLED when rows and kw are both UNROLLED, the loops over the
            kernel's taps unrolled; None: loops of rows and kw)"""
            from .llvm_loops import splat
            vt = ir.VectorType(acc_t, lanes)
            et = ir.VectorType(elem, lanes)
            if kind == "float":
                init = load(bd, initp, c0, vt)
            else:
                init = ir.Constant(vt, None)
                zx_v = splat(bd, bd.trunc(zx, i32), vt)
            base = bd.mul(bd.add(bd.mul(x, sw), off), c_n)
            step = bd.mul(sw, c_n)

            def tap_row(bd, i, accs):
                x_row = bd.add(bd.mul(i, rstride), bd.add(base, c0))
                w_row = bd.add(bd.mul(bd.mul(i, kw), c_n), c0)

                def tap(bd, j, accs):
                    at = bd.add(x_row, bd.mul(bd.mul(j, dw), c_n))
                    wv = load(bd, wp, bd.add(w_row, bd.mul(j, c_n)), vt)
                    new = []
                    for p, acc in enumerate(accs):
                        xv = load(bd, xp, bd.add(at, bd.mul(step, c64(p))), et)
                        if kind == "float":
                            new.append(bd.fadd(acc, bd.fmul(xv, wv)))
                            continue
                        wide = bd.zext(xv, vt) if kind == "u8" else bd.sext(xv, vt)
                        new.append(bd.add(acc, bd.mul(bd.sub(wide, zx_v), wv)))
                    return new
                if taps is None:
                    return carried(bd, kw, accs, "j", tap)
                for j in range(taps):
                    accs = tap(bd, c64(j), accs)
                return accs
            if taps is None:
                accs = carried(bd, rows, [init] * n, "i", tap_row)
            else:
                accs = [init] * n
                for i in range(taps):
                    accs = tap_row(bd, c64(i), accs)

            def store(bd, p, acc):
                at = bd.add(bd.mul(bd.add(x, c64(p)), c_n), c0)
                bd.store(acc, bd.bitcast(bd.gep(outp, [at]), acc.type.as_pointer()), align=1)
            if kind != "float":
                requantize_vectors(bd, bd.bitcast(initp, ir.IntType(8).as_pointer()), stride,
                                   c0, accs, qlo, qhi, store)
                return
            lo_v, hi_v = splat(bd, lo, vt), splat(bd, hi, vt)
            for p, acc in enumerate(accs):      # max(v, lo) then min(., hi), as Numba's clamp
                acc = bd.select(bd.fcmp_ordered(">", lo_v, acc), lo_v, acc)
                store(bd, p, bd.select(bd.fcmp_ordered("<", hi_v, acc), hi_v, acc))

        def channels(bd, x, n, taps):
            """every channel of pixels x..x+n: 16 at a time, then one at a time"""
            last = loop(bd, c64(0), c_n, LANES, "c",
                        lambda bd, c0: pixels(bd, x, n, c0, LANES, taps))
            loop(bd, last, c_n, 1, "c1", lambda bd, c0: pixels(bd, x, n, c0, 1, taps))

        def row(bd, taps):
            """pixels x0..x1, PIXELS at a time (then one at a time), all channels of each"""
            rest = loop(bd, x0, x1, PIXELS, "x", lambda bd, x: channels(bd, x, PIXELS, taps))
            loop(bd, rest, x1, 1, "x1", lambda bd, x: channels(bd, x, 1, taps))

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
    """The Numba intrinsic ``sweep(x, w, init, out, x0, x1, c_n, rows, rstride, kw, sw, dw,
    off, zx, lo, hi, stride, qlo, qhi)`` calling ``eqquant_dw_<kind>`` (addresses as
    integers)."""
    from numba import types
    from numba.extending import intrinsic
    define = _define(kind)

    def sweep(typingctx, x, w, init, out, x0, x1, c_n, rows, rstride, kw, sw, dw, off, zx,
              lo, hi, stride, qlo, qhi):
        sig = types.void(*([types.intp] * 14), types.float32, types.float32,
                         *([types.intp] * 3))

        def codegen(context, builder, signature, args):
            from llvmlite import ir
            fn = define(builder.module)
            ptrs = [builder.inttoptr(a, t) for a, t in zip(args[:4], fn.ftype.args[:4])]
            builder.call(fn, ptrs + list(args[4:]))
            return context.get_dummy_value()
        return sig, codegen
    sweep.__name__ = f"depthwise_sweep_{kind}"
    return intrinsic(sweep)


sweep_float = _intrinsic("float")
sweep_u8 = _intrinsic("u8")
sweep_i8 = _intrinsic("i8")
