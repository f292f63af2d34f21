"""The FrozenLake reproduction report's runs: chain GRPO, Tree-GRPO, Tree-Random and PATR on the
default FrozenLake config, three seeds each (`experiments/reports/make_frozenlake_report.py`
turns their logs into `experiments/reports/frozenlake.md`)."""

from experiments.sweeps.core import CONFIG_KEY, Sweep

PATH = "configs/frozenlake.py"
METHODS = ("grpo", "tree_grpo", "tree_random", "patr")

SWEEPS = {
    "frozenlake_methods": lambda: Sweep(
        "frozenlake_methods", f"{PATH}:algo=patr",
        {algo: {CONFIG_KEY: f"{PATH}:algo={algo}"} for algo in METHODS},
        description="FrozenLake report: chain GRPO / Tree-GRPO / Tree-Random / PATR, 3 seeds"),
}
