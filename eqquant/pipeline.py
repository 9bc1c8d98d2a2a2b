"""The main job, stage by stage, on a zoo model: what ``eqquant demo`` runs.

Stages so far: build the model, write it as text IR + params, parse it back, type-check,
check the round trip, run the reference interpreter. Each stage reports what it did and how
long it took.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import EqquantError
from .ir.interp import run
from .ir.loader import load_program
from .ir.params import load_params
from .ir.parser import parse
from .ir.printer import print_module
from .ir.typecheck import check_module
from .zoo import build, write


class _Stages:
    def __init__(self, echo: Callable[[str], None]):
        self.echo = echo

    def __call__(self, label: str, fn, *args):
        t0 = time.perf_counter()
        out = fn(*args)
        self.echo(f"  {label:<34s} {1e3 * (time.perf_counter() - t0):9.1f} ms")
        return out


def demo(model: str, out_dir: str | Path, echo: Callable[[str], None] = print) -> dict:
    stage = _Stages(echo)
    echo(f"eqquant demo: {model}")
    zoo_model = stage("build zoo model", build, model)
    paths = stage(f"write {Path(out_dir)}/", write, zoo_model, out_dir)
    mod, params = stage("parse text IR + params", load_program, paths["ir"])
    types = stage("type-check", check_module, mod)
    text = print_module(mod)
    if stage("round trip print -> parse", lambda: parse(text)) != mod:
        raise EqquantError("internal: the printed program does not parse back to itself")
    inputs = load_params(paths["input"])
    out = stage("run (reference interpreter)", run, mod, inputs, params)
    n_ops = text.count(" = ") + 1
    echo(f"  program: {n_ops} values, output {types[id(mod.main.body)]}")
    echo(f"  output: mean {float(np.mean(out)):.5g}, std {float(np.std(out)):.5g}")
    return {"module": mod, "output": out, "paths": paths}
