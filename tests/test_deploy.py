"""Programs saved ahead of time (``eqquant.deploy``): the executor's launches linked into one
library, run without Numba. The library gives the executor's bits (int8 on every kernel
path this CPU has, fp32, depthwise), a new process runs it without importing Numba, the
cache saves it once and finds it again by content, and what cannot be saved is refused with
its reason and runs on the executor.

What holds depends on the CPU kind, and each test says it: a program whose kernels are
launches of C entries is saved, with the executor's bits; one with a kernel bound as a
Numba function of its own (the AVX2 byte driver, ``x86.avx2.bytes``, which only a target
``NAME:executor`` offers; the float BLAS path) is refused, with
that reason. The tests of
the cache's mechanics use the first program this CPU saves (``saved``). CI runs this file
again as an AVX2-only CPU and with the portable paths forced (tests/cpu_kinds.py)."""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eqquant
from conftest import cli_exit, own_cache, seeded_cache
from eqquant.deploy import cache
from eqquant.deploy.build import NotDeployable, build, keep_object
from eqquant.deploy.loader import Library
from eqquant.ir.interp import run
from eqquant.ir.loader import save_program
from eqquant.ir.params import bind_params
from eqquant.quant.flow import compile_layouts, quantize
from eqquant.runtime.codegen import compiling
from eqquant.runtime.lowering.fp32 import fp32_path
from eqquant.runtime.lowering.int8 import int8_path
from eqquant.runtime.execution.executor import Executor
from eqquant.runtime.codegen.launch import parallel, share
from eqquant.runtime.codegen.serial import twin
from eqquant.zoo import build as zoo_build
from eqquant.runtime.lowering.plan import unplanned
from eqquant.runtime.target import Target
from forging import crash_at_run, restamp
from kernel_paths import forced_int8_path, int8_paths

pytest.importorskip("onnx", reason="the onnx extra is not installed")
from onnx_models import mobilenet_block  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _programs(model, shape, seed=0, **how):
    """(int8, fp32) of a model as the product runs them: per-channel minmax, uint8
    activations (or ``how``), layouts chosen for the kernels; their kernels left to the
    target of each test's executor (the tests force each path in turn: ``unplanned``)."""
    rng = np.random.default_rng(seed)
    samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    q = quantize(model.module, model.params, samples, "minmax", **{"per_channel": True,
                                                                   **how})
    return unplanned(q.runnable), compile_layouts(q.fp32).module


@pytest.fixture(scope="module")
def stem():
    return _programs(eqquant.load(*_zoo("resnet18_stem")), (1, 3, 32, 32))


@pytest.fixture(scope="module")
def inverted_residual(tmp_path_factory):
    import onnx
    path = tmp_path_factory.mktemp("onnx") / "block.onnx"
    onnx.save(mobilenet_block(c=16, t=4), str(path))
    return _programs(eqquant.load(path), (1, 16, 16, 16), seed=1)


def _zoo(name):
    built = zoo_build(name, image_size=32)
    return built.module, built.params


def _input(ex, seed=3, scale=1.0):
    rng = np.random.default_rng(seed)
    return {name: (scale * rng.standard_normal(t.shape)).astype(t.dtype)
            for name, (_, t) in ex.inputs.items()}


def _same_bits(ex, folder, scale=1.0):
    build(ex, folder)
    library = Library(folder)
    for seed in (3, 4):
        x = _input(ex, seed, scale)
        want, got = ex.run(x), library.run(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    return library


# the kernels bound as Numba functions of their own (not launches), where they run
NOT_LAUNCHES = "calls a Numba function of its own"


def _saved_or_refused(ex, folder, scale=1.0) -> str | None:
    """None where ``ex``'s program is saved (and gives the executor's bits), else why it was
    refused, which must be a kernel that is not launches, on a path that binds one: AVX2's
    byte driver (a target planned for the executor), or the float BLAS path."""
    try:
        _same_bits(ex, folder, scale)
        return None
    except NotDeployable as e:
        assert NOT_LAUNCHES in e.message, e.message
        assert fp32_path() == "blas" or ex.target.executor, (fp32_path(), e.message)
        return e.message


@pytest.fixture(scope="module")
def saved(stem, inverted_residual, tmp_path_factory):
    """The first of the programs (int8 and fp32 stems, then the inverted residual block's,
    then one of elementwise ops) that this CPU saves: the cache's mechanics are tested on
    it. On the VNNI and AMX kinds it is the int8 stem, on the AVX2 kind the fp32 stem."""
    elementwise = bind_params(eqquant.parse("""def @main(%x: Tensor[(1, 64, 28, 28), float32],
          %w: Tensor[(1, 64, 28, 28), float32]) {
  %0 = add(%x, %x);
  %1 = nn.relu(%0);
  multiply(%1, %w)
}
"""), {"w": np.linspace(-1, 1, 64 * 28 * 28, dtype=np.float32).reshape(1, 64, 28, 28)})
    folder = tmp_path_factory.mktemp("saved")
    for j, program in enumerate([*stem, *inverted_residual, elementwise]):
        try:
            build(Executor(program), folder / f"p{j}")
            return program
        except NotDeployable:
            continue
    pytest.fail("no program saved on this CPU, not even one of elementwise ops")


def test_an_int8_program_gives_the_executors_bits_on_every_kernel_path(stem, tmp_path):
    """The SIMD GEMMs (AMX, the VNNI family, AVX2's 16-bit kernel) and the portable
    convolution (its windows gathered and multiplied, per image and group) are launches:
    saved on every path the CPU has; AVX2's byte driver too (the stem's 3x3 convolutions
    have 576-byte rows: the avx2 target plans it)."""
    int8, _ = stem
    refused = {}
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(int8)
            why = _saved_or_refused(ex, tmp_path / path)
            if why is not None:
                refused[path] = why
    assert not refused, refused
    if "avx2" in int8_paths():
        ex = Executor(int8, target=Target.named("avx2"))
        assert "x86.avx2.bytes" in {d.chosen.kernel for d in ex.kernel_decisions}
        assert _saved_or_refused(ex, tmp_path / "bytes") is None


def test_signed_activations_give_the_executors_bits_on_every_kernel_path(tmp_path):
    """int8 activations (the seed's symmetric flow, eqquant demo's): each SIMD convolution
    moves its signed image to unsigned bytes first, as launches of their own."""
    int8, _ = _programs(eqquant.load(*_zoo("resnet18_stem")), (1, 3, 32, 32), seed=2,
                        per_channel=False, dtype="int8")
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(int8)
            if path != "portable":      # (the SIMD paths read unsigned bytes)
                assert any(getattr(st.fn.conv, "shift", 0) for st in ex.steps
                           if hasattr(st.fn, "conv"))
            why = _saved_or_refused(ex, tmp_path / path, scale=20.0)
            assert why is None, (path, why)


@pytest.mark.parametrize("name", ["conv_bn", "vgg_small"])
def test_the_zoos_programs_are_saved_with_the_executors_bits(name, tmp_path):
    """An NCHW float convolution (conv_bn's: its moves bound with it), float activations
    between int8 layers (vgg_small's classifier): launches too."""
    model = eqquant.load(*_zoo(name))
    shape = model.module.main.params[0].type.shape
    for j, program in enumerate(_programs(model, shape, seed=4)):
        _saved_or_refused(Executor(program), tmp_path / f"p{j}")


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_an_nchw_int8_site_binds_its_moves_and_gives_the_reference_bits(dtype, tmp_path):
    """Layouts left as written (NCHW): the SIMD convolution's moves in (made unsigned for
    signed bytes) and out are launches bound with it, the integer reference's bits."""
    z = zoo_build("conv_bn", image_size=32)
    rng = np.random.default_rng(5)
    shape = z.module.main.params[0].type.shape
    samples = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)]
    q = quantize(z.module, z.params, samples, "minmax", per_channel=True, dtype=dtype,
                 layouts=False)
    ex = Executor(q.module)
    conv = next(i for i, st in enumerate(ex.steps) if st.label == "fused.qconv2d")
    assert not ex.steps[conv].fn.channels_last
    x = _input(ex, 6, scale=10.0)
    np.testing.assert_array_equal(ex.run(x), eqquant.run(q.module, x))
    assert _saved_or_refused(ex, tmp_path / "lib", scale=10.0) is None
    assert len(ex._prepared[conv][0].launches()) >= 3        # in, the kernel(s), out


def test_the_kernel_plan_says_what_runs_each_op_on_every_path(stem, tmp_path, capsys):
    """``Executor.kernel_plan``: a row per op in order (kernels run, the GEMM path chosen,
    layout, dtypes, threads); on each int8 path forced, the convolutions' rows name it; a
    saved library keeps the executor's plan, and `eqquant run -v` prints it."""
    int8, _ = stem
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(int8)
            rows = ex.kernel_plan()
            assert [r["step"] for r in rows] == [
                i for i, st in enumerate(ex.steps) if st.kind not in ("tuple", "getitem")]
            convs = [r for r in rows if r["op"].startswith("fused.qconv2d")]
            kernel = path if path == "portable" else f"x86.{path}"
            # (AVX2's byte driver is a kernel of the avx2 path: the 3x3 layers' 576-byte rows)
            assert convs and {r["path"] for r in convs} <= {kernel, f"{kernel}.bytes"}, (
                path, convs)
            assert kernel in {r["path"] for r in convs}
            assert all(r["kernels"] and "?" not in r["kernels"] and r["threads"] >= 1
                       for r in rows)
            assert {r["layout"] for r in convs} == {"NHWC"}     # (the program's layouts)
            assert rows[0]["dtypes"] == "float32 -> uint8"
            try:
                build(ex, tmp_path / path)
            except NotDeployable:
                continue
            assert Library(tmp_path / path).plan["ops"] == rows
    path, _ = save_program(tmp_path / "stem.ir", int8)
    np.save(tmp_path / "x.npy", next(iter(_input(Executor(int8)).values())))
    for engine in ("cpu", "executor"):
        assert cli_exit(["run", str(path), "-x", str(tmp_path / "x.npy"), "-v",
                         "--engine", engine]) == 0
        said = capsys.readouterr().err.splitlines()
        header = next(i for i, line in enumerate(said) if line.split()[:3] == ["step", "op",
                                                                             "kernel"])
        assert [line.split()[1] for line in said[header + 1:]] == [
            r["op"] for r in Executor(int8).kernel_plan()]


def test_fp32_and_depthwise_programs_give_the_executors_bits(stem, inverted_residual,
                                                              tmp_path):
    for j, program in enumerate([stem[1], *inverted_residual]):
        ex = Executor(program)
        if _saved_or_refused(ex, tmp_path / f"p{j}") is None:
            # far outside any calibrated range too: saturating, the same integers
            _same_bits(ex, tmp_path / f"q{j}", scale=50.0)


def test_a_gemm_table_gets_room_for_every_address_it_writes(inverted_residual, tmp_path):
    """The regression of an AVX2-only CPU's crash: AVX2's table of GEMMs writes four
    addresses (the 16-bit and the byte kernels, each plain and requantizing), and the
    inverted residual block's 16-channel layers use only the 16-bit pair. The loader gave
    the table room for the addresses the program used, and the table wrote past it: the
    heap damaged, a crash later. The plan now records each table's length. On every int8
    path this CPU has: each table, called on a buffer longer than its plan says, writes
    exactly that many addresses, and the library gives the executor's bits."""
    tables_seen = 0
    for path in int8_paths():
        with forced_int8_path(path):
            ex = Executor(inverted_residual[0])
            if _saved_or_refused(ex, tmp_path / path) is not None:
                continue
        plan = json.loads((tmp_path / path / "plan.json").read_text())
        lib = ctypes.CDLL(str(tmp_path / path / "program.so"))
        for table in plan["tables"]:
            length = table["length"]
            used = {s["index"] for s in plan["slots"] if s["function"] == table["function"]
                    and s["index"] is not None}
            assert used <= set(range(length))
            spare = 8
            out = (ctypes.c_int64 * (length + spare))(*([-1] * (length + spare)))
            fill = ctypes.CFUNCTYPE(None, ctypes.c_int64)(
                ctypes.cast(getattr(lib, plan["functions"][table["function"]]),
                            ctypes.c_void_p).value)
            fill(ctypes.addressof(out))
            assert all(a not in (0, -1) for a in out[:length])
            assert list(out[length:]) == [-1] * spare
            tables_seen += 1
            if path == "avx2":          # (the case that crashed: a table used in part)
                assert length == 4 and used == {0, 1}
    assert tables_seen or set(int8_paths()) == {"portable"}


def _for_a_new_process(ex, folder):
    """An input, and the executor's output on it, written to x.npz and want.npy in
    ``folder`` for a new process to check itself against; the input."""
    x = _input(ex)
    np.savez(folder / "x.npz", **x)
    np.save(folder / "want.npy", ex.run(x))
    return x


def test_a_new_process_runs_the_library_without_numba(saved, tmp_path):
    ex = Executor(saved)
    build(ex, tmp_path / "lib")
    _for_a_new_process(ex, tmp_path)
    script = (
        "import sys, numpy as np\n"
        "from eqquant.deploy.loader import Library\n"
        f"lib = Library({str(tmp_path / 'lib')!r})\n"
        f"y = lib.run(dict(np.load({str(tmp_path / 'x.npz')!r})))\n"
        f"assert np.array_equal(y, np.load({str(tmp_path / 'want.npy')!r}))\n"
        "assert 'numba' not in sys.modules and 'llvmlite' not in sys.modules\n"
        "assert 'lark' not in sys.modules\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_plan_names_every_address_it_patches(saved, tmp_path):
    ex = Executor(saved)
    build(ex, tmp_path / "lib")
    plan = json.loads((tmp_path / "lib" / "plan.json").read_text())
    kinds = {ref[1] for launch in plan["launches"] for ref in launch["refs"]}
    assert "root" in kinds
    for launch in plan["launches"]:
        for at, *_ in launch["refs"]:
            assert launch["words"][at] == 0       # (patched at load, nothing kept)
    stored = [r for r in plan["roots"] if r["at"] is not None]
    assert all(r["at"] % 64 == r["phase"] for r in stored)
    # the weights are stored; activations and inputs are made empty at load
    assert any(r["at"] is None for r in plan["roots"]) and stored


def test_a_program_with_a_step_no_kernel_runs_is_refused_with_the_reason(tmp_path):
    text = """def @main(%x: Tensor[(1, 8), float32]) {
  round(%x)
}
"""
    mod = eqquant.parse(text)
    ex = Executor(mod)
    assert any(st.kind == "reference" for st in ex.steps)
    with pytest.raises(NotDeployable, match="step 0 .*round.*reference"):
        build(ex, tmp_path / "lib")
    assert not (tmp_path / "lib").exists() and not list(tmp_path.iterdir())


def test_the_cache_saves_once_and_finds_the_library_by_content(saved, tmp_path, monkeypatch):
    own_cache(monkeypatch, tmp_path / "cache")
    path, _ = save_program(tmp_path / "stem.int8.ir", saved)
    first = eqquant.open_program(path)
    assert first.engine == "library" and first.note == ""
    folders = list((tmp_path / "cache" / "programs").iterdir())
    assert len(folders) == 1
    x = _input(Executor(saved))
    want = Executor(saved).run(x)
    np.testing.assert_array_equal(first.run(x), want)
    # a new process finds it: no executor, no Numba, no parser
    script = (
        "import sys, numpy as np\n"
        "from eqquant.deploy.cache import open_program\n"
        f"p = open_program({str(path)!r})\n"
        f"y = p.run(dict(np.load({str(tmp_path / 'x.npz')!r})))\n"
        f"assert np.array_equal(y, np.load({str(tmp_path / 'want.npy')!r}))\n"
        "assert p.engine == 'library' and 'numba' not in sys.modules\n"
        "assert 'lark' not in sys.modules\n"
        "print('ok')\n")
    np.savez(tmp_path / "x.npz", **x)
    np.save(tmp_path / "want.npy", want)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    # other weights (same names and shapes): another key, another library
    npz = path.with_suffix(".npz")
    params = dict(np.load(npz))
    name = next(iter(params))
    params[name] = params[name] + np.ones((), params[name].dtype)
    np.savez(npz, **params)
    assert cache.program_key([path, npz]) not in {p.name for p in folders}


def test_the_key_changes_with_eqquants_source_and_the_settings(tmp_path, monkeypatch):
    package = tmp_path / "eqquant"
    (package / "ops").mkdir(parents=True)
    source = package / "ops" / "an_op.py"
    source.write_text("X = 1\n")
    monkeypatch.setattr(cache, "_PACKAGE", package)
    program = tmp_path / "p.ir"
    program.write_text("def @main(%x: Tensor[(1, 8), float32]) {\n  round(%x)\n}\n")
    first = cache.key([program])
    assert cache.key([program]) == first
    source.write_text("X = 2  # edited\n")          # (any module: the parser, the registry)
    second = cache.key([program])
    assert second != first
    other = "avx2" if os.environ.get("EQQUANT_INT8_KERNEL") == "portable" else "portable"
    monkeypatch.setenv("EQQUANT_INT8_KERNEL", other)
    assert cache.key([program]) not in (first, second)


def test_a_refused_program_runs_on_the_executor_and_is_not_tried_again(tmp_path, capsys,
                                                                       monkeypatch):
    own_cache(monkeypatch, tmp_path / "cache")
    path = tmp_path / "t.ir"
    path.write_text("def @main(%x: Tensor[(1, 8), float32]) {\n  round(%x)\n}\n")
    first = cache.open_program(path)
    assert first.engine == "executor" and "round" in first.note
    notes = list((tmp_path / "cache" / "programs").glob("*.refused"))
    assert len(notes) == 1
    again = cache.open_program(path)
    assert again.engine == "executor" and again.note == first.note
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
    want = Executor(eqquant.parse(path.read_text())).run({"x": x})
    np.testing.assert_array_equal(again.run({"x": x}), want)
    np.testing.assert_array_equal(again.run(x), want)          # (its one input's array)
    np.save(tmp_path / "x.npy", x)          # eqquant run -v says so, and why
    assert cli_exit(["run", str(path), "-x", str(tmp_path / "x.npy"), "-v"]) == 0
    said = capsys.readouterr().err
    assert "runs on the executor: step 0 (round" in said and "error" not in said
    assert cli_exit(["run", str(path), "-x", str(tmp_path / "x.npy"), "--profile"]) == 0
    table = capsys.readouterr().err.splitlines()
    assert table[-1].startswith("total") and any(line.startswith("round") for line in table)


def test_the_demo_notes_a_program_left_on_the_executor_and_runs_a_saved_one(saved,
                                                                            tmp_path):
    """eqquant demo's library stage: a program the library cannot hold is a note (`runs on
    the executor: ...`), never `error:`; a saved one is checked, loaded and run."""
    from eqquant.pipeline import _Stages, _library

    class Made:                     # (what the stage asks of the quantized model)
        def __init__(self, ex):
            self.executor = lambda: ex
    refused = Executor(eqquant.parse(
        "def @main(%x: Tensor[(1, 8), float32]) {\n  round(%x)\n}\n"))
    said: list[str] = []
    _library(Made(refused), {}, None, tmp_path / "refused", _Stages(said.append),
             said.append)
    assert said == ["  runs on the executor: step 0 (round (reference)): computed by Python "
                    "at each run (reference), not by kernels' launches"]
    ex = Executor(saved)
    x = _input(ex)
    said.clear()
    _library(Made(ex), x, ex.run(x), tmp_path / "lib", _Stages(said.append), said.append)
    assert any("check the library in a child process" in line for line in said)
    assert said[-1].startswith(f"  wrote {tmp_path / 'lib'}/") and "error" not in "".join(said)


def test_what_this_cache_did_not_write_is_set_aside_never_trusted(saved, tmp_path,
                                                                   monkeypatch, capsys):
    """Found in the cache where a program's library or note would be: a folder without a
    plan, a symlink to another program's library, a note that is a folder or a symlink
    to a file outside. Each is set aside and the program saved again (never a hard failure,
    never followed); no file outside the cache is read out or written through."""
    own_cache(monkeypatch, tmp_path / "cache")
    path, _ = save_program(tmp_path / "p.ir", saved)
    folder = tmp_path / "cache" / "programs" / cache.program_key([path, path.with_suffix(".npz")])
    note = folder.with_suffix(".refused")
    outside = tmp_path / "secret.txt"
    outside.write_text("not eqquant's")
    other = tmp_path / "other-library"
    other.mkdir()
    (other / "plan.json").write_text("{}")
    x = _input(Executor(saved))
    want = Executor(saved).run(x)
    for plant in ("a folder without a plan", "a symlink to another library",
                  "a note that is a folder", "a note that is a symlink"):
        _set_aside(folder)
        _set_aside(note)
        folder.parent.mkdir(parents=True, exist_ok=True)
        if plant == "a folder without a plan":
            folder.mkdir()
            (folder / "stray").write_text("x")
        elif plant == "a symlink to another library":
            folder.symlink_to(other, target_is_directory=True)
        elif plant == "a note that is a folder":
            note.mkdir()
        else:
            note.symlink_to(outside)
        program = cache.open_program(path)
        assert program.engine == "library" and program.note == "", (plant, program.note)
        assert not folder.is_symlink() and (folder / "plan.json").is_file()
        np.testing.assert_array_equal(program.run(x), want)
    assert outside.read_text() == "not eqquant's" and (other / "plan.json").read_text() == "{}"
    # a program refused, its note planted as a symlink to a file outside: the note is
    # written anew (the file outside untouched), and -v never shows the file's contents
    refused = tmp_path / "t.ir"
    refused.write_text("def @main(%x: Tensor[(1, 8), float32]) {\n  round(%x)\n}\n")
    note = (tmp_path / "cache" / "programs" / cache.program_key([refused])).with_suffix(".refused")
    note.symlink_to(outside)
    np.save(tmp_path / "x8.npy", np.zeros((1, 8), np.float32))
    assert cli_exit(["run", str(refused), "-x", str(tmp_path / "x8.npy"), "-v"]) == 0
    said = capsys.readouterr().err
    assert "not eqquant's" not in said and "runs on the executor: step 0 (round" in said
    assert outside.read_text() == "not eqquant's"
    assert not note.is_symlink() and "round" in note.read_text()


def _set_aside(path):
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        import shutil
        shutil.rmtree(path)


def test_a_library_the_compiler_could_not_build_is_tried_again(saved, tmp_path,
                                                                monkeypatch):
    """A failing C compiler (CC=false) is a cause that may pass: the program runs on the
    executor, nothing is noted, and the next run with a compiler saves the library."""
    own_cache(monkeypatch, tmp_path / "cache")
    path, _ = save_program(tmp_path / "p.ir", saved)
    x = _input(Executor(saved))
    monkeypatch.setenv("CC", "false")
    first = cache.open_program(path)
    assert first.engine == "executor" and "compiling library.c failed" in first.note
    assert not list((tmp_path / "cache" / "programs").glob("*"))       # nothing noted
    np.testing.assert_array_equal(first.run(x), Executor(saved).run(x))
    monkeypatch.delenv("CC")
    again = cache.open_program(path)
    assert again.engine == "library" and again.note == ""


def test_a_save_waits_for_anothers_and_takes_its_library(saved, tmp_path, monkeypatch):
    """While another holds the program's lock (here a second descriptor, as another process
    would), a save waits; the library saved meanwhile is taken, not built again."""
    import threading
    import eqquant.deploy.build as building
    own_cache(monkeypatch, tmp_path / "cache")
    digest = "d" * 32
    ex = Executor(saved)
    other = cache._SaveLock(digest).__enter__()
    got: dict = {}
    waiting = threading.Thread(target=lambda: got.setdefault("it", cache.save(ex, digest)))
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive() and not got             # (waiting on the lock)
    building.build(ex, cache.programs_dir() / digest, key=digest)  # the other one saves it

    def built_again(*args, **kwargs):
        raise AssertionError("built twice")
    monkeypatch.setattr(building, "build", built_again)
    other.__exit__(None, None, None)
    waiting.join(60)
    assert isinstance(got["it"], Library)
    x = _input(ex)
    np.testing.assert_array_equal(got["it"].run(x), ex.run(x))


def test_two_processes_saving_one_program_at_once_end_with_one_good_library(saved, tmp_path):
    path, _ = save_program(tmp_path / "p.ir", saved)
    _for_a_new_process(Executor(saved), tmp_path)
    script = (
        "import numpy as np\n"
        "from eqquant.deploy.cache import open_program\n"
        f"p = open_program({str(path)!r})\n"
        f"y = p.run(dict(np.load({str(tmp_path / 'x.npz')!r})))\n"
        f"assert np.array_equal(y, np.load({str(tmp_path / 'want.npy')!r}))\n"
        "print(p.engine, p.note)\n")
    for trial in range(2):
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "EQQUANT_CACHE_DIR": seeded_cache(tmp_path / f"cache{trial}")}
        both = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
                for _ in range(2)]
        for p in both:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0 and out.strip() == "library", (out, err)
        programs = tmp_path / f"cache{trial}" / "programs"
        assert not list(programs.glob("*.refused"))
        assert len([f for f in programs.iterdir() if (f / "plan.json").is_file()]) == 1


def test_a_cache_that_cannot_be_written_leaves_the_program_on_the_executor(saved, tmp_path,
                                                                          monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache would be")
    monkeypatch.setenv("EQQUANT_CACHE_DIR", str(blocked))
    # (the rules' verdicts would live in this cache too: they are not what is tested here,
    # and with no cache they are checked at every load)
    monkeypatch.setattr("eqquant.rules.trust.verify", lambda rulesets: None)
    path, _ = save_program(tmp_path / "stem.ir", saved)
    program = cache.open_program(path)
    assert program.engine == "executor" and "could not be written" in program.note
    x = _input(Executor(saved))
    np.testing.assert_array_equal(program.run(x), Executor(saved).run(x))


def _building(monkeypatch, damage):
    """``build`` as ``cache.save`` calls it, then ``damage(folder)``: a library that is
    wrong on disk, as the check in a child process finds it."""
    import eqquant.deploy.build as building
    real = building.build

    def build_then_damage(executor, folder, **kw):
        made = real(executor, folder, **kw)
        damage(Path(folder))
        return made
    monkeypatch.setattr(building, "build", build_then_damage)


def test_a_library_whose_output_differs_is_dropped(saved, tmp_path, monkeypatch):
    own_cache(monkeypatch, tmp_path / "cache")
    ex = Executor(saved)

    def a_weight_changed(folder):   # the two largest stored roots' bytes, changed (the
        plan = json.loads((folder / "plan.json").read_text())    # largest may be a packing
        stored = [r for r in plan["roots"] if r["at"] is not None and not r["state"]]
        data = np.memmap(folder / "data.bin", np.uint8, mode="r+")  # no chunk read: AVX2's
        for root in sorted(stored, key=lambda r: -r["bytes"])[:2]:  # 16-bit panels where all
            data[root["at"]:root["at"] + root["bytes"]] ^= 0x40     # took the byte kernel)
        data.flush()
        del data
        restamp(folder)                     # (its digests matched: only the check differs)
    _building(monkeypatch, a_weight_changed)
    got = cache.save(ex, "k" * 32)
    assert isinstance(got, str) and "differed" in got
    assert not (tmp_path / "cache" / "programs" / ("k" * 32)).exists()
    assert cache.lookup("k" * 32) == got            # noted: not tried again


def test_a_library_that_crashes_is_refused_with_the_signal_and_the_program_carries_on(
        saved, tmp_path, monkeypatch, capsys):
    """A library whose code crashes (its digests matched again: a forger's, or a bug's):
    it crashes in the child process that checks it, never in the process that asked; that
    one runs the program on the executor, with the right result, and says why."""
    own_cache(monkeypatch, tmp_path / "cache")
    _building(monkeypatch, crash_at_run)
    path, _ = save_program(tmp_path / "p.ir", saved)
    program = cache.open_program(path)
    assert program.engine == "executor"
    assert program.note == "the library crashed with SIGILL while checking it"
    ex = Executor(saved)
    x = _input(ex)
    np.testing.assert_array_equal(program.run(x), ex.run(x))
    key = cache.program_key([path, path.with_suffix(".npz")])
    assert not (tmp_path / "cache" / "programs" / key).exists()
    # noted: a later run does not try again, and eqquant run -v says why
    np.save(tmp_path / "x.npy", next(iter(x.values())))
    assert cli_exit(["run", str(path), "-x", str(tmp_path / "x.npy"), "-v"]) == 0
    said = capsys.readouterr().err
    assert "runs on the executor: the library crashed with SIGILL" in said
    assert "error" not in said


def test_compile_and_run_from_the_command_line(saved, tmp_path, capsys):
    path, _ = save_program(tmp_path / "stem.ir", saved)
    ex = Executor(saved)
    x = _input(ex)
    np.save(tmp_path / "x.npy", next(iter(x.values())))
    assert cli_exit(["compile", str(path), "-o", str(tmp_path / "lib")]) == 0
    assert "launches" in capsys.readouterr().out
    out = tmp_path / "y.npy"
    assert cli_exit(["run", str(tmp_path / "lib"), "-x", str(tmp_path / "x.npy"),
                     "-o", str(out), "-v"]) == 0
    np.testing.assert_array_equal(np.load(out), ex.run(x))
    assert "runs on the library" in capsys.readouterr().err
    # --profile: each launch timed in C, the time per op (the executor's steps where it ran)
    assert cli_exit(["run", str(path), "-x", str(tmp_path / "x.npy"), "--profile",
                     "--engine", "executor"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("total")
    assert cli_exit(["run", str(tmp_path / "lib"), "-x", str(tmp_path / "x.npy"),
                     "--profile"]) == 0
    table = capsys.readouterr().err
    ops = {launch["op"] for launch in Library(tmp_path / "lib").plan["launches"]}
    assert all(op in table for op in ops) and table.splitlines()[-1].startswith("total")
    assert float(table.splitlines()[-1].split()[-1]) > 0
    # compiled over a folder that is not a library: refused, the folder left as it was
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    assert cli_exit(["compile", str(path), "-o", str(tmp_path / "mine")]) == 2
    assert "not a library" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
    # a folder that is not a library: a clear error, exit 2
    (tmp_path / "empty").mkdir()
    assert cli_exit(["run", str(tmp_path / "empty"), "-x", str(tmp_path / "x.npy")]) == 2
    assert "not a library this eqquant saved" in capsys.readouterr().err


def test_relative_folders_for_a_library_and_the_cache(saved, tmp_path, monkeypatch, capsys):
    """`eqquant compile M.ir -o lib` and EQQUANT_CACHE_DIR=cache, folders relative to the
    working one (the C compiler runs inside the work folder: it once failed to find them)."""
    monkeypatch.chdir(tmp_path)
    own_cache(monkeypatch, "cache")
    path, _ = save_program(Path("p.ir"), saved)
    ex = Executor(saved)
    x = _input(ex)
    np.save("x.npy", next(iter(x.values())))
    assert cli_exit(["compile", "p.ir", "-o", "lib"]) == 0
    assert "wrote lib" in capsys.readouterr().out
    assert cli_exit(["run", "lib", "-x", "x.npy", "-o", "y.npy"]) == 0
    np.testing.assert_array_equal(np.load("y.npy"), ex.run(x))
    program = cache.open_program(path)
    assert program.engine == "library", program.note
    assert not list(Path("cache", "programs").glob("*.refused"))
    np.testing.assert_array_equal(program.run(x), ex.run(x))


def _double(thread, threads, args):
    x, out = args
    for i in range(*share(x.size, thread, threads)):
        out[i] = 2 * x[i]


def test_what_compiles_while_objects_are_kept_is_compiled_for_the_library_too(
        tmp_path, monkeypatch):
    import eqquant.deploy.build as building
    own_cache(monkeypatch, tmp_path / "cache")
    kernel = parallel(twin(_double, "_" + uuid.uuid4().hex[:12]))   # (no cache has it)
    x, out = np.arange(8.0), np.zeros(8)
    with building.keeping_objects():
        kernel(x, out)
    kept = list(building.objects_dir().glob("*.o"))
    assert len(kept) == 1 and kept[0].stat().st_size > 0
    entry = next(iter(kernel._entries.values()))

    def no_code_generation(*args):
        raise AssertionError("compiled again")
    monkeypatch.setattr(building, "_object", no_code_generation)
    assert building._emit(0, entry, tmp_path).read_bytes() == kept[0].read_bytes()
    assert keep_object not in compiling.compiled_hooks      # (the block removed it)
    # the same function compiled for another Numba cache names its entry anew: another key
    name = entry._wrapper_name
    try:
        entry._wrapper_name = name + "_elsewhere"
        assert building._object_key(entry)[0] != kept[0].stem
    finally:
        entry._wrapper_name = name


def test_a_library_compiled_for_another_cpu_is_refused_and_runs_are_one_at_a_time(
        saved, tmp_path):
    import threading
    ex = Executor(saved)
    build(ex, tmp_path / "lib")
    library = Library(tmp_path / "lib")
    inputs = [_input(ex, seed) for seed in range(6)]
    wants = [ex.run(x) for x in inputs]
    got: dict = {}

    def runs(j):
        for _ in range(5):
            got[j] = library.run(inputs[j])
    threads = [threading.Thread(target=runs, args=(j,)) for j in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j, want in enumerate(wants):
        np.testing.assert_array_equal(got[j], want)
    plan_path = tmp_path / "lib" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["cpu"] = "0" * 16                 # (as if copied from another machine)
    plan_path.write_text(json.dumps(plan))
    restamp(tmp_path / "lib")
    with pytest.raises(eqquant.errors.EvalError, match="another CPU"):
        Library(tmp_path / "lib")


def test_a_library_lacking_a_function_of_its_plan_is_an_error(saved, tmp_path):
    build(Executor(saved), tmp_path / "lib")
    plan_path = tmp_path / "lib" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["functions"][0] += "_missing"
    plan_path.write_text(json.dumps(plan))
    restamp(tmp_path / "lib")
    with pytest.raises(eqquant.errors.EvalError, match="lacks a C function"):
        Library(tmp_path / "lib")


# -- library.c's share of Numba's runtime, against Numba's own ----------------------------

@pytest.fixture(scope="module")
def c_library(saved, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lib") / "lib"
    build(Executor(saved), folder)
    return ctypes.CDLL(str(folder / "program.so"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=4),
       st.lists(st.integers(0, 3), min_size=1, max_size=4), st.integers(0, 3),
       st.booleans(), st.sampled_from([1, 4, 8]))
def test_the_no_copy_reshape_is_numbas(c_library, shape, order, cut, f_order, itemsize):
    """Same verdict and strides as Numba's helper, on views (permuted, sliced) reshaped to
    every factorisation of the same size."""
    from numba import _helperlib
    signature = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    theirs = ctypes.CFUNCTYPE(ctypes.c_int, *signature)(
        _helperlib.c_helpers["attempt_nocopy_reshape"])
    ours = c_library.numba_attempt_nocopy_reshape
    ours.argtypes = signature
    ours.restype = ctypes.c_int
    a = np.zeros(shape, dtype=f"u{itemsize}")
    axes = sorted(range(a.ndim), key=lambda i: order[i % len(order)])
    v = a.transpose(axes)
    if cut and v.shape[0] > 1:
        v = v[::2]
    dims = np.array(v.shape, np.int64)
    strides = np.array(v.strides, np.int64)
    size = int(np.prod(v.shape))
    if f_order and size == 1:
        return      # (Numba's reads newdims[-1] there: undefined; ours gives the item size)
    for new in ([size], [1, size], [size, 1], *_splits(size)):
        new = np.array(new, np.int64)
        out_a, out_b = np.zeros(len(new), np.int64), np.zeros(len(new), np.int64)
        args = (v.ndim, dims.ctypes.data, strides.ctypes.data, len(new), new.ctypes.data)
        got = ours(*args, out_a.ctypes.data, itemsize, int(f_order))
        want = theirs(*args, out_b.ctypes.data, itemsize, int(f_order))
        assert got == want
        if got:
            np.testing.assert_array_equal(out_a, out_b)


def _splits(n):
    return [[d, n // d] for d in range(2, n) if n % d == 0][:4]


def test_an_allocation_inside_a_kernel_is_aligned_and_freed(c_library):
    alloc = c_library.NRT_MemInfo_alloc_aligned
    alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_uint]
    dtor = c_library.NRT_MemInfo_call_dtor
    dtor.argtypes = [ctypes.c_void_p]
    for size, align in [(1, 1), (100, 32), (4096, 64), (0, 16)]:
        mi = alloc(size, align)
        refct, _, _, data, got_size, _ = (ctypes.c_size_t * 6).from_address(mi)
        assert refct == 1 and got_size == size and data % align == 0 and data >= mi + 48
        ctypes.memset(data, 0xAB, size)          # (writable: the whole size)
        dtor(mi)


def test_concatenation_squeeze_excitation_and_nchw_depthwise_are_launches(tmp_path):
    """Ops that ran as Numba calls of their own or as Python, now launches (issue 51): a
    concatenation (float and bytes; its tuple names its fields' buffers), a per-channel
    first operand of a product (a squeeze-excitation's scales times the image), an NCHW
    depthwise convolution, a layout change of one-pixel planes. Saved, the executor's bits;
    those the reference's within rounding."""
    rng = np.random.default_rng(0)
    mod = bind_params(eqquant.parse("""def @main(%x: Tensor[(1, 8, 5, 5), float32],
          %w: Tensor[(8, 1, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], groups=8, channels=8, kernel_size=[3, 3]);
  %1 = nn.global_avg_pool2d(%0);
  %2 = multiply(%1, %0);
  %3 = (%2, %x, %0);
  %4 = concatenate(%3, axis=1);
  %5 = layout_transform(%1, src_layout="NCHW", dst_layout="NHWC");
  %6 = reshape(%5, newshape=[1, 8, 1, 1]);
  %7 = add(%6, %1);
  %8 = multiply(%7, %0);
  %9 = nn.relu(%8);
  %10 = (%9, %4);
  concatenate(%10, axis=1)
}
"""), {"w": rng.standard_normal((8, 1, 3, 3)).astype(np.float32)})
    ex = Executor(mod)
    from eqquant.deploy.build import not_launches
    assert not_launches(ex) == []
    _same_bits(ex, tmp_path / "lib")
    x = _input(ex)
    np.testing.assert_allclose(ex.run(x), run(mod, x), rtol=1e-5, atol=1e-5)
    codes = eqquant.parse("""def @main(%x: Tensor[(1, 4, 3, 3), uint8]) {
  %0 = (%x, %x);
  concatenate(%0, axis=1)
}
""")
    ex8 = Executor(codes)
    assert not_launches(ex8) == []
    build(ex8, tmp_path / "bytes")
    x8 = {"x": rng.integers(0, 256, (1, 4, 3, 3)).astype(np.uint8)}
    np.testing.assert_array_equal(Library(tmp_path / "bytes").run(x8), run(codes, x8))


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_transposes_and_slices_are_one_strided_copy_each(dtype, tmp_path):
    """transpose and strided_slice (a channel shuffle's, negative steps, the default
    reversal) copy their registry entry's view in one launch each: saved, the reference's
    bits."""
    mod = eqquant.parse(f"""def @main(%x: Tensor[(1, 4, 6, 5), {dtype}]) {{
  %0 = nn.relu(%x);
  %1 = reshape(%0, newshape=[1, 2, 2, 6, 5]);
  %2 = transpose(%1, axes=[0, 2, 1, 3, 4]);
  %3 = reshape(%2, newshape=[1, 4, 6, 5]);
  %4 = strided_slice(%3, begin=[0, 1, 5], end=[1, 4, 0], strides=[1, 2, -2]);
  transpose(%4)
}}
""")
    ex = Executor(mod)
    assert [type(s.fn).__name__ for s in ex.steps].count("StridedCopy") == 3
    build(ex, tmp_path / "lib")
    x = {"x": (np.arange(120).reshape(1, 4, 6, 5) % 200).astype(dtype)}
    want = run(mod, x)
    np.testing.assert_array_equal(ex.run(x), want)
    np.testing.assert_array_equal(Library(tmp_path / "lib").run(x), want)


def test_an_nchw_int8_program_is_launches_too(tmp_path):
    """The int8 program in its interchange layout (NCHW: before the layout phase), an
    inverted residual block: its depthwise convolution (moved channel-last and back, one
    launch an image), its pointwise ones and the residual sum are launches; saved, with the
    executor's bits."""
    import onnx
    path = tmp_path / "block.onnx"
    onnx.save(mobilenet_block(c=16, t=4), str(path))
    model = eqquant.load(path)
    rng = np.random.default_rng(4)
    samples = [rng.standard_normal((1, 16, 16, 16)).astype(np.float32) for _ in range(3)]
    q = quantize(model.module, model.params, samples, "minmax", per_channel=True)
    ex = Executor(q.module)
    assert "depthwise" in {d.chosen.kernel for d in ex.kernel_decisions}
    from eqquant.deploy.build import not_launches
    assert not_launches(ex) == []
    _same_bits(ex, tmp_path / "lib", scale=5.0)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_grouped_convolutions_and_reductions_are_launches(layout, tmp_path):
    """A grouped convolution (two groups of 16 outputs) runs on the FMA GEMM in sets where
    the CPU has it (``fma.grouped``; the direct kernel elsewhere, between two moves at a
    channel-last site), a batch of two, and depthwise ones one launch per image; a mean over the image (ShuffleNet's global pool)
    and sums, maxima and minima over runs of adjacent axes are one launch each, the rest
    (axes apart) the reference. Saved, the executor's bits; those the reference's within
    rounding, NaN included."""
    rng = np.random.default_rng(5)
    nhwc = layout == "NHWC"
    shape, wshape = ((2, 7, 6, 16), (3, 3, 8, 32)) if nhwc else ((2, 16, 7, 6), (32, 8, 3, 3))
    dshape = (3, 3, 1, 32) if nhwc else (32, 1, 3, 3)
    conv = f'data_layout="{layout}", kernel_layout="{"HWIO" if nhwc else "OIHW"}"'
    image = "[1, 2]" if nhwc else "[2, 3]"
    mod = bind_params(eqquant.parse(f"""def @main(%x: Tensor[{shape}, float32],
          %w: Tensor[{wshape}, float32], %d: Tensor[{dshape}, float32]) {{
  %0 = nn.conv2d(%x, %w, strides=[2, 1], padding=[1, 1, 1, 1], groups=2, {conv});
  %1 = nn.conv2d(%0, %d, padding=[1, 1, 1, 1], groups=32, {conv});
  %2 = mean(%1, axis={image});
  %3 = sum(%1, axis={image}, keepdims=True);
  %4 = max(%1, axis=[3]);
  %5 = min(%1, axis=[0, 1, 2, 3]);
  %6 = mean(%1, axis=[1, 3]);
  (%2, %3, %4, %5, %6)
}}
"""), {"w": rng.standard_normal(wshape).astype(np.float32),
       "d": rng.standard_normal(dshape).astype(np.float32)})
    ex = Executor(mod)
    gemm = {"fma", "avx512"} & set(ex.target.fp32)     # (the paths the target offers)
    assert (ex.steps[0].fn.sets is not None) == bool(gemm), ex.steps[0].fn.kernel
    labels = [s.label for s in ex.steps]
    assert labels.count("mean (reference)") == 1           # axes 1 and 3: not adjacent
    assert not [a for a in labels if "reference" in a and not a.startswith("mean")]
    from eqquant.deploy.build import not_launches
    why = not_launches(ex)
    assert len(why) == 2 and "(mean (reference))" in why[0] and "(tuple)" in why[1], why
    x = _input(ex)
    x["x"][1, 0, 0, 0] = np.nan
    for got, want in zip(ex.run(x), run(mod, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    saved_part = bind_params(eqquant.parse(f"""def @main(%x: Tensor[{shape}, float32],
          %w: Tensor[{wshape}, float32], %d: Tensor[{dshape}, float32]) {{
  %0 = nn.conv2d(%x, %w, strides=[2, 1], padding=[1, 1, 1, 1], groups=2, {conv});
  %1 = nn.conv2d(%0, %d, padding=[1, 1, 1, 1], groups=32, {conv});
  %2 = max(%1, axis=[3]);
  %3 = reshape(%2, newshape=[-1]);
  %4 = mean(%1, axis={image});
  %5 = reshape(%4, newshape=[-1]);
  %6 = (%3, %5);
  concatenate(%6)
}}
"""), {"w": rng.standard_normal(wshape).astype(np.float32),
       "d": rng.standard_normal(dshape).astype(np.float32)})
    ex = Executor(saved_part)
    assert not_launches(ex) == []
    _same_bits(ex, tmp_path / "lib")


def test_layer_norms_and_broadcasts_are_launches(tmp_path):
    """ConvNeXt's float ops: a layer norm over the last axis (one row a work item, float64
    inside as the op is defined) and sums and products whose operands broadcast along any
    axes (views of the output's shape). Saved, the executor's bits; those the reference's
    within rounding (a division by zero included)."""
    rng = np.random.default_rng(8)
    mod = bind_params(eqquant.parse("""def @main(%x: Tensor[(1, 4, 5, 6), float32],
          %g: Tensor[(6), float32], %b: Tensor[(6), float32], %r: Tensor[(5, 1), float32]) {
  %0 = nn.layer_norm(%x, %g, %b, axis=-1, epsilon=1e-06f);
  %1 = add(%0, %r);
  %2 = multiply(%1, %g);
  %3 = divide(%r, %2);
  nn.layer_norm(%3, %g, %b, axis=3, center=False)
}
"""), {n: rng.standard_normal(s).astype(np.float32)
       for n, s in (("g", (6,)), ("b", (6,)), ("r", (5, 1)))})
    ex = Executor(mod)
    assert not [s.label for s in ex.steps if "reference" in s.label]
    from eqquant.deploy.build import not_launches
    assert not_launches(ex) == []
    _same_bits(ex, tmp_path / "lib")
    x = _input(ex)
    x["x"][0, 0, 0] = 0.0           # a row of zeros: 0 / 0 after the norm's centring
    x["x"][0, 1, 2, 3] = 1e30
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(ex.run(x), run(mod, x), rtol=1e-5, atol=1e-5)


def test_an_int8_dense_layer_on_rows_of_an_image_gives_the_reference_bits():
    """qnn.dense on a (1, H, W, C) input (ConvNeXt's pointwise layers, channel-last): its
    rows multiplied as one 2-D product, on every path the target plans."""
    rng = np.random.default_rng(9)
    for rows in (1, 2, 48):
        mod = bind_params(eqquant.parse(f"""def @main(%x: Tensor[(1, {rows}, 3, 40), uint8],
          %w: Tensor[(24, 40), int8]) {{
  qnn.dense(%x, %w, 3, 0, 0.1f, 0.02f, units=24, out_dtype="int32")
}}
"""), {"w": rng.integers(-128, 128, (24, 40)).astype(np.int8)})
        ex = Executor(mod)
        assert [s.label for s in ex.steps] == ["qnn.dense"]
        x = {"x": rng.integers(0, 256, (1, rows, 3, 40)).astype(np.uint8)}
        np.testing.assert_array_equal(ex.run(x), run(mod, x))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_unfused_int8_convolutions_and_batched_dense_layers_are_launches(layout, tmp_path):
    """An int8 convolution whose sums are not requantized (a qnn.conv2d on its own: 3 x 3 with
    stride 2 on signed bytes, 1 x 1 on unsigned ones that the GEMM reads as they lie) and a
    dense layer on a batch that fills the SIMD GEMM's tile (32 rows, depth and units both
    padded to the kernel's blocks): on every int8 kernel the target offers, pinned in the
    program, the executor gives the reference's bits and a library the executor's."""
    from eqquant.deploy.build import not_launches
    from eqquant.runtime.target import current
    rng = np.random.default_rng(11)
    nhwc = layout == "NHWC"
    conv = f'data_layout="{layout}", kernel_layout="{"HWIO" if nhwc else "OIHW"}"'
    shape, w3, w1 = (((2, 9, 7, 12), (3, 3, 12, 20), (1, 1, 64, 24)) if nhwc else
                     ((2, 12, 9, 7), (20, 12, 3, 3), (24, 64, 1, 1)))
    shape1 = (2, 5, 4, 64) if nhwc else (2, 64, 5, 4)
    programs = [  # (input, its type, the weights' shape, the call)
        (shape, "int8", w3, """qnn.conv2d(%x, %w, -3, 0, 0.1f, 0.02f, strides=[2, 2],
            padding=[1, 1, 1, 1], channels=20, kernel_size=[3, 3], {conv},
            out_dtype="int32"{pin})"""),
        (shape1, "uint8", w1, """qnn.conv2d(%x, %w, 131, 0, 0.1f, 0.02f, channels=24,
            kernel_size=[1, 1], {conv}, out_dtype="int32"{pin})""")]
    if not nhwc:
        programs.append(((32, 40), "int8", (24, 40), """qnn.dense(%x, %w, 5, 0, 0.1f, 0.02f,
            units=24, out_dtype="int32"{pin})"""))
    # (the byte drivers run fused convolutions: rows of 256 bytes or more, or 7-bit weights:
    # test_avx2_bytes)
    offered = [k for k in current().int8_kernels()
               if k not in ("depthwise", "x86.avx2.bytes", "x86.avx2.w7")]
    assert "portable" in offered
    for kernel in offered:
        for i, (xs, dtype, ws, call) in enumerate(programs):
            body = call.format(conv=conv, pin=f', kernel="{kernel}"')
            mod = bind_params(eqquant.parse(
                f"def @main(%x: Tensor[{xs}, {dtype}], %w: Tensor[{ws}, int8]) {{\n"
                f"  {body}\n}}\n"), {"w": rng.integers(-128, 128, ws).astype(np.int8)})
            ex = Executor(mod)
            assert [s.fn.path for s in ex.steps] == [kernel], (kernel, i)
            assert not_launches(ex) == [], (kernel, i)
            build(ex, tmp_path / f"{kernel}{i}")
            library = Library(tmp_path / f"{kernel}{i}")
            lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
            for seed in (1, 2):
                x = {"x": np.random.default_rng(seed).integers(lo, hi, xs).astype(dtype)}
                want = run(mod, x)
                np.testing.assert_array_equal(ex.run(x), want, err_msg=f"{kernel} {i}")
                np.testing.assert_array_equal(library.run(x), want, err_msg=f"{kernel} {i}")


def test_a_layout_change_of_any_permutation_is_one_launch(tmp_path):
    """A layout change other than channels last or first (NCHW -> HWCN, and a 5-axis one,
    read from a view of its operand) is one strided copy: saved, the reference's bits."""
    from eqquant.deploy.build import not_launches
    mod = eqquant.parse("""def @main(%x: Tensor[(2, 3, 4, 5), float32]) {
  %0 = layout_transform(%x, src_layout="NCHW", dst_layout="HWCN");
  %1 = reshape(%0, newshape=[4, 5, 3, 2, 1]);
  %2 = layout_transform(%1, src_layout="ABCDE", dst_layout="EDCBA");
  %3 = reshape(%2, newshape=[1, 2, 3, 20]);
  add(%3, 1f)
}
""")
    ex = Executor(mod)
    assert not_launches(ex) == []
    library = _same_bits(ex, tmp_path / "lib")
    x = _input(ex)
    np.testing.assert_array_equal(library.run(x), run(mod, x))


@parallel
def _transposing_copy(thread, threads, args):
    """A kernel whose code calls a runtime function a library lacks (Numba's ``transpose``
    with axes allocates through ``NRT_MemInfo_new_varsize_dtor``)."""
    x, out = args
    xt = x.transpose(1, 0)
    for i in range(*share(out.shape[0], thread, threads)):
        for j in range(out.shape[1]):
            out[i, j] = xt[i, j]


def test_a_kernel_calling_what_a_library_lacks_is_refused_by_name(tmp_path):
    """A launch whose code calls a function of Numba's runtime that library.c does not define
    is refused when the library is built, naming it (such a library would not load); the NCHW
    average pool, which once did through ``transpose``, saves with the executor's bits."""
    from eqquant.deploy.build import _runtime_missing
    from eqquant.runtime.codegen.compiling import made
    x, out = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((3, 2), np.float32)
    _transposing_copy(x, out)
    np.testing.assert_array_equal(out, x.T)
    entries = [c for c in made().values() if "_transposing_copy" in c._pyfunc.__qualname__]
    assert entries and "NRT_MemInfo_new_varsize_dtor" in _runtime_missing(entries[0])
    mod = eqquant.parse("""def @main(%x: Tensor[(2, 4, 9, 9), float32]) {
  nn.avg_pool2d(%x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
                count_include_pad=True)
}
""")
    ex = Executor(mod)
    assert [type(s.fn).__name__ for s in ex.steps] == ["AvgPool2D"]
    library = _same_bits(ex, tmp_path / "lib")
    x = _input(ex)
    np.testing.assert_array_equal(library.run(x), ex.run(x))
    np.testing.assert_allclose(ex.run(x), run(mod, x), rtol=1e-6, atol=1e-6)


def test_a_grouped_int8_convolution_on_a_gemm_is_saved(tmp_path):
    """A grouped fused.qconv2d (RegNet's groups of 8, channel-last) on the VNNI or AVX2 GEMMs,
    where this CPU has one: its set-major move and its sets' GEMMs are launches, saved in the
    library, with the reference's bits (elsewhere the portable loops are, and are saved)."""
    from eqquant.ir.builder import Builder
    from eqquant.runtime.execution.executor import Executor
    rng = np.random.default_rng(5)
    groups, per = 6, 8
    c = groups * per
    b = Builder()
    x = b.input("x", (2, 10, 10, c), "uint8")
    y = b.call("fused.qconv2d", x, b.param("w", rng.integers(-128, 128, (3, 3, per, c))
                                           .astype("i1")),
               b.param("b", rng.integers(-900, 900, c).astype("i4")),
               b.param("zx", np.array(9, np.int32)), b.param("zw", np.array(0, np.int32)),
               b.param("sx", np.array(0.05, np.float32)),
               b.param("sw", rng.uniform(0.01, 0.02, c).astype(np.float32)),
               b.param("s1", (0.05 * rng.uniform(0.01, 0.02, c)).astype(np.float32)),
               b.param("z1", np.array(0, np.int32)), b.param("s2", np.array(0.1, np.float32)),
               b.param("z2", np.array(5, np.int32)), padding=[1, 1, 1, 1], groups=groups,
               activation="relu", out_dtype="uint8", axis=3, data_layout="NHWC",
               kernel_layout="HWIO")
    mod = bind_params(*b.finish(y))
    ex = Executor(mod)
    (step,) = ex.steps
    gemm = {"x86.vnni", "x86.vnni16", "x86.avxvnni", "x86.avx2"} & set(ex.target.int8_kernels())
    assert (step.fn.conv.slots is not None) == bool(gemm)
    build(ex, tmp_path / "lib")
    xs = {"x": rng.integers(0, 256, (2, 10, 10, c)).astype(np.uint8)}
    want = run(mod, xs)
    np.testing.assert_array_equal(ex.run(xs), want)
    np.testing.assert_array_equal(Library(tmp_path / "lib").run(xs), want)
