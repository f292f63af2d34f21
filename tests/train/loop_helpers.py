"""Shared pieces of the RL-loop tests: smoke configs on a per-module TFDS directory."""

import os

import jax
import numpy as np

from configs.common import apply
from tree_rl.checkpointing import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def smoke(module, algo, data_dir, **overrides):
  c = module.get_config(f"algo={algo},smoke")
  c.env.data_dir = data_dir
  apply(c, overrides)
  return c


def checkpoint_params(workdir, step):
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  assert step in ckpt.all_steps()
  return ckpt.read(step)[0]["train"]["params"]


def max_abs_diff(a, b) -> float:
  """Largest absolute difference between two parameter trees of the same structure."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
