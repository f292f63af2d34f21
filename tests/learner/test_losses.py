"""Clipped policy loss against a direct per-token computation, and tree-packed == per-leaf."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tree_rl.learner import batches, losses, synthetic
from tree_rl.learner.logprobs import sequence_logprobs
from tree_rl.learner.tree_attention import block_visibility, tree_block_attention
from tree_rl.models import Transformer
from tree_rl.models.config import tiny
from tree_rl.models.transformer import dense_attention

CLIP = dict(clip_low=0.2, clip_high=0.28)


def reference_loss(logp, old, adv, mask, groups, ref, ent, mode, kl_coef, ent_coef):
  """The objective written out trajectory by trajectory, token by token."""
  n, t = logp.shape
  terms = []  # (trajectory, per-token objective)
  for i in range(n):
    row = []
    for j in range(t):
      if not mask[i, j]:
        continue
      rho = np.exp(logp[i, j] - old[i, j])
      clipped = min(max(rho, 1 - CLIP["clip_low"]), 1 + CLIP["clip_high"])
      d = ref[i, j] - logp[i, j]
      kl = np.exp(d) - d - 1
      row.append(-min(rho * adv[i], clipped * adv[i]) + kl_coef * kl - ent_coef * ent[i, j])
    terms.append(row)
  valid = [i for i in range(n) if terms[i]]
  if mode == "token_sum":
    return sum(sum(r) for r in terms)
  if mode == "token_mean":
    return sum(sum(r) for r in terms) / sum(len(r) for r in terms)
  per_traj = {i: sum(terms[i]) / len(terms[i]) for i in valid}
  if mode == "traj_mean":
    return sum(per_traj.values()) / len(valid)
  by_group = {}
  for i in valid:
    by_group.setdefault(groups[i], []).append(per_traj[i])
  return sum(sum(v) / len(v) for v in by_group.values()) / len(by_group)


@pytest.mark.parametrize("mode", losses.AGGREGATIONS)
def test_policy_loss_matches_direct_computation(mode):
  rng = np.random.default_rng(1)
  n, t = 6, 7
  logp = -rng.exponential(size=(n, t)).astype(np.float32)
  old = (logp + rng.normal(scale=0.4, size=(n, t))).astype(np.float32)
  ref = (logp + rng.normal(scale=0.3, size=(n, t))).astype(np.float32)
  ent = rng.uniform(0, 3, size=(n, t)).astype(np.float32)
  adv = np.array([1.5, -0.7, 0.0, 2.0, -1.0, 0.3], np.float32)
  mask = rng.uniform(size=(n, t)) < 0.6
  mask[:, 0] = False
  mask[5] = False                       # an invalid (empty) trajectory
  groups = np.array([4, 4, 9, 9, 9, 4])
  loss, metrics = losses.policy_loss(logp, old, adv, mask, group_ids=groups, ref_logp=ref,
                                     entropy=ent, aggregation=mode, kl_coef=0.1,
                                     entropy_coef=0.01, **CLIP)
  want = reference_loss(logp, old, adv, mask, groups, ref, ent, mode, 0.1, 0.01)
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  rho = np.exp(logp - old)[mask]
  if mode == "token_mean":  # uniform weights: plain token fractions and means
    outside = (rho < 0.8) | (rho > 1.28)
    np.testing.assert_allclose(float(metrics["clip_frac"]), outside.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["ratio_mean"]), rho.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["entropy"]), ent[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["ratio_max"]), rho.max(), rtol=1e-6)
  np.testing.assert_allclose(float(metrics["ratio_min"]), rho.min(), rtol=1e-6)
  assert 0 < float(metrics["clip_frac"]) < 1


def test_clipping_stops_the_gradient_on_the_clipped_side():
  logp = jnp.log(jnp.array([[0.5, 0.5, 0.5, 0.5]]))
  old = jnp.log(jnp.array([[0.5, 0.3, 0.5, 0.7]]))   # rho = 1, 1.67, 1, 0.71
  mask = jnp.array([[False, True, True, True]])
  g_pos = jax.grad(lambda lp: losses.policy_loss(lp, old, jnp.array([1.0]), mask,
                                                 aggregation="token_sum", **CLIP)[0])(logp)
  g_neg = jax.grad(lambda lp: losses.policy_loss(lp, old, jnp.array([-1.0]), mask,
                                                 aggregation="token_sum", **CLIP)[0])(logp)
  # A > 0: rho = 1.67 > 1.28 is clipped (zero gradient), rho = 0.71 is not (pessimistic min).
  np.testing.assert_allclose(g_pos, [[0.0, 0.0, -1.0, -0.7 / 0.7 * 0.5 / 0.7]], rtol=1e-5)
  # A < 0: rho = 0.71 < 0.8 is clipped, rho = 1.67 is not.
  np.testing.assert_allclose(g_neg, [[0.0, 0.5 / 0.3, 1.0, 0.0]], rtol=1e-5)


def test_dual_clip_caps_a_negative_advantage_token_at_c():
  # A = -1, clip 0.2 / 0.2: rho = 0.5 (below the range: clipped, loss 0.8), 5 and 12 (above:
  # loss rho). Dual clip c = 10 caps the last at 10 (no gradient); A > 0 tokens are untouched.
  old = jnp.zeros((1, 4))
  rho = jnp.array([[0.5, 5.0, 12.0, 12.0]])
  adv = jnp.array([[-1.0, -1.0, -1.0, 2.0]])
  mask = jnp.ones((1, 4), bool)

  def loss(lp, c):
    return losses.policy_loss(lp, old, adv, mask, aggregation="token_sum", clip_low=0.2,
                              clip_high=0.2, dual_clip=c)[0]

  lp = jnp.log(rho)
  # A > 0 at rho 12: min(12, 1.2) * 2 = 2.4, a loss of -2.4 with no gradient
  assert float(loss(lp, 0.0)) == pytest.approx(0.8 + 5.0 + 12.0 - 2.4, rel=1e-6)
  assert float(loss(lp, 10.0)) == pytest.approx(0.8 + 5.0 + 10.0 - 2.4, rel=1e-6)
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(lp, 0.0))[0], [0.0, 5.0, 12.0, 0.0],
                             rtol=1e-6)
  np.testing.assert_allclose(np.asarray(jax.grad(loss)(lp, 10.0))[0], [0.0, 5.0, 0.0, 0.0],
                             rtol=1e-6)


def test_packed_positions_and_predecessors_of_a_small_tree():
  # root: 2 prompt tokens; A (3 tokens) and B (2 tokens) under the root; C (1 token) under A.
  tree = batches.TrainTree(parent=[-1, 0, 0, 1], spans=[[0, 2], [2, 5], [5, 7], [7, 8]],
                      tokens=np.arange(10, 18), loss_mask=np.array([0, 0, 1, 1, 0, 1, 1, 1], bool),
                      old_logp=np.zeros(8, np.float32), advantages=np.array([0, 0, -2.0, 1.0]))
  pb = batches.pack_trees([tree], seq_len=10, max_nodes=5, aggregation="token_sum")
  # packed depth-first: root, A, C, B (each subtree contiguous)
  np.testing.assert_array_equal(pb.tokens[0, :8], [10, 11, 12, 13, 14, 17, 15, 16])
  np.testing.assert_array_equal(pb.positions[0, :8], [0, 1, 2, 3, 4, 5, 2, 3])
  np.testing.assert_array_equal(pb.pred_index[0, :8], [0, 0, 1, 2, 3, 4, 1, 6])
  np.testing.assert_array_equal(pb.node_ids[0], [0, 0, 1, 1, 1, 2, 3, 3, -1, -1])
  # Leaves are B (A = -2) and C (A = +1); A's tokens lie under C only, the root's under both.
  np.testing.assert_array_equal(pb.pos_weight[0, :8], [0, 0, 1, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(pb.neg_weight[0, :8], [0, 0, 0, 0, 0, 0, 2, 2])
  mask = np.asarray(batches.packed_attention_mask(pb.node_ids, pb.ancestors))[0]
  assert mask[5, :8].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]      # C sees root, A, itself
  assert mask[7, :8].tolist() == [1, 1, 0, 0, 0, 0, 1, 1]      # B sees root and itself
  lb = batches.leaf_batch([tree], seq_len=8)
  np.testing.assert_array_equal(lb.tokens, [[10, 11, 15, 16, 0, 0, 0, 0],
                                            [10, 11, 12, 13, 14, 17, 0, 0]])


def test_per_node_advantages_weigh_each_node_with_its_own():
  # The tree above; per node on the path: C's path (root, A, C) gets (0, 2, -1), B's (root, B)
  # gets (0, -3): A's tokens lie under C only and take its A-value 2, C's take -1, B's -3.
  adv = np.zeros((4, 3), np.float32)
  adv[3] = [0.0, 2.0, -1.0]
  adv[2] = [0.0, -3.0, 0.0]
  tree = batches.TrainTree(parent=[-1, 0, 0, 1], spans=[[0, 2], [2, 5], [5, 7], [7, 8]],
                      tokens=np.arange(10, 18), loss_mask=np.array([0, 0, 1, 1, 0, 1, 1, 1], bool),
                      old_logp=np.zeros(8, np.float32), advantages=adv)
  pb = batches.pack_trees([tree], seq_len=10, max_nodes=5, aggregation="token_sum")
  np.testing.assert_array_equal(pb.pos_weight[0, :8], [0, 0, 2, 2, 0, 0, 0, 0])  # root A C B
  np.testing.assert_array_equal(pb.neg_weight[0, :8], [0, 0, 0, 0, 0, 1, 3, 3])
  lb = batches.leaf_batch([tree], seq_len=8)
  np.testing.assert_array_equal(lb.advantages, [[0, 0, -3, -3, 0, 0, 0, 0],
                                                [0, 0, 2, 2, 2, -1, 0, 0]])


def _model_logp(model, pb):
  mask = batches.packed_attention_mask(pb.node_ids, pb.ancestors)
  return sequence_logprobs(model, pb.tokens, positions=pb.positions, pred_index=pb.pred_index,
                           attention_mask=mask)[0]


@pytest.mark.parametrize("per_node", [False, True])
def test_packed_loss_and_gradients_equal_per_leaf(per_node):
  """fp32, highest matmul precision: loss to rtol 1e-5, gradients to 1e-5 of their max; with
  one advantage per leaf, or per node of each leaf's path (step-level estimators)."""
  vocab = 64
  rng = np.random.default_rng(0)
  model = Transformer(tiny(vocab), rngs=nnx.Rngs(3))
  graph, params = nnx.split(model)
  trees = [synthetic.random_tree(rng, int(rng.integers(1, 8)), vocab, group_id=g // 3)
           for g in range(9)]
  if per_node:   # paths have at most 8 nodes
    for tree in trees:
      tree.advantages = rng.normal(size=(tree.num_nodes, 8)).astype(np.float32)
  # Old log-probs near the model's own, so some ratios fall inside and some outside the clip range.
  for tree in trees:
    one = batches.pack_trees([tree], seq_len=len(tree.tokens), max_nodes=tree.num_nodes)
    logp = np.asarray(_model_logp(model, one))[0]
    tree.old_logp = (logp + rng.normal(scale=0.4, size=logp.shape)).astype(np.float32)
  lb = batches.leaf_batch(trees, seq_len=48)
  kw = dict(kl_coef=0.05, entropy_coef=0.01, **CLIP)

  def leaf_loss(params, pos, neg, w):
    m = nnx.merge(graph, params)
    logp, ent = sequence_logprobs(m, lb.tokens, with_entropy=True)
    loss, stats = losses.weighted_policy_loss(logp, lb.old_logp, pos, neg, w,
                                              ref_logp=lb.ref_logp, entropy=ent, **kw)
    return loss, losses.finalize_metrics(stats)

  def packed_loss(params, pb):
    m = nnx.merge(graph, params)
    mask = batches.packed_attention_mask(pb.node_ids, pb.ancestors)
    logp, ent = sequence_logprobs(m, pb.tokens, positions=pb.positions, pred_index=pb.pred_index,
                                  attention_mask=mask, with_entropy=True)
    loss, stats = losses.weighted_policy_loss(logp, pb.old_logp, pb.pos_weight, pb.neg_weight,
                                              pb.weight, ref_logp=pb.ref_logp, entropy=ent, **kw)
    return loss, losses.finalize_metrics(stats)

  leaf_vg = jax.jit(jax.value_and_grad(leaf_loss, has_aux=True))
  packed_vg = jax.jit(jax.value_and_grad(packed_loss, has_aux=True))
  for mode in losses.AGGREGATIONS:
    w = losses.leaf_token_weights(jnp.asarray(lb.loss_mask), lb.group_ids, mode)
    pos, neg = losses.split_by_sign(lb.advantages, w)
    pb = batches.pack_trees(trees, seq_len=64, max_nodes=24, aggregation=mode, rows=5)
    (l1, m1), g1 = leaf_vg(params, pos, neg, w)
    (l2, m2), g2 = packed_vg(params, pb)
    np.testing.assert_allclose(float(l2), float(l1), rtol=1e-5, err_msg=mode)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale, err_msg=mode)
    for k in ("clip_frac", "kl", "entropy", "ratio_max", "ratio_min"):
      np.testing.assert_allclose(float(m2[k]), float(m1[k]), rtol=1e-5, err_msg=f"{mode} {k}")
    assert 0.1 < float(m1["clip_frac"]) < 0.9, "clipping should be active on part of the tokens"
    assert (lb.advantages > 0).any() and (lb.advantages < 0).any()
  assert leaf_vg._cache_size() == 1 and packed_vg._cache_size() == 1  # traced once


def test_attention_implementations_agree_on_a_packed_batch():
  vocab = 64
  rng = np.random.default_rng(5)
  model = Transformer(tiny(vocab), rngs=nnx.Rngs(1))
  trees = [synthetic.random_tree(rng, 5, vocab) for _ in range(3)]
  pb = batches.pack_trees(trees, seq_len=48, max_nodes=16, block=8)
  assert pb.kv_blocks.shape[2] < 6, "the block lists should skip blocks of other branches"
  mask = batches.packed_attention_mask(pb.node_ids, pb.ancestors)
  kw = dict(positions=pb.positions, pred_index=pb.pred_index, attention_mask=mask)
  ein = sequence_logprobs(model, pb.tokens, attention="einsum", **kw)[0]
  xla = sequence_logprobs(model, pb.tokens, attention="xla", **kw)[0]
  chunked = sequence_logprobs(model, pb.tokens, attention="einsum", logits_chunk=7, **kw)[0]
  layout = block_visibility(pb.node_ids, pb.ancestors, pb.kv_blocks)
  block = lambda i, q, k, v, s: (tree_block_attention(q, k, v, layout), s)
  sparse = sequence_logprobs(model, pb.tokens, attend=block, **kw)[0]
  real = pb.node_ids >= 0
  np.testing.assert_allclose(np.asarray(sparse)[real], np.asarray(ein)[real], atol=1e-5)
  np.testing.assert_allclose(np.asarray(xla)[real], np.asarray(ein)[real], atol=1e-5)
  np.testing.assert_allclose(np.asarray(chunked)[real], np.asarray(ein)[real], atol=1e-5)
  lb = batches.leaf_batch(trees, seq_len=32)
  causal_xla = sequence_logprobs(model, lb.tokens, attention="xla")[0]
  causal_ein = sequence_logprobs(model, lb.tokens, attention="einsum", remat="full")[0]
  np.testing.assert_allclose(np.asarray(causal_xla)[:, 1:], np.asarray(causal_ein)[:, 1:],
                             atol=1e-5)


@pytest.mark.parametrize("group_blocks", [1, 2, 4, 64])
@pytest.mark.parametrize("full_width", [False, True])
def test_causal_groups_of_the_block_attention_equal_dense_masked_attention(group_blocks,
                                                                           full_width):
  """Each causal group reads only the first min(width, hi) entries of its blocks' lists: the
  output and its gradient equal dense attention under the packed mask, whatever the grouping
  and whether the lists are as wide as the row or as the batch's need."""
  rng = np.random.default_rng(8)
  trees = [synthetic.patr_tree(rng, prompt=8, action=5, obs=3, vocab=64, group_id=g)
           for g in range(3)]
  pb = batches.pack_trees(trees, seq_len=256, max_nodes=64, block=16)
  kv = pb.kv_blocks
  if full_width:
    kv = np.pad(kv, ((0, 0), (0, 0), (0, kv.shape[1] - kv.shape[2])), constant_values=-1)
  assert 1 < pb.kv_blocks.shape[2] < kv.shape[1] or full_width
  b, t = pb.tokens.shape
  q = jnp.asarray(rng.normal(size=(b, t, 4, 8)), jnp.float32)
  k, v = (jnp.asarray(rng.normal(size=(b, t, 2, 8)), jnp.float32) for _ in range(2))
  mask = batches.packed_attention_mask(pb.node_ids, pb.ancestors)
  real = np.asarray(pb.node_ids >= 0)
  dense = lambda q, k, v: (dense_attention(q, k, v, mask) ** 2 * real[..., None, None]).sum()  # noqa: E731

  def sparse(q, k, v):
    layout = block_visibility(pb.node_ids, pb.ancestors, kv, group_blocks)
    return (tree_block_attention(q, k, v, layout) ** 2 * real[..., None, None]).sum()
  assert len(block_visibility(pb.node_ids, pb.ancestors, kv, group_blocks)) == \
      -(-kv.shape[1] // group_blocks)
  want, want_g = jax.value_and_grad(dense, argnums=(0, 1, 2))(q, k, v)
  got, got_g = jax.value_and_grad(sparse, argnums=(0, 1, 2))(q, k, v)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)
  for a, w in zip(got_g, want_g):
    np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_merging_shared_prompts_keeps_the_loss_and_packs_fewer_tokens():
  vocab = 64
  rng = np.random.default_rng(2)
  trees = [synthetic.tree_grpo_tree(rng, steps=3, prompt=6, action=3, obs=2, vocab=vocab,
                                    group_id=g) for g in range(2) for _ in range(2)]
  merged = batches.merge_shared_roots(trees)
  assert len(merged) == 2
  assert sum(len(t.tokens) for t in merged) == sum(len(t.tokens) for t in trees) - 2 * 6
  assert sum(len(t.leaves()) for t in merged) == sum(len(t.leaves()) for t in trees)
  model = Transformer(tiny(vocab), rngs=nnx.Rngs(1))
  for mode in ("traj_mean_group_mean", "token_mean"):
    out = []
    for share in (False, True):
      pb = batches.pack_trees(trees, seq_len=128, max_nodes=64, aggregation=mode,
                              share_prompts=share)
      logp = _model_logp(model, pb)
      out.append(losses.weighted_policy_loss(logp, pb.old_logp, pb.pos_weight, pb.neg_weight,
                                             pb.weight, ref_logp=pb.ref_logp, kl_coef=0.1,
                                             **CLIP)[0])
    np.testing.assert_allclose(float(out[1]), float(out[0]), rtol=1e-5)


def test_shared_prompts_merge_only_when_the_row_has_room():
  rng = np.random.default_rng(4)
  trees = [synthetic.tree_grpo_tree(rng, steps=2, prompt=6, action=3, obs=2, vocab=64,
                                    group_id=0) for _ in range(3)]
  biggest = max(len(t.tokens) for t in trees)
  # Rows sized for one tree: nothing can merge, packing still succeeds (one tree per row).
  pb = batches.pack_trees(trees, seq_len=biggest, max_nodes=64, rows=3)
  assert (pb.node_ids[:, 0] == 0).all()
  merged = batches.merge_shared_roots(trees, max_tokens=2 * biggest)
  assert len(merged) == 2 and len(merged[0].tokens) <= 2 * biggest
  assert len(batches.merge_shared_roots(trees)) == 1


def test_kv_block_lists_are_the_blocks_with_visible_keys():
  rng = np.random.default_rng(6)
  trees = [synthetic.patr_tree(rng, prompt=8, action=5, obs=3, vocab=64, group_id=g)
           for g in range(3)]
  pb = batches.pack_trees(trees, seq_len=512, max_nodes=128, block=8)
  mask = np.asarray(batches.packed_attention_mask(pb.node_ids, pb.ancestors))
  b, t = pb.tokens.shape
  nb = pb.kv_blocks.shape[1]
  width = pb.kv_blocks.shape[2]
  assert width in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32) and width < nb   # rounded; well below nb
  for r in range(b):
    visible = mask[r].reshape(nb, t // nb, nb, t // nb).any(axis=(1, 3))
    for j in range(nb):
      got = {int(x) for x in pb.kv_blocks[r, j] if x >= 0}
      assert set(np.nonzero(visible[j])[0]) <= got <= set(np.nonzero(visible[j])[0]) | {j}


@pytest.mark.parametrize("algo", ["patr", "tree_random", "grpo"])
def test_the_group_methods_default_weighs_a_4_leaf_and_a_6_leaf_prompt_equally(algo):
  from configs import frozenlake
  agg = frozenlake.get_config(f"algo={algo}").learner.aggregation
  lengths = np.array([3, 5, 2, 7, 4, 4, 1, 9, 2, 6], np.float32)   # loss tokens per leaf
  groups = np.array([0] * 4 + [1] * 6)
  w = np.asarray(losses.leaf_weights(lengths, groups, agg))
  per_prompt = [float((w * lengths)[groups == g].sum()) for g in (0, 1)]
  np.testing.assert_allclose(per_prompt, [0.5, 0.5], rtol=1e-6)
  # within a prompt every leaf weighs 1/G, whatever its length (PATR: 1/G sum_i 1/|tau_i| sum_t)
  np.testing.assert_allclose((w * lengths)[groups == 1], 1 / 12, rtol=1e-6)
  # the per-trajectory mean over the batch gives the 6-leaf prompt 1.5x the other's weight
  old = np.asarray(losses.leaf_weights(lengths, groups, "traj_mean")) * lengths
  assert abs(old[groups == 1].sum() / old[groups == 0].sum() - 1.5) < 1e-5


def test_tree_grpo_default_is_the_public_codes_token_mean():
  from configs import frozenlake
  agg = frozenlake.get_config("algo=tree_grpo").learner.aggregation
  lengths = np.array([3, 5, 2, 7], np.float32)
  np.testing.assert_allclose(np.asarray(losses.leaf_weights(lengths, np.zeros(4), agg)), 1 / 17)


def _hand_tree():
  """root(2) -> a(3) -> {b(4), c(4)};  root -> d(5): three leaves b, c, d."""
  lens = [2, 3, 4, 4, 5]
  ends = np.cumsum(lens)
  n_tok = int(ends[-1])
  mask = np.ones(n_tok, bool)
  mask[:2] = False
  return batches.TrainTree(parent=[-1, 0, 1, 1, 0], spans=np.stack([ends - lens, ends], 1),
                           tokens=np.arange(1, n_tok + 1), loss_mask=mask,
                           old_logp=np.zeros(n_tok, np.float32),
                           advantages=np.array([0, 0, 1.0, -1.0, 2.0], np.float32))


@pytest.mark.parametrize("row_tokens, per_leaf, expect", [
    (10, False, [list(range(1, 10)), [1, 2, 3, 4, 5, 10, 11, 12, 13], [1, 2, 14, 15, 16, 17, 18]]),
    (14, False, [list(range(1, 14)), [1, 2, 14, 15, 16, 17, 18]]),
    (18, False, [list(range(1, 19))]),
    (18, True, [list(range(1, 10)), [1, 2, 3, 4, 5, 10, 11, 12, 13], [1, 2, 14, 15, 16, 17, 18]]),
])
def test_pieces_cut_a_tree_into_whole_paths_that_fit_a_row(row_tokens, per_leaf, expect):
  tree = _hand_tree()
  w = {2: 0.5, 3: 0.25, 4: 1.0}
  pieces = batches._pieces(tree, w, row_tokens, 16, per_leaf)
  assert [p.tokens.tolist() for p, _ in pieces] == expect
  # every leaf exactly once, with its weight and its advantage
  got = sorted((wl, float(p.advantages[leaf])) for p, pw in pieces for leaf, wl in pw.items())
  assert got == sorted((w[l], float(tree.advantages[l])) for l in w)
  with pytest.raises(ValueError, match="learner.row_tokens"):
    batches._pieces(tree, w, 8, 16, per_leaf)


@pytest.mark.parametrize("per_leaf", [False, True])
def test_fixed_shape_microbatches_sum_to_the_per_leaf_loss(per_leaf):
  """Trees cut to fit 40-token rows, 2 rows per micro-batch: the summed loss and gradient of
  the micro-batches equal the per-leaf batch's (fp32; every aggregation)."""
  vocab = 64
  rng = np.random.default_rng(1)
  model = Transformer(tiny(vocab), rngs=nnx.Rngs(3))
  graph, params = nnx.split(model)
  trees = [synthetic.random_tree(rng, int(rng.integers(1, 9)), vocab, max_len=4, group_id=g // 3)
           for g in range(9)]
  lb = batches.leaf_batch(trees, seq_len=48)
  kw = dict(kl_coef=0.05, entropy_coef=0.0, **CLIP)

  def leaf_loss(params, pos, neg, w):
    logp, _ = sequence_logprobs(nnx.merge(graph, params), lb.tokens)
    return losses.weighted_policy_loss(logp, lb.old_logp, pos, neg, w, ref_logp=lb.ref_logp, **kw)[0]

  def packed_loss(params, pb):
    layout = block_visibility(pb.node_ids, pb.ancestors, pb.kv_blocks)
    attend = lambda i, q, k, v, s: (tree_block_attention(q, k, v, layout), s)  # noqa: E731
    logp, _ = sequence_logprobs(nnx.merge(graph, params), pb.tokens, positions=pb.positions,
                                pred_index=pb.pred_index, attend=attend)
    return losses.weighted_policy_loss(logp, pb.old_logp, pb.pos_weight, pb.neg_weight,
                                       pb.weight, ref_logp=pb.ref_logp, **kw)[0]

  leaf_vg = jax.jit(jax.value_and_grad(leaf_loss))
  packed_vg = jax.jit(jax.value_and_grad(packed_loss))
  for mode in ("traj_mean_group_mean", "token_mean"):
    w = losses.leaf_token_weights(jnp.asarray(lb.loss_mask), lb.group_ids, mode)
    pos, neg = losses.split_by_sign(lb.advantages, w)
    mbs = batches.pack_microbatches(trees, 40, 2, aggregation=mode, per_leaf=per_leaf, block=8)
    assert len(mbs) >= 2 and len({mb.tokens.shape for mb in mbs}) == 1
    packed = sum(int((mb.node_ids >= 0).sum()) for mb in mbs)
    trained = lb.loss_mask.any(axis=1)   # leaves without a loss token are not packed
    leaf_tokens = int((lb.tokens[trained] > 0).sum())   # synthetic tokens are >= 1
    assert packed == leaf_tokens if per_leaf else packed < leaf_tokens
    l1, g1 = leaf_vg(params, pos, neg, w)
    parts = [packed_vg(params, mb) for mb in mbs]
    l2 = sum(float(l) for l, _ in parts)
    g2 = jax.tree.map(lambda *g: sum(g), *[g for _, g in parts])
    np.testing.assert_allclose(l2, float(l1), rtol=1e-5, err_msg=mode)
    scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1))
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale, err_msg=mode)
  assert packed_vg._cache_size() == 1   # one shape for every micro-batch of every aggregation


@pytest.mark.parametrize("remat", ["full", "dots"])
def test_rematerialised_layers_run_as_one_scan_with_the_unrolled_values_and_gradients(remat):
  """With remat the layers run as one `lax.scan` over their stacked weights (one layer's
  temporaries live at a time in the backward pass); log-probs and every weight's gradient equal
  the plain unrolled forward."""
  vocab = 64
  model = Transformer(tiny(vocab), rngs=nnx.Rngs(3))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, vocab, (2, 12)), jnp.int32)
  graph, params = nnx.split(model)

  def loss(params, remat):
    return sequence_logprobs(nnx.merge(graph, params), tokens, attention="einsum",
                             remat=remat)[0][:, 1:].sum()

  lowered = jax.jit(loss, static_argnums=1).lower(params, remat).as_text()
  assert lowered.count("stablehlo.while") >= 1, "the layers should be one scan"
  (l0, g0), (l1, g1) = (jax.value_and_grad(loss)(params, r) for r in ("none", remat))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  scale = max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g0))
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5 * scale)
