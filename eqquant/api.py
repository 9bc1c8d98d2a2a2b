"""The one-call Python API: a model object over the whole pipeline.

    import eqquant
    model = eqquant.load("resnet18.onnx")            # or "model.ir" (params beside), or a Module
    y = model.run(x)                                 # an array, or a dict by input name
    q = eqquant.quantize(model, "calib.npz", mode="kl_divergence", per_channel=True)
    print(q.report())                                # SQNR per layer and at the output
    q.report().plot("sqnr.png")                      # the bar chart (needs eqquant[plot])
    q.save("out/")                                   # out/resnet18.ir, .npz, .calib.json
    q.export_onnx("resnet18.int8.onnx")              # QDQ, for ONNX Runtime
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import EqquantError
from .core.nodes import Module


@dataclass
class Report:
    """A quantized model's accuracy against its fp32 original: SQNR per layer and at the
    output. ``str()`` is the table; in a notebook it shows as the bar chart."""

    text: str
    layers: list[tuple[str, float]]
    output: dict[str, float]
    mode: str
    activations: str
    warnings: list[str] = field(default_factory=list)   # what makes the accuracy suspect
    kept_float: list[str] = field(default_factory=list)  # values left float, and why

    def __str__(self) -> str:
        return self.text

    def to_json(self) -> dict:
        return {"mode": self.mode, "activations": self.activations,
                "layers": [[n, v] for n, v in self.layers], "output": self.output,
                "warnings": list(self.warnings), "kept_float": list(self.kept_float)}

    @classmethod
    def from_result(cls, q) -> "Report":
        """From a :class:`~eqquant.quant.flow.QuantizeResult`."""
        return cls(q.report(), list(q.layers), dict(q.output), q.table.mode, q.dtype,
                   q.warnings(), list(q.kept_float))

    @classmethod
    def from_json(cls, data: Mapping, text: str = "") -> "Report":
        return cls(text, [(str(n), float(v)) for n, v in data["layers"]], dict(data["output"]),
                   str(data.get("mode", "")), str(data.get("activations", "")),
                   [str(w) for w in data.get("warnings", [])],
                   [str(w) for w in data.get("kept_float", [])])

    def plot(self, path: str | Path | None = None):
        """Draw SQNR per layer as a bar chart; write it to ``path`` (.png/.svg/.pdf) if given.
        Returns the matplotlib figure."""
        from .viz.sqnr import sqnr_chart
        return sqnr_chart(self, path)

    def _repr_png_(self):
        try:
            import io
            fig = self.plot()
        except EqquantError:      # matplotlib is not installed: the text shows instead
            return None
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        return buf.getvalue()


@dataclass
class Model:
    """A program with its weights; ``run`` compiles it for the Numba executor once."""

    module: Module
    params: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "model"
    notes: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)   # e.g. ONNX "input.1" -> "input_1"
    quantized: Any = None            # the QuantizeResult when this model came from quantize()
    _executor: Any = field(default=None, repr=False)

    @property
    def inputs(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Input name -> (shape, dtype), for the inputs the params do not give; a size known
        only at run time is a ``Dim`` (``?batch``: ``run`` takes any)."""
        return {p.name: (p.type.shape, p.type.dtype) for p in self.module.main.params
                if p.name not in self.params}

    def _bound(self) -> Module:
        from .ir.params import bind_params
        return bind_params(self.module, self.params) if self.params else self.module

    def named(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """``inputs`` keyed by the program's input names (an imported model also takes the
        names its ONNX file used)."""
        return {self.aliases.get(k, k): v for k, v in inputs.items()}

    def executor(self):
        """The Numba executor of this program with its weights, made once."""
        if self._executor is None:
            from .runtime.execution.sized import executor_for
            self._executor = executor_for(self._bound())
        return self._executor

    def run(self, x: Any):
        """Outputs for one input: an array (a one-input model) or a dict by input name."""
        self.executor()
        if not isinstance(x, Mapping):
            names = list(self.inputs)
            if len(names) != 1:
                raise EqquantError(f"{self.name} has {len(names)} inputs ({', '.join(names)});"
                                   " give a dict by input name")
            x = {names[0]: x}
        return self._executor.run(self.named(x))

    def why(self, label: str) -> str:
        """Where the value ``label`` (``"%12"``, as ``text()`` names it) came from: the rules
        that made it, in order, each with its file:line:col; the alternatives each extraction
        rejected there, with their costs; the kernel chosen for it."""
        from .extract.provenance import why
        if self.quantized is not None:
            return self.quantized.why(label)
        return why(self.module, label)

    def text(self, types: bool = False) -> str:
        """The program as text IR (``types``: every value's type in a comment)."""
        from .ir.printer import print_module
        return print_module(self.module, show_types=types)

    def show(self, types: bool = True) -> None:
        """Print the program with its types, as TVM's ``mod.show()`` does."""
        print(self.text(types), end="")

    def __str__(self) -> str:
        return self.text()

    def save(self, directory: str | Path) -> Path:
        """Write ``directory/<name>.ir`` and its ``.npz`` (and the calibration table and the
        report for a quantized model); returns the ``.ir`` path."""
        from .ir.loader import save_program
        from .ir.outputs import Outputs
        d = Path(directory)
        with Outputs() as out:          # all of them, or none
            path, _ = save_program(d / f"{self.name}.ir", self.module, self.params,
                                   outputs=out)
            if self.quantized is not None:
                import json
                text = json.dumps(self.report().to_json(), indent=1)
                out.add(path.with_suffix(".calib.json"), self.quantized.table.write)
                out.add(path.with_suffix(".report.json"),
                        lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
        return path

    def export_onnx(self, path: str | Path, activations: str = "uint8") -> Path:
        """ONNX (QDQ for a quantized model). A quantized model exports its interchange
        program: the same integers with every value NCHW, as ONNX's Conv and pools take them
        (``module`` holds the layouts chosen for eqquant's kernels)."""
        from .interop.onnx_export import save_onnx
        if self.quantized is not None:
            save_onnx(self.quantized.module, path, activations)
        else:
            save_onnx(self._bound(), path, activations)
        return Path(path)

    def report(self) -> Report:
        if self.quantized is None:
            raise EqquantError(f"{self.name} is not a quantized model: quantize it first "
                               "(eqquant.quantize(model, calibration_data))")
        return Report.from_result(self.quantized)

    def graph(self, path: str | Path | None = None) -> str:
        """The program as a Graphviz DOT graph (integer ops shaded); rendered to ``path``'s
        format (.svg/.png/.pdf) when Graphviz's ``dot`` is installed, else written as DOT."""
        from .viz.graph import to_dot, write_graph
        dot = to_dot(self.module, self.name)
        if path is not None:
            write_graph(dot, path)
        return dot


def load(source: Any, params: str | Path | Mapping | None = None,
         shapes: Mapping[str, tuple[int, ...]] | None = None) -> Model:
    """A Model from an ONNX file, a text-IR file (params from ``params`` or the ``.npz``
    beside it), a Module (with ``params``), a ``(module, params)`` pair, or a Model. An ONNX
    file's symbolic dimensions stay open (``?batch``) unless ``shapes`` (input name -> shape)
    fixes them."""
    if isinstance(source, Model):
        return source
    if isinstance(source, tuple) and len(source) == 2 and isinstance(source[0], Module):
        return Model(source[0], dict(source[1] or {}))
    if isinstance(source, Module):
        if params is not None and not isinstance(params, Mapping):
            from .ir.params import load_params
            params = load_params(params)
        return Model(source, dict(params or {}))
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix == ".onnx":
            from .interop.onnx_import import run_importer
            mod, values, im = run_importer(path, shapes)
            return Model(mod, values, path.stem, im.notes, dict(im.input_names))
        from .ir.loader import load_program
        if isinstance(params, Mapping):
            mod, _ = load_program(path, find_params=False)
            return Model(mod, dict(params), path.stem)
        mod, values = load_program(path, params)
        return Model(mod, values, path.stem)
    raise EqquantError(f"eqquant.load takes a path (.onnx or text IR), a Module or a Model, "
                       f"not {type(source).__name__}")


def calibration_samples(data: Any, model: Model):
    """Calibration data as a stream of input dicts, one sample each
    (:class:`eqquant.datasets.Samples`): a dict of arrays, an array, an iterable of them (a
    generator, a DataLoader), an ``.npz``/``.npy`` path or a folder of them; each array one
    sample, a stack of samples, or a batch of them on the input's leading axis."""
    from .datasets import Samples
    return Samples(data, model.inputs, model.aliases)


def quantize(model: Any, calibration_data: Any, mode: str = "kl_divergence",
             weight_scale: str = "max", per_channel: bool = False,
             activations: str = "uint8", skip: Iterable[str] = (),
             progress: bool = False, cost: str = "auto", min_sqnr: float | None = None,
             budget_ms: float | None = None, keep_fp32: Iterable[str] = (),
             metric=None, max_drop: float | None = None, eval_data: Any = None,
             engine: str = "local", sizes: Mapping[str, int] | None = None,
             weight_bits: int = 8) -> Model:
    """The int8 model of ``model`` (anything :func:`load` takes), calibrated on
    ``calibration_data`` (see :func:`calibration_samples`); ``.report()`` gives its accuracy.
    ``mode``: kl_divergence, minmax, percentile, global_scale, or dynamic (nothing
    calibrated: the compute ops' inputs get their scales from each input at run time; the
    data then only measures the report).

    Mixed precision: ``min_sqnr`` (dB at the output), ``budget_ms`` (the most accurate program
    within that predicted latency), ``keep_fp32`` (values to leave in float, e.g. ``"%3"``),
    or ``metric`` (a function of ``run(inputs) -> output``, higher is better; or, with
    ``eval_data``, a labelled set as :func:`evaluate` takes, a metric name or a function of
    (output, label) averaged over it) with ``max_drop``: which values are quantized is then
    chosen by extraction. ``engine="ray"``: calibration runs on Ray workers (the ``ray``
    extra), with the table the local run gives. ``sizes``: for a model with sizes known only
    at run time (``?batch``), the sizes its kernels and layouts are chosen for (name -> size;
    by default the first calibration sample's); the program still takes every size.
    ``weight_bits=7``: weights within +-63, so that on a CPU without VNNI every convolution
    runs on the AVX2 byte kernel (as ONNX Runtime's ``reduce_range``), for some accuracy."""
    from .quant.flow import quantize as run_flow
    m = load(model)
    samples = calibration_samples(calibration_data, m)
    if eval_data is not None:
        if metric is None:
            raise EqquantError("eval_data is for a metric (metric='top1', ...)")
        from .metrics import over
        metric = over(eval_data, m.inputs, metric)
    import contextlib
    import sys

    import click
    bar = click.progressbar(iter(samples), length=samples.total, label="calibrating",
                            file=sys.stderr) if progress else contextlib.nullcontext(samples)
    with bar as stream:
        result = run_flow(m.module, m.params, stream, mode, weight_scale, per_channel,
                          dtype=activations, skip=list(skip), cost=cost, engine=engine,
                          min_sqnr=min_sqnr, budget_ms=budget_ms, keep_fp32=list(keep_fp32),
                          metric=metric, max_drop=max_drop, sizes=sizes,
                          weight_bits=weight_bits)
    # what runs and is saved: the program with its layouts chosen for the CPU kernels
    return Model(result.runnable, {}, f"{m.name}.int8", list(m.notes), dict(m.aliases),
                 quantized=result)
