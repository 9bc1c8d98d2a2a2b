"""Writing outputs whole: every file eqquant writes appears complete or not at all, and a
program's ``.ir`` and ``.npz`` always belong together.

    with Outputs() as out:                 # nothing is visible until the block ends
        out.add("m.ir", lambda tmp: ...)   # each writer fills a temporary file beside its target
        out.add("m.npz", lambda tmp: ...)
    # on an exception inside the block every temporary file is removed: nothing was written

Commit moves the files into place in the order they were added. One rename is atomic, two
are not: a program written with :func:`save_program` therefore carries, on its first line,
the digest of its weights (``// eqquant params zip-blake2b=...``), its ``.npz`` is moved in before
its ``.ir``, and the weights it replaces are kept (hard-linked as ``.NAME.npz.prev``) until
the ``.ir`` is in place. A process killed between the two renames leaves the old ``.ir``
beside the new ``.npz``; the loader sees the digests disagree and reads the kept weights,
which are the old program's: whatever instant a writer dies at, the pair that is read
belongs together.

Files are created with the permissions the umask gives (an existing file keeps its own); a
symbolic link is written through (its target is replaced, the link stays).
"""
from __future__ import annotations

import hashlib
import os
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from ..errors import EqquantError

STAMP_PREFIX = "// eqquant params "   # the first line of a saved program: + its weights' stamp
# the stamp's kinds: a digest of the .npz's member list (each member's name, CRC-32 and sizes,
# from the zip's central directory: read without reading the weights, which hashing would
# do at every load), and, for programs saved before it, of the whole file
ZIP, WHOLE = "zip-blake2b", "blake2b"


def digest_file(path: str | Path, kind: str = ZIP) -> str | None:
    """The digest of the weights file ``path`` of the stamp kind ``kind`` (ZIP: of its
    members' names, CRC-32s and sizes; WHOLE: of its bytes); None where it has none (a file
    that is not a whole zip: a truncated one has lost its central directory)."""
    h = hashlib.blake2b(digest_size=16)
    if kind == WHOLE:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                h.update(f"{info.filename}\0{info.CRC}\0{info.file_size}\0"
                         f"{info.compress_size}\n".encode())
    except (zipfile.BadZipFile, OSError):
        return None
    return h.hexdigest()


def backup_path(npz: Path) -> Path:
    return npz.with_name(f".{npz.name}.prev")


def _target(path: Path) -> Path:
    """Where writing ``path`` lands: a symbolic link's target (the link itself stays)."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _mode_for(path: Path) -> int:
    if path.exists():
        return stat.S_IMODE(path.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


class Outputs:
    """A set of files written together (see the module's doc)."""

    def __init__(self) -> None:
        self._staged: list[tuple[Path, Path]] = []     # (temporary, final)
        self._links: list[Path] = []

    def add(self, path: str | Path, write: Callable[[str], None]) -> Path:
        final = _target(Path(path))
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=f".{final.name}.",
                                       suffix=".tmp")
            os.close(fd)
        except OSError as e:
            raise EqquantError(f"{path}: cannot write ({e.strerror})") from None
        self._staged.append((Path(tmp), final))
        try:
            write(tmp)
            os.chmod(tmp, _mode_for(final))
        except OSError as e:
            raise EqquantError(f"{path}: cannot write ({e.strerror})") from None
        return final

    def staged(self, final: Path) -> Path:
        """The temporary file that holds ``final`` until the commit."""
        return next(tmp for tmp, f in self._staged if f == final)

    def keep_previous(self, path: Path) -> None:
        """Keep the current ``path`` (hard-linked beside it) until the commit is done."""
        if path.exists():
            prev = backup_path(path)
            if prev.exists():
                prev.unlink()
            os.link(path, prev)
            self._links.append(prev)

    def commit(self) -> None:
        done = 0
        try:
            for tmp, final in self._staged:
                os.replace(tmp, final)
                done += 1
        except BaseException as e:
            for tmp, _ in self._staged[done:]:
                tmp.unlink(missing_ok=True)
            self._staged = []
            if done == 0:          # nothing moved: the kept weights are not needed
                self.discard()
            # (else they stay: the loader needs them to read the old pair)
            if isinstance(e, OSError):
                raise EqquantError(f"{final}: cannot write ({e.strerror})") from None
            raise
        self._staged = []
        for link in self._links:
            link.unlink(missing_ok=True)
        self._links = []

    def discard(self) -> None:
        for tmp, _ in self._staged:
            tmp.unlink(missing_ok=True)
        self._staged = []
        for link in self._links:
            link.unlink(missing_ok=True)
        self._links = []

    def __enter__(self) -> "Outputs":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()


def write_file(path: str | Path, write: Callable[[str], None]) -> None:
    """One output file, whole or not at all."""
    with Outputs() as out:
        out.add(path, write)


def stage_program(out: Outputs, path: str | Path, text: str,
                  write_npz: Callable[[str], None]) -> tuple[Path, Path]:
    """Stage a program and its weights in ``out``: the ``.npz`` first, then the ``.ir``
    stamped with the ``.npz``'s digest; the weights being replaced are kept until commit."""
    path = Path(path)
    npz = _target(path.with_suffix(".npz"))
    staged_npz = out.add(npz, write_npz)
    stamp = f"{ZIP}={digest_file(out.staged(staged_npz))}"
    out.keep_previous(staged_npz)
    ir = out.add(path, lambda tmp: Path(tmp).write_text(
        f"{STAMP_PREFIX}{stamp}\n{text}", encoding="utf-8"))
    return ir, staged_npz


def recorded_stamp(text: str) -> str | None:
    """The weights' stamp a saved program records on its first line (``kind=digest``)."""
    first = text.split("\n", 1)[0]
    return first[len(STAMP_PREFIX):].strip() if first.startswith(STAMP_PREFIX) else None


def _stamped(npz: Path, stamp: str) -> bool:
    kind, _, want = stamp.partition("=")
    return kind in (ZIP, WHOLE) and digest_file(npz, kind) == want


def params_for(ir_path: Path, text: str, npz: Path) -> Path:
    """The weights that belong to the program ``text`` read from ``ir_path``: ``npz`` when its
    digest is the one the program records (or it records none), else the weights an
    interrupted write kept; an error when neither matches."""
    stamp = recorded_stamp(text)
    if stamp is None or _stamped(npz, stamp):
        return npz
    prev = backup_path(npz)
    if prev.exists() and _stamped(prev, stamp):
        return prev
    raise EqquantError(f"{npz} does not belong to {ir_path} (its weights' digest differs from "
                       f"the one the program records): the two were written by different "
                       f"saves; write the program again")
