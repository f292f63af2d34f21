"""Task sets: the environments and the fixed train/test initial states of an experiment.

Initial states come from each env's TFDS datasets (prepared once into
`config.env.data_dir`, array_record files), so evaluations use the same held-out tasks across
runs and machines. The task set of an environment is registered with it
(`tree_rl.envs.register(name, factory, tasks=...)`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
from typing import Any

import jax
import numpy as np

from tree_rl import envs
from tree_rl.compile_cache import light_jit


@dataclasses.dataclass
class TaskSet:
  train_env: Any
  test_env: Any
  train_states: Any     # batched initial env states [N_train, ...]
  test_states: Any      # batched initial env states [N_test, ...]

  @property
  def num_train(self) -> int:
    return jax.tree.leaves(self.train_states)[0].shape[0]

  @property
  def num_test(self) -> int:
    return jax.tree.leaves(self.test_states)[0].shape[0]

  def close(self) -> None:
    """Free what the envs hold outside JAX (a host env's sandbox); device envs hold nothing."""
    for env in {id(self.train_env): self.train_env, id(self.test_env): self.test_env}.values():
      if hasattr(env, "close"):
        env.close()


def take(states, idx):
  """The states of tasks `idx` [B] from batched states [N, ...] (one program per shape); host
  indices 0..N-1 in order give `states` themselves (no program)."""
  n = jax.tree.leaves(states)[0].shape[0]
  if isinstance(idx, np.ndarray) and np.array_equal(idx, np.arange(n)):
    return states
  return _take(states, idx)


@light_jit
def _take(states, idx):
  return jax.tree.map(lambda x: x[idx], states)


def data_dir(env_config) -> str:
  """`config.env.data_dir`, or TFDS's default directory."""
  return env_config.data_dir or os.path.join(os.path.expanduser("~"), "tensorflow_datasets")


def build(config, tokenizer) -> TaskSet:
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  from tree_rl import hosts
  make = envs.entry(config.env.name).part("tasks")
  directory = data_dir(config.env)

  def prepare_and_load():
    with preparing(directory):
      return make(config, tokenizer, directory)
  # process 0 prepares the TFDS task set; the others then read it
  return hosts.main_first(prepare_and_load)


@contextlib.contextmanager
def preparing(directory: str):
  """Hold the data directory's preparation lock (DIRECTORY/.tree_rl_prepare.lock, exclusive):
  independent jobs sharing one data directory (a sweep's runs side by side) never write one
  TFDS dataset at once; the second waits, then reads what the first prepared."""
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, ".tree_rl_prepare.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)
