"""The channel-last max pool's row in LLVM IR (llvmlite), emitted into the Numba kernel
through an intrinsic, for every CPU: LLVM's generic vectors of 32 bytes, which the backend
maps to what the CPU has.

One call computes one output row, every pixel and channel (the caller says which kernel
rows lie inside the image):

    out[x, c] = max over the inside taps (i, j) of x_in[i, x * sw + j * dw + off, c]

starting from the element type's least value (padding is never a maximum), the taps in
the order kernel row, then column. The running maxima of up to 4 vectors of channels stay in
registers across the taps; ``max`` is ``kernels_fp32._max``'s two selects (NaN wins, as in
numpy's maximum; of equal values the earlier stays, so -0.0 and 0.0 keep their order): the
reference's bits, and the NCHW pool's. The Numba loops this replaces kept the maxima in
memory, and LLVM vectorised their channel loop 128 bytes a step, so that 64 channels of
bytes (ResNet's pool) ran in its remainder loops (16 bytes, then one, a step); here it
runs on whole vectors, about twice as fast or more.
"""
from __future__ import annotations

VECTOR_BYTES = 32   # a vector of channels: one AVX2 register
GROUPS = (4, 2, 1)  # vectors whose maxima a pass over the taps keeps, the largest first
KINDS = ("u8", "i8", "i32", "f32")   # the element types
KIND_OF = {"uint8": "u8", "int8": "i8", "int32": "i32", "float32": "f32"}   # numpy's names


def _define(kind: str):
    """``define(mod)``: the function ``eqquant_maxpool_<kind>(x, out, rows, rstride, c_n, w,
    ow, kw, sw, dw, off)``:

    - x: the address of the first inside kernel row's input row (nothing is read when rows
      is 0); rstride the elements from one inside kernel row's input row to the next;
    - out: the output row (ow, c_n);
    - w: the pixels of an input row; off: the input column of pixel 0's first tap;
    - the rest int64.

    For each pixel, the channels 4, 2, then 1 vector at a time (``GROUPS``), then one at a
    time; a tap whose column lies outside the row is skipped (one unsigned comparison)."""
    def define(mod):
        from llvmlite import ir
        from ..codegen.llvm_loops import carried_loop, counted_loop
        name = f"eqquant_maxpool_{kind}"
        if name in mod.globals:
            return mod.globals[name]
        i64 = ir.IntType(64)
        elem, lowest = {
            "u8": (ir.IntType(8), 0), "i8": (ir.IntType(8), -128),
            "i32": (ir.IntType(32), -(1 << 31)), "f32": (ir.FloatType(), float("-inf")),
        }[kind]
        size = 4 if kind in ("i32", "f32") else 1
        lanes = VECTOR_BYTES // size
        ptr = elem.as_pointer()
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr, ptr] + [i64] * 9),
                         name=name)
        fn.linkage = "linkonce_odr"
        xp, outp, rows, rstride, c_n, w, ow, kw, sw, dw, off = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731

        def larger(bd, acc, v):
            """``kernels_fp32._max(acc, v)``"""
            if kind == "f32":
                m = bd.select(bd.fcmp_ordered(">", v, acc), v, acc)
                return bd.select(bd.fcmp_unordered("uno", v, v), v, m)
            cmp = bd.icmp_unsigned if kind == "u8" else bd.icmp_signed
            return bd.select(cmp(">", v, acc), v, acc)

        def channels(bd, x, c0, n, group):
            """the maxima of channels c0..c0 + n * group of pixel x: ``group`` vectors of n
            lanes (n = 1: scalars), each its own running maximum"""
            vt = ir.VectorType(elem, n) if n > 1 else elem
            start = ir.Constant(vt, [lowest] * n if n > 1 else lowest)
            first = bd.add(bd.mul(x, sw), off)         # the input column of tap j = 0

            def load(bd, at, g):
                at = bd.add(at, c64(g * n))
                return bd.load(bd.bitcast(bd.gep(xp, [at]), vt.as_pointer()), align=1)

            def row(bd, i, accs):
                base = bd.add(bd.mul(i, rstride), c0)

                def tap(bd, j, accs):
                    col = bd.add(first, bd.mul(j, dw))
                    pre = bd.block
                    with bd.if_then(bd.icmp_unsigned("<", col, w), likely=True):
                        at = bd.add(base, bd.mul(col, c_n))
                        bigger = [larger(bd, acc, load(bd, at, g))
                                  for g, acc in enumerate(accs)]
                        taken = bd.block
                    merged = []
                    for acc, big in zip(accs, bigger):
                        phi = bd.phi(vt)
                        phi.add_incoming(big, taken)
                        phi.add_incoming(acc, pre)
                        merged.append(phi)
                    return merged
                return carried_loop(fn, bd, c64(0), kw, accs, tap, "j")
            accs = carried_loop(fn, bd, c64(0), rows, [start] * group, row, "i")
            for g, acc in enumerate(accs):
                at = bd.add(bd.add(bd.mul(x, c_n), c0), c64(g * n))
                bd.store(acc, bd.bitcast(bd.gep(outp, [at]), vt.as_pointer()), align=1)

        def pixel(bd, x):
            c = c64(0)
            for group in GROUPS:
                c = counted_loop(fn, bd, c, c_n, lanes * group, f"c{group}",
                                 lambda bd, c0, group=group: channels(bd, x, c0, lanes, group))
            counted_loop(fn, bd, c, c_n, 1, "c1", lambda bd, c0: channels(bd, x, c0, 1, 1))
        counted_loop(fn, b, c64(0), ow, 1, "x", pixel)
        b.ret_void()
        return fn
    return define


def _intrinsic(kind: str):
    """The Numba intrinsic ``maxpool_row(x, out, rows, rstride, c_n, w, ow, kw, sw, dw, off)``
    calling ``eqquant_maxpool_<kind>`` (x and out addresses as integers)."""
    from numba import types
    from numba.extending import intrinsic
    from ..codegen.llvm_loops import direct_call
    codegen = direct_call(_define(kind), 2)
    sig = types.void(*([types.intp] * 11))

    def maxpool_row(typingctx, x, out, rows, rstride, c_n, w, ow, kw, sw, dw, off):
        return sig, codegen
    maxpool_row.__name__ = f"maxpool_row_{kind}"
    return intrinsic(maxpool_row)


ROWS = {kind: _intrinsic(kind) for kind in KINDS}   # each element type's row intrinsic
