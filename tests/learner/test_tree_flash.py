"""The Pallas flash attention over packed trees (`tree_rl.learner.tree_flash`), run in Pallas'
interpret mode: equal to dense attention under the packed ancestor mask, forward and gradient,
on packed rows of random trees; its one-integer-per-key mask by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.learner import batches, synthetic
from tree_rl.learner.tree_flash import (flash_layout, max_pairs, pair_lists, subtree_ends,
                                        tree_flash_attention)
from tree_rl.models.transformer import dense_attention


def test_subtree_ends_by_hand_for_pallas():
  # root 0 (2 tokens) -> 1 (2 tokens) -> 3 (1 token); root -> 2 (2 tokens); depth-first: 0 1 3 2
  tree = batches.TrainTree(parent=[-1, 0, 0, 1], spans=[[0, 2], [2, 4], [4, 6], [6, 7]],
                           tokens=np.arange(7), loss_mask=np.arange(7) >= 2,
                           old_logp=np.zeros(7), advantages=np.zeros(4))
  pb = batches.pack_trees([tree], seq_len=10, max_nodes=6, block=2)
  # node 2 came after node 3's subtree: packed as 0 0 | 1 1 | 3 | 2 2 | pad pad pad
  assert pb.node_ids[0].tolist() == [0, 0, 1, 1, 2, 3, 3, -1, -1, -1]
  ends = np.asarray(subtree_ends(jnp.asarray(pb.node_ids), jnp.asarray(pb.ancestors)))
  assert ends[0].tolist() == [7, 7, 5, 5, 5, 7, 7, 8, 9, 10]
  # the rule j <= i < end[j] is the packed mask
  t = np.arange(10)
  rule = (t[None, :] <= t[:, None]) & (t[:, None] < ends[0][None, :])
  mask = np.asarray(batches.packed_attention_mask(pb.node_ids, pb.ancestors))[0]
  np.testing.assert_array_equal(rule, mask)


def test_pair_lists_by_hand_for_pallas():
  # query block 0 sees key block 0; block 1 sees 1 and 0; block 2 sees 2 and 0
  lists = jnp.asarray([[[0, -1, -1], [1, 0, -1], [2, 0, -1]]], jnp.int32)
  assert max_pairs(3, 3) == 6      # 1 + 2 + 3: the grid, whatever the lists hold
  q, k, n = (np.asarray(x)[0].tolist() for x in pair_lists(lists, by_key=False))
  assert (q, k, n) == ([0, 1, 1, 2, 2, 2], [0, 1, 0, 2, 0, 0], 5)   # the last pair repeats
  q, k, n = (np.asarray(x)[0].tolist() for x in pair_lists(lists, by_key=True))
  assert (q, k, n) == ([0, 1, 2, 1, 2, 2], [0, 0, 0, 1, 2, 2], 5)


@pytest.mark.parametrize("shape", ["patr", "patr_full_width", "random"])
def test_pallas_interpret_flash_equals_dense_masked_attention(shape):
  """Output and gradient (q, k, v) equal dense attention under the packed mask, with grouped
  query heads, on rows packed from trees whose nodes were not numbered depth-first, with the
  lists as wide as the batch needs or as the row (the fixed-shape micro-batches' width)."""
  rng = np.random.default_rng(11)
  if shape.startswith("patr"):
    trees = [synthetic.patr_tree(rng, prompt=8, action=5, obs=3, vocab=64, group_id=g)
             for g in range(3)]
    pb = batches.pack_trees(trees, seq_len=256, max_nodes=64, block=16,
                            max_kv_blocks=16 if shape == "patr_full_width" else None)
  else:
    trees = [synthetic.random_tree(rng, 7, 64, group_id=g) for g in range(4)]
    pb = batches.pack_trees(trees, seq_len=64, max_nodes=32, block=8)
  assert (pb.kv_blocks < 0).any(), "some blocks are skipped"
  b, t = pb.tokens.shape
  q = jnp.asarray(rng.normal(size=(b, t, 4, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(b, t, 2, 8)), jnp.float32) for _ in range(2))
  mask = batches.packed_attention_mask(pb.node_ids, pb.ancestors)
  layout = flash_layout(jnp.asarray(pb.node_ids), jnp.asarray(pb.ancestors),
                        jnp.asarray(pb.kv_blocks))
  w = jnp.asarray(rng.normal(size=(b, t, 4, 8)), jnp.float32)   # a loss that weighs every output

  def dense(q, k, v):
    return (dense_attention(q, k, v, mask) * w).sum()

  def flash(q, k, v):
    return (tree_flash_attention(q, k, v, layout, interpret=True) * w).sum()

  want, want_g = jax.value_and_grad(dense, argnums=(0, 1, 2))(q, k, v)
  got, got_g = jax.value_and_grad(flash, argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  for name, a, e in zip("qkv", got_g, want_g):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-4, atol=1e-5, err_msg=name)
