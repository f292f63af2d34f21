"""Learner: advantage registry, clipped policy-gradient losses, tree-packed batches and the
sharded train step."""

from tree_rl.learner import advantages, losses
from tree_rl.learner.batches import (LeafBatch, PackedBatch, TrainTree, leaf_batch, pack_trees,
                                     packed_attention_mask)
from tree_rl.learner.sharding import make_mesh, maybe_initialize_distributed
from tree_rl.learner.train_step import (TrainState, TrainStep, make_optimizer, make_train_step,
                                        validate_config)
