"""Packed SFT rows: placement by hand, and a packed row computes what its demos compute alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl import warmstart
from tree_rl.warmstart.demos import Demos

from warmstart_helpers import _model

PAD = 0


def _demos(lengths, width, vocab, seed=0):
  """Demos of the given lengths: random tokens, a 2-token prompt, every later token trained."""
  rng = np.random.default_rng(seed)
  n = len(lengths)
  tokens = np.full((n, width), PAD, np.int32)
  mask = np.zeros((n, width), np.float32)
  for i, k in enumerate(lengths):
    tokens[i, :k] = rng.integers(1, vocab, k)
    mask[i, 2:k] = 1.0
  zeros = jnp.zeros((n,), bool)
  return Demos(tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(mask), reply_mask=jnp.asarray(mask > 0),
               length=jnp.asarray(lengths, jnp.int32), prompt_len=jnp.full((n,), 2, jnp.int32),
               rows=jnp.zeros((n, 1), jnp.int32), intended=jnp.zeros((n, 1), jnp.int32),
               noisy=jnp.zeros((n, 1), bool), turns=jnp.ones((n,), jnp.int32),
               reward=jnp.zeros((n,)), success=zeros, truncated=zeros, hard=zeros)


def test_first_fit_longest_first_by_hand():
  demos = _demos([5, 3, 2, 4], width=8, vocab=50)
  rows = warmstart.pack(demos, PAD)
  # longest first: 5 -> row 0 (3 left), 4 -> row 1 (4 left), 3 -> row 0 (full), 2 -> row 1
  tok = np.asarray(demos.tokens)
  want = np.array([list(tok[0, :5]) + list(tok[1, :3]),
                   list(tok[3, :4]) + list(tok[2, :2]) + [PAD, PAD]])
  np.testing.assert_array_equal(rows.tokens, want)
  np.testing.assert_array_equal(rows.positions, [[0, 1, 2, 3, 4, 0, 1, 2],
                                                 [0, 1, 2, 3, 0, 1, 0, 0]])
  np.testing.assert_array_equal(rows.segments, [[1, 1, 1, 1, 1, 2, 2, 2],
                                                [2, 2, 2, 2, 1, 1, 0, 0]])
  np.testing.assert_array_equal(rows.loss_mask, [[0, 0, 1, 1, 1, 0, 0, 1],
                                                 [0, 0, 1, 1, 0, 0, 0, 0]])
  assert float(rows.loss_mask.sum()) == float(demos.loss_mask.sum())
  mask = np.asarray(rows.attention_mask())
  assert mask[0, 6].tolist() == [0, 0, 0, 0, 0, 1, 1, 0]   # demo 1's second token: itself and before
  assert mask[1, 3].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]


def test_a_packed_row_computes_what_its_demos_compute_alone(tok):
  model = _model(tok, seed=4)
  demos = _demos([9, 6, 4, 7, 3], width=16, vocab=tok.vocab_size, seed=1)
  alone = warmstart.one_per_row(demos)
  packed = warmstart.pack(demos, PAD)
  assert packed.num_rows == 2 < alone.num_rows
  loss_packed, n_packed = warmstart.sft_loss(model, packed, attention="einsum")
  loss_alone, n_alone = warmstart.sft_loss(model, alone, attention="einsum")
  # the same trained tokens, each with the same context: the same mean NLL
  assert float(n_packed) == float(n_alone) == 7 + 4 + 2 + 5 + 1
  assert float(loss_packed) == pytest.approx(float(loss_alone), rel=1e-5)


def test_packed_warm_start_trains_on_fewer_rows(tok, small_env):
  from warmstart_helpers import _config
  c = _config(num_demos=16, max_len=512, steps=3, batch_size=4, pack=True)
  c.unlock()
  c.env.name = "frozenlake"
  _, stats = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
                                     env_name="frozenlake")
  assert stats["steps"] == 3 and all(np.isfinite(stats["loss"]))
  assert stats["demo_tokens"] < 256 and stats["rows"] < 16, stats["demo_tokens"]
  # packed, the rows hold the demos' tokens with less padding than one demo per 512-token row
  assert stats["row_fill"] == pytest.approx(16 * stats["demo_tokens"] / (stats["rows"] * 512))
  assert stats["row_fill"] > stats["demo_tokens"] / 512
