"""The front page and the manual: the README stays a front page (at most 150 lines), its quick
start's commands and Python run as written, every page the manual's navigation names exists,
and the manual builds with ``mkdocs build --strict`` (no broken link, no missing reference)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import seeded_cache

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for section in ("## Set-up", "## Quick start", "## The manual"):
        assert section in text
    # the two set-up commands: install and run the main job; run the tests
    setup = _blocks("sh")[:2]
    assert "pip install" in setup[0] and "eqquant demo" in setup[0]
    assert "pytest -n 2" in setup[1]


def test_the_manual_names_only_pages_it_has():
    nav = re.findall(r":\s*([\w/-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert nav and sorted(nav) == pages


@pytest.mark.skipif(not (ROOT / "rules").is_dir(), reason="needs the source tree's rules/")
def test_the_quick_start_runs_as_written(tmp_path):
    """Each command of the README's quick start, in a fresh folder (``$E`` the installed
    eqquant), then its Python: each succeeds and writes what it says."""
    quick = _blocks("sh")[2]
    eqquant = shutil.which("eqquant", path=str(Path(sys.executable).parent))
    assert eqquant is not None
    (tmp_path / "rules").symlink_to(ROOT / "rules")
    script = quick.replace("\\\n", " ")
    lines = [ln.split("  #")[0].strip() for ln in script.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("E=")]
    assert len(lines) >= 6
    env = {**os.environ, "E": eqquant, "EQQUANT_CACHE_DIR": seeded_cache(tmp_path / "cache")}
    for line in lines:
        done = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
    for made in ("work/resnet18.ir", "work/resnet18.opt.ir", "work/resnet18.int8.ir",
                 "work/lib/plan.json"):
        assert (tmp_path / made).exists(), made
    python = _blocks("python")[0]
    done = subprocess.run([sys.executable, "-c", python], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "SQNR" in done.stdout


def test_the_manual_builds_strictly(tmp_path):
    """``mkdocs build --strict``: every page, the API reference from the docstrings and the
    command reference from the click commands (the ``docs`` extra; CI installs it)."""
    pytest.importorskip("mkdocs", reason="the docs extra is not installed")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    from eqquant.cli.main import cli as group
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in group.commands:                  # every command of the click group
        assert f'id="{command}"' in cli, command
    # the tutorials' rules and programs highlighted by eqquant's own lexers
    page = (tmp_path / "site" / "tutorials" / "first-rule" / "index.html").read_text()
    assert '<span class="nv">?x</span>' in page and '<span class="nv">%0</span>' in page
    # the rules language's reference includes the grammar the parser reads, as it is
    import html
    grammar = (ROOT / "grammar" / "rules.lark").read_text().splitlines()
    rules_page = html.unescape(re.sub(r"<[^>]+>", "", (tmp_path / "site" / "rules" /
                                                        "index.html").read_text()))
    assert all(line.strip() in rules_page for line in grammar if line.strip()), "grammar"
    api = (tmp_path / "site" / "python-api" / "index.html").read_text()
    assert "eqquant.api.quantize" in api
    ops = (tmp_path / "site" / "ops" / "index.html").read_text()
    registered = subprocess.run(     # (a new process: tests register ops of their own here)
        [sys.executable, "-c", "from eqquant.ops.registry import all_ops\n"
         "print('\\n'.join(all_ops()))"], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout.split()
    assert len(registered) > 50
    missing = [name for name in registered if f"<code>{name}</code>" not in ops]
    assert not missing, missing                     # every registered op, from the registry


def test_no_comment_in_the_package_quotes_a_machines_timing():
    """Code comments and docstrings keep the reason for a choice; a particular machine's
    figures (``2.3 ns an element``, ``took 25 s to compile``) belong to the benchmarks page."""
    import ast
    import io
    import tokenize
    timing = re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|µs|us|ns)\b|\b\d+(?:\.\d+)?\s(?:s|seconds)\b")
    found = []
    for path in sorted((ROOT / "eqquant").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        notes = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline)
                 if t.type == tokenize.COMMENT]
        notes += [ast.get_docstring(n, clean=False) or "" for n in ast.walk(ast.parse(text))
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                    ast.AsyncFunctionDef))]
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for note in notes
                  for m in timing.finditer(note)]
    assert not found, found
