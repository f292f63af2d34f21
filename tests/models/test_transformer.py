"""The NNX decoder on its own: masks, positions, dtypes and tracing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tree_rl.models import Transformer, logical_axes
from tree_rl.models.config import ModelConfig, tiny

CFG = ModelConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=12, model_type="qwen3", qk_norm=True)


def test_causal_mask_equals_default():
  model = Transformer(CFG, rngs=nnx.Rngs(1))
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, CFG.vocab_size)
  causal = jnp.broadcast_to(jnp.tril(jnp.ones((9, 9), bool)), (2, 9, 9))
  np.testing.assert_allclose(model(tokens, attention_mask=causal), model(tokens), atol=1e-6)


def test_logits_at_reads_are_the_full_logits_gathered():
  model = Transformer(CFG, rngs=nnx.Rngs(1))
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, CFG.vocab_size)
  reads = jnp.array([[0, 4, 8], [3, 3, 7]])
  full = np.asarray(model(tokens))
  np.testing.assert_allclose(model(tokens, reads=reads), full[np.arange(2)[:, None], reads],
                             atol=1e-6)


def test_block_diagonal_mask_gives_each_block_its_own_logits():
  model = Transformer(CFG, rngs=nnx.Rngs(2))
  a = jax.random.randint(jax.random.key(1), (1, 5), 0, CFG.vocab_size)
  b = jax.random.randint(jax.random.key(2), (1, 7), 0, CFG.vocab_size)
  packed = jnp.concatenate([a, b], axis=1)
  seg = jnp.array([0] * 5 + [1] * 7)
  mask = (seg[:, None] == seg[None, :]) & jnp.tril(jnp.ones((12, 12), bool))
  positions = jnp.array([list(range(5)) + list(range(7))])
  out = model(packed, positions=positions, attention_mask=mask[None])
  np.testing.assert_allclose(out[:, :5], model(a), atol=1e-5)
  np.testing.assert_allclose(out[:, 5:], model(b), atol=1e-5)


def test_tree_mask_matches_root_to_leaf_sequences():
  """Two branches after a shared prefix, packed once with an ancestor mask."""
  model = Transformer(CFG, rngs=nnx.Rngs(3))
  key = jax.random.key(3)
  prefix, left, right = (jax.random.randint(k, (n,), 0, CFG.vocab_size)
                         for k, n in zip(jax.random.split(key, 3), (4, 3, 2)))
  packed = jnp.concatenate([prefix, left, right])[None]
  node = np.array([0] * 4 + [1] * 3 + [2] * 2)
  ancestor = np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]], bool)  # ancestor[n, m]: m is n or above it
  order = np.arange(9)
  mask = ancestor[node][:, node] & (order[None, :] <= order[:, None])
  positions = jnp.array([[0, 1, 2, 3, 4, 5, 6, 4, 5]])
  out = model(packed, positions=positions, attention_mask=jnp.asarray(mask)[None])
  full_left = model(jnp.concatenate([prefix, left])[None])
  full_right = model(jnp.concatenate([prefix, right])[None])
  np.testing.assert_allclose(out[0, :7], full_left[0], atol=1e-5)
  np.testing.assert_allclose(out[0, 7:], full_right[0, 4:], atol=1e-5)


def test_bf16_compute_is_close_and_float32_out():
  model = Transformer(CFG, rngs=nnx.Rngs(4))
  low = Transformer(CFG, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(4))
  tokens = jnp.arange(10, dtype=jnp.int32)[None] % CFG.vocab_size
  out = low(tokens)
  assert out.dtype == jnp.float32
  assert low.layers[0].mlp.up_kernel[...].dtype == jnp.bfloat16
  np.testing.assert_allclose(out, model(tokens), atol=5e-2)


def test_logical_axes_cover_every_parameter():
  model = Transformer(tiny(64))
  params = nnx.state(model, nnx.Param)
  axes = jax.tree.leaves(logical_axes(params), is_leaf=lambda x: isinstance(x, tuple))
  shapes = jax.tree.leaves(params)
  assert len(axes) == len(shapes)
  for names, value in zip(axes, shapes):
    assert len(names) == value.ndim
    assert set(names) <= {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp"}


def test_forward_traced_once_per_shape():
  model = Transformer(CFG)
  graphdef, params = nnx.split(model)

  @jax.jit
  @chex.assert_max_traces(n=2)
  def logits(params, tokens):
    return nnx.merge(graphdef, params)(tokens)

  for _ in range(3):
    logits(params, jnp.zeros((2, 6), jnp.int32))
    logits(params, jnp.ones((1, 4), jnp.int32))
  chex.clear_trace_counter()


def test_built_model_init_is_one_program_with_the_eager_init_weights():
  """`build_model` initialises a random model in one jitted program; its weights are bit for bit
  those of the eager constructor (the draws are not fused with their scaling)."""
  from tree_rl import compile_cache
  from tree_rl.config import base_config
  from tree_rl.models import build_model
  from tree_rl.models.tokenizers import BuiltinTokenizer
  config = base_config()
  config.model.preset = "tiny"
  tok = BuiltinTokenizer()
  before, _ = compile_cache.programs_built()
  model, cfg = build_model(config.model, tok, seed=5)
  assert compile_cache.programs_built()[0] - before <= 1
  eager = Transformer(cfg, dtype=jnp.float32, param_dtype=jnp.float32, rngs=nnx.Rngs(5))
  got = jax.tree.leaves(nnx.state(model, nnx.Param))
  want = jax.tree.leaves(nnx.state(eager, nnx.Param))
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_causal_query_blocks_give_the_dense_causal_logits():
  """Attention in causal query blocks (3 tokens, the last block short) equals one dense causal
  pass: every query reads exactly the keys at or before it."""
  cfg = tiny(64)
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  tokens = jax.random.randint(jax.random.key(2), (2, 10), 1, 64)
  np.testing.assert_allclose(model(tokens, causal_block=3), model(tokens), rtol=1e-5, atol=1e-5)
  reads = jnp.array([[1, 9], [4, 6]])
  np.testing.assert_allclose(model(tokens, reads=reads, causal_block=4), model(tokens, reads=reads),
                             rtol=1e-5, atol=1e-5)
