"""The algorithms: each a rollout method, an advantage estimator and a loss aggregation, with the
recipe its paper trains with. One registry, read by the configs (`algo=NAME`), the sweeps and
the reports; register one from a notebook and name it in a config argument:

    algorithms.register(algorithms.Algorithm(
        "patr_loo", method="patr", estimator="tree_loo", aggregation="traj_mean_group_mean",
        label="PATR, leave-one-out"))
    config = frozenlake.get_config("algo=patr_loo")

Aggregation is each method's own: GRPO and PATR (and Tree-Random, its control) average per
trajectory, then per group, then over prompts (PATR's 1/G sum_i 1/|tau_i| sum_t, so a prompt that
grew 6 leaves weighs as much as one with 4); the public Tree-GRPO code and the baselines' recipes
train with verl's token mean over the batch. The recipes' sources are in docs/methods.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from tree_rl.registry import Registry


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """What `algo=name` sets, and how the reports name it."""

  name: str
  method: str                    # config.rollout.method (tree_rl.rollout.methods)
  estimator: str                 # config.learner.advantage (tree_rl.learner.advantages)
  aggregation: str               # config.learner.aggregation
  label: str = ""                # its name in reports ("" = `name`)
  paper: str = ""                # where it is defined
  recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)
                                 # {"section.field": value} set with it, after the model presets
  setup: Callable[[Any], None] | None = None   # fields that follow the config (after the recipe)
  updates: int = 0               # updates per RL step in its public scripts (train.minibatches,
                                 # one epoch); 0 keeps the config's
  compared: bool = True          # enters the method comparisons (equal-budget sweeps, reports)
  control_of: str = ""           # the algorithm it is an ablation control of (listed before it)
  knobs: tuple[str, ...] = ()    # config.rollout fields that shape its rollout (the methods table)

  @property
  def display(self) -> str:
    return self.label or self.name

  def apply(self, config) -> None:
    """Set the method, estimator, aggregation and recipe on `config` (unlocked or locked)."""
    config.rollout.method = self.method
    config.learner.advantage = self.estimator
    config.learner.aggregation = self.aggregation
    for key, value in self.recipe.items():
      section, field = key.split(".")
      config[section][field] = value
    if self.setup is not None:
      self.setup(config)


_REGISTRY = Registry("algorithm", "algo=")
get = _REGISTRY.get
names = _REGISTRY.names


def register(algorithm: Algorithm) -> Algorithm:
  """Add (or replace) `algorithm` under its name; the sweeps and reports list algorithms in
  registration order."""
  _REGISTRY.register(algorithm.name)(algorithm)
  return algorithm


def all_algorithms() -> list[Algorithm]:
  """Every registered algorithm, in registration order."""
  return [get(n) for n in _REGISTRY.ordered()]


def compared() -> tuple[str, ...]:
  """The algorithms the method comparisons run, in registration order."""
  return tuple(a.name for a in all_algorithms() if a.compared)


def display_order() -> list[str]:
  """The names as reports list them: registration order, each control just before the
  algorithm it controls."""
  order = [a.name for a in all_algorithms() if not a.control_of]
  for a in all_algorithms():
    if a.control_of:
      order.insert(order.index(a.control_of) if a.control_of in order else len(order), a.name)
  return order


def label(name: str) -> str:
  """How reports name `name` (an algorithm's label, else the name itself)."""
  return get(name).display if name in _REGISTRY else name


def _knobs(a: Algorithm) -> str:
  """Its key knobs (`knobs`), then the fields its recipe and setup set, as `field=value`."""
  parts = [f"`{k}`" for k in a.knobs]
  parts += [f"`{key.split('.')[1]}={value}`" for key, value in a.recipe.items()]
  if a.setup is not None and a.setup.__doc__:
    parts.append(a.setup.__doc__.split(": ")[0].strip())
  return ", ".join(parts) or "-"


def markdown_table() -> str:
  """The registered algorithms as a Markdown table (README.md holds exactly this rendering):
  `algo=` name, rollout method, advantage estimator, loss aggregation, updates per RL step in
  its public scripts ("-": the config's), its key knobs and the fields its recipe sets, and its
  paper."""
  rows = ["| `algo=` | name | rollout method | advantage | aggregation | updates / step "
          "| key knobs, recipe | paper |", "|---|---|---|---|---|---|---|---|"]
  for a in all_algorithms():
    rows.append(f"| `{a.name}` | {a.display} | `{a.method}` | `{a.estimator}` | "
                f"`{a.aggregation}` | {a.updates or '-'} | {_knobs(a)} | {a.paper or '-'} |")
  return "\n".join(rows) + "\n"


def _arpo_group(c) -> None:
  """`max_branches=group_size`, `initial_branches=group_size/2`: ARPO's group is its n, half of
  it started as chains (its scripts: 16, 8)."""
  c.rollout.max_branches = int(c.rollout.group_size)
  c.rollout.initial_branches = max(int(c.rollout.group_size) // 2, 1)


TREE_GRPO_PAPER = "Tree-GRPO, arXiv 2509.21240"
PATR_PAPER = "PATR, arXiv 2607.15610"

CHAIN = ("group_size",)
TREE_GRPO = ("num_trees", "expand_nodes", "expand_iterations", "keep_leaves")
PATR = ("initial_branches", "expand_children", "score_every", "expand_top_k", "prune_alpha",
        "prune_repeat", "keep_pruned", "keep_best", "max_branches")

register(Algorithm("grpo", "chain", "grpo", "traj_mean_group_mean", label="chain GRPO",
                   paper="GRPO, arXiv 2402.03300", knobs=CHAIN))
register(Algorithm("tree_grpo", "tree_grpo", "tree_grpo", "token_mean", label="Tree-GRPO",
                   paper=TREE_GRPO_PAPER, knobs=TREE_GRPO))
register(Algorithm("patr", "patr", "grpo", "traj_mean_group_mean", label="PATR",
                   paper=PATR_PAPER, knobs=PATR + ("scorer.name",)))
register(Algorithm("tree_random", "tree_random", "grpo", "traj_mean_group_mean",
                   label="Tree-Random", paper=f"{PATR_PAPER} (its random-scorer control)",
                   control_of="patr", knobs=PATR))
# DAPO (verl recipe/dapo): clip-higher 0.2 / 0.28, dual clip 10, token-level loss, no KL, no
# entropy bonus, dynamic sampling, overlong reward shaping (a window of 20% of the length limit,
# taking off at most 0.5: half the range of the 0/1 success rewards, as the recipe's 1 is of its
# +-1; a reply cut by the per-turn limit counts as overlong: -0.5); 512 prompts in mini-batches
# of 32.
register(Algorithm(
    "dapo", "chain", "grpo", "token_mean", label="DAPO", paper="DAPO, arXiv 2503.14476",
    knobs=CHAIN + ("draw_factor", "max_draws"),
    recipe={"learner.clip_low": 0.2, "learner.clip_high": 0.28, "learner.dual_clip": 10.0,
            "learner.kl_coef": 0.0, "learner.entropy_coef": 0.0,
            "rollout.dynamic_sampling": True, "learner.overlong_window": 0.2,
            "learner.overlong_penalty": 0.5, "learner.overlong_truncated": "penalize"},
    updates=16))
# GiGPO (verl-agent's ALFWorld script and config): step weight 1, gamma 0.95, KL 0.01, clip
# 0.2 / 0.2, entropy bonus 0.001, verl's token mean; 16 x 8 episodes' step rows in mini-batches
# of 256 rows (half the mean episode length: 8 for 16-step episodes).
register(Algorithm(
    "gigpo", "chain", "gigpo", "token_mean", label="GiGPO", paper="GiGPO, arXiv 2505.10978",
    knobs=CHAIN,
    recipe={"learner.step_weight": 1.0, "learner.step_gamma": 0.95,
            "learner.episode_stats": "step_rows", "learner.kl_coef": 0.01,
            "learner.clip_low": 0.2, "learner.clip_high": 0.2, "learner.entropy_coef": 0.001},
    updates=8))
# ARPO (its 7B script and config): soft attribution (a shared prefix is trained with each leaf's
# advantage, the paper's default), verl's token mean, KL 0, clip 0.2 / 0.2, dual clip 3, no
# entropy bonus; its branching fields are the config's (max_branches = group_size (its n),
# initial_branches = n / 2, arpo_alpha / arpo_beta, entropy_tokens; the stochastic rule and the
# reference entropy are the config's defaults); 128 prompts in mini-batches of 16.
register(Algorithm(
    "arpo", "arpo", "grpo", "token_mean", label="ARPO", paper="ARPO, arXiv 2507.19849",
    knobs=("group_size", "expand_children", "arpo_rule", "arpo_alpha", "arpo_beta",
           "arpo_entropy", "entropy_tokens"),
    recipe={"learner.shared_advantage": "per_leaf", "learner.kl_coef": 0.0,
            "learner.clip_low": 0.2, "learner.clip_high": 0.2, "learner.dual_clip": 3.0,
            "learner.entropy_coef": 0.0},
    setup=_arpo_group, updates=8))
# Chains with the leave-one-out baseline, and `chain`, GRPO under the method's name.
register(Algorithm("rloo", "chain", "rloo", "traj_mean_group_mean", label="RLOO",
                   paper="RLOO, arXiv 2402.14740", compared=False, knobs=CHAIN))
register(Algorithm("chain", "chain", "grpo", "traj_mean_group_mean", compared=False,
                   knobs=CHAIN))
