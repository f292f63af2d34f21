"""Per-prompt rollout cost accounting, the budget cap, and the planned cost of a config.

Counters (int32 [P]):
- generated: tokens the sampler decoded;
- prefilled: tokens the sampler actually computed in prefill (the prompt once, observations);
- reused:    context tokens a branch got from shared pages instead of re-encoding them: a fork
             of a node whose context is c tokens reuses c tokens. `prefilled + reused` is what
             the no-sharing baseline (every expansion re-prefills its whole prefix) computes;
- env_steps: environment steps taken; tool_calls: the steps the env counted as tool calls;
- forks:     branches started by forking a context that another branch also continues;
- pruned:    branches a routing policy stopped.

Budget cap (`config.rollout.budget > 0`, in `config.rollout.budget_unit`): a soft cap on
starting branches, never a cut. A branch that has started always runs to its end (finished,
pruned or the turn limit) and is charged. At every turn boundary the method's requests are
split into continuations of running branches (always granted) and new branches (a chain from
the root, a fork, an expansion). A new branch starts only if its worst-case cost fits:

    spent + sum(remaining(running branches)) + sum(remaining(new branches so far)) <= budget

where `remaining` (`CostModel.remaining`) is the most a branch continuing from a node at depth
d can still spend: `max_turns - d` turns at their most expensive. New branches are granted in
slot order while they fit; a refused one never starts (chain asks again at the next boundary,
so its chains start in waves as running chains end; Tree-GRPO's and PATR's refused expansions
and ARPO's refused forks are skipped). Hence spent <= budget always, no leaf is cut by the
budget (`budget_cut` in the statistics counts leaves stopped before the turn limit for any
reason other than the episode ending or pruning: 0), and a chain group under a budget has
fewer, complete chains.
`validation` refuses a budget below one trajectory's cost (`CostModel.trajectory`).

Planned cost (`planned_trajectories`, `planned_cost`): what a config's rollout shape costs per
prompt if every branch runs to the turn limit, in trajectories (x `trajectory` for a unit). Each
rollout method states its own (`RolloutMethod.planned_trajectories`: chain G; Tree-GRPO
M * (1 + L * N / 2); PATR / Tree-Random B0 plus the branches its expansions start, with all
branches alive and none pruned; ARPO its full group). Sweeps that compare methods at an equal
budget are checked against it (`experiments/sweeps/build.py`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.rollout import methods

UNITS = ("generated", "computed", "tool_calls", "env_steps")


@struct.dataclass
class Budget:
  generated: jax.Array
  prefilled: jax.Array
  reused: jax.Array
  env_steps: jax.Array
  tool_calls: jax.Array
  forks: jax.Array
  pruned: jax.Array

  @staticmethod
  def zeros(num_prompts: int) -> "Budget":
    return Budget(*(jnp.zeros((num_prompts,), jnp.int32) for _ in range(7)))

  def add(self, **counts) -> "Budget":
    """Add per-prompt counts ([P] arrays) to the named counters."""
    unknown = set(counts) - set(self.__dataclass_fields__)
    if unknown:
      raise KeyError(f"unknown budget counters {sorted(unknown)}")
    return self.replace(**{k: getattr(self, k) + jnp.asarray(v, jnp.int32) for k, v in counts.items()})

  def spent(self, unit: str) -> jax.Array:
    """What the equal-budget mode compares, per prompt."""
    check_unit(unit)
    if unit == "generated":
      return self.generated
    if unit == "computed":
      return self.generated + self.prefilled
    if unit == "tool_calls":
      return self.tool_calls
    return self.env_steps

  def as_dict(self) -> dict:
    return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check_unit(unit: str) -> None:
  if unit not in UNITS:
    raise ValueError(f"config.rollout.budget_unit={unit!r}; known: {UNITS}")


@dataclasses.dataclass(frozen=True)
class CostModel:
  """Upper bounds on what one branch can spend, per unit (static; hashable for jit).

  prompt_tokens / obs_tokens: the engine's prompt and observation capacities (the `computed`
  unit needs them); max_calls: the env's tool calls per episode when it has a limit;
  share_prefix=False: a new branch re-encodes its parent's context (the no-sharing baseline).
  """

  max_turns: int
  max_tokens_per_turn: int
  prompt_tokens: int | None = None
  obs_tokens: int | None = None
  max_calls: int | None = None
  share_prefix: bool = True

  def remaining(self, unit: str, depth, ctx_len=0, fork=False, xp=jnp):
    """Most a branch whose next turn follows a node at `depth` can still spend in `unit`
    (arrays broadcast): every turn decodes `max_tokens_per_turn`, every turn but the last is
    followed by a full observation (prefilled with the turn's last token), and a fork in the
    no-sharing baseline first re-encodes its parent's `ctx_len` context tokens (+1 pending).
    xp: the array module (numpy for host constants: nothing compiled)."""
    check_unit(unit)
    turns = xp.maximum(self.max_turns - xp.asarray(depth, xp.int32), 0)
    if unit == "generated":
      return turns * self.max_tokens_per_turn
    if unit == "computed":
      if self.obs_tokens is None:
        raise ValueError("the computed unit needs the engine's observation capacity")
      cost = turns * self.max_tokens_per_turn + xp.maximum(turns - 1, 0) * (self.obs_tokens + 1)
      if not self.share_prefix:
        cost = cost + xp.where(fork, xp.asarray(ctx_len, xp.int32) + 1, 0)
      return cost
    if unit == "tool_calls" and self.max_calls is not None:
      return xp.minimum(turns, self.max_calls)
    return turns          # env_steps; tool calls at most one per step

  def trajectory(self, unit: str) -> int | None:
    """The most one trajectory can spend in `unit` (its prompt too in `computed`; None when that
    needs capacities not given): the floor of a meaningful per-prompt budget."""
    if unit == "computed" and (self.prompt_tokens is None or self.obs_tokens is None):
      check_unit(unit)
      return None
    extra = self.prompt_tokens if unit == "computed" else 0
    return int(self.remaining(unit, 0, xp=np)) + extra


def trajectory_cost(unit: str, *, max_turns: int, max_tokens_per_turn: int,
                    prompt_tokens: int | None = None, obs_tokens: int | None = None,
                    max_calls: int | None = None) -> int | None:
  """`CostModel(...).trajectory(unit)`: the most one trajectory can spend in `unit`."""
  return CostModel(int(max_turns), int(max_tokens_per_turn), prompt_tokens, obs_tokens,
                   max_calls).trajectory(unit)


def admit(costs: CostModel, unit: str, limit: int, spent: jax.Array, parents: jax.Array,
          running: jax.Array, fork: jax.Array, depth: jax.Array, ctx_len: jax.Array) -> jax.Array:
  """The budget cap on one boundary's requests: -> parents [P, S] with refused new branches -1.

  spent [P] in `unit`; parents [P, S] requested parent nodes (-1 none); running [P, S] the
  request continues a running branch (granted); fork [P, S] the request forks its parent's
  context (`per_parent_forks`); depth / ctx_len [P, S] of the parent nodes.
  New branches are granted in slot order while spent + the running branches' and the granted
  new branches' `remaining` cost stays <= limit (limit <= 0: everything is granted).
  """
  if limit <= 0:
    return parents
  req = parents >= 0
  new = req & ~running
  cost = jnp.where(req, costs.remaining(unit, depth, ctx_len, fork), 0)
  committed = spent + jnp.sum(jnp.where(running & req, cost, 0), axis=1)
  need = committed[:, None] + jnp.cumsum(jnp.where(new, cost, 0), axis=1)
  return jnp.where(req & (running | (need <= limit)), parents, -1)


def planned_trajectories(rc) -> float:
  """Planned cost per prompt of `config.rollout` `rc`, in full trajectories: its method's
  `planned_trajectories` (module docstring)."""
  return methods.get(rc.method)(rc).planned_trajectories(int(rc.max_turns))


def planned_cost(rc, unit: str | None = None, **capacities) -> float | None:
  """Planned cost per prompt in `unit` (default `rc.budget_unit`): planned trajectories x one
  trajectory's cost (`capacities`: prompt_tokens / obs_tokens / max_calls, as `CostModel`)."""
  unit = unit or rc.budget_unit
  one = trajectory_cost(unit, max_turns=rc.max_turns, max_tokens_per_turn=rc.max_tokens_per_turn,
                        **capacities)
  return None if one is None else planned_trajectories(rc) * one


def per_parent_forks(parents: jax.Array, mask: jax.Array, had_children: jax.Array) -> jax.Array:
  """bool [P, S]: which new children of one turn count as forks.

  parents [P, S] local parent ids of the new children (in slot order), mask [P, S] real
  children, had_children [P, S] whether that parent already had a child before this turn.
  The first child of a parent without children continues its context; every other child forks.
  """
  s = parents.shape[1]
  same = (parents[:, :, None] == parents[:, None, :]) & mask[:, None, :]
  earlier = jnp.tril(jnp.ones((s, s), bool), k=-1)[None]
  has_earlier = jnp.any(same & earlier, axis=2)
  return mask & (has_earlier | had_children)
