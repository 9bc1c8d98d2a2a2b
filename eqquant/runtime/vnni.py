"""An int8 GEMM on AVX512-VNNI (``vpdpbusd``), generated as LLVM IR with llvmlite and called
from Numba kernels.

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

``vpdpbusd`` multiplies 4 unsigned bytes of A by 4 signed bytes of B and adds the four products
into one int32 lane, 16 lanes at a time. B is packed once as [O/64][K/4][64][4] (K padded to a
multiple of 4, O a multiple of 64): one 64-byte load gives 4 k-values for 16 output channels,
and each block of 64 channels is one contiguous panel that stays in cache. The micro-kernel
keeps 6 pixels x 64 channels in 24 accumulators, so each weight load feeds 6 ``vpdpbusd``; an
int8 activation x is fed as the byte x + 128 and the product corrected by 128 * sum_k B[k, o]
(see ``pack``).

``available()`` says whether the host CPU has VNNI; callers keep the portable kernels for the
rest. The same function is compiled once per process (a few milliseconds).
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

BLOCK = 64  # output channels per register block (4 x 16 lanes)


@lru_cache(maxsize=1)
def available() -> bool:
    try:
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        return bool(llvm.get_host_cpu_features().get("avx512vnni"))
    except Exception:  # noqa: BLE001 - no llvmlite, an odd platform: use the portable path
        return False


ROWS = 6    # pixels per micro-kernel step: 6 x 4 accumulators + 4 weight vectors in zmm


def _ir() -> str:
    """void gemm_u8s8(A, lda, B, C, ldc, p0, p1, kq, oblocks): for each block of 64 output
    channels (its packed weights contiguous, kept in cache), the pixels p0..p1 go ROWS at a
    time: each step loads 4 weight vectors (64 channels x 4 k) once and uses them for ROWS
    broadcast pixels, ROWS x 4 ``vpdpbusd``; leftover pixels go one at a time."""
    from llvmlite import ir
    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    mod = ir.Module(name="eqquant_vnni")
    dp = ir.Function(mod, ir.FunctionType(v16, [v16, v16, v16]),
                     name="llvm.x86.avx512.vpdpbusd.512")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i64, i8p, i8p, i64, i64, i64,
                                                          i64, i64]), name="gemm_u8s8")
    a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, kq, oblocks = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    c64 = lambda v: ir.Constant(i64, v)  # noqa: E731
    zeros = ir.Constant(v16, None)

    def loop(builder, start, stop, step, name, body):
        """for (i = start; i + step <= stop; i += step) body(builder, i); returns the final i
        (the builder is left after the loop)."""
        head = fn.append_basic_block(f"{name}.head")
        work = fn.append_basic_block(f"{name}.body")
        done = fn.append_basic_block(f"{name}.done")
        pre = builder.block
        builder.branch(head)
        builder.position_at_end(head)
        i = builder.phi(i64, name=name)
        i.add_incoming(start, pre)
        builder.cbranch(builder.icmp_signed("<=", builder.add(i, c64(step)), stop), work, done)
        builder.position_at_end(work)
        body(builder, i)
        i.add_incoming(builder.add(i, c64(step)), builder.block)
        builder.branch(head)
        builder.position_at_end(done)
        return i

    def micro(bc, p, ob, rows):
        """rows pixels from p times the 64 channels of block ob, over all of k."""
        pre = bc.block
        head = fn.append_basic_block("k.head")
        work = fn.append_basic_block("k.body")
        done = fn.append_basic_block("k.done")
        bc.branch(head)
        bc.position_at_end(head)
        k = bc.phi(i64, name="k")
        k.add_incoming(c64(0), pre)
        accs = [[bc.phi(v16) for _ in range(4)] for _ in range(rows)]
        for row in accs:
            for acc in row:
                acc.add_incoming(zeros, pre)
        bc.cbranch(bc.icmp_signed("<", k, kq), work, done)
        bc.position_at_end(work)
        panel = bc.mul(ob, bc.mul(kq, c64(BLOCK * 4)))          # this block's weights
        at = bc.add(panel, bc.mul(k, c64(BLOCK * 4)))
        bvs = [bc.load(bc.bitcast(bc.gep(b_ptr, [bc.add(at, c64(64 * j))]),
                                  v16.as_pointer()), align=1) for j in range(4)]
        new = []
        for r in range(rows):
            a_off = bc.add(bc.mul(bc.add(p, c64(r)), lda), bc.mul(k, c64(4)))
            a32 = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=1)
            av = bc.insert_element(ir.Constant(v16, ir.Undefined), a32, ir.Constant(i32, 0))
            av = bc.shuffle_vector(av, ir.Constant(v16, ir.Undefined),
                                   ir.Constant(v16, [0] * 16))
            new.append([bc.call(dp, [accs[r][j], av, bvs[j]]) for j in range(4)])
        k.add_incoming(bc.add(k, c64(1)), bc.block)
        for r in range(rows):
            for j in range(4):
                accs[r][j].add_incoming(new[r][j], bc.block)
        bc.branch(head)
        bc.position_at_end(done)
        c32 = bc.bitcast(c_ptr, i32.as_pointer())
        for r in range(rows):
            for j in range(4):
                off = bc.add(bc.mul(bc.add(p, c64(r)), ldc),
                             bc.add(bc.mul(ob, c64(BLOCK)), c64(16 * j)))
                bc.store(accs[r][j], bc.bitcast(bc.gep(c32, [off]), v16.as_pointer()),
                         align=4)

    def per_block(bb, ob):
        last = loop(bb, p0, p1, ROWS, "pg", lambda bc, p: micro(bc, p, ob, ROWS))
        loop(bb, last, p1, 1, "p1", lambda bc, p: micro(bc, p, ob, 1))

    loop(b, c64(0), oblocks, 1, "ob", per_block)
    b.ret_void()
    _jobs_ir(mod, fn)
    return str(mod)


def _jobs_ir(mod, gemm) -> None:
    """void gemm_jobs(i64 *jobs, i64 n): ``n`` calls of gemm_u8s8, each from 9 int64 words
    (its arguments, pointers as addresses), jobs 1..n-1 on new POSIX threads and job 0 on the
    caller's; returns when all are done. Threads are made per call (tens of microseconds),
    which beats waking a Python thread pool and needs no runtime beyond libc."""
    from llvmlite import ir
    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    i64p = i64.as_pointer()
    job_t = ir.FunctionType(i8p, [i8p])
    create = ir.Function(mod, ir.FunctionType(i32, [i64p, i8p, job_t.as_pointer(), i8p]),
                         name="pthread_create")
    join = ir.Function(mod, ir.FunctionType(i32, [i64, i8p.as_pointer()]), name="pthread_join")
    job = ir.Function(mod, job_t, name="gemm_job")
    b = ir.IRBuilder(job.append_basic_block("entry"))
    words = b.bitcast(job.args[0], i64p)
    args = [b.load(b.gep(words, [ir.Constant(i64, i)])) for i in range(9)]
    for i in (0, 2, 3):                       # A, B, C are addresses
        args[i] = b.inttoptr(args[i], i8p)
    b.call(gemm, args)
    b.ret(ir.Constant(i8p, None))

    run = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64p, i64]), name="gemm_jobs")
    jobs, n = run.args
    entry = run.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    tids = b.alloca(i64, n)
    one = ir.Constant(i64, 1)

    def counted(builder, name, body):
        head = run.append_basic_block(f"{name}.head")
        work = run.append_basic_block(f"{name}.body")
        done = run.append_basic_block(f"{name}.done")
        pre = builder.block
        builder.branch(head)
        builder.position_at_end(head)
        t = builder.phi(i64)
        t.add_incoming(one, pre)
        builder.cbranch(builder.icmp_signed("<", t, n), work, done)
        builder.position_at_end(work)
        body(builder, t)
        t.add_incoming(builder.add(t, one), builder.block)
        builder.branch(head)
        builder.position_at_end(done)

    def arg(builder, t):
        return builder.bitcast(builder.gep(jobs, [builder.mul(t, ir.Constant(i64, 9))]), i8p)

    counted(b, "spawn", lambda bb, t: bb.call(create, [bb.gep(tids, [t]), ir.Constant(i8p, None),
                                                       job, arg(bb, t)]))
    b.call(job, [arg(b, ir.Constant(i64, 0))])
    counted(b, "join", lambda bb, t: bb.call(join, [bb.load(bb.gep(tids, [t])),
                                                    ir.Constant(i8p.as_pointer(), None)]))
    b.ret_void()


@lru_cache(maxsize=1)
def _compiled():
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(),
                                      features=llvm.get_host_cpu_features().flatten(), opt=3)
    mod = llvm.parse_assembly(_ir())
    mod.verify()
    # LLVM's -O3 pipeline first: the IR above recomputes addresses inside its loops and
    # leaves strength reduction and hoisting to it
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    address = engine.get_function_address("gemm_u8s8")
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64)
    jobs = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(
        engine.get_function_address("gemm_jobs"))
    return engine, proto(address), jobs


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K), O a multiple of 64 -> (B packed [O/64][K/4][64][4]: each block of
    64 output channels contiguous, 128 * column sums (O,), K padded to a multiple of 4)."""
    o, k = w.shape
    kp = -(-k // 4) * 4
    padded = np.zeros((o, kp), np.int8)
    padded[:, :k] = w
    packed = np.ascontiguousarray(
        padded.reshape(o // BLOCK, BLOCK, kp // 4, 4).transpose(0, 2, 1, 3))
    return packed, (128 * w.astype(np.int32).sum(axis=1)).astype(np.int32), kp


def gemm(a_u8: np.ndarray, packed: np.ndarray, out: np.ndarray, p0: int = 0,
         p1: int | None = None, ob0: int = 0, ob1: int | None = None) -> None:
    """out[p, :] = a_u8[p, :] @ B for rows p0..p1 (a_u8: (P, Kp) uint8, out: (P, O) int32),
    for the blocks of 64 output channels ob0..ob1 (all by default)."""
    fn = _compiled()[1]
    p1 = a_u8.shape[0] if p1 is None else p1
    oblocks, kq = packed.shape[0], packed.shape[1]
    ob1 = oblocks if ob1 is None else ob1
    fn(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data + ob0 * kq * BLOCK * 4,
       out.ctypes.data + ob0 * BLOCK * 4, out.shape[1], p0, p1, kq, ob1 - ob0)


def gemm_parallel(a_u8: np.ndarray, packed: np.ndarray, out: np.ndarray) -> None:
    """``gemm`` over the cores, forked and joined inside the compiled code (``gemm_jobs``):
    split by pixels when there are many, by output blocks when the image is small (a 7x7
    layer has 49 pixels)."""
    import os
    workers = os.cpu_count() or 1
    p, oblocks, kq = a_u8.shape[0], packed.shape[0], packed.shape[1]
    if workers > 1 and p >= 32 * workers:
        step = -(-p // workers)
        parts = [(i, min(i + step, p), 0, oblocks) for i in range(0, p, step)]
    elif workers > 1 and oblocks > 1:
        step = -(-oblocks // workers)
        parts = [(0, p, i, min(i + step, oblocks)) for i in range(0, oblocks, step)]
    else:
        parts = [(0, p, 0, oblocks)]
    jobs = np.array([[a_u8.ctypes.data, a_u8.shape[1],
                      packed.ctypes.data + ob0 * kq * BLOCK * 4,
                      out.ctypes.data + ob0 * BLOCK * 4, out.shape[1], p0, p1, kq, ob1 - ob0]
                     for p0, p1, ob0, ob1 in parts], np.int64)
    _compiled()[2](jobs.ctypes.data, len(parts))
