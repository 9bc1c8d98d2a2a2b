"""Choosing one node per class: greedy DAG extraction, and an exact ILP.

Both count a shared class once, never choose a node whose type does not check, and never
choose a cycle. A class that is a constant subexpression costs nothing.

- :func:`greedy_dag` keeps, for each class, the cheapest sub-DAG found so far as a set of
  (class, cost) pairs, so sharing below a node is counted once (the "greedy DAG" extractor of
  the extraction-gym). Fast; can miss savings from sharing between siblings.
- :func:`ilp` is exact: binary variables for nodes, one chosen per used class, a chosen node's
  operand classes used, and an order on classes that forbids cycles; solved by HiGHS through
  ``scipy.optimize.milp``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import EqquantError
from .cost import CostModel
from .view import EGraphView, ENode


@dataclass
class Extraction:
    choice: dict[str, ENode]   # class -> chosen node, for the classes the program uses
    cost: float
    method: str


def node_costs(view: EGraphView, model: CostModel) -> dict[str, float]:
    out: dict[str, float] = {}
    for cls, nodes in view.classes.items():
        for n in nodes:
            if n.node_id in view.bad:
                continue
            if n.kind != "op" or cls in view.const:
                out[n.node_id] = 0.0
            else:
                out[n.node_id] = model.op_cost(n.op, n.attrs, view.input_types_of(n),
                                               view.types[cls])
    return out


def _reachable(view: EGraphView, root: str, costs: dict[str, float]) -> list[str]:
    seen, stack = {root}, [root]
    while stack:
        c = stack.pop()
        for n in view.classes.get(c, ()):
            if n.node_id in costs:
                for k in n.children:
                    if k not in seen:
                        seen.add(k)
                        stack.append(k)
    return list(seen)


def dag_cost(choice: dict[str, ENode], costs: dict[str, float], root: str) -> float:
    seen, stack, total = {root}, [root], 0.0
    while stack:
        c = stack.pop()
        n = choice[c]
        total += costs[n.node_id]
        for k in n.children:
            if k not in seen:
                seen.add(k)
                stack.append(k)
    return total


def _used(choice: dict[str, ENode], root: str) -> dict[str, ENode]:
    out, stack = {}, [root]
    while stack:
        c = stack.pop()
        if c in out:
            continue
        out[c] = choice[c]
        stack.extend(choice[c].children)
    return out


def greedy_dag(view: EGraphView, root: str, model: CostModel) -> Extraction:
    costs = node_costs(view, model)
    # constant classes are folded at compile time: cost 0, an acyclic choice fixed up front
    best: dict[str, tuple[float, dict[str, float], ENode]] = {
        c: (0.0, {}, n) for c, n in view.const_node.items()}
    todo = [c for c in view.order if c not in view.const_node]
    changed, rounds = True, 0
    while changed and rounds < 50:
        changed, rounds = False, rounds + 1
        for cls in todo:
            current = best.get(cls)
            for n in view.classes[cls]:
                if n.node_id not in costs:
                    continue
                kids = [best.get(k) for k in n.children]
                if any(k is None or cls in k[1] for k in kids):
                    continue  # an operand is not reachable yet, or this would close a cycle
                sub = {cls: costs[n.node_id]}
                for k in kids:
                    sub.update(k[1])
                total = sum(sub.values())
                if current is None or total < current[0] - 1e-15:
                    current = (total, sub, n)
                    changed = True
            if current is not None:
                best[cls] = current
    if root not in best:
        raise EqquantError("extraction found no well-typed program for the result")
    choice = _used({c: b[2] for c, b in best.items()}, root)
    return Extraction(choice, dag_cost(choice, costs, root), "greedy")


def ilp(view: EGraphView, root: str, model: CostModel, time_limit: float = 60.0,
        warm: Extraction | None = None) -> Extraction:
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    costs = node_costs(view, model)
    classes = _reachable(view, root, costs)
    cindex = {c: i for i, c in enumerate(classes)}
    nodes = [(c, n) for c in classes for n in view.classes.get(c, ()) if n.node_id in costs
             and all(k in cindex for k in n.children)]
    nn, nc = len(nodes), len(classes)
    # variables: x (one per node, binary), then t (one per class, order in [0, nc])
    cost_vec = np.zeros(nn + nc)
    cost_vec[:nn] = [costs[n.node_id] for _, n in nodes]
    # a tiny tie-break toward fewer nodes keeps the program free of needless constant nodes
    cost_vec[:nn] += 1e-12
    rows = []
    lo, hi = [], []
    by_class: dict[str, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        by_class.setdefault(c, []).append(j)
    big = nc + 1
    # root used; at most one node per class
    rows.append({j: 1.0 for j in by_class.get(root, [])})
    lo.append(1.0)
    hi.append(1.0)
    for c, js in by_class.items():
        rows.append({j: 1.0 for j in js})
        lo.append(0.0)
        hi.append(1.0)
    for j, (c, n) in enumerate(nodes):
        for k in set(n.children):
            # chosen node -> its operand class is used
            row = {j: 1.0}
            for m in by_class.get(k, []):
                row[m] = row.get(m, 0.0) - 1.0
            rows.append(row)
            lo.append(-np.inf)
            hi.append(0.0)
            # order: t_c - t_k >= 1 when the node is chosen (no cycles)
            rows.append({nn + cindex[c]: 1.0, nn + cindex[k]: -1.0, j: -float(big)})
            lo.append(1.0 - big)
            hi.append(np.inf)
    a = lil_matrix((len(rows), nn + nc))
    for i, row in enumerate(rows):
        for j, v in row.items():
            a[i, j] = v
    integrality = np.concatenate([np.ones(nn), np.zeros(nc)])
    bounds = Bounds(np.zeros(nn + nc), np.concatenate([np.ones(nn), np.full(nc, nc)]))
    res = milp(cost_vec, constraints=LinearConstraint(a.tocsr(), lo, hi),
               integrality=integrality, bounds=bounds,
               options={"time_limit": time_limit, "disp": False})
    if res.x is None:
        raise EqquantError(f"the ILP extractor found no solution ({res.message})")
    choice = {}
    for j, (c, n) in enumerate(nodes):
        if res.x[j] > 0.5:
            choice[c] = n
    choice = _used(choice, root)
    method = "ilp" if res.status == 0 else f"ilp (stopped: {res.message})"
    return Extraction(choice, dag_cost(choice, costs, root), method)


EXTRACTORS = {"greedy": greedy_dag, "ilp": ilp}


def extract(view: EGraphView, root: str, model: CostModel, method: str = "greedy"
            ) -> Extraction:
    if method not in EXTRACTORS:
        raise EqquantError(f"unknown extractor '{method}' (there are: {', '.join(EXTRACTORS)})")
    return EXTRACTORS[method](view, root, model)
