"""The int8 kernel paths a test runs in turn, for hypothesis tests (which cannot take pytest's
monkeypatch fixture): ``EQQUANT_INT8_KERNEL`` set to each, and put back as it was after."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from eqquant.runtime.target import int8_paths as simd_paths


@contextlib.contextmanager
def forced_int8_path(path: str) -> Iterator[None]:
    """EQQUANT_INT8_KERNEL=``path`` inside the block, its old value (or none) after."""
    old = os.environ.get("EQQUANT_INT8_KERNEL")
    os.environ["EQQUANT_INT8_KERNEL"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("EQQUANT_INT8_KERNEL", None)
        else:
            os.environ["EQQUANT_INT8_KERNEL"] = old


def int8_paths() -> list[str]:
    """Every int8 path this CPU has (run each under ``forced_int8_path``: a ``with`` in the
    test's own body puts the variable back whatever the test raises)."""
    return [*simd_paths(), "portable"]
