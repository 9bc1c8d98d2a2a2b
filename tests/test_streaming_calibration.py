"""Calibration streamed batch by batch: the observers' memory is fixed (histograms whose
counts do not depend on how the data was split, and that merge exactly), and calibration data
comes from folders, files, generators and DataLoader-like iterables one sample at a time,
giving the scales the same data gives in memory."""
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import eqquant
from eqquant.datasets import Samples
from eqquant.errors import EqquantError
from eqquant.quant.calibrate import (HIST_BINS, NUM_BINS, GlobalScale, KLDivergence,
                                     Magnitudes, Percentile, find_scale_by_kl, kl_threshold)
from eqquant.zoo import build, write


def _heavy(rng, n):
    return np.concatenate([0.3 * rng.standard_normal(n), rng.standard_t(3, n // 4)])


@pytest.mark.parametrize("seed", range(4))
def test_a_histogram_is_the_same_however_the_data_is_split_or_merged(seed):
    rng = np.random.default_rng(seed)
    x = _heavy(rng, 40_000) * 10.0 ** rng.uniform(-6, 6)
    x[rng.integers(0, x.size, 50)] = 0.0
    whole = Magnitudes(signed=True)
    whole.add(x)
    parts = np.array_split(x[rng.permutation(x.size)], 13)
    batched = Magnitudes(signed=True)
    for p in parts[:7]:
        batched.add(p)
    rest = Magnitudes(signed=True)
    rest.add(np.zeros(3))                   # (zeros before any other value: bin 0 at any R)
    for p in parts[7:]:
        rest.add(p)
    batched.merge(rest)
    np.testing.assert_array_equal(batched.counts[:, 1:], whole.counts[:, 1:])
    assert batched.counts[0, 0] == whole.counts[0, 0] + 3
    assert batched.top == whole.top and batched.max == whole.max
    assert batched.counts.sum() == x.size + 3
    # the least power of two above every magnitude: bins at most 1/4096 of the largest wide
    assert 2.0 ** (whole.top - 1) <= np.abs(x).max() < 2.0 ** whole.top
    assert whole.width <= np.abs(x).max() / (HIST_BINS / 2)


@pytest.mark.parametrize("q", [0.5, 0.99, 0.9999, 0.99999, 1.0])
def test_the_histogram_quantile_is_within_a_bin_of_the_exact_one(q):
    rng = np.random.default_rng(1)
    x = _heavy(rng, 200_000)
    h = Magnitudes()
    for b in np.array_split(x, 9):
        h.add(b)
    assert abs(h.quantile(q) - np.quantile(np.abs(x), q)) <= h.width
    assert h.quantile(1.0) == np.abs(x).max()


def test_the_kl_observer_finds_tvms_threshold_from_its_histogram():
    rng = np.random.default_rng(2)
    x = _heavy(rng, 100_000).astype(np.float32)
    obs = KLDivergence()
    for b in np.array_split(x, 25):
        obs.update(b)
    hist, edges = obs.seen.symmetric(NUM_BINS)
    assert hist.sum() == pytest.approx(x.size) and edges[-1] == np.abs(x).max()
    exact, _ = np.histogram(x, bins=NUM_BINS, range=(-edges[-1], edges[-1]))
    # each bin's count within the two fine bins its edges cut
    assert np.abs(np.cumsum(hist) - np.cumsum(exact)).max() <= 2 * np.diff(
        np.cumsum(exact)).max() + 1
    t = obs.range().hi
    assert t == pytest.approx(find_scale_by_kl(x), rel=0.02)
    assert t == kl_threshold(hist, edges)


def test_percentile_and_kl_merge_as_if_one_observer_saw_everything():
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal(1000) * s for s in (1, 5, 0.1, 3)]
    for kind in (lambda: Percentile(99.9), KLDivergence, lambda: GlobalScale(2.0)):
        one, a, b = kind(), kind(), kind()
        for i, x in enumerate(batches):
            one.update(x)
            (a if i % 2 else b).update(x)
        a.merge(b)
        assert a.range() == one.range()      # (the clipped share too: from the counts)


def _spec():
    return {"data": ((1, 2, 3), "float32")}


def test_every_layout_of_samples_streams_the_same_samples(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((7, 1, 2, 3)).astype(np.float32)
    folder = tmp_path / "calib"
    folder.mkdir()
    np.save(folder / "a.npy", x[0])                             # one sample
    np.save(folder / "b.npy", x[1:3])                           # a stack
    np.savez(folder / "c.npz", data=x[3:5].reshape(2, 2, 3))    # a batch on the leading axis
    np.savez_compressed(folder / "d.npz", data=x[5:])           # compressed, row by row
    (folder / "notes.txt").write_text("not data")               # (not read)
    want = [s for s in x]
    for source in (folder, x, list(x), iter(list(x)), {"data": x},
                   [(s, i) for i, s in enumerate(x)], x.reshape(7, 2, 3)):
        got = list(Samples(source, _spec()))
        assert len(got) == 7
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g["data"], w)
            assert g["data"].shape == (1, 2, 3)
    assert Samples(folder, _spec()).total == 7 and Samples(x, _spec()).total == 7
    assert Samples(iter(list(x)), _spec()).total is None
    labelled = list(Samples([(x[1:4].reshape(3, 2, 3), np.arange(3))], _spec(), labelled=True))
    assert [int(lab) for _, lab in labelled] == [0, 1, 2]


def test_bad_calibration_data_is_named_with_its_file(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    np.save(folder / "a.npy", np.zeros((1, 2, 3), np.float32))
    np.save(folder / "b.npy", np.zeros((1, 2, 4), np.float32))
    with pytest.raises(EqquantError, match=r"b\.npy: calibration array 'data' has shape "
                                           r"\(1, 2, 4\)"):
        list(Samples(folder, _spec()))
    np.savez(folder / "b.npz", data=np.zeros((1, 2, 3)), other=np.zeros(1))
    (folder / "b.npy").unlink()
    with pytest.raises(EqquantError, match="names other, which the model does not take"):
        list(Samples(folder, _spec()))
    with pytest.raises(EqquantError, match="holds no .npy or .npz"):
        Samples(tmp_path / "calib" / ".." / "calib" / "..", _spec()).total  # noqa: B018
    with pytest.raises(EqquantError, match="no such file or folder"):
        Samples(tmp_path / "nope", _spec())
    with pytest.raises(EqquantError, match="no label"):
        list(Samples([np.zeros((1, 2, 3))], _spec(), labelled=True))


class _Loader:
    """A DataLoader's shape: re-iterable, (images, labels) batches, tensors with __array__."""

    class _T:
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    def __init__(self, x, y, batch):
        self.x, self.y, self.batch = x, y, batch

    def __iter__(self):
        for i in range(0, len(self.x), self.batch):
            yield [self._T(self.x[i:i + self.batch].reshape(-1, *self.x.shape[2:])),
                   self._T(self.y[i:i + self.batch])]


def test_quantize_from_a_folder_a_loader_and_memory_gives_one_table(tmp_path):
    zoo = build("resnet18_stem", image_size=32)
    model = eqquant.load(zoo.module, zoo.params)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 1, 3, 32, 32)).astype(np.float32)
    folder = tmp_path / "calib"
    folder.mkdir()
    for i in range(0, 12, 4):
        np.save(folder / f"{i:03d}.npy", x[i:i + 4])
    probe = rng.standard_normal((1, 3, 32, 32)).astype(np.float32) * 3   # (outside the range)
    for mode in ("percentile", "kl_divergence"):
        runs = [eqquant.quantize(model, data, mode=mode, per_channel=True)
                for data in (list(x), folder, _Loader(x, np.arange(12), 5))]
        tables = [q.save(tmp_path / f"{mode}{i}").with_suffix(".calib.json").read_text()
                  for i, q in enumerate(runs)]
        outs = [q.run(probe) for q in runs]
        for o, t in zip(outs[1:], tables[1:]):
            np.testing.assert_array_equal(o, outs[0])
            assert t == tables[0]


def test_calibration_memory_does_not_grow_with_the_number_of_samples(tmp_path):
    from eqquant.quant.annotate import calibrate
    zoo = build("resnet18_stem", image_size=32)
    rng = np.random.default_rng(6)
    peaks = {}
    for n in (10, 200):
        folder = tmp_path / f"c{n}"
        folder.mkdir()
        for i in range(n):
            np.save(folder / f"{i:04d}.npy",
                    rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
        samples = Samples(folder, {"data": ((1, 3, 32, 32), "float32")})
        calibrate(zoo.module, zoo.params, list(samples)[:2], "percentile")   # (compiled)
        tracemalloc.start()
        table = calibrate(zoo.module, zoo.params, iter(samples), "percentile")
        peaks[n] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert table.ranges
    # 20x the samples: the same histograms (a sample is 12 KB: kept, 200 would be 2.4 MB
    # more per calibrated value)
    assert peaks[200] < 1.2 * peaks[10], peaks


def test_the_cli_calibrates_from_a_folder(tmp_path):
    paths = write(build("resnet18_stem", image_size=32), tmp_path)
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(7)
    for i in range(3):
        np.savez(folder / f"{i}.npz", data=rng.standard_normal((2, 3, 32, 32)).astype("f4"))
    out = tmp_path / "q.ir"
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "quantize", str(paths["ir"]),
                        "--calib", str(folder), "--mode", "percentile", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "calibrating" in r.stderr and out.exists()     # (the bar itself: on a terminal)
    np.savez(folder / "3.npz", data=np.zeros((2, 3, 31, 32), np.float32))
    bad = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "quantize",
                          str(paths["ir"]), "--calib", str(folder), "-o",
                          str(tmp_path / "q2.ir")], capture_output=True, text=True)
    assert bad.returncode != 0 and "3.npz" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "q2.ir").exists()
