"""Deterministic models for tests, benchmarks and the demo (see ``models.py``)."""
from .models import MODELS, ZooModel, build, write

__all__ = ["MODELS", "ZooModel", "build", "write"]
