"""Shared fixtures: the built-in tokenizer and small environments."""

import pytest

from tree_rl import envs
from tree_rl.models import BuiltinTokenizer


@pytest.fixture(scope="session")
def tok():
  return BuiltinTokenizer()


@pytest.fixture(scope="session")
def rllm_env(tok):
  return envs.make("frozenlake", preset="rllm", tokenizer=tok)


@pytest.fixture(scope="module")
def small_env(tok):
  return envs.make("frozenlake", preset="rllm", tokenizer=tok, max_size=4)
