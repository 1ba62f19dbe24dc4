"""Architecture of the Llama-style GPT model shared by the actor, rollout and inference engines."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from slurm_rl.config import shape_problems


ARCHITECTURES = ("llama", "qwen2", "qwen3")  # decoder families the engines build and convert


@dataclass(frozen=True)
class ModelConfig:
    """Llama-family decoder: RMSNorm, SwiGLU, RoPE; Qwen2's q/k/v biases, Qwen3's q/k RMSNorm.

    ``num_query_groups=None`` means multi-head attention (one KV head per query head);
    ``ffn_hidden_size=None`` means the Llama rule: 8/3 * hidden rounded up to a multiple of 64;
    ``kv_channels=None`` means a head size of ``hidden_size // num_attention_heads`` (Qwen3 names
    its own ``head_dim``). The head size must be at least 32 (vLLM CPU kernels).
    ``rope_scaling`` is the checkpoint's ``rope_parameters`` beyond the default (e.g. Llama-3's
    ``{"rope_type": "llama3", "factor": 8.0, ...}``); None means plain RoPE with ``rotary_base``.
    """

    vocab_size: int = 64
    hidden_size: int = 128
    num_layers: int = 2
    num_attention_heads: int = 4
    num_query_groups: int | None = None
    ffn_hidden_size: int | None = None
    max_position_embeddings: int = 256
    rotary_base: float = 10000.0
    norm_epsilon: float = 1e-5
    tie_word_embeddings: bool = False
    architecture: str = "llama"  # llama | qwen2 | qwen3
    kv_channels: int | None = None  # head size when not hidden / heads (Qwen3's head_dim)
    qkv_bias: bool = False  # biases on the q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm of each query and key head before RoPE (Qwen3)
    rope_scaling: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"model.architecture: got {self.architecture!r}; allowed: "
                             f"{', '.join(ARCHITECTURES)}")
        if self.kv_channels is not None and (self.kv_channels < 32 or self.kv_channels % 2):
            raise ValueError(f"model.kv_channels: got {self.kv_channels!r}; allowed: an even "
                             "head size >= 32")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_attention_heads",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{name}: got {value!r}, expected a positive integer")
        problems = shape_problems(self.hidden_size, self.num_attention_heads, self.num_query_groups)
        if self.kv_channels is not None:  # the head size is given: hidden need not split into heads
            problems = [p for p in problems if p[0] == "model.num_query_groups"]
        for key, value, allowed in problems[:1]:
            raise ValueError(f"{key}: got {value!r}; allowed: {allowed}")
        if self.ffn_hidden_size is not None and self.ffn_hidden_size <= 0:
            raise ValueError(
                f"model.ffn_hidden_size: got {self.ffn_hidden_size!r}, expected a positive "
                "integer or null")

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def kv_groups(self) -> int:
        """Number of key/value heads (query groups)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn_size(self) -> int:
        """Intermediate size of the SwiGLU MLP (resolved default)."""
        if self.ffn_hidden_size is not None:
            return self.ffn_hidden_size
        return ((8 * self.hidden_size // 3) + 63) // 64 * 64

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        """Build from a plain mapping; unknown keys are an error naming the key."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model.{unknown[0]}: unknown key; allowed: {sorted(known)}")
        return cls(**dict(data))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-serialisable)."""
        return dataclasses.asdict(self)

    def num_parameters(self) -> int:
        """Parameter count of the model built from this config."""
        h, f, v = self.hidden_size, self.ffn_size, self.vocab_size
        d, n = self.head_dim, self.num_attention_heads
        qkv = (h + self.qkv_bias) * (n + 2 * self.kv_groups) * d
        layer = h + qkv + n * d * h + h + 2 * h * f + f * h + (2 * d if self.qk_norm else 0)
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return emb + self.num_layers * layer + h
