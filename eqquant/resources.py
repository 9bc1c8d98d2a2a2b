"""Where the grammar/ and rules/ folders are, and the user's cache folder.

In a source checkout (or an editable install) they sit at the top of the repository, next to
the ``eqquant`` package; a wheel carries them inside the package as ``eqquant/_data/`` (see
``pyproject.toml``). Both layouts are looked up here and nowhere else.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    for candidate in (_PKG / "_data" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"eqquant's {name}/ folder is missing from the installation "
                            f"(looked in {_PKG / '_data'} and {_PKG.parent})")


def cache_write(path: Path, data: str | bytes) -> bool:
    """Put ``data`` at ``path`` in a cache, whole or not at all (written beside it, then
    renamed over it: a reader never sees half a file, and a link there is replaced, never
    written through); False where the cache cannot be written (a cache: the caller carries
    on without it)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")
        if isinstance(data, str):
            part.write_text(data, encoding="utf-8")
        else:
            part.write_bytes(data)
        part.replace(path)
        return True
    except OSError:
        return False


def source_digest(package: Path | None = None) -> str:
    """A digest of eqquant's source (every .py, .c and .lark file of the package, ``package``
    where given, and of grammar/: its path within its folder and its bytes): what a verdict
    or a compiled program made by this eqquant depends on. Where it is installed does not
    enter it, so a source checkout and the package installed from it share their verdicts
    and programs (a test's own process and the command it runs). This process's own
    source is read once (what it runs does not change while it runs)."""
    return _own_source_digest() if package is None else _source_digest(package)


@lru_cache(maxsize=None)
def _own_source_digest() -> str:
    return _source_digest(_PKG)


def _source_digest(package: Path) -> str:
    import hashlib
    h = hashlib.sha256()
    for label, folder in (("eqquant", package), ("grammar", data_dir("grammar"))):
        for top, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "_data"))
            for name in sorted(names):
                if name.endswith((".py", ".c", ".lark")):
                    path = os.path.join(top, name)
                    with open(path, "rb") as f:
                        data = f.read()
                    rel = os.path.relpath(path, folder).replace(os.sep, "/")
                    h.update(f"{label}/{rel} {len(data)}\n".encode() + data)
    return h.hexdigest()


def rules_digest() -> str:
    """A digest of the rules files as installed (each .rules file's path, size and
    modification time): what an optimized program depends on besides the code (a program
    optimized, and its library saved, before a rules file changed is another program)."""
    import hashlib
    h = hashlib.sha256()
    folder = rules_dir()
    for path in sorted(folder.rglob("*.rules")):
        st = path.stat()
        h.update(f"{path.relative_to(folder)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def grammar_path(name: str) -> Path:
    return data_dir("grammar") / name


def rules_dir() -> Path:
    return data_dir("rules")


def cache_dir() -> Path:
    """The folder of eqquant's caches (measured kernel times, programs saved ahead of
    time): ``EQQUANT_CACHE_DIR``, else ``$XDG_CACHE_HOME/eqquant`` (``~/.cache/eqquant``).
    Made where missing, private to the user (0700): what it holds is run."""
    if os.environ.get("EQQUANT_CACHE_DIR"):
        path = Path(os.environ["EQQUANT_CACHE_DIR"])
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        path = Path(base) / "eqquant"
    if not path.is_dir():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            pass                # (reported where something is written there)
    return path
