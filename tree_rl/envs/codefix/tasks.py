"""The codefix task set: generated code-repair tasks (TFDS `codefix`), one sandbox per split."""

from __future__ import annotations

import os

import numpy as np

from tree_rl import envs
from tree_rl.tasks import TaskSet


def task_set(config, tokenizer, directory) -> TaskSet:
  """The codefix task set (TFDS `codefix`, sized by train.num_train_tasks / num_test_tasks);
  train and test envs each get their own sandbox (under config.env.scratch_dir/train|test
  when it is set)."""
  from tree_rl.envs.codefix.dataset import Codefix, CodefixConfig, load_codefix

  seed = int(config.env.data_seed)
  n_train = int(config.train.num_train_tasks) or CodefixConfig.num_train
  n_test = int(config.train.num_test_tasks) or CodefixConfig.num_test
  name = f"seed{seed}_{n_train}_{n_test}"
  Codefix(data_dir=directory, config=CodefixConfig(name=name, seed=seed, num_train=n_train,
                                                   num_test=n_test)
          ).download_and_prepare(file_format="array_record")
  scratch = config.env.scratch_dir

  def make(split):
    return envs.from_config(config, tokenizer, tasks=load_codefix(directory, split, config=name),
                            scratch_dir=os.path.join(scratch, split) if scratch else "")

  train_env, test_env = make("train"), make("test")
  states = lambda env: env.initial_states(np.arange(env.num_tasks, dtype=np.int32))  # noqa: E731
  return TaskSet(train_env, test_env, states(train_env), states(test_env))
