"""The rollout -> learner handoff, in one place: leaves -> advantages -> training trees -> batches.

    batches = learner_batches(config, out, row_multiple=train_step.row_multiple)

`advantage_inputs` flattens a `RolloutOutput`'s group leaves for the advantage registry (with
DAPO's overlong reward shaping when configured), `step_inputs` their turns for step-level
estimators, `advantages` calls the configured estimator, `train_trees` turns each (prompt, tree)
into a host `TrainTree` carrying its leaves' advantages, and `make_batches` splits the trees into
`train.minibatches` batches (tree-packed or one row per leaf) with bucketed shapes.

Overlong shaping (DAPO; `learner.overlong_window` > 0): a trajectory's length is the tokens the
policy generated on its path (observations and tool output not counted: the recipe counts every
response token, which for its single-turn answers is the same thing), its limit L the most it
can generate (rollout.max_turns x max_tokens_per_turn) and the window W = overlong_window x L;
the outcome reward gets c (L - W - length) / W inside the last W tokens (0 before, -c at L),
c = `learner.overlong_penalty` (the recipe's penalty factor 1 on +-1 rewards is half their
range; the DAPO preset's 0.5 is half the range of 0/1 success rewards). A trajectory with a
reply cut at max_tokens_per_turn (no end-of-turn token) is "truncated":
`learner.overlong_truncated` keeps it (soft penalty only), penalises it with -c, or masks it (it
enters the advantage statistics but is not trained on: DAPO's overlong filtering).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.buckets import fine_bucket
from tree_rl.learner import advantages as advantage_lib
from tree_rl.learner.batches import TrainTree, leaf_batch, pack_microbatches, pack_trees
from tree_rl.rollout.tree import path_nodes

OVERLONG_TRUNCATED = ("keep", "penalize", "mask")


def overlong_penalty(lengths, limit: int, window: float, scale: float = 1.0) -> np.ndarray:
  """DAPO's soft length penalty of trajectories of `lengths` generated tokens under a limit of
  `limit` tokens and a window of `window` tokens: 0, then linear down to -scale at the limit."""
  lengths = np.asarray(lengths, np.float64)
  if window <= 0:
    return np.zeros(lengths.shape, np.float32)
  start = limit - window
  return (scale * np.where(lengths <= start, 0.0, np.where(
      lengths <= limit, (start - lengths) / window, -1.0))).astype(np.float32)


def leaf_lengths(out, end_of_turn_id: int, max_tokens_per_turn: int
                 ) -> tuple[np.ndarray, np.ndarray]:
  """(generated tokens [P, L], truncated [P, L]) of every group leaf's root-to-leaf path; a
  path is truncated when one of its replies ran to max_tokens_per_turn without `end_of_turn_id`."""
  t = jax.device_get(out.tree)
  leaf = np.asarray(out.leaf)
  n = t.policy_len
  last = np.take_along_axis(t.tokens, np.maximum(n - 1, 0)[..., None], axis=2)[..., 0]
  cut = (n >= max_tokens_per_turn) & (last != end_of_turn_id)
  gen = np.zeros(leaf.shape, np.int64)
  trunc = np.zeros(leaf.shape, bool)
  for p, j in zip(*np.nonzero(leaf >= 0)):
    node = int(leaf[p, j])
    while node >= 0:
      gen[p, j] += n[p, node]
      trunc[p, j] |= bool(cut[p, node])
      node = int(t.parent[p, node])
  return gen, trunc


def shaped_rewards(lc, out, *, max_turns: int, max_tokens_per_turn: int,
                   end_of_turn_id: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """(rewards [P, L] after overlong shaping, trainable [P, L]): the outcome rewards, and False
  where `overlong_truncated=mask` masks a truncated leaf. Unchanged when shaping is off.
  lc: config.learner; the rollout's turn limit and reply size bound a trajectory's tokens."""
  reward = np.asarray(out.reward, np.float32)
  train = np.ones(reward.shape, bool)
  frac = float(lc.overlong_window)
  if frac <= 0:
    return reward, train
  if end_of_turn_id is None:
    raise ValueError("overlong shaping needs the tokenizer's end_of_turn_id")
  per_turn = int(max_tokens_per_turn)
  limit = int(max_turns) * per_turn
  gen, trunc = leaf_lengths(out, end_of_turn_id, per_turn)
  scale = float(lc.overlong_penalty)
  reward = reward + overlong_penalty(gen, limit, frac * limit, scale)
  mode = lc.overlong_truncated
  if mode == "penalize":
    reward = np.where(trunc, np.asarray(out.reward, np.float32) - scale, reward)
  elif mode == "mask":
    train = ~trunc
  return reward.astype(np.float32), train


def advantage_inputs(out, rewards=None) -> dict:
  """Flat [P*L] arrays for `tree_rl.learner.advantages` estimators: rewards (`rewards` [P, L]
  when given, else the outcome rewards), prompt_ids, tree_ids (unique per prompt and tree),
  valid."""
  p, l = out.leaf.shape
  pid = jnp.broadcast_to(out.tree.prompt_id[:, None], (p, l))
  m = jnp.max(out.tree.tree_id) + 1
  r = out.reward if rewards is None else jnp.asarray(rewards, jnp.float32)
  return dict(rewards=r.reshape(-1), prompt_ids=pid.reshape(-1),
              tree_ids=(pid * m + jnp.maximum(out.tree_id, 0)).reshape(-1),
              valid=out.valid.reshape(-1))


@functools.partial(jax.jit, static_argnums=(3,))   # also traced inside `_advantages`
def _step_inputs(tree, leaf, state_key, max_turns):
  p, l = leaf.shape
  p_idx = jnp.arange(p)[:, None]
  paths = path_nodes(tree, max_turns)[p_idx, jnp.maximum(leaf, 0)]      # [P, L, D + 1] root first
  paths = jnp.where(leaf[:, :, None] >= 0, paths, -1)
  node, parent = paths[..., 1:], paths[..., :-1]
  mask = node >= 0
  at = lambda field, ids: field[p_idx[:, :, None], jnp.maximum(ids, 0)]  # noqa: E731
  flat = lambda x: x.reshape(p * l, max_turns)                          # noqa: E731
  return advantage_lib.StepInputs(
      node=flat(node), state_key=flat(jnp.where(mask, at(state_key, parent), 0)),
      reward=flat(jnp.where(mask, at(tree.reward, node), 0.0)), mask=flat(mask))


def step_inputs(out, max_turns: int) -> advantage_lib.StepInputs:
  """The turns of every group leaf, [P*L, max_turns] in `advantage_inputs` order: node ids, the
  anchor key of the state each turn acted from (its parent node's), step rewards."""
  return _step_inputs(out.tree, out.leaf, out.state_key, int(max_turns))


def advantages(lc, out, rewards=None, *, max_turns: int) -> jax.Array:
  """Advantages of `lc.advantage` (lc: config.learner, which holds its knobs) in
  `advantage_inputs` order: [P*L] per leaf, or [P*L, max_turns] per turn for a step-level
  estimator or `learner.shared_advantage=mean`.
  Computed in one jitted program per rollout shape (estimators are traced, so a registered one
  must be jittable, as every built-in is)."""
  rewards = out.reward if rewards is None else jnp.asarray(rewards, jnp.float32)
  knobs = tuple((k, _static(lc[k])) for k in sorted(advantage_lib.knobs(lc.advantage)))
  return _advantages(out.replace(reward=rewards, stats={}), lc.advantage,
                     lc.shared_advantage == "mean", int(max_turns),
                     float(lc.adv_eps), knobs)


def _static(value):
  """A knob's config value as a hashable jit static argument (lists from JSON as tuples)."""
  return tuple(map(_static, value)) if isinstance(value, (list, tuple)) else value


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))   # float statistics: fully optimised
def _advantages(out, name: str, shared: bool, max_turns: int, eps: float,
                knobs: tuple[tuple[str, object], ...]):
  inputs = advantage_inputs(out)
  steps = (step_inputs(out, max_turns) if shared or advantage_lib.is_step_level(name) else None)
  adv = advantage_lib.compute(name, **inputs, eps=eps, steps=steps, **dict(knobs))
  if shared:
    adv = advantage_lib.shared_mean(adv, inputs["prompt_ids"], inputs["valid"], steps)
  return adv


def informative_groups(out) -> np.ndarray:
  """bool [P]: prompts whose valid leaves neither all succeed nor all fail (success: outcome
  reward > 0, as every success metric here counts it). DAPO's dynamic sampling keeps these: the
  recipe filters on accuracy, so a format penalty (-0.1 against 0) or the overlong shaping does
  not make a group informative. A group of one leaf compares nothing and is not informative."""
  won = np.asarray(out.reward, np.float64) > 0
  v = np.asarray(out.valid, bool)
  return (v.sum(axis=1) > 1) & np.any(v & won, axis=1) & np.any(v & ~won, axis=1)


def train_trees(out, leaf_advantages, trainable=None, prompts=None) -> list[TrainTree]:
  """One `TrainTree` per (prompt, tree) with the leaves' advantages.

  leaf_advantages: [P * L] or [P, L] per leaf, or [P * L, D] per turn (as `advantage_inputs`
  orders them); trainable [P, L]: False leaves are not trained on; prompts: the prompt rows to
  convert (default all).
  """
  t = jax.device_get(out.tree)
  p_count, l_count = out.leaf.shape
  adv = np.asarray(leaf_advantages, np.float32)
  per_turn = adv.size != p_count * l_count
  adv = adv.reshape(p_count, l_count, -1) if per_turn else adv.reshape(p_count, l_count)
  leaf, valid = np.asarray(out.leaf), np.asarray(out.valid)
  if trainable is not None:
    valid = valid & np.asarray(trainable, bool)
  trees = []
  for p in (range(p_count) if prompts is None else prompts):
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
      # per turn: a leaf's row holds its path's nodes' advantages, root (no loss tokens) first
      node_adv = np.zeros((len(nodes), adv.shape[2] + 1) if per_turn else len(nodes), np.float32)
      leaf_valid = np.zeros(len(nodes), bool)
      for j in range(leaf.shape[1]):
        if leaf[p, j] >= 0 and int(leaf[p, j]) in local:
          node_adv[local[int(leaf[p, j])]] = np.concatenate([[0.0], adv[p, j]]) if per_turn else adv[p, j]
          leaf_valid[local[int(leaf[p, j])]] = valid[p, j]
      trees.append(TrainTree(parent=parent, spans=spans, tokens=toks, loss_mask=mask,
                             old_logp=logp.astype(np.float32), advantages=node_adv,
                             group_id=int(t.prompt_id[p]), leaf_valid=leaf_valid))
  return trees


def make_batches(lc, trees: list[TrainTree], *, minibatches: int = 1, row_multiple: int = 1
                 ) -> list:
  """Learner batches for one step (lc: config.learner): the prompts' trees split into
  `minibatches` groups (`train.minibatches`),
  each packed (learner.packed) or materialised per leaf, with rows, lengths and nodes in
  `fine_bucket`s (at most a third padding, few shapes; rows then rounded up to a multiple of
  `row_multiple`: `TrainStep.row_multiple`), so the update compiles once per bucket.

  With several processes each passes its own trees: the shapes are agreed (the largest
  bucket of any process), packed weights use the whole batch's totals, every process returns
  the same number of batches (an empty share gives padding rows), and the rows are this
  process's share of each global batch (`TrainStep.shard_batch`).

  With `learner.row_tokens` > 0 each batch is instead a list of fixed-shape micro-batches
  (`pack_microbatches`: [learner.microbatch_rows / processes, row_tokens] on each process, rows
  rounded up to a multiple of the batch shards, as many as the most any process needs), one
  update summing their gradients."""
  from tree_rl import hosts
  from tree_rl.learner.batches import batch_totals, global_totals
  procs = hosts.count()
  multiple = max(row_multiple // procs, 1) if row_multiple % procs == 0 else row_multiple
  rows_for = lambda n: -(-fine_bucket(n) // multiple) * multiple  # noqa: E731
  n = int(minibatches)
  groups = sorted({t.group_id for t in trees})
  chunks = [groups[i::n] for i in range(n)]
  batches = []
  for chunk in chunks:
    members = [t for t in trees if t.group_id in set(chunk)]
    if procs == 1 and not members:
      continue
    if int(lc.row_tokens):
      batch = _fixed_microbatches(lc, members, procs, multiple)
    elif lc.packed:
      shape = hosts.agree_max({
          "seq": fine_bucket(max([len(t.tokens) for t in members] or [1]), 64),
          "nodes": fine_bucket(max([t.num_nodes for t in members] or [1]), 8),
          "rows": rows_for(max(len(members), 1))})
      totals = global_totals(members) if procs > 1 else batch_totals(members)
      batch = pack_trees(members, shape["seq"], shape["nodes"],
                         aggregation=lc.aggregation, rows=shape["rows"],
                         block=int(lc.attention_block), totals=totals)
      width = batch.kv_blocks.shape[2]
      agreed = hosts.agree_max({"kv_blocks": width})["kv_blocks"]
      if agreed > width:   # another process's rows see more key blocks: pad to the same width
        batch = batch.replace(kv_blocks=np.pad(batch.kv_blocks, ((0, 0), (0, 0), (0, agreed - width)),
                                               constant_values=-1))
    else:
      leaves = sum(len(t.leaves()) for t in members)
      shape = hosts.agree_max({
          "seq": fine_bucket(max([len(t.path_tokens(l)) for t in members for l in t.leaves()]
                                 or [1]), 64),
          "rows": rows_for(max(leaves, 1))})
      batch = leaf_batch(members, shape["seq"], rows=shape["rows"])
    batches.append(batch)
  return batches


def _fixed_microbatches(lcfg, members: list[TrainTree], procs: int, multiple: int) -> list:
  """`pack_microbatches` of one minibatch on this process: learner.microbatch_rows / procs rows
  (rounded up to a multiple of the batch shards each process feeds), as many micro-batches as
  the most any process needs. Key-block lists are as wide as a row has blocks (the blocks a
  query block does not see are masked), so every step runs one program."""
  from tree_rl import hosts
  from tree_rl.learner.batches import batch_totals, global_totals
  kw = dict(aggregation=lcfg.aggregation, per_leaf=not lcfg.packed,
            block=int(lcfg.attention_block),
            max_kv_blocks=int(lcfg.row_tokens) // int(lcfg.attention_block),
            totals=global_totals(members) if procs > 1 else batch_totals(members))
  rows = -(-int(lcfg.microbatch_rows) // procs)
  row_tokens, rows = int(lcfg.row_tokens), -(-rows // multiple) * multiple
  out = pack_microbatches(members, row_tokens, rows, **kw)
  agreed = hosts.agree_max({"microbatches": len(out)})
  if agreed["microbatches"] > len(out):   # another process needs more: pad with empty ones
    out += pack_microbatches([], row_tokens, rows, min_batches=agreed["microbatches"] - len(out), **kw)
  return out


def rollout_trees(lc, out, *, max_turns: int, max_tokens_per_turn: int,
                  end_of_turn_id: int | None = None, prompts=None) -> list[TrainTree]:
  """A rollout's training trees (lc: config.learner): shaped rewards, advantages, `train_trees`
  (of `prompts`).

  Every prompt of the rollout is its own group, so its `prompt_id`s must be distinct (a task
  drawn twice gets two ids: `train._prompt_batch`)."""
  ids = np.asarray(out.tree.prompt_id)
  if len(np.unique(ids)) < len(ids):
    raise ValueError(f"rollout prompt ids {ids.tolist()} repeat: the copies would share one "
                     "advantage group; give every prompt of a batch its own id")
  rewards, trainable = shaped_rewards(lc, out, max_turns=max_turns,
                                      max_tokens_per_turn=max_tokens_per_turn,
                                      end_of_turn_id=end_of_turn_id)
  return train_trees(out, advantages(lc, out, rewards, max_turns=max_turns), trainable, prompts)


def learner_batches(config, out, row_multiple: int = 1, end_of_turn_id: int | None = None
                    ) -> list:
  """A rollout's learner batches: `rollout_trees`, then bucketed `make_batches`, under the
  config's learner, rollout limits and `train.minibatches` (the whole config: a convenience for
  tests and notebooks)."""
  r = config.rollout
  trees = rollout_trees(config.learner, out, max_turns=int(r.max_turns),
                        max_tokens_per_turn=int(r.max_tokens_per_turn),
                        end_of_turn_id=end_of_turn_id)
  return make_batches(config.learner, trees, minibatches=int(config.train.minibatches),
                      row_multiple=row_multiple)
