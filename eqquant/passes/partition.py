"""The partition view: a program printed as the seed's MergeComposite/PartitionGraph output,
each fused op (and each op of the pattern table) as an inline composite function called with
its arguments::

    %0 = fn (%FunctionVar_0_0: T, %FunctionVar_0_1: W, %FunctionVar_0_2: B,
             PartitionedFromPattern="nn.conv2d_add_nn.relu_",
             Composite="ccompiler.conv_add_relu") -> T2 {
      %0 = nn.conv2d(%FunctionVar_0_0, %FunctionVar_0_1, ...);
      %1 = add(%0, %FunctionVar_0_2);
      nn.relu(%1)
    };
    %1 = %0(%data, meta[relay.Constant][0], meta[relay.Constant][1]);

It is a view: running it (the interpreter inlines composites) gives the same values, and
``passes.inline.inline_calls`` turns it back into plain ops.
"""
from __future__ import annotations

from ..core.nodes import Call, Expr, Function, Module, Var, freeze_attrs, post_order, rewrite
from ..ir.typecheck import infer_types

# op -> composite name: the seed-004 pattern table
PATTERN_TABLE = {
    "fused.conv2d": "ccompiler.conv_add_relu",
    "nn.conv2d": "ccompiler.conv_add_relu",
    "nn.max_pool2d": "ccompiler.max_pool2d",
    "add": "ccompiler.add",
}


def _pattern_name(body: Expr) -> str:
    return "".join(f"{n.op_name}_" for n in post_order(body)
                   if isinstance(n, Call) and n.op_name)


def partition_view(mod: Module, table: dict[str, str] | None = None) -> Module:
    table = PATTERN_TABLE if table is None else table
    types = infer_types(mod)
    counter = [0]

    def visit(node, children):
        if not isinstance(node, Call) or isinstance(node.op, Expr) or node.op_name not in table:
            return None
        k = counter[0]
        counter[0] += 1
        params = tuple(Var(name=f"FunctionVar_{k}_{i}", type=types[id(a)])
                       for i, a in enumerate(node.args))
        if node.op.unfuse is not None:
            body = node.op.unfuse(params, node.attrs)
        else:
            body = Call(op=node.op, args=params, attrs=node.attrs)
        fn = Function(params=params, body=body, ret_type=types[id(node)],
                      attrs=freeze_attrs({"PartitionedFromPattern": _pattern_name(body),
                                          "Composite": table[node.op_name]}))
        return Call(op=fn, args=children, name=node.name)

    main = mod.main
    body = rewrite(main.body, visit)
    return Module({"main": Function(params=main.params, body=body, ret_type=main.ret_type)},
                  version=mod.version)
