"""The same work on a local Ray cluster (two workers) as on this process: evaluation and
calibration's statistics, which must give the local results bit for bit. (The ray extra:
CI installs it.)"""
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

import eqquant
from eqquant.errors import EqquantError

MODEL = Path(__file__).parent / "data" / "tiny_resnet.onnx"

ray = pytest.importorskip("ray", reason="the ray extra is not installed")


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_evaluation_on_ray_is_the_local_one_bit_for_bit(cluster, tmp_path):
    m = eqquant.load(MODEL)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 3, 16, 16)).astype(np.float32)
    labels = rng.integers(0, 5, 48)
    q = eqquant.quantize(m, list(x[:8, None]), mode="minmax", per_channel=True)
    lib = tmp_path / "lib"
    done = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "compile",
                           str(q.save(tmp_path / "q")), "-o", str(lib)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    sources = [q, lib]          # (in memory: its text travels; a library folder: opened)
    data = [(x[i:i + 4], labels[i:i + 4]) for i in range(0, 48, 4)]
    for model in sources:
        local = eqquant.evaluate(model, data, "top1")
        on_ray = eqquant.evaluate(model, data, "top1", engine="ray", workers=2, chunk=5)
        assert on_ray.engine == "ray" and on_ray.samples == 48
        np.testing.assert_array_equal(on_ray.scores, local.scores)
        assert on_ray.value == local.value
    probe = eqquant.evaluate(q, [(x[:1], q.run(x[:1]))], "neg_mse", engine="ray")
    assert probe.value == 0.0           # a worker's outputs are the local executor's bits
    with pytest.raises(EqquantError, match="label 9 is not a class"):
        eqquant.evaluate(q, [(x[:1], 9)], engine="ray", workers=1)


@pytest.mark.parametrize("mode", ["percentile", "kl_divergence", "minmax"])
def test_calibration_on_ray_merges_to_the_local_table(cluster, mode):
    from eqquant.quant.annotate import calibrate
    m = eqquant.load(MODEL)
    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) * (1 + i % 3)
               for i in range(21)]
    local = calibrate(m.module, m.params, iter(samples), mode)
    on_ray = calibrate(m.module, m.params, iter(samples), mode, engine="ray", workers=2,
                       chunk=4)
    assert on_ray == local and local.ranges
