"""Saved programs kept in the user's cache, so that a later process runs a program it has run
before without Numba: ``eqquant run`` on a program file takes its library from here, and a
first run saves it (the kernels compiled, or loaded from Numba's cache, then linked).

    program = open_program("resnet18.ir")      # numpy and ctypes only, where it is saved
    y = program.run({"data": x})
    program.engine                              # "library" or "executor"

A program is found by a digest (``key``) of what decides its machine code and its data: the
bytes of the program's file, its weights and an ONNX model's external data files
(``digests.file_digest``: SHA-256 of the contents, remembered while the file is unchanged),
eqquant's source (each file's
size and time), Numba's and llvmlite's versions, the CPU's model and features, the settings that
choose kernels (``EQQUANT_INT8_KERNEL``, ``EQQUANT_FP32_KERNEL``, Numba's CPU options) and
the threads. A program the library cannot hold (``build.NotDeployable``) is noted with the
reason and runs on the executor, without trying again; one whose library could not be built
in this setting (``build.NotBuiltHere``: no C compiler, the compiler failing) is tried again
at its next run. Nothing found in the cache is trusted as it lies: a library is opened only
if its files have the digests recorded when it was saved and its plan is one this eqquant
could have written for the key it is found under (``loader.Library``); anything else there
(damaged, edited, swapped, a symlink, a folder the cache did not write) is set aside and the
program saved again. A library is checked once, as it is
saved, in a child process (``check.py``): its output on a random input must equal the
executor's bit for bit, else it is dropped (a crash there too, with the signal named).
``EQQUANT_DEPLOY=0``: neither used nor saved. The cache keeps the KEEP programs used last.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from ..errors import EqquantError, EvalError
from ..ir.outputs import backup_path
from ..resources import cache_dir, cache_write, rules_digest, source_digest
from .digests import file_digest
from .loader import FORMAT, Library, cpu_digest, pool_threads

KEEP = 8
SETTINGS = ("EQQUANT_INT8_KERNEL", "EQQUANT_FP32_KERNEL", "NUMBA_OPT", "NUMBA_CPU_NAME",
            "NUMBA_CPU_FEATURES", "NUMBA_NUM_THREADS")
_PACKAGE = Path(__file__).resolve().parent.parent


def enabled() -> bool:
    """Whether libraries are used and saved: on Linux (a library is an ELF shared object
    built with cc and OpenMP), unless ``EQQUANT_DEPLOY=0``."""
    return sys.platform.startswith("linux") and \
        os.environ.get("EQQUANT_DEPLOY", "1").strip() != "0"


def programs_dir() -> Path:
    return cache_dir() / "programs"


def _code() -> bytes:
    """eqquant's source as installed (``resources.source_digest``: all of it, as a program's
    binding reads the parser, the registry and the passes besides the runtime), its rules
    (``resources.rules_digest``: an optimized program is what they made it), Numba's and
    llvmlite's versions."""
    h = hashlib.sha256(source_digest(_PACKAGE).encode())
    h.update(rules_digest().encode())     # (the rules an optimized program was made by)
    for package in ("numba", "llvmlite"):
        spec = importlib.util.find_spec(package)      # (found, not imported)
        version = Path(spec.origin).with_name("_version.py") if spec and spec.origin else None
        h.update(version.read_bytes() if version and version.exists() else b"?")
    return h.digest()


def key(files: list[Path], how: str = "") -> str:
    """The digest a program made from ``files`` is saved under (in this setting; ``how``:
    what was done to the program after loading it, e.g. its kernels planned again)."""
    h = hashlib.sha256(f"eqquant-library {FORMAT}\n{how}\n".encode())
    for path in files:
        h.update(file_digest(path).encode() + b"\n")
    h.update(_code())
    h.update(cpu_digest().encode())
    for name in SETTINGS:
        h.update(f"{name}={os.environ.get(name, '')}\n".encode())
    # the target chosen (--target: the kernels the program is planned for; the host's follow
    # from the CPU and the settings above). None was where the module was never imported,
    # which this process's first run of a saved library must not do (it imports Numba)
    targets = sys.modules.get("eqquant.runtime.target")
    target = targets.chosen() if targets else None
    h.update(f"target={target.to_json() if target else 'host'}\n".encode())
    h.update(f"threads={pool_threads()}".encode())
    return h.hexdigest()[:32]


def lookup(digest: str) -> Library | str | None:
    """The library saved under ``digest``, the reason it could not be saved (a string), or
    None."""
    folder = programs_dir() / digest
    refused = folder.with_suffix(".refused")
    if refused.exists() or refused.is_symlink():
        note = _note(refused)
        if note is not None:
            return note
        _set_aside(refused)             # (not a note this cache wrote: tried again)
    if folder.is_symlink() or (folder.exists() and not _is_library(folder)):
        _set_aside(folder)              # (not a library this cache saved: saved again)
    if not folder.exists():
        return None
    try:
        library = Library(folder, key=digest)
    except EvalError:       # (damaged, or not the library of this key: saved again)
        _set_aside(folder)
        return None
    try:
        os.utime(folder / "plan.json")          # (used now: kept longer, ``_prune``)
    except OSError:
        pass
    return library


NOTE_BYTES = 4096     # a refusal's note is one line of eqquant's: longer is not one


def _note(path: Path) -> str | None:
    """The refusal noted at ``path``, or None where that is not a note this cache wrote (a
    symlink, a folder, a large or binary file): never another file's contents."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > NOTE_BYTES:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _is_library(folder: Path) -> bool:
    plan = folder / "plan.json"
    return folder.is_dir() and not plan.is_symlink() and plan.is_file()


def _set_aside(path: Path) -> None:
    """Remove what lies at ``path`` in the cache, whatever it is (a symlink: the link, never
    what it points to)."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)
    except OSError:
        pass


def save(executor, digest: str, aliases: dict | None = None) -> Library | str:
    """Save ``executor``'s program under ``digest`` (``aliases``: other names of its inputs,
    ``build``'s): its library, checked in a child process against the executor
    (``check.Checker``: a library that crashes there costs the child only) and only then
    loaded here, or the reason it was not saved (noted in the cache, unless it was the
    cache itself: a folder that cannot be written, a full disk). One process saves a
    program at a time (``_SaveLock``): another that asked meanwhile waits, then takes the
    library it saved, or its reason (two saves at once had read one's plan with the
    other's data, and noted the mix as a refusal)."""
    folder = programs_dir() / digest
    try:
        lock = _SaveLock(digest)
    except OSError as e:
        return f"the library could not be written to the cache ({e})"
    with lock:
        found = lookup(digest)      # (saved or refused while this one waited; a folder
        if found is not None:       # this cache did not write: set aside)
            return found
        return _save(executor, folder, digest, aliases)


def _save(executor, folder: Path, digest: str, aliases: dict | None) -> Library | str:
    """``save``'s work, its lock held."""
    from .build import NotBuiltHere, NotDeployable, build, prune_objects
    from .check import Checker
    library = None
    try:
        with Checker() as checker:          # (starting while the library is linked)
            build(executor, folder, key=digest, aliases=aliases)
            reason = checker.check(executor, folder)
        if reason is None:
            library = Library(folder, key=digest)
    except NotBuiltHere as e:               # (may pass: not noted, tried again next time)
        _set_aside(folder)
        return e.message
    except (NotDeployable, EvalError) as e:
        reason = e.message
    except OSError as e:
        _set_aside(folder)
        return f"the library could not be written to the cache ({e})"
    if reason is not None:
        _set_aside(folder)
        cache_write(folder.with_suffix(".refused"), reason)   # (never through a link)
        return reason
    _prune()
    prune_objects()
    return library


class _SaveLock:
    """An exclusive lock on saving the program ``digest`` names (``flock`` on its file in the
    cache's ``locks/``, released when the block ends, or when the process dies)."""

    def __init__(self, digest: str):
        path = cache_dir() / "locks" / f"{digest}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def __enter__(self):
        import fcntl
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)               # (the lock goes with its descriptor)


def _prune() -> None:
    """Keep the KEEP programs used last (and the notes of refusals)."""
    try:
        folders = [p for p in programs_dir().iterdir() if (p / "plan.json").exists()]
        folders.sort(key=lambda p: (p / "plan.json").stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in folders[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


class Program:
    """A program to run (``run``: an array for its one input, or a dict by input name): its
    saved library (``runner``: a ``loader.Library``), or the executor (``runner``: the
    ``api.Model``, its executor made) (``engine``; ``note``: why not the library;
    ``compiled``: what making the executor compiled, where one was made,
    ``runtime.codegen.compiling.Shared``; ``said``: what was done to the program as it was loaded,
    ``prepare``'s)."""

    def __init__(self, runner, engine: str, inputs: dict, note: str = "", compiled=None,
                 said: str = ""):
        self.runner, self.engine, self.inputs, self.note = runner, engine, inputs, note
        self.compiled, self.said = compiled, said

    def run(self, inputs):
        return self.runner.run(inputs)


def program_files(program: Path, params: str | os.PathLike | None) -> list[Path]:
    """The files a program is made from: it, an ONNX model's external data files, and its
    weights (``params``, else the .npz beside a text IR, ``ir.loader``'s rule)."""
    files = [program]
    if program.suffix == ".onnx":
        from ..interop.onnx_import import external_data_files
        files += external_data_files(program)
    if params is not None:
        files.append(Path(params))
    elif program.suffix != ".onnx":
        files += [f for f in (program.with_suffix(".npz"),
                              backup_path(program.with_suffix(".npz"))) if f.exists()]
    return files


def program_key(files: list[Path], replan: bool = False, optimize: bool = True) -> str:
    """The digest of a program run from ``files`` the way ``eqquant run`` was asked to
    (``key``'s, with what ``prepare`` does to it)."""
    return key(files, ",".join(h for h, on in (("replan", replan), ("optimized", optimize))
                               if on))


def prepare(program: str | os.PathLike, params: str | os.PathLike | None = None,
            replan: bool = False, optimize: bool = True, digest: str | None = None):
    """(the ``api.Model`` of ``program`` as ``eqquant run`` runs it, what was done to it, the
    digest its library is saved under (None: not saved)): with ``optimize``, its batch norms
    folded, epilogues fused, layouts and kernels chosen (``quant.flow.cpu_program``), once
    per program, the result kept in the cache (``_optimized``); with ``replan``, the kernels
    it names forgotten first and planned for this process's target. ``digest``: the
    program's, where the caller has it."""
    program = Path(program)
    files = program_files(program, params)
    if digest is None and all(f.is_file() for f in files):
        digest = program_key(files, replan, optimize)
    from ..api import load
    model = load(program, params)
    if replan:
        import dataclasses
        from ..runtime.lowering.plan import unplanned
        model = dataclasses.replace(model, module=unplanned(model.module))
    said = ""
    if optimize:
        model, said = _optimized(model, digest)
    return model, said, digest


OPTIMIZED = "optimized"    # the cache's folder of optimized programs: <digest>.ir, .npz, .sha256


def _optimized(model, digest: str | None):
    """(``model`` optimized for the CPU, what was done): from the cache where it holds it (its
    files checked against the digests written beside them: damaged, they are made again),
    else optimized now and kept there."""
    import dataclasses
    from ..core.nodes import Call, post_order
    from ..ir.loader import load_program, save_program
    from ..quant.flow import cpu_program

    def calls(mod) -> int:
        return sum(isinstance(n, Call) for n in post_order(mod.main.body))
    before = calls(model.module)
    folder = cache_dir() / OPTIMIZED
    ir, npz, sums = (folder / f"{digest}{ext}" for ext in (".ir", ".npz", ".sha256")) \
        if digest else (None, None, None)
    if digest and any(f.is_symlink() for f in (ir, npz, sums)):
        for f in (sums, ir, npz):                  # (not written by the cache: never
            _set_aside(f)                          # followed, made again)
    if digest and sums.is_file():
        try:
            if sums.read_text() == _digests(ir, npz):
                mod, values = load_program(ir, npz)
                return (dataclasses.replace(model, module=mod, params=values, _executor=None),
                        f"optimized: {before} ops -> {calls(mod)} (cached)")
        except (OSError, UnicodeDecodeError, EqquantError):
            pass                                   # damaged: made again below
        for f in (sums, ir, npz):
            f.unlink(missing_ok=True)
    mod = cpu_program(model._bound()).module
    if digest:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            save_program(ir, mod)
            cache_write(sums, _digests(ir, npz))
        except OSError:
            pass                                   # (a cache that cannot be written: none)
    return (dataclasses.replace(model, module=mod, params={}, _executor=None),
            f"optimized: {before} ops -> {calls(mod)} (bn_fold, fusion, layouts, kernels)")


def _digests(*files: Path) -> str:
    return "".join(f"{file_digest(f)}  {f.name}\n" for f in files)


def open_program(program: str | os.PathLike, params: str | os.PathLike | None = None,
                 save_library: bool = True, replan: bool = False,
                 optimize: bool = True) -> Program:
    """``program`` (text IR, with ``params`` or the .npz beside it; or .onnx) ready to run:
    from its library where one is saved (Numba never imported), else on the executor,
    its library saved for the next process (``save_library``). ``optimize`` and ``replan``:
    as ``prepare``'s (``Program.said`` says what was done)."""
    program = Path(program)
    files = program_files(program, params)
    digest = program_key(files, replan, optimize) \
        if enabled() and all(f.is_file() for f in files) else None
    found = lookup(digest) if digest else None
    if isinstance(found, Library):
        return Program(found, "library", found.inputs)
    from contextlib import nullcontext
    from .build import keeping_objects
    model, said, _ = prepare(program, params, replan, optimize, digest)
    saving = bool(digest) and found is None and save_library
    with keeping_objects() if saving else nullcontext():   # (what compiles, compiled for
        executor = model.executor()                         # the library too)
    inputs = {name: t for name, (_, t) in executor.inputs.items()}
    note = found if isinstance(found, str) else ""
    if saving:
        saved = save(executor, digest, model.aliases)
        if isinstance(saved, Library):
            return Program(saved, "library", inputs, compiled=executor.compiled, said=said)
        note = saved
    if not enabled():
        note = "libraries are off (EQQUANT_DEPLOY=0, or not on Linux)"
    return Program(model, "executor", inputs, note, executor.compiled, said)
