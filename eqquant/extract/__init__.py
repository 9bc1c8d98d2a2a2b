"""Extraction: the serialized e-graph in Python (``view.py``), cost models (``cost.py``),
greedy and ILP extractors (``extractors.py``), and the way back to IR (``to_ir.py``)."""
