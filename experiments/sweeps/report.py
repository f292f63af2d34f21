"""The FrozenLake reproduction report's runs: chain GRPO, Tree-GRPO, Tree-Random and PATR on the
default FrozenLake config, three seeds each (`experiments/reports/make_frozenlake_report.py`
turns their logs into `experiments/reports/frozenlake.md`).

The four entries plan the same per-prompt cost, 8 trajectories' worth of generated tokens
(B = max_turns x max_tokens_per_turn), and each is capped there (`rollout.budget`): every method
scales its count of independent starts to the budget and keeps its branching knobs at the
papers' values. Planned cost, with T = max_turns = 10 and an expansion costing the rest of the
episode after its branch point:

| entry | shape | leaves per prompt | planned cost |
|---|---|---|---|
| grpo | G = 8 chains (PATR's baseline group) | 8 | 8 B |
| tree_grpo | M = 4 trees, N = 2, L = 1, K = 3 (public code) | 12 | 4 B + 4*2 * B/2 = 8 B |
| patr, tree_random | B0 = 7, M = 2, top-k = 2, K = 5 (paper), at most 9 | <= 9 | 7 B + 2 * B/2 = 8 B |

(Tree-GRPO expansions start at a uniformly drawn node, half-way down on average; PATR scores at
turn 5 and expands the top 2 branches into 2 children each, which then run the last 5 turns;
the round at turn 10 ends the episode.)
"""

from experiments.sweeps.build import one_trajectory_tokens
from experiments.sweeps.core import CONFIG_KEY, Sweep

PATH = "configs/frozenlake.py"
METHODS = ("grpo", "tree_grpo", "tree_random", "patr")
TRAJECTORIES = 8     # the planned per-prompt cost, in trajectories' worth
_PATR = {"rollout.initial_branches": 7, "rollout.expand_children": 2, "rollout.expand_top_k": 2,
         "rollout.score_every": 5, "rollout.max_branches": 9}
SHAPES = {
    "grpo": {"rollout.group_size": 8},
    "tree_grpo": {"rollout.num_trees": 4, "rollout.expand_nodes": 2, "rollout.expand_iterations": 1,
                  "rollout.keep_leaves": 3},
    "tree_random": _PATR,
    "patr": _PATR,
}


def method_entries() -> dict:
  cap = {"rollout.budget": TRAJECTORIES * one_trajectory_tokens(f"{PATH}:algo=grpo"),
         "rollout.budget_unit": "generated"}
  return {algo: {CONFIG_KEY: f"{PATH}:algo={algo}", **SHAPES[algo], **cap} for algo in METHODS}


SWEEPS = {
    "frozenlake_methods": lambda: Sweep(
        "frozenlake_methods", f"{PATH}:algo=patr", method_entries(),
        description="FrozenLake report: chain GRPO / Tree-GRPO / Tree-Random / PATR at an equal "
                    "planned budget of 8 trajectories per prompt, 3 seeds"),
}
