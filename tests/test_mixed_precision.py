"""Mixed precision by extraction: the program is cut at its marks, every variant of every
region saturated in one e-graph, and the choice of marks solved as an integer program. What
it extracts must be the marked program with exactly the kept marks (never an approximate
merge of a value with its quantized round trip), on any input."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("scipy")

from eqquant.core.nodes import Call, post_order  # noqa: E402
from eqquant.errors import EqquantError  # noqa: E402
from eqquant.extract.cost import CpuLatency  # noqa: E402
from eqquant.ir.interp import run  # noqa: E402
from eqquant.ir.parser import parse  # noqa: E402
from eqquant.quant.annotate import annotate, mark_labels  # noqa: E402
from eqquant.quant.flow import quantize  # noqa: E402
from eqquant.quant.mixed import MixedSpace, search  # noqa: E402
from eqquant.runtime.execution.executor import Executor  # noqa: E402

from soundness_programs import conv_program  # noqa: E402


def _space(text, params, shape, dtype, per_channel, seed):
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.uniform(0, 1, shape).astype(np.float32)} for _ in range(3)]
    r = quantize(parse(text), params, samples, "minmax", dtype=dtype, per_channel=per_channel,
                 cost="cpu", layouts=False)     # (its fp32 program and table are what is read)
    marked = annotate(r.fp32, r.table, dtype, "max", per_channel)
    space = MixedSpace(marked, CpuLatency(), names=mark_labels(marked, r.fp32))
    space.measure_sensitivity(samples)
    return r, space, rng


def _ops(mod):
    return [n.op_name for n in post_order(mod.main.body) if isinstance(n, Call)]


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.lists(st.sampled_from(["none", "relu", "clip"]), min_size=2, max_size=3),
       residual=st.booleans(), dtype=st.sampled_from(["uint8", "int8"]),
       per_channel=st.booleans(), seed=st.integers(0, 2 ** 16), data=st.data())
def test_a_mixed_program_is_the_marked_program_with_its_kept_marks(layers, residual, dtype,
                                                                    per_channel, seed, data):
    rng = np.random.default_rng(seed)
    text, params = conv_program(rng, 4, layers, residual, False)
    shape = (1, 4, 6, 6)
    r, space, rng = _space(text, params, shape, dtype, per_channel, seed)
    values = space.marked_values()
    inner = [v for v in values[:-1]]
    dropped = data.draw(st.lists(st.sampled_from(inner), unique=True, max_size=len(inner)))
    choice = space.solve(keep_fp32=dropped)
    assert [v for v in dropped if choice.kept[v]] == []
    program = space.program(choice)
    wanted = space.only(keep=[v for v, k in choice.kept.items() if k],
                        weights_of=[g.label for g in space.regions
                                    if g.weights and all(choice.variants[g.index][0])])
    body = program.main.body
    for scale in (1.0, -3.0, 10.0):      # inside the calibrated range, negative, far outside
        x = {"x": (rng.uniform(0, 1, shape) * scale).astype(np.float32)}
        got, want = run(program, x), run(wanted, x)
        np.testing.assert_array_equal(Executor(program).run(x), got)
        # the approx rules round differently from the marked program by a step at most
        # each; a step's difference inside grows through the later layers' weights, but a
        # fact carried out of the calibrated range (a relu dropped, a clamp moved) would be
        # tens of steps. A step: the result's scale when it is 8-bit, else 1/255 of its span.
        if choice.kept[values[-1]]:
            assert body.op_name == "qnn.dequantize"
            step = float(body.args[1].value)
        else:
            assert body.op_name != "qnn.dequantize"
            step = float(np.ptp(want)) / 255 or 1.0
        err = np.abs(got.astype(np.float64) - want) / step
        assert err.max() <= 8.0 + 1e-6, (dropped, scale, err.max())
        assert np.mean(err <= 2.0 + 1e-6) >= 0.9, (dropped, scale)
    if dropped:      # a dropped mark leaves its readers in float
        assert {"fused.conv2d", "nn.conv2d", "add"} & set(_ops(program))


def test_all_int8_is_the_int8_program_bit_for_bit():
    rng = np.random.default_rng(3)
    text, params = conv_program(rng, 4, ["relu", "none"], True, True)
    shape = (1, 4, 6, 6)
    r, space, rng = _space(text, params, shape, "uint8", True, 3)
    program = space.program(space.solve(int8_only=True))
    x = {"x": rng.uniform(-1, 2, shape).astype(np.float32)}
    np.testing.assert_array_equal(run(program, x), run(r.module, x))


@pytest.mark.parametrize("dtype,per_channel", [("uint8", True), ("int8", False)])
def test_each_marks_noise_is_that_of_the_program_with_it_alone(dtype, per_channel):
    """measure_sensitivity runs the unmarked program once per sample and then, for each mark,
    only what reads the marked value (or the layer reading the marked weights): the noise
    equals, bit for bit, the noise of the whole program with that one mark run on its own
    executor (the definition), on inputs inside and far outside the calibrated range."""
    from eqquant.passes.fold import fold_constants
    from eqquant.quant.flow import _flat
    from eqquant.zoo import build
    m = build("resnet18_stem", image_size=32, seed=1)
    rng = np.random.default_rng(1)
    calib = [{"data": rng.normal(size=(1, 3, 32, 32)).astype(np.float32)} for _ in range(2)]
    r = quantize(m.module, m.params, calib, "minmax", dtype=dtype, per_channel=per_channel,
                 cost="cpu", layouts=False)     # (its fp32 program and table are what is read)
    marked = annotate(r.fp32, r.table, dtype, "max", per_channel)
    space = MixedSpace(marked, CpuLatency(), names=mark_labels(marked, r.fp32))
    samples = calib[:1] + [{"data": (10 * rng.normal(size=(1, 3, 32, 32))).astype(np.float32)}]
    space.measure_sensitivity(samples)
    refs = [_flat(Executor(space.only()).run(x)) for x in samples]

    def noise(mod):
        ex = Executor(fold_constants(mod))
        return sum(float(np.sum((_flat(ex.run(x)) - ref) ** 2)) for x, ref in zip(samples, refs))
    assert all(np.array_equal(a, b) for a, b in zip(space.refs, refs))
    regions = [g for g in space.regions if g.mark is not None or g.weights]
    assert sum(1 for g in regions if g.weights) >= 3 and sum(g.mark is not None
                                                               for g in regions) >= 3
    for g in regions:
        if g.mark is not None:
            assert g.noise == noise(space.only(keep=[g.label])) > 0, g.label
        if g.weights:
            assert g.weight_noise == noise(space.only(weights_of=[g.label])) > 0, g.label


def test_a_rerun_changes_only_what_reads_the_changed_value():
    """Executor.rerun: steps reading no changed value are not run again (their kernels are
    not called), and the result is the full run's of the program so changed."""
    text = """def @main(%x: Tensor[(4), float32]) {
  %0 = nn.relu(%x);
  %1 = add(%x, 1f);
  multiply(%0, %1)
}
"""
    mod = parse(text)
    ex = Executor(mod)
    x = np.array([-1, 0, 2, 3], np.float32)
    trace = ex.trace({"x": x})
    np.testing.assert_array_equal(ex.rerun(trace), ex.run({"x": x}))
    relu = mod.main.body.args[0]
    calls = []
    for step in ex.steps:
        real = step.fn
        if step.kind == "kernel":
            step.fn = (lambda a, o, _f=real, _l=step.label: (calls.append(_l), _f(a, o)))
        elif step.kind == "reference":
            step.fn = (lambda *a, _f=real, _l=step.label: (calls.append(_l), _f(*a))[1])
    got = ex.rerun(trace, {ex.slot(relu): np.full(4, 2, np.float32)})
    np.testing.assert_array_equal(got, 2 * (x + 1))
    assert len(calls) == 1 and "multiply" in calls[0]


def test_a_rerun_with_two_layers_bound_to_other_weights_is_that_program_run():
    """Executor.with_constant twice in one rerun (a region holding two layers' weights):
    each new constant has a slot of its own, and the result is the full run's of the
    program with both weights replaced, bit for bit."""
    from eqquant.ir.builder import Builder
    from eqquant.ir.params import bind_params
    from eqquant.passes.fold import fold_constants
    rng = np.random.default_rng(5)
    w1, w2 = (rng.normal(size=s).astype(np.float32) for s in ((16, 8), (4, 16)))

    def program(a, b):
        bl = Builder()
        x = bl.input("x", (2, 8))
        y = bl.call("nn.dense", bl.call("nn.relu", bl.call("nn.dense", x, bl.param("w1", a),
                                                          units=16)),
                    bl.param("w2", b), units=4)
        mod, params = bl.finish(y)
        return fold_constants(bind_params(mod, params))
    ex = Executor(program(w1, w2))
    x = {"x": rng.normal(size=(2, 8)).astype(np.float32)}
    trace = ex.trace(x)
    body = ex.module.main.body
    dense2, dense1 = body, body.args[0].args[0]
    v1, v2 = w1 * 0.5 + 1, w2[::-1].copy()
    i1, s1, c1 = ex.with_constant(dense1, 1, v1)
    i2, s2, c2 = ex.with_constant(dense2, 1, v2)
    assert set(c1).isdisjoint(c2)
    got = ex.rerun(trace, {**c1, **c2}, {i1: s1, i2: s2})
    np.testing.assert_array_equal(got, Executor(program(v1, v2)).run(x))
    assert not np.array_equal(got, ex.run(x))


def test_every_query_is_answered_from_one_saturation(monkeypatch):
    from eqquant.egraph import engine
    count = [0]
    real = engine.EGraphSession.run

    def counting(self, phases):
        count[0] += 1
        return real(self, phases)
    monkeypatch.setattr(engine.EGraphSession, "run", counting)
    rng = np.random.default_rng(5)
    text, params = conv_program(rng, 4, ["relu", "relu", "none"], True, False)
    shape = (1, 4, 6, 6)
    r, space, _ = _space(text, params, shape, "uint8", False, 5)
    before = count[0]
    first = space.marked_values()[1]
    answers = [space.solve(int8_only=True), space.solve(), space.solve(min_sqnr=45.0),
               space.solve(keep_fp32=[first]),
               space.solve(budget=space.solve(int8_only=True).cost * 1.5)]
    search(space, min_sqnr=40.0)
    assert count[0] == before and space.saturations == 1
    int8, _, strict, pinned, budget = answers
    assert not int8.floats and pinned.kept[first] is False
    assert strict.sqnr >= 45.0 and budget.cost <= answers[0].cost * 1.5 + 1e-12
    assert strict.noise <= int8.noise


def test_min_sqnr_is_met_as_measured_and_reported():
    from eqquant.zoo import build
    m = build("resnet18_stem", image_size=32)
    rng = np.random.default_rng(0)
    samples = [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")} for _ in range(4)]
    full = quantize(m.module, m.params, samples, "minmax", cost="cpu")
    target = full.output["sqnr"] + 4.0
    r = quantize(m.module, m.params, samples, "minmax", cost="cpu", min_sqnr=target)
    assert r.mixed.rounds[-1].measured >= target
    assert r.output["sqnr"] >= target - 1e-9       # (the report's own measure, same samples)
    text = r.report()
    assert "mixed precision" in text and "one saturation" in text and "round 1" in text
    with pytest.raises(EqquantError, match="no marked value %nope"):
        quantize(m.module, m.params, samples, "minmax", cost="cpu", keep_fp32=["%nope"])


def test_a_user_metric_with_a_largest_drop():
    from eqquant.zoo import build
    m = build("resnet18_stem", image_size=32)
    rng = np.random.default_rng(1)
    samples = [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")} for _ in range(4)]
    held = [{"data": rng.normal(size=(1, 3, 32, 32)).astype("float32")} for _ in range(4)]
    ref = [Executor(quantize(m.module, m.params, samples, "minmax", cost="cpu").fp32).run(x)
           for x in held]

    def metric(run_program):       # minus the mean squared error on held-out inputs
        return -float(np.mean([np.mean((run_program(x) - y) ** 2) for x, y in zip(held, ref)]))
    r = quantize(m.module, m.params, samples, "minmax", cost="cpu", metric=metric,
                 max_drop=1e-3)
    assert metric(Executor(r.module).run) >= -1e-3
    assert r.mixed.evaluations >= 2


def _stem_files(tmp_path):
    """The ResNet stem's text IR and weights, and a calibration set (calib.npz), in
    ``tmp_path``."""
    from eqquant.zoo import build, write
    paths = write(build("resnet18_stem", image_size=32), tmp_path)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", data=rng.normal(size=(3, 1, 3, 32, 32)).astype("float32"))
    return paths


def test_the_command_line_takes_the_queries(tmp_path):
    from conftest import cli_exit
    paths = _stem_files(tmp_path)
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "calib.npz"),
                     "--mode", "minmax", "--cost", "cpu", "--min-sqnr", "45",
                     "-o", str(out)]) == 0
    assert out.exists()
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "calib.npz"),
                     "--keep-fp32", "%nope", "-o", str(tmp_path / "r.ir")]) != 0
    assert not (tmp_path / "r.ir").exists()
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "calib.npz"),
                     "--int8-only", "--min-sqnr", "40", "-o", str(tmp_path / "r.ir")]) != 0


def test_pareto_points_and_the_cost_table_from_the_command_line(tmp_path, capsys):
    import json
    from conftest import cli_exit
    paths = _stem_files(tmp_path)
    out = tmp_path / "q.ir"
    assert cli_exit(["quantize", str(paths["ir"]), "--calib", str(tmp_path / "calib.npz"),
                     "--mode", "minmax", "--cost", "cpu", "--pareto", "--explain",
                     "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "latency against SQNR (one saturation)" in text
    assert "predicted ms" in text and "measured ms" in text and "fused.qconv2d" in text
    points = json.loads(out.with_suffix(".pareto.json").read_text())
    assert len(points) == 6
    sqnrs = [p["sqnr"] for p in points]
    assert sqnrs[-1] >= sqnrs[0] and points[-1]["floats"] >= points[0]["floats"]
    pytest.importorskip("matplotlib")
    assert cli_exit(["plot", "pareto", str(out.with_suffix(".pareto.json")),
                     "-o", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000
    (tmp_path / "bad.json").write_text("{}")
    assert cli_exit(["plot", "pareto", str(tmp_path / "bad.json"), "-o",
                     str(tmp_path / "q.png")]) != 0


def test_the_digits_cnn_keeps_its_top1_within_the_drop_allowed():
    """The small CNN trained on scikit-learn's digits (bench/mixed_precision.py made it): a
    metric (top-1 on 500 held-out images) and a largest drop of 0.1 point."""
    pytest.importorskip("onnx")
    from pathlib import Path
    from eqquant.api import load
    data = Path(__file__).parent / "data"
    d = np.load(data / "digits.npz", allow_pickle=False)

    def batches(images):
        x = (images.astype(np.float32) / 16.0)[:, None]
        return [{"image": x[i:i + 50]} for i in range(0, len(x), 50)]
    calib, val = batches(d["calib"]), batches(d["val"])
    labels = [d["val_labels"][i:i + 50] for i in range(0, len(d["val_labels"]), 50)]

    def top1(run):
        return float(np.mean(np.concatenate([np.argmax(run(v), axis=1) == t
                                             for v, t in zip(val, labels)])))
    m = load(data / "digits_cnn.onnx")
    base = top1(Executor(quantize(m.module, m.params, calib[:1], "minmax", cost="cpu",
                                  layouts=False).fp32).run)
    assert base > 0.97                       # (it learnt its digits)
    r = quantize(m.module, m.params, calib, "minmax", per_channel=True, cost="cpu",
                 metric=top1, max_drop=0.001)
    assert base - top1(Executor(r.runnable).run) <= 0.001
    assert r.mixed.evaluations >= 2 and "fused.qconv2d" in _ops(r.module)


def test_a_budget_before_the_sensitivities_is_a_clear_error():
    rng = np.random.default_rng(2)
    text, params = conv_program(rng, 4, ["relu"], False, False)
    samples = [{"x": rng.uniform(0, 1, (1, 4, 6, 6)).astype(np.float32)} for _ in range(2)]
    r = quantize(parse(text), params, samples, "minmax", cost="cpu")
    space = MixedSpace(annotate(r.fp32, r.table, "uint8", "max", False), CpuLatency())
    assert not space.solve(int8_only=True).floats          # no budget: no noise needed
    with pytest.raises(EqquantError, match="measure_sensitivity first"):
        space.solve(min_sqnr=40.0)
