"""eqquant: fp32 inference graphs to int8 programs by equality saturation.

The package's folders follow the pipeline: ``ir`` (text IR, types, interpreter), ``ops`` (the
op registry), ``zoo`` (models), ``cli`` (the command line); ``pipeline.py`` strings the stages
together for ``eqquant demo``.
"""
__version__ = "0.1.0"
