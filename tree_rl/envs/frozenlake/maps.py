"""Fixed FrozenLake map sets as a TFDS dataset, so evaluations use the same held-out maps everywhere.

    builder = FrozenLakeMaps(data_dir=d, config="rllm")      # 10,000 train / 100 test, seed 42
    builder.download_and_prepare(file_format="array_record")
    states = load_frozenlake_maps(d, "test", env)             # a batched FrozenLakeState

Maps come from the env's own jitted generator (`generate_map`) with keys derived from the seed
(train: fold_in(seed_key, 0), test: fold_in(seed_key, 1)); example i is map i (no shuffling).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow_datasets as tfds

from tree_rl.compile_cache import light_jit
from tree_rl.data.builder_utils import LocalBuilder

from tree_rl.envs.frozenlake import dynamics as fl
from tree_rl.envs.frozenlake.env import FrozenLake


@dataclasses.dataclass
class FrozenLakeMapsConfig(tfds.core.BuilderConfig):
  preset: str = "rllm"
  num_train: int = 10_000
  num_test: int = 100
  seed: int = 42


class FrozenLakeMaps(LocalBuilder):
  """FrozenLake maps: tiles (FROZEN=0, HOLE=1, GOAL=2, PAD=3), size, start, goal, shortest path."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  BUILDER_CONFIGS = [FrozenLakeMapsConfig(name="rllm", preset="rllm"),
                     FrozenLakeMapsConfig(name="rllm_small", preset="rllm_small"),
                     FrozenLakeMapsConfig(name="ragen", preset="ragen"),
                     FrozenLakeMapsConfig(name="long", preset="long")]

  def _env(self):
    return FrozenLake(self.builder_config.preset)

  def _info(self):
    m = self._env().max_size
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "tiles": tfds.features.Tensor(shape=(m, m), dtype=np.int8),
            "size": np.int32,
            "start": tfds.features.Tensor(shape=(2,), dtype=np.int32),
            "goal": tfds.features.Tensor(shape=(2,), dtype=np.int32),
            "shortest_path": np.int32,
        }),
        disable_shuffling=True,
        description=f"FrozenLake maps of the {self.builder_config.preset!r} preset.")

  def _split_generators(self, dl_manager):
    c = self.builder_config
    return {"train": self._generate_examples(0, c.num_train), "test": self._generate_examples(1, c.num_test)}

  def _generate_examples(self, split_index: int, count: int):
    env = self._env()
    p = env.default_params
    chunk = 256                          # one program per split; the last chunk is padded

    def one(key):
      tiles, size, start, goal = fl.generate_map(key, p, env.max_size)
      return tiles, size, start, goal, fl.bfs_distance(tiles, size, size, start, goal)

    @jax.jit
    def gen(lo):
      keys = jax.random.split(jax.random.fold_in(jax.random.key(self.builder_config.seed),
                                                 split_index), count)
      return jax.vmap(one)(keys[jnp.minimum(lo + jnp.arange(chunk), count - 1)])

    for lo in range(0, count, chunk):
      tiles, size, start, goal, dist = jax.tree.map(np.asarray, gen(np.int32(lo)))
      for j in range(min(chunk, count - lo)):
        yield lo + j, {"tiles": tiles[j].astype(np.int8), "size": size[j], "start": start[j],
                       "goal": goal[j], "shortest_path": dist[j]}


def load_frozenlake_maps(data_dir: str, split: str, env: FrozenLake, config: str = "rllm"):
  """All maps of a prepared split as one batched, freshly reset FrozenLakeState."""
  source = tfds.data_source(f"frozen_lake_maps/{config}", data_dir=data_dir, split=split)
  rows = [source[i] for i in range(len(source))]
  tiles = np.stack([r["tiles"] for r in rows]).astype(np.int32)
  if tiles.shape[1] != env.max_size:
    raise ValueError(f"maps have side {tiles.shape[1]} but the env's max_size is {env.max_size}")
  size = np.array([r["size"] for r in rows], np.int32)
  start = np.stack([r["start"] for r in rows])
  return light_jit(jax.vmap(env.init_state))(tiles, size, size, start)   # one program, not one per op
