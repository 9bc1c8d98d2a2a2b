"""Lowering: which kernel each op runs on, and how it is called.

- ``plan.py``: the kernel plan: each int8 site's kernel chosen for a target from one table of
  guards and costs, written into the program (``kernel="x86.vnni"``);
- ``fp32.py``, ``int8.py``, ``indexing.py``: the bindings, one class per kind of op, each preparing its
  kernel's operands once (packed weights, epilogue tables, launches) and calling it.

An op's registry entry names its binding (``kernel="Conv2D"``); ``binding_class`` finds it
among the classes registered here (``@binding``)."""
from __future__ import annotations

from ...errors import EqquantError

_BINDINGS: dict[str, type] = {}


def binding(cls: type) -> type:
    """Register a binding class under its name (``kernel="Conv2D"`` in an op's entry)."""
    if cls.__name__ in _BINDINGS and _BINDINGS[cls.__name__] is not cls:
        raise EqquantError(f"two bindings named {cls.__name__}")
    _BINDINGS[cls.__name__] = cls
    return cls


def binding_class(name: str) -> type:
    """The binding an op's entry names: a class registered here, or "module:Class" for a
    binding defined outside eqquant (an op a user registers with a binding of their own)."""
    if ":" in name:
        import importlib
        module, _, cls = name.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError) as e:
            raise EqquantError(f"kernel binding {name!r}: {e}") from None
    from . import fp32, indexing, int8  # noqa: F401  (their classes register on import)
    try:
        return _BINDINGS[name]
    except KeyError:
        raise EqquantError(f"no kernel binding {name!r} (one of "
                           f"{', '.join(sorted(_BINDINGS))})") from None
