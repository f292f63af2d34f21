"""FrozenLake's heuristic process score: how much of the way to the goal the agent has come."""

from __future__ import annotations

import jax.numpy as jnp


def progress(env, env_params, state, root_state):
  """1 - d / d0 with d the BFS moves left to the goal and d0 those at the episode start;
  1 on the goal, 0 in a hole (or when the goal became unreachable)."""
  del env_params
  d = env.distance_to_goal(state).astype(jnp.float32)
  d0 = env.distance_to_goal(root_state).astype(jnp.float32)
  prog = 1.0 - d / jnp.maximum(d0, 1.0)
  prog = jnp.where(d < 0, 0.0, prog)
  return jnp.where(state.won, 1.0, jnp.where(state.fell, 0.0, jnp.clip(prog, 0.0, 1.0)))
