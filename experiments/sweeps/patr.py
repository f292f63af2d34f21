"""PATR ablations: expansion M, branch interval K, top-k, which leaves form the group, and the
process scorer (heuristic / judge / random = Tree-Random), one factor at a time on FrozenLake;
the scorer comparison also on tool-call QA.

The group arms: `keep_all` (the paper: pruned branches stay as negatives), `drop_pruned` (pruned
leaves leave the group) and `best_n` (the paper's Best_n: only the n best-scored leaves, ranked
by `routing.best_leaf_score`, with n = B0, the branches the rollout starts).
"""

from experiments.sweeps.build import base_values
from experiments.sweeps.core import CONFIG_KEY, Sweep, axis, one_at_a_time

FROZENLAKE = "configs/frozenlake.py"
TOOLCALL = "configs/toolcall.py"

EXPAND = axis("M", "rollout.expand_children", (2, 3))
INTERVAL = axis("K", "rollout.score_every", (1, 3, 5))
TOP_K = axis("top", "rollout.expand_top_k", (1, 2, 4))


def keep_entries() -> dict:
  b0 = base_values(f"{FROZENLAKE}:algo=patr", ["rollout.initial_branches"])["rollout.initial_branches"]
  return {"keep_all": {"rollout.keep_pruned": True}, "drop_pruned": {"rollout.keep_pruned": False},
          "best_n": {"rollout.keep_best": b0}}


def scorer_entries(path: str) -> dict:
  return {"heuristic": {"scorer.name": "heuristic"}, "judge": {"scorer.name": "judge"},
          "random": {CONFIG_KEY: f"{path}:algo=tree_random"}}


def _single(name, entries, description, path=FROZENLAKE, **kw):
  return lambda: Sweep(name, f"{path}:algo=patr", entries, description=description, **kw)


def patr_ablation() -> Sweep:
  config = f"{FROZENLAKE}:algo=patr"
  sets = (EXPAND, INTERVAL, TOP_K, keep_entries(), scorer_entries(FROZENLAKE))
  keys = {k for s in sets for e in s.values() for k in e if k != CONFIG_KEY}
  entries = one_at_a_time(base_values(config, keys), *sets)
  return Sweep("patr_ablation", config, entries,
               description="PATR on FrozenLake, one factor at a time around the base config "
                           "(M, K, top-k, group: keep all / drop pruned / best n, scorer)")


SWEEPS = {
    "patr_ablation": patr_ablation,
    "patr_expand": _single("patr_expand", EXPAND, "PATR expansion children M in {2, 3}"),
    "patr_interval": _single("patr_interval", INTERVAL, "PATR branch interval K in {1, 3, 5}"),
    "patr_topk": _single("patr_topk", TOP_K, "PATR branches expanded per round in {1, 2, 4}"),
    "patr_keep_pruned": lambda: Sweep(
        "patr_keep_pruned", f"{FROZENLAKE}:algo=patr", keep_entries(),
        description="PATR group: pruned branches kept / dropped / only the n best-scored (Best_n)"),
    "patr_scorer": _single("patr_scorer", scorer_entries(FROZENLAKE),
                           "PATR process scorer: heuristic / judge / random (Tree-Random)"),
    # 6-turn QA episodes: score every 2 turns so routing happens more than once.
    "toolcall_patr_scorer": _single(
        "toolcall_patr_scorer", scorer_entries(TOOLCALL),
        "PATR on tool-call QA, scored every 2 turns: heuristic / judge / random",
        path=TOOLCALL, overrides={"rollout.score_every": 2}),
}
