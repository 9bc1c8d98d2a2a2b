"""The kernels' C functions compiled once, and a first start's compiling shared with a helper
process.

Every C function the runtime compiles (a parallel kernel's entry, ``launch``; the GEMMs' and
the gather's modules, ``llvm_loops.load_gemms`` and ``gather.load_entry``; the depthwise
sweep) is made by ``c_function``: a Numba ``cfunc`` in Numba's disk cache, made once per
process; every Numba function a binding binds (the launcher's loop, a few kernels of their
own) goes through ``entry_point``. With an empty cache, compiling them is most of a first start (resnet18 int8: 5 s
of Numba, one function at a time, as Numba's compiler holds a lock). The executor finds out
first what its program will compile, then compiles it on two processes:

    with deferring():                  # slots' modules imported now are loaded at the end
        ...bind the steps...
        units = survey(bind_again)     # what the binding compiled: recorded, not compiled
        share(units)                   # compiled here and in a forked helper, into the cache
    ...bind for real: each unit loads from memory or from the cache...

``survey(fn)`` runs ``fn`` with every function missing from the cache recorded as a unit
and given as None (a C function: its callers then leave nothing behind, an address of 0 is
never kept) or ``not_compiled`` (a Numba function's entry point).
``share(units)`` forks a helper process where it is safe (Linux, one Python thread, Numba's
thread pool not launched yet, two CPUs or ``EQQUANT_COMPILE_JOBS``): the helper and this
process take units in turn from a pipe and compile each into Numba's cache, and this one
waits for the helper's last. A unit the helper did not finish is compiled here when the
binding asks for it, so the outcome never depends on the helper: only the time does. The
bits are the same: a unit is the same C function, compiled by the same compiler, wherever.
"""
from __future__ import annotations

import os
import struct
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

_made: dict = {}          # (module, qualified name, signature) -> its CFunc (kept alive)
_survey: list | None = None
_deferred: dict = {}      # name -> a slot module's loader, while deferring
_deferring = 0

JOBS_VARIABLE = "EQQUANT_COMPILE_JOBS"
HELPER_DEADLINE = 600.0   # seconds a helper may take before it is stopped and ignored


@dataclass
class Unit:
    """A function to compile (``survey``'s): its name, its uncompiled CFunc or Numba
    dispatcher, and for a dispatcher, the argument types."""
    name: str
    function: object
    signature: tuple | None = None

    def compile(self) -> None:
        # (Numba's: from the cache where it is there, else compiled and saved)
        if self.signature is None:
            self.function.compile()
        else:
            self.function.compile(self.signature)

    @property
    def key(self) -> tuple:
        return id(self.function), self.signature


@dataclass
class Shared:
    """What ``share`` did: the units, how many the helper compiled, in how long."""
    units: int = 0
    helper: int = 0
    seconds: float = 0.0
    helper_names: list = field(default_factory=list)


last_share = Shared()


def c_function(fn, signature, **options):
    """``fn`` as a C function of Numba type ``signature`` (Numba's ``cfunc``, in its disk
    cache): loaded from the cache or compiled, once per process (by ``fn``'s module and
    qualified name, as Numba's cache keys it). While ``survey`` runs, one the cache does not
    hold is recorded and None returned."""
    from numba.core import sigutils
    from numba.core.ccallback import CFunc
    key = (fn.__module__, fn.__qualname__, str(signature))
    c = _made.get(key)
    if c is None:
        c = _made[key] = CFunc(fn, sigutils.normalize_signature(signature), locals={},
                               options=options)
        c.enable_caching()
    if c.address is not None:
        return c
    if _survey is not None:
        if _load(c):
            return c
        _survey.append(Unit(fn.__qualname__, c))
        return None
    c.compile()
    return c


def entry_point(dispatcher, signature: tuple):
    """The Numba function ``dispatcher``'s compiled entry point for argument types
    ``signature`` (loaded from the cache or compiled). While ``survey`` runs, one the cache
    does not hold is recorded and ``not_compiled`` returned, and so is a parallel one
    (``prange``) that it holds: loading it would launch Numba's thread pool, and a process
    with threads is not forked."""
    known = dispatcher.overloads.get(signature)
    if known is not None:
        return known.entry_point
    if _survey is not None:
        parallel = dispatcher.targetoptions.get("parallel")
        if parallel or not _cached(dispatcher, signature):
            if not _cached(dispatcher, signature):
                _survey.append(Unit(dispatcher.py_func.__qualname__, dispatcher, signature))
            return not_compiled
    return dispatcher.compile(signature)


def not_compiled(*args):
    """(``entry_point``'s while surveying: a binding made then is dropped, never called)"""
    raise RuntimeError("a kernel bound while compiling.survey ran was called")


def _cached(dispatcher, signature: tuple) -> bool:
    """Whether Numba's disk cache holds ``dispatcher`` for ``signature`` (its index read,
    nothing loaded)."""
    try:
        cache = dispatcher._cache
        key = cache._index_key(signature, dispatcher.targetctx.codegen())
        return cache._cache_file._load_index().get(key) is not None
    except AttributeError:      # (no disk cache, or a Numba that keeps it otherwise)
        return True


def _load(c) -> bool:
    """Load ``c`` (a CFunc) from Numba's disk cache, as ``CFunc.compile`` does first;
    whether the cache held it."""
    try:
        found = c._cache.load_overload(c._sig, c._targetdescr.target_context)
    except AttributeError:         # (a Numba whose CFunc differs: compiled where asked)
        c.compile()
        return True
    if found is None:
        return False
    c._library = found.library
    c._wrapper_name = found.fndesc.llvm_cfunc_wrapper_name
    c._wrapper_address = c._library.get_pointer_to_function(c._wrapper_name)
    return True


def survey(fn) -> list[Unit]:
    """Run ``fn()`` with C functions missing from the cache recorded, not compiled (their
    callers get None); the units recorded, each once."""
    global _survey
    outer, _survey = _survey, []
    try:
        fn()
        load_deferred()
        units, seen = [], set()
        for u in _survey:
            if u.key not in seen:
                seen.add(u.key)
                units.append(u)
        return units
    finally:
        _survey = outer


def defer(name: str, load) -> None:
    """Run ``load()`` (a slot module's: it compiles or loads C functions and fills their
    slots) now, or at the end of ``deferring`` while one is open (its units then join the
    survey); ``load`` returns whether it loaded."""
    if _deferring:
        _deferred[name] = load
    else:
        load()


def load_deferred() -> None:
    """Run the deferred loaders (``defer``); while surveying, those that could not load stay
    deferred."""
    for name, load in list(_deferred.items()):
        if load():
            del _deferred[name]


@contextmanager
def deferring():
    """Defer slot modules' loaders (``defer``) to the end of the block, where they run
    whatever happened in it: a kernel calling an empty slot would jump to 0."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring:
            load_deferred()


def jobs() -> int:
    """How many processes compile a first start's units: ``EQQUANT_COMPILE_JOBS`` (1: this
    process alone; 2: a helper too), else 2 where this process may run on two CPUs."""
    value = os.environ.get(JOBS_VARIABLE, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{JOBS_VARIABLE}={value!r}: expected a whole number of "
                             "processes, 1 or more")
        return min(int(value), 2)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return 2 if cpus >= 2 else 1


def can_fork() -> bool:
    """Whether a helper may be forked now: on Linux, from a process with one Python thread
    whose Numba thread pool is not launched (a fork copies no threads; locks they held
    would stay held in the copy)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.active_count() != 1:
        return False
    from numba.np.ufunc import parallel as pool
    return not getattr(pool, "_is_initialized", True)


_TOKEN = struct.Struct("<H")


def share(units: list[Unit]) -> Shared:
    """Compile ``units`` into Numba's cache, here and, where ``jobs()`` and ``can_fork()``
    allow, in a forked helper: each process takes the next unit from a pipe until none is
    left; this one then waits for the helper (at most HELPER_DEADLINE). What the helper
    compiled, this process loads from the cache when its binding asks."""
    global last_share
    t0 = time.perf_counter()
    done = Shared(units=len(units))
    if len(units) < 2 or jobs() < 2 or not can_fork() or len(units) >= 1 << 16:
        for u in units:
            u.compile()
        done.seconds = time.perf_counter() - t0
        last_share = done
        return done
    todo_r, todo_w = os.pipe()
    report_r, report_w = os.pipe()
    os.write(todo_w, b"".join(_TOKEN.pack(i) for i in range(len(units))))
    os.close(todo_w)
    pid = os.fork()
    if pid == 0:                                    # the helper
        try:
            os.close(report_r)
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1)
            os.dup2(quiet, 2)
            while token := os.read(todo_r, _TOKEN.size):
                i = _TOKEN.unpack(token)[0]
                try:
                    units[i].compile()
                except BaseException:               # (this process compiles it again)
                    continue
                os.write(report_w, token)
        finally:
            os._exit(0)
    os.close(report_w)
    try:
        while token := os.read(todo_r, _TOKEN.size):
            units[_TOKEN.unpack(token)[0]].compile()
    finally:
        os.close(todo_r)
        _reap(pid)
        report = b""
        while chunk := os.read(report_r, 4096):
            report += chunk
        os.close(report_r)
    helped = [units[_TOKEN.unpack_from(report, j)[0]].name
              for j in range(0, len(report) - 1, _TOKEN.size)]
    done.helper, done.helper_names = len(helped), helped
    done.seconds = time.perf_counter() - t0
    last_share = done
    return done


def _reap(pid: int) -> None:
    """Wait for the helper to exit, at most HELPER_DEADLINE; past it, stop it."""
    deadline = time.monotonic() + HELPER_DEADLINE
    while True:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished:
            return
        if time.monotonic() > deadline:
            import signal
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        time.sleep(0.002)
