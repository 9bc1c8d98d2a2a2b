"""``eqquant``: the command line.

Every command reports a user's mistake as ``file:line:col: kind: message`` with the line and a
caret, exits with status 2 and never shows a Python traceback (``EQQUANT_DEBUG=1`` shows one
for internal errors). Nothing is written unless the command succeeds, and files are replaced
atomically.
"""
from __future__ import annotations

import os
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path

import click
import numpy as np

from ..errors import EqquantError


def _fail(message: str, code: int = 2) -> None:
    click.echo(message, err=True)
    sys.exit(code)


def _use_target(ctx, param, value):
    """``--target``: the process's target (``runtime.target``), checked against this CPU."""
    if value is not None:
        from ..runtime.target import NAMES, use
        if value not in NAMES:
            raise click.BadParameter(f"{value!r} is none of {', '.join(NAMES)}")
        use(value)
    return value


# the kernels a command may plan and run: the host's, or a kind of CPU as this one runs it
_TARGET = click.option(
    "--target", metavar="NAME", default=None, expose_value=False, is_eager=True,
    callback=_use_target,
    help="The kernels to plan and run: host (every kernel this CPU runs; default) or a kind "
    "of CPU as this one runs it: avx512 (VNNI, no AMX), avxvnni, avx2 (no VNNI), portable. "
    "A kind whose kernels this CPU lacks is an error.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eqquant")
def cli() -> None:
    """eqquant: fp32 inference graphs to fast int8 programs by equality saturation."""


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--check", is_flag=True, help="Exit 1 if FILE is not in canonical form.")
@click.option("--in-place", "-i", is_flag=True, help="Rewrite FILE in canonical form.")
@click.option("--types", is_flag=True, help="Annotate every value with its type (text IR).")
@click.option("--to", "to", type=click.Choice(["relay", "relax"]), default=None,
              help="Print in this format: the text IR (relay) or TVM Relax's TVMScript "
                   "(relax). Default: FILE's own (.py/.tvmscript files are TVMScript).")
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz) of a TVMScript FILE (it omits its constants); default: "
                   "the .npz beside FILE, if any.")
def fmt(file: Path, check: bool, in_place: bool, types: bool, to: str | None,
        params: Path | None) -> None:
    """Print FILE in canonical form (or in the other format, with --to)."""
    from ..ir.loader import default_params_path, is_tvmscript, parse_source, read_source
    from ..ir.params import atomic_write, load_params
    from ..ir.printer import print_module
    from ..ir.tvmscript import print_tvmscript
    from ..ir.outputs import STAMP_PREFIX, recorded_stamp
    own = "relax" if is_tvmscript(file) else "relay"
    if (check or in_place) and to not in (None, own):
        _fail(f"--check and --in-place keep {file}'s own format ({own}); --to {to} prints")
    text = read_source(file)
    if params is None and own == "relax":
        params = default_params_path(file)
    mod = parse_source(text, file, load_params(params) if params is not None else {})
    if (to or own) == "relax":
        out = print_tvmscript(mod)
    else:
        out = print_module(mod, show_types=types)
        stamp = recorded_stamp(text)
        if stamp is not None and own == "relay":   # a saved program keeps its weights' stamp
            out = f"{STAMP_PREFIX}{stamp}\n{out}"
    if check:
        if out != text:
            _fail(f"{file}: not in canonical form (run: eqquant fmt -i {file})", 1)
        return
    if in_place:
        if out != text:
            atomic_write(file, lambda tmp: Path(tmp).write_text(out, encoding="utf-8"))
        return
    click.echo(out, nl=False)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz); default: the .npz beside FILE, if any.")
def check(file: Path, params: Path | None) -> None:
    """Type-check FILE (and its /* ty=... */ annotations)."""
    from ..ir.loader import load_program
    from ..ir.params import bind_params
    from ..ir.typecheck import check_module
    mod, values = load_program(file, params)
    types = check_module(mod)
    if values:
        check_module(bind_params(mod, values))  # the params fit the declared types
    for name, fn in mod.functions.items():
        ins = ", ".join(f"%{p.name}: {p.type}" for p in fn.params if p.name not in values)
        click.echo(f"{file}: @{name}({ins}) -> {types[id(fn.body)]}: ok")


@cli.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz); default: the .npz beside FILE, if any.")
@click.option("--input", "-x", "input_path", required=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The input: .npy (one input) or .npz keyed by input name.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the output here (.npy); default: print a summary.")
@click.option("--engine", type=click.Choice(["cpu", "executor", "reference"]), default="cpu",
              show_default=True, help="cpu: the program's library saved ahead of time "
              "(saved in the cache at its first run; else the executor); executor: the "
              "Numba executor; reference: the numpy reference interpreter.")
@click.option("--profile", is_flag=True, help="Print the time per op (on stderr).")
@_TARGET
@click.option("--replan", is_flag=True, help="Forget the kernels FILE names (a plan made for "
              "another CPU or target) and plan them for this one.")
@click.option("--no-opt", is_flag=True, help="Run FILE as it is: no batch norm folding, "
              "fusion, layouts (by default, a program is optimized for the CPU at its first "
              "run, and the result cached).")
@click.option("--verbose", "-v", is_flag=True,
              help="Say on stderr what runs the program (its library, or the executor and "
              "why) and what runs each op: kernel, path, layout, dtypes, threads.")
def run(file: Path, params: Path | None, input_path: Path, output: Path | None,
        engine: str, profile: bool, replan: bool, no_opt: bool, verbose: bool) -> None:
    """Run FILE (text IR, .onnx, or a library saved by `eqquant compile`) on an input: as
    optimized for this CPU (batch norms folded, epilogues fused, layouts and kernels chosen;
    once, then cached), unless --no-opt; the reference interpreter runs it as it is."""
    from ..ir.params import atomic_write, load_inputs
    if file.is_dir() or engine == "cpu":
        out = _run_library(file, params, input_path, engine, verbose, profile, replan,
                           not no_opt)
    else:
        import dataclasses
        from ..api import load
        from ..ir.interp import run as interpret
        from ..ir.typecheck import check_module
        from ..runtime.lowering.plan import unplanned
        if engine == "reference":
            m = load(file, params)
            if replan:
                m = dataclasses.replace(m, module=unplanned(m.module))
            said = ""
        else:
            from ..deploy.cache import prepare
            if not file.exists():
                raise EqquantError(f"{file}: no such file")
            m, said, _ = prepare(file, params, replan, not no_opt)
        mod, values = m.module, m.params
        check_module(mod)
        inputs = m.named(load_inputs(input_path, list(m.inputs)))
        if engine == "reference":
            if verbose:
                _say(file, "runs on the reference interpreter (--engine reference)")
            out = interpret(mod, inputs, values)
        else:
            ex = m.executor()
            if hasattr(ex, "for_inputs"):     # (sizes open: the executor of these inputs')
                ex = ex.for_inputs(inputs)
            if verbose:
                _say(file, f"runs on the executor (--engine executor){_said(said)}",
                     ex.kernel_plan())
            out = ex.run(inputs, profile=profile)
            if profile:
                for _ in range(4):
                    ex.run(inputs, profile=True)
                click.echo(ex.profile_table(), err=True)
    leaves = _output_leaves(out)
    if output is not None:
        if len(leaves) == 1 and output.suffix != ".npz":
            arr = leaves[0]
            def write_npy(tmp):      # (a file object: np.save would add .npy to a name)
                with open(tmp, "wb") as f:
                    np.save(f, arr)
            atomic_write(output, write_npy)
            click.echo(f"wrote {output}: {arr.dtype}{list(arr.shape)}")
        elif output.suffix == ".npz":
            named = {f"output_{i}": a for i, a in enumerate(leaves)}
            def write_npz(tmp):
                with open(tmp, "wb") as f:
                    np.savez(f, **named)
            atomic_write(output, write_npz)
            click.echo(f"wrote {output}: {len(leaves)} outputs (output_0 ...)")
        else:
            raise EqquantError(f"the program has {len(leaves)} outputs: give -o a .npz path")
    else:
        for i, arr in enumerate(leaves):
            flat = arr.reshape(-1).astype(np.float64)
            name = "output" if len(leaves) == 1 else f"output {i}"
            stats = (f"mean {flat.mean():.6g}, std {flat.std():.6g}, "
                     f"first {np.array2string(arr.reshape(-1)[:5], precision=5)}"
                     if flat.size else "empty")
            click.echo(f"{name} {arr.dtype}{list(arr.shape)}: {stats}")


def _say(file: Path, said: str, rows: list | None = None) -> None:
    """``run -v``: on stderr, which engine runs FILE, and what runs each op (the kernel
    plan's ``rows``, where it has one)."""
    from ..core.timing import plan_table
    click.echo(f"{file}: {said}", err=True)
    if rows:
        click.echo(plan_table(rows), err=True)


def _said(said: str) -> str:
    return f"; {said}" if said else ""


def _run_library(file: Path, params: Path | None, input_path: Path, engine: str,
                 verbose: bool = False, profile: bool = False, replan: bool = False,
                 optimize: bool = True):
    """FILE's output on the input, from its library: FILE itself (a folder `eqquant compile`
    wrote), or the one saved in the cache (``deploy.cache.open_program``; the executor where
    there is none)."""
    from ..ir.params import load_inputs
    if file.is_dir():
        if engine != "cpu" or params is not None or replan or not optimize:
            raise EqquantError(f"{file}: a saved library runs as it was saved (no --params, "
                               "--replan, --no-opt; --engine cpu)")
        from ..deploy.loader import Library
        library, model = Library(file), None
        said = f"runs on the library {file}"
    else:
        if not file.exists():
            raise EqquantError(f"{file}: no such file")
        from ..deploy.cache import open_program
        program = open_program(file, params, replan=replan, optimize=optimize)
        library = program.runner if program.engine == "library" else None
        model = None if library else program.runner
        said = (f"runs on its library ({library.folder})" if library
                else f"runs on the executor: {program.note or 'no library'}")
        said += _said(program.said)
    runner = library or model
    inputs = load_inputs(input_path, list(runner.inputs))
    ex = None
    if model is not None:
        ex = model.executor()
        if hasattr(ex, "for_inputs"):           # (sizes open: the executor of these inputs')
            ex = ex.for_inputs(model.named(inputs))
            said += f" ({_made_for(model.module, model.named(inputs))})"
    if verbose:
        _say(file, said, library.plan.get("ops") if library else ex.kernel_plan())
    out = runner.run(inputs)
    if profile and library:                     # each launch timed in C
        click.echo(library.profile(inputs), err=True)
    elif profile:                               # each of the executor's steps timed
        named = model.named(inputs)
        for _ in range(5):
            ex.run(named, profile=True)
        click.echo(ex.profile_table(), err=True)
    return out


def _made_for(mod, inputs) -> str:
    """The open sizes of ``mod`` at ``inputs``, as ``run -v`` says them."""
    from ..core.types import size_label
    from ..passes.sizes import input_sizes
    return "made for " + ", ".join(f"{size_label(k)}={v}" for k, v in
                                   input_sizes(mod.main, inputs).items())


def _output_leaves(out) -> list[np.ndarray]:
    """The tensors of a program's result, a tuple's in order (nested tuples flattened)."""
    leaves, stack = [], [out]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        elif isinstance(v, np.ndarray) or np.isscalar(v):
            leaves.append(np.asarray(v))
        else:
            raise EqquantError("the program's result is a function value, not tensors: "
                               "eqquant run needs a program that returns tensors")
    return leaves


@cli.command()
@click.argument("name", required=False)
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), show_default=True, help="Directory to write into.")
@click.option("--seed", default=0, show_default=True)
@click.option("--image-size", default=None, type=int,
              help="An image model's height and width (its own default: 224 for most).")
@click.option("--seq-len", default=None, type=int,
              help="A sequence model's length in tokens (bert_tiny's default: 128).")
@click.option("--list", "list_", is_flag=True, help="List the models.")
def zoo(name: str | None, out_dir: Path, seed: int, image_size: int | None,
        seq_len: int | None, list_: bool) -> None:
    """Write zoo model NAME (text IR, weights, a sample input) into a directory."""
    import inspect
    from ..zoo import ALIASES, MODELS, build, write
    if list_ or name is None:
        for key, fn in MODELS.items():
            click.echo(f"{key:14s} {(fn.__doc__ or '').strip().splitlines()[0]}"
                       if fn.__doc__ else key)
        return
    fn = MODELS.get(ALIASES.get(name, name))
    if fn is None:
        build(name)                  # (the error naming the models there are)
    takes = inspect.signature(fn).parameters
    kwargs = {"seed": seed}
    for option, key, value in (("--image-size", "image_size", image_size),
                               ("--seq-len", "seq", seq_len)):
        if value is not None:
            if key not in takes:
                raise EqquantError(f"zoo model {name} takes no {option}")
            kwargs[key] = value
    paths = write(build(name, **kwargs), out_dir)
    for kind, path in paths.items():
        click.echo(f"{kind:6s} {path}")


_UNCHECKED_RULES = click.option(
    "--unchecked-rules", is_flag=True,
    help="Use the rules without checking them first (every rule is checked with `rules check`'s "
         "sampler before use, the verdict kept in the cache; a rejected rule stops the "
         "command): the output says which rules went unchecked.")


@contextmanager
def _rules_checked(unchecked_rules: bool):
    """The block's rules checked before use, or (``--unchecked-rules``) not: then a list
    that fills, as the block ends, with the rules used without a verdict (to mark the
    output with, and warned of)."""
    from ..rules.trust import unchecked, used_unchecked
    said: list[str] = []
    if not unchecked_rules:
        yield said
        return
    with unchecked():
        try:
            yield said
        finally:
            said += used_unchecked()
    if said:
        click.echo(f"warning: {len(said)} rules used unchecked (--unchecked-rules): "
                   f"{', '.join(said[:5])}{' ...' if len(said) > 5 else ''}", err=True)


def _unchecked_note(said: list[str]) -> str:
    return (f"UNCHECKED RULES: made with --unchecked-rules; not checked: {', '.join(said)}"
            if said else "")


_WHY = click.option(
    "--why", "why", multiple=True, metavar="%N",
    help="Where the value %N of the program written came from: the rules that made it, in "
         "order (file:line:col), the alternatives extraction rejected there with their costs, "
         "its kernel. Repeatable.")


def _answer_why(result, labels) -> None:
    from ..errors import EqquantError
    for label in labels:
        try:
            click.echo(result.why(label))
        except EqquantError as e:
            _fail(str(e))


def _sizes_options(fn):
    """--batch and --size: the sizes a program with open sizes (?n) is priced at."""
    fn = click.option("--size", "size_specs", multiple=True, metavar="NAME=N",
                      help="Price the open size ?NAME at N (kernels and layouts are chosen "
                           "for it; the program still takes every size); repeatable.")(fn)
    return click.option("--batch", type=click.IntRange(min=1),
                        help="Price the open size on the inputs' leading axis (the batch) "
                             "at this: extraction chooses for serving that batch.")(fn)


def _priced_sizes(mod, batch, specs) -> dict[str, int] | None:
    """The sizes --batch and --size name, checked against the program's open sizes."""
    from ..passes.sizes import leading_size, open_sizes
    if batch is None and not specs:
        return None
    names = open_sizes(mod)
    sizes: dict[str, int] = {}
    if batch is not None:
        lead = leading_size(mod)
        if lead is None:
            raise EqquantError("--batch: the program's inputs have no open size on their "
                               "leading axis" + (f" (its open sizes: "
                                                 f"{', '.join('?' + n for n in names)}; "
                                                 f"--size NAME=N names one)" if names else
                                                 " (its shapes are fixed)"))
        sizes[lead] = batch
    for spec in specs:
        name, eq, value = spec.partition("=")
        name = name.strip().lstrip("?")
        if not eq or not value.strip().isdigit() or int(value) < 1:
            raise EqquantError(f"--size {spec}: expected NAME=N with N >= 1 (e.g. "
                               f"--size seq=128)")
        if name not in names:
            raise EqquantError(f"--size {spec}: the program has no open size ?{name} (its "
                               f"open sizes: {', '.join('?' + n for n in names) or 'none'})")
        sizes[name] = int(value)
    return sizes


def _opt_options(fn):
    """Options shared by ``opt`` and ``extract``."""
    opts = [
        click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
                     help="Weights (.npz); default: the .npz beside MODEL, if any."),
        click.option("--rules", "-r", "rules", multiple=True, default=("simplify", "bn_fold"),
                     show_default=True, help="Rule files or names of shipped rule sets; "
                     "repeat the option for several."),
        click.option("--schedule", "-s", help='Phases, e.g. "simplify; bn_fold*10; '
                     'simplify" (default: each rule set once, in order), or @FILE.'),
        click.option("--cost", default="auto", show_default=True,
                     type=click.Choice(["auto", "measured", "cpu", "nodes"]),
                     help="Cost model: measured (this machine's kernel times, timing what "
                     "the cache lacks), cpu (roofline), nodes; auto: measured from the "
                     "cache once this machine has one (eqquant profile), else cpu."),
        click.option("--extractor", default="greedy", show_default=True,
                     type=click.Choice(["greedy", "ilp", "best"])),
        click.option("--iterations", default=30, show_default=True,
                     help="Iteration limit per phase."),
        click.option("--node-limit", default=200_000, show_default=True,
                     help="E-node limit."),
        click.option("--time-limit", default=60.0, show_default=True,
                     help="Saturation time limit (seconds)."),
        _TARGET,
        click.option("--replan", is_flag=True, help="Forget the kernels MODEL names (a plan "
                     "made for another CPU or target) and plan them for this one."),
        _UNCHECKED_RULES,
        _WHY,
    ]
    for o in reversed(opts):
        fn = o(fn)
    return _sizes_options(fn)


def _optimize(model, params, rules, schedule, cost, extractor, iterations, node_limit,
              time_limit, replan, batch=None, size_specs=()):
    from ..egraph.engine import Limits
    from ..ir.loader import load_program, read_source
    from ..optimizer import optimize
    from ..rules.loader import load_rules
    from ..runtime.execution.measured_cost import resolve_cost
    from ..extract.cost import constant_bytes
    from ..ir.params import bind_params
    mod, values = load_program(model, params)
    if schedule and schedule.startswith("@"):
        schedule = read_source(schedule[1:])
    bound = bind_params(mod, values) if values else mod
    from ..runtime.lowering.plan import planned, unplanned
    if replan:
        bound = unplanned(bound)
    model = resolve_cost(cost).for_weights(constant_bytes(bound))
    from ..passes.sizes import is_symbolic
    if is_symbolic(bound):
        from ..extract.cost import at_sizes
        model = at_sizes(model, _priced_sizes(bound, batch, size_specs) or {})
    elif batch is not None or size_specs:
        raise EqquantError(f"{model}: --batch and --size price open sizes (?n); this "
                           "program's shapes are fixed")
    return planned(optimize(bound, None, [load_rules(r) for r in rules], schedule=schedule,
                            cost=model, extractor=extractor,
                            limits=Limits(iterations, node_limit, time_limit)), None, model)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@_opt_options
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the new program (.ir); its weights go to the .npz beside.")
def opt(model, params, rules, schedule, cost, extractor, iterations, node_limit, time_limit,
        replan, unchecked_rules, why, batch, size_specs, output):
    """Optimize MODEL: saturate with rules, extract the cheapest program, fold constants."""
    from ..ir.loader import refuse_overwriting_inputs, save_program
    refuse_overwriting_inputs(output, model, params)
    with _rules_checked(unchecked_rules) as said:
        result = _optimize(model, params, rules, schedule, cost, extractor, iterations,
                           node_limit, time_limit, replan, batch, size_specs)
    ir_path, npz = save_program(output, result.module, note=_unchecked_note(said))
    click.echo(f"wrote {ir_path} and {npz}: cost {result.before.total:.4g} -> "
               f"{result.after.total:.4g} ({result.model})")
    if result.model_summary:
        click.echo(result.model_summary)
    if not result.report.saturated:
        click.echo("LIMIT HIT: " + "; ".join(result.report.limits_hit), err=True)
    _answer_why(result, why)


@cli.command()
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@_opt_options
@click.option("--explain", is_flag=True, help="Cost table, rules that fired, e-graph size.")
def extract(model, params, rules, schedule, cost, extractor, iterations, node_limit,
            time_limit, replan, unchecked_rules, why, batch, size_specs, explain):
    """Print the cheapest program equivalent to MODEL under a cost model."""
    from ..ir.printer import print_module
    with _rules_checked(unchecked_rules) as said:
        result = _optimize(model, params, rules, schedule, cost, extractor, iterations,
                           node_limit, time_limit, replan, batch, size_specs)
    note = _unchecked_note(said)
    click.echo((f"// {note}\n" if note else "") + print_module(result.module), nl=False)
    if explain:
        click.echo("\n" + result.report.table(result.rule_locations))
        click.echo(result.explain())
    _answer_why(result, why)


@cli.command("quantize")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz) of a text-IR MODEL; default: the .npz beside it, if any.")
@click.option("--calib", "calib", required=True, type=click.Path(path_type=Path),
              help="Calibration set: an .npz of arrays keyed by input name (an .npy for a "
                   "model of one input), or a folder of them read one file at a time; each "
                   "array one sample, a stack of samples on a new leading axis, or a batch "
                   "on the input's own leading axis.")
@click.option("--mode", type=click.Choice(["kl_divergence", "minmax", "percentile",
                                          "global_scale", "dynamic"]),
              default="kl_divergence", show_default=True,
              help="How activations get their scales: a calibration method over --calib, or "
                   "dynamic: computed from each input as it runs, for the inputs of "
                   "convolutions, dense layers and attention's products (as ONNX Runtime's "
                   "quantize_dynamic; --calib then only measures the report's accuracy).")
@click.option("--weight-scale", type=click.Choice(["max", "power2"]), default="max",
              show_default=True)
@click.option("--per-channel", is_flag=True, help="One weight scale per output channel.")
@click.option("--weight-bits", type=click.Choice(["8", "7"]), default="8", show_default=True,
              help="7: weights within +-63, so that on a CPU without VNNI every convolution "
                   "runs on the AVX2 byte kernel (x86.avx2.w7; ONNX Runtime's reduce_range), "
                   "for some accuracy.")
@click.option("--activations", type=click.Choice(["uint8", "int8"]), default="uint8",
              show_default=True, help="uint8 (asymmetric, as ONNX Runtime) or int8 "
                                      "(symmetric, as TVM's realize).")
@click.option("--skip", multiple=True, help="A value not to calibrate (e.g. %3); repeatable.")
@click.option("--layouts", type=click.Choice(["cpu", "nchw"]), default="cpu", show_default=True,
              help="cpu: the layouts layout.rules chose for eqquant's kernels (channel-last "
                   "convolutions); nchw: every value NCHW (the interchange form, as ONNX "
                   "takes it).")
@click.option("--cost", default="auto", show_default=True,
              type=click.Choice(["auto", "measured", "cpu"]),
              help="Cost model: measured (this machine's kernel times, timing what the cache "
                   "lacks), cpu (roofline); auto: measured from the cache once this machine "
                   "has one (eqquant profile), else cpu.")
@click.option("--min-sqnr", type=float, help="Mixed precision: the cheapest program whose "
              "output SQNR (dB, on the calibration set) is at least this.")
@click.option("--budget-ms", type=float, help="Mixed precision: the most accurate program "
              "whose predicted latency is at most this.")
@click.option("--keep-fp32", multiple=True, help="A value to leave in float (e.g. %3); "
              "repeatable.")
@click.option("--metric", help="Mixed precision: the cheapest program whose METRIC over "
              "--eval-data is within --max-drop of the float program's (top1, top5, "
              "neg_mse).")
@click.option("--eval-data", type=click.Path(exists=True, path_type=Path),
              help="The labelled set --metric is measured on (as `eqquant eval` takes it).")
@click.option("--max-drop", type=float, help="The largest drop of --metric allowed.")
@click.option("--int8-only", is_flag=True, help="Every calibrated value quantized (the "
              "default when no accuracy budget is given; with --keep-fp32, all but those).")
@click.option("--pareto", is_flag=True, help="Also print latency against SQNR for a range of "
              "budgets (one saturation), and write them to OUT.pareto.json (eqquant plot "
              "pareto draws them).")
@click.option("--explain", is_flag=True, help="Print the program's cost per op: the cost "
              "model's prediction beside the executor's measured time; and its kernel plan.")
@_TARGET
@_UNCHECKED_RULES
@_WHY
@_sizes_options
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The int8 program (.ir); weights go to the .npz and the calibration "
                   "table to the .calib.json beside it.")
def quantize_cmd(model, params, calib, mode, weight_scale, per_channel, weight_bits,
                 activations, skip,
                 layouts, cost, min_sqnr, budget_ms, keep_fp32, metric, eval_data, max_drop,
                 int8_only, pareto, explain, unchecked_rules, why, batch, size_specs, output):
    """Quantize MODEL (text IR or .onnx) to int8: calibrate, apply the quantize rules,
    report accuracy."""
    import json

    from ..api import Report, calibration_samples, load
    from ..ir.loader import refuse_overwriting_inputs, save_program
    from ..ir.outputs import Outputs
    from ..quant.flow import quantize
    refuse_overwriting_inputs(output, model, params, calib)
    for extra in (".calib.json", ".report.json", ".pareto.json"):
        refuse_overwriting_inputs(output.with_suffix(extra), model, params, calib)
    if int8_only and (min_sqnr is not None or budget_ms is not None or metric is not None):
        raise EqquantError("--int8-only takes no accuracy or latency budget "
                           "(--min-sqnr, --budget-ms, --metric)")
    m = load(model, params)
    sizes = _priced_sizes(m.module, batch, size_specs)
    samples = calibration_samples(calib, m)
    scored = None
    if (metric, eval_data, max_drop).count(None) not in (0, 3):
        raise EqquantError("--metric, --eval-data and --max-drop go together")
    if metric is not None:
        from ..metrics import over
        scored = over(eval_data, m.inputs, metric)
    with _rules_checked(unchecked_rules) as said, \
            click.progressbar(iter(samples), length=samples.total, file=sys.stderr,
                              label="calibrating" if mode != "dynamic" else
                              "quantizing (dynamic: no calibration)") as stream:
        result = quantize(m.module, m.params, stream, mode, weight_scale, per_channel,
                          dtype=activations, skip=list(skip), cost=cost,
                          layouts=layouts == "cpu",
                          min_sqnr=min_sqnr, budget_ms=budget_ms, keep_fp32=list(keep_fp32),
                          metric=scored, max_drop=max_drop, pareto=pareto, sizes=sizes,
                          weight_bits=int(weight_bits))
    table_path = output.with_suffix(".calib.json")
    report_path = output.with_suffix(".report.json")
    report = Report.from_result(result).to_json()
    if said:
        report["unchecked_rules"] = list(said)
    text = json.dumps(report, indent=1)
    points = [dict(budget=r.target, floats=r.floats, cost_ms=r.cost * 1e3,
                   predicted_sqnr=r.predicted, sqnr=r.measured) for r in result.pareto]
    with Outputs() as out:      # the files appear together, or none does
        ir_path, npz = save_program(output, result.runnable, outputs=out,
                                    note=_unchecked_note(said))
        out.add(table_path, result.table.write)
        out.add(report_path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        if pareto:
            out.add(output.with_suffix(".pareto.json"), lambda tmp: Path(tmp).write_text(
                json.dumps(points, indent=1), encoding="utf-8"))
    click.echo(result.report())
    if explain:
        from ..runtime.execution.measured_cost import cost_table, resolve_cost
        click.echo(cost_table(result.runnable, resolve_cost(cost), next(iter(samples))))
        if result.layouts is not None:
            click.echo(result.layouts.kernel_table)
    click.echo(f"wrote {ir_path}, {npz}, {table_path} and {report_path} "
               f"(eqquant plot sqnr {report_path} -o sqnr.png draws it)")
    _answer_why(result, why)


@cli.command("eval")
@click.argument("model", type=click.Path(exists=True, path_type=Path))
@click.argument("data", type=click.Path(exists=True, path_type=Path))
@click.option("--metric", default="top1", show_default=True,
              help="top1, top5 (the label a class index), or neg_mse (the label a reference "
                   "output).")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local",
              show_default=True, help="ray: the samples shared among Ray workers (the ray "
                                      "extra), each opening MODEL once; the same result.")
@click.option("--workers", type=int, help="Ray workers (default: the cluster's CPUs).")
def eval_cmd(model, data, metric, engine, workers):
    """Measure MODEL (text IR, .onnx, or a library folder `eqquant compile` wrote, opened as
    `eqquant run` opens it) over the labelled set DATA: an .npz (inputs by name and a
    `label` array, stacked on a leading sample axis) or a folder of them, read one file at a
    time."""
    from ..evaluation import evaluate
    total = [0]

    def progress(n):
        total[0] = n
        if n % 64 == 0:
            click.echo(f"\revaluated {n} samples", nl=False, err=True)
    result = evaluate(model, data, metric, engine=engine, workers=workers, progress=progress)
    if total[0] >= 64:
        click.echo("", err=True)
    click.echo(str(result))


@cli.command("profile")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz) of a text-IR MODEL; default: the .npz beside it, if any.")
@click.option("--calib", type=click.Path(path_type=Path),
              help="Calibration set (as for quantize); default: 4 random inputs (the "
                   "kernels' times depend on shapes and types, not on values).")
@click.option("--per-channel", is_flag=True, help="One weight scale per output channel.")
@click.option("--activations", type=click.Choice(["uint8", "int8"]), default="uint8",
              show_default=True)
def profile_cmd(model, params, calib, per_channel, activations):
    """Time on this machine every kernel instance the fp32, int8 and layout e-graphs of MODEL
    hold, into the kernel-time cache that the measured cost model reads (and that quantize
    and opt then use by default)."""
    from ..api import calibration_samples, load
    from ..runtime.execution.measured_cost import MeasuredCost
    from ..quant.flow import quantize
    m = load(model, params)
    if calib is not None:
        samples = calibration_samples(calib, m)
    else:
        rng = np.random.default_rng(0)
        samples = [{p.name: rng.standard_normal(p.type.shape).astype(p.type.dtype)
                    for p in m.module.main.params} for _ in range(4)]
    count = [0]

    def progress(key):
        count[0] += 1
        click.echo(f"\rtimed {count[0]} kernel instances", nl=False, err=True)
    cost = MeasuredCost(progress=progress)
    try:
        quantize(m.module, m.params, samples, "minmax", per_channel=per_channel,
                 dtype=activations, cost=cost)
    finally:
        cost.flush()
        if count[0]:
            click.echo("", err=True)
    click.echo(cost.summary().removeprefix("cost model: "))
    for key, why in sorted(cost.estimated.items()):
        click.echo(f"  {key}: {why}")


def _parse_shapes(specs) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            name = ""
        if not name or any(d <= 0 for d in shapes.get(name, (0,))):
            raise click.BadParameter(f"'{spec}' is not NAME=D1,D2,... with positive D",
                                     param_hint="--shape")
    return shapes


@cli.command("import")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", "out_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the text IR (MODEL's stem + .ir) and its weights (.npz).")
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D1,D2,...",
              help="Fix an input's shape (for symbolic dimensions); repeatable.")
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="The constants of a TVMScript MODEL (.npz keyed "
                   "`metadata[\"relax.expr.Constant\"][i]`); default: the .npz beside it.")
def import_cmd(model, out_dir, shapes, params):
    """Import an ONNX model, or a TVMScript module (.py, .tvmscript), as text IR + params."""
    from ..interop.onnx_import import import_onnx
    from ..ir.loader import is_tvmscript, load_program, refuse_overwriting_inputs, save_program
    from ..ir.params import constant_params
    from ..core.nodes import Call, post_order
    refuse_overwriting_inputs(out_dir / (model.stem + ".ir"), model, params)
    if is_tvmscript(model):
        if shapes:
            _fail("--shape is for ONNX models (a TVMScript module gives its shapes)")
        mod, _ = load_program(model, params)
        params, notes = constant_params(mod), []
    else:
        if params is not None:
            _fail("--params is for TVMScript modules (an ONNX model holds its weights)")
        mod, params, notes = import_onnx(model, _parse_shapes(shapes))
    ir_path, npz = save_program(out_dir / (model.stem + ".ir"), mod, params)
    calls = sum(isinstance(n, Call) for n in post_order(mod.main.body))
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"wrote {ir_path} ({calls} ops) and {npz} ({len(params)} params)")


@cli.command("export")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz); default: the .npz beside MODEL, if any.")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The .onnx file to write.")
def export_cmd(model, params, output):
    """Export MODEL to ONNX: fp32 ops as they are, an int8 program as QDQ."""
    from ..interop.onnx_export import save_onnx
    from ..ir.loader import load_program
    from ..ir.params import bind_params
    mod, values = load_program(model, params)
    kind = save_onnx(bind_params(mod, values), output)
    click.echo(f"wrote {output} ({kind})")


@cli.command("compile")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz); default: the .npz beside MODEL, if any.")
@click.option("--out", "-o", "out_dir", required=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="The folder to write the library into (replaced whole).")
@_TARGET
@click.option("--no-opt", is_flag=True, help="Compile MODEL as it is (by default it is "
              "optimized for the CPU first, as `eqquant run` runs it).")
@click.option("--batched", type=click.IntRange(min=1), metavar="N",
              help="A program whose batch is open: its launches made at batch N too, a second "
              "table (a batch of n runs as n // N runs of N, then one sample at a time); 1: "
              "none; default: 8 (deploy/build.py's BATCHED).")
def compile_cmd(model, params, out_dir, no_opt, batched):
    """Compile MODEL ahead of time: its kernels linked into one library with its weights,
    which `eqquant run OUT -x ...` runs without Numba (on this machine's CPU, with as many
    threads as now)."""
    from ..deploy.build import BATCHED, build, keeping_objects
    from ..deploy.cache import prepare
    from ..deploy.check import Checker
    from ..deploy.loader import Library
    batched = BATCHED if batched is None else batched
    if not model.exists():
        raise EqquantError(f"{model}: no such file")
    m, said, _ = prepare(model, params, optimize=not no_opt)
    if said:
        click.echo(said)
    with keeping_objects():
        ex = m.executor()
    with Checker() as checker:              # (in a child process: a crash is its only)
        build(ex, out_dir, aliases=m.aliases, batched=batched)
        reason = checker.check(ex, out_dir)
    if reason is not None:
        raise EqquantError(f"{out_dir}: {reason} (the library is kept for a bug report)")
    library = Library(out_dir)
    size = sum(f.stat().st_size for f in out_dir.iterdir())
    click.echo(f"wrote {out_dir}: {len(library.plan['launches'])} launches of "
               f"{len(library.plan['functions'])} C functions, {size / 1e6:.1f} MB, "
               f"{library.threads} threads"
               + (f"; its batch ?{library.batch} open: any batch runs, in runs of "
                  f"{library.batched[0]} samples (a table of launches of its own) and of one"
                  if library.batched else f"; its batch ?{library.batch} open: any batch "
                  "runs, one sample at a time" if library.batch else ""))


@cli.group()
def plot() -> None:
    """Draw pictures: per-layer SQNR charts and program graphs."""


def _read_json(path: Path, what: str, read):
    """``read`` of the JSON in ``path``; a located error when it is not ``what``."""
    import json

    from ..ir.loader import read_source
    try:
        return read(json.loads(read_source(path)))
    except (ValueError, KeyError, TypeError) as e:
        raise EqquantError(f"{path}: not {what} ({e})") from None


# where a chart goes (every plot command but the graph's)
_CHART_OUTPUT = click.option("--output", "-o", required=True,
                             type=click.Path(dir_okay=False, path_type=Path),
                             help="The chart: .png, .svg or .pdf.")


@plot.command("sqnr")
@click.argument("report", type=click.Path(dir_okay=False, path_type=Path))
@_CHART_OUTPUT
def plot_sqnr(report, output):
    """Bar chart of REPORT (the .report.json eqquant quantize writes)."""
    from ..api import Report
    _read_json(report, "a report written by eqquant quantize", Report.from_json).plot(output)
    click.echo(f"wrote {output}")


@plot.command("pareto")
@click.argument("points", type=click.Path(dir_okay=False, path_type=Path))
@_CHART_OUTPUT
def plot_pareto(points, output):
    """Latency against SQNR of POINTS (the .pareto.json eqquant quantize --pareto writes)."""
    from ..viz.pareto import pareto_chart

    def check(data):
        if not isinstance(data, list) or not all({"sqnr", "cost_ms", "floats"} <= set(p)
                                                  for p in data):
            raise ValueError("a list of points with sqnr, cost_ms and floats")
        return data
    pareto_chart(_read_json(points, "points written by eqquant quantize --pareto", check),
                 output)
    click.echo(f"wrote {output}")


@plot.command("graph")
@click.argument("model", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help=".dot, or .svg/.png/.pdf rendered by Graphviz (a .dot without it).")
def plot_graph(model, output):
    """Draw MODEL (text IR or .onnx) as a graph."""
    from ..api import load
    from ..viz.graph import to_dot, write_graph
    m = load(model)
    written = write_graph(to_dot(m.module, m.name), output)
    click.echo(f"wrote {written}" + ("" if written == output else
                                     " (Graphviz's dot is not installed: DOT text instead)"))


@cli.group()
def rules() -> None:
    """Read and check rule files."""


@rules.command("show")
@click.argument("files", nargs=-1, required=True)
@click.option("--egglog", is_flag=True, help="Show the egglog the rules compile to.")
def rules_show(files, egglog):
    """Print FILES' rules as loaded (or compiled, with --egglog)."""
    from ..rules.ast import format_rule
    from ..rules.compile import compile_ruleset
    from ..rules.loader import load_rules
    for f in files:
        rs = load_rules(f)
        if egglog:
            click.echo(compile_ruleset(rs).text)
        else:
            click.echo(f"ruleset {rs.name}  ({rs.file})\n")
            for r in rs.rules:
                click.echo(format_rule(r) + f"\n    # at {r.loc}\n")


@rules.command("check")
@click.argument("files", nargs=-1, required=True)
@click.option("--trials", default=5, show_default=True, help="Instances per rule.")
@click.option("--seed", default=0, show_default=True)
@click.option("--again", is_flag=True,
              help="Check every rule, also those whose pass this eqquant kept in the cache.")
def rules_check(files, trials, seed, again):
    """Check that every rule in FILES is an identity, on random well-typed tensors (the
    rules shared among helper processes where there are several CPUs). At the default
    trials and seed, the draw every rule is checked with before use, a pass kept in the
    cache by this eqquant is reported as kept, marked [kept]."""
    from ..rules.check import CheckReport, RuleCheck
    from ..rules.loader import load_rules
    from ..rules.trust import checked
    failed = 0
    for f in files:
        rules = load_rules(f).rules
        report = CheckReport([RuleCheck(rule, variant, ok, message, kept=kept)
                              for rule, (results, kept) in zip(
                                  rules, checked(rules, trials, seed, again))
                              for variant, ok, message in results])
        click.echo(report.format())
        failed += sum(not r.ok for r in report.results)
    if failed:
        sys.exit(1)


@rules.command("explain")
@click.argument("file")
@click.option("--on", "model", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The program (.ir, .py TVMScript or .onnx) to match the rules on.")
@click.option("--params", "-p", type=click.Path(dir_okay=False, path_type=Path),
              help="Weights (.npz); default: the .npz beside MODEL, if any.")
@click.option("--rule", help="Only this rule of FILE.")
@click.option("--schedule", "-s", help="The shipped rule sets to saturate with before FILE's "
              "(default: the float pipeline's, \"simplify; bn_fold; simplify; fusion\").")
@click.option("--limit", default=5, show_default=True,
              help="Places listed per rule, for matches and for near misses.")
def rules_explain(file, model, params, rule, schedule, limit):
    """Where FILE's rules match on MODEL's saturated e-graph, and why they miss where their
    head op is: the sub-pattern, attribute or guard that failed, with locations in FILE and
    in MODEL."""
    from ..explain import explain_rules
    from ..ir.loader import load_program
    mod, values = load_program(model, params)
    click.echo(explain_rules(mod, file, values, rule, schedule).text(limit))


@cli.command()
@click.option("--model", default="resnet18_stem", show_default=True, help="Zoo model to use.")
@click.option("--out", "-o", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("eqquant-demo"), show_default=True)
def demo(model: str, out_dir: Path) -> None:
    """The main job on a bundled model: every pipeline stage that exists, with a report."""
    from ..pipeline import demo as run_demo
    run_demo(model, out_dir, echo=click.echo)


def main(argv: list[str] | None = None) -> None:
    from ..runtime.target import chosen, use
    before = chosen()      # (--target is the command's: a caller in-process keeps its own)
    try:
        try:
            cli.main(args=argv, prog_name="eqquant", standalone_mode=False)
        finally:
            use(before)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code in (1, 2) else e.exit_code)
    except click.Abort:
        _fail("aborted", 130)
    except EqquantError as e:
        _fail(e.format())
    except RecursionError:
        _fail("eqquant: error: the program is nested too deeply", 2)
    except MemoryError:
        _fail("eqquant: error: out of memory: what the command built outgrew this machine (an "
              "e-graph: lower --node-limit or --iterations; a tensor: a smaller shape)", 2)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    except Exception as e:  # noqa: BLE001 - the CLI never shows a raw traceback
        if os.environ.get("EQQUANT_DEBUG"):
            traceback.print_exc()
        _fail(f"eqquant: internal error: {type(e).__name__}: {e}\n"
              "(this is a bug; EQQUANT_DEBUG=1 shows the traceback)", 3)
    sys.exit(0)


if __name__ == "__main__":
    main()
