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

A step-level estimator also declares a keyword `steps` (a `StepInputs`: each trajectory's turns,
[N, D]) and returns [N, D], one advantage per turn: the turn's tokens are trained with it.
`gigpo` is the built-in one.
All built-ins are jittable: fixed-size arrays, masks and segment sums, no data-dependent shapes.

An estimator's own knobs are declared where it is registered, name -> default or
`tree_rl.fields.Field` (default, range, doc)::

    @register("scaled_grpo", scale=Field(2.0, "num (0 _)", "what the advantages are scaled by"))
    def scaled_grpo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6, scale=2.0): ...

Each knob is a config field `learner.<knob>` with that default (`tree_rl.config.base_config`
adds every registered estimator's), saved in config.json and loaded back, and passed to the
estimator as the keyword of its name (a static value: changing it compiles anew). Estimators
may share a knob (GiGPO's `step_weight`, `step_gamma`, `episode_stats`) with one default.

Group statistics follow the public Tree-GRPO/verl convention: std is unbiased (n - 1), and a group
with a single valid member uses mean 0 and std 1, so its advantage is r / (1 + eps). Unlike that
code, a group whose rewards are all equal gets advantage exactly 0 under every estimator
(statistics are taken of rewards shifted by the group minimum; see `group_stats`).
"""

from __future__ import annotations

import inspect
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl import fields
from tree_rl.fields import Field
from tree_rl.registry import Registry

__all__ = ["register", "get", "names", "knobs", "group_stats", "StepInputs", "compute",
           "shared_mean"]


class Estimator(Protocol):

  def __call__(self, rewards: jax.Array, prompt_ids: jax.Array, tree_ids: jax.Array,
               valid: jax.Array, *, eps: float = 1e-6) -> jax.Array:
    ...


@struct.dataclass
class StepInputs:
  """The turns of every trajectory, [N, D] (trajectory, turn 1..D in order; D = max_turns)."""

  node: jax.Array       # int32 node id of the turn within its prompt's tree(s), -1 past the leaf
  state_key: jax.Array  # int32 anchor key of the env state the turn acted from (`state_key`)
  reward: jax.Array     # float32 env reward of the turn
  mask: jax.Array       # bool the turn exists


_REGISTRY = Registry("advantage estimator", "config.learner.advantage")
get = _REGISTRY.get
names = _REGISTRY.names         # used by config validation


def register(name: str, **knob_defaults):
  """Decorator: `@register("my_adv", knob=default, ...)` makes get("my_adv") find the function
  and declares its knobs (module docstring); each must be a keyword the function takes."""

  def deco(fn):
    params = inspect.signature(fn).parameters
    missing = sorted(k for k in knob_defaults if k not in params)
    if missing:
      raise TypeError(f"advantage estimator {name!r} declares knobs {missing} that it does not "
                      f"take as keyword arguments")
    fields.declare("learner", f"advantage {name}", knob_defaults)
    _REGISTRY.register(name)(fn)
    return fn

  return deco


def knobs(name: str) -> dict[str, Any]:
  """{knob: default} of estimator `name`."""
  get(name)
  return {k: f.default for k, f in fields.owned("learner", f"advantage {name}").items()}


# How a step-level estimator weighs trajectories in its episode statistics: `step_rows` each by
# its number of turns (the public GiGPO code takes mean and std over the batch's step rows),
# `trajectories` each once.
EPISODE_STATS = ("step_rows", "trajectories")


def is_step_level(name: str) -> bool:
  """Whether estimator `name` reads the trajectories' turns (declares `steps`)."""
  return "steps" in inspect.signature(get(name)).parameters


def compute(name: str, rewards, prompt_ids, tree_ids, valid, *, eps: float = 1e-6,
            steps: StepInputs | None = None, **options) -> jax.Array:
  """Call estimator `name`, passing `steps` and those of `options` (knob values) it takes."""
  fn = get(name)
  params = inspect.signature(fn).parameters
  kw = {k: v for k, v in options.items() if k in params}
  if "steps" in params:
    if steps is None:
      raise ValueError(f"advantage estimator {name!r} is step-level: it needs `steps`")
    kw["steps"] = steps
  return fn(rewards, prompt_ids, tree_ids, valid, eps=eps, **kw)


# ---------------------------------------------------------------------------------------------
# Segment helpers.


def dense_ids(ids: jax.Array, valid: jax.Array) -> jax.Array:
  """Map arbitrary integer ids to 0..N-1 (same id -> same index); invalid slots get index N-1
  or a shared one, which is harmless because they are masked out of every sum."""
  n = ids.shape[0]
  _, inverse = jnp.unique(jnp.where(valid, ids, jnp.iinfo(jnp.int32).max), return_inverse=True,
                          size=n, fill_value=jnp.iinfo(jnp.int32).max)
  return inverse.reshape(n).astype(jnp.int32)


def _shifted(values: jax.Array, groups: jax.Array, valid: jax.Array, weights=None):
  """(values minus their group's smallest valid value, 0 on invalid slots; group counts [N],
  each valid member counted `weights` times when given).

  Statistics of the shifted values are exact where it matters: an all-equal group shifts to
  exact zeros, so its deviations and std are exactly 0 (the float32 mean of unshifted equal
  values can land an ulp off, which std + eps then blows up to advantages of ~0.1).
  """
  n = values.shape[0]
  x = values.astype(jnp.float32)
  low = jax.ops.segment_min(jnp.where(valid, x, jnp.inf), groups, num_segments=n)
  shifted = jnp.where(valid, x - low[groups], 0.0)
  w = valid.astype(jnp.float32) if weights is None else jnp.where(valid, weights, 0.0)
  count = jax.ops.segment_sum(w.astype(jnp.float32), groups, num_segments=n)
  return shifted, count


def group_stats(values: jax.Array, groups: jax.Array, valid: jax.Array, weights=None):
  """Per-member (deviation from its group's mean, unbiased std, count) over valid members;
  groups in [0, N). An all-equal group has deviation and std exactly 0. A group with one valid
  member uses mean 0 and std 1 (the public-code convention): its deviation is the value itself.
  weights [N] (integers >= 1): member i stands for weights[i] equal samples (the statistics of
  the list with each value repeated; "one member" is then a total count of 1).
  """
  n = values.shape[0]
  shifted, count = _shifted(values, groups, valid, weights)
  w = jnp.ones_like(shifted) if weights is None else weights.astype(jnp.float32)
  mean = jax.ops.segment_sum(w * shifted, groups, num_segments=n) / jnp.maximum(count, 1.0)
  dev = jnp.where(valid, shifted - mean[groups], 0.0)
  ss = jax.ops.segment_sum(w * dev * dev, groups, num_segments=n)
  std = jnp.sqrt(ss / jnp.maximum(count - 1.0, 1.0))
  single = (count <= 1.0)[groups]
  dev = jnp.where(single, values.astype(jnp.float32), dev)
  return dev, jnp.where(single, 1.0, std[groups]), count[groups]


def _normalise(values, groups, valid, eps, *, use_std=True, weights=None):
  dev, std, _ = group_stats(values, groups, valid, weights)
  adv = dev / (std + eps) if use_std else dev
  return jnp.where(valid, adv, 0.0).astype(jnp.float32)


def _prompt_groups(prompt_ids, valid):
  return dense_ids(prompt_ids, valid)


def pair_ids(a: jax.Array, b: jax.Array, valid: jax.Array) -> jax.Array:
  """Dense ids 0..M-1 of the distinct (a, b) pairs among valid slots (exact: no hashing of the
  pair); invalid slots share one id of their own. All arrays [M]."""
  big = jnp.iinfo(jnp.int32).max
  a = jnp.where(valid, a, big).astype(jnp.int32)
  b = jnp.where(valid, b, big).astype(jnp.int32)
  order = jnp.lexsort((b, a))
  sa, sb = a[order], b[order]
  new = jnp.concatenate([jnp.ones((1,), bool), (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])])
  return jnp.zeros_like(a).at[order].set(jnp.cumsum(new).astype(jnp.int32) - 1)


def discounted_returns(reward: jax.Array, mask: jax.Array, gamma: float) -> jax.Array:
  """R[n, t] = sum_{k >= t} gamma^(k - t) r[n, k] over the turns in `mask` ([N, D]); 0 outside."""
  r = jnp.where(mask, reward.astype(jnp.float32), 0.0)

  def back(acc, x):
    acc = x + gamma * acc
    return acc, acc

  _, out = jax.lax.scan(back, jnp.zeros(r.shape[0], jnp.float32), r.T, reverse=True)
  return jnp.where(mask, out.T, 0.0)


def shared_mean(advantages: jax.Array, prompt_ids: jax.Array, valid: jax.Array,
                steps: StepInputs) -> jax.Array:
  """[N, D]: every turn gets the mean advantage of the valid trajectories through its node (a
  prefix shared by several leaves carries the mean of theirs; ARPO's hard attribution).
  advantages [N] (per trajectory) or [N, D] (per turn)."""
  n, d = steps.mask.shape
  m = steps.mask & valid[:, None]
  adv = jnp.broadcast_to(advantages.astype(jnp.float32).reshape(n, -1), (n, d))
  pid = jnp.broadcast_to(_prompt_groups(prompt_ids, valid)[:, None], (n, d))
  groups = pair_ids(pid.reshape(-1), steps.node.reshape(-1), m.reshape(-1))
  flat = jnp.where(m, adv, 0.0).reshape(-1)
  total = jax.ops.segment_sum(flat, groups, num_segments=n * d)
  count = jax.ops.segment_sum(m.reshape(-1).astype(jnp.float32), groups, num_segments=n * d)
  mean = (total / jnp.maximum(count, 1.0))[groups].reshape(n, d)
  return jnp.where(m, mean, 0.0)


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


def _gigpo(rewards, prompt_ids, valid, eps, steps, step_weight, step_gamma, use_std,
           episode_stats):
  if episode_stats not in EPISODE_STATS:
    raise ValueError(f"learner.episode_stats={episode_stats!r}; known: {EPISODE_STATS}")
  n, d = steps.mask.shape
  prompts = _prompt_groups(prompt_ids, valid)
  m = steps.mask & valid[:, None]
  turns = jnp.sum(m, axis=1) if episode_stats == "step_rows" else None
  episode = _normalise(rewards, prompts, valid, eps, use_std=use_std, weights=turns)
  ret = discounted_returns(steps.reward, m, step_gamma).reshape(-1)
  pid = jnp.broadcast_to(prompts[:, None], (n, d)).reshape(-1)
  flat_m = m.reshape(-1)
  groups = pair_ids(pid, steps.state_key.reshape(-1), flat_m)
  dev, std, count = group_stats(ret, groups, flat_m)
  step = jnp.where(count > 1.0, dev / (std + eps) if use_std else dev, 0.0).reshape(n, d)
  return jnp.where(m, episode[:, None] + step_weight * step, 0.0).astype(jnp.float32)


# GiGPO's knobs (config.learner.<knob>)
GIGPO_KNOBS = dict(
    step_weight=Field(1.0, "num [0 _)", "gigpo: the weight w of A_step in A_episode + w * A_step"),
    step_gamma=Field(0.95, "num [0 1]", "gigpo: the discount of the step return"),
    episode_stats=Field("step_rows", "", "gigpo: episode mean / std over step_rows (each "
                        "trajectory weighted by its turns: the public code) | trajectories (each once)"))


@register("gigpo", **GIGPO_KNOBS)
def gigpo(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6, steps: StepInputs,
          step_weight=1.0, step_gamma=0.95, episode_stats="step_rows"):
  """GiGPO (arXiv 2505.10978): A[n, t] = A_episode[n] + step_weight * A_step[n, t], per turn.

  A_episode = (R - mean) / (std + eps) over the prompt's trajectories; with `episode_stats` =
  step_rows (the public code's: its statistics run over the batch's step rows) each trajectory
  counts once per turn, so R = [1, 1, 0, 0] over [2, 2, 8, 8] turns has mean 0.2 and std
  0.41 (A = +1.95 / -0.49); `trajectories` counts each once (`grpo`: +-0.87). A_step groups the turns of a prompt's trajectories by their anchor state
  (equal `state_key` of the state the turn acted from, at any turn index) and normalises each
  turn's discounted return R_t = sum_{k >= t} step_gamma^(k - t) r_k within its anchor group
  ((R - mean) / (std + eps), unbiased std). A state reached by one turn only has no comparison:
  A_step = 0 there (the public GiGPO code's convention), as in an all-equal anchor group.
  """
  del tree_ids
  return _gigpo(rewards, prompt_ids, valid, eps, steps, step_weight, step_gamma, True,
                episode_stats)


@register("gigpo_mean", **GIGPO_KNOBS)
def gigpo_mean(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6, steps: StepInputs,
               step_weight=1.0, step_gamma=0.95, episode_stats="step_rows"):
  """`gigpo` without the std division at either level (F_norm = 1, the public code's
  mean_norm mode); the episode mean weighted as `episode_stats` says."""
  del tree_ids
  return _gigpo(rewards, prompt_ids, valid, eps, steps, step_weight, step_gamma, False,
                episode_stats)
