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
  """A from-scratch model small enough to train on a 2-core CPU (0.46M parameters with the
  builtin tokenizer)."""
  return ModelConfig(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=32, model_type="qwen2",
                     tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=4096)


def small(vocab_size: int) -> ModelConfig:
  """A from-scratch model for a single GPU or a patient CPU (about 10M params)."""
  return ModelConfig(vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_layers=6,
                     num_heads=8, num_kv_heads=2, head_dim=32, model_type="qwen2",
                     tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=8192)


def _published(vocab_size, hidden, mlp, layers, heads, kv_heads, head_dim, *, tied=True,
               qwen3=False, max_positions=32768) -> ModelConfig:
  """A Qwen2.5 / Qwen3 shape as its config.json publishes it (rope theta 1e6, RMSNorm eps 1e-6;
  Qwen2.5 has q/k/v biases, Qwen3 per-head q/k norms instead)."""
  return ModelConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=mlp,
                     num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                     model_type="qwen3" if qwen3 else "qwen2", rope_theta=1000000.0,
                     tie_word_embeddings=tied, qkv_bias=not qwen3, qk_norm=qwen3,
                     max_position_embeddings=max_positions)


# The papers' policies by their published shapes (random weights when a run builds one: the AOT
# tool, the benchmarks and dry runs size programs with them; a real checkpoint is `preset=hf`).
PUBLISHED = {
    "qwen2.5-0.5b": lambda: _published(151936, 896, 4864, 24, 14, 2, 64),
    "qwen2.5-1.5b": lambda: _published(151936, 1536, 8960, 28, 12, 2, 128),
    "qwen2.5-3b": lambda: _published(151936, 2048, 11008, 36, 16, 2, 128),
    "qwen2.5-7b": lambda: _published(152064, 3584, 18944, 28, 28, 4, 128, tied=False),
    "qwen3-4b": lambda: _published(151936, 2560, 9728, 36, 32, 8, 128, qwen3=True,
                                   max_positions=40960),
}


def qwen25_05b() -> ModelConfig:
  """The Qwen2.5-0.5B shape (494M params), used by the benchmarks with random weights."""
  return PUBLISHED["qwen2.5-0.5b"]()


def _fixed_vocab(make):
  def build(vocab_size: int) -> ModelConfig:
    cfg = make()
    if vocab_size > cfg.vocab_size:
      raise ValueError(f"the tokenizer has {vocab_size} tokens, the model's vocabulary "
                       f"{cfg.vocab_size}")
    return cfg
  return build


# preset name -> ModelConfig for a tokenizer of `vocab_size` tokens (tiny / small fit their
# vocabulary to the tokenizer; the published shapes keep theirs)
PRESETS = {"tiny": tiny, "small": small} | {k: _fixed_vocab(v) for k, v in PUBLISHED.items()}
