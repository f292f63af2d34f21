"""Synthetic rollout trees with the shapes of Tree-GRPO and PATR, for tests and benchmarks.

A node is one agent step: `action` policy tokens (in the loss) then `obs` observation tokens
(not in the loss); the root is the prompt. Log-probs and advantages are random.
"""

from __future__ import annotations

import numpy as np

from tree_rl.learner.batches import TrainTree


def _build(rng, parent, lengths, vocab, loss_first, logp_scale=1.0, group_id=0,
           shared_prompt=False):
  spans, toks, mask = [], [], []
  cursor = 0
  for node, (act, obs) in enumerate(lengths):
    k = act + obs
    spans.append((cursor, cursor + k))
    toks.append(rng.integers(1, vocab, k))
    m = np.zeros(k, bool)
    if node > 0 or loss_first:
      m[:act] = True
    mask.append(m)
    cursor += k
  tokens = np.concatenate(toks)
  loss_mask = np.concatenate(mask)
  if len(loss_mask):
    loss_mask[0] = False
  n = len(parent)
  adv = rng.normal(size=n).astype(np.float32)
  old = (-logp_scale * rng.exponential(size=cursor)).astype(np.float32)
  ref = (-logp_scale * rng.exponential(size=cursor)).astype(np.float32)
  if shared_prompt:  # the same prompt for every tree of the group
    k = lengths[0][0] + lengths[0][1]
    prng = np.random.default_rng(10_000 + group_id)
    tokens[:k] = prng.integers(1, vocab, k)
    old[:k] = -logp_scale * prng.exponential(size=k)
    ref[:k] = -logp_scale * prng.exponential(size=k)
  return TrainTree(parent=np.asarray(parent), spans=np.asarray(spans), tokens=tokens,
              loss_mask=loss_mask, old_logp=old, ref_logp=ref, advantages=adv, group_id=group_id)


def random_tree(rng: np.random.Generator, num_nodes: int, vocab: int, max_len: int = 6,
                group_id: int = 0) -> TrainTree:
  """Random parents (parent[i] < i), node lengths 0..max_len, mixed-sign advantages."""
  parent = [-1] + [int(rng.integers(0, i)) for i in range(1, num_nodes)]
  lengths = [(int(rng.integers(1, max_len + 1)), int(rng.integers(0, 3))) for _ in parent]
  return _build(rng, parent, lengths, vocab, loss_first=True, group_id=group_id)


def tree_grpo_tree(rng, *, steps=4, n=2, l=1, prompt=64, action=32, obs=32, vocab=1000,
                   group_id=0) -> TrainTree:
  """One Tree-GRPO tree: a chain of `steps` agent steps, then l*n expansions, each from a node
  picked uniformly among the root and the non-leaf nodes, running to a full episode. Trees of
  one group_id share the prompt (root) tokens."""
  parent, depth = [-1], [0]
  def grow(start):
    node = start
    for _ in range(steps - depth[start]):
      parent.append(node)
      depth.append(depth[node] + 1)
      node = len(parent) - 1
  grow(0)
  for _ in range(l):
    has_child = set(parent[1:])
    inner = [i for i in range(len(parent)) if i in has_child or i == 0]
    for _ in range(n):
      start = inner[int(rng.integers(0, len(inner)))]
      if depth[start] >= steps:
        start = parent[start]
      grow(start)
  lengths = [(0, prompt)] + [(action, obs)] * (len(parent) - 1)
  return _build(rng, parent, lengths, vocab, loss_first=False, group_id=group_id,
                shared_prompt=True)


def patr_tree(rng, *, b0=4, m=2, k=2, rounds=2, prompt=64, action=32, obs=32, vocab=1000,
              group_id=0) -> TrainTree:
  """A PATR-shaped tree: b0 branches advance k steps; then each round the top half expands
  into m children, a quarter survives and a quarter is pruned (kept as a leaf)."""
  parent = [-1]
  def advance(node):
    for _ in range(k):
      parent.append(node)
      node = len(parent) - 1
    return node
  active = [advance(0) for _ in range(b0)]
  for _ in range(rounds):
    order = list(rng.permutation(len(active)))
    nxt = []
    half = max(1, len(active) // 2)
    for j, idx in enumerate(order):
      node = active[idx]
      if j < half:
        nxt.extend(advance(node) for _ in range(m))
      elif j < half + max(0, (len(active) - half) // 2):
        nxt.append(advance(node))
    active = nxt[: 2 * b0]
  lengths = [(0, prompt)] + [(action, obs)] * (len(parent) - 1)
  return _build(rng, parent, lengths, vocab, loss_first=False, group_id=group_id)
