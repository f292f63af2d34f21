"""An env's registration carries its own config.env fields, their ranges and its checks: every
config then holds the fields, config.json keeps them, and validate runs the checks."""

import pytest

from configs import frozenlake
from tree_rl import config as config_lib
from tree_rl import envs, fields
from tree_rl.envs import registry
from tree_rl.envs.frozenlake import FrozenLake
from tree_rl.validation import ConfigError, validate


def _no_sevens(env_config):
  return ["config.env.probe_holes=7 is unlucky"] if env_config.probe_holes == 7 else []


@pytest.fixture
def probe(monkeypatch):
  monkeypatch.setattr(fields, "_DECLARED", {k: dict(v) for k, v in fields._DECLARED.items()})
  envs.register("lake_probe", FrozenLake, fields=dict(probe_holes=3),
                ranges=dict(probe_holes="int [0 _)"), checks=_no_sevens)
  try:
    yield
  finally:
    registry._REGISTRY._items.pop("lake_probe")
    config_lib.RANGES.pop("env.probe_holes", None)


def test_registered_fields_join_every_config_and_round_trip(probe):
  assert config_lib.base_config().env.probe_holes == 3
  c = frozenlake.get_config("algo=chain,smoke")
  c.env.probe_holes = 5
  assert config_lib.from_json(c.to_json()).env.probe_holes == 5
  assert config_lib.RANGES["env.probe_holes"] == "int [0 _)"


def test_registered_ranges_and_checks_run_in_validate(probe):
  c = frozenlake.get_config("algo=chain,smoke")
  validate(c)
  c.env.probe_holes = 7
  with pytest.raises(ConfigError, match="config.env.probe_holes=7 is unlucky"):
    validate(c)
  c.env.probe_holes = -1
  with pytest.raises(ConfigError, match=r"config.env.probe_holes=-1 must be an integer >= 0"):
    validate(c)


def test_a_shared_field_has_one_default_and_ranges_and_policy_fields_name_fields(probe):
  with pytest.raises(ValueError, match="a shared field has one default"):
    envs.register("lake_probe_2", FrozenLake, fields=dict(probe_holes=4))
  with pytest.raises(ValueError, match=r"ranges of \['holes'\]"):
    envs.register("lake_probe_2", FrozenLake, ranges=dict(holes="int [0 _)"))
  with pytest.raises(ValueError, match=r"policy_fields of \['holes'\]"):
    envs.register("lake_probe_2", FrozenLake, policy_fields=("holes",))
  assert "lake_probe_2" not in envs.registered()
  with pytest.raises(ValueError, match="already config.env.preset"):
    envs.register("lake_probe_2", FrozenLake, fields=dict(preset="x"))
    try:
      config_lib.base_config()
    finally:
      registry._REGISTRY._items.pop("lake_probe_2")
