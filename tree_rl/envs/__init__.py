"""Environments: FrozenLake and a multi-hop tool-call QA env speak tokens on device (JAX-native);
`codefix` repairs code in real sandboxed workspaces on the host (`HostEnv`, `envs/host.py`).

    env = tree_rl.envs.make("frozenlake", preset="rllm", tokenizer=tok)
    state, obs = env.reset(key, env.default_params)
    prompt, n = env.initial_prompt_tokens(state)
    action = env.parse_action(reply_tokens, reply_len)
    state, obs, reward, done, info = env.step(key, state, action, env.default_params)
    obs_tokens, m = env.observation_tokens(state, turn_closed)

A state is a pytree: branching a rollout tree is keeping (or `snapshot`-ing) it and stepping the
copy. `register(name, factory, tasks=..., heuristic=..., judge=..., expert=...)` adds an environment,
with its task set, process heuristic, judge template and warm-start expert, from a notebook.
An env package here (`tree_rl/envs/<name>/`) holds all of one environment and registers it when
imported; importing `tree_rl.envs` imports every such package.
"""

import importlib
import pkgutil

from tree_rl.envs.base import Environment, TokenEnv, repeat, restore, snapshot, take
from tree_rl.envs.registry import (EnvEntry, entry, from_config, make, problems, register,
                                     registered)
from tree_rl.envs.external_tool import ExternalTool
from tree_rl.envs.host import HostEnv, HostState, is_host_env


def _import_env_packages() -> None:
  """Import every env package beside this file: each registers its environment."""
  for module in pkgutil.iter_modules(__path__):
    if module.ispkg:
      importlib.import_module(f"{__name__}.{module.name}")


_import_env_packages()
