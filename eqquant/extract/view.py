"""The serialized e-graph as Python data, with the types of its classes.

egglog's own extraction breaks on residual graphs (its tree costs double-count shared values
and overflow; printing extracted terms is exponential), so eqquant reads the serialized e-graph
(``EGraph.serialize(...).to_json()``) into an :class:`EGraphView` and extracts here, where cost
models see every node's op, attributes, input types and output type.

A class's type is inferred from any of its nodes with the registry's type relations. A *weak*
scalar (``(Scalar "1e-05" "weak")``, made by a rule) has the type :data:`WEAK` and takes the
dtype of the operand it is combined with. Nodes whose types do not check (a rule may build
alternatives that are ill-typed in some context) are marked and never extracted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..ir.types import TensorType, TupleType, Type
from ..ops.registry import OpDef, OpTypeError
from ..egraph.schema import OP_PREFIX, decode_attr, schema

WEAK = TensorType((), "weak")


@dataclass
class ENode:
    kind: str                      # "op", "Input", "Const", "Scalar", "MkTuple", "GetItem"
    children: tuple[str, ...]      # classes of the expression operands
    op: OpDef | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    value: Any = None              # input name, constant index, (text, dtype), item index
    node_id: str = ""

    @property
    def label(self) -> str:
        return self.op.name if self.op is not None else self.kind


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return json.loads(text)
    return text


class EGraphView:
    def __init__(self, data: dict, input_types: dict[str, Type], const_types: dict[int, Type]):
        self.input_types, self.const_types = input_types, const_types
        nodes = data["nodes"]
        self.node_class = {nid: n["eclass"] for nid, n in nodes.items()}
        self.classes: dict[str, list[ENode]] = {}
        # a class bound by several lets lists them all: "$e3, $e7"
        self.lets: dict[str, str] = {c: d["let"].split(",")[0].strip()
                                     for c, d in data.get("class_data", {}).items() if "let" in d}
        lists: dict[str, list[str]] = {}
        sch = schema()
        self.demanded: set[str] = set()   # classes in need-types
        self.root: str | None = None      # the class of the program's result
        self.has_types: set[str] = set()  # classes with type facts written
        for nid, n in nodes.items():
            op, kids = n["op"], n["children"]
            cls = n["eclass"]
            if op == "need-types":
                self.demanded.add(nodes[kids[0]]["eclass"])
            elif op == "is-root":
                self.root = nodes[kids[0]]["eclass"]
            elif op == "type-of":
                self.has_types.add(nodes[kids[0]]["eclass"])
            elif op == "ECons":
                lists[cls] = kids
            elif op == "ENil":
                lists[cls] = []
        for nid, n in nodes.items():
            node = self._decode(nid, n, nodes, lists, sch)
            if node is not None:
                self.classes.setdefault(n["eclass"], []).append(node)
        self.types: dict[str, Type] = {}
        self.order: list[str] = []       # classes, operands before users
        self.bad: set[str] = set()       # node ids whose type does not check
        self.const: set[str] = set()
        self.const_node: dict[str, ENode] = {}
        self._infer()

    # -- decoding ------------------------------------------------------------------------------
    def _prim(self, nodes: dict, nid: str) -> str:
        return nodes[nid]["op"]

    def _list(self, cls: str, nodes: dict, lists: dict[str, list[str]]) -> tuple[str, ...]:
        out = []
        while True:
            kids = lists.get(cls)
            if not kids:
                return tuple(out)
            head, tail = kids
            out.append(self.node_class[head])
            cls = self.node_class[tail]

    def _decode(self, nid: str, n: dict, nodes: dict, lists, sch) -> ENode | None:
        op, kids = n["op"], n["children"]
        if op.startswith(OP_PREFIX):
            opdef = sch.op(op)
            k = len(opdef.inputs)
            attrs = {}
            for spec, child in zip(opdef.attrs, kids[k:]):
                attrs[spec.name] = decode_attr(spec, _unquote(self._prim(nodes, child)))
            return ENode("op", tuple(self.node_class[c] for c in kids[:k]), opdef, attrs,
                         node_id=nid)
        if op == "Input":
            return ENode("Input", (), value=_unquote(self._prim(nodes, kids[0])), node_id=nid)
        if op == "Const":
            return ENode("Const", (), value=int(self._prim(nodes, kids[0])), node_id=nid)
        if op == "Scalar":
            return ENode("Scalar", (), value=(_unquote(self._prim(nodes, kids[0])),
                                              _unquote(self._prim(nodes, kids[1]))), node_id=nid)
        if op == "GetItem":
            return ENode("GetItem", (self.node_class[kids[0]],),
                         value=int(self._prim(nodes, kids[1])), node_id=nid)
        if op == "MkTuple":
            return ENode("MkTuple", self._list(self.node_class[kids[0]], nodes, lists),
                         node_id=nid)
        return None  # analyses (type-of, is-const, ...) and list cells

    # -- types and constness -------------------------------------------------------------------
    def node_type(self, node: ENode) -> Type | None:
        """The type of ``node`` from its children's types; None if they are not known yet;
        raises OpTypeError when they do not check."""
        if node.kind == "Input":
            return self.input_types[node.value]
        if node.kind == "Const":
            return self.const_types[node.value]
        if node.kind == "Scalar":
            dtype = node.value[1]
            return WEAK if dtype == "weak" else TensorType((), dtype)
        kids = [self.types.get(c) for c in node.children]
        if any(k is None for k in kids):
            return None
        if node.kind == "MkTuple":
            if any(k == WEAK for k in kids):
                raise OpTypeError("a weak scalar cannot stand in a tuple")
            return TupleType(tuple(kids))
        if node.kind == "GetItem":
            t = kids[0]
            if not isinstance(t, TupleType) or node.value >= len(t.fields):
                raise OpTypeError(f"projection .{node.value} of {t}")
            return t.fields[node.value]
        return node.op.type_rel(resolve_weak(kids), node.attrs)

    def _infer(self) -> None:
        """Types, then constness, by worklists: a node is looked at once all its operand
        classes are known, so this is linear in the size of the e-graph."""
        parents: dict[str, list[tuple[str, ENode]]] = {}
        waiting: dict[str, int] = {}
        ready: list[tuple[str, ENode]] = []
        for cls, nodes in self.classes.items():
            for node in nodes:
                kids = set(node.children)
                waiting[node.node_id] = len(kids)
                for k in kids:
                    parents.setdefault(k, []).append((cls, node))
                if not kids:
                    ready.append((cls, node))
        typed_queue: list[str] = []
        while ready or typed_queue:
            while ready:
                cls, node = ready.pop()
                if cls in self.types:
                    self._check(node)
                    continue
                t = self._check(node)
                if t is not None:
                    self.types[cls] = t
                    self.order.append(cls)
                    typed_queue.append(cls)
            while typed_queue and not ready:
                cls = typed_queue.pop()
                for pcls, pnode in parents.get(cls, ()):
                    waiting[pnode.node_id] -= 1
                    if waiting[pnode.node_id] == 0:
                        ready.append((pcls, pnode))
        # constness: a class is constant when one of its nodes has only constant operands
        # (const_node: the node that made it so; its operands were constant first, so these
        # choices never form a cycle)
        pending = {n.node_id: len(set(n.children)) for ns in self.classes.values() for n in ns}
        queue = []
        for cls, ns in self.classes.items():
            leaf = next((n for n in ns if n.kind in ("Const", "Scalar")), None)
            if leaf is not None:
                self.const_node[cls] = leaf
                queue.append(cls)
        while queue:
            cls = queue.pop()
            for pcls, pnode in parents.get(cls, ()):
                pending[pnode.node_id] -= 1
                if pending[pnode.node_id] == 0 and pcls not in self.const_node \
                        and pnode.node_id not in self.bad:
                    self.const_node[pcls] = pnode
                    queue.append(pcls)
        self.const.update(self.const_node)

    def _check(self, node: ENode) -> Type | None:
        try:
            return self.node_type(node)
        except (OpTypeError, KeyError, IndexError):
            self.bad.add(node.node_id)
            return None

    def input_types_of(self, node: ENode) -> list[Type]:
        return resolve_weak([self.types[c] for c in node.children])

    def size(self) -> tuple[int, int]:
        return sum(len(v) for v in self.classes.values()), len(self.classes)


def resolve_weak(types: list[Type]) -> list[Type]:
    """Weak scalars take the dtype of the first tensor operand that is not weak."""
    if not any(t == WEAK for t in types):
        return types
    strong = next((t for t in types if isinstance(t, TensorType) and t != WEAK), None)
    if strong is None:
        raise OpTypeError("no operand gives a dtype to the weak scalar")
    return [TensorType((), strong.dtype) if t == WEAK else t for t in types]
