"""The rollout -> learner handoff, in one place: leaves -> advantages -> training trees -> batches.

    batches = learner_batches(config, out, row_multiple=train_step.row_multiple)

`advantage_inputs` flattens a `RolloutOutput`'s group leaves for the advantage registry,
`advantages` calls the configured estimator, `train_trees` turns each (prompt, tree) into a host
`TrainTree` carrying its leaves' advantages, and `make_batches` splits the trees into
`train.minibatches` batches (tree-packed or one row per leaf) with bucketed shapes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.buckets import fine_bucket
from tree_rl.learner import advantages as advantage_lib
from tree_rl.learner.batches import TrainTree, leaf_batch, pack_trees


def advantage_inputs(out) -> dict:
  """Flat [P*L] arrays for `tree_rl.learner.advantages` estimators: rewards, prompt_ids,
  tree_ids (unique per prompt and tree), valid."""
  p, l = out.leaf.shape
  pid = jnp.broadcast_to(out.tree.prompt_id[:, None], (p, l))
  m = jnp.max(out.tree.tree_id) + 1
  return dict(rewards=out.reward.reshape(-1), prompt_ids=pid.reshape(-1),
              tree_ids=(pid * m + jnp.maximum(out.tree_id, 0)).reshape(-1),
              valid=out.valid.reshape(-1))


def advantages(config, out) -> jax.Array:
  """Per-leaf advantages [P*L] of `config.learner.advantage` (in `advantage_inputs` order)."""
  return advantage_lib.get(config.learner.advantage)(**advantage_inputs(out),
                                                     eps=float(config.learner.adv_eps))


def train_trees(out, leaf_advantages) -> list[TrainTree]:
  """One `TrainTree` per (prompt, tree) with the leaves' advantages.

  leaf_advantages: [P * L] or [P, L] per leaf (as `advantage_inputs` orders them).
  """
  t = jax.device_get(out.tree)
  adv = np.asarray(leaf_advantages, np.float32).reshape(out.leaf.shape)
  leaf, valid = np.asarray(out.leaf), np.asarray(out.valid)
  trees = []
  for p in range(t.parent.shape[0]):
    used = np.nonzero(t.used[p])[0]
    for tid in np.unique(t.tree_id[p, used]):
      nodes = used[t.tree_id[p, used] == tid]
      local = {int(n): i for i, n in enumerate(nodes)}
      parent = np.array([local.get(int(t.parent[p, n]), -1) for n in nodes])
      lens = t.policy_len[p, nodes] + t.obs_len[p, nodes]
      ends = np.cumsum(lens)
      spans = np.stack([ends - lens, ends], axis=1)
      toks = np.concatenate([t.tokens[p, n, :k] for n, k in zip(nodes, lens)])
      mask = np.concatenate([np.arange(k) < t.policy_len[p, n] for n, k in zip(nodes, lens)])
      logp = np.concatenate([t.logprobs[p, n, :k] for n, k in zip(nodes, lens)])
      node_adv = np.zeros(len(nodes), np.float32)
      leaf_valid = np.zeros(len(nodes), bool)
      for j in range(leaf.shape[1]):
        if leaf[p, j] >= 0 and int(leaf[p, j]) in local:
          node_adv[local[int(leaf[p, j])]] = adv[p, j]
          leaf_valid[local[int(leaf[p, j])]] = valid[p, j]
      trees.append(TrainTree(parent=parent, spans=spans, tokens=toks, loss_mask=mask,
                             old_logp=logp.astype(np.float32), advantages=node_adv,
                             group_id=int(t.prompt_id[p]), leaf_valid=leaf_valid))
  return trees


def make_batches(config, trees: list[TrainTree], row_multiple: int = 1) -> list:
  """Learner batches for one step: the prompts' trees split into `train.minibatches` groups,
  each packed (learner.packed) or materialised per leaf, with rows, lengths and nodes in
  `fine_bucket`s (at most a third padding, few shapes; rows then rounded up to a multiple of
  `row_multiple`: `TrainStep.row_multiple`), so the update compiles once per bucket."""
  rows_for = lambda n: -(-fine_bucket(n) // row_multiple) * row_multiple  # noqa: E731
  n = int(config.train.minibatches)
  groups = sorted({t.group_id for t in trees})
  chunks = [groups[i::n] for i in range(n)]
  batches = []
  for chunk in chunks:
    members = [t for t in trees if t.group_id in set(chunk)]
    if not members:
      continue
    if config.learner.packed:
      seq = fine_bucket(max(len(t.tokens) for t in members), 64)
      nodes = fine_bucket(max(t.num_nodes for t in members), 8)
      batch = pack_trees(members, seq, nodes, aggregation=config.learner.aggregation,
                         rows=rows_for(len(members)), block=int(config.learner.attention_block))
    else:
      leaves = sum(len(t.leaves()) for t in members)
      seq = fine_bucket(max(len(t.path_tokens(l)) for t in members for l in t.leaves()), 64)
      batch = leaf_batch(members, seq, rows=rows_for(leaves))
    batches.append(batch)
  return batches


def learner_batches(config, out, row_multiple: int = 1) -> list:
  """A rollout's learner batches: advantages, training trees, bucketed batches.

  Every prompt of the rollout is its own group, so its `prompt_id`s must be distinct (a task
  drawn twice gets two ids: `train._prompt_batch`)."""
  ids = np.asarray(out.tree.prompt_id)
  if len(np.unique(ids)) < len(ids):
    raise ValueError(f"rollout prompt ids {ids.tolist()} repeat: the copies would share one "
                     "advantage group; give every prompt of a batch its own id")
  return make_batches(config, train_trees(out, advantages(config, out)), row_multiple)
