"""The model, batch and config shared by the two-process test and its single-process check."""

import numpy as np
from flax import nnx

from tree_rl.config import base_config
from tree_rl.learner import batches, synthetic
from tree_rl.models import Transformer
from tree_rl.models.config import ModelConfig

VOCAB = 64
# Tests compile many small updates: skip LLVM's heavy optimisation (compiles ~2x faster).
FAST_COMPILE = {"xla_backend_optimization_level": 0}
# One layer keeps compilation short; 4 query / 2 kv heads still exercise tensor sharding.
MICRO = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
                    qkv_bias=True)
STEPS = 2
AGGREGATION = "traj_mean_group_mean"


def config(shape):
  c = base_config()
  c.learner.learning_rate = 1e-3
  c.learner.adam_eps = 1e-3   # see test_train_step.config
  c.learner.kl_coef = 0.05
  c.learner.aggregation = AGGREGATION
  c.mesh.shape = shape
  return c


def model():
  return Transformer(MICRO, rngs=nnx.Rngs(0))


def trees():
  rng = np.random.default_rng(7)
  return [synthetic.random_tree(rng, int(rng.integers(1, 6)), VOCAB, group_id=g // 2)
          for g in range(8)]


def batch(subset=None, rows=8, totals=None):
  """Packed rows of all trees, or of `subset` (indices) normalised by the batch `totals`."""
  ts = trees()
  if subset is not None:
    ts = [ts[i] for i in subset]
  return batches.pack_trees(ts, seq_len=40, max_nodes=12, rows=rows, totals=totals,
                            aggregation=AGGREGATION)
