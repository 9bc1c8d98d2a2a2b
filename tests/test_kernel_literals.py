"""A Numba kernel called from another with a literal integer is compiled for that literal
(``Literal[int](0)``) besides the plain integer type: a second variant of it and of all it
calls, each through LLVM again. A lone image's branch of the AVX2 convolution drivers passed
0 as its image and first pixel, and compiled the gather, the high-bit lists and the residual
sum twice: about 10 s of a cold start."""
import ast
import importlib
import inspect
import textwrap

import pytest
from numba.core.registry import CPUDispatcher

from eqquant.runtime.codegen.launch import Parallel

MODULES = ["avx2", "vnni", "fma", "gather", "int8",
           "fp32", "depthwise", "pools"]


def _literal_calls(module):
    """(caller, callee, line) for each call of a kernel (not one inlined by Numba's front
    end) with a literal integer argument, in the kernels of ``module``."""
    found = []
    for name, caller in vars(module).items():
        if isinstance(caller, Parallel):
            caller = caller.part        # (its own source: the share of one thread)
        if not isinstance(caller, CPUDispatcher) or caller.py_func.__module__ != module.__name__:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(caller.py_func)))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            callee = caller.py_func.__globals__.get(node.func.id)
            if not isinstance(callee, CPUDispatcher):
                continue
            if callee.targetoptions.get("inline") == "always":
                continue       # typed in its caller's code: no variant of its own
            args = list(node.args) + [k.value for k in node.keywords]
            if any(isinstance(a, ast.Constant) and type(a.value) is int for a in args):
                line = caller.py_func.__code__.co_firstlineno + node.lineno - 1
                found.append((name, node.func.id, line))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_no_kernel_passes_a_literal_integer_to_another(name):
    module = importlib.import_module(f"eqquant.runtime.kernels.{name}")
    assert _literal_calls(module) == []


def test_the_check_sees_a_literal_argument(tmp_path, monkeypatch):
    """(the check itself: a kernel that passes 0 to another is found, one that passes a
    variable is not)"""
    (tmp_path / "literal_probe.py").write_text(textwrap.dedent("""\
        from numba import njit

        @njit
        def callee(a, p0):
            return a + p0

        @njit
        def caller(a):
            return callee(a, 0) + callee(a, a)

        @njit
        def fine(a):
            return callee(a, a)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.import_module("literal_probe")
    assert _literal_calls(probe) == [("caller", "callee", 9)]
