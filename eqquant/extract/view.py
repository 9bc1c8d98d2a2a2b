"""The serialized e-graph as Python data, with the types of its classes.

egglog's own extraction breaks on residual graphs (its tree costs double-count shared values
and overflow; printing extracted terms is exponential), so eqquant reads the serialized e-graph
(``EGraph.serialize(...).to_json()``) into an :class:`EGraphView` and extracts here, where cost
models see every node's op, attributes, input types and output type.

A class's type is the one the e-graph's type analysis gave it (``type-of``, see
``egraph/analysis.py``). A *weak* scalar (``(Scalar "1e-05" "weak")``, made by a rule) has the
type :data:`WEAK` and takes the dtype of the operand it is combined with. Nodes whose own types
do not check (a rule may build alternatives that are ill-typed in some context) are marked
and never extracted: each node is checked once here, against the analysis's memo.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..egraph.analysis import ILL_TYPED, WEAK, Typer, resolve_weak, type_of_text
from ..egraph.schema import OP_PREFIX, decode_attr, schema
from ..core.types import Type
from ..ops.registry import OpDef


@dataclass
class ENode:
    kind: str                      # "op", "Input", "Const", "Scalar", "MkTuple", "GetItem"
    children: tuple[str, ...]      # classes of the expression operands
    op: OpDef | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    value: Any = None              # input name, constant index, (text, dtype), item index
    node_id: str = ""
    attr_texts: tuple[str, ...] = ()   # the attributes as egglog holds them (the typer's key)

    @property
    def label(self) -> str:
        return self.op.name if self.op is not None else self.kind


@lru_cache(maxsize=65536)   # (the same texts recur across thousands of nodes)
def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return json.loads(text)
    return text


class EGraphView:
    @classmethod
    def of(cls, session) -> "EGraphView":
        """The view of an ``egraph.engine.EGraphSession``, typed by its analysis."""
        return cls(session.serialized(), session.typer)

    def __init__(self, data: dict, typer: Typer):
        self.typer = typer
        self._attr_memo: dict[tuple[int, str], Any] = {}
        nodes = data["nodes"]
        self.node_class = {nid: n["eclass"] for nid, n in nodes.items()}
        self.classes: dict[str, list[ENode]] = {}
        # a class bound by several lets lists them all: "$e3_, $e7_"
        self.lets: dict[str, str] = {c: d["let"].split(",")[0].strip()
                                     for c, d in data.get("class_data", {}).items() if "let" in d}
        self.let_classes: dict[str, str] = {   # every let name -> its class
            name.strip(): c for c, d in data.get("class_data", {}).items() if "let" in d
            for name in d["let"].split(",")}
        lists: dict[str, list[str]] = {}
        sch = schema()
        self.root: str | None = None      # the class of the program's result
        self.type_text: dict[str, str] = {}   # class -> the analysis's type text
        for nid, n in nodes.items():
            op, kids = n["op"], n["children"]
            cls = n["eclass"]
            if op == "is-root":
                self.root = nodes[kids[0]]["eclass"]
            elif op == "type-of":
                text = _unquote(nodes[f"primitive-{cls}"]["op"]) \
                    if f"primitive-{cls}" in nodes else None
                if text is not None and text != ILL_TYPED:
                    self.type_text[nodes[kids[0]]["eclass"]] = text
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
            if kids is None:
                return None
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
            attrs, texts = {}, []
            for spec, child in zip(opdef.attrs, kids[k:]):
                literal = self._prim(nodes, child)
                key = (id(spec), literal)
                if key not in self._attr_memo:   # (values are shared, never mutated)
                    self._attr_memo[key] = decode_attr(spec, _unquote(literal))
                attrs[spec.name] = self._attr_memo[key]
                texts.append(_unquote(literal))
            return ENode("op", tuple(self.node_class[c] for c in kids[:k]), opdef, attrs,
                         node_id=nid, attr_texts=tuple(texts))
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
            fields = self._list(self.node_class[kids[0]], nodes, lists)
            if fields is None:         # a list not unrolled to its end (a map cut short)
                return None
            return ENode("MkTuple", fields, node_id=nid)
        return None  # analyses (type-of, is-const, ...) and list cells

    # -- types and constness -------------------------------------------------------------------
    def _node_ok(self, cls: str, node: ENode) -> bool:
        """Whether ``node``'s own type (from its operands' class types) is its class's."""
        kids = [self.type_text.get(c) for c in node.children]
        if any(k is None for k in kids):
            return False
        text = self.typer.node_type(node.label, kids, node.value, node.attr_texts)
        return text != ILL_TYPED and (text == self.type_text.get(cls) or type_of_text(
            text) == WEAK)

    def _infer(self) -> None:
        """Check every node, then order the classes operands first and find the constant
        ones, by worklists: linear in the size of the e-graph."""
        for cls, text in self.type_text.items():
            self.types[cls] = type_of_text(text)
        parents: dict[str, list[tuple[str, ENode]]] = {}
        waiting: dict[str, int] = {}
        ready: list[tuple[str, ENode]] = []
        for cls, nodes in self.classes.items():
            for node in nodes:
                if cls not in self.types or not self._node_ok(cls, node):
                    self.bad.add(node.node_id)
                    continue
                kids = set(node.children)
                waiting[node.node_id] = len(kids)
                for k in kids:
                    parents.setdefault(k, []).append((cls, node))
                if not kids:
                    ready.append((cls, node))
        ordered: set[str] = set()
        while ready:
            cls, node = ready.pop()
            if cls in ordered:
                continue
            ordered.add(cls)
            self.order.append(cls)
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
            # (an op without operands, such as qnn.codes, is constant too: its value is fixed
            # by its attributes)
            leaf = next((n for n in ns if n.kind in ("Const", "Scalar") or (
                n.kind == "op" and not n.children and n.node_id not in self.bad)), None)
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

    def input_types_of(self, node: ENode) -> list[Type]:
        return resolve_weak([self.types[c] for c in node.children])

    def size(self) -> tuple[int, int]:
        return sum(len(v) for v in self.classes.values()), len(self.classes)


