"""Env registry: `register(name, factory)` then `make(name, **kwargs)`; a notebook can add its own."""

from __future__ import annotations

from typing import Callable

_FACTORIES: dict[str, Callable] = {}
_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {}


def register(name: str, factory: Callable, config_fields: tuple[str, ...] = ("preset",),
             overwrite: bool = False) -> Callable:
  """Register `factory(**kwargs) -> Environment` under `name`; returns the factory.

  `config_fields`: the `config.env` fields `from_config` passes to the factory as keywords.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"env name must be a non-empty string, got {name!r}")
  if name in _FACTORIES and not overwrite and _FACTORIES[name] is not factory:
    raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
  _FACTORIES[name] = factory
  _CONFIG_FIELDS[name] = tuple(config_fields)
  return factory


def make(name: str, **kwargs):
  """The environment registered as `name`, built with `kwargs` (e.g. preset=..., tokenizer=...)."""
  if name not in _FACTORIES:
    raise KeyError(f"unknown env {name!r} (config.env.name); registered: {sorted(_FACTORIES)}")
  return _FACTORIES[name](**kwargs)


def registered() -> list[str]:
  return sorted(_FACTORIES)


def from_config(env_config, tokenizer=None, **kwargs):
  """The env named by `config.env.name`, given the config fields it registered plus `kwargs`."""
  name = env_config.name
  if name not in _FACTORIES:
    raise KeyError(f"unknown env {name!r} (config.env.name); registered: {sorted(_FACTORIES)}")
  fields = {k: env_config[k] for k in _CONFIG_FIELDS[name]}
  return _FACTORIES[name](tokenizer=tokenizer, **fields, **kwargs)
