"""Libraries forged on purpose, for tests of what follows a library that passes its checks
(a library is refused when its files differ from the digests it was saved with; these make
the digests match again, as only a deliberate forger would)."""
from __future__ import annotations

import ctypes
import hashlib
import json
import struct
from pathlib import Path

from eqquant.deploy.loader import FILES


def restamp(folder: Path) -> None:
    """sums.json made to match ``folder``'s files as they now are."""
    sums = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in FILES}
    (folder / "sums.json").write_text(json.dumps(sums))


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def file_offset(so: Path, symbol: str) -> int:
    """Where in the file ``so`` the code of its function ``symbol`` starts (its address as
    loaded, less the library's base, mapped through the ELF program headers)."""
    loaded = ctypes.CDLL(str(so))
    address = ctypes.cast(getattr(loaded, symbol), ctypes.c_void_p).value
    info = _DlInfo()
    libc = ctypes.CDLL(None)
    assert libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info))
    vaddr = address - info.fbase
    data = so.read_bytes()
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for j in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + j * phentsize)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:
            return vaddr - p_vaddr + p_offset
    raise AssertionError(f"{symbol} lies in no loaded segment of {so}")


def crash_at_run(folder: Path) -> None:
    """``folder``'s library made to stop with SIGILL (x86's ud2) as its run starts, its
    digests matched again."""
    so = folder / "program.so"
    at = file_offset(so, "eqq_run")
    data = bytearray(so.read_bytes())
    data[at:at + 2] = b"\x0f\x0b"
    so.write_bytes(bytes(data))
    restamp(folder)
