"""The algorithm registry: what `algo=NAME` sets, and how sweeps and reports list and name it."""

import pytest

from configs import frozenlake
from experiments.reports import measures
from tree_rl import algorithms


def test_a_registered_algorithm_is_an_algo_preset_with_its_label(monkeypatch):
  monkeypatch.setattr(algorithms._REGISTRY, "_items", dict(algorithms._REGISTRY._items))
  algorithms.register(algorithms.Algorithm(
      "patr_rloo", "patr", "rloo", "token_mean", label="PATR, RLOO",
      recipe={"learner.kl_coef": 0.0}, compared=False))
  c = frozenlake.get_config("algo=patr_rloo")
  assert (c.rollout.method, c.learner.advantage, c.learner.aggregation, c.learner.kl_coef) == (
      "patr", "rloo", "token_mean", 0.0)
  assert measures.label("patr_rloo") == "PATR, RLOO" and "patr_rloo" not in algorithms.compared()
  with pytest.raises(KeyError, match="unknown algorithm 'patr_rlo'.*'patr_rloo'"):
    frozenlake.get_config("algo=patr_rlo")


def test_comparisons_in_registration_order_reports_list_a_control_first():
  assert algorithms.compared() == ("grpo", "tree_grpo", "patr", "tree_random", "dapo", "gigpo",
                                   "arpo")
  assert algorithms.display_order()[:4] == ["grpo", "tree_grpo", "tree_random", "patr"]
  assert [measures.label(a) for a in ("grpo", "tree_random", "rloo", "tree_grpo_quarter")] == [
      "chain GRPO", "Tree-Random", "RLOO", "Tree-GRPO, 1/4 budget"]


def test_the_readme_holds_the_methods_table_rendered_from_the_registry():
  import os
  readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "README.md")).read()
  table = algorithms.markdown_table()
  assert table in readme, "README.md: paste tree_rl.algorithms.markdown_table()\n" + table
