"""Tree-GRPO ablations: the advantage (intra-tree only / inter-tree only / both) on FrozenLake and
tool-call QA, and the tree shape (expansion nodes N, expansion iterations L) on FrozenLake."""

from experiments.sweeps.build import base_values
from experiments.sweeps.core import Sweep, axis, one_at_a_time

FROZENLAKE = "configs/frozenlake.py:algo=tree_grpo"
TOOLCALL = "configs/toolcall.py:algo=tree_grpo"

ADVANTAGE = {"intra": {"learner.advantage": "tree_intra"},
             "inter": {"learner.advantage": "tree_inter"},
             "both": {"learner.advantage": "tree_grpo"}}
NODES = axis("N", "rollout.expand_nodes", (1, 2, 4))
ITERATIONS = axis("L", "rollout.expand_iterations", (1, 2, 3))


def _around_base(*sets) -> dict:
  keys = {k for s in sets for e in s.values() for k in e}
  return one_at_a_time(base_values(FROZENLAKE, keys), *sets)


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
