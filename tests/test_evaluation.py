"""eqquant.evaluate / eqquant eval: a model's metric over a labelled set streamed in batches,
every way the set can come; mixed precision's metric measured by it (on Ray:
test_ray.py)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import eqquant
from eqquant.errors import EqquantError
from eqquant.metrics import METRICS

DATA = Path(__file__).parent / "data"
MODEL = DATA / "tiny_resnet.onnx"      # (1, 3, 16, 16) -> 5 classes


@pytest.fixture(scope="module")
def labelled():
    """48 images, labelled with the float model's class for half of them and another class
    for the rest: top1 is 0.5 exactly, top5 (of 5 classes) 1.0."""
    m = eqquant.load(MODEL)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 3, 16, 16)).astype(np.float32)
    classes = np.array([int(np.argmax(m.run(x[i:i + 1]))) for i in range(48)])
    labels = np.where(np.arange(48) % 2 == 0, classes, (classes + 1) % 5)
    return m, x, labels


def test_top1_and_top5_over_every_kind_of_labelled_set(tmp_path, labelled):
    m, x, labels = labelled
    folder = tmp_path / "val"
    folder.mkdir()
    for i in range(0, 48, 16):                 # batches on the input's leading axis
        np.savez(folder / f"{i:03d}.npz", input_1=x[i:i + 16], label=labels[i:i + 16])
    np.savez(tmp_path / "val.npz", **{"input.1": x[:, None], "labels": labels})
    for data in (folder, tmp_path / "val.npz", [(x[i:i + 1], labels[i]) for i in range(48)],
                 ((x[i:i + 8], labels[i:i + 8]) for i in range(0, 48, 8))):
        result = eqquant.evaluate(m, data, "top1")
        assert result.samples == 48 and result.value == 0.5
        np.testing.assert_array_equal(result.scores, np.arange(48) % 2 == 0)
    assert eqquant.evaluate(m, folder, "top5").value == 1.0
    assert "top1: 0.5 over 48 samples (local)" == str(eqquant.evaluate(MODEL, folder))
    mean_sq = eqquant.evaluate(m, [(x[:1], m.run(x[:1]) + 0.5)], "neg_mse")
    assert mean_sq.value == pytest.approx(-0.25)
    custom = eqquant.evaluate(m, folder, lambda out, label: float(out.ravel()[0] > 0))
    assert custom.metric == "<lambda>" and 0 <= custom.value <= 1


def test_bad_evaluation_input_is_a_clear_error(labelled):
    m, x, labels = labelled
    with pytest.raises(EqquantError, match="unknown metric 'top3'.*top1, top5, neg_mse"):
        eqquant.evaluate(m, [(x[:1], 0)], "top3")
    with pytest.raises(EqquantError, match="no label"):
        eqquant.evaluate(m, [x[:1]])
    with pytest.raises(EqquantError, match="label 7 is not a class of an output of 5"):
        eqquant.evaluate(m, [(x[:1], 7)])
    with pytest.raises(EqquantError, match="4 samples but labels of shape \\(3,\\)"):
        eqquant.evaluate(m, [(x[:4], labels[:3])])
    with pytest.raises(EqquantError, match="unknown engine"):
        eqquant.evaluate(m, [(x[:1], 0)], engine="spark")
    with pytest.raises(EqquantError, match="empty"):
        eqquant.evaluate(m, [])
    assert set(METRICS) == {"top1", "top5", "neg_mse"}


def test_the_eval_command(tmp_path, labelled):
    m, x, labels = labelled
    np.savez(tmp_path / "val.npz", input_1=x, label=labels)
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "eval", str(MODEL),
                        str(tmp_path / "val.npz"), "--metric", "top5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "top5: 1 over 48 samples (local)"
    np.savez(tmp_path / "bad.npz", input_1=x)
    bad = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "eval", str(MODEL),
                          str(tmp_path / "bad.npz")], capture_output=True, text=True)
    assert bad.returncode != 0 and "no label" in bad.stderr and "Traceback" not in bad.stderr


def test_mixed_precision_takes_a_metric_over_a_labelled_set(labelled):
    m, x, labels = labelled
    floats = np.array([int(np.argmax(m.run(x[i:i + 1]))) for i in range(16)])
    q = eqquant.quantize(m, list(x[:8, None]), mode="minmax", per_channel=True,
                         metric="top1", eval_data=(x[:16], floats), max_drop=0.0)
    # the float program scores 1.0 on its own classes: the mixed one may not drop
    assert eqquant.evaluate(q, [(x[:16], floats)], "top1").value == 1.0
    with pytest.raises(EqquantError, match="eval_data is for a metric"):
        eqquant.quantize(m, list(x[:2, None]), eval_data=(x[:2], floats[:2]))
