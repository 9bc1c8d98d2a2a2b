"""The check a library passes before any process of the user's loads it: in a child process,
it is loaded and run on a random input, and its output must equal the executor's bit for
bit. A library that crashes there (a signal), fails, hangs or differs is refused with the
reason; the process that asked carries on, with the executor.

    with Checker() as checker:                  # the child starts (Python, numpy) ...
        build(executor, folder)                 # ... while the library is linked
        reason = checker.check(executor, folder)    # None: the executor's bits

The child (``python -m eqquant.deploy.check``) imports numpy and the loader only, as a later
process running the library does, then reads what to check on its standard input.
"""
from __future__ import annotations

import json
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


def random_inputs(types: dict, seed: int = 0, bounds: dict | None = None) -> dict:
    """A random value for each input (name -> TensorType): floats N(0, 1), booleans, and
    integers over their whole range, or within the input's ``bounds`` (name -> (lo, hi,
    why): the indices a take_at reads, ``Executor.bounds``)."""
    rng = np.random.default_rng(seed)
    bounds = bounds or {}
    inputs = {}
    for name, t in types.items():
        kind = np.dtype(t.dtype).kind
        if kind == "f":
            inputs[name] = rng.standard_normal(t.shape).astype(t.dtype)
        elif kind == "b":
            inputs[name] = rng.integers(0, 2, t.shape).astype(bool)
        else:
            info = np.iinfo(t.dtype)
            lo, hi = bounds.get(name, (info.min, info.max))[:2]
            inputs[name] = rng.integers(max(lo, info.min), min(hi, info.max), t.shape,
                                        dtype=t.dtype, endpoint=True)
    return inputs


class Checker:
    """A child process started ahead (its start-up, most of a check's time, overlaps the
    library's linking), which checks one library (``check``); closed unused, it exits."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")) if p)}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "eqquant.deploy.check"], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._child.poll() is None:
            try:
                self._child.communicate("", timeout=TIMEOUT)    # (nothing to check: it exits)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.communicate()

    def check(self, executor, folder: str | os.PathLike) -> str | None:
        """Why the library in ``folder`` (saved from ``executor``) is refused: it crashed,
        failed or hung while the child loaded and ran it, or its output differs from the
        executor's on a random input. None: the same bits."""
        from ..core.types import bind_type
        from .build import per_sample
        _, batch = per_sample(executor)
        # (a library whose batch is open: checked on one run of its batched table and one of
        # a sample, against the executor's runs at those batches, which is what it promises)
        size = _batched_size(Path(folder)) if batch else None
        runs = [size, 1] if size else [1, 1] if batch else []
        types = {name: bind_type(t, {batch: sum(runs)}) if batch else t
                 for name, (_, t) in executor.inputs.items()}
        inputs = random_inputs(types, bounds=executor.bounds)
        try:
            want = executor.run(inputs) if not batch else np.concatenate([executor.run(
                {k: v[sum(runs[:j]):sum(runs[:j + 1])] for k, v in inputs.items()})
                for j in range(len(runs))])
        except EqquantError as e:       # (a program refusing such an input: not checked)
            self.close()
            return f"the saved library could not be checked on a random input ({e.message})"
        with tempfile.TemporaryDirectory(prefix="eqquant-check.") as work:
            given, got_path = Path(work) / "inputs.npz", Path(work) / "output.npy"
            np.savez(given, **inputs)
            asked = json.dumps({"folder": str(Path(folder).resolve()), "inputs": str(given),
                                "output": str(got_path)})
            try:
                _, said = self._child.communicate(asked + "\n", timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.communicate()
                return f"the library did not finish within {TIMEOUT:.0f} s while checking it"
            code = self._child.returncode
            if code < 0:
                return f"the library crashed with {_signal_name(-code)} while checking it"
            if code != 0:
                said = said.strip().splitlines()
                return "the library failed while checking it" + \
                    (f" ({said[-1]})" if said else f" (exit status {code})")
            got = np.load(got_path, allow_pickle=False)
        if want.dtype == got.dtype and want.shape == got.shape and \
                np.array_equal(want, got, equal_nan=True):
            return None
        return "the saved library's output differed from the executor's on a random input"


def _batched_size(folder: Path) -> int | None:
    """The batch of the batched table of launches the library in ``folder`` holds (None:
    none, or a plan that cannot be read: the child's load then says what is wrong)."""
    try:
        table = json.loads((folder / "plan.json").read_text()).get("batched")
        return int(table["inputs"][0]["shape"][0]) if table else None
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child() -> int:
    """The child's side: wait for what to check (one line of JSON on standard input; none:
    exit), load the library, run it on the inputs, save its output."""
    from .loader import Library
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    asked = json.loads(line)
    try:
        library = Library(asked["folder"])
        with np.load(asked["inputs"], allow_pickle=False) as f:
            inputs = {name: f[name] for name in f.files}
        np.save(asked["output"], library.run(inputs), allow_pickle=False)
    except EqquantError as e:
        print(e.message, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_child())
