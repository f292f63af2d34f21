"""The FrozenLake reproduction report's runs: chain GRPO, Tree-GRPO, Tree-Random and PATR on the
default FrozenLake config, three seeds each (`experiments/reports/summaries.py` turns their logs
into per-run summaries, `experiments/reports/make_report.py` those into
`experiments/reports/frozenlake.md`).

The four compare at an equal planned budget: chain GRPO's base group of G chains, and the tree
methods shaped by `budget.method_shapes` to plan G trajectories per prompt too (at PATR's GRPO
group G = 8: Tree-GRPO M=4, N=2, L=1; PATR / Tree-Random B0=6, top-4, M=2, 10 branches: the paper's
B0=4, top-2 plans 5 trajectories; DAPO and GiGPO 8 chains; ARPO B0=4 and a cap of 8 branches,
its worst case 7.6). No runtime cap: every method runs its own rule."""

from experiments.sweeps.budget import method_shapes
from experiments.sweeps.build import base_values
from experiments.sweeps.core import CONFIG_KEY, Sweep

PATH = "configs/frozenlake.py"
METHODS = ("grpo", "tree_grpo", "tree_random", "patr", "dapo", "gigpo", "arpo")


def frozenlake_methods() -> Sweep:
  k = int(base_values(f"{PATH}:algo=grpo", ["rollout.group_size"])["rollout.group_size"])
  shapes = method_shapes(PATH, k)
  return Sweep("frozenlake_methods", f"{PATH}:algo=patr",
               {algo: {CONFIG_KEY: f"{PATH}:algo={algo}", **shapes[algo]} for algo in METHODS},
               equal_budget=(METHODS,),
               description=f"FrozenLake report: chain GRPO / Tree-GRPO / Tree-Random / PATR / DAPO / "
                           f"GiGPO / ARPO at "
                           f"{k} planned trajectories per prompt, 3 seeds")


SWEEPS = {"frozenlake_methods": frozenlake_methods}
