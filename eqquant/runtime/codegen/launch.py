"""One parallel launcher for the kernels: a kernel is written as the share of its work one
thread does, ``part(thread, threads, args)`` on the tuple of its arguments, a serial Numba
function, and ``parallel``
runs it on every thread of the pool through one parallel loop compiled once (``_launch``):

    @parallel
    def relu_u8(thread, threads, args):
        x, out = args
        for i in range(*share(x.size, thread, threads)):
            ...

    relu_u8(x, out)            # on the pool's threads (``threads()``)
    relu_u8.serial(x, out)     # on the calling thread: the same compiled entry, thread 0 of 1

Why: Numba compiles each parallel loop into a function of its own, with a scheduler and two
wrappers, through LLVM again with everything the loop calls: on resnet18 int8's small
kernels (max pool, dense, global average) a ``prange`` made compiling with an empty cache
about four times as long as the serial loop's. Here each kernel compiles serially, once, and the pool is entered by one
function for all of them, so that every kernel wakes the workers the same way.

How a call reaches the part: the arguments are written as 64-bit words into a block (an
array: its data address and its shape; a number: its value, a float's as float64 bits; a
tuple: its fields; an array that is not C-contiguous, its strides too), and the launcher
calls a C function (``entry``: a Numba ``cfunc``, one per part and argument types, in
Numba's disk cache) with the block's address and the thread's index; the C function reads
the arguments back as the part's types and calls it. A part cannot raise (a C function has
nowhere to send an exception): what could fail is checked before the launch.

A kernel whose call needs more than one launch, or Python first, is a ``Driver``: its plan
(Python) gives its launches. A convolution's plan cuts its work and allocates its item
counters (``gather.plan_shares``), and where its items share gathered rows, a launch that
gathers them comes first. Bound to its operands (``bindings.bound``), a kernel's block is
written once and its plan made once, and a call is the launcher's compiled entry point on
three integers.
"""
from __future__ import annotations

import array
import ctypes
import hashlib
import struct
import sys

import numpy as np
from numba import config, from_dtype, get_num_threads, njit, prange, typeof, types
from numba.extending import intrinsic
from numba.np.ufunc import parallel as _pool

from . import compiling
from .compiling import c_function
from .serial import twin


def threads() -> int:
    """The thread pool's size now (``numba.get_num_threads()``; ``numba.set_num_threads`` may
    change it between two calls): once Numba has launched its pool, read straight from it,
    as Numba's public getter takes two locks first (at every convolution call); before, the
    size it will have."""
    read = getattr(_pool, "_get_num_threads", None)   # (set when the pool is launched)
    count = read() if read is not None else 0
    if count > 0:
        return count
    if not getattr(_pool, "_is_initialized", True):
        # not launched yet: its size to be (Numba's getter would launch it, and a process
        # with threads is not forked, ``compiling.share``); set_num_threads launches it
        return config.NUMBA_NUM_THREADS
    return get_num_threads()


@njit(inline="always")
def share(n, thread, threads):
    """Thread ``thread``'s share of ``n`` iterations: [lo, hi), equal runs in order (as
    Numba's static schedule of a ``prange`` cut them), as unsigned integers: an array
    indexed by a signed counter from a start LLVM cannot prove is not negative keeps Numba's
    wrap-around test in the loop, which stops it vectorising (a flat qadd ran about ten
    times as long an element; a ``prange`` index is unsigned too)."""
    return np.uintp(thread * n // threads), np.uintp((thread + 1) * n // threads)


@intrinsic
def _call_entry(typingctx, address, block, thread, threads):
    """Call the C function ``void f(i64 block, i64 thread, i64 threads)`` at ``address``."""
    def codegen(context, builder, signature, args):
        from llvmlite import ir
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [i64, i64, i64])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.intp, types.intp), codegen


@njit(parallel=True, cache=True)
def _launch(address, block, threads):
    """The parallel loop of every kernel: thread t runs the C function at ``address`` (a
    part's ``entry``) on the argument block at ``block`` (an address)."""
    for t in prange(threads):
        _call_entry(address, block, t, threads)


# -- the argument block ---------------------------------------------------------------------

def argument_type(value):
    """The Numba type an argument is passed to the part as: arrays writable, C-contiguous
    where they are, else of any layout (their strides passed too), numbers and tuples as
    Numba types them."""
    if isinstance(value, np.ndarray):
        return types.Array(from_dtype(value.dtype), value.ndim,
                           "C" if value.flags.c_contiguous else "A")
    if isinstance(value, tuple):
        return types.Tuple(tuple(argument_type(v) for v in value))
    return typeof(value)


ARRAY, STRIDED, INTEGER, FLOAT, TUPLE = range(5)   # how an argument is written (``_plan``)


def _plan(layout: tuple, where: str) -> tuple:
    """How to write arguments of Numba types ``layout`` into a block, kind by kind, decided
    once per argument types (a call then tests no Numba type)."""
    plan = []
    for t in layout:
        if isinstance(t, types.Array):
            plan.append((ARRAY if t.layout == "C" else STRIDED, None))
        elif isinstance(t, types.BaseTuple):
            plan.append((TUPLE, _plan(tuple(t), where)))
        elif isinstance(t, types.Float):
            plan.append((FLOAT, None))
        elif isinstance(t, (types.Integer, types.Boolean)):
            plan.append((INTEGER, None))
        else:
            raise TypeError(f"{where}: a parallel kernel's argument of type {t} cannot be "
                            "passed")
    return tuple(plan)


def _address(a: np.ndarray) -> int:
    """The address of an array's data (through ctypes' view of its buffer, a third of the
    time ``a.ctypes.data`` takes; read-only, empty or strided arrays take the latter)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


_DOUBLE = struct.Struct("<d")
_WORD = struct.Struct("<q")


def _write(words: list, values, plan: tuple) -> None:
    for v, (kind, sub) in zip(values, plan):
        if kind == ARRAY:
            words.append(_address(v))
            words.extend(v.shape)
        elif kind == INTEGER:
            v = int(v)
            words.append(v - (1 << 64) if v >= 1 << 63 else v)   # (a uint64's bits)
        elif kind == FLOAT:
            words.append(_WORD.unpack(_DOUBLE.pack(v))[0])
        elif kind == TUPLE:
            _write(words, v, sub)
        else:                                   # STRIDED
            words.append(v.ctypes.data)
            words.extend(v.shape)
            words.extend(v.strides)


def argument_block(values: tuple, plan: tuple) -> array.array:
    """The block of 64-bit words that passes ``values`` as ``plan`` says (``_plan``): an
    array's data address and shape (and strides where not C-contiguous), a number's value
    (a float's as float64 bits), a tuple's fields."""
    words: list = []
    _write(words, values, plan)
    return array.array("q", words or [0])


def references(values, plan: tuple) -> tuple[list, list]:
    """What the words of ``argument_block(values, plan)`` that are addresses point to:
    (word, value) for each array's data address (the array) and each integer that is a
    ``compiling.Address``; and the words that hold other integers. (For a program saved
    ahead of time, ``eqquant.deploy``, whose arrays and code lie elsewhere in the process
    that loads it.)"""
    from .compiling import Address
    found: list = []
    integers: list = []

    def walk(values, plan, at):
        for v, (kind, sub) in zip(values, plan):
            if kind in (ARRAY, STRIDED):
                found.append((at, v))
                at += 1 + v.ndim * (1 if kind == ARRAY else 2)
            elif kind == TUPLE:
                at = walk(v, sub, at)
            else:
                if isinstance(v, Address):
                    found.append((at, v))
                elif kind == INTEGER:
                    integers.append(at)
                at += 1
        return at
    walk(values, plan, 0)
    return found, integers


def block_address(block: array.array) -> int:
    """The address of a block's first word."""
    return block.buffer_info()[0]


def _read(context, builder, base, at: int, t):
    """The argument of type ``t`` at word ``at`` of the block at ``base`` (an i64*): its
    value and the next word."""
    from llvmlite import ir
    from numba.np.arrayobj import populate_array
    i64 = ir.IntType(64)

    def word(j):
        return builder.load(builder.gep(base, [ir.Constant(i64, j)]))
    if isinstance(t, types.Array):
        data_type = context.get_data_type(t.dtype)
        data = builder.inttoptr(word(at), data_type.as_pointer())
        shape = [word(at + 1 + d) for d in range(t.ndim)]
        itemsize = context.get_abi_sizeof(data_type)
        at += 1 + t.ndim
        if t.layout == "C":
            strides, step = [], ir.Constant(i64, itemsize)
            for d in reversed(range(t.ndim)):
                strides.insert(0, step)
                step = builder.mul(step, shape[d])
        else:
            strides = [word(at + d) for d in range(t.ndim)]
            at += t.ndim
        array = context.make_array(t)(context, builder)
        populate_array(array, data=data, shape=shape, strides=strides,
                       itemsize=ir.Constant(i64, itemsize), meminfo=None)
        return array._getvalue(), at
    if isinstance(t, types.BaseTuple):
        fields = []
        for f in t:
            value, at = _read(context, builder, base, at, f)
            fields.append(value)
        return context.make_tuple(builder, t, fields), at
    if isinstance(t, types.Float):
        double = builder.bitcast(word(at), ir.DoubleType())
        return context.cast(builder, double, types.float64, t), at + 1
    if isinstance(t, types.Boolean):
        return builder.icmp_unsigned("!=", word(at), ir.Constant(i64, 0)), at + 1
    # an integer read in its own width, the word's low bytes (where they come first: a trunc
    # of the 64-bit word let LLVM widen the kernels' 32-bit arithmetic to 64-bit lanes)
    width = ir.IntType(t.bitwidth)
    if sys.byteorder != "little" or t.bitwidth == 64:
        return builder.trunc(word(at), width) if t.bitwidth < 64 else word(at), at + 1
    at_word = builder.gep(base, [ir.Constant(i64, at)])
    return builder.load(builder.bitcast(at_word, width.as_pointer())), at + 1


def _reader(layout: tuple):
    """An intrinsic ``read(block)``: the tuple of arguments of types ``layout`` written at
    the block's address (``argument_block``)."""
    out = types.Tuple(layout)

    def read(typingctx, block):
        def codegen(context, builder, signature, args):
            from llvmlite import ir
            base = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
            fields, at = [], 0
            for t in layout:
                value, at = _read(context, builder, base, at, t)
                fields.append(value)
            return context.make_tuple(builder, out, fields)
        return out(types.intp), codegen
    return intrinsic(read)


part = None         # (bound in each twin of _entry to its part, ``parallel``'s)
read_block = None   # (bound in each twin of _entry to its layout's reader, ``_reader``)


def _entry(block, thread, threads):
    """The C function a launch calls on each thread: ``part`` on the block's arguments."""
    part(thread, threads, read_block(block))


_ENTRY_SIGNATURE = types.void(types.intp, types.intp, types.intp)


def kernel_of(entry) -> str:
    """The kernel a launch's entry (a C function ``Parallel.entry`` made) runs, as its
    source names it ("vnni._conv_items", "kernels_fp32.binary_same"), for the kernel plan;
    another C function: its own name."""
    fn = entry._pyfunc                  # (Numba's; eqquant pins its version)
    kernel = fn.__globals__["part"].py_func if fn.__code__ is _entry.__code__ else fn
    return f"{kernel.__module__.removeprefix('eqquant.runtime.')}.{kernel.__qualname__}"


class Parallel:
    """A kernel run by the pool's threads, each doing its share (``parallel``)."""

    def __init__(self, fn, options: dict):
        # inlined into each entry (one compile, the part's code through LLVM once); its own
        # dispatcher is compiled only where it is called as a Numba function
        self.part = njit(inline="always", **options)(fn)
        self.options = options
        self.py_func = fn
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__
        self.__module__, self.__qualname__ = fn.__module__, fn.__qualname__
        self._entries: dict = {}     # argument layout -> entry (a cfunc)
        self._calls: dict = {}       # ``_key`` of the arguments -> (entry address, plan)
        self.serial = _Serial(self)

    def entry(self, layout: tuple):
        """The C function that runs the part on a block of arguments of types ``layout``
        (compiled, or loaded from Numba's disk cache, once per layout; None while
        ``compiling.survey`` records it)."""
        c = self._entries.get(layout)
        if c is None:
            key = hashlib.sha1(repr((layout, self.options)).encode()).hexdigest()[:10]
            name = f"_{self.__module__.rsplit('.', 1)[-1]}_{self.__name__}_{key}"
            c = c_function(twin(_entry, name, part=self.part, read_block=_reader(layout)),
                           _ENTRY_SIGNATURE, **self.options)
            if c is not None:
                self._entries[layout] = c
        return c

    def _launch_args(self, args: tuple):
        """(the entry's address, the argument block, how it was written: ``_plan``'s) for a
        call on ``args`` (an address of 0 while ``compiling.survey`` records the entry:
        never kept, never called)."""
        key = tuple([_key(a) for a in args])
        known = self._calls.get(key)
        if known is None:
            layout = tuple(argument_type(a) for a in args)
            entry = self.entry(layout)
            known = (0 if entry is None else entry.address, _plan(layout, self.__name__))
            if entry is not None:
                self._calls[key] = known
        return known[0], argument_block(args, known[1]), known[1]

    def __call__(self, *args) -> None:
        self.run(threads(), *args)

    def run(self, count: int, *args) -> None:
        """The kernel on ``args`` as ``count`` threads (``count`` parts, thread 0..count-1 of
        count; the pool's threads take them)."""
        address, block, _ = self._launch_args(args)
        _loaded(_launch)(_callable(address, self), block_address(block), count)

    def bind(self, args: tuple, entry_point, count: int | None = None):
        """A call with no arguments doing ``self(*args)`` on these arrays (``bindings.bound``):
        the block written once; as ``count`` threads, else as many as the pool has at each
        call."""
        address, block, plan = self._launch_args(args)
        run = entry_point(_launch, (address, block_address(block), 1))
        return _BoundLaunch(run, address, block, args, plan, count)


class _Serial:
    """``kernel.serial(*args)``: the kernel on the calling thread alone (thread 0 of 1), its
    same entry, without waking the pool (``serial.sized`` picks it for small ops)."""

    def __init__(self, kernel: Parallel):
        self.kernel = kernel

    def __call__(self, *args) -> None:
        address, block, _ = self.kernel._launch_args(args)
        _loaded(_run_one)(_callable(address, self.kernel), block_address(block))

    def run(self, count: int, *args) -> None:
        """(``Parallel.run``'s: on one thread, whatever ``count``)"""
        self(*args)

    def bind(self, args: tuple, entry_point, count: int | None = None):
        """``Parallel.bind``'s, on one thread."""
        address, block, plan = self.kernel._launch_args(args)
        return _BoundSerial(entry_point(_run_one, (address, block_address(block))), address,
                            block, args, plan, 1)


_LOADED: dict = {}


def _loaded(launcher):
    """``_launch``'s or ``_run_one``'s compiled entry point (on integers), loaded once as
    a binding's are (``compiling.entry_point``: without Numba's registry refresh, where
    its dispatcher's call would make one)."""
    point = _LOADED.get(launcher)
    if point is None:
        count = launcher.py_func.__code__.co_argcount
        point = compiling.entry_point(launcher, (types.intp,) * count)
        if point is not compiling.not_compiled:
            _LOADED[launcher] = point
    return point


def _callable(address: int, kernel) -> int:
    """``address``, checked: a kernel cannot run while its entry is only recorded."""
    if not address:
        raise RuntimeError(f"{kernel.__name__} was called while compiling.survey recorded "
                           "what the binding compiles: a binding may bind kernels then, "
                           "not run them")
    return address


def _key(value):
    """What decides an argument's type (``argument_type``), cheaply: an array's dtype, rank
    and contiguity, a number's Python type, a tuple's fields'."""
    if isinstance(value, np.ndarray):
        return value.dtype, value.ndim, value.flags.c_contiguous
    if isinstance(value, tuple):
        return tuple([_key(v) for v in value])
    return type(value)


@njit(cache=True)
def _run_one(address, block):
    """A part's entry on the calling thread, as thread 0 of 1."""
    _call_entry(address, block, 0, 1)


class _BoundLaunch:
    """``bind``'s call: the launcher's entry point, the part's entry and its block, and the
    arguments, kept alive (the block holds their addresses only), with how they were
    written (``references`` reads it); ``count``: the threads it runs as (None: the
    pool's)."""

    __slots__ = ("run", "address", "block", "at", "args", "plan", "count")

    def __init__(self, run, address: int, block: array.array, args: tuple, plan: tuple,
                 count: int | None = None):
        self.run, self.address, self.block, self.count = run, address, block, count
        self.args, self.plan = args, plan
        self.at = block_address(block)

    def launches(self) -> list:
        """This call as the launches it makes, in order: [self]."""
        return [self]

    def __call__(self) -> None:
        self.run(self.address, self.at, self.count or threads())


def parallel(fn=None, **options):
    """Decorator: ``fn(thread, threads, args)``, one thread's share of a kernel on the
    tuple of its arguments, run on the pool's threads (``Parallel``); ``options``: Numba's
    (``error_model``...), for the part and its entries. ``@parallel`` or
    ``@parallel(error_model="numpy")``."""
    if fn is None:
        return lambda f: Parallel(f, options)
    return Parallel(fn, options)


class _BoundSerial(_BoundLaunch):
    """``_Serial.bind``'s call."""

    __slots__ = ()

    def __call__(self) -> None:
        self.run(self.address, self.at)


class Driver:
    """A kernel whose call is a plan, then launches: ``plan(*args)`` (Python, run where the
    kernel is called or bound) gives the launches, (kernel, its arguments, the threads it
    runs as, or None for the pool's), each a ``parallel`` kernel or its ``serial`` call. A
    convolution's plan cuts its work (``gather.plan_shares``) and gathers what its items
    share before they run. Bound (``bind``), the plan is made once and its launches are
    bound."""

    def __init__(self, plan, parts: tuple = ()):
        self.plan, self.parts = plan, parts      # (parts: the kernels its plan launches)
        self.__name__, self.__doc__ = plan.__name__, plan.__doc__

    def __call__(self, *args) -> None:
        for kernel, values, count in self.plan(*args):
            kernel.run(threads() if count is None else count, *values)

    def bind(self, args: tuple, entry_point):
        return in_order([kernel.bind(values, entry_point, count)
                         for kernel, values, count in self.plan(*args)])


def launches_of(call) -> list | None:
    """The launches a bound call makes (``bind``'s, ``in_order``'s), or None where it is not
    launches of C entries (a Numba function's entry point, a binding's own call)."""
    found = getattr(call, "launches", None)
    return found() if found is not None else None


def in_order(calls: list):
    """Bound calls (``bind``'s) as one bound call making them in order."""
    return calls[0] if len(calls) == 1 else _Calls(calls)


class _Calls:
    """Bound calls made in order (``Driver.bind``, ``in_order``)."""

    __slots__ = ("calls",)

    def __init__(self, calls: list):
        self.calls = calls

    def launches(self) -> list | None:
        """The launches of the calls, in order; None where one is not a launch (a Numba
        function's entry point, bound)."""
        found = []
        for call in self.calls:
            more = launches_of(call)
            if more is None:
                return None
            found += more
        return found

    def __call__(self) -> None:
        for call in self.calls:
            call()
