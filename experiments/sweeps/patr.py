"""PATR ablations: expansion M, branch interval K, top-k, keep-all-pruned vs best-only, and the
process scorer (heuristic / judge / random = Tree-Random), one factor at a time on FrozenLake;
the scorer comparison also on tool-call QA."""

from experiments.sweeps.build import base_values
from experiments.sweeps.core import CONFIG_KEY, Sweep, axis, one_at_a_time

FROZENLAKE = "configs/frozenlake.py"
TOOLCALL = "configs/toolcall.py"

EXPAND = axis("M", "rollout.expand_children", (2, 3))
INTERVAL = axis("K", "rollout.score_every", (1, 3, 5))
TOP_K = axis("top", "rollout.expand_top_k", (1, 2, 4))
KEEP = {"keep_all": {"rollout.keep_pruned": True}, "best_only": {"rollout.keep_pruned": False}}


def scorer_entries(path: str) -> dict:
  return {"heuristic": {"scorer.name": "heuristic"}, "judge": {"scorer.name": "judge"},
          "random": {CONFIG_KEY: f"{path}:algo=tree_random"}}


def _single(name, entries, description, path=FROZENLAKE, **kw):
  return lambda: Sweep(name, f"{path}:algo=patr", entries, description=description, **kw)


def patr_ablation() -> Sweep:
  config = f"{FROZENLAKE}:algo=patr"
  sets = (EXPAND, INTERVAL, TOP_K, KEEP, scorer_entries(FROZENLAKE))
  keys = {k for s in sets for e in s.values() for k in e if k != CONFIG_KEY}
  entries = one_at_a_time(base_values(config, keys), *sets)
  return Sweep("patr_ablation", config, entries,
               description="PATR on FrozenLake, one factor at a time around the base config "
                           "(M, K, top-k, keep-pruned, scorer)")


SWEEPS = {
    "patr_ablation": patr_ablation,
    "patr_expand": _single("patr_expand", EXPAND, "PATR expansion children M in {2, 3}"),
    "patr_interval": _single("patr_interval", INTERVAL, "PATR branch interval K in {1, 3, 5}"),
    "patr_topk": _single("patr_topk", TOP_K, "PATR branches expanded per round in {1, 2, 4}"),
    "patr_keep_pruned": _single("patr_keep_pruned", KEEP,
                                "PATR: pruned branches kept in the group vs dropped"),
    "patr_scorer": _single("patr_scorer", scorer_entries(FROZENLAKE),
                           "PATR process scorer: heuristic / judge / random (Tree-Random)"),
    # 6-turn QA episodes: score every 2 turns so routing happens more than once.
    "toolcall_patr_scorer": _single(
        "toolcall_patr_scorer", scorer_entries(TOOLCALL),
        "PATR on tool-call QA, scored every 2 turns: heuristic / judge / random",
        path=TOOLCALL, overrides={"rollout.score_every": 2}),
}
