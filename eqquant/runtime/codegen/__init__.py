"""Code generation: what turns a kernel into machine code and a C entry.

- ``compiling.py``: Numba compilation, C entries and their addresses, deferred compiling;
- ``launch.py``: a kernel as a launch of a C entry on an argument block, and the one thread
  pool (``parallel``, ``Driver``) every launch runs on;
- ``serial.py``: the serial twin of each parallel kernel, for small ops;
- ``llvm_loops.py``: loop nests and GEMM bodies written in LLVM IR with llvmlite, the slot
  tables that hold their addresses, and the CPU's features (``cpu_has``);
- ``requantize_ir.py``, ``epilogue_table.py``: the requantizing epilogue in LLVM IR and the
  per-channel table it reads;
- ``memory.py``: arrays on 64-byte boundaries.

It imports nothing else of the runtime: kernels build on it."""
