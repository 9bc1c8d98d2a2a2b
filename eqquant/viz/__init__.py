"""Pictures: per-layer SQNR as a bar chart (``sqnr.py``, matplotlib from the ``plot`` extra)
and programs as Graphviz graphs (``graph.py``, DOT text; rendered when ``dot`` is installed)."""
