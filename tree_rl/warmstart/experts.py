"""Scripted experts for demonstrations, registered with their environment.

An expert is a small object built from an environment and a noise level:

    expert = make_expert("frozenlake", env, epsilon=0.1)
    row, noisy, intended = expert.act(key, state, params)   # jittable, vmappable

Every reply the expert can give is one row of a host-side table `expert.reply_texts`; the reply
on the wire is `reply_texts[row]` followed by the tokenizer's end-of-turn token. `intended` is
the row the noiseless expert would pick, `noisy` whether `row` differs from it.
`expert.success(state)` says whether an episode ended in success.

A notebook adds an expert for a new env where it registers the env:

    tree_rl.envs.register("myenv", MyEnv, tasks=..., expert=make_my_expert)  # (env, epsilon) -> Expert
"""

from __future__ import annotations

from typing import Protocol, Sequence

import jax

from tree_rl import envs


class Expert(Protocol):
  reply_texts: Sequence[str]

  def act(self, key: jax.Array, state, params) -> tuple[jax.Array, jax.Array, jax.Array]:
    """-> (row int32, noisy bool, intended row int32) for one (unbatched) env state."""

  def success(self, state) -> jax.Array:
    """bool: the episode in `state` ended in success."""


def registered_experts() -> list[str]:
  """Envs registered with a warm-start expert."""
  return [n for n in envs.registered() if envs.entry(n).expert is not None]


def make_expert(name: str, env, epsilon: float) -> Expert:
  """The expert registered with env `name` (config.env.name) at noise level `epsilon`."""
  if name not in registered_experts():
    raise KeyError(f"no warm-start expert for env {name!r} (config.env.name); "
                   f"registered: {registered_experts()}; add one with "
                   f"tree_rl.envs.register(name, factory, expert=...)")
  if not 0.0 <= float(epsilon) <= 1.0:
    raise ValueError(f"warmstart.epsilon must be in [0, 1], got {epsilon}")
  return envs.entry(name).part("expert")(env, float(epsilon))
