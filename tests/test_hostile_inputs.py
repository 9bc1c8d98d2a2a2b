"""Regression tests for the hostile probe: each bad input ends in eqquant's own located error
(or a documented behaviour), never another exception, a hang, or a silent wrong result."""
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import cli_exit
from eqquant.errors import EqquantError, ParseError
from eqquant.ir.interp import run
from eqquant.ir.parser import parse
from eqquant.ir.typecheck import check_module
from eqquant.quant.flow import quantize
from eqquant.rules.loader import load_rules, parse_rules
from eqquant.runtime.execution.executor import Executor

DENSE = ("def @main(%x: Tensor[(1, 4), float32], %w: Tensor[(3, 4), float32]) {\n"
         "  nn.relu(nn.dense(%x, %w))\n}\n")
W = {"w": np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)}


# -- calibration data ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["minmax", "percentile", "kl_divergence", "global_scale"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_calibration_data_with_nan_or_inf_is_refused(mode, bad):
    x = np.ones((1, 4), np.float32)
    x[0, 2] = bad
    with pytest.raises(EqquantError, match="NaN or infinite"):
        quantize(parse(DENSE), W, [np.ones((1, 4), np.float32), x], mode)


def test_constant_calibration_data_is_refused():
    for value in (0.0, 3.0, 1e-40):
        with pytest.raises(EqquantError, match="one value only"):
            quantize(parse(DENSE), W, [np.full((1, 4), value, np.float32)] * 3, "minmax")


def test_the_report_without_a_held_out_input_covers_several_samples():
    rng = np.random.default_rng(1)
    samples = [rng.normal(size=(1, 4)).astype(np.float32) for _ in range(5)]
    r = quantize(parse(DENSE), W, samples, "minmax")
    assert r.output["samples"] == 5 and "on 5 calibration samples" in r.report()


def test_an_all_zero_weight_keeps_its_bias():
    text = ("def @main(%x: Tensor[(1, 4), float32], %w: Tensor[(2, 4), float32], "
            "%b: Tensor[(2), float32]) {\n  nn.relu(add(nn.dense(%x, %w), %b))\n}\n")
    params = {"w": np.zeros((2, 4), np.float32), "b": np.array([0.5, 1.5], np.float32)}
    rng = np.random.default_rng(0)
    samples = [rng.normal(size=(1, 4)).astype(np.float32) for _ in range(4)]
    for per_channel in (False, True):
        r = quantize(parse(text), params, samples, "minmax", per_channel=per_channel)
        out = Executor(r.module).run({"x": samples[0]})
        np.testing.assert_allclose(out, [[0.5, 1.5]], atol=0.02)


def test_a_dense_layer_whose_accumulator_could_overflow_stays_float():
    k = 73728
    text = (f"def @main(%x: Tensor[(1, {k}), float32], %w: Tensor[(1, {k}), float32]) "
            "{ nn.dense(%x, %w) }")
    r = quantize(parse(text), {"w": np.ones((1, k), np.float32)},
                 [np.ones((1, k), np.float32), np.zeros((1, k), np.float32)], "minmax")
    assert r.kept_float and "overflow" in r.kept_float[0] and "kept in float" in r.report()
    out = Executor(r.module).run({"x": np.ones((1, k), np.float32)})
    np.testing.assert_allclose(out, [[k]], rtol=1e-2)


# -- IR text ----------------------------------------------------------------------------------

@pytest.mark.parametrize("nest", [
    lambda n: "nn.relu(" * n + "%x" + ")" * n,
    lambda n: "(" * n + "%x" + ",)" * n,
    lambda n: "(" * n + "(%x,)" + ").0" * n + ".0",
    lambda n: "reshape(%x, newshape=" + "[" * n + "2" + "]" * n + ")",
    lambda n: "fn (%y: Tensor[(2), float32]) { " * n + "%x" + " }" * n,
])
def test_deep_nesting_is_a_located_error(nest):
    text = "def @main(%x: Tensor[(2), float32]) {\n  " + nest(1000) + "\n}\n"
    with pytest.raises(ParseError) as e:
        parse(text, "deep.ir")
    assert e.value.loc.line == 2 and "nest" in e.value.message


def test_moderate_nesting_goes_through_every_stage():
    text = "def @main(%x: Tensor[(2), float32]) {\n  " + "nn.relu(" * 150 + "%x" + \
        ")" * 150 + "\n}\n"
    from eqquant.ir.printer import print_module
    mod = parse(text)
    assert parse(print_module(mod)) == mod
    x = {"x": np.array([1.0, -2.0], np.float32)}
    np.testing.assert_array_equal(run(mod, x), [1.0, 0.0])
    np.testing.assert_array_equal(Executor(mod).run(x), [1.0, 0.0])


@pytest.mark.parametrize("literal,message", [
    ("2147483648", "does not fit int32"),
    ("300i8", "does not fit int8"),
    ("1e999f", "overflows"),
    ("1e39f", "overflows float32"),
    ("9" * 5000, "too long"),
])
def test_out_of_range_literals_are_located_errors(literal, message):
    text = f"def @main(%x: Tensor[(2), float32]) {{\n  qnn.quantize(%x, 0.1f, {literal})\n}}\n"
    with pytest.raises(ParseError, match=message) as e:
        parse(text)
    assert e.value.loc.line == 2


@pytest.mark.parametrize("text", [
    "def @main(%x: Tensor[(2), float32]) { reshape(%x, newshape=[18446744073709551616]) }",
    "def @main(%x: Tensor[(1, 1, 2, 2), float32]) { nn.pad(%x, 0f, pad_width=[[0, 0], [0, 0], "
    "[0, 4611686018427387904], [0, 0]]) }",
    "def @main(%x: Tensor[(4611686018427387904, 2), float32]) { nn.relu(%x) }",
])
def test_impossible_sizes_are_type_errors(text):
    from eqquant.ir.typecheck import check_module
    with pytest.raises(EqquantError) as e:
        check_module(parse(text))
    assert e.value.loc is not None


def test_a_mixed_integer_conv_without_out_dtype_is_int32_on_every_engine():
    mod = parse("def @main(%x: Tensor[(1, 2, 3, 3), uint8], %w: Tensor[(1, 2, 1, 1), int8]) "
                "{ nn.conv2d(%x, %w) }")
    x = {"x": np.full((1, 2, 3, 3), 200, np.uint8), "w": np.full((1, 2, 1, 1), -3, np.int8)}
    for out in (run(mod, x), Executor(mod).run(x)):
        assert out.dtype == np.int32 and out.ravel()[0] == -1200


def test_the_cpu_engine_refuses_what_the_reference_refuses():
    mod = parse("def @main(%x: Tensor[(2), int8]) { nn.relu(%x) }")
    for bad in (np.array([1.5, 2.0]), np.array([300, 1])):
        with pytest.raises(EqquantError):
            Executor(mod).run({"x": bad})
        with pytest.raises(EqquantError):
            run(mod, {"x": bad})


def test_run_prints_tuple_outputs_and_refuses_a_function_result(tmp_path, capsys):
    x = tmp_path / "x.npz"
    np.savez(x, x=np.array([1.0, -2.0], np.float32))
    tup = tmp_path / "t.ir"
    tup.write_text("def @main(%x: Tensor[(2), float32]) { ((%x, nn.relu(%x)),) }")
    for engine in ("cpu", "reference"):
        assert cli_exit(["run", str(tup), "-x", str(x), "--engine", engine]) == 0
        out = capsys.readouterr().out
        assert "output 0" in out and "output 1" in out
    assert cli_exit(["run", str(tup), "-x", str(x), "-o", str(tmp_path / "o.npz")]) == 0
    assert sorted(np.load(tmp_path / "o.npz")) == ["output_0", "output_1"]
    fn = tmp_path / "f.ir"
    fn.write_text("def @main(%x: Tensor[(2), float32]) { fn (%y: Tensor[(2), float32]) { %y } }")
    assert cli_exit(["run", str(fn), "-x", str(x), "--engine", "reference"]) == 2
    assert "function value" in capsys.readouterr().err


# -- rules files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    ("rule big: add(?x, 99999999999999999999) => ?x", "does not fit int64"),
    ("approx rule r (rtol=300i8): nn.relu(?x) => ?x", "approx option rtol"),
    ("approx rule r (atol=nan): nn.relu(?x) => ?x", "approx option atol"),
    ("approx rule r (atol=1e999): nn.relu(?x) => ?x", "approx option atol"),
    ("rule r: reshape(?x, newshape=[99999999999999999999]) => ?x", "does not fit int64"),
    ('include "/etc/passwd"', "include names a .rules file"),
    ("rule r: " + "nn.relu(" * 300 + "?x" + ")" * 300 + " => ?x", "nest"),
    ("rule r: nn.relu(?x) => ?x if rank(?x) == 999999999999999999990", "a rank"),
    ("rule r: nn.relu(?x) => ?x if shape(?x) == [99999999999999999999]", "does not fit"),
])
def test_bad_rules_are_located_errors(text, message):
    with pytest.raises(EqquantError, match=message) as e:
        parse_rules("ruleset t\n" + text + "\n", "t.rules")
    assert e.value.loc is not None and e.value.loc.line == 2
    assert "root:" not in e.value.format()


def test_dtype_guards_cannot_explode_the_variants():
    guards = ", ".join(f"dtype(?{v}) in {{int8, uint8, int16, int32}}" for v in "abcdefgh")
    text = ("ruleset t\nrule g: add(add(add(?a, ?b), add(?c, ?d)), add(add(?e, ?f), add(?g, ?h)))"
            f" => ?a\n    if {guards}\n")
    with pytest.raises(EqquantError, match="variants"):
        parse_rules(text, "t.rules")


def test_a_schedule_file_is_never_echoed(tmp_path, capsys):
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    prog = tmp_path / "p.ir"
    prog.write_text("def @main(%x: Tensor[(2), float32]) { nn.relu(%x) }")
    code = cli_exit(["opt", str(prog), "-r", "simplify", "-s", f"@{secret}",
                     "-o", str(tmp_path / "o.ir")])
    err = capsys.readouterr().err
    assert code == 2 and "schedule" in err and "root:" not in err
    assert not (tmp_path / "o.ir").exists()


@pytest.mark.parametrize("body", [
    "nn.batch_norm(%x, %x, %x, %x, %x).0", "nn.bias_add(%x, %x)", "concatenate((%x, %x))",
    "squeeze(%x, axis=[0])", "mean(%x, axis=[0])", "nn.softmax(%x)", "nn.batch_flatten(%x)",
])
def test_rank_0_inputs_are_type_errors_where_an_axis_is_needed(body):
    from eqquant.ir.typecheck import check_module
    with pytest.raises(EqquantError) as e:
        check_module(parse(f"def @main(%x: Tensor[(), float32]) {{\n  {body}\n}}\n"))
    assert e.value.loc is not None and e.value.loc.line == 2


@pytest.mark.parametrize("body", ["transpose(%x)", "squeeze(%x)", "nn.relu(%x)",
                                  "reshape(%x, newshape=[])", "add(%x, 1f)"])
def test_rank_0_values_stay_rank_0_on_both_engines(body):
    mod = parse(f"def @main(%x: Tensor[(), float32]) {{ {body} }}")
    x = {"x": np.array(1.5, np.float32)}
    for out in (run(mod, x), Executor(mod).run(x)):
        assert out.shape == ()


def test_a_zero_size_softmax_runs_on_both_engines():
    mod = parse("def @main(%x: Tensor[(0, 4), float32]) { nn.softmax(%x) }")
    x = {"x": np.zeros((0, 4), np.float32)}
    for out in (run(mod, x), Executor(mod).run(x)):
        assert out.shape == (0, 4)


def test_strings_print_with_escapes_and_read_back():
    from eqquant.ir.printer import print_module
    text = ("def @main(%x: Tensor[(2), float32]) {\n  %0 = fn (%p: Tensor[(2), float32], "
            'Composite="a\\nb\\t\\"c\\"\\\\") { nn.relu(%p) };\n  %0(%x)\n}\n')
    mod = parse(text)
    out = print_module(mod)
    assert "\n" not in out.split("Composite=")[1].split(")")[0]
    assert parse(out) == mod and print_module(parse(out)) == out


def test_keyword_only_values_are_located():
    """True, False and () have no token of their own: reading them needs positions."""
    text = "def @main(%x: Tensor[(2), float32]) {\n  %0 = (True, False, ());\n  %x\n}\n"
    from eqquant.ir.printer import print_module
    assert "%x" in print_module(parse(text))
    from eqquant.ir.typecheck import check_module
    with pytest.raises(EqquantError) as e:
        check_module(parse("def @main(%x: Tensor[(2), float32]) {\n  add(%x, ())\n}\n"))
    assert e.value.loc is not None and e.value.loc.line == 2


def test_an_npy_where_an_npz_is_expected_is_named(tmp_path):
    from eqquant.ir.params import load_params
    path = tmp_path / "w.npy"
    np.save(path, np.ones(3))
    with pytest.raises(EqquantError, match="not an .npz file.*an .npy holds one array"):
        load_params(path)


def test_a_compressed_npz_bomb_costs_nothing_until_its_entry_is_read(tmp_path):
    """2 MB on disk, 2 GB unpacked: an entry the program never reads is never unpacked, and
    an entry declaring more than the limit is refused from its header alone."""
    import resource
    from eqquant.ir import params as P
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, big=np.zeros(2 ** 28, np.float64), small=np.ones(3, np.float32))
    assert path.stat().st_size < 4 * 2 ** 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    values = P.load_params(path)
    np.testing.assert_array_equal(values["small"], [1, 1, 1])
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 500 * 1024   # KB
    old = P.MAX_ARRAY_BYTES
    P.MAX_ARRAY_BYTES = 2 ** 30
    try:
        with pytest.raises(EqquantError, match="declares"):
            P.load_params(path)
    finally:
        P.MAX_ARRAY_BYTES = old


def test_degenerate_ranges_get_the_documented_scales():
    """A value that was always 0 (a relu that never fired) gets scale 1.0; a denormal range
    the minimum scale; an infinite range is an error; one calibration sample is enough."""
    from eqquant.ops.numerics import MIN_SCALE
    from eqquant.quant.annotate import qparams
    from eqquant.quant.calibrate import Range
    for dtype in ("int8", "uint8"):
        assert qparams(Range(0.0, 0.0), dtype) == (1.0, 0)
        scale, _ = qparams(Range(-1e-40, 1e-40), dtype)
        assert scale == MIN_SCALE
        with pytest.raises(EqquantError):
            qparams(Range(-np.inf, 1.0), dtype)
    # a relu that never fires on the (single) calibration sample
    text = ("def @main(%x: Tensor[(1, 4), float32], %w: Tensor[(2, 4), float32]) {\n"
            "  nn.relu(nn.dense(%x, %w))\n}\n")
    sample = np.random.default_rng(0).uniform(0.5, 1.0, (1, 4)).astype(np.float32)
    r = quantize(parse(text), {"w": -np.ones((2, 4), np.float32)}, [sample], "minmax")
    out = Executor(r.module).run({"x": -np.ones((1, 4), np.float32)})
    assert np.all(np.isfinite(out))


def test_a_damaged_array_header_in_an_npz_is_a_params_error(tmp_path):
    """(found by the long fuzz run: a header that no longer parses as a dict)"""
    import io
    from eqquant.ir.params import load_params
    buf = io.BytesIO()
    np.savez(buf, w=np.ones(3))
    data = buf.getvalue().replace(b"'shape': (3,)", b"'s\xff\xff\xff\xff3,), ")
    path = tmp_path / "bad.npz"
    path.write_bytes(data)
    with pytest.raises(EqquantError, match="not an array|not a readable"):
        dict(load_params(path))


# -- programs whose kernel raised inside Numba: the error was printed as "ignored" and the
# run exited 0 with an uninitialised output (the hostile probe of #54). Each is now a
# located type error on every engine, or the same numbers on every engine.

SWALLOWED = {
    "a zero scale": ("def @main(%x: Tensor[(1, 8), float32]) {\n"
                     "  qnn.quantize(%x, 0f, 0, out_dtype=\"int8\")\n}\n", (1, 8),
                     "2:20: type error: qnn.quantize: its output_scale must be positive and "
                     "finite, got 0.0"),
    "an empty image averaged": ("def @main(%x: Tensor[(1, 2, 0, 3), float32]) {\n"
                                "  nn.global_avg_pool2d(%x)\n}\n", (1, 2, 0, 3),
                                "2:3: type error: nn.global_avg_pool2d: averages an empty "
                                "image (0 x 3 pixels)"),
    "a stride of 2**40": ("def @main(%x: Tensor[(1, 2, 8, 8), float32]) {\n"
                          "  nn.max_pool2d(%x, pool_size=[2, 2], strides=[2, 1099511627776])"
                          "\n}\n", (1, 2, 8, 8), None),
}


@pytest.mark.parametrize("case", list(SWALLOWED))
def test_a_kernels_error_is_never_swallowed(tmp_path, case):
    text, shape, error = SWALLOWED[case]
    (tmp_path / "p.ir").write_text(text)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    outputs = []
    for engine in ("executor", "reference"):
        r = subprocess.run([sys.executable, "-m", "eqquant.cli.main", "run",
                            str(tmp_path / "p.ir"), "-x", str(tmp_path / "x.npy"),
                            "--engine", engine, "-o", str(tmp_path / f"{engine}.npy")],
                           capture_output=True, text=True)
        assert "ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        if error is not None:
            assert r.returncode == 2 and f"p.ir:{error}" in r.stderr, r.stderr
        else:
            assert r.returncode == 0, r.stderr
            outputs.append(np.load(tmp_path / f"{engine}.npy"))
    if outputs:
        np.testing.assert_array_equal(outputs[0], outputs[1])


def test_a_per_channel_scale_with_a_zero_is_a_type_error():
    """A constant scale per channel, one of them 0: located at the constant, on the API."""
    from eqquant.errors import TypeCheckError
    from eqquant.ir.builder import Builder
    from eqquant.ir.params import bind_params
    from eqquant.runtime.execution.executor import Executor
    b = Builder()
    x = b.input("x", (1, 4, 2, 2), "int8")
    y = b.call("qnn.dequantize", x, b.param("s", np.array([0.1, 0.2, 0.0, 0.3], np.float32)),
               b.param("z", np.zeros(4, np.int32)), axis=1)
    with pytest.raises(TypeCheckError, match="input_scale must be positive and finite, got 0.0"):
        Executor(bind_params(*b.finish(y)))


# -- #54's classes: each engine follows the reference, or both refuse with one located error

@pytest.mark.parametrize("text,message", [
    ("def @main(%x: Tensor[(2, 0), float32]) { max(%x, axis=[1]) }",
     "max over axis 1, of length 0, has no value"),
    ("def @main(%x: Tensor[(2, 0), float32]) { min(%x, axis=[1], keepdims=True) }",
     "min over axis 1, of length 0, has no value"),
    ("def @main(%x: Tensor[(2, 3), float32]) { expand_dims(%x, axis=0, num_newaxis=100000) }",
     "rank 100002 has more axes than eqquant handles"),
    ("def @main(%x: Tensor[(1, 2, 8, 8), float32], %w: Tensor[(2, 2, 3, 3), float32]) {\n"
     "  nn.conv2d(%x, %w, padding=[-1, -1, -1, -1]) }", "sizes of 0 or more"),
    ("def @main(%x: Tensor[(1, 2, 8, 8), float32]) {\n"
     "  nn.max_pool2d(%x, pool_size=[2, 2], padding=[0, -1]) }", "sizes of 0 or more"),
    ("def @main(%x: Tensor[(1, 8), int32]) {\n"
     "  qnn.requantize(%x, 1e30f, 0, 1e-30f, 0, out_dtype=\"int8\") }",
     "input_scale / output_scale = 1e+60"),
    ("def @main(%x: Tensor[(1, 8), int32]) {\n"
     "  qnn.requantize(%x, 2f, 0, 1f, 0, out_dtype=\"int8\") }",
     "holds only below 1"),
])
def test_what_one_engine_cannot_do_both_refuse_where_it_is_written(text, message):
    with pytest.raises(EqquantError, match=re.escape(message)) as refused:
        check_module(parse(text, "t.ir"))
    assert refused.value.loc is not None and refused.value.loc.line >= 1


def test_zero_size_reductions_agree_on_every_engine():
    """A sum of nothing is 0 and a mean of nothing NaN, on both engines, without a warning."""
    import warnings
    mod = parse("def @main(%x: Tensor[(2, 0), float32]) {\n"
                "  (sum(%x, axis=[1]), mean(%x, axis=[1])) }")
    x = {"x": np.zeros((2, 0), np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for out in (run(mod, x), Executor(mod).run(x)):
            np.testing.assert_array_equal(out[0], [0, 0])
            assert np.isnan(out[1]).all()


def test_a_tiny_requantize_ratio_rounds_to_zero_on_every_engine():
    mod = parse("def @main(%x: Tensor[(1, 8), int32]) {\n"
                "  qnn.requantize(%x, 1e-30f, 0, 1e30f, 0, out_dtype=\"int8\") }")
    x = {"x": (np.arange(8, dtype=np.int32) * 100_000_000).reshape(1, 8)}
    for out in (run(mod, x), Executor(mod).run(x)):
        np.testing.assert_array_equal(out, np.zeros((1, 8), np.int8))


def test_an_unclosed_comment_in_a_large_file_is_a_short_located_error(tmp_path):
    """10 MB after an unclosed /*: the lexer's pattern is linear (it had backtracked to 2.5
    GB), and the error quotes the part of the line around its column, not 10 MB."""
    from eqquant.ir.loader import load_program
    path = tmp_path / "big.ir"
    path.write_text("/* " + "a" * 10_000_000 + "\ndef @main(%x: Tensor[(1), float32]) { %x }\n")
    with pytest.raises(ParseError, match="unclosed comment") as refused:
        load_program(path)
    said = refused.value.format()
    assert len(said) < 600 and said.startswith(f"{path}:1:1")
    ok = parse("def @main(%x: Tensor[(1), float32]) {\n  /* a ** b * / c */ %x /***/\n}\n")
    assert ok.main.body.name == "x"


def test_calibration_arrays_of_the_wrong_rank_are_named(tmp_path):
    import eqquant
    model = eqquant.load(eqquant.parse("def @main(%x: Tensor[(1, 4), float32]) { nn.relu(%x) }"))
    for bad in (np.array(1.0, np.float32), np.ones((2, 3, 1, 4), np.float32)):
        np.savez(tmp_path / "c.npz", x=bad)
        with pytest.raises(EqquantError, match=r"calibration array 'x' has shape"):
            eqquant.quantize(model, tmp_path / "c.npz", mode="minmax")


def test_onnx_dropout_in_training_mode_and_wrong_import_shapes_are_refused(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from eqquant.interop.onnx_import import import_onnx

    def model(training):
        g = helper.make_graph(
            [helper.make_node("Dropout", ["x", "r", "t"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
            [numpy_helper.from_array(np.array(0.5, np.float32), "r"),
             numpy_helper.from_array(np.array(training), "t")])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(EqquantError, match="Dropout in training mode"):
        import_onnx(model(True))
    import_onnx(model(False))
    for shapes, message in (({"y": (2, 4)}, "--shape names y, which the model does not take"),
                            ({"x": (2, 4, 1)}, "gives 3 dimensions; the model's input 'x' has 2"),
                            ({"x": (2, 5)}, "gives dimension 1 as 5; the model fixes it at 4")):
        with pytest.raises(EqquantError, match=re.escape(message)):
            import_onnx(model(False), shapes)
    mod, _, _ = import_onnx(model(False), {"x": (3, 4)})
    assert mod.main.params[0].type.shape == (3, 4)


def test_a_10_mb_comment_is_read_and_skipped(tmp_path):
    from eqquant.ir.loader import load_program
    path = tmp_path / "commented.ir"
    path.write_text("// " + "a" * 10_000_000 + "\ndef @main(%x: Tensor[(1), float32]) { %x }\n")
    mod, _ = load_program(path)
    assert mod.main.body.name == "x"


def test_running_out_of_memory_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch,
                                                                capsys):
    """(As greedy extraction of a comm+assoc blow-up under --node-limit 5000000 did: 3.6 GB,
    then MemoryError.) Whatever runs out of memory, the command says so and exits 2."""
    import eqquant.optimizer as optimizer
    path = tmp_path / "m.ir"
    path.write_text("def @main(%x: Tensor[(1, 4), float32]) { nn.relu(%x) }\n")

    def out_of_memory(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(optimizer, "extract", out_of_memory)
    assert cli_exit(["extract", str(path)]) == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "--node-limit" in err and "Traceback" not in err
