"""ONNX's own conformance data as a test: the backend test cases the installed ``onnx`` wheel
ships (``onnx/backend/test/data``: ``pytorch-converted``, ``pytorch-operator``, ``simple``; the
``node`` suite where a wheel carries it), each a ``model.onnx`` with input and expected-output
protobufs. Each model is imported and run on its inputs, by the reference interpreter and by
the executor's kernels, and compared with its outputs (rtol and atol 1e-4, NaN equal to NaN).
A case passes, or is refused with a clear error naming the op (an ``EqquantError``); a wrong
number or a crash fails the test. The pass count may not go down: ``PASS_FLOOR`` is raised as
ops land. (The ``real`` and ``light`` suites carry no test data in the wheel.)"""
from __future__ import annotations

import glob
import os
import re
from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
from onnx import numpy_helper  # noqa: E402

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
PASS_FLOOR = 119         # the onnx wheel's data: 119 pass, 21 refused, none wrong


def _cases() -> list[str]:
    out = []
    for suite in SUITES:
        for case in sorted(glob.glob(os.path.join(DATA, suite, "*"))):
            if os.path.exists(os.path.join(case, "model.onnx")) and \
                    glob.glob(os.path.join(case, "test_data_set_*")):
                out.append(case)
    return out


def _arrays(folder: str, kind: str) -> list[np.ndarray]:
    files = sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                   key=lambda p: int(re.search(r"_(\d+)\.pb$", p).group(1)))
    return [numpy_helper.to_array(onnx.load_tensor(p)) for p in files]


def _same(got, want: list[np.ndarray]) -> bool:
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    return len(got) == len(want) and all(
        np.asarray(a).shape == b.shape and np.allclose(np.asarray(a, dtype=b.dtype), b,
                                                      rtol=1e-4, atol=1e-4, equal_nan=True)
        for a, b in zip(got, want))


def classify(case: str) -> tuple[str, str]:
    """(pass | refused | wrong | crash, what happened) for one backend test case."""
    import eqquant
    from eqquant.errors import EqquantError
    from eqquant.ir.interp import run
    try:
        proto = onnx.load(os.path.join(case, "model.onnx"), load_external_data=False)
        weights = {t.name for t in proto.graph.initializer}
        names = [i.name for i in proto.graph.input if i.name not in weights]
        model = eqquant.load(os.path.join(case, "model.onnx"))
        for data in sorted(glob.glob(os.path.join(case, "test_data_set_*"))):
            inputs = dict(zip(names, _arrays(data, "input")))
            want = _arrays(data, "output")
            with np.errstate(all="ignore"):
                if not _same(run(model._bound(), model.named(inputs)), want):
                    return "wrong", f"{os.path.basename(data)}: the reference interpreter"
                if not _same(model.run(inputs), want):
                    return "wrong", f"{os.path.basename(data)}: the executor's kernels"
        return "pass", ""
    except EqquantError as e:
        return "refused", str(e).splitlines()[0]
    except Exception as e:    # noqa: BLE001  (what the test is for: none may get here)
        return "crash", f"{type(e).__name__}: {e}"


def test_onnx_backend_cases_pass_or_are_refused_clearly():
    cases = _cases()
    assert len(cases) >= 100, f"the onnx wheel's backend data: {len(cases)} cases"
    results = {os.path.relpath(c, DATA): classify(c) for c in cases}
    counts = Counter(kind for kind, _ in results.values())
    print(f"\nONNX backend conformance: {dict(counts)} of {len(cases)} cases")
    bad = {k: v for k, v in results.items() if v[0] in ("wrong", "crash")}
    assert not bad, bad
    # a refusal names the node and the op it could not take
    unclear = {k: why for k, (kind, why) in results.items()
               if kind == "refused" and not re.search(r"node \d+ '[^']*' \(\w+\)|input '", why)}
    assert not unclear, unclear
    assert counts["pass"] >= PASS_FLOOR, dict(counts)


def test_every_pytorch_case_passes():
    """The 117 cases ONNX's wheel has from PyTorch's exporter (pytorch-converted and
    pytorch-operator: 1-d, 2-d and 3-d convolutions and pools, PReLU, embeddings, ...) all
    pass; what is refused is in the ``simple`` suite (sequences, strings, gradients, an
    Expand whose shape is an input)."""
    cases = [c for c in _cases() if os.path.basename(os.path.dirname(c)).startswith("pytorch")]
    assert len(cases) >= 117, len(cases)
    failed = {os.path.relpath(c, DATA): r for c in cases if (r := classify(c))[0] != "pass"}
    assert not failed, failed
