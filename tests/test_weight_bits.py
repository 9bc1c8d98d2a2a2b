"""7-bit weights (``quantize(..., weight_bits=7)``, ``--weight-bits 7``): every weight within
+-63, so that on a CPU without VNNI each convolution runs on the AVX2 byte kernel over whole
bytes (``x86.avx2.w7``); the program is still the reference's, bit for bit, on every path."""
from __future__ import annotations

import numpy as np
import pytest

import eqquant
from conftest import cli_exit
from eqquant.core.nodes import Call, Constant, post_order
from eqquant.errors import EqquantError
from eqquant.ir.interp import run
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.target import Target
from eqquant.zoo import build
from kernel_paths import forced_int8_path


def _quantized(bits: int):
    m = build("resnet18_stem", image_size=32)
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")} for _ in range(3)]
    q = eqquant.quantize((m.module, m.params), samples, mode="minmax",
                         per_channel=True, cost="cpu", weight_bits=bits)
    return q, samples


def _conv_weights(mod) -> list[np.ndarray]:
    return [n.args[1].data for n in post_order(mod.main.body)
            if isinstance(n, Call) and n.op_name.startswith("fused.qconv2d")
            and isinstance(n.args[1], Constant)]


@pytest.fixture(scope="module")
def both():
    return {bits: _quantized(bits) for bits in (8, 7)}


def test_7_bit_weights_reach_63_and_no_further_and_cost_some_accuracy(both):
    (q8, _), (q7, _) = both[8], both[7]
    w8, w7 = _conv_weights(q8.module), _conv_weights(q7.module)
    assert len(w7) == len(w8) >= 3
    for w in w7:            # per output channel: the largest magnitude is the grid's end
        per_channel = np.abs(w.astype(np.int64)).reshape(w.shape[0], -1).max(axis=1)
        assert per_channel.max() == 63 and (per_channel <= 63).all()
    assert max(int(np.abs(w.astype(np.int64)).max()) for w in w8) == 127
    s8, s7 = q8.quantized.output["sqnr"], q7.quantized.output["sqnr"]
    assert 20 < s7 < s8, (s7, s8)      # (half the weights' steps: some dB, not all)
    assert "7-bit weights" in str(q7.report()) and "7-bit weights" not in str(q8.report())
    assert "calibration minmax" in str(q8.report())


def test_on_an_avx2_target_every_convolution_takes_the_narrow_byte_kernel():
    avx2 = pytest.importorskip("eqquant.runtime.kernels.avx2")
    if not avx2.available():
        pytest.skip("this CPU has no AVX2: the byte kernels cannot run here")
    # (quantized and planned on the AVX2 path, whatever path the environment pins: a program
    # names its kernels when it is extracted)
    with forced_int8_path("avx2"):
        (q7, samples), (q8, _) = _quantized(7), _quantized(8)
        mod7, mod8 = q7.quantized.runnable, q8.quantized.runnable
        target = Target.named("avx2")
        ex7 = Executor(mod7, target)
        kernels = {d.chosen.kernel for d in ex7.kernel_decisions if d.site.op.startswith(
            "fused.qconv2d") and d.site.groups == 1}
        assert kernels == {"x86.avx2.w7"}, kernels
        assert "x86.avx2.w7" not in {d.chosen.kernel for d in Executor(mod8, target)
                                     .kernel_decisions}
        for x in samples:
            np.testing.assert_array_equal(ex7.run(x), run(mod7, x))
        far = {"data": 40 * samples[0]["data"]}        # far outside the calibrated range
        np.testing.assert_array_equal(ex7.run(far), run(mod7, far))


def test_weight_bits_other_than_8_or_7_are_refused():
    with pytest.raises(EqquantError, match="weight bits must be one of 8, 7"):
        _quantized(6)


def test_the_quantize_command_takes_weight_bits(tmp_path, capsys):
    assert cli_exit(["zoo", "resnet18_stem", "-o", str(tmp_path), "--image-size", "32"]) == 0
    ir = tmp_path / "resnet18_stem.ir"
    calib = tmp_path / "resnet18_stem.input.npz"
    out = tmp_path / "q7.ir"
    assert cli_exit(["quantize", str(ir), "--calib", str(calib), "--mode", "minmax",
                     "--per-channel", "--weight-bits", "7", "--cost", "cpu", "-o",
                     str(out)]) == 0
    assert "7-bit weights" in capsys.readouterr().out
    m = eqquant.load(out)
    assert all(int(np.abs(w.astype(np.int64)).max()) <= 63 for w in _conv_weights(m.module))
    assert cli_exit(["quantize", str(ir), "--calib", str(calib), "--weight-bits", "6",
                     "-o", str(tmp_path / "q6.ir")]) == 2
    assert not (tmp_path / "q6.ir").exists()
