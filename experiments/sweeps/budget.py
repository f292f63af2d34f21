"""Equal-budget curves: chain GRPO against the tree methods at per-prompt budgets of 2, 4, 8 and
16 trajectories' worth of generated tokens (one trajectory's worth = max_turns x
max_tokens_per_turn of the base config).

Every run caps `rollout.budget` (unit `generated`) at k trajectories' worth; the shapes give each
method room to spend it: chain GRPO samples k trajectories; Tree-GRPO grows max(1, k/2) trees
with N=2 expansions in L=1 round (about 2 trajectories' worth per tree, expansions start
mid-episode); PATR and Tree-Random start min(B0, k) branches with room for 2k.
"""

from experiments.sweeps.build import base_values, one_trajectory_tokens
from experiments.sweeps.core import CONFIG_KEY, Sweep

BUDGETS = (2, 4, 8, 16)


def budget_entries(path: str, budgets=BUDGETS) -> dict:
  one = one_trajectory_tokens(f"{path}:algo=grpo")
  b0 = base_values(f"{path}:algo=patr", ["rollout.initial_branches"])["rollout.initial_branches"]
  cap = lambda k: {"rollout.budget": k * one, "rollout.budget_unit": "generated"}
  shapes = {
      "grpo": lambda k: {"rollout.group_size": k},
      "tree_grpo": lambda k: {"rollout.num_trees": max(1, k // 2), "rollout.expand_nodes": 2,
                              "rollout.expand_iterations": 1},
      "patr": lambda k: {"rollout.initial_branches": min(b0, k), "rollout.max_branches": 2 * k},
      "tree_random": lambda k: {"rollout.initial_branches": min(b0, k), "rollout.max_branches": 2 * k},
  }
  return {f"{algo}_b{k}": {CONFIG_KEY: f"{path}:algo={algo}", **shape(k), **cap(k)}
          for algo, shape in shapes.items() for k in budgets}


def _curve(name: str, path: str, what: str):
  return lambda: Sweep(name, f"{path}:algo=grpo", budget_entries(path),
                       description=f"{what}: chain GRPO vs Tree-GRPO / PATR / Tree-Random at "
                                   f"budgets of {', '.join(map(str, BUDGETS))} trajectories")


SWEEPS = {
    "budget_curve": _curve("budget_curve", "configs/frozenlake.py", "FrozenLake"),
    "toolcall_budget_curve": _curve("toolcall_budget_curve", "configs/toolcall.py", "tool-call QA"),
}
