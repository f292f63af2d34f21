"""Tree-GRPO ablations: the advantage (intra-tree only / inter-tree only / both) on FrozenLake and
tool-call QA, and the tree shape (expansion nodes N, expansion iterations L) on FrozenLake.

Every shape trains what the public code trains: K = `rollout.keep_leaves` (3) random leaves
per tree of its 1 + L*N. The public code asserts a tree has K leaves, so a shape with fewer
(N=1, L=1: 2 per tree) keeps all of them (`keep_leaves=0`) instead of being refused.
"""

from experiments.sweeps.build import base_values
from experiments.sweeps.core import Sweep, axis, one_at_a_time

FROZENLAKE = "configs/frozenlake.py:algo=tree_grpo"
TOOLCALL = "configs/toolcall.py:algo=tree_grpo"

ADVANTAGE = {"intra": {"learner.advantage": "tree_intra"},
             "inter": {"learner.advantage": "tree_inter"},
             "both": {"learner.advantage": "tree_grpo"}}
NODES = axis("N", "rollout.expand_nodes", (1, 2, 4))
ITERATIONS = axis("L", "rollout.expand_iterations", (1, 2, 3))


SHAPE_KEYS = ("rollout.expand_nodes", "rollout.expand_iterations", "rollout.keep_leaves")


def _around_base(*sets) -> dict:
  keys = {k for s in sets for e in s.values() for k in e} | set(SHAPE_KEYS)
  base = base_values(FROZENLAKE, keys)
  entries = one_at_a_time(base, *sets)
  for e in entries.values():
    n, l, k = ({**base, **e}[key] for key in SHAPE_KEYS)
    if 1 + l * n < k:
      e["rollout.keep_leaves"] = 0
  return entries


def tree_grpo_ablation() -> Sweep:
  return Sweep("tree_grpo_ablation", FROZENLAKE, _around_base(ADVANTAGE, NODES, ITERATIONS),
               description="Tree-GRPO on FrozenLake, one factor at a time (advantage, N, L)")


SWEEPS = {
    "tree_grpo_ablation": tree_grpo_ablation,
    "tree_grpo_advantage": lambda: Sweep(
        "tree_grpo_advantage", FROZENLAKE, ADVANTAGE,
        description="Tree-GRPO advantage: intra-tree / inter-tree / both"),
    "tree_grpo_shape": lambda: Sweep(
        "tree_grpo_shape", FROZENLAKE, _around_base(NODES, ITERATIONS),
        description="Tree-GRPO expansion nodes N in {1, 2, 4}, iterations L in {1, 2, 3}, "
                    "one at a time around the base (N=2, L=1)"),
    "toolcall_tree_grpo_advantage": lambda: Sweep(
        "toolcall_tree_grpo_advantage", TOOLCALL, ADVANTAGE,
        description="Tree-GRPO advantage on tool-call QA: intra-tree / inter-tree / both"),
}
