"""Inline every call of a function value or a global function (TVM's DefuseOps and Inline):
the e-graph sees one flat dataflow graph.

    %5 = fn (%p: T, Composite="...") { nn.relu(%p) };  %5(%x)    ==>    nn.relu(%x)
"""
from __future__ import annotations

from ..errors import EqquantError
from ..core.nodes import Call, Expr, Function, GlobalVar, Module, rewrite


def substitute(body: Expr, env: dict[int, Expr]) -> Expr:
    return rewrite(body, lambda node, children: env.get(id(node)))


def inline_calls(mod: Module, entry: str = "main") -> Module:
    active: list[str] = []

    def inline(fn: Function) -> Expr:
        def visit(node, children):
            if not isinstance(node, Call) or not isinstance(node.op, Expr):
                return None
            callee, args = children[-1], children[:-1]
            if isinstance(callee, GlobalVar):
                if callee.name in active:
                    raise EqquantError(f"@{callee.name} is recursive; it cannot be inlined",
                                       callee.loc)
                active.append(callee.name)
                target = mod.functions[callee.name]
                body = inline(target)
                active.pop()
                return substitute(body, {id(p): a for p, a in zip(target.params, args)})
            if isinstance(callee, Function):
                return substitute(callee.body, {id(p): a for p, a in zip(callee.params, args)})
            raise EqquantError("a call of a value that is not a known function cannot be "
                               "inlined", node.loc)
        return rewrite(fn.body, visit)

    main = mod.functions[entry]
    active.append(entry)
    body = inline(main)
    new_main = Function(params=main.params, body=body, ret_type=main.ret_type, attrs=main.attrs,
                        loc=main.loc)
    return Module({entry: new_main}, version=mod.version)
