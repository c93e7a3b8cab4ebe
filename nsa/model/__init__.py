"""LLaMA-style decoder with NSA attention."""
from .config import ModelConfig
from .model import NSATransformer
from .telemetry import backend_report, count_calls, gate_stats, track_gates

__all__ = ["ModelConfig", "NSATransformer", "gate_stats", "backend_report", "count_calls", "track_gates"]
