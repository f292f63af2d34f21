"""The codefix judge prompt: diagnose, edit, then verify."""

from __future__ import annotations

import jax.numpy as jnp

from tree_rl.rollout.scorers.judge import JUDGE_ASK, JudgeTemplate


def stage(env, env_params, state, root_state):
  """0 (diagnose) until the first edit, 1 (edit) after it, 2 (verify) once the tests ran on it."""
  del env_params, root_state
  return jnp.clip(env.info(state, "stage").astype(jnp.int32) - 1, 0, 2)


JUDGE = JudgeTemplate(
    text="<|im_start|>system\nYou judge an agent repairing a bug in a small Python module with "
         "tools to read files, replace text, run the visible tests and submit. Its stages: "
         "diagnose (it reads the code and the tests to find the bug), edit (it changed the code) "
         "and verify (it ran the tests on its edit; the fix must make them pass)." + JUDGE_ASK,
    stages=("diagnose", "edit", "verify"), stage=stage)
