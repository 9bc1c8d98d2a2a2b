"""The Python API mirrors the CLI: load, optimize, explain, save, run."""
import numpy as np

import eqquant
from eqquant.zoo import build, write


def test_api_round_trip(tmp_path):
    paths = write(build("conv_bn", image_size=16), tmp_path)
    mod, params = eqquant.load_program(paths["ir"])
    result = eqquant.optimize(mod, params, rules=["simplify", "bn_fold"], cost="nodes",
                              extractor="ilp")
    text = result.explain()
    assert "fold_batch_norm_into_conv2d" in text and "cost model nodes" in text
    ir_path, npz = eqquant.save_program(tmp_path / "opt.ir", result.module)
    again, values = eqquant.load_program(ir_path)
    x = np.random.default_rng(0).normal(size=(1, 3, 16, 16)).astype("float32")
    np.testing.assert_allclose(eqquant.run(again, {"data": x}),
                               eqquant.run(mod, {"data": x}, params), rtol=1e-5, atol=1e-5)
    assert "meta[relay.Constant][0]" in ir_path.read_text()


def test_cli_opt_and_extract(tmp_path):
    import subprocess
    import sys
    paths = write(build("resnet18_stem", image_size=32), tmp_path)
    out = tmp_path / "opt.ir"
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "opt", str(paths["ir"]),
                        "-o", str(out), "--schedule", "simplify; bn_fold; simplify"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.exists() and out.with_suffix(".npz").exists()
    assert "nn.batch_norm" not in out.read_text()
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "extract", str(paths["ir"]),
                        "--explain", "--cost", "nodes"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "rules that fired:" in r.stdout and "e-graph:" in r.stdout
    assert "phase bn_fold" in r.stdout and "saturated" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "opt", str(paths["ir"]),
                          "-o", str(tmp_path / "x.ir"), "--schedule", "nosuch"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not loaded" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "x.ir").exists()
