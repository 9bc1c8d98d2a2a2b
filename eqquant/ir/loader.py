"""Reading a program and its params from disk (the one place the CLI and the API do it)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EqquantError, ParamsError
from .nodes import Module
from .params import load_params, meta_constants
from .parser import parse


def read_source(path: str | Path) -> str:
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EqquantError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise EqquantError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") \
            from None
    except OSError as e:
        raise EqquantError(f"{path}: cannot read ({e.strerror})") from None


def default_params_path(ir_path: str | Path) -> Path | None:
    """``model.ir`` -> ``model.npz`` when that file exists."""
    candidate = Path(ir_path).with_suffix(".npz")
    return candidate if candidate.exists() else None


def load_program(path: str | Path, params: str | Path | None = None,
                 find_params: bool = True) -> tuple[Module, dict[str, np.ndarray]]:
    """Parse ``path``; params come from ``params`` or, when ``find_params``, the ``.npz``
    beside the program. Returns the module (meta constants carry their data) and the params."""
    text = read_source(path)
    if params is None and find_params:
        params = default_params_path(path)
    values = load_params(params) if params is not None else {}
    mod = parse(text, str(path), constants=meta_constants(values))
    return mod, values


def load_inputs(path: str | Path, mod: Module, params: dict[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """An ``.npy`` (the one input the program has) or an ``.npz`` keyed by input name."""
    path = Path(path)
    free = [p.name for p in mod.main.params if p.name not in params]
    if path.suffix == ".npy":
        try:
            arr = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise ParamsError(f"{path}: no such input file") from None
        except (ValueError, OSError) as e:
            raise ParamsError(f"{path}: not a readable .npy file ({e})") from None
        if len(free) != 1:
            raise ParamsError(f"{path}: an .npy gives one input, but the program has "
                              f"{len(free)} ({', '.join('%' + f for f in free)}); use an .npz")
        return {free[0]: arr}
    return load_params(path)


def save_program(path: str | Path, mod: Module,
                 params: dict[str, np.ndarray] | None = None) -> tuple[Path, Path]:
    """Write ``path`` (text IR) and the ``.npz`` beside it (the module's constants plus
    ``params``). Both are written to temporary files first and then moved into place."""
    from .params import atomic_write, constant_params, save_params
    from .printer import print_module
    path = Path(path)
    npz = path.with_suffix(".npz")
    text = print_module(mod)
    values = {**(params or {}), **constant_params(mod)}
    save_params(npz, values)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return path, npz
