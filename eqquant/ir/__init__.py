"""The text IR: parser, printer, type checker, params, outputs and the reference interpreter
(the types and nodes it reads and writes are in ``eqquant.core``)."""
from . import printer  # noqa: F401  (gives core.nodes.Module its text form)
