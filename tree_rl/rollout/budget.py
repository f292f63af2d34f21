"""Per-prompt rollout cost accounting and the equal-budget mode.

Counters (int32 [P]):
- generated: tokens the sampler decoded;
- prefilled: tokens the sampler actually computed in prefill (the prompt once, observations);
- reused:    context tokens a branch got from shared pages instead of re-encoding them: a fork
             of a node whose context is c tokens reuses c tokens. `prefilled + reused` is what
             the no-sharing baseline (every expansion re-prefills its whole prefix) computes;
- env_steps: environment steps taken; tool_calls: the steps the env counted as tool calls;
- forks:     branches started by forking a context that another branch also continues;
- pruned:    branches a routing policy stopped.

Budget mode (`config.rollout.budget > 0`): once a prompt has spent its budget in
`config.rollout.budget_unit`, it starts no new branch and its active branches stop (truncated)
at the next turn boundary; a turn in flight finishes, so the overshoot is at most one turn per
active branch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

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


def trajectory_cost(unit: str, *, max_turns: int, max_tokens_per_turn: int,
                    max_context: int | None = None, max_calls: int | None = None) -> int | None:
  """The most one trajectory can spend in `unit` (None when it needs the engine's
  `max_context` and that is not given): the floor of a meaningful per-prompt budget."""
  check_unit(unit)
  if unit == "generated":
    return max_turns * max_tokens_per_turn
  if unit == "computed":   # its prompt, every reply and every observation
    return max_context
  if unit == "tool_calls" and max_calls is not None:
    return min(max_turns, max_calls)
  return max_turns          # env_steps, or tool calls of an env where every step is one


def exhausted(budget: Budget, limit: int, unit: str) -> jax.Array:
  """bool [P]: the prompt has spent `limit` (never when limit <= 0)."""
  check_unit(unit)
  if limit <= 0:
    return jnp.zeros(budget.generated.shape, bool)
  return budget.spent(unit) >= limit


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
