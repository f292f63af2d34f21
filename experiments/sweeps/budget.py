"""Equal-budget curves: chain GRPO against the tree methods at per-prompt budgets of 2, 4, 8 and
16 trajectories' worth of generated tokens (one trajectory's worth = max_turns x
max_tokens_per_turn of the base config).

Every run caps `rollout.budget` (unit `generated`) at k trajectories' worth (`tree_rl.rollout.
budget`: branches start only while their worst case fits; nothing is cut), and each method's
shape plans to spend it (`method_shapes`; planned cost = `budget.planned_trajectories`, checked
within 10% across the methods of a budget by `build.check_equal_budget`): chain GRPO samples k
chains; Tree-GRPO grows M trees with its N expansions per tree (L rounds) so that
M * (1 + L*N/2) = k; PATR and Tree-Random raise their initial branches B0 and top-k with the
budget (M children and the scoring interval K of the base config; M + 1 only where no M shape
lands within 10%) and get exactly the branch cap their schedule starts; DAPO and GiGPO sample k
chains; ARPO starts about k/2 chains and caps its branches so its worst case plans k. The methods
are `tree_rl.algorithms.compared()`, each shaped by its rollout method (`SHAPES`).
"""

import functools
import itertools
import types

from experiments.sweeps.build import load_config, one_trajectory_tokens
from experiments.sweeps.core import CONFIG_KEY, Sweep
from tree_rl import algorithms
from tree_rl.rollout import methods
from tree_rl.rollout.budget import planned_trajectories

BUDGETS = (2, 4, 8, 16)
TOLERANCE = 0.10


def with_algo(path: str, algo: str) -> str:
  """The config argument of `algo` on `path`, a file or a file with arguments (`file.py:testbed`)."""
  return f"{path},algo={algo}" if ":" in path else f"{path}:algo={algo}"


@functools.lru_cache(maxsize=None)
def _base_rollout(path: str, algo: str) -> dict:
  r = load_config(with_algo(path, algo)).rollout
  return {k: r[k] for k in r}


def _rollout(path: str, algo: str, overrides: dict):
  """The base config's `rollout` fields with `overrides` ("rollout.x" keys) applied."""
  fields = dict(_base_rollout(path, algo))
  fields.update({k.removeprefix("rollout."): v for k, v in overrides.items()})
  return types.SimpleNamespace(**fields)


def _error(path: str, algo: str, k: int, overrides: dict) -> float:
  """How far the planned trajectories of `overrides` are from k, relative (inf for a shape
  its rollout method refuses)."""
  try:
    return abs(planned_trajectories(_rollout(path, algo, overrides)) - k) / k
  except ValueError:
    return float("inf")


def _best(path: str, algo: str, k: int, candidates, penalty):
  """The candidate whose planned trajectories are nearest k (then the smallest penalty)."""
  def key(c):
    return (round(_error(path, algo, k, c), 9), penalty(c))
  best = min(candidates, key=key)
  if key(best)[0] > TOLERANCE:
    raise ValueError(f"no {algo} shape of {path} plans {k} trajectories within 10%")
  return best


def _chain(path: str, algo: str, k: int, extra: dict) -> dict:
  del path, algo, extra
  return {"rollout.group_size": k}


def _tree_grpo(path: str, algo: str, k: int, extra: dict) -> dict:
  r = _rollout(path, algo, {})
  cands = [{"rollout.num_trees": m, "rollout.expand_nodes": n,
            "rollout.expand_iterations": int(r.expand_iterations)}
           for m in range(1, k + 1) for n in range(1, 5)]
  return _best(path, algo, k, cands,
               lambda c: (c["rollout.expand_nodes"] != int(r.expand_nodes),))


def _patr(path: str, algo: str, k: int, extra: dict) -> dict:
  r = _rollout(path, algo, extra)
  cands = []
  for m, b0, top in itertools.product((int(r.expand_children), int(r.expand_children) + 1),
                                      range(1, k + 1), range(1, k + 1)):
    c = {**extra, "rollout.initial_branches": b0, "rollout.expand_children": m,
         "rollout.expand_top_k": top, "rollout.max_branches": 64 * k}
    rc = _rollout(path, algo, c)
    c["rollout.max_branches"] = methods.get(rc.method)(rc).schedule(int(rc.max_turns))[1]
    cands.append(c)
  # prefer the base M, then the most branches started by expansions, then the smallest top-k
  return _best(path, algo, k, cands, lambda c: (
      c["rollout.expand_children"] != int(r.expand_children),
      c["rollout.initial_branches"] - c["rollout.max_branches"], c["rollout.expand_top_k"]))


def _arpo(path: str, algo: str, k: int, extra: dict) -> dict:
  """ARPO's split of the budget: about half global chains, half entropy forks (B0 = k/2 or
  the nearest that plans k within 10%)."""
  def err(c):
    return _error(path, algo, k, c)
  cands = [c for c in ({"rollout.initial_branches": b0, "rollout.max_branches": m}
                       for b0 in range(1, k + 1) for m in range(b0, 4 * k + 1))
           if err(c) <= TOLERANCE]
  if not cands:
    raise ValueError(f"no {algo} shape of {path} plans {k} trajectories within 10%")
  return min(cands, key=lambda c: (abs(2 * c["rollout.initial_branches"] - k), round(err(c), 9)))


# rollout method -> (path, algo, k, patr_extra) -> the overrides planning k trajectories
SHAPES = {"chain": _chain, "tree_grpo": _tree_grpo, "patr": _patr, "tree_random": _patr,
          "arpo": _arpo}


def shape(path: str, algo: str, k: int, patr_extra: dict | None = None) -> dict:
  """The overrides giving `algo`'s rollout on `path` a plan of k trajectories per prompt."""
  method = algorithms.get(algo).method
  if method not in SHAPES:
    raise ValueError(f"no budget shape for rollout method {method!r} (algo={algo}): add one "
                     f"to experiments.sweeps.budget.SHAPES")
  return SHAPES[method](path, algo, k, dict(patr_extra or {}))


def method_shapes(path: str, k: int, patr_extra: dict | None = None) -> dict:
  """{algo: overrides} giving each compared algorithm a rollout that plans k trajectories per
  prompt (DAPO and GiGPO are chains of k; DAPO's dynamic sampling draws `rollout.draw_factor`
  times the prompts, up to `rollout.max_draws` times, which `rollout/draws` and
  `rollout/cost_per_kept_group` report); `patr_extra` overrides PATR's and Tree-Random's."""
  return {algo: shape(path, algo, k, patr_extra) for algo in algorithms.compared()}


def budget_entries(path: str, budgets=BUDGETS, patr_extra: dict | None = None) -> dict:
  one = one_trajectory_tokens(with_algo(path, "grpo"))
  cap = lambda k: {"rollout.budget": k * one, "rollout.budget_unit": "generated"}  # noqa: E731
  out = {}
  for k in budgets:
    for algo, shape in method_shapes(path, k, patr_extra).items():
      out[f"{algo}_b{k}"] = {CONFIG_KEY: f"{path}:algo={algo}", **shape, **cap(k)}
  return out


def equal_budget_groups(budgets=BUDGETS) -> tuple:
  return tuple(tuple(f"{a}_b{k}" for a in algorithms.compared()) for k in budgets)


def _curve(name: str, path: str, what: str, patr_extra: dict | None = None):
  return lambda: Sweep(name, f"{path}:algo=grpo", budget_entries(path, patr_extra=patr_extra),
                       equal_budget=equal_budget_groups(),
                       description=f"{what}: chain GRPO vs Tree-GRPO / PATR / Tree-Random at "
                                   f"budgets of {', '.join(map(str, BUDGETS))} trajectories")


SWEEPS = {
    "budget_curve": _curve("budget_curve", "configs/frozenlake.py", "FrozenLake"),
    # 6-turn QA episodes: score every 2 turns so routing happens more than once.
    "toolcall_budget_curve": _curve("toolcall_budget_curve", "configs/toolcall.py",
                                    "tool-call QA", {"rollout.score_every": 2}),
}
