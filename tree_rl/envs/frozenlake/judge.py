"""FrozenLake's stage-aware judge prompt: plan (no move made yet), then move."""

from __future__ import annotations

import jax.numpy as jnp

from tree_rl.rollout.scorers.judge import JUDGE_ASK, JudgeTemplate


def stage(env, env_params, state, root_state):
  """0 (plan) until the agent's first move on the board, 1 (move) after it."""
  del env, env_params, root_state
  return (state.steps > 0).astype(jnp.int32)


JUDGE = JudgeTemplate(
    text="<|im_start|>system\nYou judge an agent walking on a FrozenLake grid to the goal G "
         "without falling into a hole O. Its stages: plan (it reads the map and picks a route, "
         "no move made yet) and move (it moves on the board toward the goal)." + JUDGE_ASK,
    stages=("plan", "move"), stage=stage)
