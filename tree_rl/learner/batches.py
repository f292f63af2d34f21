"""Training batch formats and the converters from a tree description.

Two device formats, both `flax.struct` dataclasses of arrays (jax pytrees):

`LeafBatch` -- one row per trajectory (leaf), shared prefixes repeated in every row:
  tokens     int32 [N, T]   root-to-leaf tokens, right-padded
  loss_mask  bool  [N, T]   True on the policy's own tokens (never prompt/observation/padding;
                            never column 0, which has no context)
  old_logp   f32   [N, T]   log p_old(tokens[t] | tokens[:t]) from the sampling policy
  ref_logp   f32   [N, T]   the same under the frozen reference policy (zeros when KL is off)
  advantages f32   [N]      per-trajectory advantage ([N, T] per token for per-node advantages)
  group_ids  int32 [N]      group (prompt) id, for the 'traj_mean_group_mean' aggregation

`PackedBatch` -- each tree node's tokens once, several trees per row:
  tokens      int32 [B, T]     packed tokens (parents before children), 0 on padding
  positions   int32 [B, T]     position of the token in its root-to-leaf path (RoPE position)
  pred_index  int32 [B, T]     packed index of the token's predecessor on its path: the logits
                               there predict this token (a node's first token points at the
                               last token of its parent)
  node_ids    int32 [B, T]     row-local node index of each token, -1 on padding
  ancestors   bool  [B, M, M]  ancestors[b, i, j]: node j is node i or one of its ancestors
  old_logp, ref_logp f32 [B, T] as above, aligned with `tokens`
  pos_weight  f32   [B, T]     sum over valid leaves below the token with A > 0 of w_leaf * A
  neg_weight  f32   [B, T]     sum over valid leaves below the token with A < 0 of w_leaf * |A|
  weight      f32   [B, T]     sum over valid leaves below the token of w_leaf (KL/entropy weight)
  loss_mask   bool  [B, T]
  kv_blocks   int32 [B, T // block, A]  key blocks each query block may see (-1 pads), for the
                               block-sparse tree attention (`tree_attention`)
w_leaf is the aggregation's per-token weight of that leaf (`losses.leaf_token_weights`), so the
packed loss is exactly the per-leaf loss; see `losses`.

The host-side tree description is `TrainTree` (numpy): node parent array, per-node token spans into a
flat token array, per-token loss mask and log-probs, per-leaf advantages and a group id.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.buckets import fine_bucket, pow2_bucket
from tree_rl.learner.losses import check_aggregation, leaf_weights
from tree_rl.learner.tree_attention import kv_block_lists


@struct.dataclass
class LeafBatch:
  tokens: jax.Array
  loss_mask: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  advantages: jax.Array
  group_ids: jax.Array


@struct.dataclass
class PackedBatch:
  tokens: jax.Array
  positions: jax.Array
  pred_index: jax.Array
  node_ids: jax.Array
  ancestors: jax.Array
  old_logp: jax.Array
  ref_logp: jax.Array
  pos_weight: jax.Array
  neg_weight: jax.Array
  weight: jax.Array
  loss_mask: jax.Array
  kv_blocks: jax.Array


@dataclasses.dataclass
class TrainTree:
  """One rollout tree on the host.

  parent         int [n]     parent node (-1 for the root; parent[i] < i, one root at node 0)
  spans          int [n, 2]  [start, end) of node i's tokens in `tokens`
  tokens         int [L]
  loss_mask      bool [L]    True on the policy's own tokens
  old_logp       f32 [L]     log-prob of each token given its root-to-node context (sampling policy)
  advantages     f32 [n]     advantage of each leaf (read at leaves only), or f32 [n, D]: per leaf,
                             the advantage of each node on its root-to-leaf path (column k: the
                             path's k-th node, root 0; D >= the longest path, max_turns + 1 from
                             a rollout), for step-level estimators
  ref_logp       f32 [L]     reference policy's log-probs (None: zeros)
  group_id       int         prompt id of the tree
  leaf_valid     bool [n]    leaves to train on (None: every leaf)
  """

  parent: np.ndarray
  spans: np.ndarray
  tokens: np.ndarray
  loss_mask: np.ndarray
  old_logp: np.ndarray
  advantages: np.ndarray
  ref_logp: np.ndarray | None = None
  group_id: int = 0
  leaf_valid: np.ndarray | None = None

  def __post_init__(self):
    self.parent = np.asarray(self.parent, np.int64)
    self.spans = np.asarray(self.spans, np.int64).reshape(-1, 2)
    n = len(self.parent)
    if n == 0 or self.parent[0] != -1 or np.any(self.parent[1:] < 0) or np.any(
        self.parent[1:] >= np.arange(1, n)):
      raise ValueError("TrainTree.parent must have the root at node 0 (-1) and parent[i] < i for i > 0")
    if self.spans.shape[0] != n:
      raise ValueError(f"TrainTree.spans has {self.spans.shape[0]} rows for {n} nodes")
    length = len(self.tokens)
    for name in ("loss_mask", "old_logp") + (("ref_logp",) if self.ref_logp is not None else ()):
      if len(getattr(self, name)) != length:
        raise ValueError(f"TrainTree.{name} has length {len(getattr(self, name))}, tokens {length}")
    if len(self.advantages) != n:
      raise ValueError(f"TrainTree.advantages needs one value per node ({n}), got {len(self.advantages)}")
    if np.any(self.spans[:, 0] > self.spans[:, 1]) or np.any(self.spans < 0) or np.any(
        self.spans > length):
      raise ValueError("TrainTree.spans must be [start, end) ranges inside tokens")
    if self.spans[0, 1] > self.spans[0, 0] and self.loss_mask[self.spans[0, 0]]:
      raise ValueError("TrainTree.loss_mask must be False on the root's first token (it has no context)")

  @property
  def num_nodes(self) -> int:
    return len(self.parent)

  def leaves(self) -> np.ndarray:
    has_child = np.zeros(self.num_nodes, bool)
    has_child[self.parent[1:]] = True
    leaf = ~has_child
    if self.leaf_valid is not None:
      leaf &= np.asarray(self.leaf_valid, bool)
    return np.nonzero(leaf)[0]

  def path(self, node: int) -> list[int]:
    out = []
    while node >= 0:
      out.append(int(node))
      node = self.parent[node]
    return out[::-1]

  def node_slice(self, node: int) -> slice:
    return slice(int(self.spans[node, 0]), int(self.spans[node, 1]))

  def path_tokens(self, node: int) -> np.ndarray:
    """Indices into the flat arrays of the tokens on the root-to-node path, in order."""
    parts = [np.arange(*self.spans[i]) for i in self.path(node)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _ref(tree: TrainTree) -> np.ndarray:
  return tree.ref_logp if tree.ref_logp is not None else np.zeros(len(tree.tokens), np.float32)


def path_advantages(tree: TrainTree, leaf: int) -> list[tuple[int, float]]:
  """(node, advantage) for every node on `leaf`'s root-to-leaf path: the leaf's advantage
  everywhere, or each node's own for per-node (step-level) advantages."""
  path = tree.path(leaf)
  a = np.asarray(tree.advantages[leaf], np.float32)
  if a.ndim == 0:
    return [(node, float(a)) for node in path]
  return [(node, float(a[k])) for k, node in enumerate(path)]


def leaf_batch(trees: list[TrainTree], seq_len: int, rows: int | None = None) -> LeafBatch:
  """Materialise every valid leaf of `trees` as its own row (the per-leaf format).

  `rows` pads the batch with empty rows (all-False loss mask) to a fixed row count.
  """
  items = [(t, leaf) for t in trees for leaf in t.leaves()]
  n = rows if rows is not None else len(items)
  if len(items) > n:
    raise ValueError(f"leaf_batch: {len(items)} leaves do not fit rows={n}")
  tokens = np.zeros((n, seq_len), np.int32)
  mask = np.zeros((n, seq_len), bool)
  old = np.zeros((n, seq_len), np.float32)
  ref = np.zeros((n, seq_len), np.float32)
  per_node = any(np.ndim(t.advantages) == 2 for t in trees)
  adv = np.zeros((n, seq_len) if per_node else n, np.float32)   # per token when per node
  gid = np.zeros(n, np.int32)
  for r, (t, leaf) in enumerate(items):
    idx = t.path_tokens(leaf)
    if len(idx) > seq_len:
      raise ValueError(f"leaf_batch: a leaf has {len(idx)} tokens > seq_len={seq_len}")
    k = len(idx)
    tokens[r, :k] = t.tokens[idx]
    mask[r, :k] = t.loss_mask[idx]
    old[r, :k] = t.old_logp[idx]
    ref[r, :k] = _ref(t)[idx]
    if per_node:
      adv[r, :k] = np.concatenate([np.full(t.spans[node, 1] - t.spans[node, 0], a, np.float32)
                                   for node, a in path_advantages(t, leaf)])
    else:
      adv[r] = t.advantages[leaf]
    gid[r] = t.group_id
  return LeafBatch(tokens=tokens, loss_mask=mask, old_logp=old, ref_logp=ref, advantages=adv,
                   group_ids=gid)


def merge_shared_roots(trees: list[TrainTree], max_tokens: int | None = None,
                       max_nodes: int | None = None) -> list[TrainTree]:
  """Merge trees of one group whose roots are the same prompt (same tokens and log-probs, no
  loss tokens) into one tree, so the prompt is packed once (Tree-GRPO's M trees per prompt).
  Training on the result gives the same loss and gradient: the leaves do not change. A merge
  that would exceed `max_tokens` tokens or `max_nodes` nodes is not made."""
  out: list[TrainTree] = []
  index: dict[tuple, int] = {}
  for t in trees:
    root = t.node_slice(0)
    key = (t.group_id, t.tokens[root].tobytes(), t.old_logp[root].tobytes(),
           _ref(t)[root].tobytes())
    if t.loss_mask[root].any() or t.num_nodes == 1 or key not in index:
      index.setdefault(key, len(out))
      out.append(t)
      continue
    base = out[index[key]]
    n, length = base.num_nodes, len(base.tokens)
    root_len = root.stop - root.start
    if ((max_tokens is not None and length + len(t.tokens) - root_len > max_tokens)
        or (max_nodes is not None and n + t.num_nodes - 1 > max_nodes)):
      index[key] = len(out)   # later trees of this prompt merge into this one instead
      out.append(t)
      continue
    keep = np.arange(1, t.num_nodes)
    parent = np.where(t.parent[keep] == 0, 0, t.parent[keep] - 1 + n)
    flat = np.concatenate([np.arange(*t.spans[i]) for i in keep]).astype(np.int64)
    lens = t.spans[keep, 1] - t.spans[keep, 0]
    ends = length + np.cumsum(lens)
    spans = np.stack([ends - lens, ends], axis=1)
    valid = lambda x: (np.asarray(x.leaf_valid, bool) if x.leaf_valid is not None
                       else np.ones(x.num_nodes, bool))
    out[index[key]] = TrainTree(
        parent=np.concatenate([base.parent, parent]), spans=np.concatenate([base.spans, spans]),
        tokens=np.concatenate([base.tokens, t.tokens[flat]]),
        loss_mask=np.concatenate([base.loss_mask, t.loss_mask[flat]]),
        old_logp=np.concatenate([base.old_logp, t.old_logp[flat]]),
        ref_logp=np.concatenate([_ref(base), _ref(t)[flat]]),
        advantages=np.concatenate([base.advantages, t.advantages[keep]]),
        group_id=base.group_id, leaf_valid=np.concatenate([valid(base), valid(t)[keep]]))
  return out


@dataclasses.dataclass(frozen=True)
class BatchTotals:
  """Batch-wide counts the aggregations normalise by: valid leaves, their loss tokens (summed
  per leaf), and groups with a valid leaf. With several hosts, pack each host's trees with the
  totals of the whole batch (`global_totals`), so every host weighs its leaves the same way."""

  num_leaves: float
  num_tokens: float
  num_groups: float


def _valid_lengths(trees: list[TrainTree]) -> list[dict[int, float]]:
  lengths = [{int(l): float(t.loss_mask[t.path_tokens(l)].sum()) for l in t.leaves()}
             for t in trees]
  return [{l: n for l, n in d.items() if n > 0} for d in lengths]


def batch_totals(trees: list[TrainTree]) -> BatchTotals:
  """This process's totals (groups must not straddle processes)."""
  valid = _valid_lengths(trees)
  groups = {t.group_id for t, d in zip(trees, valid) if d}
  return BatchTotals(num_leaves=float(sum(len(d) for d in valid)),
                     num_tokens=float(sum(sum(d.values()) for d in valid)),
                     num_groups=float(len(groups)))


def global_totals(trees: list[TrainTree]) -> BatchTotals:
  """`batch_totals` summed over all processes (a collective: every process must call it)."""
  from jax.experimental import multihost_utils
  local = batch_totals(trees)
  arr = np.array([local.num_leaves, local.num_tokens, local.num_groups], np.float64)
  total = np.asarray(multihost_utils.process_allgather(arr)).reshape(-1, 3).sum(0)
  return BatchTotals(*map(float, total))


_weights_jit = jax.jit(leaf_weights, static_argnames=("aggregation",))


def _leaf_weights(trees: list[TrainTree], aggregation: str,
                  totals: BatchTotals | None = None) -> list[dict[int, float]]:
  """Per tree, {leaf: w_leaf} for the aggregation (`losses.leaf_weights`, as the per-leaf rows
  are weighed on device)."""
  check_aggregation(aggregation)
  valid = _valid_lengths(trees)
  items = [(i, leaf, n) for i, d in enumerate(valid) for leaf, n in d.items()]
  totals = totals or batch_totals(trees)
  if not items:
    return [{} for _ in trees]
  # padded (length 0: weight 0, in no group) to one shape for every step up to 1,024 leaves (a
  # step with fewer leaves than the last would otherwise build a program mid-run), then powers
  # of two
  size = pow2_bucket(len(items), lo=1024)
  lengths = np.zeros(size, np.float32)
  groups = np.zeros(size, np.int32)
  lengths[:len(items)] = [n for *_, n in items]
  groups[:len(items)] = [trees[i].group_id for i, *_ in items]
  w = np.asarray(_weights_jit(lengths, groups, aggregation, num_leaves=totals.num_leaves,
                              num_tokens=totals.num_tokens, num_groups=totals.num_groups))
  out: list[dict[int, float]] = [{} for _ in trees]
  for (i, leaf, _), wl in zip(items, w):
    out[i][leaf] = float(wl)
  return out


def pack_trees(trees: list[TrainTree], seq_len: int, max_nodes: int, *, aggregation: str = "traj_mean",
               rows: int | None = None, block: int | None = None,
               max_kv_blocks: int | None = None, share_prompts: bool = True,
               totals: BatchTotals | None = None) -> PackedBatch:
  """Pack trees (whole trees, first fit, in order) into rows of `seq_len` tokens and at most
  `max_nodes` nodes; `rows` pads to a fixed row count. Weights follow `aggregation` over all the
  valid leaves given, exactly as `leaf_batch` + `losses.leaf_token_weights` would weigh them.

  `block` (default: the largest of 32, 16, ... dividing seq_len) is the block size of the
  block-sparse tree attention and `max_kv_blocks` its fixed key-block width (default: the
  batch's need rounded up to 2^k or 3 * 2^k, at most seq_len // block, so shapes, and
  compilations, repeat across steps).
  `share_prompts` packs the common prompt of a group's trees once (`merge_shared_roots`).
  `totals` (default: these trees' `batch_totals`) sets the normalisers; pass `global_totals`
  when each host packs its own share of the batch.
  """
  trees = [depth_first(t) for t in trees]     # subtrees contiguous in the row
  if share_prompts:
    trees = merge_shared_roots(trees, seq_len, max_nodes)
  leaf_w = _leaf_weights(trees, aggregation, totals)
  for i, t in enumerate(trees):
    if len(t.tokens) > seq_len or t.num_nodes > max_nodes:
      raise ValueError(f"pack_trees: tree {i} has {len(t.tokens)} tokens / {t.num_nodes} nodes; "
                       f"seq_len={seq_len}, max_nodes={max_nodes}")
  placed = _first_fit(trees, range(len(trees)), seq_len, max_nodes)
  b = rows if rows is not None else len(placed)
  if len(placed) > b:
    raise ValueError(f"pack_trees: the trees need {len(placed)} rows > rows={b}")
  arrays = _empty_rows(b, seq_len, max_nodes)
  _fill_rows(arrays, placed, list(zip(trees, leaf_w)))
  return _finish(arrays, seq_len, block, max_kv_blocks)


def _first_fit(trees: list[TrainTree], order, seq_len: int, max_nodes: int) -> list[list[int]]:
  """Indices of `trees` per row, each placed (in `order`) in the first row with room."""
  placed: list[list[int]] = []
  used: list[tuple[int, int]] = []
  for i in order:
    size, nodes = len(trees[i].tokens), trees[i].num_nodes
    for r, (tok, nod) in enumerate(used):
      if tok + size <= seq_len and nod + nodes <= max_nodes:
        placed[r].append(i)
        used[r] = (tok + size, nod + nodes)
        break
    else:
      placed.append([i])
      used.append((size, nodes))
  return placed


def _fill_rows(arrays: dict, placed: list[list[int]], items: list[tuple[TrainTree, dict]]):
  """Write items[i] (tree, leaf weights) for every i of row r of `placed` into row r."""
  for r, members in enumerate(placed):
    cursor = node_base = 0
    for i in members:
      cursor = _fill_tree(arrays, r, cursor, node_base, *items[i])
      node_base += items[i][0].num_nodes


def _preorder(tree: TrainTree, keep) -> list[int]:
  """The nodes of `keep` (closed under parents) in depth-first preorder, children ascending."""
  children: dict[int, list[int]] = {}
  for n in sorted(keep):
    if tree.parent[n] >= 0:
      children.setdefault(int(tree.parent[n]), []).append(n)
  order, stack = [], [0]
  while stack:
    n = stack.pop()
    order.append(n)
    stack.extend(reversed(children.get(n, [])))
  return order


def _renumbered(tree: TrainTree, order: list[int], valid: np.ndarray) -> TrainTree:
  """`tree` restricted to the nodes of `order` (parents first), numbered in that order, its
  tokens laid out node after node; `valid`: the new leaf_valid."""
  new = {old: i for i, old in enumerate(order)}
  parent = np.array([-1 if tree.parent[o] < 0 else new[int(tree.parent[o])] for o in order])
  flat = np.concatenate([np.arange(*tree.spans[o]) for o in order]).astype(np.int64)
  lens = tree.spans[order, 1] - tree.spans[order, 0]
  ends = np.cumsum(lens)
  return TrainTree(parent=parent, spans=np.stack([ends - lens, ends], axis=1),
                   tokens=tree.tokens[flat], loss_mask=tree.loss_mask[flat],
                   old_logp=tree.old_logp[flat], advantages=np.asarray(tree.advantages)[order],
                   ref_logp=_ref(tree)[flat], group_id=tree.group_id, leaf_valid=valid)


def depth_first(tree: TrainTree) -> TrainTree:
  """`tree` with its nodes renumbered (and its tokens laid out) in depth-first preorder: every
  subtree's tokens are contiguous, which the packed rows' attention relies on
  (`tree_flash.subtree_ends`). The identity on a tree already in that order."""
  order = _preorder(tree, range(tree.num_nodes))
  if order == list(range(tree.num_nodes)):
    return tree
  valid = None if tree.leaf_valid is None else np.asarray(tree.leaf_valid, bool)[order]
  return _renumbered(tree, order, valid)


def subtree(tree: TrainTree, leaves) -> tuple[TrainTree, dict[int, int]]:
  """The part of `tree` on the root-to-leaf paths of `leaves`, and {old node: new node}.
  Nodes are renumbered depth-first (parents still first), so each path's tokens sit close
  together in a packed row and the block-sparse attention reads few key blocks; exactly
  `leaves` are valid. Training on it gives those leaves the same tokens, contexts and
  advantages as in `tree`."""
  order = _preorder(tree, {n for leaf in leaves for n in tree.path(int(leaf))})
  new = {old: i for i, old in enumerate(order)}
  valid = np.zeros(len(order), bool)
  valid[[new[int(leaf)] for leaf in leaves]] = True
  return _renumbered(tree, order, valid), new


def _pieces(tree: TrainTree, weights: dict[int, float], seq_len: int, max_nodes: int,
            per_leaf: bool) -> list[tuple[TrainTree, dict[int, float]]]:
  """`tree` cut into (subtree, leaf weights) pieces of at most `seq_len` tokens and `max_nodes`
  nodes: one per weighted leaf (`per_leaf`), else as few as fit, neighbouring leaves (which
  share the most prefix) together. Nodes on no weighted leaf's path are dropped."""
  def node_len(n):
    return int(tree.spans[n, 1] - tree.spans[n, 0])
  groups: list[list[int]] = []
  nodes: set[int] = set()
  size = 0
  for leaf in sorted(weights, key=tree.path):   # depth-first order
    path = tree.path(leaf)
    if sum(map(node_len, path)) > seq_len or len(path) > max_nodes:
      raise ValueError(f"a trajectory of {sum(map(node_len, path))} tokens / {len(path)} steps does "
                       f"not fit a learner row of learner.row_tokens={seq_len} tokens / "
                       f"{max_nodes} nodes: raise learner.row_tokens")
    extra = [n for n in path if n not in nodes]
    if groups and not per_leaf and size + sum(map(node_len, extra)) <= seq_len and (
        len(nodes) + len(extra) <= max_nodes):
      groups[-1].append(leaf)
    else:
      groups.append([leaf])
      nodes, size = set(), 0
      extra = path
    nodes.update(extra)
    size += sum(map(node_len, extra))
  out = []
  for g in groups:
    piece, new = subtree(tree, g)
    out.append((piece, {new[leaf]: weights[leaf] for leaf in g}))
  return out


def pack_microbatches(trees: list[TrainTree], row_tokens: int, rows: int, *,
                      aggregation: str = "traj_mean", per_leaf: bool = False,
                      max_nodes: int | None = None, block: int = 32,
                      max_kv_blocks: int | None = None, share_prompts: bool = True,
                      totals: BatchTotals | None = None, min_batches: int = 1
                      ) -> list[PackedBatch]:
  """Micro-batches of one fixed shape, [rows, row_tokens], holding every weighted leaf of
  `trees`: the trees (or, `per_leaf`, each leaf's root-to-leaf path on its own) are cut into
  pieces that fit a row (`_pieces`) and packed first-fit by decreasing size, several per
  row, so executed tokens stay near the real ones and every step compiles the same program.
  The leaves are weighed over all of `trees` (`aggregation`, `totals`), so summing the
  micro-batches' losses and gradients gives one update over the whole batch, equal to
  `leaf_batch`'s.

  max_nodes: nodes per row (default row_tokens // 8, at least 16); max_kv_blocks: the
  block-sparse attention's key-block width (default: the batch's need in `fine_bucket`s, the
  same for every micro-batch, so a step compiles at most one new width and the attention reads
  about the blocks it needs). `min_batches` pads with empty micro-batches (multi-host: the
  same count on every process)."""
  max_nodes = max_nodes or max(16, row_tokens // 8)
  if share_prompts and not per_leaf:
    trees = merge_shared_roots(trees, row_tokens, max_nodes)
  leaf_w = _leaf_weights(trees, aggregation, totals)
  pieces = [p for t, w in zip(trees, leaf_w) if w
            for p in _pieces(t, w, row_tokens, max_nodes, per_leaf)]
  order = sorted(range(len(pieces)), key=lambda i: -len(pieces[i][0].tokens))
  placed = _first_fit([p for p, _ in pieces], order, row_tokens, max_nodes)
  count = max(-(-len(placed) // rows), int(min_batches))
  placed += [[] for _ in range(count * rows - len(placed))]
  out = []
  for b in range(count):
    arrays = _empty_rows(rows, row_tokens, max_nodes)
    _fill_rows(arrays, placed[b * rows:(b + 1) * rows], pieces)
    out.append(_finish(arrays, row_tokens, block, max_kv_blocks))
  return with_kv_width(out, max(mb.kv_blocks.shape[2] for mb in out)) if out else out


def with_kv_width(micro: list[PackedBatch], width: int) -> list[PackedBatch]:
  """The micro-batches with their key-block lists padded (-1) to one `width`."""
  pad = lambda k: np.pad(k, ((0, 0), (0, 0), (0, width - k.shape[2])), constant_values=-1)  # noqa: E731
  return [mb.replace(kv_blocks=pad(mb.kv_blocks)) for mb in micro]


def _empty_rows(b: int, seq_len: int, max_nodes: int) -> dict:
  f32 = lambda: np.zeros((b, seq_len), np.float32)  # noqa: E731
  return dict(tokens=np.zeros((b, seq_len), np.int32), positions=np.zeros((b, seq_len), np.int32),
              pred_index=np.tile(np.arange(seq_len, dtype=np.int32), (b, 1)),
              node_ids=np.full((b, seq_len), -1, np.int32),
              ancestors=np.zeros((b, max_nodes, max_nodes), bool), old_logp=f32(), ref_logp=f32(),
              pos_weight=f32(), neg_weight=f32(), weight=f32(),
              loss_mask=np.zeros((b, seq_len), bool))


def _fill_tree(a: dict, r: int, cursor: int, node_base: int, t: TrainTree,
               w: dict[int, float]) -> int:
  """Write tree `t` (leaf weights `w`) into row `r` of the arrays `a` from token `cursor`,
  its nodes numbered from `node_base`; returns the cursor after it."""
  n = t.num_nodes
  # Per-node sums over the valid leaves below it.
  node_w, node_p, node_n = np.zeros(n), np.zeros(n), np.zeros(n)
  for leaf, wl in w.items():
    for node, adv in path_advantages(t, leaf):
      node_w[node] += wl
      node_p[node] += wl * max(adv, 0.0)
      node_n[node] += wl * max(-adv, 0.0)
  depth = np.zeros(n, np.int64)   # path position of each node's first token
  last = np.full(n, -1, np.int64)  # packed index of the last token on the root-to-node path
  anc = a["ancestors"][r]
  ref = _ref(t)
  for node in range(n):
    p = t.parent[node]
    sl = t.node_slice(node)
    k = sl.stop - sl.start
    depth[node] = 0 if p < 0 else depth[p] + (t.spans[p, 1] - t.spans[p, 0])
    prev = -1 if p < 0 else last[p]
    cols = slice(cursor, cursor + k)
    a["tokens"][r, cols] = t.tokens[sl]
    a["positions"][r, cols] = depth[node] + np.arange(k)
    if k:
      a["pred_index"][r, cols] = np.concatenate([[cursor if prev < 0 else prev],
                                                 cursor + np.arange(k - 1)])
    a["node_ids"][r, cols] = node_base + node
    m = t.loss_mask[sl]
    a["loss_mask"][r, cols] = m
    a["old_logp"][r, cols] = t.old_logp[sl]
    a["ref_logp"][r, cols] = ref[sl]
    a["pos_weight"][r, cols] = m * node_p[node]
    a["neg_weight"][r, cols] = m * node_n[node]
    a["weight"][r, cols] = m * node_w[node]
    last[node] = cursor + k - 1 if k else prev
    anc[node_base + node, node_base + node] = True
    if p >= 0:
      anc[node_base + node] |= anc[node_base + p]
    cursor += k
  return cursor


def _finish(a: dict, seq_len: int, block: int | None, max_kv_blocks: int | None) -> PackedBatch:
  if block is None:
    block = next(k for k in (32, 16, 8, 4, 2, 1) if seq_len % k == 0)
  kv_blocks = kv_block_lists(a["node_ids"], a["ancestors"], block, max_kv_blocks)
  if max_kv_blocks is None:  # pad the width to 2^k or 3 * 2^k (at most every block)
    need = kv_blocks.shape[2]
    width = min(seq_len // block, fine_bucket(need))
    kv_blocks = np.pad(kv_blocks, ((0, 0), (0, 0), (0, width - need)), constant_values=-1)
  return PackedBatch(kv_blocks=kv_blocks, **a)


def packed_attention_mask(node_ids: jax.Array, ancestors: jax.Array) -> jax.Array:
  """[B, T, T] bool: query q sees key k iff k <= q and k's node is q's node or an ancestor.
  Padding tokens see only themselves."""
  t = node_ids.shape[1]
  nid = jnp.maximum(node_ids, 0)
  rows = jnp.take_along_axis(ancestors, nid[:, :, None], axis=1)          # [B, T, M]
  vis = jnp.take_along_axis(rows, jnp.broadcast_to(nid[:, None, :], rows.shape[:2] + (t,)),
                            axis=2)                                         # [B, T, T]
  real = node_ids >= 0
  causal = jnp.tril(jnp.ones((t, t), bool))
  vis = vis & causal & real[:, :, None] & real[:, None, :]
  return vis | (jnp.eye(t, dtype=bool) & ~real[:, :, None])
