"""eqquant.load / eqquant.quantize: one model object over the pipeline, from ONNX files, text IR,
modules or models, calibrated from .npz paths, dicts of stacked arrays or iterables; and the
pictures (SQNR bar chart, program graph)."""
from pathlib import Path

import numpy as np
import pytest

import eqquant
from eqquant.core.types import Dim
from conftest import cli_exit
from eqquant.errors import EqquantError
from eqquant.zoo import build, write

DATA = Path(__file__).parent / "data"
onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")



def test_load_every_kind_of_source_and_run(tmp_path, capsys):
    m = eqquant.load(DATA / "tiny_resnet.onnx")
    assert m.inputs == {"input_1": ((Dim.named("N"), 3, 16, 16), "float32")}   # the batch open
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    sess = ort.InferenceSession(str(DATA / "tiny_resnet.onnx"),
                                providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"input.1": x})[0]
    y = m.run(x)
    assert np.max(np.abs(y - ref)) <= 1e-4 * np.max(np.abs(ref))
    np.testing.assert_array_equal(m.run({"input_1": x}), y)
    ir = m.save(tmp_path)
    assert ir == tmp_path / "tiny_resnet.ir" and ir.with_suffix(".npz").exists()
    for again in (eqquant.load(ir), eqquant.load(ir, params=ir.with_suffix(".npz")),
                  eqquant.load(m.module, m.params), eqquant.load((m.module, m.params)),
                  eqquant.load(m)):
        np.testing.assert_array_equal(again.run(x), y)
    assert "nn.conv2d" in m.text() and "/* ty=Tensor[" in m.text(types=True)
    assert str(m) == m.text()
    m.show()
    assert "/* ty=Tensor[" in capsys.readouterr().out
    with pytest.raises(EqquantError, match="not a quantized model"):
        m.report()
    with pytest.raises(EqquantError, match="takes a path"):
        eqquant.load(42)


@pytest.fixture(scope="module")
def seed_model():
    return build("resnet18_stem", image_size=32)


def test_quantize_from_every_kind_of_calibration_data(tmp_path, seed_model):
    rng = np.random.default_rng(1)
    stacked = rng.standard_normal((4, 1, 3, 32, 32)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", data=stacked)
    model = eqquant.load(seed_model.module, seed_model.params)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    outs = []
    for data in (tmp_path / "calib.npz", str(tmp_path / "calib.npz"), {"data": stacked},
                 list(stacked), [{"data": s} for s in stacked], iter(list(stacked))):
        q = eqquant.quantize(model, data, mode="minmax", per_channel=True)
        outs.append(q.run(x))
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])          # the same calibration each time
    rep = q.report()
    assert rep.layers and rep.output["sqnr"] > 20 and "output: SQNR" in str(rep)
    assert rep.activations == "uint8" and rep.mode == "minmax"
    ref = model.run(x)
    from eqquant.quant.flow import sqnr_db
    assert sqnr_db(ref, outs[0]) > 20        # on an input the calibration did not see
    # saved with its calibration table and report; exported to ONNX as QDQ
    ir = q.save(tmp_path / "q")
    assert ir.with_suffix(".calib.json").exists() and ir.with_suffix(".report.json").exists()
    onnx_path = q.export_onnx(tmp_path / "q.onnx")
    kinds = {n.op_type for n in onnx.load(str(onnx_path)).graph.node}
    assert "QuantizeLinear" in kinds
    with pytest.raises(EqquantError, match="extra, which the model does not take"):
        eqquant.quantize(model, {"data": stacked, "extra": stacked})
    # one array: its shape says how it holds samples (here a stack of them)
    np.testing.assert_array_equal(eqquant.quantize(model, stacked, mode="minmax",
                                                   per_channel=True).run(x), outs[0])
    # arrays of the input's own rank (an `eqquant run -x` input, the zoo's sample): one
    # sample, the same calibration as that sample in a list
    from eqquant.api import calibration_samples
    np.savez(tmp_path / "one.npz", data=stacked[2])
    one = list(calibration_samples(tmp_path / "one.npz", model))
    assert len(one) == 1 and one[0]["data"].shape == (1, 3, 32, 32)
    np.testing.assert_array_equal(
        eqquant.quantize(model, tmp_path / "one.npz", mode="minmax").run(x),
        eqquant.quantize(model, [stacked[2]], mode="minmax").run(x))
    with pytest.raises(EqquantError, match="empty"):
        eqquant.quantize(model, [])


def test_quantize_an_onnx_path_directly():
    rng = np.random.default_rng(2)
    samples = [rng.standard_normal((1, 3, 16, 16)).astype(np.float32) for _ in range(3)]
    q = eqquant.quantize(DATA / "tiny_resnet.onnx", samples, mode="percentile",
                         weight_scale="power2", activations="int8")
    assert q.report().activations == "int8" and q.name == "tiny_resnet.int8"


def test_sqnr_chart_and_graph_pictures(tmp_path, seed_model):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    rng = np.random.default_rng(3)
    q = eqquant.quantize((seed_model.module, seed_model.params),
                         [rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
                          for _ in range(2)], mode="minmax")
    rep = q.report()
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml")):
        path = tmp_path / f"sqnr{suffix}"
        rep.plot(path)
        assert path.read_bytes().startswith(magic)
    fig = rep.plot()
    bars = fig.axes[0].patches
    assert len(bars) == len(rep.layers)
    assert [b.get_width() for b in bars] == pytest.approx([v for _, v in rep.layers])
    assert rep._repr_png_().startswith(b"\x89PNG")               # shows in a notebook
    dot = q.graph()
    assert dot.startswith(f'digraph "{q.name}" {{')          # named after the model
    # (the seed block's sum taken in its last convolution: rules/residual.rules)
    assert "fused.qconv2d\n" in dot and "fused.qconv2d_add\n" in dot and "->" in dot
    assert dot.count("#c6dbef") >= 4            # integer ops shaded
    import shutil

    from eqquant.viz.graph import write_graph
    written = write_graph(dot, tmp_path / "g.svg")
    if shutil.which("dot"):
        assert written == tmp_path / "g.svg" and "<svg" in written.read_text()
    else:                           # no Graphviz: the DOT text, beside the asked-for path
        assert written == tmp_path / "g.dot" and written.read_text() == dot
    # and from the command line: quantize writes the report, plot draws it
    paths = write(seed_model, tmp_path / "m")
    np.savez(tmp_path / "c.npz", data=rng.standard_normal((2, 1, 3, 32, 32)).astype("f4"))
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "c.npz"),
                  "--mode", "minmax", "-o", str(tmp_path / "q.ir")]) == 0
    # the program written has its layouts chosen for the kernels; --layouts nchw writes the
    # interchange one; both compute the same bits
    assert 'data_layout="NHWC"' in (tmp_path / "q.ir").read_text()
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "c.npz"),
                  "--mode", "minmax", "--layouts", "nchw", "-o", str(tmp_path / "n.ir")]) == 0
    nchw_text = (tmp_path / "n.ir").read_text()
    assert "layout_transform" not in nchw_text and 'data_layout="NHWC"' not in nchw_text
    from eqquant.api import load
    sample = {"data": rng.standard_normal((1, 3, 32, 32)).astype("f4")}
    np.testing.assert_array_equal(load(tmp_path / "q.ir").run(sample),
                                  load(tmp_path / "n.ir").run(sample))
    assert cli_exit(["plot", "sqnr", str(tmp_path / "q.report.json"), "-o",
                  str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    assert cli_exit(["plot", "graph", str(tmp_path / "q.ir"), "-o", str(tmp_path / "q.dot")]) == 0
    assert "digraph" in (tmp_path / "q.dot").read_text()
    assert cli_exit(["plot", "sqnr", str(tmp_path / "q.ir"), "-o", str(tmp_path / "x.png")]) == 2
    assert not (tmp_path / "x.png").exists()
