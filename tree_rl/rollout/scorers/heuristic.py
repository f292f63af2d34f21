"""Scorers without a model: `random` (Tree-Random) and `heuristic` (the env's progress signal),
and the built-in envs' progress signals."""

from __future__ import annotations

import jax

from tree_rl import envs
from tree_rl.rollout.scorers.base import per_state, register


# ---------------------------------------------------------------------------------------------
# random


@register("random")
def make_random(cfg, **_):
  """Uniform scores: PATR's routing with this scorer is Tree-Random."""
  del cfg

  def score(weights, batch, key):
    del weights
    return jax.random.uniform(key, batch.mask.shape)

  return score


# ---------------------------------------------------------------------------------------------
# heuristic: observable progress signals, one function per environment, registered with the env
# (`tree_rl.envs.register(name, factory, heuristic=fn)`, fn(env, env_params, state, root_state)
# -> [0, 1] for one unbatched state).


@register("heuristic")
def make_heuristic(cfg, *, env=None, env_params=None, **_):
  """Progress of the env state: FrozenLake BFS distance, tool-call facts retrieved, ..."""
  del cfg
  name = getattr(env, "name", None)
  try:
    one = envs.entry(name).part("heuristic")
  except KeyError as e:
    raise ValueError(f"no heuristic process score for env {name!r}: {e.args[0]}") from None

  def score(weights, batch, key):
    del weights, key
    return per_state(one, env, env_params, batch)

  return score
