"""A first start's compiling (``runtime/codegen/compiling.py``): what binding a program compiles is
found first (``survey``), without compiling it and without leaving anything half-made
behind, then compiled here and in forked helpers (``share``); the program computes the
same bits whichever process compiled what, and the next process finds it all in the
cache and loads it without Numba's registry refresh."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from eqquant.runtime.codegen import compiling
from eqquant.runtime.lowering.fp32 import entry_point
from eqquant.runtime.codegen.launch import parallel, share
from eqquant.runtime.codegen.serial import twin


def _double(thread, threads, args):
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = 2 * x[i]


def _new_kernel():
    """A parallel kernel no cache holds yet (its name is new at each call)."""
    return parallel(twin(_double, "_" + uuid.uuid4().hex[:12]))


def test_a_survey_records_what_binding_would_compile_and_keeps_nothing_of_it():
    kernel = _new_kernel()
    x, out = np.arange(10, dtype=np.int64), np.zeros(10, np.int64)
    units = compiling.survey(lambda: kernel.bind((x, out), entry_point))
    # (the launcher's own loop may be a unit too, where this process has not loaded it)
    assert [kernel.__name__ in u.name for u in units].count(True) == 1
    assert not kernel._entries and not kernel._calls      # no address 0 kept
    # a kernel may be bound while surveying, never run
    with pytest.raises(RuntimeError, match="survey"):
        compiling.survey(lambda: kernel(x, out))
    shared = compiling.share(units)
    assert shared.units == len(units)
    kernel(x, out)                  # the unit's own C function, compiled once
    np.testing.assert_array_equal(out, 2 * x)
    assert next(iter(kernel._entries.values())) in [u.function for u in units]
    # surveyed again, it is known: nothing to compile
    assert compiling.survey(lambda: kernel.bind((x, out), entry_point)) == []


def test_a_unit_met_twice_is_compiled_once():
    kernel = _new_kernel()
    x, out = np.arange(4.0), np.zeros(4)

    def twice():
        kernel.bind((x, out), entry_point)
        kernel.serial.bind((x, out), entry_point)
    units = compiling.survey(twice)
    assert [kernel.__name__ in u.name for u in units].count(True) == 1


def test_a_survey_in_one_thread_leaves_the_others_compiling():
    import threading
    mine, theirs = _new_kernel(), _new_kernel()
    x, out = np.arange(6, dtype=np.int64), np.zeros(6, np.int64)
    done = []

    def elsewhere():
        theirs(x, out)              # compiled (not recorded) although a survey runs here
        done.append(out.copy())

    def bind_and_wait():
        mine.bind((x, out), entry_point)
        t = threading.Thread(target=elsewhere)
        t.start()
        t.join()
    units = compiling.survey(bind_and_wait)
    assert [mine.__name__ in u.name for u in units].count(True) == 1
    assert not [u for u in units if theirs.__name__ in u.name]
    np.testing.assert_array_equal(done[0], 2 * x)


def _total(x):
    s = 0.0
    for i in range(x.size):
        s += x[i]
    return s


def test_a_survey_records_numba_functions_missing_from_the_cache_and_binds_none():
    from numba import njit
    fn = njit(cache=True)(twin(_total, "_" + uuid.uuid4().hex[:12]))
    x = np.arange(5.0)
    got = []
    units = compiling.survey(lambda: got.append(entry_point(fn, (x,))))
    assert got == [compiling.not_compiled] and len(units) == 1
    assert units[0].signature == (fn.typeof_pyval(x),) and not fn.overloads
    with pytest.raises(RuntimeError, match="survey"):
        got[0](x)
    compiling.share(units)
    assert entry_point(fn, (x,))(x) == 10.0


def test_loaders_deferred_run_when_the_block_ends_even_on_an_error():
    ran = []
    with pytest.raises(KeyError):
        with compiling.deferring():
            compiling.defer("test loader", lambda: ran.append(1) or True)
            assert ran == []
            raise KeyError("a failed binding")
    assert ran == [1]
    compiling.defer("test loader", lambda: ran.append(2) or True)   # outside: at once
    assert ran == [1, 2]


@pytest.mark.parametrize("value, want", [("1", 1), ("2", 2), ("8", 8), ("99", 16)])
def test_compile_jobs_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv(compiling.JOBS_VARIABLE, value)
    assert compiling.jobs() == want


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_wrong_compile_jobs_value_is_refused_clearly(monkeypatch, value):
    from eqquant.errors import EqquantError
    monkeypatch.setenv(compiling.JOBS_VARIABLE, value)
    with pytest.raises(EqquantError, match=compiling.JOBS_VARIABLE):
        compiling.jobs()
    with pytest.raises(EqquantError, match=compiling.JOBS_VARIABLE):
        compiling.share([])         # (whether or not anything is to compile)


_FIRST_START = """
import json, sys
import numpy as np
from numba.core import base
refreshes = []
_refresh = base.BaseContext.refresh
base.BaseContext.refresh = lambda self: refreshes.append(1) or _refresh(self)
from eqquant.optimizer import optimize
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build
m = build("resnet18_stem", image_size=32)
r = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
             "simplify; bn_fold; simplify; fusion")
from eqquant.quant.flow import compile_layouts
ex = Executor(compile_layouts(r.module, "cpu").module)   # (as the pipeline runs it)
from numba.core import ccallback, dispatcher
at_run = []
for cls in (ccallback.CFunc, dispatcher.Dispatcher):
    cls.compile = (lambda f: lambda *a: at_run.append(1) or f(*a))(cls.compile)
np.save(sys.argv[1], ex.run(m.inputs))
c = ex.compiled
print(json.dumps({"units": c.units, "helper": c.by_helpers, "refreshed": bool(refreshes),
                  "compiled at run": len(at_run)}))
"""


def _first_start(cache, out, jobs: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), EQQUANT_COMPILE_JOBS=jobs)
    done = subprocess.run([sys.executable, "-c", _FIRST_START, str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


_MANY_HELPERS = """
import json, sys
import numpy as np
from numba import njit
from eqquant.runtime.codegen import compiling
from eqquant.runtime.lowering.fp32 import entry_point
from eqquant.runtime.codegen.serial import twin

def total(x):
    s = 0.0
    for i in range(x.size):
        s += x[i]
    return s

fns = [njit(cache=True)(twin(total, f"_{i}")) for i in range(8)]
x = np.arange(3.0)
units = compiling.survey(lambda: [entry_point(f, (x,)) for f in fns])
shared = compiling.share(units)
here = [u.name for u in units if u.signature in u.function.overloads]
print(json.dumps({"units": len(units), "helpers": shared.helpers, "here": here,
                  "helped": shared.helper_names, "sums": [entry_point(f, (x,))(x) for f in fns]}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux only")
def test_units_are_shared_among_as_many_helpers_as_asked_and_each_compiled_once(tmp_path):
    """Three helpers and this process take the units from one pipe: each unit is compiled
    by one of them (a helper's reported, the rest here), none twice, and every one runs."""
    script = tmp_path / "many_helpers.py"      # (a file: Numba caches no "-c" function)
    script.write_text(_MANY_HELPERS)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), EQQUANT_COMPILE_JOBS="4")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["units"] == 8 and got["helpers"] == 3, got
    assert sorted(got["here"] + got["helped"]) == sorted(f"total_{i}" for i in range(8))
    assert got["sums"] == [3.0] * 8


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux only")
def test_a_first_start_compiled_on_two_processes_gives_the_same_bits(tmp_path):
    """With an empty cache, a helper process compiles some of the program's units; the
    output is the same bits as with one process; a second start finds every unit in the
    cache (none lost, none compiled again)."""
    two = _first_start(tmp_path / "two", tmp_path / "two.npy", "2")
    assert two["units"] >= 2 and two["helper"] >= 1, two
    # all of it before the first run, the steps reading the input too (bound ahead)
    assert two["compiled at run"] == 0, two
    one = _first_start(tmp_path / "one", tmp_path / "one.npy", "1")
    assert one["units"] == two["units"] and one["helper"] == 0, one
    assert np.load(tmp_path / "two.npy").tobytes() == np.load(tmp_path / "one.npy").tobytes()
    again = _first_start(tmp_path / "two", tmp_path / "again.npy", "2")
    # all loaded, none compiled, and loaded without refreshing Numba's registries
    # (compiling._from_cache: most of a warm start's loading)
    assert again == {"units": 0, "helper": 0, "refreshed": False, "compiled at run": 0}
    assert np.load(tmp_path / "again.npy").tobytes() == np.load(tmp_path / "one.npy").tobytes()


_HELPER_FAILS = """
import json, os, sys, time
from eqquant.runtime.codegen import compiling
parent, log = os.getpid(), sys.argv[1]


class Fake:
    def __init__(self, name, fail=None):
        self.name, self.fail = name, fail

    def compile(self):
        if self.fail == "helper dies" and os.getpid() != parent:
            os._exit(3)
        if self.fail == "error here" and os.getpid() == parent:
            raise ValueError("a compile error")
        time.sleep(0.05)
        with open(log, "a") as f:
            f.write(f"{self.name} {'here' if os.getpid() == parent else 'helper'}\\n")


shared = compiling.share([Fake(f"u{i}", "helper dies" if i == 1 else None) for i in range(8)])
try:
    compiling.share([Fake(f"v{i}", "error here" if i < 2 else None) for i in range(40)])
    raised = False
except ValueError:
    raised = True
try:
    os.waitpid(-1, os.WNOHANG)
    children = True
except ChildProcessError:
    children = False
print(json.dumps({"helpers": shared.helpers, "by_helpers": shared.by_helpers,
                  "raised": raised, "children left": children}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks on Linux only")
def test_a_helper_that_dies_or_an_error_here_leaves_no_unit_twice_and_no_process(tmp_path):
    """A helper that dies on a unit costs that unit only (the binding compiles it when it
    asks); an error here stops the helper and is raised; no process is left behind."""
    log = tmp_path / "log"
    env = dict(os.environ, EQQUANT_COMPILE_JOBS="2")
    done = subprocess.run([sys.executable, "-c", _HELPER_FAILS, str(log)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got == {"helpers": 1, "by_helpers": got["by_helpers"], "raised": True,
                   "children left": False}, got
    names = [line.split()[0] for line in log.read_text().splitlines()]
    first = [n for n in names if n.startswith("u")]
    assert len(first) == len(set(first))        # none twice
    assert set(first) >= {f"u{i}" for i in range(8)} - {"u1"}
    assert len(names) == len(set(names))
