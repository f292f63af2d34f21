"""Shared pieces of the RL-loop tests: smoke configs on a per-module TFDS directory."""

import os

from tree_rl.checkpointing import Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def smoke(module, algo, data_dir, **overrides):
  c = module.get_config(f"algo={algo},smoke")
  c.env.data_dir = data_dir
  for key, value in overrides.items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def checkpoint_params(workdir, step):
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  assert step in ckpt.all_steps()
  return ckpt.read(step)[0]["train"]["params"]


