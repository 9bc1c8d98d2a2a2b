"""The check a library passes before any process of the user's loads it: in a child process,
it is loaded and run on a random input, and its output must equal the executor's bit for
bit. A library that crashes there (a signal), fails, hangs or differs is refused with the
reason; the process that asked carries on, with the executor.

    reason = check(executor, "out/resnet18.eqq")     # None: the executor's bits

The child (``python -m eqquant.deploy.check FOLDER INPUTS.npz OUTPUT.npy``) imports numpy
and the loader only, as a later process running the library does.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ..errors import EqquantError

TIMEOUT = 300.0     # seconds the child may take (loading and one run; far more than either)
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent.parent


def random_inputs(types: dict, seed: int = 0) -> dict:
    """A random value for each input (name -> TensorType): floats N(0, 1), booleans, and
    integers over their whole range."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, t in types.items():
        kind = np.dtype(t.dtype).kind
        if kind == "f":
            inputs[name] = rng.standard_normal(t.shape).astype(t.dtype)
        elif kind == "b":
            inputs[name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            info = np.iinfo(t.dtype)
            inputs[name] = rng.integers(info.min, info.max, t.shape, dtype=t.dtype,
                                        endpoint=True)
    return inputs


def check(executor, folder: str | os.PathLike) -> str | None:
    """Why the library in ``folder`` (saved from ``executor``) is refused: it crashed,
    failed or hung while a child process loaded and ran it, or its output differs from the
    executor's on a random input. None: the same bits."""
    types = {name: t for name, (_, t) in executor.inputs.items()}
    inputs = random_inputs(types)
    try:
        want = executor.run(inputs)
    except EqquantError as e:       # (a program refusing such an input: not checked)
        return f"the saved library could not be checked on a random input ({e.message})"
    with tempfile.TemporaryDirectory(prefix="eqquant-check.") as work:
        given, got_path = Path(work) / "inputs.npz", Path(work) / "output.npy"
        np.savez(given, **inputs)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")) if p)}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "eqquant.deploy.check", str(folder), str(given),
                 str(got_path)], capture_output=True, text=True, env=env, timeout=TIMEOUT,
                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return f"the library did not finish within {TIMEOUT:.0f} s while checking it"
        if done.returncode < 0:
            return f"the library crashed with {_signal_name(-done.returncode)} while " \
                   "checking it"
        if done.returncode != 0:
            said = done.stderr.strip().splitlines()
            return "the library failed while checking it" + \
                (f" ({said[-1]})" if said else f" (exit status {done.returncode})")
        got = np.load(got_path, allow_pickle=False)
    if want.dtype == got.dtype and want.shape == got.shape and \
            np.array_equal(want, got, equal_nan=True):
        return None
    return "the saved library's output differed from the executor's on a random input"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child(folder: str, given: str, out: str) -> int:
    """The child's side: load the library, run it on the inputs, save its output."""
    from .loader import Library
    try:
        library = Library(folder)
        with np.load(given, allow_pickle=False) as f:
            inputs = {name: f[name] for name in f.files}
        np.save(out, library.run(inputs), allow_pickle=False)
    except EqquantError as e:
        print(e.message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:4]))
