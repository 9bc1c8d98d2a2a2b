"""rules/quantize.rules and the calibrate/annotate passes: the seed-004 flow, as rules."""
import numpy as np
import pytest

from conftest import bert_sample
from eqquant.ir.interp import run
from eqquant.core.nodes import Call, post_order
from eqquant.ir.typecheck import infer_types
from eqquant.optimizer import optimize
from eqquant.api import calibration_samples, load
from eqquant.quant.annotate import annotate, calibrate
from eqquant.quant.calibrate import CalibrationTable
from eqquant.rules.check import check_ruleset
from eqquant.rules.loader import load_rules
from eqquant.runtime.execution.executor import Executor
from eqquant.zoo import build

SIZE = 64


def test_every_quantize_rule_holds_within_its_tolerance():
    rules = load_rules("quantize")
    report = check_ruleset(rules, trials=4)
    assert report.ok, report.format()
    names = [r.rule.name for r in report.results]
    assert {r.name for r in rules.rules} == set(names)    # every rule checked, each variant
    assert all(r.trials >= 1 for r in report.results)
    # the central rule is checked for every activation dtype it can take
    assert {"quantize_calibrated[int8]", "quantize_calibrated[uint8]"} <= {
        r.rule.name + r.variant for r in report.results}
    # dtype(?x) in {int8, uint8} made one checked variant per dtype
    assert {"conv2d_in_integers[int8]", "conv2d_in_integers[uint8]",
            "add_in_integers_rounding_once"} <= set(names)


@pytest.fixture(scope="module")
def flow():
    m = build("resnet18_stem", image_size=SIZE)
    fp = optimize(m.module, m.params, ["simplify", "bn_fold", "fusion"],
                  "simplify; bn_fold; simplify; fusion")
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, SIZE, SIZE)).astype("float32")}
               for _ in range(4)]
    table = calibrate(fp.module, None, samples, "kl_divergence")
    q = optimize(annotate(fp.module, table, weight_scale="max"), None, ["quantize"])
    return fp, table, q, rng


def test_seed004_flow_is_integer_from_quantize_to_dequantize(flow):
    fp, table, q, _ = flow
    assert set(table.ranges) == {"%data", "%0", "%1", "%2", "%3", "%result"}
    mod = q.module
    types = infer_types(mod)
    calls = [n for n in post_order(mod.main.body) if isinstance(n, Call)]
    names = [c.op_name for c in calls]
    assert names[0] == "qnn.quantize" and names[-1] == "qnn.dequantize"
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1
    # each conv with its int32 bias, relu and requantization is one fused.qconv2d
    convs = [c for c in calls if c.op_name == "fused.qconv2d"]
    assert len(convs) == 3 and all(types[id(c)].dtype == "int8" for c in convs)
    assert all(types[id(c.args[1])].dtype == "int8" for c in convs)  # weights folded to int8
    assert [c.attrs["activation"] for c in convs] == ["relu", "relu", "none"]
    pools = [c for c in calls if c.op_name == "nn.max_pool2d"]
    assert len(pools) == 1 and types[id(pools[0])].dtype == "int8"
    assert names.count("qnn.add") == 1
    # between the two ends, every value is an integer
    inner = calls[1:-1]
    assert all(types[id(c)].dtype in ("int8", "int32") for c in inner)


def test_seed004_int8_accuracy(flow):
    fp, _, q, rng = flow
    x = {"data": rng.normal(size=(1, 3, SIZE, SIZE)).astype("float32")}
    ref = run(fp.module, x)
    out = run(q.module, x)
    sqnr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - out) ** 2))
    assert sqnr > 20.0


def test_calibration_table_and_npz_samples(tmp_path, flow):
    fp, table, _, rng = flow
    table.save(tmp_path / "t.json")
    assert CalibrationTable.load(tmp_path / "t.json") == table
    np.savez(tmp_path / "calib.npz", data=rng.normal(size=(3, 1, 3, SIZE, SIZE)).astype("f4"))
    samples = list(calibration_samples(tmp_path / "calib.npz", load(fp.module)))
    assert len(samples) == 3 and samples[0]["data"].shape == (1, 3, SIZE, SIZE)
    t2 = calibrate(fp.module, None, samples, "minmax", skip=["%1"])
    assert "%1" not in t2.ranges and t2.ranges["%data"].hi > 0


def _normalized_ops(mod):
    """Op names in a canonical order (operands by decreasing height, then in order), without
    the annotations and the casts that do not change the dtype: what TVM's realize output
    and eqquant's realize view both mean, regardless of how their printers order bindings."""
    from eqquant.core.nodes import Expr, rewrite
    types = infer_types(mod)

    def drop(node, kids):
        if isinstance(node, Call) and not isinstance(node.op, Expr):
            if node.op_name == "annotation.stop_fusion":
                return kids[0]
            if node.op_name == "cast" and types[id(node.args[0])] == types[id(node)]:
                return kids[0]
        return None
    body = rewrite(mod.main.body, drop)
    height = {}
    for n in post_order(body):
        height[id(n)] = 1 + max((height[id(c)] for c in n.children()), default=0)
    out, seen = [], set()

    def visit(n):
        stack = [(n, False)]
        while stack:
            node, done = stack.pop()
            if done:
                if isinstance(node, Call) and node.op_name:
                    out.append(node.op_name)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            kids = sorted(node.children(), key=lambda c: -height[id(c)])
            stack.extend((c, False) for c in reversed(kids))
    visit(body)
    return out


def test_realize_view_has_the_seed_final_op_sequence(flow):
    from eqquant.ir.parser import parse
    from seed_listings import listings
    from eqquant.quant.realize import realize_view
    from conftest import seed_file
    fp, _, q, rng = flow
    view = realize_view(q.module)
    # the view computes exactly what the QNN program does
    x = {"data": rng.normal(size=(1, 3, SIZE, SIZE)).astype("float32")}
    np.testing.assert_array_equal(run(view, x), run(q.module, x))
    seed_final = parse(listings(seed_file("004"))[-1][1])
    ours = _normalized_ops(view)
    theirs = _normalized_ops(seed_final)
    assert ours == theirs, f"\nours:   {ours}\ntheirs: {theirs}"
    assert ours[:4] == ["multiply", "round", "clip", "cast"]
    assert ours[-2:] == ["cast", "multiply"] and ours.count("nn.conv2d") == 3


def _clip_bounds(mod) -> set[tuple[float, float]]:
    return {(float(n.attrs["a_min"]), float(n.attrs["a_max"]))
            for n in post_order(mod.main.body) if isinstance(n, Call) and n.op_name == "clip"}


def test_int8_realize_view_saturates_as_the_seed_does(flow):
    """TVM's int8 flow clips every int8 value to [-127, 127] (the seed's realize listing, all
    of its clips); the TVM-compatible mode's realize view has the same bounds and its
    quantize, requantize and add saturate there, value for value."""
    from eqquant.ir.parser import parse
    from seed_listings import listings
    from eqquant.quant.realize import realize_view
    from conftest import seed_file
    _, _, q, rng = flow
    seed_final = parse(listings(seed_file("004"))[-1][1])
    assert _clip_bounds(seed_final) == {(-127.0, 127.0)}
    view = realize_view(q.module)
    assert _clip_bounds(view) == {(-127.0, 127.0)}
    # far outside the calibrated range every int8 value saturates at -127 or 127, never -128
    big = {"data": (rng.normal(size=(1, 3, SIZE, SIZE)) * 1e3).astype("float32")}
    seen = []
    Executor(q.module).run(big, observe=lambda node, v: seen.append(np.array(v))
                           if np.asarray(v).dtype == np.int8 else None)
    assert seen and min(int(v.min()) for v in seen) == -127
    np.testing.assert_array_equal(run(view, big), run(q.module, big))


def test_fixed_point_constants_decompose_as_tvm_does():
    """Every (multiplier, shift) of the seed's realize listing is what quantize_multiplier
    gives for the real scale it stands for (Q31 significand in [2**30, 2**31), TVM's
    convention); requantization rounds UPWARD (ties toward +inf), TVM's default."""
    import re
    from eqquant.ops.numerics import fixed_point_multiply
    from eqquant.ops.fixed_point import quantize_multiplier
    from conftest import seed_file
    text = seed_file("004").read_text()
    pairs = {(int(m), int(s)) for m, s in re.findall(
        r"fixed_point_multiply\(%\d+, multiplier=(\d+), shift=(-?\d+)\)", text)}
    assert len(pairs) >= 6
    for m, s in pairs:
        assert quantize_multiplier(m * 2.0 ** (s - 31)) == (m, s)
    # ties go up: 0.5 * 3 = 1.5 -> 2 and -1.5 -> -1
    half = quantize_multiplier(0.5)
    np.testing.assert_array_equal(fixed_point_multiply(np.array([3, -3], np.int64), *half),
                                  [2, -1])


def test_quantize_cli_writes_program_weights_and_table(tmp_path):
    import subprocess
    import sys
    from eqquant.zoo import write
    paths = write(build("resnet18_stem", image_size=32), tmp_path)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", data=rng.normal(size=(3, 1, 3, 32, 32)).astype("f4"))
    out = tmp_path / "q.ir"
    r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "quantize", str(paths["ir"]),
                        "--calib", str(tmp_path / "calib.npz"), "--mode", "minmax",
                        "--per-channel", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "output: SQNR" in r.stdout and "cosine" in r.stdout
    assert out.exists() and out.with_suffix(".npz").exists()
    assert CalibrationTable.load(out.with_suffix(".calib.json")).mode == "minmax"
    from eqquant.ir.loader import load_program
    mod, _ = load_program(out)
    assert "fused.qconv2d" in out.read_text() and "annotation.calibrated" not in out.read_text()
    bad = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "quantize", str(paths["ir"]),
                          "--calib", str(paths["ir"]), "-o", str(tmp_path / "x.ir")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_resnet18_per_channel_minmax_sqnr():
    """resnet18, per-channel minmax on 16 N(0, 1) inputs: output SQNR against fp32 >= 34 dB
    (ONNX Runtime's per-channel u8/s8 QDQ: 34.2 dB on such a model and data)."""
    from eqquant.quant.flow import quantize
    m = build("resnet18")
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, 224, 224)).astype("float32")}
               for _ in range(16)]
    check = {"data": rng.normal(size=(1, 3, 224, 224)).astype("float32")}
    r = quantize(m.module, m.params, samples, "minmax", per_channel=True, check_input=check)
    assert r.output["sqnr"] >= 34.0, r.report()
    ops = [n.op_name for n in post_order(r.module.main.body) if isinstance(n, Call)]
    assert ops.count("fused.qconv2d") == 20 and ops.count("qnn.add") == 8
    assert ops.count("qnn.dense") == 1          # the classifier runs in integers too
    # uint8 activations: every relu joined the quantization of the op before it; the one
    # requantization is the classifier's, to the output's marked (fake-quantized) grid
    assert "nn.relu" not in ops and ops.count("qnn.requantize") == 1
    assert ops[-2:] == ["qnn.requantize", "qnn.dequantize"]
    assert len(r.layers) >= 20, "per-layer SQNR is reported for the fused convolutions"


def test_slices_and_transposes_between_quantized_layers_move_8_bit_values():
    """ShuffleNet's channel split and shuffle (slice, reshape, transpose) between two int8
    convolutions: the layout ops run on the 8-bit tensor, with no dequantize/quantize pair
    around them, and the program computes what the marked program computes."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.input("x", (1, 64, 28, 28))
    w1 = b.param("w1", rng.normal(size=(64, 64, 3, 3)).astype("float32"))
    w2 = b.param("w2", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    y = b.call("nn.relu", b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1]))
    half = b.call("strided_slice", y, begin=[32], end=[64], axes=[1])
    shuffled = b.call("reshape", b.call("transpose", b.call(
        "reshape", half, newshape=[1, 2, 16, 28, 28]), axes=[0, 2, 1, 3, 4]),
        newshape=[1, 32, 28, 28])
    mod, params = b.finish(b.call("nn.conv2d", shuffled, w2, padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 64, 28, 28)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    types = infer_types(module)
    layout = [n for n in post_order(module.main.body) if isinstance(n, Call)
              and n.op_name in ("strided_slice", "transpose", "reshape")]
    assert layout and all(types[id(n)].dtype in ("int8", "uint8") for n in layout)
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1
    assert q.report().output["sqnr"] > 25


@pytest.mark.parametrize("branches", [2, 3, 4])
def test_a_concatenation_of_quantized_branches_stays_integer(branches, tmp_path):
    """SqueezeNet's fire module, Inception's and GoogLeNet's blocks: branches joined by
    concatenate. Each branch is requantized to the join's parameters and the 8-bit tensors
    are joined: no dequantize/quantize pair is left around the join."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(branches)
    b = Builder()
    x = b.input("x", (1, 16, 20, 20))
    parts = []
    for i in range(branches):
        w = b.param(f"w{i}", rng.normal(size=(8 + 8 * i, 16, 3, 3)).astype("float32"))
        parts.append(b.call("nn.relu", b.call("nn.conv2d", x, w, padding=[1, 1, 1, 1])))
    joined = b.call("concatenate", b.tuple(*parts), axis=1)
    channels = sum(8 + 8 * i for i in range(branches))
    w = b.param("wo", rng.normal(size=(16, channels, 1, 1)).astype("float32"))
    mod, params = b.finish(b.call("nn.conv2d", joined, w))
    samples = [rng.normal(size=(1, 16, 20, 20)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    types = infer_types(module)
    concat = [n for n in post_order(module.main.body) if isinstance(n, Call)
              and n.op_name == "concatenate"]
    assert len(concat) == 1 and types[id(concat[0])].dtype in ("int8", "uint8")
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1
    assert q.report().output["sqnr"] > 25
    x0 = samples[0]
    np.testing.assert_array_equal(q.run(x0), run(module, {"x": x0}))   # executor = reference
    # exported, the 8-bit join is an ONNX Concat of uint8 tensors, which ONNX Runtime runs
    # (its convolutions are inexact on CPUs without VNNI: compared as a whole, in dB)
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from eqquant.quant.flow import sqnr_db
    path = q.export_onnx(tmp_path / "concat.onnx")
    concat_inputs = [n.input for n in onnx.load(str(path)).graph.node if n.op_type == "Concat"]
    assert len(concat_inputs) == 1 and len(concat_inputs[0]) == branches
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sqnr_db(q.run(x0), sess.run(None, {sess.get_inputs()[0].name: x0})[0]) > 17


@pytest.mark.parametrize("act", ["nn.hardswish", "sigmoid", "nn.gelu"])
def test_an_activation_between_quantized_layers_is_a_lookup_table(act, tmp_path):
    """MobileNet-v3's hardswish, EfficientNet's sigmoid, GELU: between two int8 convolutions
    the activation is one 256-entry table lookup (qnn.lut, the table folded to a constant);
    the executor computes the reference's bits, and the QDQ export (a Gather from the table)
    gives them in ONNX Runtime."""
    pytest.importorskip("onnxruntime")
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.input("x", (1, 32, 16, 16))
    w1 = b.param("w1", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    w2 = b.param("w2", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    y = b.call(act, b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1]))
    mod, params = b.finish(b.call("nn.conv2d", y, w2, padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 32, 16, 16)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.lut") == 1 and act not in names
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1
    assert q.report().output["sqnr"] > 25
    x0 = samples[0]
    ours = q.run(x0)
    np.testing.assert_array_equal(ours, run(module, {"x": x0}))
    # the export: the activation alone, so that no ONNX Runtime convolution (inexact on CPUs
    # without VNNI) stands between the two: its table lookup gives eqquant's bits
    import onnxruntime as ort
    b = Builder()
    x = b.input("x", (1, 32, 16, 16))
    alone, _ = b.finish(b.call(act, x))
    q = eqquant.quantize(eqquant.load(alone, {}), samples, mode="minmax", per_channel=True)
    assert "qnn.lut" in str(q.quantized.module)
    path = q.export_onnx(tmp_path / "lut.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {sess.get_inputs()[0].name: x0})[0]
    np.testing.assert_array_equal(q.run(x0), theirs)


def test_silu_between_quantized_layers_is_one_lookup_table():
    """SiLU as EfficientNet's exports write it, x * sigmoid(x): the sigmoid becomes a table of
    x, and the product of x and a table of x one table of x (rule
    product_with_its_own_lookup_as_lookup_table): one qnn.lut, no qnn.mul, the reference's
    bits on inputs far outside the calibrated range too."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(8)
    b = Builder()
    x = b.input("x", (1, 16, 12, 12))
    w1 = b.param("w1", rng.normal(size=(16, 16, 3, 3)).astype("float32"))
    w2 = b.param("w2", rng.normal(size=(16, 16, 3, 3)).astype("float32"))
    y = b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1])
    y = b.call("multiply", y, b.call("sigmoid", y))
    mod, params = b.finish(b.call("nn.conv2d", y, w2, padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 16, 12, 12)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.lut") == 1 and "qnn.mul" not in names and "sigmoid" not in names
    assert q.report().output["sqnr"] > 25
    for scale in (1.0, 50.0):
        x0 = scale * samples[1]
        np.testing.assert_array_equal(q.run(x0), run(module, {"x": x0}))


def test_squeeze_excitation_gates_multiply_in_integers():
    """EfficientNet's and MobileNet-v3's squeeze-excitation: a feature map times its sigmoid
    gate (broadcast over the pixels) is qnn.mul, the exact integer product requantized once;
    the executor computes the reference's bits and the output is close to fp32."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.input("x", (1, 32, 16, 16))
    w1 = b.param("w1", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    ws = b.param("ws", rng.normal(size=(32, 32, 1, 1)).astype("float32"))
    bs = b.param("bs", rng.normal(size=(32,)).astype("float32"))
    w2 = b.param("w2", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    y = b.call("nn.relu", b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1]))
    gate = b.call("sigmoid", b.call("nn.bias_add", b.call(
        "nn.conv2d", b.call("nn.global_avg_pool2d", y), ws), bs, axis=1))
    mod, params = b.finish(b.call("nn.conv2d", b.call("multiply", y, gate), w2,
                                  padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 32, 16, 16)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert "qnn.mul" in names and "multiply" not in names
    x0 = samples[0]
    np.testing.assert_array_equal(q.run(x0), run(module, {"x": x0}))
    assert q.report().output["sqnr"] > 25


def test_a_nearest_upsample_between_quantized_layers_stays_integer(tmp_path):
    """A decoder's nn.Upsample(scale_factor=2) (ONNX Resize, nearest): it picks 8-bit values,
    so the program stays integer from one quantize to one dequantize, and the QDQ export
    resizes the 8-bit tensor itself."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", (1, 32, 12, 12))
    w1 = b.param("w1", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    w2 = b.param("w2", rng.normal(size=(32, 32, 3, 3)).astype("float32"))
    y = b.call("nn.relu", b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1]))
    y = b.call("image.resize2d", y, size=[24, 24], method="nearest_neighbor",
               coordinate_transformation_mode="asymmetric", rounding_method="floor")
    mod, params = b.finish(b.call("nn.conv2d", y, w2, padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 32, 12, 12)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    types = infer_types(module)
    resize = [n for n in post_order(module.main.body) if isinstance(n, Call)
              and n.op_name == "image.resize2d"]
    assert len(resize) == 1 and types[id(resize[0])].dtype == "uint8"
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1
    path = _runs_as_the_reference_and_in_onnx_runtime(q, samples[0], tmp_path / "up.onnx")
    import onnx
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("Resize") == 1


def _mbconv_with_se(rng):
    """EfficientNet's first blocks: stem conv + SiLU, depthwise conv + SiLU, squeeze-excitation
    (global pool, 1x1 conv + SiLU, 1x1 conv + sigmoid gate, multiply), projection; then an
    average pool that counts its padding (Inception's) and the classifier's global pool."""
    from eqquant.ir.builder import Builder
    b = Builder()

    def conv(x, cin, cout, k, s=1, g=1, name="w"):
        w = b.param(name, (rng.normal(size=(cout, cin // g, k, k)) *
                           np.sqrt(2 / (cin // g * k * k))).astype("float32"))
        bias = b.param(name + ".b", (rng.normal(size=(cout, 1, 1)) * 0.1).astype("float32"))
        return b.call("add", b.call("nn.conv2d", x, w, strides=[s, s], padding=[k // 2] * 2,
                                    groups=g), bias)

    def silu(y):
        return b.call("multiply", y, b.call("sigmoid", y))

    x = b.input("x", (1, 3, 32, 32))
    y = silu(conv(x, 3, 32, 3, 2, name="stem"))
    y = silu(conv(y, 32, 32, 3, 1, 32, name="dw"))
    g = silu(conv(b.call("nn.global_avg_pool2d", y), 32, 8, 1, name="se1"))
    y = b.call("multiply", y, b.call("sigmoid", conv(g, 8, 32, 1, name="se2")))
    y = conv(y, 32, 16, 1, name="proj")
    y = b.call("nn.avg_pool2d", y, pool_size=[3, 3], padding=[1, 1, 1, 1],
               count_include_pad=True)
    y = conv(y, 16, 16, 3, name="last")
    return b.finish(b.call("nn.batch_flatten", b.call("nn.global_avg_pool2d", y)))


def test_squeeze_excitation_and_pools_stay_integer(tmp_path):
    """Gates on tensors of a few values are lookup tables too (their tables are constants),
    and averages of 8-bit values are 8-bit ops: one quantize at the input, one dequantize at
    the output, nothing in float between; the executor computes the reference's bits and
    ONNX Runtime runs the QDQ export."""
    import eqquant
    rng = np.random.default_rng(5)
    mod, params = _mbconv_with_se(rng)
    samples = [rng.normal(size=(1, 3, 32, 32)).astype("float32") for _ in range(3)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    types = infer_types(module)
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1, names
    floats = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)
              and types[id(n)].dtype == "float32" and n.op_name != "qnn.dequantize"]
    assert floats == ["nn.batch_flatten"] or floats == [], floats
    assert names.count("qnn.lut") == 4 and "qnn.avg_pool2d" in names
    assert names.count("qnn.global_avg_pool2d") in (1, 2)
    assert q.report().output["sqnr"] > 20
    _runs_as_the_reference_and_in_onnx_runtime(q, samples[0], tmp_path / "se.onnx")


def test_a_dense_block_stays_integer(tmp_path):
    """DenseNet: each layer joins every earlier output (here up to six inputs, more than any
    fixed-arity rule would cover), then a batch norm no convolution absorbs, relu and a
    convolution. The join requantizes each input to its own parameters (one rule over any
    number of inputs), the batch norm and relu one lookup table per channel (the batch norm's
    multiply and add, each a table per channel, composed into one: rule
    per_channel_lookup_of_a_lookup_is_one_lookup): one quantize at the input, one dequantize
    at the output."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.input("x", (1, 8, 12, 12))
    feats = [x]
    for i in range(5):
        cin = 8 * (i + 1)
        joined = b.call("concatenate", b.tuple(*feats), axis=1) if len(feats) > 1 else feats[0]
        stats = [b.param(f"bn{i}.{k}", v.astype("float32")) for k, v in (
            ("g", rng.uniform(0.5, 1.5, cin)), ("b", rng.normal(size=cin) * 0.1),
            ("m", rng.normal(size=cin) * 0.1), ("v", rng.uniform(0.5, 1.5, cin)))]
        y = b.call("nn.relu", b.get(b.call("nn.batch_norm", joined, *stats), 0))
        w = b.param(f"w{i}", (rng.normal(size=(8, cin, 3, 3)) / np.sqrt(cin * 9))
                    .astype("float32"))
        feats.append(b.call("nn.conv2d", y, w, padding=[1, 1, 1, 1]))
    out = b.call("concatenate", b.tuple(*feats), axis=1)
    w = b.param("wo", (rng.normal(size=(16, 48, 1, 1)) / 7).astype("float32"))
    mod, params = b.finish(b.call("nn.conv2d", out, w))
    samples = [rng.normal(size=(1, 8, 12, 12)).astype("float32") for _ in range(3)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1, names
    assert "nn.batch_norm" not in names and names.count("qnn.lut") == 5, names
    types = infer_types(module)
    joins = [n for n in post_order(module.main.body) if isinstance(n, Call)
             and n.op_name == "concatenate"]
    assert len(joins) == 5 and all(types[id(j)].dtype == "uint8" for j in joins)
    assert max(len(j.args[0].fields) for j in joins) == 6
    assert q.report().output["sqnr"] > 25
    _runs_as_the_reference_and_in_onnx_runtime(q, samples[0], tmp_path / "dense.onnx")


def _runs_as_the_reference_and_in_onnx_runtime(q, x0, path):
    """The executor computes the reference's bits, and ONNX Runtime runs the QDQ export (its
    convolutions are inexact on CPUs without VNNI: compared as a whole, in dB)."""
    np.testing.assert_array_equal(q.run(x0), run(q.quantized.module, {"x": x0}))
    ort = pytest.importorskip("onnxruntime")
    from eqquant.quant.flow import sqnr_db
    q.export_onnx(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sqnr_db(q.run(x0), sess.run(None, {sess.get_inputs()[0].name: x0})[0]) > 17
    return path


def test_a_join_with_a_constant_exports(tmp_path):
    """ViT's class token joined to the patch embeddings: the constant is quantized with the
    join's parameters when the program compiles, and the QDQ export writes it as it is."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(2)
    b = Builder()
    x = b.input("x", (1, 16, 8, 8))
    w1 = b.param("w1", rng.normal(size=(16, 16, 3, 3)).astype("float32"))
    y = b.call("nn.relu", b.call("nn.conv2d", x, w1, padding=[1, 1, 1, 1]))
    token = b.param("token", np.abs(rng.normal(size=(1, 16, 1, 8))).astype("float32"))
    y = b.call("concatenate", b.tuple(token, y), axis=2)
    w2 = b.param("w2", rng.normal(size=(16, 16, 3, 3)).astype("float32"))
    mod, params = b.finish(b.call("nn.conv2d", y, w2, padding=[1, 1, 1, 1]))
    samples = [rng.normal(size=(1, 16, 8, 8)).astype("float32") for _ in range(3)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    names = [n.op_name for n in post_order(q.quantized.module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.quantize") == 1 and names.count("qnn.dequantize") == 1, names
    _runs_as_the_reference_and_in_onnx_runtime(q, samples[0], tmp_path / "token.onnx")


def test_a_convnext_block_stays_integer_around_its_layer_norm(tmp_path):
    """ConvNeXt's block as PyTorch exports it: depthwise conv, to NHWC, LayerNorm, a dense
    layer on the 4-d value with its bias added after (bias + x), GELU written out op by op
    (x / sqrt 2 and its constants scalars), the second dense layer, back to NCHW, the layer
    scale (a (C, 1, 1) constant times x) and the residual add. Everything but the LayerNorm
    (no 8-bit rule) runs in integers: each bias in its dense layer, the GELU one table, the
    layer scale a table per channel; the executor computes the reference's bits and ONNX Runtime runs the
    export."""
    pytest.importorskip("onnxruntime")
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(11)
    c, h = 64, 8
    b = Builder()
    x = b.input("x", (1, c, h, h))
    p = lambda name, *shape: b.param(name, rng.normal(size=shape).astype("float32"))  # noqa
    stem = b.call("nn.conv2d", x, p("w0", c, c, 1, 1))
    y = b.call("nn.conv2d", stem, p("dw", c, 1, 7, 7), padding=[3, 3, 3, 3], groups=c)
    y = b.call("transpose", y, axes=[0, 2, 3, 1])
    y = b.call("nn.layer_norm", y, b.param("g", np.ones(c, "float32")),
               b.param("beta", np.zeros(c, "float32")), axis=3)

    def linear(v, k, n, name):
        flat = b.call("reshape", v, newshape=[-1, k])
        out = b.call("nn.dense", flat, p(name, n, k))
        return b.call("add", p(name + "_b", n), b.call("reshape", out, newshape=[1, h, h, n]))
    y = linear(y, c, 4 * c, "fc1")
    erf = b.call("erf", b.call("divide", y, b.scalar(np.float32(np.sqrt(2)))))
    y = b.call("multiply", b.call("multiply", y, b.call("add", erf, b.scalar(1.0))),
               b.scalar(0.5))
    y = linear(y, 4 * c, c, "fc2")
    y = b.call("transpose", y, axes=[0, 3, 1, 2])
    scale = b.param("layer_scale", rng.uniform(0.1, 1.0, size=(c, 1, 1)).astype("float32"))
    y = b.call("add", b.call("multiply", scale, y), stem)
    mod, params = b.finish(b.call("nn.conv2d", y, p("w1", c, c, 1, 1)))
    samples = [rng.normal(size=(1, c, h, h)).astype("float32") for _ in range(4)]
    # (priced by the roofline: whether a dense layer of 64 rows is faster in int8 is this
    # machine's to measure, not this test's)
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True,
                         cost="cpu")
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    # each bias joins its dense layer (bias_before_reshape_keeping_last_axis), so the GELU is
    # one table of 256 entries; the layer scale a table per channel
    assert names.count("qnn.lut") == 2, names
    tables = sorted(tuple(n.args[1].type.shape) for n in post_order(module.main.body)
                    if isinstance(n, Call) and n.op_name == "qnn.lut")
    assert tables == [(64, 256), (256,)], tables
    assert not {"erf", "divide", "multiply", "nn.gelu", "fused.dense"} & set(names), names
    adds = [n for n in post_order(module.main.body) if isinstance(n, Call) and n.op_name == "add"]
    assert len(adds) == 2 and all(a.args[0].op_name == "qnn.dense" for a in adds)
    # one quantize at the input, one dequantize at the output, one pair around the LayerNorm
    assert names.count("qnn.quantize") == 2 and names.count("qnn.dequantize") == 2
    assert q.report().output["sqnr"] > 20
    x0 = samples[0]
    np.testing.assert_array_equal(q.run(x0), run(module, {"x": x0}))
    # ONNX Runtime runs the export; its u8 x s8 products (dense layers and convolutions) are
    # inexact on CPUs without VNNI and four of them stand in a row here: compared in dB
    import onnxruntime as ort
    from eqquant.quant.flow import sqnr_db
    path = q.export_onnx(tmp_path / "convnext.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sqnr_db(q.run(x0), sess.run(None, {"x": x0})[0]) > 8


def test_a_bert_encoder_quantizes_with_integer_attention():
    """The zoo's BERT-style encoder (token IDs and an attention mask as inputs): every dense
    layer and both of each attention's products of activations are integer
    (``batch_matmul_in_integers``); the mask, -inf where a token is padding, has no range and
    stays float, said so; quantize/dequantize pairs remain only around the LayerNorms and
    softmaxes and in the embeddings' sum; the executor computes the reference's bits on
    inputs calibration never saw."""
    import eqquant
    m = build("bert_tiny", seq=8)
    rng = np.random.default_rng(3)

    def sample():
        return bert_sample(rng)
    q = eqquant.quantize(eqquant.load(m.module, m.params), [sample() for _ in range(6)],
                         mode="minmax", per_channel=True)
    module = q.quantized.module
    names = [n.op_name for n in post_order(module.main.body) if isinstance(n, Call)]
    assert names.count("qnn.batch_matmul") == 4 and "nn.batch_matmul" not in names
    assert names.count("qnn.dense") == 13 and "nn.dense" not in names
    quantized_from = sorted(n.args[0].op_name for n in post_order(module.main.body)
                            if isinstance(n, Call) and n.op_name == "qnn.quantize")
    # 5 LayerNorms, 2 softmaxes; the embedding look-up and the first of its two sums
    assert quantized_from == ["add"] * 2 + ["nn.layer_norm"] * 5 + ["nn.softmax"] * 2 \
        + ["take_at"], quantized_from
    kept = q.quantized.kept_float
    assert any("computes -inf" in why for why in kept), kept
    assert q.quantized.table.unbounded
    assert q.report().output["sqnr"] > 25
    for _ in range(3):
        s = sample()
        np.testing.assert_array_equal(q.run(s), run(module, s))


def test_a_feed_forward_layers_bias_and_gelu_are_one_table_at_rank_three():
    """A transformer's feed-forward layer as PyTorch exports it, on a (batch, tokens, d)
    value: the rows flattened for the dense layer, its output reshaped back, the bias added
    after (bias + x), GELU written out. The bias (a table per channel) and the GELU (one
    table) become one table per channel (``table_of_per_channel_lookup_is_one_lookup``, at
    any rank); the executor computes the reference's bits."""
    from eqquant.ir.builder import Builder
    import eqquant
    rng = np.random.default_rng(12)
    t, d, f = 8, 16, 32
    b = Builder()
    x = b.input("x", (1, t, d))
    out = b.call("nn.dense", b.call("reshape", x, newshape=[-1, d]),
                 b.param("w1", rng.normal(size=(f, d)).astype("float32")))
    y = b.call("add", b.param("b1", rng.normal(size=f).astype("float32")),
               b.call("reshape", out, newshape=[1, t, f]))
    erf = b.call("erf", b.call("divide", y, b.scalar(np.float32(np.sqrt(2)))))
    y = b.call("multiply", b.call("multiply", y, b.call("add", erf, b.scalar(1.0))),
               b.scalar(0.5))
    y = b.call("nn.dense", b.call("reshape", y, newshape=[-1, f]),
               b.param("w2", rng.normal(size=(d, f)).astype("float32")))
    mod, params = b.finish(y)
    samples = [rng.normal(size=(1, t, d)).astype("float32") for _ in range(4)]
    q = eqquant.quantize(eqquant.load(mod, params), samples, mode="minmax", per_channel=True)
    module = q.quantized.module
    luts = [n for n in post_order(module.main.body) if isinstance(n, Call)
            and n.op_name == "qnn.lut"]
    assert len(luts) == 1, [n.op_name for n in post_order(module.main.body)
                            if isinstance(n, Call)]
    assert luts[0].args[0].op_name != "qnn.lut"
    x0 = samples[0]
    np.testing.assert_array_equal(q.run(x0), run(module, {"x": x0}))
