"""The packages import downward only. Layers, bottom first: what a package may import is
what lies below it (function-local imports count; ``if TYPE_CHECKING:`` ones do not, since
they never run)."""
from __future__ import annotations

import ast
from pathlib import Path

import eqquant

LAYERS = [
    ("errors", "resources"),          # errors and bundled files
    ("parallel",),                    # work on Ray
    ("core",),                        # IR types and nodes
    ("ops",),                         # the op registry and the ops' definitions
    ("ir",),                          # the text IR: parser, printer, type checker, interpreter
    ("passes", "zoo", "datasets"),    # (datasets: input data, streamed)
    ("metrics",),                     # scores against labels
    ("egraph",),                      # programs in egglog, analyses, saturation
    ("rules",),                       # the rules language, compiled to egglog rewrites
    ("extract",),                     # the serialized e-graph, cost models, extraction
    ("optimizer",),                   # saturate + extract + fold
    ("runtime",),                     # kernels and the executor
    ("quant",),                       # calibration, marking, the int8 flow
    ("interop", "viz"),               # ONNX import/export, plots
    ("api", "explain"),
    ("deploy",),                      # programs saved ahead of time, run without Numba
    ("evaluation",),                  # a metric over a labelled set, locally or on Ray
    ("pipeline",),                    # eqquant demo
    ("cli", "__init__"),
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}
ROOT = Path(eqquant.__file__).parent


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Packages of eqquant that ``path`` imports, outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    here = list(path.relative_to(root).parts[:-1])
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                target = base + (node.module.split(".") if node.module else
                                 [a.name for a in node.names][:1])
            elif node.module and node.module.startswith("eqquant."):
                target = node.module.split(".")[1:]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("eqquant.")]
            if not names:
                continue
            target = names[0].split(".")[1:]
        else:
            continue
        if target:
            out.add(target[0])
    return out


def test_every_package_imports_only_packages_below_it():
    wrong = []
    seen = set()
    for path in sorted(ROOT.rglob("*.py")):
        pkg = _package(path)
        assert pkg in LAYER, f"{pkg} ({path}) is in no layer of this test"
        seen.add(pkg)
        for target in _imports(path) - {pkg}:
            assert target in LAYER, f"{path} imports {target}, which is in no layer"
            if LAYER[target] >= LAYER[pkg]:
                wrong.append(f"{path.relative_to(ROOT.parent)} ({pkg}) imports {target}")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)
    assert {"core", "ops", "ir", "egraph", "rules", "extract", "runtime", "quant"} <= seen


def test_the_checker_sees_an_upward_import(tmp_path):
    """(The check above can fail: a function-local import upward is caught, one under
    TYPE_CHECKING is not.)"""
    assert "ops" not in _imports(ROOT / "core" / "nodes.py")
    (tmp_path / "core").mkdir()
    probe = tmp_path / "core" / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                     "    from ..ops import registry\n"
                     "def f():\n    from ..quant import flow\n    from .types import Type\n")
    assert _imports(probe, tmp_path) == {"quant", "core"}


# the runtime's stages, bottom first (runtime/__init__.py): each imports only those below it
RUNTIME_STAGES = [("codegen",), ("kernels",), ("target",), ("lowering",), ("execution",)]
STAGE = {name: i for i, names in enumerate(RUNTIME_STAGES) for name in names}


def test_the_runtime_stages_import_downward_only():
    runtime = ROOT / "runtime"
    wrong, seen = [], set()
    for path in sorted(runtime.rglob("*.py")):
        if path.parent == runtime and path.name == "__init__.py":
            continue                 # the package's set-up (Numba's cache stamps)
        stage = _package_in(path, runtime)
        assert stage in STAGE, f"{path} is in no stage of this test"
        seen.add(stage)
        for target in _imports(path, runtime) - {stage}:
            if target not in STAGE:
                continue             # (eqquant's packages: the test above)
            if STAGE[target] >= STAGE[stage]:
                wrong.append(f"{path.relative_to(ROOT.parent)} ({stage}) imports {target}")
    assert not wrong, "runtime imports that go up or sideways:\n" + "\n".join(wrong)
    assert seen == set(STAGE)


def _package_in(path: Path, root: Path) -> str:
    rel = path.relative_to(root).parts
    return rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
