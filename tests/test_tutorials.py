"""The manual's tutorials and its getting-started page run as written, so they cannot rot:
each page of ``docs/tutorials/``, and ``docs/getting-started.md``, in a fresh folder, in the
order written. A code block with a ``title="NAME"`` is a file the reader writes (NAME); an
``sh`` block's commands are run by bash (``eqquant`` the installed command), each expected
to exit 0 unless it ends with ``# exit N``; a ``python`` block is run by this Python;
``text`` blocks are what the reader sees, and ``shell`` blocks (installing) what the reader
runs once, outside the folder: neither is run here."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import seeded_cache

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "docs" / "tutorials").glob("*.md"))
PAGES = TUTORIALS + [ROOT / "docs" / "getting-started.md"]
BLOCK = re.compile(r"^```([\w-]+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[tuple[str, str | None, str]]:
    """(language, title or None, text) of each fenced block, in order."""
    out = []
    for lang, info, text in BLOCK.findall(page.read_text(encoding="utf-8")):
        title = re.search(r'title="([^"]+)"', info)
        out.append((lang, title.group(1) if title else None, text))
    return out


def commands(text: str) -> list[tuple[str, int]]:
    """An sh block's commands (continued lines joined), each with the exit status expected."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        expect = re.search(r"#\s*exit (\d+)\s*$", line)
        out.append((line.split("  #")[0].strip(), int(expect.group(1)) if expect else 0))
    return out


def test_there_are_tutorials_and_each_runs_something():
    assert len(TUTORIALS) >= 4
    for page in PAGES:
        kinds = {lang for lang, title, _ in blocks(page) if title is None}
        assert "sh" in kinds, page.name


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_tutorial_runs_as_written(page, tmp_path):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "EQQUANT_CACHE_DIR": seeded_cache(tmp_path / ".cache")}
    ran = 0
    for lang, title, text in blocks(page):
        if title is not None:
            (tmp_path / title).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / title).write_text(text, encoding="utf-8")
        elif lang == "sh":
            for command, expected in commands(text):
                done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                      capture_output=True, text=True, timeout=900)
                assert done.returncode == expected, (page.name, command, done.stdout[-3000:],
                                                     done.stderr[-3000:])
                ran += 1
        elif lang == "python":
            done = subprocess.run([sys.executable, "-c", text], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, (page.name, text, done.stderr[-3000:])
            ran += 1
    assert ran >= 2
