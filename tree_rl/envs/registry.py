"""The env registry: one `register` names everything the rest of tree_rl needs of an environment.

    register("mylake", MyLake, fields=dict(holes=3), ranges=dict(holes="int [0 _)"),
             config_fields=("preset", "holes"), tasks=my_tasks, heuristic=my_progress,
             judge=MY_JUDGE, expert=MyExpert, checks=my_checks)
    env = make("mylake", tokenizer=tok, preset="...")
    env = from_config(config, tokenizer)

What an entry holds (`EnvEntry`):
- fields: the env's own `config.env` fields, name -> default or `tree_rl.fields.Field` (declared
  through `tree_rl.fields`, which `tree_rl.config.base_config` reads, so they sit beside the
  shared name / preset / data_dir / data_seed and round-trip through a run's config.json);
  ranges: the numeric ones' ranges, where not given in a Field. Two envs may share a field with
  one default; policy_fields: those of its fields (besides preset) that change what a policy
  sees, so a shipped warm-start policy is bound to their values;
- factory(tokenizer=..., max_turns=..., max_reply_tokens=..., **fields) -> TokenEnv;
  `from_config` passes the `config.env` fields named in `config_fields`, the turn limit
  `config.rollout.max_turns` and the reply size `config.rollout.max_tokens_per_turn`;
- tasks(config, tokenizer, data_dir) -> `tree_rl.tasks.TaskSet`: the train / held-out initial states;
- heuristic(env, env_params, state, root_state) -> float in [0, 1]: the `heuristic` process score;
- judge: a `tree_rl.rollout.scorers.JudgeTemplate`, the judge scorer's stage-aware prompt (its
  text with `{stage}` / `{trajectory}` slots, the stage names, and a function of the env state
  giving the current stage);
- expert(env, epsilon) -> `tree_rl.warmstart.Expert`: the warm start's demonstrator;
- checks(config.env) -> list of problems with the env's own fields (each a message naming the
  field), run by `tree_rl.validation.validate` before anything is built. Every config holds every
  env's fields, so every registered env's checks run, whichever env `config.env.name` selects.
The factory and each part may be the object or a "module:attribute" path imported on first use (as gymnasium's
entry points), so a built-in env registers its parts without importing them.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from tree_rl import fields as fields_lib
from tree_rl.registry import Registry

_PARTS = {"tasks": "its task set (train / test initial states)",
          "heuristic": "a heuristic process score", "judge": "a judge template",
          "expert": "a warm-start expert", "checks": "config checks"}


@dataclasses.dataclass(frozen=True)
class EnvEntry:
  name: str
  factory: Callable | str
  config_fields: tuple[str, ...] = ("preset",)
  fields: dict[str, fields_lib.Field] = dataclasses.field(default_factory=dict)
  policy_fields: tuple[str, ...] = ()
  tasks: Callable | str | None = None
  heuristic: Callable | str | None = None
  expert: Callable | str | None = None
  judge: Any = None
  checks: Callable | str | None = None

  def part(self, what: str) -> Any:
    """The entry's `tasks`, `heuristic`, `judge`, `expert` or `checks` (imported if given as a
    path)."""
    value = getattr(self, what)
    if value is None:
      raise KeyError(f"env {self.name!r} (config.env.name) has no {_PARTS[what]}; register it "
                     f"with tree_rl.envs.register({self.name!r}, factory, {what}=...)")
    return _load(value)

  def build(self, **kwargs) -> Any:
    """The environment, from the factory (imported first if given as a path)."""
    return _load(self.factory)(**kwargs)


def _load(value):
  if isinstance(value, str):
    module, _, attr = value.partition(":")
    value = getattr(importlib.import_module(module), attr)
  return value


_REGISTRY = Registry("env", "config.env.name")


def register(name: str, factory: Callable | str, *, config_fields: tuple[str, ...] = ("preset",),
             fields: dict[str, Any] | None = None, ranges: dict[str, str] | None = None,
             policy_fields: tuple[str, ...] = (),
             tasks: Callable | str | None = None, heuristic: Callable | str | None = None,
             expert: Callable | str | None = None, judge: Any = None,
             checks: Callable | str | None = None, overwrite: bool = False) -> Callable:
  """Register the environment `name` with everything tree_rl needs of it (see the module
  docstring); returns the factory."""
  declared = fields_lib.as_fields(fields, ranges)
  entry = EnvEntry(name, factory, tuple(config_fields), declared, tuple(policy_fields), tasks,
                   heuristic, expert, judge, checks)
  if name in _REGISTRY and not overwrite and _REGISTRY.get(name) != entry:
    raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
  unknown = sorted(set(policy_fields) - set(declared))
  if unknown:
    raise ValueError(f"env {name!r} declares policy_fields of {unknown}, which are not among its fields")
  fields_lib.declare("env", name, declared)
  _REGISTRY.register(name)(entry)
  return factory


def entry(name: str) -> EnvEntry:
  """The registration of env `name` (a KeyError naming config.env.name and the known envs)."""
  return _REGISTRY.get(name)


def make(name: str, **kwargs) -> Any:
  """The environment registered as `name`, built with `kwargs` (e.g. preset=..., tokenizer=...)."""
  return entry(name).build(**kwargs)


def registered() -> list[str]:
  return _REGISTRY.names()


def problems(env_config) -> list[str]:
  """What every registered env's checks find wrong in `config.env` (one message each)."""
  return [p for name in _REGISTRY.ordered() if entry(name).checks is not None
          for p in entry(name).part("checks")(env_config)]


def from_config(config, tokenizer=None, **kwargs) -> Any:
  """The env `config.env.name` names, built from its registered `config.env` fields, the turn
  limit and reply size of `config.rollout`, and `kwargs` (which take precedence)."""
  e = entry(config.env.name)
  fields = {k: config.env[k] for k in e.config_fields}
  fields.update(max_turns=int(config.rollout.max_turns),
                max_reply_tokens=int(config.rollout.max_tokens_per_turn))
  return e.build(tokenizer=tokenizer, **(fields | kwargs))
