"""Deterministic models for tests, benchmarks and the demo (see ``models.py``)."""
from .models import ALIASES, MODELS, ZooModel, build, write

__all__ = ["ALIASES", "MODELS", "ZooModel", "build", "write"]
