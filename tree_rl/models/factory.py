"""Build the tokenizer and the policy model named by a config."""

from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from tree_rl.models.config import PRESETS, ModelConfig
from tree_rl.models.hf_io import load_hf_checkpoint
from tree_rl.models.tokenizers import Tokenizer, make_tokenizer
from tree_rl.models.transformer import Transformer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def _dtype(name: str, field: str):
  if name not in DTYPES:
    raise ValueError(f"config.model.{field}={name!r}; choose one of {sorted(DTYPES)}")
  return DTYPES[name]


def build_tokenizer(tc, model_path: str = "") -> Tokenizer:
  """tc: config.tokenizer: builtin, or a local HF directory (`tc.path`, else `model_path`: the
  model's config.model.hf_path)."""
  return make_tokenizer(tc.kind, tc.path or model_path)


def build_model(m, tokenizer: Tokenizer, seed: int = 0) -> tuple[Transformer, ModelConfig]:
  """m: config.model; its preset: tiny/small (random init sized to the tokenizer) or hf (local
  checkpoint)."""
  dtype, param_dtype = _dtype(m.dtype, "dtype"), _dtype(m.param_dtype, "param_dtype")
  if m.preset == "hf":
    if not m.hf_path:
      raise ValueError("config.model.hf_path must name a local HF checkpoint directory when preset=hf")
    model, cfg = load_hf_checkpoint(m.hf_path, dtype=param_dtype, compute_dtype=dtype)
    if cfg.vocab_size < tokenizer.vocab_size:
      raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size}")
    return model, cfg
  if m.preset not in PRESETS:
    raise ValueError(f"config.model.preset={m.preset!r}; choose one of {sorted(PRESETS) + ['hf']}")
  cfg = PRESETS[m.preset](tokenizer.vocab_size)
  return _random_init(cfg, dtype, param_dtype, int(seed)), cfg


def abstract_model(m, tokenizer: Tokenizer) -> tuple[Transformer, ModelConfig]:
  """The model `m` (config.model) names as shapes only (`nnx.eval_shape`: no weight allocated
  or drawn), for compiling programs ahead of time; a preset, or `hf` read from its config.json."""
  dtype, param_dtype = _dtype(m.dtype, "dtype"), _dtype(m.param_dtype, "param_dtype")
  if m.preset == "hf":
    import json
    import os
    from tree_rl.models.hf_io import config_from_hf
    path = os.path.join(m.hf_path, "config.json")
    with open(path) as f:
      cfg = config_from_hf(json.load(f), path)
  elif m.preset in PRESETS:
    cfg = PRESETS[m.preset](tokenizer.vocab_size)
  else:
    raise ValueError(f"config.model.preset={m.preset!r}; choose one of {sorted(PRESETS) + ['hf']}")
  make = lambda: Transformer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0))  # noqa: E731
  return nnx.eval_shape(make), cfg


def _random_init(cfg: ModelConfig, dtype, param_dtype, seed: int) -> Transformer:
  """A randomly initialised model in one compiled program (eagerly, every parameter's draw and
  scaling would compile programs of their own); the same weights as an eager init."""
  make = lambda: Transformer(cfg, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(seed))  # noqa: E731
  graphdef, _ = nnx.split(nnx.eval_shape(make))
  return nnx.merge(graphdef, jax.jit(lambda: nnx.split(make())[1])())
