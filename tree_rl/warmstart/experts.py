"""Scripted experts for demonstrations, in a registry keyed by env name.

An expert is a small object built from an environment and a noise level:

    expert = make_expert("frozenlake", env, epsilon=0.1)
    row, noisy, intended = expert.act(key, state, params)   # jittable, vmappable

Every reply the expert can give is one row of a host-side table `expert.reply_texts`; the reply
on the wire is `reply_texts[row]` followed by the tokenizer's end-of-turn token. `intended` is
the row the noiseless expert would pick, `noisy` whether `row` differs from it.
`expert.success(state)` says whether an episode ended in success.

A notebook adds an expert for a new env with

    @register_expert("myenv")
    def make_my_expert(env, epsilon): ...
"""

from __future__ import annotations

from typing import Callable, Protocol, Sequence

import jax


class Expert(Protocol):
  reply_texts: Sequence[str]

  def act(self, key: jax.Array, state, params) -> tuple[jax.Array, jax.Array, jax.Array]:
    """-> (row int32, noisy bool, intended row int32) for one (unbatched) env state."""

  def success(self, state) -> jax.Array:
    """bool: the episode in `state` ended in success."""


_EXPERTS: dict[str, Callable] = {}


def register_expert(name: str, factory: Callable | None = None, *, overwrite: bool = False):
  """Register `factory(env, epsilon) -> Expert` for the env registered as `name`.

  Use as `register_expert("name", factory)` or as the decorator `@register_expert("name")`.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"expert name must be a non-empty string, got {name!r}")

  def add(f):
    if name in _EXPERTS and not overwrite and _EXPERTS[name] is not f:
      raise ValueError(f"an expert for env {name!r} is already registered; pass overwrite=True")
    _EXPERTS[name] = f
    return f

  return add if factory is None else add(factory)


def registered_experts() -> list[str]:
  return sorted(_EXPERTS)


def make_expert(name: str, env, epsilon: float) -> Expert:
  """The expert registered for env `name` (config.env.name) at noise level `epsilon`."""
  if name not in _EXPERTS:
    raise KeyError(f"no warm-start expert for env {name!r} (config.env.name); "
                   f"registered: {registered_experts()}; add one with register_expert")
  if not 0.0 <= float(epsilon) <= 1.0:
    raise ValueError(f"warmstart.epsilon must be in [0, 1], got {epsilon}")
  return _EXPERTS[name](env, float(epsilon))
