"""The pieces the hand-written SIMD GEMMs (``vnni.py``, ``avx2.py``, ``fma.py``) share:
counted and reduction loops in LLVM IR (llvmlite), the loop over output blocks and pixel
rows, storing an accumulator grid, the GEMMs compiled once as C functions and the Numba
intrinsic that calls one, and the host CPU's features."""
from __future__ import annotations

from functools import lru_cache


def counted_loop(fn, builder, start, stop, step: int, name: str, body):
    """``for (i = start; i + step <= stop; i += step) body(builder, i)`` in function ``fn``;
    returns the final i, with the builder positioned after the loop."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    head = fn.append_basic_block(f"{name}.head")
    work = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    pre = builder.block
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(i64, name=name)
    i.add_incoming(start, pre)
    builder.cbranch(builder.icmp_signed("<=", builder.add(i, ir.Constant(i64, step)), stop),
                    work, done)
    builder.position_at_end(work)
    body(builder, i)
    i.add_incoming(builder.add(i, ir.Constant(i64, step)), builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return i


def while_loop(fn, builder, values: list, test, body, name: str = "w"):
    """``while (test(builder, values)) values = body(builder, values)``: a list of values
    (vectors, scalars) carried through the loop in registers; returns their final values,
    with the builder positioned after the loop."""
    pre = builder.block
    head = fn.append_basic_block(f"{name}.head")
    work = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    builder.branch(head)
    builder.position_at_end(head)
    carried = [builder.phi(v.type) for v in values]
    for phi, v in zip(carried, values):
        phi.add_incoming(v, pre)
    builder.cbranch(test(builder, carried), work, done)
    builder.position_at_end(work)
    new = body(builder, carried)
    for phi, v in zip(carried, new):
        phi.add_incoming(v, builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return carried


def do_while_loop(fn, builder, count, values: list, body, name: str = "s") -> list:
    """``i = 0; do values = body(builder, i, values) while (++i < count)``: at least one
    pass, the test at the bottom; returns the values' final values, with the builder
    positioned after the loop. (The AMX GEMM's loop over K: tested at its top, as
    ``carried_loop`` is, LLVM's -O3 unswitched the loops around it on whether K had a step
    at all, and its allocation of the tiles then spilled three of them.)"""
    from llvmlite import ir
    i64 = ir.IntType(64)
    pre = builder.block
    work = fn.append_basic_block(f"{name}.body")
    done = fn.append_basic_block(f"{name}.done")
    builder.branch(work)
    builder.position_at_end(work)
    i = builder.phi(i64, name=name)
    i.add_incoming(ir.Constant(i64, 0), pre)
    carried = [builder.phi(v.type) for v in values]
    for phi, v in zip(carried, values):
        phi.add_incoming(v, pre)
    new = body(builder, i, carried)
    after = builder.add(i, ir.Constant(i64, 1))
    i.add_incoming(after, builder.block)
    for phi, v in zip(carried, new):
        phi.add_incoming(v, builder.block)
    builder.cbranch(builder.icmp_signed("<", after, count), work, done)
    builder.position_at_end(done)
    return new


def carried_loop(fn, builder, start, stop, values: list, body, name: str = "c"):
    """``for (i = start; i < stop; i++) values = body(builder, i, values)`` (``while_loop``):
    returns the values' final values, with the builder positioned after the loop."""
    from llvmlite import ir
    one = ir.Constant(ir.IntType(64), 1)

    def step(bc, vs):
        # the body's code first, then the count's: the other way round, LLVM's code for the
        # AVX2 GEMM's reduction ran 1.38x as long (resnet18's convolutions, AMD EPYC Zen 3)
        new = body(bc, vs[0], vs[1:])
        return [bc.add(vs[0], one), *new]
    out = while_loop(fn, builder, [start, *values],
                     lambda bc, vs: bc.icmp_signed("<", vs[0], stop), step, name)
    return out[1:]


def reduction_loop(fn, builder, count, rows: int, cols: int, vtype, body):
    """``for (k = 0; k < count; k++) accs = body(builder, k, accs)``: a rows x cols grid of
    ``vtype`` accumulators, zero at the start, carried through the loop in registers;
    returns the final grid, with the builder positioned after the loop."""
    from llvmlite import ir

    def flat_body(bc, k, flat):
        grid = [flat[r * cols:(r + 1) * cols] for r in range(rows)]
        return [v for row in body(bc, k, grid) for v in row]
    flat = carried_loop(fn, builder, ir.Constant(ir.IntType(64), 0), count,
                        [ir.Constant(vtype, None)] * (rows * cols), flat_body, "k")
    return [flat[r * cols:(r + 1) * cols] for r in range(rows)]


def direct_call(define, pointers: int):
    """The code generator of a Numba intrinsic that calls the function ``define`` emits
    into the caller's module, its first ``pointers`` arguments integer addresses passed on
    as the function's pointer types, the rest as they are."""
    def codegen(context, builder, signature, args):
        fn = define(builder.module)
        ptrs = [builder.inttoptr(a, t) for a, t in zip(args[:pointers], fn.ftype.args)]
        builder.call(fn, ptrs + list(args[pointers:]))
        return context.get_dummy_value()
    return codegen


def gemm_intrinsic(define, element: str, extra: tuple = ()):
    """A Numba intrinsic that calls the GEMM function ``define`` (``gemm_definition``'s)
    through its slot (``load_gemms``), with the arguments every hand-written GEMM here takes:
    (A, lda, B, C, ldc, p0, p1, k, blocks), A, B and C as integer addresses, passed on as
    pointers to ``element`` ("i8" or "float"), then ``extra`` ones (``gemm_definition``'s:
    "ptr" an address passed on as a pointer to ``element``, "f32" a float32, "i64" an
    integer). The kernel that calls it holds a load and an indirect call, not the GEMM's
    code: emitted into each caller, the code went through LLVM again in every Numba
    function and parallel region that calls it, directly or not."""
    from numba import types
    from numba.extending import intrinsic

    sig = types.void(*([types.intp] * 9),
                     *[types.float32 if e == "f32" else types.intp for e in extra])
    slot(define.symbol)

    def codegen(context, builder, signature, args):
        fnty = _gemm_type(element, extra)
        ptr = fnty.args[0]
        a_, lda_, b_, c_, *rest = args[:9]
        tail = [builder.inttoptr(v, ptr) if e == "ptr" else v
                for v, e in zip(args[9:], extra)]
        call_slot(builder, define.symbol, fnty, [
            builder.inttoptr(a_, ptr), lda_, builder.inttoptr(b_, ptr),
            builder.inttoptr(c_, ptr), *rest, *tail])
        return context.get_dummy_value()

    # (Numba's intrinsics take no *args: one typing function per count of arguments)
    if not extra:
        def block(typingctx, a, lda, b, c, ldc, p0, p1, k, blocks):
            return sig, codegen
    elif len(extra) == 2:
        def block(typingctx, a, lda, b, c, ldc, p0, p1, k, blocks, e0, e1):
            return sig, codegen
    elif len(extra) == 4:
        def block(typingctx, a, lda, b, c, ldc, p0, p1, k, blocks, e0, e1, e2, e3):
            return sig, codegen
    elif len(extra) == 5:
        def block(typingctx, a, lda, b, c, ldc, p0, p1, k, blocks, e0, e1, e2, e3, e4):
            return sig, codegen
    elif len(extra) == 7:
        def block(typingctx, a, lda, b, c, ldc, p0, p1, k, blocks, e0, e1, e2, e3, e4, e5, e6):
            return sig, codegen
    else:
        raise ValueError(f"a GEMM with {len(extra)} extra arguments")
    block.__name__ = f"{define.symbol}_block"
    called = intrinsic(block)
    called.define = define
    return called


def gemm_at(element: str, extra: tuple = ()):
    """A Numba intrinsic ``call(cell, args)`` that calls the GEMM whose C function's address
    is in the slot at ``cell`` (an integer: ``slot_cell``'s) on the tuple ``args``,
    which holds what ``gemm_intrinsic``'s intrinsic takes, in its order and meaning. One
    driver then serves every GEMM of the same interface, the GEMM's address being one of its
    arguments (``vnni.conv_requantize``): compiled once, where a twin bound to each GEMM's
    slot was compiled again per GEMM, on every first start."""
    from numba import types
    from numba.extending import intrinsic

    def codegen(context, builder, signature, args):
        from llvmlite import ir
        fnty = _gemm_type(element, extra)
        ptr = fnty.args[0]
        kinds = ("ptr", "i64", "ptr", "ptr") + ("i64",) * 5 + tuple(extra)
        tuple_type = signature.args[1]
        values = []
        for j, kind in enumerate(kinds):
            value = context.cast(builder, builder.extract_value(args[1], j),
                                 tuple_type[j], types.float32 if kind == "f32" else types.intp)
            values.append(builder.inttoptr(value, ptr) if kind == "ptr" else value)
        cell = builder.inttoptr(args[0], ir.IntType(8).as_pointer().as_pointer())
        callee = builder.bitcast(builder.load(cell), fnty.as_pointer())
        builder.call(callee, values)
        return context.get_dummy_value()

    def call(typingctx, address, args):
        if not isinstance(args, types.BaseTuple) or len(args) != 9 + len(extra):
            return None
        return types.void(address, args), codegen
    call.__name__ = f"gemm_at_{element}_{len(extra)}"
    return intrinsic(call)


# C function symbol (a GEMM's, the gather's) -> the process's cell for its address
# (ctypes.c_void_p), which LLVM's symbol table knows as "eqquant_slot.<symbol>": kernels
# compiled or loaded from Numba's disk cache in any process link to this process's cell.
# A slot must be filled before any kernel calling it runs, so its C function is compiled (or
# loaded) as its module is imported, or, while the executor binds a program, once it has
# (``compiling.deferring``), before it runs anything. The depthwise sweep, which only the
# kernels the bindings call reach, takes the other way: its address is one of their
# arguments (``depthwise_simd.entry``), and each of its three kinds compiles on first use.
_SLOTS: dict = {}
_TABLES: dict = {}   # owner -> the C function that gave its GEMMs' addresses (kept alive)
# symbol -> where its slot's address came from (``fill_slot``): (a CFunc, None), the C
# function itself, or (a CFunc, j), the j-th address its table gives (``load_gemms``)
FILLED: dict = {}


def slot(symbol: str) -> str:
    """The name of ``symbol``'s slot, registered with LLVM (once) as the address of a cell
    holding 0 until it is filled (``fill_slot``; ``load_gemms`` for the GEMMs)."""
    name = "eqquant_slot." + symbol
    if symbol not in _SLOTS:
        import ctypes
        from llvmlite import binding
        cell = ctypes.c_void_p(0)
        binding.add_symbol(name, ctypes.addressof(cell))
        _SLOTS[symbol] = cell
    return name


def slot_names() -> list[str]:
    """The symbols whose slots this process has registered, sorted."""
    return sorted(_SLOTS)


def fill_slot(symbol: str, address: int, function, index: int | None = None) -> None:
    """Put the address of ``symbol``'s C function in its slot (``slot``): that of
    ``function`` (a CFunc), or where ``index`` is given, the index-th address its table
    gives (``load_gemms``), as ``FILLED`` keeps."""
    slot(symbol)
    _SLOTS[symbol].value = address
    FILLED[symbol] = (function, index)


def table_length(function) -> int:
    """How many addresses the GEMM table ``function`` (a CFunc ``load_gemms`` made) writes
    when called: all of its module's GEMMs, whichever of them a program uses (a caller must
    give it room for every one)."""
    return 1 + max(index for source, index in FILLED.values()
                   if source is function and index is not None)


def slot_cell(symbol: str) -> int:
    """The address of ``symbol``'s slot itself, the cell holding its C function's address
    (known before the function is loaded, which ``compiling.deferring`` may put off)."""
    import ctypes
    from .compiling import Address
    slot(symbol)
    return Address(ctypes.addressof(_SLOTS[symbol]), slot=symbol)


def call_slot(builder, symbol: str, fnty, args):
    """Emit a call of the C function in ``symbol``'s slot (``slot``), of LLVM type ``fnty``,
    on ``args``: a load of the slot and an indirect call."""
    from llvmlite import ir
    name = slot(symbol)
    cell = builder.module.globals.get(name)
    if cell is None:
        cell = ir.GlobalVariable(builder.module, ir.IntType(8).as_pointer(), name)
    return builder.call(builder.bitcast(builder.load(cell), fnty.as_pointer()), args)


def _gemm_type(element: str, extra: tuple):
    """The LLVM type of ``void name(A, lda, B, C, ldc, p0, p1, k, blocks, *extra)``."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    ptr = (ir.FloatType() if element == "float" else ir.IntType(8)).as_pointer()
    more = [ptr if e == "ptr" else ir.FloatType() if e == "f32" else i64 for e in extra]
    return ir.FunctionType(ir.VoidType(), [ptr, i64, ptr, ptr] + [i64] * 5 + more)


def _addresses(out):
    """Store the GEMMs' addresses at ``out`` (``store``: bound in each of ``load_gemms``'s
    copies to an intrinsic that defines them in this C function's module)."""
    store(out)


store = None   # (the placeholder ``_addresses``'s copies bind)


def load_gemms(owner: str, defines: list) -> None:
    """Compile the GEMMs ``defines`` (``gemm_definition``'s) once, as one module of C
    functions (a Numba ``cfunc`` in Numba's disk cache, under ``owner``'s name: compiled
    with an empty cache, else loaded), and put their addresses in their slots, which every
    kernel calling them reads. Called by each SIMD module as it is imported, for the GEMMs
    the CPU runs: at once, or, while the executor binds a program
    (``compiling.deferring``), once it has bound it, so that a first start compiles them
    beside its kernels. A kernel calling a GEMM whose slot was never filled would jump to
    0."""
    from numba import types
    from numba.extending import intrinsic
    from .compiling import c_function, defer
    from .serial import twin

    def fill(typingctx, out):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            i64 = ir.IntType(64)
            to = builder.inttoptr(args[0], i64.as_pointer())
            for j, define in enumerate(defines):
                builder.store(builder.ptrtoint(define(builder.module), i64),
                              builder.gep(to, [ir.Constant(i64, j)]))
            return context.get_dummy_value()
        return types.void(types.intp), codegen
    fill.__name__ = f"fill_{owner}"

    def load() -> bool:
        import ctypes
        if owner in _TABLES:
            return True
        table = c_function(twin(_addresses, f"_{owner}", store=intrinsic(fill)),
                           types.void(types.intp))
        if table is None:                   # (recorded by compiling.survey)
            return False
        out = (ctypes.c_int64 * len(defines))()
        table.ctypes(ctypes.addressof(out))
        for j, (define, address) in enumerate(zip(defines, out)):
            fill_slot(define.symbol, address, table, j)
        _TABLES[owner] = table
        return True
    for define in defines:      # (the slots exist at once: a cached kernel links to them)
        slot(define.symbol)
    defer(f"gemms {owner}", load)


MOVES = (1, 2, 4, 8, 16, 32, 64)   # the sizes of move ``copy_runs`` copies a run with


def copy_runs_intrinsic():
    """A Numba intrinsic ``copy_runs(dst, src, nbytes, count, dst_step, src_step)``
    (addresses and sizes as integers): ``count`` runs of nbytes, dst_step and src_step bytes
    apart, each copied as two moves of the least of MOVES bytes two of which cover it (the
    second ending where the run ends: they overlap, nothing past the run is read or
    written), or as one memcpy past 128 bytes. The move's size is chosen once, not run by
    run, and each size has a loop of its own, its moves memcpys of constant size, which LLVM
    makes a vector move or two: a loop of Numba's copying a few dozen bytes (a 7 x 7 stem's
    kernel row of 3 channels) was vectorised for 64 bytes a step and ran in its scalar
    remainder; the choice in the loop made MobileNet-v2's 3 x 3 stem's gather 1.3x as long;
    one loop with the size a variable made every move a memcpy call (about twice as long).
    Emitted as LLVM IR: written as Numba functions inlined into one another, the eight
    loops made most of the gather's compiling with an empty cache (Numba copies a
    function's IR for each place it inlines it)."""
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    def define(mod):
        from llvmlite import ir
        name = "eqquant_copy_runs"
        if name in mod.globals:
            return mod.globals[name]
        i64, i8p = ir.IntType(64), ir.IntType(8).as_pointer()
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64] * 6), name=name)
        fn.linkage = "internal"
        dst, src, nbytes, count, dst_step, src_step = fn.args
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
        move = c64(0)
        for m in reversed(MOVES):      # the least m with m <= nbytes <= 2m
            fits = builder.and_(builder.icmp_signed("<=", c64(m), nbytes),
                                builder.icmp_signed("<=", nbytes, c64(2 * m)))
            move = builder.select(fits, c64(m), move)
        done = fn.append_basic_block("done")
        switch = builder.switch(move, done)
        for m in (*MOVES, 0):
            block = fn.append_basic_block(f"move{m}")
            if m:
                switch.add_case(c64(m), block)
            else:
                switch.default = block
            builder.position_at_end(block)

            def run(bc, i, m=m):
                d = bc.add(dst, bc.mul(i, dst_step))
                s_ = bc.add(src, bc.mul(i, src_step))

                def moved(at_d, at_s, size):
                    cgutils.raw_memcpy(bc, bc.inttoptr(at_d, i8p), bc.inttoptr(at_s, i8p),
                                       size, 1)
                if m:
                    moved(d, s_, c64(m))
                    tail = bc.sub(nbytes, c64(m))
                    moved(bc.add(d, tail), bc.add(s_, tail), c64(m))
                else:
                    moved(d, s_, nbytes)
            counted_loop(fn, builder, c64(0), count, 1, f"r{m}", run)
            builder.branch(done)
        builder.position_at_end(done)
        builder.ret_void()
        return fn

    def copy_runs(typingctx, dst, src, nbytes, count, dst_step, src_step):
        def codegen(context, builder, signature, args):
            values = [context.cast(builder, v, t, types.intp)
                      for v, t in zip(args, signature.args)]
            builder.call(define(builder.module), values)
            return context.get_dummy_value()
        return types.void(dst, src, nbytes, count, dst_step, src_step), codegen
    return intrinsic(copy_runs)


def fetch_add_intrinsic(ordering: str = "monotonic"):
    """A Numba intrinsic ``fetch_add(address, n)``: the int64 at ``address`` (an integer)
    increased by n atomically, its value before returned (LLVM's ``atomicrmw add``, by
    default monotonic: the counters of ``gather.next_item`` only hand out indices, each
    once, and the parallel region's end orders what the work items wrote; ``gather.release``
    counts the finished threads with "acq_rel", so that the last sees the others' last
    takes before it resets the counters)."""
    from numba import types
    from numba.extending import intrinsic

    def fetch_add(typingctx, address, n):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            at, v = args
            ptr = builder.inttoptr(at, ir.IntType(64).as_pointer())
            return builder.atomic_rmw("add", ptr, v, ordering)
        return types.int64(types.intp, types.int64), codegen
    fetch_add.__name__ = f"fetch_add_{ordering}"
    return intrinsic(fetch_add)


def blocks_of_rows(fn, builder, p0, p1, blocks, rows: int, micro) -> None:
    """For each output block ob < ``blocks``: ``micro(builder, p, ob, rows)`` for pixels
    p0..p1 ``rows`` at a time, then ``micro(builder, p, ob, 1)`` for the rest."""
    from llvmlite import ir

    def per_block(bb, ob):
        last = counted_loop(fn, bb, p0, p1, rows, "pg", lambda bc, p: micro(bc, p, ob, rows))
        counted_loop(fn, bb, last, p1, 1, "p1", lambda bc, p: micro(bc, p, ob, 1))

    counted_loop(fn, builder, ir.Constant(ir.IntType(64), 0), blocks, 1, "ob", per_block)


def panel_gemm(fn, builder, args, *, rows: int, block: int, panel: int, weights: tuple,
               accumulators: tuple, row_step, out_lane=None, finish=None,
               correct=None, k_block: int = 0, resume=None, pause=None,
               prefetch: int = 0) -> None:
    """The loop nest of every GEMM here, given its arguments ``args`` (A, lda, B, C, ldc, p0,
    p1, k, blocks): for each block ob of ``block`` output channels, pixels p0..p1 ``rows`` at
    a time (then one at a time), over k: load the k-th step of the block's weight panel
    (``panel`` elements of B a step, at ob * k * panel + k * panel) as ``weights`` = (stride,
    n, vector type, alignment), then for each pixel row r ``row_step(builder, start, k,
    accs[r], vectors)`` gives the row's new accumulators (``start`` = (p + r) * lda; a grid
    of ``accumulators`` = (n, vector type) per row, zero at first). The grid is stored in C
    (bitcast to ``out_lane`` first, where given), or handed to ``finish(builder, accs, p,
    ob)``, which stores it its own way (a fused epilogue). ``correct(builder, accs, p, ob)``,
    where given, gives the grid's final values before it is stored (sums the panel cannot
    take added).

    With ``k_block``, each block's k runs in slices of ``k_block`` steps, all the pixels
    going through one slice before the next, so that the slice of the panel stays in the L1
    cache while they do (a panel of K = 4608 is 590 KB of floats: read whole for every group
    of rows, it came from L2 at every step). Between its slices a group's sums wait in C:
    ``pause(builder, accs, p, ob)`` stores them there, ``resume(builder, p, ob, nrows)``
    loads them back (the same values: the sums are added in the same order). With
    ``prefetch``, each step of k asks for the lines of the panel ``prefetch`` steps ahead
    (``llvm.prefetch``, into every level of cache)."""
    from llvmlite import ir
    a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, count, blocks = args[:9]
    c64 = lambda v: ir.Constant(ir.IntType(64), v)  # noqa: E731
    stride, n, vtype, align = weights

    def store(bc, accs, p, ob):
        if correct is not None:
            accs = correct(bc, accs, p, ob)
        if finish is not None:
            finish(bc, accs, p, ob)
            return
        out = c_ptr if out_lane is None else bc.bitcast(c_ptr, out_lane.as_pointer())
        store_rows(bc, accs, out, p, ldc, ob, block)

    def step(ob, p, nrows):
        """the body of the loop over k: one step of the panel, for rows p..p+nrows"""
        def body(bc, k, accs):
            at = bc.add(bc.mul(ob, bc.mul(count, c64(panel))), bc.mul(k, c64(panel)))
            if prefetch:
                for line in range(0, panel * 4, 64):
                    ahead = c64(prefetch * panel + line // 4)
                    prefetch_line(bc, bc.gep(b_ptr, [bc.add(at, ahead)]))
            vectors = load_vectors(bc, b_ptr, at, stride, n, vtype, align)
            return [row_step(bc, bc.mul(bc.add(p, c64(r)), lda), k, accs[r], vectors)
                    for r in range(nrows)]
        return body

    def micro(bc, p, ob, nrows):
        store(bc, reduction_loop(fn, bc, count, nrows, *accumulators, step(ob, p, nrows)),
              p, ob)

    if not k_block:
        blocks_of_rows(fn, builder, p0, p1, blocks, rows, micro)
        return

    def per_block(bb, ob):
        def per_slice(bs, k0):
            k1 = bs.select(bs.icmp_signed("<", bs.add(k0, c64(k_block)), count),
                           bs.add(k0, c64(k_block)), count)

            def sliced(bc, p, ob, nrows):
                zero = [[ir.Constant(accumulators[1], None)] * accumulators[0]] * nrows
                first = bc.icmp_signed("==", k0, c64(0))
                start = bc.block
                with bc.if_then(bc.not_(first)):
                    loaded = resume(bc, p, ob, nrows)
                    after = bc.block
                flat = []
                for zrow, lrow in zip(zero, loaded):
                    for z, v in zip(zrow, lrow):
                        phi = bc.phi(v.type)
                        phi.add_incoming(z, start)
                        phi.add_incoming(v, after)
                        flat.append(phi)
                cols = accumulators[0]
                grid = [flat[r * cols:(r + 1) * cols] for r in range(nrows)]
                body = step(ob, p, nrows)

                def flat_body(bk, k, values):
                    g = [values[r * cols:(r + 1) * cols] for r in range(nrows)]
                    return [v for row in body(bk, k, g) for v in row]
                out = carried_loop(fn, bc, k0, k1, [v for row in grid for v in row],
                                   flat_body, "k")
                out = [out[r * cols:(r + 1) * cols] for r in range(nrows)]
                with bc.if_else(bc.icmp_signed("==", k1, count)) as (last, more):
                    with last:
                        store(bc, out, p, ob)
                    with more:
                        pause(bc, out, p, ob)

            last = counted_loop(fn, bs, p0, p1, rows, "pg",
                                lambda bc, p: sliced(bc, p, ob, rows))
            counted_loop(fn, bs, last, p1, 1, "p1", lambda bc, p: sliced(bc, p, ob, 1))

        # (k0 + k_block <= count + k_block - 1: every slice start below count)
        counted_loop(fn, bb, c64(0), bb.add(count, c64(k_block - 1)), k_block, "kb",
                     per_slice)

    counted_loop(fn, builder, c64(0), blocks, 1, "ob", per_block)


def store_rows(builder, accs, out, p, ldc, ob, block: int, align: int = 4) -> None:
    """Store the accumulator grid ``accs[r][j]`` (vectors of n lanes) at row p + r, columns
    ob * block + j * n of ``out`` (a pointer to the lane type, rows ldc apart)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    for r, row in enumerate(accs):
        for j, acc in enumerate(row):
            lanes = acc.type.count
            off = builder.add(builder.mul(builder.add(p, ir.Constant(i64, r)), ldc),
                              builder.add(builder.mul(ob, ir.Constant(i64, block)),
                                          ir.Constant(i64, lanes * j)))
            builder.store(acc, builder.bitcast(builder.gep(out, [off]), acc.type.as_pointer()),
                          align=align)


@lru_cache(maxsize=None)
def cpu_has(feature: str) -> bool:
    """Whether the CPU the kernels are compiled for has ``feature`` (LLVM's name: "avx2",
    "fma", "avx512vnni"): the host's, or, where Numba is told to compile for another CPU
    (``NUMBA_CPU_FEATURES``, with ``NUMBA_CPU_NAME``), the features given there, so that
    every kernel choice follows the code Numba emits (a machine can run the kernels of a
    CPU with fewer features: tests/cpu_kinds.py). False where llvmlite cannot tell (the
    portable kernels are then used)."""
    given = _target_features()
    if given is not None:
        return given.get(feature, False)
    try:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        return bool(llvm.get_host_cpu_features().get(feature))
    except Exception:  # noqa: BLE001 - no llvmlite, an odd platform: use the portable path
        return False


def _target_features() -> dict[str, bool] | None:
    """The features Numba is told to compile for (``NUMBA_CPU_FEATURES``: "+avx2,-avx512f,
    ..."), or None where it compiles for the host."""
    from numba.core import config
    given = config.CPU_FEATURES
    if not given:
        return None
    return {f[1:]: f[0] == "+" for f in given.split(",") if f[:1] in "+-" and len(f) > 1}


def prefetch_line(builder, pointer, write: bool = False) -> None:
    """Ask for the cache line at ``pointer`` (into every level of cache; ``write``: to be
    written, so that it comes owned), with ``llvm.prefetch``; never faults."""
    from llvmlite import ir
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fetch = declare(builder.module, "llvm.prefetch.p0",
                    ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fetch, [builder.bitcast(pointer, i8p), ir.Constant(i32, int(write)),
                         ir.Constant(i32, 3), ir.Constant(i32, 1)])


def declare(mod, name: str, fntype):
    """The function ``name`` of ``mod`` (an LLVM intrinsic), declared on first use."""
    from llvmlite import ir
    return mod.globals.get(name) or ir.Function(mod, fntype, name=name)


def gemm_definition(name: str, element: str, extra: tuple = ()):
    """Decorates ``body(mod, fn, args, builder)``, the code of a GEMM function ``void
    name(A, lda, B, C, ldc, p0, p1, k, blocks, *extra)`` (A, B, C pointers to ``element``,
    "i8" or "float"; the rest i64; ``extra``: "ptr" one more pointer to ``element``, "f32" a
    float, "i64" an integer), into ``define(mod)``: the function, defined once in LLVM
    module ``mod`` (``load_gemms``'s, whose C functions every kernel calls); ``define.symbol``
    is its name."""
    def deco(body):
        def define(mod):
            from llvmlite import ir
            if name in mod.globals:
                return mod.globals[name]
            fn = ir.Function(mod, _gemm_type(element, extra), name=name)
            fn.linkage = "linkonce_odr"
            builder = ir.IRBuilder(fn.append_basic_block("entry"))
            body(mod, fn, fn.args, builder)
            builder.ret_void()
            return fn
        define.__name__, define.__doc__ = body.__name__, body.__doc__
        define.symbol = name
        return define
    return deco


def load_vectors(builder, ptr, at, stride: int, n: int, vtype, align: int) -> list:
    """``n`` vectors of ``vtype`` from ``ptr`` at offsets at, at + stride, ... (in ``ptr``'s
    elements): a panel of packed weights."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    return [builder.load(builder.bitcast(builder.gep(ptr, [builder.add(at, ir.Constant(
        i64, stride * j))]), vtype.as_pointer()), align=align) for j in range(n)]


def splat(builder, value, vtype):
    """``value`` in every lane of a ``vtype`` vector (a broadcast pixel)."""
    from llvmlite import ir
    i32 = ir.IntType(32)
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(i32, 0))
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), ir.Constant(
        ir.VectorType(i32, vtype.count), [0] * vtype.count))
