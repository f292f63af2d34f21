"""The tool-call judge prompt: search (gathering facts), then answer."""

from __future__ import annotations

import jax.numpy as jnp

from tree_rl.rollout.scorers.judge import JUDGE_ASK, JudgeTemplate


def stage(env, env_params, state, root_state):
  """0 (search) while searches are left and nothing is answered, 1 (answer) after."""
  del root_state
  params = env.default_params if env_params is None else env_params
  return (state.answered | (state.calls >= params.max_calls)).astype(jnp.int32)


JUDGE = JudgeTemplate(
    text="<|im_start|>system\nYou judge an agent answering a multi-hop question with a search "
         "tool. Its stages: search (it gathers the facts the question needs) and answer (no "
         "searches left or an answer given: the answer must follow from the facts found)."
         + JUDGE_ASK,
    stages=("search", "answer"), stage=stage)
