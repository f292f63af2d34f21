"""Learner: advantage registry, clipped policy-gradient losses, tree-packed batches and the
sharded train step."""

from tree_rl.learner import advantages, losses
from tree_rl.learner.batches import LeafBatch, PackedBatch, Tree, leaf_batch, pack_trees
