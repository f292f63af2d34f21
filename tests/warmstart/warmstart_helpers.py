"""Helpers shared by the SFT tests: a locked config with warm-start overrides, a tiny model."""

from flax import nnx

from tree_rl import config as config_lib
from tree_rl.models import Transformer
from tree_rl.models.config import tiny


def _config(**overrides):
  c = config_lib.base_config()
  c.warmstart.update(overrides)
  return config_lib.lock(c)


def _model(tok, seed=0):
  return Transformer(tiny(tok.vocab_size), rngs=nnx.Rngs(seed))
