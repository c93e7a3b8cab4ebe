"""The NSA attention module, its float64 oracle (reference.py) and backend routing."""
from .backends import BackendUnavailable, Route
from .config import NSAConfig
from .module import NSAAttention, NSACache

__all__ = ["NSAConfig", "NSAAttention", "NSACache", "BackendUnavailable", "Route"]
