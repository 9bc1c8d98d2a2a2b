"""Interchange with other frameworks: ONNX export (onnx_export.py). Needs the optional onnx extra."""
