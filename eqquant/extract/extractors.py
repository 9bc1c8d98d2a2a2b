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

import collections

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
                consts = frozenset(i for i, k in enumerate(n.children) if k in view.const)
                out[n.node_id] = model.instance_cost(n.op, n.attrs, view.input_types_of(n),
                                                     view.types[cls], consts)
    return out


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


def _acyclic_used(choice: dict[str, ENode], root: str,
                  leaves: dict | frozenset = frozenset()) -> dict[str, ENode] | None:
    """The classes ``choice`` uses from ``root``, or None if they form a cycle. Classes in
    ``leaves`` are taken as they are, not entered."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    out: dict[str, ENode] = {}
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        c, i = stack.pop()
        if i == 0:
            if state.get(c) == 2:
                continue
            if state.get(c) == 1:
                return None
            if c not in choice:
                return None
            state[c] = 1
            out[c] = choice[c]
        kids = () if c in leaves else choice[c].children
        if i < len(kids):
            stack.append((c, i + 1))
            k = kids[i]
            if state.get(k) == 1:
                return None
            if state.get(k) != 2:
                stack.append((k, 0))
        else:
            state[c] = 2
    return out


def greedy_dag(view: EGraphView, root: str, model: CostModel) -> Extraction:
    """Greedy DAG extraction, then local improvement: switch one class at a time to another
    of its nodes while the whole program's cost (shared values once) goes down."""
    costs = node_costs(view, model)
    # Each class's best subprogram is kept as a bit set of the classes it uses (a Python int:
    # a union is one OR, and a chain of 5,000 ops takes megabytes, not the gigabytes a set
    # per class would), with its total cost, shared classes counted once.
    bit = {c: i for i, c in enumerate(view.classes)}
    own: dict[int, float] = {}         # bit -> the cost of the class's chosen node
    # constant classes are folded at compile time: cost 0, an acyclic choice fixed up front
    best: dict[str, tuple[float, int, ENode]] = {
        c: (0.0, 1 << bit[c], n) for c, n in view.const_node.items()}
    for c in view.const_node:
        own[bit[c]] = 0.0
    # a worklist: a class is looked at again whenever one of its operands' totals went down
    # (classes are ordered by their first node that could be built, so a class's other nodes
    # may read classes ordered after it: sweeping in order until nothing changes took one
    # sweep per layer of a deep network)
    users: dict[str, set[str]] = {}
    for cls, nodes in view.classes.items():
        for n in nodes:
            for k in n.children:
                users.setdefault(k, set()).add(cls)
    todo = collections.deque(c for c in view.order if c not in view.const_node)
    queued = set(todo)
    budget = 1000 * max(len(todo), 1)  # (totals only go down: this ends long before)
    while todo and budget > 0:
        budget -= 1
        cls = todo.popleft()
        queued.discard(cls)
        changed = False
        current = best.get(cls)
        me = 1 << bit[cls]
        for n in view.classes[cls]:
            if n.node_id not in costs:
                continue
            kids = [best.get(k) for k in n.children]
            if any(k is None or k[1] & me for k in kids):
                continue  # an operand is not reachable yet, or this would close a cycle
            total, mask = costs[n.node_id], me
            if kids:
                base = max(kids, key=lambda k: k[0])
                total, mask = total + base[0], mask | base[1]
                for k in kids:
                    new = k[1] & ~mask
                    mask |= new
                    while new:           # the classes this operand adds
                        low = new & -new
                        total += own[low.bit_length() - 1]
                        new ^= low
            if current is None or total < current[0] * (1 - 1e-12):
                current = (total, mask, n)
                changed = True
        if current is not None and changed:
            best[cls] = current
            own[bit[cls]] = costs[current[2].node_id]
            for u in users.get(cls, ()):
                if u not in queued and u not in view.const_node:
                    queued.add(u)
                    todo.append(u)
    if root not in best:
        raise EqquantError("extraction found no well-typed program for the result")
    choice = {c: b[2] for c, b in best.items()}
    fixed = view.const_node  # cost 0 and never on a cycle: not entered while searching

    choice = _improve(choice, root, fixed, costs, view)
    if _acyclic_used(choice, root, fixed) is None:
        raise EqquantError("internal: greedy extraction chose a cycle")
    used = _used(choice, root)
    return Extraction(used, dag_cost(used, costs, root), "greedy")


class _Program:
    """The program a choice of one node per class extracts, kept up to date under single
    switches: which classes it uses (reference counts), their order (operands first) and its
    cost, so that trying a switch costs only the part of the program that changes."""

    def __init__(self, choice, root, fixed, costs):
        self.choice, self.root, self.fixed, self.costs = choice, root, fixed, costs
        self.refs: dict[str, int] = {}
        self.recount()

    def kids(self, c):
        return () if c in self.fixed else self.choice[c].children

    def cost_of(self, c) -> float:
        return 0.0 if c in self.fixed else self.costs[self.choice[c].node_id]

    def recount(self) -> None:
        refs: dict[str, int] = {self.root: 1}
        order: list[str] = []
        stack = [(self.root, False)]
        expanded: set[str] = set()
        while stack:
            c, done = stack.pop()
            if done:
                order.append(c)
                continue
            # (a class takes its place when it is expanded, not when first pushed: one pushed
            # by a user and reached first through another must still come after its
            # operands, or ``reaches`` skips it and lets a switch close a cycle)
            if c in expanded:
                continue
            expanded.add(c)
            stack.append((c, True))
            for k in self.kids(c):
                if k not in expanded:
                    stack.append((k, False))
        for c in expanded:
            for k in self.kids(c):
                refs[k] = refs.get(k, 0) + 1
        self.refs = refs
        self.topo = {c: i for i, c in enumerate(order)}
        self.total = sum(self.cost_of(c) for c in refs)

    def reaches(self, start, target) -> bool:
        """Whether ``target`` is reachable from ``start`` under the current choice (used
        classes ordered before ``target`` cannot reach it: they are not entered)."""
        limit = self.topo[target]
        stack, seen = [start], {start}
        while stack:
            c = stack.pop()
            if c == target:
                return True
            if c in self.topo and self.topo[c] < limit:
                continue
            for k in self.kids(c):
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
        return False

    def delta(self, cls, node) -> tuple[float, dict[str, int]] | None:
        """The change of cost if ``cls`` took ``node`` (None if that closes a cycle), and the
        reference counts that change."""
        if any(self.reaches(k, cls) for k in node.children):
            return None
        refs: dict[str, int] = {}
        get = lambda c: refs.get(c, self.refs.get(c, 0))  # noqa: E731
        change = self.costs[node.node_id] - self.cost_of(cls)
        stack = list(node.children)          # operands the new node uses
        while stack:
            c = stack.pop()
            n = get(c)
            refs[c] = n + 1
            if n == 0:                       # newly used: it and its operands join
                change += self.cost_of(c)
                stack.extend(self.kids(c))
        stack = list(self.kids(cls))         # operands the old node no longer uses
        while stack:
            c = stack.pop()
            n = get(c) - 1
            refs[c] = n
            if n == 0:                       # no longer used: it and its operands leave
                change -= self.cost_of(c)
                stack.extend(self.kids(c))
        return change, refs

    def switch(self, cls, node, refs) -> None:
        self.choice[cls] = node
        self.recount()


def _improve(choice, root, fixed, costs, view: EGraphView, rounds: int = 10):
    """Local improvement: switch one class at a time to another of its nodes while the whole
    program's cost (shared values once) goes down. Each trial costs the part of the program
    the switch changes, not the whole program."""
    choice = dict(choice)
    prog = _Program(choice, root, fixed, costs)
    for _ in range(rounds):
        improved = False
        for cls in list(prog.topo):
            if cls in fixed or cls not in prog.refs or len(view.classes[cls]) < 2:
                continue
            for n in view.classes[cls]:
                if n is choice[cls] or n.node_id not in costs or \
                        any(k not in choice for k in n.children):
                    continue
                found = prog.delta(cls, n)
                if found is not None and found[0] < -1e-12 * max(prog.total, 1e-30):
                    prog.switch(cls, n, found[1])
                    improved = True
        if not improved:
            break
    return prog.choice


def _cyclic_edges(view: EGraphView, classes: list[str], nodes) -> set[tuple[str, str]]:
    """Class edges (user, operand) inside a strongly connected component (scipy's csgraph):
    the only ones that need ordering constraints to forbid cycles."""
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    at = {c: i for i, c in enumerate(classes)}
    edges = [(at[c], at[k]) for c, n in nodes for k in n.children if k in at]
    rows, cols = (np.array(x, np.int64) for x in zip(*edges)) if edges else \
        (np.zeros(0, np.int64), np.zeros(0, np.int64))
    graph = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(classes),) * 2)
    _, label = connected_components(graph, directed=True, connection="strong")
    return {(c, k) for c, n in nodes for k in n.children
            if k in at and label[at[c]] == label[at[k]]}


def ilp(view: EGraphView, root: str, model: CostModel, time_limit: float = 60.0,
        node_limit: int | None = None) -> Extraction:
    """The cheapest program of the e-graph as a 0-1 program (HiGHS through scipy): one node
    per used class, a chosen node's operand classes used, shared values counted once, no
    cycles. Solved to a proven optimum within ``time_limit`` seconds, or, with
    ``node_limit``, the best program found in that many branch-and-bound nodes (a budget
    that, unlike a time, gives the same program on every machine); ``method`` says which."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    costs = node_costs(view, model)
    # constant classes cost nothing whichever node stands for them: fix the acyclic choice
    # made when constness was found, and let the solver choose everything else
    fixed = dict(view.const_node)
    reach, stack = {root}, [root]
    while stack:
        c = stack.pop()
        alternatives = [fixed[c]] if c in fixed else view.classes.get(c, ())
        for n in alternatives:
            if n.node_id in costs:
                for k in n.children:
                    if k not in reach:
                        reach.add(k)
                        stack.append(k)
    free = [c for c in reach if c not in fixed]
    cindex = {c: i for i, c in enumerate(free)}
    nodes = [(c, n) for c in free for n in view.classes.get(c, ()) if n.node_id in costs
             and all(k in reach for k in n.children)]
    nn, nc = len(nodes), len(free)
    cyclic = _cyclic_edges(view, free, [(c, n) for c, n in nodes])
    cost_vec = np.zeros(nn + nc)
    cost_vec[:nn] = [costs[n.node_id] for _, n in nodes]
    # HiGHS stops within an absolute gap of 1e-6 of the objective: costs in seconds (a node
    # is microseconds) would all lie inside it. Scaled so that the dearest node costs 1000,
    # the gap is a billionth of a node.
    top = float(cost_vec.max()) if nn else 0.0
    if top > 0:
        cost_vec[:nn] *= 1e3 / top
    cost_vec[:nn] += 1e-6  # among equal costs, fewer nodes
    by_class: dict[str, list[int]] = {}
    for j, (c, _) in enumerate(nodes):
        by_class.setdefault(c, []).append(j)
    rows, cols, vals, lo, hi = [], [], [], [], []

    def add(row: dict[int, float], low: float, high: float) -> None:
        r = len(lo)
        for j, v in row.items():
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    if root in cindex:
        add({j: 1.0 for j in by_class.get(root, [])}, 1.0, 1.0)   # the result is computed
    for c, js in by_class.items():
        add({j: 1.0 for j in js}, 0.0, 1.0)                       # one node per used class
    big = nc + 1
    for j, (c, n) in enumerate(nodes):
        for k in set(n.children):
            if k in fixed:
                continue
            row = {j: 1.0}                                        # chosen -> operand used
            for m in by_class.get(k, []):
                row[m] = row.get(m, 0.0) - 1.0
            add(row, -np.inf, 0.0)
            if (c, k) in cyclic:                                  # no cycles: t_c > t_k
                add({nn + cindex[c]: 1.0, nn + cindex[k]: -1.0, j: -float(big)}, 1.0 - big,
                    np.inf)
    choice = {c: n for c, n in fixed.items() if c in reach}
    method = "ilp"
    if nn:
        a = coo_matrix((vals, (rows, cols)), shape=(len(lo), nn + nc)).tocsr()
        res = milp(cost_vec, constraints=LinearConstraint(a, lo, hi),
                   integrality=np.concatenate([np.ones(nn), np.zeros(nc)]),
                   bounds=Bounds(np.zeros(nn + nc), np.concatenate([np.ones(nn),
                                                                    np.full(nc, nc)])),
                   options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 0.0,
                            **({"node_limit": node_limit} if node_limit else {})})
        if res.x is None:
            raise EqquantError(f"the ILP extractor found no solution ({res.message})")
        for j, (c, n) in enumerate(nodes):
            if res.x[j] > 0.5:
                choice[c] = n
        if res.status != 0:
            gap = getattr(res, "mip_gap", None)
            bound = "" if gap is None else f"; its lower bound {100 * gap:.0f}% below it"
            method = (f"ilp (best of {node_limit} branch-and-bound nodes, not proven "
                      f"optimal{bound})" if node_limit and res.status == 4 else
                      f"ilp (stopped: {res.message})")
    choice = _used(choice, root)
    return Extraction(choice, dag_cost(choice, costs, root), method)


# The ILP's budget in ``best``: branch-and-bound nodes. An int8 e-graph's relaxation is weak
# (a value reached by an integer and a float path at once is paid once at half weight, and
# the halves compound along a chain of marks), so HiGHS finds the optimum at its first node
# and then spends minutes raising its bound: mobilenet_v2's 578 nodes, optimal at the root,
# took 14,642 nodes to prove it. The budget keeps the first nodes' search; it is a budget of
# work, not of time, so a slower machine does not stop earlier.
BEST_NODES = 32


def best_of_both(view: EGraphView, root: str, model: CostModel) -> Extraction:
    """The ILP when scipy's HiGHS is installed (the ``ilp`` extra), searched for BEST_NODES
    branch-and-bound nodes, and greedy where it is not installed or where the ILP did not
    prove its program optimal in that budget: then the cheaper of the two. ``method`` says
    which. Greedy can miss a chain of integer ops that pays only as a whole, which the ILP
    weighs at once. (``ilp`` alone proves the optimum, within its time limit.)"""
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        ex = greedy_dag(view, root, model)
        return Extraction(ex.choice, ex.cost, "greedy (no scipy for the ILP)")
    exact = ilp(view, root, model, node_limit=BEST_NODES)
    if exact.method == "ilp":
        return exact
    ex = greedy_dag(view, root, model)
    if exact.cost <= ex.cost:
        return exact
    return Extraction(ex.choice, ex.cost, f"{ex.method}: cheaper than the {exact.method}")


EXTRACTORS = {"greedy": greedy_dag, "ilp": ilp, "best": best_of_both}


def extract(view: EGraphView, root: str, model: CostModel, method: str = "greedy"
            ) -> Extraction:
    if method not in EXTRACTORS:
        raise EqquantError(f"unknown extractor '{method}' (there are: {', '.join(EXTRACTORS)})")
    return EXTRACTORS[method](view, root, model)
