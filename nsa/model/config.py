"""ModelConfig: the LLaMA-style decoder around NSA attention."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..attention.config import NSAConfig


@dataclass
class ModelConfig:
    dim: int = 768
    """Model width."""
    n_layers: int = 12
    """Decoder blocks."""
    n_heads: int = 12
    """Query heads (HQ)."""
    n_kv_groups: int = 2
    """KV heads (H); each serves n_heads // n_kv_groups query heads, which share one selection."""
    head_dim: int = 64
    """d_k = d_v (one head dim for queries, keys and values); at most 256 where the NSA kernels
    may run (nsa.kernels.MAX_HEAD_DIM)."""
    vocab_size: int = 256
    """256 for the byte tokenizer."""
    ffn_hidden: int = 3072
    """SwiGLU hidden width."""
    rope_theta: float = 10000.0
    """RoPE base; q and every branch's k use the same frequencies."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share the token embedding with the output head."""
    init_std: float = 0.02
    """Std of the normal init of embeddings and projections."""
    dropout: float = 0.0
    """Residual dropout on each block's attention and feed-forward outputs, in training only. 0
    (the default) draws no random numbers; above 0 the run's RNG state is part of what a resumed
    run must restore."""
    attn: NSAConfig = field(default_factory=NSAConfig)
    """NSA hyper-parameters and per-branch backends."""

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_groups", "head_dim", "vocab_size", "ffn_hidden"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_groups:
            raise ValueError(
                f"model.n_heads={self.n_heads} must be divisible by model.n_kv_groups={self.n_kv_groups}"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        self.attn.check_head_dim(self.head_dim)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")
        for name in ("norm_eps", "rope_theta", "init_std"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be > 0, got {getattr(self, name)}")


def load_model_config(name_or_path: str, overrides: list[str] | str | None = None) -> ModelConfig:
    """The ``model:`` section of a preset or YAML file, with dotted overrides such as
    ``model.n_layers=2`` or ``model.attn.window=64`` applied. Errors name the file and key."""
    from ..config import ConfigError, from_dict, merge, parse_overrides, read_yaml, resolve_config_path

    path = resolve_config_path(name_or_path)
    data = read_yaml(path, sections=["model"])
    extra = parse_overrides(overrides)
    unknown = sorted(set(extra) - {"model"})
    if unknown:
        raise ConfigError(f"override {unknown[0]}.*: only model.* keys apply to a model config")
    try:
        return from_dict(ModelConfig, merge(data, extra).get("model", {}), prefix="model")
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
