"""One op, one place: outside eqquant/ops/ no module keeps a table of op names (a tuple, list,
set or dict literal holding registered op names). What an op is, how it imports, exports,
quantizes and runs is on its registry entry; the other packages hold machinery."""
from __future__ import annotations

import ast
from pathlib import Path

import eqquant
from eqquant.ops.registry import all_ops

PACKAGE = Path(eqquant.__file__).parent
# the one table left, and why: the seed's MergeComposite pattern table (TVM's composite names
# for the partition view), which a caller may replace; it is data about TVM's output, not
# about the ops
ALLOWED = {("passes/partition.py", "PATTERN_TABLE")}


def _ops_in(value: ast.AST, names: set[str]) -> list[str]:
    items = []
    for inner in ast.walk(value):
        if isinstance(inner, (ast.Tuple, ast.List, ast.Set)):
            items += inner.elts
        elif isinstance(inner, ast.Dict):
            items += [k for k in inner.keys if k is not None] + list(inner.values)
    return sorted({i.value for i in items if isinstance(i, ast.Constant)
                   and isinstance(i.value, str) and i.value in names})


def _tables(path: Path, names: set[str]):
    """(assigned name or None, line, op names) of each literal collection holding two or
    more op names."""
    tree = ast.parse(path.read_text())
    seen: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.id for t in targets if isinstance(t, ast.Name)), None)
            seen.update(id(n) for n in ast.walk(node.value))
            ops = _ops_in(node.value, names)
            if len(ops) >= 2:
                yield target, node.lineno, ops
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and id(node) not in seen:
            seen.update(id(n) for n in ast.walk(node))
            ops = _ops_in(node, names)
            if len(ops) >= 2:
                yield None, node.lineno, ops


def test_no_op_name_tables_outside_the_registry():
    names = set(all_ops())
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("ops/", "zoo/")):     # the registry; models built from ops
            continue
        for target, line, ops in _tables(path, names):
            if (rel, target) not in ALLOWED:
                found.append(f"{rel}:{line} {target or ''} {ops}")
    assert not found, "op-name tables outside eqquant/ops/:\n" + "\n".join(found)


def _name_tests(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """``x == "op name"`` comparisons: several in one file are an if-chain over ops."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for c in [node.left, *node.comparators]:
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in names:
                    out.append((node.lineno, c.value))
    return out


def test_no_if_chains_over_op_names_outside_the_registry():
    names = set(all_ops())
    chains = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("ops/", "zoo/")):
            continue
        tests = _name_tests(path, names)
        if len(tests) >= 2:
            chains.append(f"{rel}: {tests}")
    assert not chains, "if-chains over op names:\n" + "\n".join(chains)


def test_the_scan_finds_a_table():
    """The scan is not vacuous: the allowed pattern table is one it finds."""
    names = set(all_ops())
    hits = list(_tables(PACKAGE / "passes" / "partition.py", names))
    assert any(t == "PATTERN_TABLE" for t, _, _ in hits)


def test_every_op_is_registered_whichever_module_is_imported_first():
    """The registry loads every op family, even when a process first imports one family on
    its own (the runtime imports eqquant.ops.fused, which imports nn only)."""
    import subprocess
    import sys
    counts = []
    for first in ("eqquant.ops.registry", "eqquant.ops.fused", "eqquant.runtime.lowering.fp32",
                  "eqquant.ops.qnn"):
        code = (f"import {first}\nfrom eqquant.ops.registry import all_ops, get_op\n"
                "get_op('nn.relu'); get_op('qnn.quantize'); print(len(all_ops()))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        counts.append(int(out.stdout))
    # (this process may hold test ops as well: compare fresh processes with each other)
    assert len(set(counts)) == 1 and counts[0] >= 40, counts
