"""Programs saved ahead of time: an executor's kernels linked into one shared library with
its plan of launches and its data, run later without Numba (``build.py`` saves, with the
runtime; ``loader.py`` loads, with numpy and ctypes only; ``library.c``: the C side).
"""
