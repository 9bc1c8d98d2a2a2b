"""Content digests of files: what the cache keys a program by and what a saved library is
checked against before it is trusted.

A digest is SHA-256 of a file's bytes, never of its name, size, time or (for a zip) its own
CRC-32s, which a file can keep while its data changes. Hashing every byte at every run would
cost a warm start time in proportion to the weights, so a digest once computed is remembered
beside the file's identity as the operating system reports it: device, inode, size,
modification and change times (``os.stat``). A write changes the change time, which no
user can set back, so a file edited in place, truncated, replaced or renamed over is hashed
again. A digest is remembered only for a file whose times are older than ``SETTLED``
seconds, so that a write within the same tick of the file system's clock as the hashing
cannot hide behind equal times (git's "racy" entries, handled the same way). The memory
lives in the cache's ``digests/`` folder; a damaged entry is hashed again, never trusted.
"""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ..resources import cache_dir, cache_write

SETTLED = 2.0       # seconds: a file changed more recently is hashed, not remembered


def _memo(path: Path) -> Path:
    name = hashlib.sha256(os.fsencode(path.resolve())).hexdigest()[:40]
    return cache_dir() / "digests" / name


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def file_digest(path: str | os.PathLike, remember: bool = True) -> str:
    """The SHA-256 of ``path``'s bytes (hex), from memory where the file is unchanged since
    it was hashed (``remember``: use and keep that memory)."""
    path = Path(path)
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        memo = _memo(path) if remember else None
        identity = _identity(st)
        if memo is not None:
            try:
                seen, digest = memo.read_text().rsplit(" ", 1)
                if seen == identity and len(digest) == 64:
                    return digest
            except (OSError, ValueError, UnicodeDecodeError):
                pass
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if memo is not None and max(st.st_mtime, st.st_ctime) < time.time() - SETTLED:
        cache_write(memo, f"{identity} {digest}")   # (unwritable: hashed each time)
    return digest
