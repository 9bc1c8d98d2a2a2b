"""Calibration that cannot silently collapse (#54): a value an op bounds (sigmoid, tanh,
softmax) takes its range as seen under a histogram mode, and a range that cuts off most of
a value's energy, or an output far from the float program's, is warned of in the report and
on the command line."""
from __future__ import annotations

import json

import numpy as np
import pytest

import eqquant
from conftest import cli_exit
from eqquant.ir.loader import save_program
from eqquant.ir.params import bind_params
from eqquant.quant.flow import quantize

CONV = """def @main(%x: Tensor[(1, 3, 8, 8), float32], %w: Tensor[(4, 3, 3, 3), float32]) {{
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1]);
  {tail}
}}
"""


def _program(tail: str, scale: float = 1.0):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 3, 3, 3)) * scale).astype(np.float32)
    return bind_params(eqquant.parse(CONV.format(tail=tail)), {"w": w})


def _samples(n=4, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("op, bounds, scale, keeps", [
    ("sigmoid", (0, 1), 0.0, 30), ("sigmoid", (0, 1), 0.05, 30), ("sigmoid", (0, 1), 1.0, 30),
    ("sigmoid", (0, 1), 20.0, 20), ("tanh", (-1, 1), 0.05, 20), ("tanh", (-1, 1), 1.0, 20),
    ("tanh", (-1, 1), 20.0, 20)])
def test_a_bounded_output_keeps_its_range_under_the_default_mode(op, bounds, scale, keeps):
    """conv -> sigmoid (or tanh), weights zero, small, ordinary or large (outputs all at 0.5,
    near it, spread, or saturated at the bounds): the default mode (kl_divergence) takes the
    output's range as minmax sees it. The issue's conv -> sigmoid (0.7 dB before: its range
    had collapsed to +-0.041) keeps >= 30 dB; a steeper function of a wider range (tanh, or
    weights 20 times larger, where the conv's 8-bit steps are wide against the function's
    slope) keeps >= 20 dB or says it does not."""
    mod, samples = _program(f"{op}(%0)", scale), _samples()
    kl = quantize(mod, None, samples, per_channel=True)
    minmax = quantize(mod, None, samples, "minmax", per_channel=True)
    out = kl.table.ranges["%result"]
    assert (out.lo, out.hi) == (minmax.table.ranges["%result"].lo,
                                minmax.table.ranges["%result"].hi)
    assert bounds[0] <= out.lo <= out.hi <= bounds[1] and out.clipped == 0
    assert kl.output["sqnr"] >= keeps or any("below 20 dB" in w for w in kl.warnings()), \
        kl.report()
    assert not [w for w in kl.warnings() if w.startswith("%result")]


def _sparse_samples(n=4):
    """Inputs whose signal is in a few large values (2% at about 5, the rest noise of 0.01):
    kl_divergence takes the large ones for a tail and cuts them off."""
    rng = np.random.default_rng(2)
    out = []
    for _ in range(n):
        x = rng.standard_normal((1, 3, 8, 8)) * 0.01
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 4, replace=False)] = 5 + 0.1 * rng.standard_normal(4)
        out.append(x.astype(np.float32))
    return out


def test_a_range_that_cuts_off_most_of_a_values_energy_is_warned_of(tmp_path, capsys):
    mod = _program("nn.relu(%0)")
    result = quantize(mod, None, _sparse_samples(), per_channel=True)
    r = result.table.ranges["%x"]
    assert r.clipped > 0.5, r                   # (kl_divergence cut the signal off)
    said = result.warnings()
    assert any(w.startswith("%x: the kl_divergence range") and "cuts off" in w
               for w in said), said
    assert "warning: %x: the kl_divergence range" in result.report()
    path, _ = save_program(tmp_path / "m.ir", mod)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.stack(_sparse_samples()))
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(path), "--calib", str(calib), "-o", str(out)]) == 0
    assert "warning: %x: the kl_divergence range" in capsys.readouterr().out
    report = json.loads(out.with_suffix(".report.json").read_text())
    assert any(w.startswith("%x: the kl_divergence range") for w in report["warnings"])
    # minmax keeps every value: no range is warned of
    clean = quantize(mod, None, _sparse_samples(), "minmax", per_channel=True)
    assert not clean.table.warnings()
    assert all(r.clipped == 0 for r in clean.table.ranges.values())
