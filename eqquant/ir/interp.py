"""The reference interpreter: runs a module with the registry's numpy semantics.

It is the semantic ground truth for every other stage (rules, constant folding, kernels):

    out = run(mod, {"data": x}, params)   # params: name -> array, for unbound parameters

Each value is freed after its last use, so large models run in bounded memory.
"""
from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import EvalError
from ..core.nodes import (Call, Constant, Expr, Function, GlobalVar, Module, Scalar, Tuple,
                          TupleGetItem, Var, post_order)
from ..core.types import check_input


@dataclass
class _Closure:
    fn: Function
    env: Mapping[int, Any]


class Interpreter:
    """``observe(node, value)``, if given, sees every value computed (for calibration)."""

    def __init__(self, mod: Module, observe=None):
        self.mod = mod
        self.observe = observe

    def call_function(self, fn: Function, args: list[Any], env: Mapping[int, Any]) -> Any:
        scope: dict[int, Any] = {id(p): a for p, a in zip(fn.params, args)}
        return self.eval(fn.body, ChainMap(scope, dict(env)))

    def eval(self, root: Expr, env: Mapping[int, Any]) -> Any:
        order = post_order(root)
        uses: dict[int, int] = {}
        for node in order:
            for c in node.children():
                uses[id(c)] = uses.get(id(c), 0) + 1
        values: dict[int, Any] = {}
        for node in order:
            if id(node) in env:
                values[id(node)] = env[id(node)]
                continue
            values[id(node)] = self.node(node, values, env)
            if self.observe is not None:
                self.observe(node, values[id(node)])
            for c in node.children():
                uses[id(c)] -= 1
                if uses[id(c)] == 0 and c is not root:
                    values.pop(id(c), None)
        return values[id(root)]

    def node(self, node: Expr, values: dict[int, Any], env: Mapping[int, Any]) -> Any:
        if isinstance(node, Var):
            raise EvalError(f"%{node.name} has no value (is it an input?)", node.loc)
        if isinstance(node, Constant):
            if node.data is None:
                raise EvalError(f"meta[relay.Constant][{node.index}] has no value: load the "
                                "params file with the program", node.loc)
            return node.data
        if isinstance(node, Scalar):
            return node.data
        if isinstance(node, GlobalVar):
            return _Closure(self.mod.functions[node.name], {})
        if isinstance(node, Function):
            return _Closure(node, env)
        if isinstance(node, Tuple):
            return tuple(values[id(f)] for f in node.fields)
        if isinstance(node, TupleGetItem):
            return values[id(node.tuple)][node.index]
        if isinstance(node, Call):
            args = [values[id(a)] for a in node.args]
            if isinstance(node.op, Expr):
                closure = values[id(node.op)]
                return self.call_function(closure.fn, args, closure.env)
            try:
                return node.op.semantics(*args, **node.attrs)
            except (ValueError, IndexError, FloatingPointError, ZeroDivisionError) as e:
                raise EvalError(f"{node.op.name} failed: {e}", node.loc) from None
        raise EvalError(f"cannot evaluate {type(node).__name__}", getattr(node, "loc", None))


def run(mod: Module, inputs: Mapping[str, Any] | None = None,
        params: Mapping[str, np.ndarray] | None = None, entry: str = "main",
        observe=None) -> Any:
    """Evaluate ``entry`` with its parameters taken from ``inputs`` then ``params``."""
    fn = mod.functions[entry]
    given = {**(params or {}), **(inputs or {})}
    args, sizes = [], {}
    for p in fn.params:
        if p.name not in given:
            raise EvalError(f"no value for %{p.name}: give it as an input or in the params",
                            p.loc)
        args.append(check_input(p.name, given[p.name], p.type, sizes))
    with np.errstate(all="ignore"):
        return Interpreter(mod, observe).call_function(fn, args, {})
