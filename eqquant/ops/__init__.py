"""The op registry (``registry.py``) and the ops it holds, one file per family."""
from .registry import OpDef, all_ops, get_op, has_op, ops_with, register

__all__ = ["OpDef", "all_ops", "get_op", "has_op", "ops_with", "register"]
