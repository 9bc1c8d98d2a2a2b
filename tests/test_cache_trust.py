"""Nothing on disk is trusted as it lies (#54): a saved library is checked against the digests
recorded as it was saved and its plan against what eqquant writes, before any address is
formed from it; the cache's key reads every byte of what a program is made from. The fuzzer
here damages each file of a saved library the ways a disk, a user or another program can
(truncated, bits flipped, swapped with another program's, plan fields edited, replaced by a
folder or a symlink): every case ends in the right output or a clear error, never a crash or
a wrong number."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from conftest import own_cache

import eqquant
from eqquant.deploy import cache
from eqquant.deploy.build import NotDeployable, build
from eqquant.deploy.loader import FILES, Library
from eqquant.errors import EqquantError, EvalError
from eqquant.ir.loader import save_program
from eqquant.ir.params import bind_params
from eqquant.runtime.execution.executor import Executor
from forging import restamp

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (1, 16, 24, 24)
TEXT = """def @main(%x: Tensor[(1, 16, 24, 24), float32], %w: Tensor[(1, 16, 24, 24), float32],
          %b: Tensor[(1, 16, 24, 24), float32]) {
  %0 = multiply(%x, %w);
  %1 = add(%0, %b);
  nn.relu(%1)
}
"""


def _weights(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal(SHAPE).astype(np.float32),
            "b": rng.standard_normal(SHAPE).astype(np.float32)}


def _program(seed):
    return bind_params(eqquant.parse(TEXT), _weights(seed))


X = np.random.default_rng(9).standard_normal(SHAPE).astype(np.float32)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """Two libraries of one architecture with other weights (``a``, ``b``), their keys and
    the output each must give on X."""
    folder = tmp_path_factory.mktemp("libraries")
    made = {}
    for name, seed in (("a", 0), ("b", 1)):
        ex = Executor(_program(seed))
        try:
            build(ex, folder / name, key=f"key-{name}")
        except NotDeployable as e:
            pytest.fail(f"a program of elementwise ops is not saved on this CPU: {e.message}")
        made[name] = (folder / name, ex.run({"x": X}))
    return made


def _flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[min(int(where * len(data)), len(data) - 1)] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path, keep) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


def _replace(path: Path, by) -> None:
    path.unlink()
    by(path)


FILE_DAMAGE = {
    "truncated by 4 KiB": lambda p, o: _truncate(p, lambda n: max(0, n - 4096)),
    "truncated to half": lambda p, o: _truncate(p, lambda n: n // 2),
    "emptied": lambda p, o: _truncate(p, lambda n: 0),
    "a bit flipped at its start": lambda p, o: _flip(p, 0.0),
    "a bit flipped in its middle": lambda p, o: _flip(p, 0.5),
    "a bit flipped at its end": lambda p, o: _flip(p, 1.0),
    "swapped with the other program's": lambda p, o: shutil.copyfile(o / p.name, p),
    "a folder": lambda p, o: _replace(p, lambda q: q.mkdir()),
    "a symlink to the other program's": lambda p, o: _replace(p, lambda q: q.symlink_to(o / p.name)),
    "missing": lambda p, o: p.unlink(),
}


def _edit(change):
    def edit(folder: Path):
        plan = json.loads((folder / "plan.json").read_text())
        change(plan)
        (folder / "plan.json").write_text(json.dumps(plan))
    return edit


def _set(path, value):
    def change(plan):
        *head, last = path
        at = plan
        for k in head:
            at = at[k]
        at[last] = value
    return change


# plan edits a schema must refuse (each also tried as damage: sums.json not matching)
PLAN_EDITS = {
    "its function index -1": _set(("launches", 0, "function"), -1),
    "its function index 999": _set(("launches", 0, "function"), 999),
    "a function renamed": lambda p: p["functions"].__setitem__(0, "eqq_no_such_function"),
    "a function named as a path": lambda p: p["functions"].__setitem__(0, "../../x"),
    "threads -1": _set(("threads",), -1),
    "threads as text": _set(("threads",), "2"),
    "phase 0": _set(("phase",), 0),
    "phase 3": _set(("phase",), 3),
    "an output of dtype object": _set(("output", "dtype"), "object"),
    "an output past its root": _set(("output", "offset"), 1 << 30),
    "an input shape grown": lambda p: p["inputs"][0]["shape"].__setitem__(0, 1 << 20),
    "a weight root past data.bin's end":
        lambda p: next(r for r in p["roots"] if r["at"] is not None).__setitem__("at", 1 << 40),
    "a reference offset of 10^9":
        lambda p: next(r for l in p["launches"] for r in l["refs"]
                       if r[1] == "root").__setitem__(3, 10 ** 9),
    "a reference to word 10^6":
        lambda p: p["launches"][0]["refs"][0].__setitem__(0, 10 ** 6),
    "a reference of no kind": lambda p: p["launches"][0]["refs"][0].__setitem__(1, "bogus"),
    "a word that is not an integer": lambda p: p["launches"][0]["words"].__setitem__(0, 1.5),
    "the launches a number": _set(("launches",), 7),
    "a launch count of -1": _set(("launches", 0, "count"), -1),
    "the format of another version": _set(("format",), 3),
    "a batched table of inputs other than the plan's": lambda p: p.__setitem__("batched", {
        "inputs": [{**p["inputs"][0], "shape": [1, 3]}], "output": p["output"],
        "launches": p["launches"]}),
    "a batched table naming function 999": lambda p: p.__setitem__("batched", {
        "inputs": p["inputs"], "output": p["output"],
        "launches": [{**p["launches"][0], "function": 999}]}),
    "a batched table that is a list": _set(("batched",), []),
    "the plan emptied": lambda p: p.clear(),
}
# plan edits of damage only: a plan eqquant could write, caught by its digest
PLAN_DAMAGE = {
    "its launches emptied": _set(("launches",), []),
    "its last launch dropped": lambda p: p["launches"].pop(),
    "its inputs emptied": _set(("inputs",), []),
    **PLAN_EDITS,
}


def _outcome(folder: Path, want: np.ndarray, key: str | None = None) -> str:
    """"right" (the library runs and gives ``want``), or "refused: <message>"; anything
    else fails the test."""
    try:
        library = Library(folder, key=key)
    except EvalError as e:
        assert str(folder) in e.message, e.message
        return f"refused: {e.message}"
    got = library.run({"x": X})
    assert got.shape == want.shape and np.array_equal(got, want), "a wrong result"
    return "right"


@pytest.mark.parametrize("name", [*FILES, "sums.json"])
@pytest.mark.parametrize("damage", list(FILE_DAMAGE))
def test_every_damage_to_a_librarys_files_is_refused_never_run(libraries, tmp_path, name,
                                                               damage):
    (a, want), (b, _) = libraries["a"], libraries["b"]
    folder = tmp_path / "lib"
    shutil.copytree(a, folder)
    FILE_DAMAGE[damage](folder / name, b)
    said = _outcome(folder, want, key="key-a")
    if (name, damage) == ("program.so", "swapped with the other program's") and \
            (b / name).read_bytes() == (a / name).read_bytes():
        assert said == "right"       # (the same code: nothing was changed)
    else:
        assert said.startswith("refused"), said


@pytest.mark.parametrize("edit", list(PLAN_DAMAGE))
def test_an_edited_plan_is_refused_by_its_digest(libraries, tmp_path, edit):
    a, want = libraries["a"]
    folder = tmp_path / "lib"
    shutil.copytree(a, folder)
    _edit(PLAN_DAMAGE[edit])(folder)
    said = _outcome(folder, want)
    assert said.startswith("refused") and "plan.json is not the file it was saved with" in said


def test_a_forged_plan_whose_digests_match_is_refused_by_its_schema(libraries, tmp_path):
    """Each edit with sums.json made to match: the schema names the field, before the
    loader forms an address from it. Run in a child process, so that an edit the schema let
    through and that crashed would be reported with its name, not kill the test run."""
    a, _ = libraries["a"]
    cases = {}
    for j, (edit, change) in enumerate(PLAN_EDITS.items()):
        folder = tmp_path / f"forged{j}"
        shutil.copytree(a, folder)
        _edit(change)(folder)
        restamp(folder)
        cases[edit] = str(folder)
    script = (
        "import json, sys\n"
        "from eqquant.deploy.loader import Library\n"
        "from eqquant.errors import EvalError\n"
        f"for edit, folder in json.loads({json.dumps(json.dumps(cases))}).items():\n"
        "    print(json.dumps(edit), end='\\t', flush=True)\n"
        "    try:\n"
        "        Library(folder)\n"
        "        print(json.dumps('loaded'), flush=True)\n"
        "    except EvalError as e:\n"
        "        print(json.dumps(e.message), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = done.stdout.splitlines()
    assert done.returncode == 0, f"crashed ({done.returncode}) at {lines[-1:]}: {done.stderr}"
    said = dict(line.split("\t", 1) for line in lines)
    assert len(said) == len(PLAN_EDITS)
    for edit, message in said.items():
        message = json.loads(message)
        assert message != "loaded", f"{edit}: loaded"
        assert "plan.json is a plan eqquant does not write" in message or \
            "lacks a C function" in message, (edit, message)


def test_a_library_of_another_program_is_not_taken_for_this_ones(libraries, tmp_path):
    (a, want), (b, other) = libraries["a"], libraries["b"]
    folder = tmp_path / "lib"
    shutil.copytree(b, folder)                 # (whole and consistent, another key)
    said = _outcome(folder, other, key="key-a")
    assert said.startswith("refused") and "another program" in said
    assert _outcome(folder, other) == "right"  # (opened as itself, it is that program)


def _cached(tmp_path, monkeypatch, seed=0):
    own_cache(monkeypatch, tmp_path / "cache")
    path, _ = save_program(tmp_path / f"p{seed}.ir", _program(seed))
    files = cache.program_files(path, None)
    return path, cache.programs_dir() / cache.program_key(files)


@pytest.mark.parametrize("damage", ["data.bin truncated by 4 KiB", "a bias's bit flipped",
                                    "the other program's plan and data",
                                    "the other program's library whole",
                                    "a plan with its launches emptied"])
def test_a_damaged_library_in_the_cache_is_set_aside_and_saved_again(tmp_path, monkeypatch,
                                                                      damage):
    other, other_folder = _cached(tmp_path, monkeypatch, seed=1)
    assert cache.open_program(other).engine == "library"
    path, folder = _cached(tmp_path, monkeypatch)
    first = cache.open_program(path)
    assert first.engine == "library"
    want = Executor(_program(0)).run({"x": X})
    if damage == "data.bin truncated by 4 KiB":
        _truncate(folder / "data.bin", lambda n: n - 4096)
    elif damage == "a bias's bit flipped":
        _flip(folder / "data.bin", 0.75)
    elif damage == "the other program's plan and data":
        for name in ("plan.json", "data.bin"):
            shutil.copyfile(other_folder / name, folder / name)
    elif damage == "the other program's library whole":
        shutil.rmtree(folder)
        shutil.copytree(other_folder, folder)
    else:
        _edit(_set(("launches",), []))(folder)
    again = cache.open_program(path)
    assert again.engine == "library" and again.note == ""
    np.testing.assert_array_equal(again.run({"x": X}), want)
    assert Library(folder, key=folder.name)       # (saved again, whole)


def _forge_crc(data: bytearray, start: int, want: int) -> None:
    """Set the 4 bytes of ``data`` at ``start`` so that its CRC-32 is ``want`` (CRC-32 is
    affine over GF(2): the 32 bits there span every difference)."""
    data[start:start + 4] = b"\0\0\0\0"
    base = zlib.crc32(bytes(data))
    columns = []
    for bit in range(32):
        data[start + bit // 8] ^= 1 << (bit % 8)
        columns.append(zlib.crc32(bytes(data)) ^ base)
        data[start + bit // 8] ^= 1 << (bit % 8)
    # solve sum(x_i * columns[i]) == want ^ base over GF(2)
    rows = [(c, 1 << i) for i, c in enumerate(columns)]
    basis: dict[int, tuple[int, int]] = {}
    for c, m in rows:
        for top in sorted(basis, reverse=True):
            if c >> top & 1:
                c, m = c ^ basis[top][0], m ^ basis[top][1]
        if c:
            basis[c.bit_length() - 1] = (c, m)
    target, chosen = want ^ base, 0
    for top in sorted(basis, reverse=True):
        if target >> top & 1:
            target, chosen = target ^ basis[top][0], chosen ^ basis[top][1]
    assert target == 0
    for bit in range(32):
        if chosen >> bit & 1:
            data[start + bit // 8] ^= 1 << (bit % 8)


def _rewrite_member(npz: Path, name: str, change) -> None:
    """Change array ``name`` of an uncompressed .npz in place, its bytes only: the zip's
    CRC-32s and sizes stay as they were."""
    with zipfile.ZipFile(npz) as z:
        info = z.getinfo(f"{name}.npy")
        raw = bytearray(z.read(info))
    change(raw)
    blob = bytearray(npz.read_bytes())
    header = info.header_offset
    n, m = struct.unpack("<HH", blob[header + 26:header + 30])
    start = header + 30 + n + m
    blob[start:start + len(raw)] = raw
    npz.write_bytes(bytes(blob))


def test_the_key_reads_every_byte_of_the_weights_not_their_zip_crcs(tmp_path, monkeypatch):
    """A bias raised by 5 with the CRC-32 kept (four bytes of that weight forged to match)
    is another program: not served the first one's library. An in-place edit that leaves a
    stale CRC is another key too (its loading then names the damaged file)."""
    path, folder = _cached(tmp_path, monkeypatch)
    assert cache.open_program(path).engine == "library"
    npz = path.with_suffix(".npz")
    with np.load(npz, allow_pickle=False) as stored:
        b, w = (next(k for k in stored.files if np.array_equal(stored[k], _weights(0)[name]))
                for name in ("b", "w"))
    crc = zipfile.ZipFile(npz).getinfo(f"{b}.npy").CRC

    def forged(raw):
        offset = len(raw) - SHAPE[1] * SHAPE[2] * SHAPE[3] * 4    # (past the .npy header)
        values = np.frombuffer(bytes(raw[offset:]), np.float32).copy()
        values[0] += 5
        raw[offset:] = values.tobytes()
        _forge_crc(raw, len(raw) - 4, crc)
    _rewrite_member(npz, b, forged)
    with zipfile.ZipFile(npz) as z:
        assert z.getinfo(f"{b}.npy").CRC == crc and z.testzip() is None   # (a CRC that holds)
    changed = cache.program_key(cache.program_files(path, None))
    assert changed != folder.name
    program = cache.open_program(path)
    got = program.run({"x": X})
    with np.load(npz, allow_pickle=False) as stored:
        changed_b = stored[b]
    assert changed_b.reshape(-1)[0] == pytest.approx(_weights(0)["b"].reshape(-1)[0] + 5)
    want = Executor(bind_params(eqquant.parse(TEXT), {**_weights(0), "b": changed_b})).run(
        {"x": X})
    np.testing.assert_array_equal(got, want)
    # the CRC left stale: another key; the weights' loading names the file
    _rewrite_member(npz, w, lambda raw: raw.__setitem__(slice(-4, None), b"\1\2\3\4"))
    assert cache.program_key(cache.program_files(path, None)) != changed
    with pytest.raises(EqquantError, match=str(npz.name)):
        cache.open_program(path)


def test_an_onnx_models_external_data_is_part_of_its_key(tmp_path, monkeypatch):
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    own_cache(monkeypatch, tmp_path / "cache")
    w = np.linspace(-2, 2, 16 * 24 * 24, dtype=np.float32).reshape(SHAPE)
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(SHAPE))],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="m.onnx.data",
              size_threshold=0)
    data = tmp_path / "m.onnx.data"
    assert data.is_file() and cache.program_files(path, None) == [path, data]
    first = cache.open_program(path)
    assert first.engine == "library"
    np.testing.assert_array_equal(first.run({"x": X}), np.maximum(X * w, 0))
    data.write_bytes((-w).tobytes() + data.read_bytes()[w.nbytes:])    # (the same size)
    again = cache.open_program(path)
    np.testing.assert_array_equal(again.run({"x": X}), np.maximum(X * -w, 0))


def test_the_cache_folder_is_private(tmp_path, monkeypatch):
    path, _ = _cached(tmp_path, monkeypatch)
    assert cache.open_program(path).engine == "library"
    assert (tmp_path / "cache").stat().st_mode & 0o777 == 0o700


def test_a_rules_file_changed_is_another_key(tmp_path, monkeypatch):
    """A program optimized (and its library saved) by one set of rules is not served after a
    rules file changes: the rules are part of the key, as the code is."""
    import shutil
    from eqquant import resources
    rules = tmp_path / "rules"
    shutil.copytree(resources.rules_dir(), rules)
    monkeypatch.setattr(resources, "rules_dir", lambda: rules)
    path, folder = _cached(tmp_path, monkeypatch)
    files = cache.program_files(path, None)
    assert cache.program_key(files) == folder.name
    edited = rules / "layout.rules"
    edited.write_text(edited.read_text() + "\n# a comment: still another file\n")
    assert cache.program_key(files) != folder.name
