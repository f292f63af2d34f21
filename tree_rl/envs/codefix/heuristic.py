"""The codefix heuristic process score: visible tests passed and the read -> edit -> test stage."""

from __future__ import annotations

import jax.numpy as jnp


def progress(env, env_params, state, root_state):
  """1 once resolved, 0 after a failed submit; else 0.6 x the fraction of visible tests the
  branch's own workspace passes + 0.4 x its read -> edit -> test stage (of 3)."""
  del env_params, root_state
  stage = env.info(state, "stage") / 3.0
  score = 0.6 * env.info(state, "visible_pass") + 0.4 * stage
  return jnp.where(env.info(state, "resolved") > 0, 1.0, jnp.where(state.done, 0.0, score))
