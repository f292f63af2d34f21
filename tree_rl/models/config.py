"""Architecture hyper-parameters of the decoder family (Qwen2/Qwen2.5, Qwen3, Llama)."""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """One decoder-only transformer shape.

  `qkv_bias` is Qwen2's q/k/v projection bias, `qk_norm` Qwen3's per-head RMSNorm
  of queries and keys; `head_dim` may differ from hidden_size // num_heads.
  """

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  model_type: str = "qwen2"
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None  # llama3 scaling, as sorted items
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 32768

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"model_type {self.model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")

  @property
  def num_params(self) -> int:
    e, h, kv, d, m, v = (self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim,
                         self.intermediate_size, self.vocab_size)
    attn = e * d * (h + 2 * kv) + h * d * e + (d * (h + 2 * kv) if self.qkv_bias else 0)
    layer = attn + 3 * e * m + 2 * e + (2 * d if self.qk_norm else 0)
    return v * e * (1 if self.tie_word_embeddings else 2) + self.num_layers * layer + e


def tiny(vocab_size: int) -> ModelConfig:
  """A from-scratch model small enough to train on a 2-core CPU (about 0.45M params)."""
  return ModelConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, model_type="qwen2",
                     tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=4096)


def small(vocab_size: int) -> ModelConfig:
  """A from-scratch model for a single GPU or a patient CPU (about 10M params)."""
  return ModelConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_layers=6,
                     num_heads=8, num_kv_heads=2, head_dim=32, model_type="qwen2",
                     tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=8192)


def qwen25_05b() -> ModelConfig:
  """The Qwen2.5-0.5B shape (494M params), used by the benchmarks with random weights."""
  return ModelConfig(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24,
                     num_heads=14, num_kv_heads=2, head_dim=64, model_type="qwen2",
                     rope_theta=1000000.0, tie_word_embeddings=True, qkv_bias=True)


PRESETS = {"tiny": tiny, "small": small}
