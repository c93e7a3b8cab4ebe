"""The NSA attention module, its float64 oracle (reference.py) and backend routing."""
from .backends import BackendUnavailable, Route, check_requested
from .config import NSAConfig
from .graphed import set_graph_tokens
from .module import NSAAttention, NSACache

__all__ = ["NSAConfig", "NSAAttention", "NSACache", "BackendUnavailable", "Route", "check_requested",
           "set_graph_tokens"]
