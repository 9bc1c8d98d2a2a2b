"""The kernels' C functions compiled once, and a first start's compiling shared with helper
processes.

Every C function the runtime compiles (a parallel kernel's entry, ``launch``; the GEMMs' and
the gather's modules, ``llvm_loops.load_gemms`` and ``gather.load_entry``; the depthwise
sweep) is made by ``c_function``: a Numba ``cfunc`` in Numba's disk cache, made once per
process; every Numba function a binding binds (the launcher's loop, a few kernels of their
own) goes through ``entry_point``. With an empty cache, compiling them is most of a first
start (one function at a time, as Numba's compiler holds a lock). The executor finds out first what its program will compile, then compiles it on
several processes:

    with deferring():                  # slots' modules imported now are loaded at the end
        ...bind the steps...
        units = survey(bind_again)     # what the binding compiled: recorded, not compiled
        share(units)                   # compiled here and in forked helpers, into the cache
    ...bind for real: each unit loads from memory or from the cache...

``survey(fn)`` runs ``fn`` with every function missing from the cache recorded as a unit
and given as None (a C function: its callers then leave nothing behind, an address of 0 is
never kept) or ``not_compiled`` (a Numba function's entry point).
``share(units)`` forks helper processes where it is safe (Linux, one Python thread, Numba's
thread pool not launched yet), one for each CPU past the first (``jobs``;
``EQQUANT_COMPILE_JOBS``): the helpers and this process take units in turn from a pipe and
compile each into Numba's cache, and this one waits for the helpers' last. A unit no helper
finished is compiled here when the binding asks for it, so the outcome never depends on the
helpers: only the time does. The bits are the same: a unit is the same C function, compiled
by the same compiler, wherever.

Loads skip the refresh of Numba's typing and lowering registries that its cache makes first
(``_from_cache``): a warm start then sets up none of them.
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
_making = threading.RLock()   # (a CFunc is compiled once, whichever thread asks first)
_deferred: dict = {}      # name -> a slot module's loader, while deferring


class _State(threading.local):
    survey: list | None = None      # the units recorded, while this thread surveys
    deferring: int = 0              # open ``deferring`` blocks of this thread


_state = _State()
session = threading.RLock()   # held by the executor while it surveys and shares (one at a time)

JOBS_VARIABLE = "EQQUANT_COMPILE_JOBS"
DEFAULT_JOBS = 4          # (each helper holds a compiler's memory, some 100 MB, for seconds)
MAX_JOBS = 16
HELPER_DEADLINE = 600.0   # seconds a helper may take before it is stopped and ignored


@dataclass
class Unit:
    """A function to compile (``survey``'s): its name, its uncompiled CFunc or Numba
    dispatcher, and for a dispatcher, the argument types."""
    name: str
    function: object
    signature: tuple | None = None

    def compile(self) -> None:
        # (Numba's: from the cache where it is there, else compiled and saved; once: a
        # CFunc compiled again would drop the code its address points into)
        if self.signature is None:
            with _making:
                if self.function.address is None:
                    self.function.compile()
                    _compiled(self.function)
        elif self.signature not in self.function.overloads:
            self.function.compile(self.signature)

    @property
    def key(self) -> tuple:
        return id(self.function), self.signature


@dataclass
class Shared:
    """What ``share`` did: the units, the helper processes forked, how many units they
    compiled (and which), in how long."""
    units: int = 0
    helpers: int = 0
    by_helpers: int = 0
    helper_names: list = field(default_factory=list)
    seconds: float = 0.0


class Address(int):
    """A C function's address passed to a kernel as an integer (the depthwise sweep's), or
    the address of the cell holding one (a GEMM's slot, ``llvm_loops.slot_cell``): an
    integer that says what it points to, so that a program saved ahead of time
    (``eqquant.deploy``) can point it at the same code in its own library. ``function``: the
    CFunc (``c_function``'s) at the address; ``slot``: the slot's name, for a cell."""

    function = None
    slot = None

    def __new__(cls, value: int, function=None, slot: str | None = None):
        self = super().__new__(cls, value)
        self.function, self.slot = function, slot
        return self


# called with each C function compiled (in this process or a helper), while registered:
# what else a first start would do with its code is done there, on the helpers too
# (``eqquant.deploy`` keeps its position-independent object for the program's library)
compiled_hooks: list = []


def _compiled(c) -> None:
    for hook in list(compiled_hooks):
        hook(c)


def c_function(fn, signature, **options):
    """``fn`` as a C function of Numba type ``signature`` (Numba's ``cfunc``, in its disk
    cache): loaded from the cache or compiled, once per process (by ``fn``'s module and
    qualified name, as Numba's cache keys it). While ``survey`` runs, one the cache does not
    hold is recorded and None returned."""
    from numba.core import sigutils
    from numba.core.ccallback import CFunc
    key = (fn.__module__, fn.__qualname__, str(signature))
    with _making:
        c = _made.get(key)
        if c is None:
            c = _made[key] = CFunc(fn, sigutils.normalize_signature(signature), locals={},
                                   options=options)
            c.enable_caching()
        if c.address is not None:
            return c
        if _load(c):
            return c
        if _state.survey is not None:
            _state.survey.append(Unit(fn.__qualname__, c))
            return None
        c.compile()
        _compiled(c)
        return c


def made() -> dict:
    """The C functions ``c_function`` made in this process and compiled or loaded, by
    address (for a program saved ahead of time, ``eqquant.deploy``)."""
    with _making:
        return {c.address: c for c in _made.values() if c.address is not None}


def entry_point(dispatcher, signature: tuple):
    """The Numba function ``dispatcher``'s compiled entry point for argument types
    ``signature`` (loaded from the cache, ``_load_dispatcher``, or compiled). While
    ``survey`` runs, one the cache does not hold is recorded and ``not_compiled`` returned,
    and so is a parallel one (``prange``) that it holds: loading it would launch Numba's
    thread pool, and a process with threads is not forked."""
    known = dispatcher.overloads.get(signature)
    if known is not None:
        return known.entry_point
    surveying = _state.survey is not None
    if not (surveying and dispatcher.targetoptions.get("parallel")):
        loaded = _load_dispatcher(dispatcher, signature)
        if loaded is not None:
            return loaded
    if surveying:
        if not _cached(dispatcher, signature):
            _state.survey.append(Unit(dispatcher.py_func.__qualname__, dispatcher,
                                      signature))
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


def _from_cache(cache, signature, context):
    """What Numba's disk cache holds for ``signature``, or None: its ``load_overload``
    without the refresh of the context's typing and lowering registries it makes first
    (most of a warm start's loading, the first time: loading compiled code uses
    none of them, and a compile refreshes them itself), Numba's runtime (NRT) set up as that
    refresh would, for code that allocates."""
    from numba.core.runtime import rtsys
    rtsys.initialize(context)
    try:
        return cache._load_overload(signature, context)
    except OSError:             # (as load_overload's guard: read as not cached)
        return None


def _load_dispatcher(dispatcher, signature: tuple):
    """``dispatcher`` for ``signature`` loaded from the disk cache as its ``compile`` would
    (``_from_cache``): its entry point, or None where the cache lacks it."""
    from numba.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        known = dispatcher.overloads.get(signature)
        if known is not None:
            return known.entry_point
        try:
            found = _from_cache(dispatcher._cache, signature, dispatcher.targetctx)
        except AttributeError:  # (no disk cache: compiled where asked)
            return None
        if found is None:
            return None
        if not found.objectmode:
            dispatcher.targetctx.insert_user_function(found.entry_point, found.fndesc,
                                                      [found.library])
        dispatcher.add_overload(found)
        return found.entry_point


def _load(c) -> bool:
    """Load ``c`` (a CFunc) from Numba's disk cache, as ``CFunc.compile`` does first
    (``_from_cache``); whether the cache held it."""
    from numba.core.compiler_lock import global_compiler_lock
    with global_compiler_lock:
        try:
            found = _from_cache(c._cache, c._sig, c._targetdescr.target_context)
        except AttributeError:     # (a Numba whose CFunc differs: compiled where asked)
            c.compile()
            return True
        if found is None:
            return False
        c._library = found.library
        c._wrapper_name = found.fndesc.llvm_cfunc_wrapper_name
        c._wrapper_address = c._library.get_pointer_to_function(c._wrapper_name)
        return True


def survey(fn) -> list[Unit]:
    """Run ``fn()`` with the functions missing from the cache recorded, not compiled (a C
    function's caller gets None, a Numba function's ``not_compiled``), and the deferred
    loaders tried; the units recorded, each once."""
    outer, _state.survey = _state.survey, []
    try:
        fn()
        load_deferred()
        units, seen = [], set()
        for u in _state.survey:
            if u.key not in seen:
                seen.add(u.key)
                units.append(u)
        return units
    finally:
        _state.survey = outer


def defer(name: str, load) -> None:
    """Run ``load()`` (a slot module's: it compiles or loads C functions and fills their
    slots) now, or at the end of ``deferring`` while one is open (its units then join the
    survey); ``load`` returns whether it loaded."""
    if _state.deferring:
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
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring:
            load_deferred()


def jobs() -> int:
    """How many processes compile a first start's units: ``EQQUANT_COMPILE_JOBS`` (1: this
    process alone; n: n - 1 helpers too, at most MAX_JOBS in all), else as many as the CPUs
    this process may run on, at most DEFAULT_JOBS."""
    value = os.environ.get(JOBS_VARIABLE, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            from ...errors import EqquantError
            raise EqquantError(f"{JOBS_VARIABLE}={value!r}: expected a whole number of "
                               "processes, 1 or more")
        return min(int(value), MAX_JOBS)
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, DEFAULT_JOBS))


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
    allow, in forked helpers: each process takes the next unit from a pipe until none is
    left; this one then waits for the helpers (at most HELPER_DEADLINE). What a helper
    compiled, this process loads from the cache when its binding asks. Interrupted (an
    error here, Ctrl-C), this process stops the helpers first."""
    t0 = time.perf_counter()
    done = Shared(units=len(units))
    helpers = min(jobs() - 1, len(units) - 1)   # (read first: a wrong value is an error,
    pids: list[int] = []                        # with a cache warm too)
    if helpers > 0 and len(units) <= MAX_SHARED and can_fork():
        todo_r, todo_w = os.pipe()       # (all tokens fit in the pipe: MAX_SHARED)
        report_r, report_w = os.pipe()
        os.write(todo_w, b"".join(_TOKEN.pack(i) for i in range(len(units))))
        os.close(todo_w)
        for _ in range(helpers):
            try:
                pid = os.fork()
            except OSError:              # (no memory or process left: fewer helpers)
                break
            if pid == 0:
                _helper(units, todo_r, report_r, report_w)      # (never returns)
            pids.append(pid)
        if not pids:
            for fd in (todo_r, report_r, report_w):
                os.close(fd)
    if not pids:
        for u in units:
            u.compile()
        done.seconds = time.perf_counter() - t0
        return done
    os.close(report_w)
    try:
        while token := os.read(todo_r, _TOKEN.size):
            units[_TOKEN.unpack(token)[0]].compile()
    except BaseException:
        for pid in pids:
            _stop(pid)
        raise
    finally:
        os.close(todo_r)
        deadline = time.monotonic() + HELPER_DEADLINE
        for pid in pids:
            _reap(pid, deadline)
        report = b""
        while chunk := os.read(report_r, 4096):
            report += chunk
        os.close(report_r)
    helped = [units[_TOKEN.unpack_from(report, j)[0]].name
              for j in range(0, len(report) - 1, _TOKEN.size)]
    done.helpers, done.by_helpers, done.helper_names = len(pids), len(helped), helped
    done.seconds = time.perf_counter() - t0
    return done


MAX_SHARED = 4096     # units shared at most (their tokens fill 8 KB of a pipe's 64)


def _helper(units: list[Unit], todo_r: int, report_r: int, report_w: int) -> None:
    """A forked helper: compile the units whose tokens it reads, report each done, exit
    (quietly: what it would print, this process prints when it compiles the unit again). A
    unit that fails is left to this process; Ctrl-C ends the helper."""
    try:
        os.close(report_r)
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        while token := os.read(todo_r, _TOKEN.size):
            try:
                units[_TOKEN.unpack(token)[0]].compile()
            except Exception:
                continue
            os.write(report_w, token)
    finally:
        os._exit(0)


def _stop(pid: int) -> None:
    import signal
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _reap(pid: int, deadline: float) -> None:
    """Wait for a helper to exit, until ``deadline`` (``time.monotonic``); past it, stop
    it."""
    while True:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        if finished:
            return
        if time.monotonic() > deadline:
            _stop(pid)
            os.waitpid(pid, 0)
            return
        time.sleep(0.002)
