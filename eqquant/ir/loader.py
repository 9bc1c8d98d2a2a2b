"""Reading a program and its params from disk (the one place the CLI and the API do it)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import EqquantError
from ..core.nodes import Module
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


TVMSCRIPT_SUFFIXES = (".py", ".tvmscript")


def is_tvmscript(path: str | Path) -> bool:
    """Whether ``path`` holds TVM Relax's TVMScript (by its suffix), not the text IR."""
    return Path(path).suffix in TVMSCRIPT_SUFFIXES


def parse_source(text: str, path: str | Path, values) -> Module:
    """The program in ``text``, read in the format ``path``'s suffix names."""
    if is_tvmscript(path):
        from .tvmscript import metadata_constants, parse_tvmscript
        return parse_tvmscript(text, str(path), metadata_constants(values))
    return parse(text, str(path), constants=meta_constants(values))


def load_program(path: str | Path, params: str | Path | None = None,
                 find_params: bool = True) -> tuple[Module, dict[str, np.ndarray]]:
    """Parse ``path`` (text IR, or TVMScript for a ``.py``/``.tvmscript`` file); params come
    from ``params`` or, when ``find_params``, the ``.npz`` beside the program. Returns the
    module (constants carry their data) and the params."""
    text = read_source(path)
    if params is None and find_params:
        params = default_params_path(path)
        if params is not None:      # the weights saved with this program (outputs.py)
            from .outputs import params_for
            params = params_for(Path(path), text, params)
    values = load_params(params) if params is not None else {}
    return parse_source(text, path, values), values


def save_program(path: str | Path, mod: Module, params: dict[str, np.ndarray] | None = None,
                 outputs=None, note: str = "") -> tuple[Path, Path]:
    """Write ``path`` (text IR) and the ``.npz`` beside it (the module's constants plus
    ``params``) as a pair that always belongs together (:mod:`eqquant.ir.outputs`). With
    ``outputs`` (an :class:`~eqquant.ir.outputs.Outputs`) they are only staged in it, to be
    committed with the other files of the same command. ``note``: lines written as comments
    above the program (what a reader must know of how it was made)."""
    from .outputs import Outputs, stage_program
    from .params import constant_params, params_writer
    from .printer import print_module
    text = "".join(f"// {line}\n" for line in note.splitlines()) + print_module(mod)
    values = {**(params or {}), **constant_params(mod)}
    if outputs is not None:
        return stage_program(outputs, path, text, params_writer(values))
    with Outputs() as out:
        return stage_program(out, path, text, params_writer(values))


def refuse_overwriting_inputs(output: str | Path, *inputs: str | Path | None) -> None:
    """An output (or the .npz it brings) that is one of the command's inputs is an error:
    the input would be lost if the command failed half way, and is replaced if not."""
    out = Path(output)
    mine = {Path(os.path.realpath(p)) for p in (out, out.with_suffix(".npz"))}
    for given in inputs:
        if given is not None and Path(os.path.realpath(given)) in mine:
            raise EqquantError(f"{output}: the output would overwrite the input {given}; "
                               f"write it elsewhere")
