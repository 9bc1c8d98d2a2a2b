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
    p = eqquant.open_program("out/model.int8.ir")   # as `eqquant run` runs it: from its
    y = p.run(x)                                     # library, saved at its first run

and the pieces underneath::

    mod, params = eqquant.load_program("model.ir")          # params from model.npz
    result = eqquant.optimize(mod, params, rules=["simplify", "bn_fold"], cost="cpu")
    print(result.explain())
    eqquant.save_program("out.ir", result.module)
    y = eqquant.run(result.module, {"data": x})             # the reference interpreter
"""
__version__ = "0.1.0"

# the API, imported on first use: name, then module[:attribute] (the attribute is the name
# unless given)
_API_TABLE = """
parse           eqquant.ir.parser
print_module    eqquant.ir.printer
check_module    eqquant.ir.typecheck
load_program    eqquant.ir.loader
save_program    eqquant.ir.loader
run             eqquant.ir.interp
optimize        eqquant.optimizer
load            eqquant.api
quantize        eqquant.api
Model           eqquant.api
open_program    eqquant.deploy.cache
evaluate        eqquant.evaluation
load_rules      eqquant.rules.loader
check_rules     eqquant.rules.check:check_ruleset
"""
_API = {}
for _name, _where in (line.split() for line in _API_TABLE.strip().splitlines()):
    _module, _, _attr = _where.partition(":")
    _API[_name] = (_module, _attr or _name)
del _name, _where, _module, _attr


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
