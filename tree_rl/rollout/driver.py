"""Run a rollout method on the engine: one loop of turns and turn-boundary decisions.

    engine = Engine(env, tokenizer, max_turns=..., max_tokens_per_turn=...)
    method = methods.get(config.rollout.method)(config.rollout)
    out, cache = run(engine, method, cache, env_states, key, scorer=scorer)

`RolloutOutput` holds the tree, the group's leaves ([P, L]: node ids, kept mask, outcome
rewards, tree ids), the per-prompt budget and statistics; `tree_rl.learner.from_rollout` turns
it into learner batches.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.compile_cache import light_jit
from tree_rl.rollout import scorers as scorer_lib
from tree_rl.rollout.budget import UNITS, Budget, CostModel, admit, check_unit, per_parent_forks
from tree_rl.rollout.engine import Engine, Layout, RolloutState
from tree_rl.rollout.methods import RolloutMethod, alive
from tree_rl.rollout.tree import Tree, gather, leaf_ids, scatter


@struct.dataclass
class RolloutOutput:
  tree: Tree
  leaf: jax.Array        # int32 [P, L] leaf node ids (-1 fill)
  valid: jax.Array       # bool [P, L] leaves in the training group
  reward: jax.Array      # float32 [P, L] outcome reward (sum of step rewards on the path)
  tree_id: jax.Array     # int32 [P, L] tree index within the prompt
  state_key: jax.Array   # int32 [P, N] env `state_key` of every node's state (anchors of step-level advantages)
  budget: Budget
  stats: dict


def _scatter_frontier(field, frontier, values):
  return scatter(field, jnp.where(frontier >= 0, frontier, -1), values)


def _admit(tree, budget, frontier, parents, limit, unit, costs: CostModel):
  """The budget cap (`budget.admit`): refused new branches of `parents` become -1."""
  if limit <= 0:
    return parents
  req = parents >= 0
  fork = per_parent_forks(parents, req, gather(tree.num_children, parents) > 0)
  go = jnp.where(alive(tree, frontier), frontier, -2)
  running = req & ~fork & jnp.any(parents[:, :, None] == go[:, None, :], axis=2)
  return admit(costs, unit, limit, budget.spent(unit), parents, running, fork,
               gather(tree.depth, parents), gather(tree.ctx_len, parents))


@light_jit(static_argnums=(0, 7, 8, 9))
def _boundary(method: RolloutMethod, tree, budget, frontier, pstate, scores, key, limit, unit,
              costs):
  go = alive(tree, frontier)
  scores = None if scores is None else scores.reshape(frontier.shape)
  parents, pstate, pruned = method.next(tree, frontier, pstate, scores, key)
  parents = _admit(tree, budget, frontier, parents, limit, unit, costs)
  continued = jnp.any(frontier[:, :, None] == jnp.where(parents >= 0, parents, -2)[:, None, :], axis=2)
  pruned = go & pruned
  stopped = go & ~continued & ~pruned
  tree = tree.replace(
      pruned=_scatter_frontier(tree.pruned, jnp.where(pruned, frontier, -1), jnp.ones_like(pruned)),
      truncated=_scatter_frontier(tree.truncated, jnp.where(stopped, frontier, -1),
                                  jnp.ones_like(stopped)))
  if scores is not None:
    tree = tree.replace(score=_scatter_frontier(tree.score, jnp.where(go, frontier, -1), scores))
  budget = budget.add(pruned=jnp.sum(pruned, axis=1))
  p_idx = jnp.arange(tree.num_prompts)[:, None]
  release = jnp.zeros(tree.used.shape, bool).at[
      p_idx, jnp.where(pruned | stopped, frontier, tree.capacity)].set(True, mode="drop")
  if method.keep_only_requested:   # contexts the next turn does not branch from are never read
    requested = jnp.zeros(tree.used.shape, bool).at[
        p_idx, jnp.where(parents >= 0, parents, tree.capacity)].set(True, mode="drop")
    release = release | ~requested
  return parents, pstate, tree, budget, release, jnp.any(parents >= 0)


@light_jit(static_argnums=(0, 3, 4, 5))
def _first(method: RolloutMethod, tree, budget, limit, unit, costs):
  parents, pstate = method.first(tree, method.init(tree.num_prompts))
  none = jnp.full(parents.shape, -1, jnp.int32)
  return _admit(tree, budget, none, parents, limit, unit, costs), pstate


@light_jit(static_argnums=(2, 3))
def _score_input(tree, frontier, max_len, max_depth):
  nodes = jnp.where(alive(tree, frontier), frontier, -1)
  return scorer_lib.score_input(tree, nodes, max_len, max_depth)


@light_jit
def _turn_keys(key, turn):
  return tuple(jax.random.split(jax.random.fold_in(key, turn), 3))


@light_jit(static_argnums=(0,))
def _state_keys(env, env_state):
  return jax.vmap(jax.vmap(env.state_key))(env_state)


@light_jit(static_argnums=(0, 3))
def _finish(method: RolloutMethod, tree, key, width):
  keep = method.keep_leaves(tree, key)
  ids, mask = leaf_ids(tree, width)
  valid = mask & gather(keep, ids)
  reward = jnp.where(mask, gather(tree.ret, ids), 0.0)
  tid = jnp.where(mask, gather(tree.tree_id, ids), -1)
  return ids, valid, reward, tid


def run(engine: Engine, method: RolloutMethod, cache, env_states, key, *, prompt_ids=None,
        scorer=None, budget: int = 0, budget_unit: str = "generated",
        capacity: int | None = None) -> tuple[RolloutOutput, Any]:
  """Roll out `method` for the prompts whose initial env states are `env_states` (leading [P]).

  scorer: a built process scorer (`scorers.build`), needed by scoring methods; it scores with
  `scorer.weights_for(cache.params)`, so a scorer that reads the policy sees the weights `cache`
  is bound to. Returns the output and the cache (all its pages released). capacity: node slots
  per prompt when more than the method needs (lets several methods share one cache shape).
  budget > 0 caps the branches each prompt starts at `budget` `budget_unit`
  (`tree_rl.rollout.budget`: started branches always finish; spent <= budget).
  """
  check_unit(budget_unit)
  if method.score_every and scorer is None:
    raise ValueError(f"rollout method {method.name!r} needs a process scorer (config.scorer.name)")
  if method.entropy_tokens and (method.entropy_tokens, method.entropy_top) != (
      engine.entropy_tokens, engine.entropy_top):
    raise ValueError(f"rollout method {method.name!r} branches on the entropy of "
                     f"{method.entropy_tokens} reply tokens (top {method.entropy_top}), the engine "
                     f"reports {engine.entropy_tokens} (top {engine.entropy_top}) "
                     "(Engine(entropy_tokens=..., entropy_top=...), rollout.build sets them)")
  layout = _layout(engine, method, env_states, capacity)
  limit, costs = int(budget), engine.cost_model()
  one = costs.trajectory(budget_unit)
  if 0 < limit < one:
    raise ValueError(f"config.rollout.budget={limit} {budget_unit} per prompt is less than one "
                     f"trajectory can take ({one}): no branch could start")
  rs = engine.start(cache, env_states, layout, prompt_ids)
  try:
    rs = _turns(engine, method, rs, key, scorer, limit, budget_unit, costs)
  except BaseException:   # a host env's handles do not outlive a failed or interrupted rollout
    engine.close(rs)
    raise
  ids, valid, reward, tid = _finish(method, rs.tree, jax.random.fold_in(key, 2**31 - 1), method.max_leaves())
  out = RolloutOutput(tree=rs.tree, leaf=ids, valid=valid, reward=reward, tree_id=tid,
                      state_key=_state_keys(engine.env, rs.tree.env_state), budget=rs.budget,
                      stats=statistics(rs, ids, valid, reward, budget_unit, engine.max_turns))
  return out, rs.cache


def _layout(engine: Engine, method: RolloutMethod, env_states, capacity: int | None) -> Layout:
  """The rollout's shape: one prompt per initial state, `capacity` (or the method's need) node
  slots per prompt."""
  need = method.capacity(engine.max_turns)
  if capacity is not None and capacity < need:
    raise ValueError(f"capacity={capacity} is below the {need} nodes per prompt {method.name!r} needs")
  return Layout(num_prompts=jax.tree.leaves(env_states)[0].shape[0], capacity=capacity or need,
                slots=method.slots, num_trees=method.num_trees)


def warm_up(engine: Engine, method: RolloutMethod, cache, env_states, *, budget: int = 0,
            capacity: int | None = None):
  """Build, ahead of the first rollout, every per-turn program a rollout of `method` over
  prompts `env_states` can meet: one real turn from fresh roots at each row count of the
  engine's buckets (`Engine.row_counts`), with the statics `run` uses. The trees are discarded;
  returns the cache, empty again. A host env is not stepped here (its turns build on first use).
  """
  if not engine.stepper.can_warm_up:
    return cache
  layout = _layout(engine, method, env_states, capacity)
  key = jax.random.wrap_key_data(np.zeros((2,), np.uint32))   # any key: no program to make one
  for parents in engine.bucket_requests(layout, cache.num_shards):   # host arrays, as `advance` reads them
    rs = engine.start(cache, env_states, layout)
    rs, _ = engine.advance(rs, parents, key, keep_parents=method.keep_contexts,
                           keep_roots=budget > 0)
    cache = engine.release(rs, rs.live).cache
  return cache


def _turns(engine: Engine, method: RolloutMethod, rs: RolloutState, key, scorer, limit: int,
           budget_unit: str, costs: CostModel) -> RolloutState:
  """The turn loop of `run`, from the roots until no branch goes on; every slot released."""
  parents, pstate = _first(method, rs.tree, rs.budget, limit, budget_unit, costs)
  max_len = engine.max_context()
  while True:
    k_turn, k_score, k_route = _turn_keys(key, rs.turns)
    rs, frontier = engine.advance(rs, parents, k_turn, keep_parents=method.keep_contexts,
                                  keep_roots=limit > 0 or method.keep_roots)
    scores = None
    if method.score_every and rs.turns % method.score_every == 0:
      inp = _score_input(rs.tree, frontier, max_len, engine.max_turns)
      scores = scorer(scorer.weights_for(rs.cache.params), inp, k_score)
    parents, pstate, tree, bud, release, more = _boundary(
        method, rs.tree, rs.budget, frontier, pstate, scores, k_route, limit, budget_unit, costs)
    rs = engine.release(dataclasses.replace(rs, tree=tree, budget=bud), release)
    if not bool(more):
      break
  return engine.release(rs, rs.live)


# how `statistics` of rollouts run one after the other combine into one step's
_SUMMED = ("trajectories", "nodes", "pruned", "budget_cut")
_MAXED = ("max_depth", "turns", "peak_pages")
_PER_TRAJECTORY = ("success_rate", "mean_reward", "mean_turns")


def merge_statistics(parts: list[dict]) -> dict:
  """One `statistics` dict for rollouts of equal prompt counts run one after the other: counts
  and budget totals add up, per-trajectory rates weigh by trajectories, per-prompt costs
  average, extremes take the largest."""
  if len(parts) == 1:
    return dict(parts[0])
  n = sum(p["trajectories"] for p in parts)
  out = {}
  for k in parts[0]:
    values = [p[k] for p in parts]
    if k in _SUMMED or k.startswith("budget/"):
      out[k] = sum(values)
    elif k in _MAXED:
      out[k] = max(values)
    elif k in _PER_TRAJECTORY:
      out[k] = sum(p[k] * p["trajectories"] for p in parts) / max(n, 1)
    else:   # cost_per_prompt*: a mean over equally many prompts per rollout
      out[k] = float(np.mean(values))
  return out


def statistics(rs: RolloutState, ids, valid, reward, unit: str = "generated",
               max_turns: int | None = None) -> dict:
  """Host-side summary: success rate, turns, depth, pruned, budget totals; `cost_per_prompt`
  (mean spent per prompt in `unit`) and `cost_per_prompt/<unit>` in every unit; `budget_cut`:
  leaves stopped before `max_turns` that neither finished nor were pruned (the budget cap never
  cuts a branch, so 0 unless a method stops branches itself)."""
  tree = jax.device_get(rs.tree.replace(tokens=None, logprobs=None, env_state=None))
  v, ids, r = np.asarray(valid), np.asarray(ids), np.asarray(reward)
  depth = np.take_along_axis(tree.depth, np.maximum(ids, 0), axis=1)
  n = max(int(v.sum()), 1)
  b = {k: np.asarray(x) for k, x in jax.device_get(rs.budget.as_dict()).items()}
  out = {
      "trajectories": int(v.sum()),
      "success_rate": float((r[v] > 0).sum() / n),
      "mean_reward": float(r[v].sum() / n),
      "mean_turns": float(depth[v].sum() / n),
      "max_depth": int(depth[v].max()) if v.any() else 0,
      "nodes": int(np.asarray(tree.size).sum()),
      "pruned": int(np.asarray(tree.pruned).sum()),
      "turns": rs.turns,
      "peak_pages": int(rs.peak_pages),
  }
  for k, x in b.items():
    out[f"budget/{k}"] = int(x.sum())
  out["budget/no_sharing_prefilled"] = int(b["prefilled"].sum() + b["reused"].sum())
  spent = jax.device_get(rs.budget).spent   # numpy counters: nothing compiled
  for u in UNITS:
    out[f"cost_per_prompt/{u}"] = float(np.mean(spent(u)))
  out["cost_per_prompt"] = out[f"cost_per_prompt/{unit}"]
  leaf = np.asarray(tree.is_leaf)
  cut = leaf & np.asarray(tree.truncated) & ~np.asarray(tree.finished) & ~np.asarray(tree.pruned)
  if max_turns is not None:
    cut &= np.asarray(tree.depth) < max_turns
  out["budget_cut"] = int(cut.sum())
  return out
