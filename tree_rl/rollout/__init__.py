"""Tree rollouts: one engine, method policies (chain, tree_grpo, patr, tree_random), process
scorers and budget accounting."""

from tree_rl.rollout import budget, routing, scorers, sequences, tree
from tree_rl.rollout.budget import Budget
from tree_rl.rollout.tree import Tree
