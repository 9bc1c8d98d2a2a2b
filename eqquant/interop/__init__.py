"""Interchange with other frameworks: ONNX export (``onnx_export.py``), which needs the
optional ``onnx`` extra."""
