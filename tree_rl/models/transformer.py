"""Flax NNX decoder-only transformer for the Qwen2/Qwen2.5, Qwen3 and Llama families.

Every parameter carries logical axis names in its `axes` metadata (see `logical_axes`), which
`tree_rl.learner.sharding` maps to mesh axes. Attention is pluggable: `forward` takes an `attend`
function so the paged sampler and the tree-packed learner reuse the same layers.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from tree_rl.models.config import ModelConfig

# attend(layer_index, q [B,T,H,D], k [B,T,KV,D], v [B,T,KV,D], state) -> (out [B,T,H,D], state)
AttendFn = Callable[[int, jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def _param(rngs: nnx.Rngs, shape, axes, dtype, scale: float | None = 0.02):
  if scale is None:
    value = jnp.ones(shape, dtype)
  elif scale == 0.0:
    value = jnp.zeros(shape, dtype)
  else:
    # the barrier keeps the draw unfused from the scaling: the same bits eagerly or under jit
    draw = jax.lax.optimization_barrier(jax.random.normal(rngs.params(), shape, jnp.float32))
    value = (scale * draw).astype(dtype)
  return nnx.Param(value, axes=axes)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * weight.astype(jnp.float32)).astype(x.dtype)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, axis_name: str, param_dtype, rngs: nnx.Rngs):
    self.weight = _param(rngs, (dim,), (axis_name,), param_dtype, scale=None)
    self.eps = eps

  def __call__(self, x):
    return rms_norm(x, self.weight[...], self.eps)


def rope_inverse_frequencies(cfg: ModelConfig) -> jax.Array:
  """Per-pair inverse frequencies, with Llama 3's frequency-dependent scaling when configured."""
  half = cfg.head_dim // 2
  inv = 1.0 / (cfg.rope_theta ** (jnp.arange(half, dtype=jnp.float32) * 2.0 / cfg.head_dim))
  if not cfg.rope_scaling:
    return inv
  s = dict(cfg.rope_scaling)
  factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old_len = s["original_max_position_embeddings"]
  wavelen = 2 * jnp.pi / inv
  smooth = (old_len / wavelen - low) / (high - low)
  mid = (1 - smooth) * inv / factor + smooth * inv
  return jnp.where(wavelen > old_len / low, inv / factor, jnp.where(wavelen < old_len / high, inv, mid))


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotate-half RoPE (the HF convention). x: [B, T, N, D], positions: [B, T]."""
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, D/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x32 = x.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def dense_attention(q, k, v, mask) -> jax.Array:
  """Grouped-query attention over full k/v. q [B,T,H,D], k/v [B,S,KV,D], mask [B,T,S] bool."""
  b, t, h, d = q.shape
  kv = k.shape[2]
  qg = q.reshape(b, t, kv, h // kv, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
  scores = scores * (d ** -0.5)
  scores = jnp.where(mask[:, None, None], scores, -1e30)
  probs = jax.nn.softmax(scores, axis=-1)
  probs = jnp.where(mask[:, None, None], probs, 0.0)  # rows with no visible key give zeros
  out = jnp.einsum("bkgts,bskd->btkgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return out.reshape(b, t, h, d).astype(q.dtype)


def causal_block_attention(q, k, v, block: int) -> jax.Array:
  """Causal grouped-query attention in query blocks of `block` tokens: block j reads keys
  [0, (j + 1) x block) only, so the float32 scores held at once are [B, H, block, <= T] rather
  than [B, H, T, T], and about half the (query, key) pairs are computed. Shapes as
  `dense_attention` (k, v as long as q)."""
  b, t = q.shape[:2]
  outs = []
  for lo in range(0, t, block):
    hi = min(lo + block, t)
    mask = jnp.arange(lo, hi)[:, None] >= jnp.arange(hi)[None]
    outs.append(dense_attention(q[:, lo:hi], k[:, :hi], v[:, :hi],
                                jnp.broadcast_to(mask, (b, hi - lo, hi))))
  return jnp.concatenate(outs, axis=1)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, param_dtype, rngs: nnx.Rngs):
    e, h, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    self.q_kernel = _param(rngs, (e, h, d), ("embed", "heads", "head_dim"), param_dtype)
    self.k_kernel = _param(rngs, (e, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.v_kernel = _param(rngs, (e, kv, d), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.o_kernel = _param(rngs, (h, d, e), ("heads", "head_dim", "embed"), param_dtype)
    if cfg.qkv_bias:
      self.q_bias = _param(rngs, (h, d), ("heads", "head_dim"), param_dtype, scale=0.0)
      self.k_bias = _param(rngs, (kv, d), ("kv_heads", "head_dim"), param_dtype, scale=0.0)
      self.v_bias = _param(rngs, (kv, d), ("kv_heads", "head_dim"), param_dtype, scale=0.0)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(d, cfg.rms_norm_eps, "head_dim", param_dtype, rngs)
      self.k_norm = RMSNorm(d, cfg.rms_norm_eps, "head_dim", param_dtype, rngs)
    self.cfg = cfg

  def project(self, x, positions, inv_freq, dtype):
    """Queries, keys and values after bias, q/k norm and RoPE."""
    cast = lambda p: p[...].astype(dtype)
    q = jnp.einsum("bte,ehd->bthd", x, cast(self.q_kernel))
    k = jnp.einsum("bte,ehd->bthd", x, cast(self.k_kernel))
    v = jnp.einsum("bte,ehd->bthd", x, cast(self.v_kernel))
    if self.cfg.qkv_bias:
      q, k, v = q + cast(self.q_bias), k + cast(self.k_bias), v + cast(self.v_bias)
    if self.cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq), v

  def output(self, attn, dtype):
    return jnp.einsum("bthd,hde->bte", attn, self.o_kernel[...].astype(dtype))


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, param_dtype, rngs: nnx.Rngs):
    e, m = cfg.hidden_size, cfg.intermediate_size
    self.gate_kernel = _param(rngs, (e, m), ("embed", "mlp"), param_dtype)
    self.up_kernel = _param(rngs, (e, m), ("embed", "mlp"), param_dtype)
    self.down_kernel = _param(rngs, (m, e), ("mlp", "embed"), param_dtype)

  def __call__(self, x, dtype):
    gate = x @ self.gate_kernel[...].astype(dtype)
    up = x @ self.up_kernel[...].astype(dtype)
    return (jax.nn.silu(gate) * up) @ self.down_kernel[...].astype(dtype)


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, param_dtype, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed", param_dtype, rngs)
    self.attn = Attention(cfg, param_dtype, rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed", param_dtype, rngs)
    self.mlp = MLP(cfg, param_dtype, rngs)


class Transformer(nnx.Module):
  """Decoder-only LM. `model(tokens)` gives float32 logits [B, T, V] under a causal mask.

  param_dtype is the storage dtype of the weights, dtype the compute dtype (fp32 or bf16);
  softmax, norms and logits always run in float32.
  """

  def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
               rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.cfg = cfg
    self.dtype = dtype
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), param_dtype)
    self.layers = nnx.List([DecoderLayer(cfg, param_dtype, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, "embed", param_dtype, rngs)
    if not cfg.tie_word_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), param_dtype)

  def forward(self, tokens: jax.Array, positions: jax.Array, attend: AttendFn, state: Any = None):
    """Final normalised hidden states [B, T, E] with attention delegated to `attend`."""
    dtype = self.dtype
    inv_freq = rope_inverse_frequencies(self.cfg)
    x = jnp.take(self.embed[...], tokens, axis=0).astype(dtype)
    for i, layer in enumerate(self.layers):
      q, k, v = layer.attn.project(layer.input_norm(x), positions, inv_freq, dtype)
      attn, state = attend(i, q, k, v, state)
      x = x + layer.attn.output(attn, dtype)
      x = x + layer.mlp(layer.post_attn_norm(x), dtype)
    return self.final_norm(x), state

  def logits(self, hidden: jax.Array) -> jax.Array:
    head = self.embed[...].T if self.cfg.tie_word_embeddings else self.lm_head[...]
    return jnp.einsum("...e,ev->...v", hidden.astype(self.dtype), head.astype(self.dtype),
                      preferred_element_type=jnp.float32)

  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None, reads: jax.Array | None = None,
               causal_block: int = 0) -> jax.Array:
    """tokens int32 [B, T]; positions [B, T] (default 0..T-1); attention_mask bool [B, T, T]
    (query, key), default causal. Returns float32 logits [B, T, V], or [B, D, V] at the positions
    `reads` [B, D] only (the vocabulary projection of the other positions is never computed).
    causal_block > 0 (causal mask only): attention in query blocks of that many tokens
    (`causal_block_attention`), for long rows."""
    b, t = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    if causal_block and attention_mask is None:
      attend = lambda i, q, k, v, s: (causal_block_attention(q, k, v, causal_block), s)  # noqa: E731
    else:
      if attention_mask is None:
        attention_mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
      attend = lambda i, q, k, v, s: (dense_attention(q, k, v, attention_mask), s)  # noqa: E731
    hidden, _ = self.forward(tokens, positions, attend)
    if reads is not None:
      hidden = jnp.take_along_axis(hidden, reads[..., None].astype(jnp.int32), axis=1)
    return self.logits(hidden)


def logical_axes(params: nnx.State) -> Any:
  """The pytree of logical axis-name tuples matching `params` (an nnx.State of Params)."""
  return jax.tree.map(lambda v: v.axes, params, is_leaf=lambda x: isinstance(x, nnx.Variable))
