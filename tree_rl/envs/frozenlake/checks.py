"""FrozenLake's config checks, run before anything is built."""

from __future__ import annotations


def check(env_config) -> list[str]:
  """Problems with FrozenLake's `config.env` fields: `eval_maps` is for FrozenLake only, and its
  file must hold valid maps that the preset's largest side fits."""
  path = env_config.get("eval_maps", "")
  if not path:
    return []
  if env_config.name != "frozenlake":
    return [f"config.env.eval_maps is a FrozenLake option; config.env.name={env_config.name!r}"]
  from tree_rl.envs.frozenlake.env import FrozenLake
  from tree_rl.envs.frozenlake.json_maps import MapsFileError, read_maps
  try:
    read_maps(path, FrozenLake(env_config.preset).max_size)
  except MapsFileError as e:
    return [f"config.env.eval_maps: {e}"]
  return []
