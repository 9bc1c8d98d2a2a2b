"""A counted loop in LLVM IR (llvmlite), for the SIMD GEMMs written by hand (``vnni.py``,
``avx2.py``)."""
from __future__ import annotations


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
