"""The integer epilogue in LLVM IR, for kernels that finish their int32 sums in registers
(the VNNI GEMM, the depthwise sweep): ``kernels_int8.requantize_rows``'s steps on vectors
of sums, with the per-channel constants of ``epilogue_table.epilogue_params`` (a
(TABLE_ROWS, O) int64 table whose rows are named here), giving the same bits. The full
epilogue, in int64 lanes:

    v = clamp(sum + ADD, LO, HI)                      the int32 saturation and the activation
    p = (v << LEFT) * MULT + OFFSET                   the fixed-point multiply, zero point in
    r = ((p ^ 2^63) >>> TOTAL) - BACK                 rounding shift; the output zero point
    out = clamp(r, lo, hi), 8 bits

and the same narrowed, where ``epilogue_table._narrowed`` shows it gives the same bits (the
usual case: a scale below 1, a bias far from int32's ends):

    v = clamp(sum + ADD, FLO, FHI)                    int32 lanes; the output clamp moved here
    out = (v * FMULT + FOFFSET) >> TOTAL, 8 bits      one 32 x 32 -> 64-bit multiply

16 outputs take about 16 vector instructions narrowed, against about 29 in full (two int64
clamps, a shift and a 64 x 64-bit multiply more). A layer takes one or the other as a whole
(row FAST), chosen by a branch per block of channels. CPUs without AVX-512 take the narrowed
epilogue on 32-bit words (row WORDS, ``epilogue_table._words``), its clamp moved to the end:

    w = (sum * WMULT + WOFFSET) >> 32 >> WSHIFT       signed words: out - lo, not yet clamped
    out = clamp(sat8(w), WCLO, WCHI) + lo, 8 bits     sat8: two saturating packs

The 512-bit GEMMs take the same words' form on a whole block of 16, 32 or 64 channels at
once (``block_words``, rows ZMULT .. ZCHI: the same constants laid out for 16-lane
vectors): 64 sums take 4 x 8 vector instructions and 6 for the packs, the clamp and the
store, where the narrowed epilogue on 64-bit lanes took about 4 x 20, 8 of them shuffles (a
widening, two narrowings), the one port that does them the bottleneck.
"""
from __future__ import annotations

# the rows of ``epilogue_table.epilogue_params``: one per-channel constant each
ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK = range(8)
FAST, FLO, FHI, FMULT, FOFFSET = range(8, 13)
WORDS, WCLO, WCHI, WMULT, WOFFSET, WSHIFT = range(13, 19)
ZMULT, ZSHIFT, ZOFFSET, ZCLO, ZCHI = range(19, 24)
TABLE_ROWS = 24


def _const_loader(bc, table, stride, col, n: int):
    """``load(row, bits)``: the constants of channels col..col+n in ``row`` as a vector of n
    int64 (narrowed to ``bits`` when asked), emitted with builder ``bc``."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    table = bc.bitcast(table, i64.as_pointer())

    def load(row, bits=64):
        at = bc.add(bc.mul(stride, ir.Constant(i64, row)), col)
        v = bc.load(bc.bitcast(bc.gep(table, [at]), w64.as_pointer()), align=8)
        return v if bits == 64 else bc.trunc(v, ir.VectorType(ir.IntType(bits), n))
    return load


def load_constants(bc, table, stride, col, n: int) -> tuple:
    """The 8 constants (ADD .. BACK) of channels col..col+n as vectors of n int64, emitted
    with builder ``bc``: ``table`` an i8 pointer to the constants of channel 0 (row r of
    channel c at r * stride + c). Loaded once for all the rows a kernel finishes (a store of
    8-bit results between two loads of the table may alias it, as far as LLVM knows, so it
    would load them again for every row)."""
    load = _const_loader(bc, table, stride, col, n)
    return tuple(load(row) for row in (ADD, LO, HI, LEFT, MULT, OFFSET, TOTAL, BACK))


def _clamp(bc, v, low, high):
    v = bc.select(bc.icmp_signed(">", low, v), low, v)
    return bc.select(bc.icmp_signed("<", high, v), high, v)


def requantize_vector(bc, sums, constants, lo, hi):
    """The 8-bit values of ``sums`` (a vector of n int32) by the full epilogue, emitted with
    builder ``bc``: ``constants`` from ``load_constants`` for the same channels, ``lo`` and
    ``hi`` i64 values."""
    from llvmlite import ir
    from .llvm_loops import splat
    n = sums.type.count
    i8, i64 = ir.IntType(8), ir.IntType(64)
    w64 = ir.VectorType(i64, n)
    add, c_lo, c_hi, left, mult, offset, total, back = constants
    v = _clamp(bc, bc.add(bc.sext(sums, w64), add), c_lo, c_hi)
    v = bc.add(bc.mul(bc.shl(v, left), mult), offset)
    v = bc.xor(v, ir.Constant(w64, [-(1 << 63)] * n))
    v = bc.sub(bc.lshr(v, total), back)
    return bc.trunc(_clamp(bc, v, splat(bc, lo, w64), splat(bc, hi, w64)),
                    ir.VectorType(i8, n))


def _narrowed_vector(bc, sums, constants):
    """The 8-bit values of ``sums`` by the narrowed epilogue (``constants``: ADD, FLO, FHI
    as int32 vectors, FMULT, FOFFSET, TOTAL as int64 ones)."""
    from llvmlite import ir
    add, f_lo, f_hi, f_mult, f_offset, total = constants
    w64 = f_offset.type
    v = _clamp(bc, bc.add(sums, add), f_lo, f_hi)
    # both factors sign-extended int32: one vpmuldq per 64-bit lane
    p = bc.add(bc.mul(bc.sext(v, w64), f_mult), f_offset)
    return bc.trunc(bc.ashr(p, total), ir.VectorType(ir.IntType(8), w64.count))


def _narrowed_words(bc, sums, table, stride, col, lo):
    """The 8-bit values of ``sums`` (n int32 of the channels col..col+n, n a multiple of 8)
    by the narrowed epilogue on 32-bit words (``epilogue_table._words``), for CPUs without
    AVX-512, which have no arithmetic shift of 64-bit lanes and no narrowing of them to
    bytes. For each group of 8:

    - the even and the odd sums' products by WMULT, each a signed 32 x 32 -> 64-bit
      multiply (one ``vpmuldq`` for 4 lanes), plus WOFFSET: exact in int64;
    - their upper words, the 8 results' in order (one shift and one blend), shifted right by
      WSHIFT together (one ``vpsravd``, arithmetic: a floor);

    then all saturated to [0, 255] (``_saturated_bytes``: two packs), clamped to [WCLO,
    WCHI] and plus lo in 8-bit lanes (out - lo + lo wraps to out's byte, signed or not).
    The constants are loaded here, where they are used (``_words_constants``), from a table
    that no kernel writes: LLVM takes them as the instructions' memory operands, and holds
    none in a register across a kernel's loops (held, they were spilled and reloaded in the
    depthwise sweep's)."""
    from llvmlite import ir
    from .llvm_loops import cpu_has, declare, splat
    n = sums.type.count
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v8, half = ir.VectorType(i32, 8), ir.VectorType(i64, 4)
    c32 = ir.Constant(half, [32] * 4)
    groups, (c_lo, c_hi) = _words_constants(bc, table, stride, col, n)
    if cpu_has("avx2"):
        pmuldq = declare(bc.module, "llvm.x86.avx2.pmul.dq", ir.FunctionType(half, [v8, v8]))

        def products(s, mult_even, mult_odd):
            odd = bc.bitcast(bc.lshr(bc.bitcast(s, half), c32), v8)
            return bc.call(pmuldq, [s, mult_even]), bc.call(pmuldq, [odd, mult_odd])
    else:
        def products(s, mult_even, mult_odd):
            def low(v):       # the even words of v, sign-extended
                return bc.ashr(bc.shl(bc.bitcast(v, half), c32), c32)
            return bc.mul(low(s), low(mult_even)), bc.mul(
                bc.ashr(bc.bitcast(s, half), c32), low(mult_odd))
    out = []
    for g, (mult_even, mult_odd, off_even, off_odd, shift) in enumerate(groups):
        part = sums if n == 8 else bc.shuffle_vector(
            sums, ir.Constant(sums.type, ir.Undefined), ir.Constant(v8, list(range(8 * g,
                                                                                  8 * g + 8))))
        p_even, p_odd = products(part, mult_even, mult_odd)
        p_even, p_odd = bc.add(p_even, off_even), bc.add(p_odd, off_odd)
        upper = bc.bitcast(bc.lshr(p_even, c32), v8)
        both = bc.shuffle_vector(upper, bc.bitcast(p_odd, v8),
                                 ir.Constant(v8, [0, 9, 2, 11, 4, 13, 6, 15]))
        out.append(bc.ashr(both, shift))
    words = out[0] if n == 8 else bc.shuffle_vector(out[0], out[1], ir.Constant(
        ir.VectorType(i32, 16), list(range(16))))
    low = _saturated_bytes(bc, words)
    low = bc.select(bc.icmp_unsigned("<", low, c_lo), c_lo, low)
    low = bc.select(bc.icmp_unsigned(">", low, c_hi), c_hi, low)
    return bc.add(low, splat(bc, bc.trunc(lo, i8), low.type))


def _saturated_bytes(bc, words):
    """``words`` (n int32) saturated to [0, 255], as n bytes. On AVX2, two saturating packs
    (int32 -> int16 -> uint8): 8 words take an extract of their upper half and two packs of
    128 bits; 16 take two packs of 256 bits and a join of the two halves' fronts
    (``vpermd``). Elsewhere LLVM's clamp and truncation."""
    from llvmlite import ir
    from .llvm_loops import cpu_has, declare
    i8, i16, i32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
    n = words.type.count
    if n not in (8, 16) or not cpu_has("avx2"):
        words = _clamp(bc, words, ir.Constant(words.type, [0] * n),
                       ir.Constant(words.type, [255] * n))
        return bc.trunc(words, ir.VectorType(i8, n))
    mod = bc.module
    if n == 8:
        v4, v8s, v16b = ir.VectorType(i32, 4), ir.VectorType(i16, 8), ir.VectorType(i8, 16)
        pack32 = declare(mod, "llvm.x86.sse2.packssdw.128", ir.FunctionType(v8s, [v4, v4]))
        pack16 = declare(mod, "llvm.x86.sse2.packuswb.128", ir.FunctionType(v16b, [v8s, v8s]))
        halves = [bc.shuffle_vector(words, ir.Constant(words.type, ir.Undefined),
                                    ir.Constant(v4, list(range(h, h + 4)))) for h in (0, 4)]
        shorts = bc.call(pack32, halves)
        both = bc.call(pack16, [shorts, shorts])
        return bc.shuffle_vector(both, ir.Constant(v16b, ir.Undefined),
                                 ir.Constant(ir.VectorType(i32, 8), list(range(8))))
    v32, v8, v16 = ir.VectorType(i8, 32), ir.VectorType(i32, 8), ir.VectorType(i16, 16)
    perm = declare(mod, "llvm.x86.avx2.permd", ir.FunctionType(v8, [v8, v8]))
    pack32 = declare(mod, "llvm.x86.avx2.packssdw", ir.FunctionType(v16, [v8, v8]))
    pack16 = declare(mod, "llvm.x86.avx2.packuswb", ir.FunctionType(v32, [v16, v16]))
    halves = [bc.shuffle_vector(words, ir.Constant(words.type, ir.Undefined),
                                ir.Constant(v8, list(range(h, h + 8)))) for h in (0, 8)]
    shorts = bc.call(pack32, halves)      # per 128 bits: 4 of the first half, 4 of the
    fronts = bc.call(pack16, [shorts, shorts])   # second; as bytes, twice over
    both = bc.call(perm, [bc.bitcast(fronts, v8), ir.Constant(v8, [0, 4, 1, 5] + [0] * 4)])
    return bc.shuffle_vector(bc.bitcast(both, v32), ir.Constant(v32, ir.Undefined),
                             ir.Constant(ir.VectorType(i32, n), list(range(n))))


def _invariant_loader(bc, table, stride):
    """``load(row, at, vector)``: the ``vector`` at byte ``at`` of the table's row ``row``, a
    load marked invariant (no kernel writes the table; LLVM may take it as an instruction's
    memory operand)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    invariant = bc.module.add_metadata([])

    def load(row, at, vector):
        index = bc.add(bc.mul(stride, ir.Constant(i64, 8 * row)), at)
        v = bc.load(bc.bitcast(bc.gep(table, [index]), vector.as_pointer()),
                    align=vector.element.width // 8)
        v.set_metadata("invariant.load", invariant)
        return v
    return load


def block_words(bc, table, stride, col, lo):
    """``requantize(bc, sums)``: the bytes of a whole block of 16, 32 or 64 channels from
    col on, from its vectors of 16 int32 sums (a list of 1, 2 or 4), by the narrowed
    epilogue on 32-bit words (``_narrowed_words``), for AVX-512, in a layer whose row WORDS
    is set. For each vector of 16: the even lanes' and the odd lanes' products by ZMULT,
    each a signed 32 x 32 -> 64-bit multiply (``vpmuldq``: the even words of each operand,
    the odd ones shifted down first), plus ZOFFSET; their upper words in lane order (one
    shuffle of two vectors), shifted right by ZSHIFT (``vpsravd``). The vectors' words then
    saturate to bytes in two packs of 512 bits (signed to 16 bits, unsigned to 8: to [0,
    255] in all), which leave each 128-bit lane holding 4 channels of each vector: one
    ``vpermd`` puts them in order. Then clamped to [ZCLO, ZCHI] and plus lo in 8-bit lanes
    (``_narrowed_words``). The constants (``epilogue_table._lay_out_zwords``), within each
    group of 16 channels' 16 int64 columns of a row: ZMULT and ZSHIFT int32 in channel order
    (the odd channels' factors are the words from the next on), ZOFFSET int64 as the even
    channels then the odd ones, ZCLO and ZCHI the bytes of 64 channels in channel order;
    ``table`` an i8 pointer, ``stride`` the table's columns, ``col`` a multiple of 16, ``lo``
    an i64."""
    from llvmlite import ir
    from .llvm_loops import declare, splat
    i8, i16, i32, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
    v16, q8, s32 = ir.VectorType(i32, 16), ir.VectorType(i64, 8), ir.VectorType(i16, 32)
    c32 = ir.Constant(q8, [32] * 8)
    pack32 = declare(bc.module, "llvm.x86.avx512.packssdw.512",
                     ir.FunctionType(s32, [v16, v16]))
    pack16 = declare(bc.module, "llvm.x86.avx512.packuswb.512",
                     ir.FunctionType(ir.VectorType(i8, 64), [s32, s32]))
    load = _invariant_loader(bc, table, stride)
    first = bc.mul(col, ir.Constant(i64, 8))        # the block's first byte in a row

    def at(n: int):
        return bc.add(first, ir.Constant(i64, n))

    def even_words(bc, v):      # the even words of v, sign-extended to int64
        return bc.ashr(bc.shl(bc.bitcast(v, q8), c32), c32)

    def requantize(bc, sums):
        words = []
        for g, s in enumerate(sums):          # group g: 16 columns (128 bytes) on
            mult_even = load(ZMULT, at(128 * g), v16)
            mult_odd = load(ZMULT, at(128 * g + 4), v16)
            even = bc.add(bc.mul(even_words(bc, s), even_words(bc, mult_even)),
                          load(ZOFFSET, at(128 * g), q8))
            odd = bc.add(bc.mul(bc.ashr(bc.bitcast(s, q8), c32), even_words(bc, mult_odd)),
                         load(ZOFFSET, at(128 * g + 64), q8))
            upper = bc.shuffle_vector(
                bc.bitcast(bc.lshr(even, c32), v16), bc.bitcast(odd, v16),
                ir.Constant(v16, [i + 16 * (i % 2) for i in range(16)]))
            words.append(bc.ashr(upper, load(ZSHIFT, at(128 * g), v16)))
        shorts = [bc.call(pack32, [words[0], words[-1] if len(words) == 2 else words[0]])]
        if len(words) == 4:
            shorts = [bc.call(pack32, words[:2]), bc.call(pack32, words[2:])]
        packed = bc.call(pack16, [shorts[0], shorts[-1]])
        # lane L of 128 bits holds channels 4L..4L+4 of each vector in turn
        n = 4 * len(sums)
        bytes_ = ir.VectorType(i8, 4 * n)
        ordered = bc.bitcast(bc.shuffle_vector(
            bc.bitcast(packed, v16), ir.Constant(v16, ir.Undefined),
            ir.Constant(ir.VectorType(i32, n), [4 * (i % 4) + i // 4 for i in range(n)])),
            bytes_)
        c_lo, c_hi = load(ZCLO, first, bytes_), load(ZCHI, first, bytes_)
        ordered = bc.select(bc.icmp_unsigned("<", ordered, c_lo), c_lo, ordered)
        ordered = bc.select(bc.icmp_unsigned(">", ordered, c_hi), c_hi, ordered)
        return bc.add(ordered, splat(bc, bc.trunc(lo, i8), bytes_))
    return requantize


def _words_constants(bc, table, stride, col, n: int) -> tuple:
    """``_narrowed_words``'s constants for the n channels from col (n 8 or 16, col a multiple
    of 8): a tuple for each group of 8, WMULT as 8 int32 (the even channels' factors in the
    even words) and again from the next word on (the odd ones'), WOFFSET's even and odd
    channels as 4 int64 each and WSHIFT as 8 int32; and WCLO, WCHI as n bytes: plain loads
    of ``epilogue_table._lay_out_words``'s rows (``table`` an i8 pointer, ``stride`` the
    columns), marked invariant (no kernel writes the table)."""
    from llvmlite import ir
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v8, half = ir.VectorType(i32, 8), ir.VectorType(i64, 4)
    words, longs = bc.bitcast(table, i32.as_pointer()), bc.bitcast(table, i64.as_pointer())
    invariant = bc.module.add_metadata([])

    def load(base, row, at, vector, scale, extra=0):
        """at the table's column ``at`` of ``row`` (in int32 for scale 2, int64 for 1, bytes
        for 8), ``extra`` elements on"""
        index = bc.add(bc.mul(bc.add(bc.mul(stride, ir.Constant(i64, row)), at),
                              ir.Constant(i64, scale)), ir.Constant(i64, extra))
        v = bc.load(bc.bitcast(bc.gep(base, [index]), vector.as_pointer()),
                    align={8: 1, 2: 4, 1: 8}[scale])
        v.set_metadata("invariant.load", invariant)
        return v
    groups = []
    for g in range(n // 8):
        c = bc.add(col, ir.Constant(i64, 8 * g))
        groups.append((load(words, WMULT, c, v8, 2), load(words, WMULT, c, v8, 2, 1),
                       load(longs, WOFFSET, c, half, 1),
                       load(longs, WOFFSET, bc.add(c, ir.Constant(i64, 4)), half, 1),
                       load(words, WSHIFT, c, v8, 2)))
    vb = ir.VectorType(i8, n)
    return groups, (load(table, WCLO, col, vb, 8), load(table, WCHI, col, vb, 8))


def with_epilogue(bc, table, stride, col, n: int, lo, hi, body, form: str | None = None):
    """Emit ``body(bc, requantize)`` under a branch on the layer's row FAST (WORDS for the
    words' forms), with builder ``bc``: ``requantize(bc, sums)`` gives the 8-bit values of a
    vector of n int32 sums of the channels col..col+n, by the narrowed epilogue where the
    layer has it, else the full one, from constants loaded once before ``body`` (the words'
    forms load their own where they use them; ``table``: as for ``load_constants``; ``lo``,
    ``hi`` i64). ``body`` is emitted once in each branch. The narrowed epilogue's ``form``:
    "block" (``block_words``, by default on a CPU with AVX-512 for n = 16, 32 or 64, col a
    multiple of 16; a layer without WORDS then takes the "lanes" form's branches), "words"
    (``_narrowed_words``, by default on a CPU without AVX-512, for n a multiple of 8) or
    "lanes" (``_narrowed_vector``, elsewhere)."""
    from llvmlite import ir
    from .llvm_loops import cpu_has
    if form is None:
        form = "block" if n in (16, 32, 64) and cpu_has("avx512bw") else \
            "words" if n % 8 == 0 and not cpu_has("avx512f") else "lanes"
    i64 = ir.IntType(64)
    at = bc.add(bc.mul(stride, ir.Constant(i64, FAST if form == "lanes" else WORDS)), col)
    flag = bc.load(bc.gep(bc.bitcast(table, i64.as_pointer()), [at]), align=8)
    with bc.if_else(bc.icmp_signed("!=", flag, ir.Constant(i64, 0)), likely=True) as (
            narrowed, other):
        with narrowed:
            if form == "block":
                requantize = block_words(bc, table, stride, col, lo)
                body(bc, lambda bd, sums: requantize(bd, [bd.shuffle_vector(
                    sums, ir.Constant(sums.type, ir.Undefined),
                    ir.Constant(ir.VectorType(ir.IntType(32), 16), list(range(g, g + 16))))
                    for g in range(0, n, 16)] if n > 16 else [sums]))
            elif form == "words":
                body(bc, lambda bd, sums: _narrowed_words(bd, sums, table, stride, col, lo))
            else:
                load = _const_loader(bc, table, stride, col, n)
                fast = (load(ADD, 32), load(FLO, 32), load(FHI, 32),
                        bc.sext(load(FMULT, 32), load(FOFFSET).type), load(FOFFSET),
                        load(TOTAL))
                body(bc, lambda bd, sums: _narrowed_vector(bd, sums, fast))
        with other:
            if form == "block":
                with_epilogue(bc, table, stride, col, n, lo, hi, body, "lanes")
            else:
                constants = load_constants(bc, table, stride, col, n)
                body(bc, lambda bd, sums: requantize_vector(bd, sums, constants, lo, hi))
