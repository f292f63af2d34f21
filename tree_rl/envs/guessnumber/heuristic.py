"""Guess-the-number's heuristic process score: how far the answers have narrowed the secret."""

from __future__ import annotations

import jax.numpy as jnp


def narrowed(env, env_params, state, root_state):
  """1 on the right guess; else 1 - (numbers still possible - 1) / (numbers at the start - 1)."""
  del env, env_params
  left = (state.high - state.low).astype(jnp.float32)
  start = jnp.maximum(root_state.high - root_state.low, 1).astype(jnp.float32)
  return jnp.where(state.won, 1.0, jnp.clip(1.0 - left / start, 0.0, 1.0))
