"""Guess-the-number's task set: episodes drawn from `config.env.data_seed` (no dataset to
prepare: a task is its secret)."""

from __future__ import annotations

import jax

from tree_rl import envs
from tree_rl.tasks import TaskSet


def task_set(config, tokenizer, directory) -> TaskSet:
  """train.num_train_tasks / num_test_tasks episodes (0: 1,000 / 100), split 0 and 1 of the seed."""
  del directory
  env = envs.from_config(config, tokenizer)
  seed = jax.random.key(int(config.env.data_seed))
  sizes = (int(config.train.num_train_tasks) or 1000, int(config.train.num_test_tasks) or 100)
  train, test = (_episodes(env, jax.random.fold_in(seed, split), n)
                 for split, n in enumerate(sizes))
  return TaskSet(env, env, train, test)


def _episodes(env, key, n):
  return jax.vmap(lambda k: env.reset(k)[0])(jax.random.split(key, n))
