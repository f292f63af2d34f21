"""TFDS builders: build into a temporary dir as array_record, read back with tfds.data_source."""

import sys

import jax
import numpy as np

from tree_rl.data import (FrozenLakeMaps, FrozenLakeMapsConfig, ToolcallQa, ToolcallQaConfig,
                          load_frozenlake_maps, load_kb)
from tree_rl.envs import frozenlake as fl
from tree_rl.envs import toolcall as tc
from tree_rl.envs.toolcall_kb import generate_kb


def test_frozenlake_maps_build_and_read(tmp_path):
  config = FrozenLakeMapsConfig(name="small", preset="rllm", num_train=40, num_test=8, seed=42)
  builder = FrozenLakeMaps(data_dir=str(tmp_path), config=config)
  builder.download_and_prepare(file_format="array_record")
  assert "tensorflow" not in sys.modules
  env = fl.FrozenLake("rllm")
  states = load_frozenlake_maps(str(tmp_path), "test", env, config="small")
  assert states.tiles.shape == (8, 9, 9)
  # the stored maps are the generator's maps for the same keys
  keys = jax.random.split(jax.random.fold_in(jax.random.key(42), 1), 8)
  tiles, size, start, goal = jax.jit(jax.vmap(lambda k: fl.generate_map(k, env.default_params, 9)))(keys)
  np.testing.assert_array_equal(states.tiles, tiles)
  np.testing.assert_array_equal(states.pos, start)
  d = np.asarray(jax.jit(jax.vmap(fl.distance_to_goal))(states))
  assert np.all((d >= 1) & (d <= 8))
  train = load_frozenlake_maps(str(tmp_path), "train", env, config="small")
  assert train.tiles.shape[0] == 40 and not np.array_equal(train.tiles[:8], states.tiles)
  # a second builder on the same dir reuses the files: same maps across runs
  again = load_frozenlake_maps(str(tmp_path), "test", env, config="small")
  np.testing.assert_array_equal(again.tiles, states.tiles)


def test_toolcall_qa_build_and_read(tmp_path, builtin_tok):
  config = ToolcallQaConfig(name="small", seed=3, num_people=12, num_cities=6, num_countries=3,
                            num_companies=4, num_test=10)
  ToolcallQa(data_dir=str(tmp_path), config=config).download_and_prepare(file_format="array_record")
  assert "tensorflow" not in sys.modules
  kb = load_kb(str(tmp_path), config="small")
  ref = generate_kb(3, 12, 6, 3, 4, 10)
  assert kb.facts == ref.facts and kb.test == ref.test and kb.train == ref.train
  env = tc.ToolCallEnv(builtin_tok, split="test", kb=kb)
  assert env.num_questions == 10
