"""Quantization: fixed-point requantization arithmetic (``fixed_point.py``) and calibration
(``calibrate.py``: observers, TVM's KL-divergence threshold search, weight scales, the
calibration table)."""
