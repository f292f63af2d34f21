"""The report sweeps: which runs `experiments/reports/make_report.py` turns into a report
(`experiments/reports/run_reproductions.py` runs them, one warm start per seed).

`frozenlake_methods`: every compared algorithm (`tree_rl.algorithms.compared()`, in the reports'
order) on the default FrozenLake config, three seeds each.

`frozenlake_reproduction` (on the `testbed` config, 5 seeds): chain GRPO (group 8),
Tree-GRPO, Tree-Random and PATR at an equal planned budget of 8 trajectories per prompt, and
`tree_grpo_quarter` at 2 (a quarter). `frozenlake_ablations` (3 seeds): Tree-GRPO intra-only and
inter-only advantages (`tree_grpo` of the reproduction is "both"), PATR's group without the
pruned branches and Best_n (`patr` of the reproduction keeps them, the paper's default). Seeds
0-2 of the two sweeps share their warm starts.

`frozenlake_long` (on the `testbed_long` config, 5 seeds): the reproduction's five arms on
the long-horizon testbed, shaped on it (16 turns, PATR scoring every 4).

`toolcall_reproduction` (on the tool-call `testbed` config, 5 seeds): chain GRPO
(group 8), Tree-GRPO at the same planned budget and `tree_grpo_quarter` at a quarter; the
intra/inter ablation stays with FrozenLake.

Shapes at equal budget (`budget.method_shapes`): chain G=8; Tree-GRPO M=4, N=2, L=1 (M trees of
1 + L*N/2 trajectories' worth each: the issue's M=2 plans 4, half of chain GRPO's 8); PATR /
Tree-Random B0=6, top-4, M=2, 10 branches (the paper's B0=4, top-2 plans 5); DAPO and GiGPO 8
chains; ARPO B0=4 and a cap of 8 branches. The quarter: Tree-GRPO M=1, N=2, L=1. No runtime cap:
every method runs its own rule, and the report sets the spent budget beside the planned one.
"""

from experiments.sweeps.budget import method_shapes, shape, with_algo
from experiments.sweeps.build import base_values
from experiments.sweeps.core import CONFIG_KEY, Sweep
from experiments.sweeps.tree_grpo import ADVANTAGE
from tree_rl import algorithms

PATH = "configs/frozenlake.py"
TOOLCALL = "configs/toolcall.py"
REPRODUCTION = ("grpo", "tree_grpo", "tree_random", "patr")
REPRODUCTION_SEEDS = (0, 1, 2, 3, 4)
ABLATION_SEEDS = (0, 1, 2)


def _shapes(path: str = PATH) -> tuple[int, dict]:
  """Chain GRPO's group k and each method's rollout shape planning k trajectories per prompt."""
  k = int(base_values(with_algo(path, "grpo"), ["rollout.group_size"])["rollout.group_size"])
  return k, method_shapes(path, k)


def _entry(algo: str, shape: dict, arg: str = "", path: str = PATH) -> dict:
  return {CONFIG_KEY: f"{path}:algo={algo}{arg}", **shape}


def frozenlake_methods() -> Sweep:
  k, shapes = _shapes()
  methods = tuple(a for a in algorithms.display_order() if a in algorithms.compared())
  return Sweep("frozenlake_methods", f"{PATH}:algo=patr",
               {algo: _entry(algo, shapes[algo]) for algo in methods},
               equal_budget=(methods,),
               description=f"FrozenLake report: {' / '.join(map(algorithms.label, methods))} at "
                           f"{k} planned trajectories per prompt, 3 seeds")


def _five_arms(name: str, arg: str, shaped_on: str, what: str) -> Sweep:
  """Chain GRPO, Tree-GRPO, Tree-Random and PATR at chain GRPO's planned budget and Tree-GRPO
  at a quarter of it, on `PATH:arg`, with the rollout shapes planned on `shaped_on`."""
  k, shapes = _shapes(shaped_on)
  entries = {algo: _entry(algo, shapes[algo], f",{arg}") for algo in REPRODUCTION}
  entries["tree_grpo_quarter"] = _entry("tree_grpo", shape(shaped_on, "tree_grpo", k // 4),
                                        f",{arg}")
  return Sweep(name, f"{PATH}:algo=patr,{arg}", entries,
               seeds=REPRODUCTION_SEEDS, equal_budget=(REPRODUCTION,),
               description=f"{what}: chain GRPO / Tree-GRPO / Tree-Random / PATR at {k} planned "
                           f"trajectories per prompt and Tree-GRPO at {k // 4}, 5 seeds")


def frozenlake_reproduction() -> Sweep:
  # The testbed changes the view, the warm start and the schedule, not the rollout: the shapes
  # of the default config are the testbed's (and `sweeps.get` checks the budgets on the
  # testbed configs themselves).
  return _five_arms("frozenlake_reproduction", "testbed", PATH,
                    "FrozenLake reproduction on the testbed")


def frozenlake_long() -> Sweep:
  # Shapes planned on the long testbed itself (16 turns, scoring every 4): PATR and Tree-Random
  # need B0=5 (cap 11) to plan chain GRPO's 8 there; B0=4 plans 6.5.
  return _five_arms("frozenlake_long", "testbed_long", f"{PATH}:testbed_long",
                    "FrozenLake on the long-horizon testbed")


def frozenlake_ablations() -> Sweep:
  k, shapes = _shapes()
  tree = _entry("tree_grpo", shapes["tree_grpo"], ",testbed")
  patr = _entry("patr", shapes["patr"], ",testbed")
  b0 = int(shapes["patr"]["rollout.initial_branches"])
  entries = {"tree_grpo_intra": {**tree, **ADVANTAGE["intra"]},
             "tree_grpo_inter": {**tree, **ADVANTAGE["inter"]},
             "patr_drop_pruned": {**patr, "rollout.keep_pruned": False},
             "patr_best_n": {**patr, "rollout.keep_best": b0}}
  return Sweep("frozenlake_ablations", f"{PATH}:algo=patr,testbed", entries,
               seeds=ABLATION_SEEDS,
               equal_budget=(("tree_grpo_intra", "tree_grpo_inter", "patr_drop_pruned",
                              "patr_best_n"),),
               description="FrozenLake ablations on the testbed, 3 seeds: Tree-GRPO intra-only / "
                           "inter-only advantages, PATR without pruned branches / Best_n")


def toolcall_reproduction() -> Sweep:
  k, shapes = _shapes(TOOLCALL)
  entries = {algo: _entry(algo, shapes[algo], ",testbed", TOOLCALL) for algo in ("grpo", "tree_grpo")}
  entries["tree_grpo_quarter"] = _entry(
      "tree_grpo", method_shapes(TOOLCALL, k // 4)["tree_grpo"], ",testbed", TOOLCALL)
  return Sweep("toolcall_reproduction", f"{TOOLCALL}:algo=tree_grpo,testbed", entries,
               seeds=REPRODUCTION_SEEDS, equal_budget=(("grpo", "tree_grpo"),),
               description=f"Tool-call QA reproduction on the testbed: chain GRPO / Tree-GRPO at "
                           f"{k} planned trajectories per prompt and Tree-GRPO at {k // 4}, 5 seeds")


SWEEPS = {"frozenlake_methods": frozenlake_methods,
          "frozenlake_reproduction": frozenlake_reproduction,
          "frozenlake_ablations": frozenlake_ablations,
          "frozenlake_long": frozenlake_long,
          "toolcall_reproduction": toolcall_reproduction}
