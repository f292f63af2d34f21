"""Fixtures of the RL-loop tests."""

import pytest


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """A TFDS directory per test module (tiny task splits are prepared into it once)."""
  return str(tmp_path_factory.mktemp("tfds"))
