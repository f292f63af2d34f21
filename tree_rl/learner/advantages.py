"""Advantage estimators behind one registry.

Every estimator has the same signature::

    fn(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6) -> advantages

- rewards    float [N]  outcome reward of each trajectory (leaf)
- prompt_ids int   [N]  which prompt the trajectory answers (any integers)
- tree_ids   int   [N]  which tree of that prompt it belongs to (any integers; a chain is its own tree)
- valid      bool  [N]  False for padding / dropped slots: they enter no statistic and get advantage 0
- eps        the denominator guard of the std normalisation

and returns float32 advantages [N], one per trajectory: the learner puts each on its leaf, and
every token on the leaf's path is trained with it.
All built-ins are jittable: fixed-size arrays, masks and segment sums, no data-dependent shapes.

Group statistics follow the public Tree-GRPO/verl convention: std is unbiased (n - 1), and a group
with a single valid member uses mean 0 and std 1, so its advantage is r / (1 + eps). Unlike that
code, a group whose rewards are all equal gets advantage exactly 0 under every estimator
(statistics are taken of rewards shifted by the group minimum; see `group_stats`).
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp

from tree_rl.registry import Registry

__all__ = ["register", "get", "names", "group_stats"]


class Estimator(Protocol):

  def __call__(self, rewards: jax.Array, prompt_ids: jax.Array, tree_ids: jax.Array,
               valid: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    ...


_REGISTRY = Registry("advantage estimator", "config.learner.advantage")
register = _REGISTRY.register   # decorator: `@register("my_adv")` makes get("my_adv") find it
get = _REGISTRY.get
names = _REGISTRY.names         # used by config validation


# ---------------------------------------------------------------------------------------------
# Segment helpers.


def dense_ids(ids: jax.Array, valid: jax.Array) -> jax.Array:
  """Map arbitrary integer ids to 0..N-1 (same id -> same index); invalid slots get index N-1
  or a shared one, which is harmless because they are masked out of every sum."""
  n = ids.shape[0]
  _, inverse = jnp.unique(jnp.where(valid, ids, jnp.iinfo(jnp.int32).max), return_inverse=True,
                          size=n, fill_value=jnp.iinfo(jnp.int32).max)
  return inverse.reshape(n).astype(jnp.int32)


def _shifted(values: jax.Array, groups: jax.Array, valid: jax.Array):
  """(values minus their group's smallest valid value, 0 on invalid slots; group counts [N]).

  Statistics of the shifted values are exact where it matters: an all-equal group shifts to
  exact zeros, so its deviations and std are exactly 0 (the float32 mean of unshifted equal
  values can land an ulp off, which std + eps then blows up to advantages of ~0.1).
  """
  n = values.shape[0]
  x = values.astype(jnp.float32)
  low = jax.ops.segment_min(jnp.where(valid, x, jnp.inf), groups, num_segments=n)
  shifted = jnp.where(valid, x - low[groups], 0.0)
  count = jax.ops.segment_sum(valid.astype(jnp.float32), groups, num_segments=n)
  return shifted, count


def group_stats(values: jax.Array, groups: jax.Array, valid: jax.Array):
  """Per-member (deviation from its group's mean, unbiased std, count) over valid members;
  groups in [0, N). An all-equal group has deviation and std exactly 0. A group with one valid
  member uses mean 0 and std 1 (the public-code convention): its deviation is the value itself.
  """
  n = values.shape[0]
  shifted, count = _shifted(values, groups, valid)
  mean = jax.ops.segment_sum(shifted, groups, num_segments=n) / jnp.maximum(count, 1.0)
  dev = jnp.where(valid, shifted - mean[groups], 0.0)
  ss = jax.ops.segment_sum(dev * dev, groups, num_segments=n)
  std = jnp.sqrt(ss / jnp.maximum(count - 1.0, 1.0))
  single = (count <= 1.0)[groups]
  dev = jnp.where(single, values.astype(jnp.float32), dev)
  return dev, jnp.where(single, 1.0, std[groups]), count[groups]


def _normalise(values, groups, valid, eps, *, use_std=True):
  dev, std, _ = group_stats(values, groups, valid)
  adv = dev / (std + eps) if use_std else dev
  return jnp.where(valid, adv, 0.0).astype(jnp.float32)


def _prompt_groups(prompt_ids, valid):
  return dense_ids(prompt_ids, valid)


def _tree_groups(prompt_ids, tree_ids, valid):
  n = prompt_ids.shape[0]
  p = dense_ids(prompt_ids, valid)
  t = dense_ids(tree_ids, valid)
  return dense_ids(p * n + t, valid)


# ---------------------------------------------------------------------------------------------
# Built-in estimators.


@register("grpo")
def grpo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """(r - mean_P) / (std_P + eps) over all trajectories of the same prompt."""
  del tree_ids
  return _normalise(rewards, _prompt_groups(prompt_ids, valid), valid, eps)


@register("drgrpo")
def drgrpo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """Dr. GRPO: r - mean_P, no std division (a single-member group keeps r)."""
  del tree_ids, eps
  return _normalise(rewards, _prompt_groups(prompt_ids, valid), valid, 0.0, use_std=False)


@register("rloo")
def rloo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """r_i - mean of the other valid trajectories of the same prompt (baseline 0 when alone)."""
  del tree_ids, eps
  n = rewards.shape[0]
  groups = _prompt_groups(prompt_ids, valid)
  r, count = _shifted(rewards, groups, valid)    # a shift cancels in r_i - mean(others)
  total = jax.ops.segment_sum(r, groups, num_segments=n)[groups]
  count = count[groups]
  alone = jnp.where(valid, rewards.astype(jnp.float32), 0.0)
  baseline = (total - r) / jnp.maximum(count - 1.0, 1.0)
  return jnp.where(valid, jnp.where(count > 1.0, r - baseline, alone), 0.0)


@register("tree_inter")
def tree_inter(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """Tree-GRPO A_inter: normalised over all leaves of the same prompt (same as grpo)."""
  return grpo(rewards, prompt_ids, tree_ids, valid, eps=eps)


@register("tree_intra")
def tree_intra(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """Tree-GRPO A_intra: normalised over the leaves of the same tree of the same prompt."""
  return _normalise(rewards, _tree_groups(prompt_ids, tree_ids, valid), valid, eps)


@register("tree_grpo")
def tree_grpo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """Tree-GRPO: A = A_intra + A_inter."""
  return (tree_intra(rewards, prompt_ids, tree_ids, valid, eps=eps)
          + tree_inter(rewards, prompt_ids, tree_ids, valid, eps=eps))


@register("tree_2norm")
def tree_2norm(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
  """Normalise over the prompt, then re-normalise those values within each tree."""
  first = _normalise(rewards, _prompt_groups(prompt_ids, valid), valid, eps)
  return _normalise(first, _tree_groups(prompt_ids, tree_ids, valid), valid, eps)
