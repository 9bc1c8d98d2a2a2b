"""eqquant: fp32 inference graphs to int8 programs by equality saturation.

The package's folders follow the pipeline, bottom layer first: ``core`` (IR types and
nodes), ``ops`` (the op registry), ``ir`` (text IR, interpreter), ``egraph`` (loading programs
into egglog, analyses, saturating), ``rules`` (the rules language), ``extract`` (cost models,
extraction), ``runtime`` (kernels, executor), ``quant`` (the int8 flow), ``interop`` (ONNX),
``cli`` (the command line); ``optimizer.py`` strings saturation, extraction and folding
together and ``pipeline.py`` runs the stages for ``eqquant demo``. A package imports only
the ones before it (``tests/test_import_graph.py``).

The Python API (``eqquant/api.py``)::

    import eqquant
    model = eqquant.load("resnet18.onnx")        # or "model.ir" (+ model.npz), or a Module
    y = model.run(x)                             # the Numba executor; x: array or dict
    q = eqquant.quantize(model, "calib.npz", mode="kl_divergence", per_channel=True)
    print(q.report())                            # SQNR per layer and at the output
    q.save("out/"); q.export_onnx("model.int8.onnx")

and the pieces underneath::

    mod, params = eqquant.load_program("model.ir")          # params from model.npz
    result = eqquant.optimize(mod, params, rules=["simplify", "bn_fold"], cost="cpu")
    print(result.explain())
    eqquant.save_program("out.ir", result.module)
    y = eqquant.run(result.module, {"data": x})             # the reference interpreter
"""
__version__ = "0.1.0"

_API = {
    "parse": ("eqquant.ir.parser", "parse"),
    "print_module": ("eqquant.ir.printer", "print_module"),
    "check_module": ("eqquant.ir.typecheck", "check_module"),
    "load_program": ("eqquant.ir.loader", "load_program"),
    "save_program": ("eqquant.ir.loader", "save_program"),
    "run": ("eqquant.ir.interp", "run"),
    "optimize": ("eqquant.optimizer", "optimize"),
    "load": ("eqquant.api", "load"),
    "quantize": ("eqquant.api", "quantize"),
    "Model": ("eqquant.api", "Model"),
    "load_rules": ("eqquant.rules.loader", "load_rules"),
    "check_rules": ("eqquant.rules.check", "check_ruleset"),
}


def __getattr__(name: str):
    """The API is imported on first use, so ``import eqquant`` stays light."""
    if name in _API:
        import importlib
        module, attr = _API[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'eqquant' has no attribute '{name}'")


__all__ = list(_API)
