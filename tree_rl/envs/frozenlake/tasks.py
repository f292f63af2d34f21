"""FrozenLake's task set: fixed train / held-out map sets (TFDS `frozen_lake_maps`), or a JSON map
file (`config.env.eval_maps`) in place of the held-out split."""

from __future__ import annotations

from tree_rl import envs
from tree_rl.tasks import TaskSet


def task_set(config, tokenizer, directory) -> TaskSet:
  """Prepare the map set `config.env.preset` sized by train.num_train_tasks / num_test_tasks
  (0: 10,000 / 100) from env.data_seed in `directory`, and load both splits."""
  from tree_rl.envs.frozenlake.maps import FrozenLakeMaps, FrozenLakeMapsConfig, load_frozenlake_maps

  env = envs.from_config(config, tokenizer)
  t = config.train
  preset = config.env.preset
  sizes = FrozenLakeMapsConfig(name=preset, preset=preset, seed=int(config.env.data_seed))
  num_train = int(t.num_train_tasks) or sizes.num_train
  num_test = int(t.num_test_tasks) or sizes.num_test
  name = preset if (num_train, num_test, sizes.seed) == (10_000, 100, 42) else (
      f"{preset}_{num_train}_{num_test}_seed{sizes.seed}")
  maps = name if name == preset else FrozenLakeMapsConfig(
      name=name, preset=preset, num_train=num_train, num_test=num_test, seed=sizes.seed)
  FrozenLakeMaps(data_dir=directory, config=maps).download_and_prepare(file_format="array_record")
  load = lambda split: load_frozenlake_maps(directory, split, env, config=name)  # noqa: E731
  if config.env.get("eval_maps", ""):   # a map set given as JSON replaces the held-out split
    from tree_rl.envs.frozenlake.json_maps import load_json_maps
    return TaskSet(env, env, load("train"), load_json_maps(config.env.eval_maps, env))
  return TaskSet(env, env, load("train"), load("test"))
