"""The tool-call task set: the questions of a generated knowledge base (TFDS `toolcall_qa`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tree_rl import envs
from tree_rl.compile_cache import light_jit
from tree_rl.tasks import TaskSet


def task_set(config, tokenizer, directory) -> TaskSet:
  """Prepare the KB of env.data_seed scaled by env.kb_scale in `directory`; the train and
  held-out questions (at most train.num_train_tasks / num_test_tasks, 0: all), each split with
  its own env over the one KB."""
  from tree_rl.envs.toolcall.qa import ToolcallQa, load_kb, scaled_config

  builder_config = scaled_config(int(config.env.data_seed), int(config.env.kb_scale))
  ToolcallQa(data_dir=directory, config=builder_config).download_and_prepare(
      file_format="array_record")
  kb = load_kb(directory, config=builder_config.name)
  make = lambda split: envs.from_config(config, tokenizer, split=split, kb=kb)  # noqa: E731
  train_env, test_env = make("train"), make("test")
  states = lambda env, n: light_jit(jax.vmap(env.init_state))(jnp.arange(n, dtype=jnp.int32))  # noqa: E731
  n_train, n_test = int(config.train.num_train_tasks), int(config.train.num_test_tasks)
  return TaskSet(train_env, test_env,
                 states(train_env, min(n_train or train_env.num_questions, train_env.num_questions)),
                 states(test_env, min(n_test or test_env.num_questions, test_env.num_questions)))
