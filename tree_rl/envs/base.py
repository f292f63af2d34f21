"""The environment interface (gymnax / jumanji style) and state snapshots.

An environment is a Python object holding static set-up (capacities, token tables) with pure
methods over pytrees:

    params = env.default_params
    state, obs = env.reset(key, params)
    state, obs, reward, done, info = env.step(key, state, action, params)

`state` and `params` are `flax.struct.dataclass` pytrees of arrays, so every method is jittable and
vmappable, and a state can be snapshotted and restored: it is a pytree of immutable arrays, so a
branch point of a rollout tree keeps a reference (or `snapshot` for a defensive device copy) and a
branch continues with `env.step(key, snapshot, ...)`. `take(states, i)` picks one env of a batch
and `repeat(state, n)` broadcasts one state into `n` branches.

`TokenEnv` adds what the rollout engine calls: token rendering and action parsing on device.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class Environment(abc.ABC):
  """Pure-function environment: static set-up on the object, all mutable data in `state`."""

  name: str = ""

  @property
  @abc.abstractmethod
  def default_params(self) -> Any:
    ...

  @abc.abstractmethod
  def reset(self, key: jax.Array, params: Any) -> tuple[Any, jax.Array]:
    """-> (state, obs)."""

  @abc.abstractmethod
  def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any
           ) -> tuple[Any, jax.Array, jax.Array, jax.Array, dict]:
    """-> (state, obs, reward, done, info). A done state stays put with reward 0."""


class TokenEnv(Environment):
  """An environment the rollout engine can drive: it speaks token ids on device.

  A subclass fills in, besides `default_params`, `reset` and `step`, the three token methods
  below (all jittable and vmappable over states) and may override `tool_calls`. The episode's
  turn limit is `params.max_turns`; the registered factory receives it as `max_turns`.
  `has_tools`: the agent calls tools (evaluation then reports tool calls per episode).
  """

  has_tools: bool = False

  @abc.abstractmethod
  def initial_prompt_tokens(self, state: Any, params: Any = None) -> tuple[jax.Array, jax.Array]:
    """-> (int32 [prompt_capacity] tokens, length): the first user message with chat markup
    and the generation prompt."""

  @abc.abstractmethod
  def observation_tokens(self, state: Any, turn_closed: jax.Array, params: Any = None
                         ) -> tuple[jax.Array, jax.Array]:
    """-> (int32 [obs_capacity] tokens, length): closes the agent turn unless `turn_closed`
    (the reply ended with the end-of-turn token), then the observation of `state` and the
    generation prompt."""

  @abc.abstractmethod
  def parse_action(self, tokens: jax.Array, length: jax.Array) -> Any:
    """The action for `step` from a reply's generated ids (`tokens[:length]`)."""

  def state_key(self, state: Any) -> jax.Array:
    """int32 anchor key of `state`: equal keys mean the agent stands in the same situation
    (step-level estimators such as GiGPO group turns by it). Default: a hash of every leaf; an
    env overrides it to leave out counters that do not change what the agent faces."""
    return pytree_hash(state)

  def eval_groups(self, states: Any) -> tuple[str, np.ndarray] | None:
    """(name, int labels [N]) of a batch of initial states: the evaluation also reports success
    per label (FrozenLake: the map's side), read on the host. Default None: no groups."""
    del states
    return None

  def tool_calls(self, before: Any, after: Any) -> jax.Array:
    """int32: tool calls the step from `before` to `after` made (budgets in `tool_calls`).
    Default: every env step is one call."""
    del before, after
    return jnp.int32(1)


def pytree_hash(tree: Any) -> jax.Array:
  """An int32 fingerprint of a pytree of integer / boolean arrays (equal trees hash equal)."""
  leaves = [jnp.ravel(jnp.asarray(x)).astype(jnp.uint32) for x in jax.tree.leaves(tree)]
  flat = jnp.concatenate(leaves) if leaves else jnp.zeros((1,), jnp.uint32)
  mult = jnp.uint32(1000003) ** jnp.arange(1, flat.shape[0] + 1, dtype=jnp.uint32)
  return (jnp.sum(flat * mult + jnp.uint32(97)) & jnp.uint32(0x7FFFFFFF)).astype(jnp.int32)


def snapshot(state: Any) -> Any:
  """A device copy of `state` (states are immutable, so keeping a reference is equally safe)."""
  return jax.tree.map(jnp.copy, state)


def restore(snap: Any) -> Any:
  """The state to continue from; stepping it never changes `snap`."""
  return snap


def take(states: Any, index) -> Any:
  """Env `index` of a batched state (index may be an int or an int array of branch sources)."""
  return jax.tree.map(lambda x: x[index], states)


def repeat(state: Any, n: int) -> Any:
  """`n` copies of one (unbatched) state along a new leading axis: `n` branches of one node."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + x.shape), state)
