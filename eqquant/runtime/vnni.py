"""An int8 GEMM on AVX512-VNNI (``vpdpbusd``), generated as LLVM IR with llvmlite and called
from Numba kernels.

    C[p, o] = sum_k A[p, k] * B[k, o]     A uint8 (P x K), B int8, C int32

``vpdpbusd`` multiplies 4 unsigned bytes of A by 4 signed bytes of B and adds the four products
into one int32 lane, 16 lanes at a time. B is packed once as [K/4][O][4] (K padded to a
multiple of 4, O a multiple of 64): one 64-byte load gives 4 k-values for 16 output channels.
The kernel keeps 4 accumulators (64 output channels) per pixel; a int8 activation x is fed as
the byte x + 128 and the product corrected by 128 * sum_k B[k, o] (see ``pack``).

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


def _ir() -> str:
    from llvmlite import ir
    i8p = ir.IntType(8).as_pointer()
    i32, i64 = ir.IntType(32), ir.IntType(64)
    v16 = ir.VectorType(i32, 16)
    mod = ir.Module(name="eqquant_vnni")
    dp = ir.Function(mod, ir.FunctionType(v16, [v16, v16, v16]),
                     name="llvm.x86.avx512.vpdpbusd.512")
    # void gemm(A, lda, B, C, ldc, p0, p1, kq, oblocks)
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i8p, i64, i8p, i8p, i64, i64, i64,
                                                          i64, i64]), name="gemm_u8s8")
    a_ptr, lda, b_ptr, c_ptr, ldc, p0, p1, kq, oblocks = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    zero64 = ir.Constant(i64, 0)
    one64 = ir.Constant(i64, 1)
    zeros = ir.Constant(v16, None)

    def loop(builder, start, stop, name, body):
        """for (i = start; i < stop; i++) body(builder, i); returns the builder after it."""
        head = fn.append_basic_block(f"{name}.head")
        work = fn.append_basic_block(f"{name}.body")
        done = fn.append_basic_block(f"{name}.done")
        pre = builder.block
        builder.branch(head)
        builder.position_at_end(head)
        i = builder.phi(i64, name=name)
        i.add_incoming(start, pre)
        builder.cbranch(builder.icmp_signed("<", i, stop), work, done)
        builder.position_at_end(work)
        body(builder, i)
        i.add_incoming(builder.add(i, one64), builder.block)
        builder.branch(head)
        builder.position_at_end(done)
        return builder

    def per_pixel(bb, p):
        def per_block(bc, ob):
            acc_blocks = fn.append_basic_block("k.pre")
            bc.branch(acc_blocks)
            bc.position_at_end(acc_blocks)
            head = fn.append_basic_block("k.head")
            work = fn.append_basic_block("k.body")
            done = fn.append_basic_block("k.done")
            bc.branch(head)
            bc.position_at_end(head)
            k = bc.phi(i64, name="k")
            accs = [bc.phi(v16, name=f"acc{j}") for j in range(4)]
            k.add_incoming(zero64, acc_blocks)
            for acc in accs:
                acc.add_incoming(zeros, acc_blocks)
            bc.cbranch(bc.icmp_signed("<", k, kq), work, done)
            bc.position_at_end(work)
            # 4 bytes of A, broadcast to the 16 lanes
            a_off = bc.add(bc.mul(p, lda), bc.mul(k, ir.Constant(i64, 4)))
            a32 = bc.load(bc.bitcast(bc.gep(a_ptr, [a_off]), i32.as_pointer()), align=1)
            av = bc.insert_element(ir.Constant(v16, ir.Undefined), a32, ir.Constant(i32, 0))
            av = bc.shuffle_vector(av, ir.Constant(v16, ir.Undefined),
                                   ir.Constant(v16, [0] * 16))
            row = bc.mul(k, bc.mul(oblocks, ir.Constant(i64, BLOCK * 4)))
            new = []
            for j in range(4):
                off = bc.add(row, bc.add(bc.mul(ob, ir.Constant(i64, BLOCK * 4)),
                                         ir.Constant(i64, j * 64)))
                bv = bc.load(bc.bitcast(bc.gep(b_ptr, [off]), v16.as_pointer()), align=1)
                new.append(bc.call(dp, [accs[j], av, bv]))
            k.add_incoming(bc.add(k, one64), bc.block)
            for acc, value in zip(accs, new):
                acc.add_incoming(value, bc.block)
            bc.branch(head)
            bc.position_at_end(done)
            for j in range(4):
                off = bc.add(bc.mul(p, ldc), bc.add(bc.mul(ob, ir.Constant(i64, BLOCK)),
                                                    ir.Constant(i64, j * 16)))
                dst = bc.bitcast(bc.gep(bc.bitcast(c_ptr, i32.as_pointer()), [off]),
                                 v16.as_pointer())
                bc.store(accs[j], dst, align=4)
        loop(bb, zero64, oblocks, "ob", per_block)

    loop(b, p0, p1, "p", per_pixel)
    b.ret_void()
    return str(mod)


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
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    address = engine.get_function_address("gemm_u8s8")
    proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64)
    return engine, proto(address)


def pack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """int8 weights (O, K) -> (B packed [K/4][O][4], 128 * column sums (O,), K padded)."""
    o, k = w.shape
    kp = -(-k // 4) * 4
    padded = np.zeros((o, kp), np.int8)
    padded[:, :k] = w
    packed = np.ascontiguousarray(padded.reshape(o, kp // 4, 4).transpose(1, 0, 2))
    return packed, (128 * w.astype(np.int32).sum(axis=1)).astype(np.int32), kp


def gemm(a_u8: np.ndarray, packed: np.ndarray, out: np.ndarray, p0: int = 0,
         p1: int | None = None) -> None:
    """out[p, :] = a_u8[p, :] @ B for rows p0..p1 (a_u8: (P, Kp) uint8, out: (P, O) int32)."""
    _, fn = _compiled()
    p1 = a_u8.shape[0] if p1 is None else p1
    kq, o = packed.shape[0], packed.shape[1]
    fn(a_u8.ctypes.data, a_u8.shape[1], packed.ctypes.data, out.ctypes.data, out.shape[1],
       p0, p1, kq, o // BLOCK)
