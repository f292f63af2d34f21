"""docs/config.md is what `experiments.config_reference` prints from the schema now."""

import os

from experiments import config_reference
from tree_rl import config as config_lib

DOC = os.path.join(config_reference.ROOT, config_reference.OUT)


def test_config_reference_is_current_and_lists_every_field():
  text = config_reference.render() + "\n"
  with open(DOC) as f:
    assert f.read() == text, (
        "docs/config.md is stale: run `python -m experiments.config_reference --write`")
  schema = config_lib.base_config()
  keys = [f"{section}.{name}" if hasattr(schema[section], "keys") else section
          for section in schema.keys()
          for name in (schema[section].keys() if hasattr(schema[section], "keys") else [None])]
  assert len(keys) > 100
  missing = [k for k in keys if f"| `{k}` |" not in text]
  assert not missing, f"fields missing from the config reference: {missing}"
