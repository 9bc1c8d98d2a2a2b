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


def reduction_loop(fn, builder, count, rows: int, cols: int, vtype, body):
    """``for (k = 0; k < count; k++) accs = body(builder, k, accs)``: a rows x cols grid of
    ``vtype`` accumulators, zero at the start, carried through the loop in registers;
    returns the final grid, with the builder positioned after the loop."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    pre = builder.block
    head = fn.append_basic_block("k.head")
    work = fn.append_basic_block("k.body")
    done = fn.append_basic_block("k.done")
    builder.branch(head)
    builder.position_at_end(head)
    k = builder.phi(i64, name="k")
    k.add_incoming(ir.Constant(i64, 0), pre)
    accs = [[builder.phi(vtype) for _ in range(cols)] for _ in range(rows)]
    for row in accs:
        for acc in row:
            acc.add_incoming(ir.Constant(vtype, None), pre)
    builder.cbranch(builder.icmp_signed("<", k, count), work, done)
    builder.position_at_end(work)
    new = body(builder, k, accs)
    k.add_incoming(builder.add(k, ir.Constant(i64, 1)), builder.block)
    for r in range(rows):
        for c in range(cols):
            accs[r][c].add_incoming(new[r][c], builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return accs
