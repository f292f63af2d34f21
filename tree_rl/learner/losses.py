"""Clipped policy-gradient loss with KL to a reference policy and an optional entropy bonus.

Every aggregation mode is a weighted token sum: trajectory i's token t carries a weight w_it
(`leaf_weights`) and the loss is

    sum_it w_it * [ -min(rho A_i, clip(rho) A_i) + kl_coef * k3_t - entropy_coef * H_t ]

with rho = exp(logp - old_logp) and clip(rho) = clip(rho, 1 - clip_low, 1 + clip_high); with
`dual_clip` = c > 1 (verl's clip_ratio_c, dual-clip PPO) a token of A < 0 contributes at most
c |A|: |A| min(max(rho, clip(rho)), c). Because
min(rho A, clip(rho) A) = A min(rho, clip(rho)) for A > 0 and A max(rho, clip(rho)) for A < 0, the
advantage enters only through two per-token weights, pos = sum w A over A > 0 and neg = sum w |A|
over A < 0. `weighted_policy_loss` works on those weights, so a tree-packed token shared by many
leaves carries the sums over its leaves and gives the same loss and gradient as the leaves
trained one by one.

Aggregation modes (`AGGREGATIONS`):
- traj_mean             1/|tau_i| over the trajectory's loss tokens, then mean over valid trajectories
- traj_mean_group_mean  1/|tau_i| per trajectory, mean within each group, then mean over groups
                        (PATR's objective: 1/G sum_i 1/|tau_i| sum_t ..., for one or more equal groups)
- token_mean            mean over every loss token of the batch
- token_sum             plain sum over loss tokens
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tree_rl.learner.advantages import dense_ids

AGGREGATIONS = ("traj_mean", "traj_mean_group_mean", "token_mean", "token_sum")


def check_aggregation(aggregation: str) -> None:
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"learner.aggregation={aggregation!r} is not known; known: {AGGREGATIONS}")


def leaf_weights(lengths, group_ids, aggregation: str, *, num_leaves=None, num_tokens=None,
                 num_groups=None) -> jax.Array:
  """Per-token weight w_leaf [N] of each trajectory under the aggregation; the one definition
  of loss weighting, used on device (`leaf_token_weights`) and by the host packer.

  lengths [N]: loss tokens of each trajectory (0: not trained, weight 0); group_ids [N] (needed
  by 'traj_mean_group_mean'). num_leaves / num_tokens / num_groups: the normalisers of the whole
  batch when these trajectories are only a share of it (several hosts); default: these.
  Group sizes are always counted here, so a group must not straddle shares.
  """
  check_aggregation(aggregation)
  lengths = jnp.asarray(lengths, jnp.float32)
  n = lengths.shape[0]
  valid = lengths > 0
  ones = valid.astype(jnp.float32)
  if aggregation == "token_sum":
    return ones
  if aggregation == "token_mean":
    total = lengths.sum() if num_tokens is None else jnp.float32(num_tokens)
    return ones / jnp.maximum(total, 1.0)
  per_token = ones / jnp.maximum(lengths, 1.0)
  if aggregation == "traj_mean":
    count = valid.sum() if num_leaves is None else jnp.float32(num_leaves)
    return per_token / jnp.maximum(count, 1.0)
  if group_ids is None:
    raise ValueError("aggregation 'traj_mean_group_mean' needs group_ids")
  groups = dense_ids(jnp.asarray(group_ids), valid)
  size = jax.ops.segment_sum(ones, groups, num_segments=n)
  count = (size > 0).sum() if num_groups is None else jnp.float32(num_groups)
  scale = 1.0 / (jnp.maximum(size[groups], 1.0) * jnp.maximum(count, 1.0))
  return per_token * jnp.where(valid, scale, 0.0)


def leaf_token_weights(loss_mask: jax.Array, group_ids: jax.Array | None,
                       aggregation: str) -> jax.Array:
  """Per-token weights w [N, T] of per-trajectory rows (0 outside `loss_mask`)."""
  mask = loss_mask.astype(jnp.float32)
  return mask * leaf_weights(mask.sum(axis=1), group_ids, aggregation)[:, None]


def split_by_sign(advantages: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(pos, neg) token weights: w * max(A, 0) and w * max(-A, 0); A is [N] or [N, T]."""
  adv = advantages.astype(jnp.float32)
  if adv.ndim == 1:
    adv = adv[:, None]
  return weights * jnp.maximum(adv, 0.0), weights * jnp.maximum(-adv, 0.0)


def k3(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1."""
  d = ref_logp - logp
  return jnp.exp(d) - d - 1.0


def weighted_policy_loss(logp, old_logp, pos_weight, neg_weight, weight, *, ref_logp=None,
                         entropy=None, clip_low=0.2, clip_high=0.2, kl_coef=0.0,
                         entropy_coef=0.0, dual_clip=0.0):
  """Loss and additive statistics from per-token weights (see module docstring).

  All arrays share one shape. Returns (loss, stats); stats are sums (and max/min) that add up
  across micro-batches; `finalize_metrics(stats)` turns them into means.
  """
  logp = logp.astype(jnp.float32)
  log_ratio = logp - old_logp.astype(jnp.float32)
  ratio = jnp.exp(log_ratio)
  clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  upper = jnp.maximum(ratio, clipped)
  if dual_clip:
    upper = jnp.minimum(upper, dual_clip)
  pg = -pos_weight * jnp.minimum(ratio, clipped) + neg_weight * upper
  pg_loss = pg.sum()
  loss = pg_loss
  active = weight > 0
  w = jax.lax.stop_gradient(weight)
  stats = {
      "pg_loss": pg_loss,
      "weight_sum": w.sum(),
      "tokens": active.sum().astype(jnp.float32),
      "clip_frac": (w * ((ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high))).sum(),
      "ratio_mean": (w * ratio).sum(),
      "ratio_dev": (w * jnp.abs(ratio - 1.0)).sum(),
      "ratio_max": jnp.where(active, ratio, -jnp.inf).max(),
      "ratio_min": jnp.where(active, ratio, jnp.inf).min(),
      "approx_kl_old": (w * -log_ratio).sum(),
  }
  if ref_logp is not None:
    kl = k3(logp, ref_logp.astype(jnp.float32))
    kl_loss = (weight * kl).sum()
    loss = loss + kl_coef * kl_loss
    stats["kl"] = kl_loss
  if entropy is not None:
    ent = (weight * entropy).sum()
    if entropy_coef:
      loss = loss - entropy_coef * ent
    stats["entropy"] = ent
  stats = {k: jax.lax.stop_gradient(v) for k, v in stats.items()}
  return loss, stats


_MEANS = ("clip_frac", "ratio_mean", "ratio_dev", "approx_kl_old", "kl", "entropy")


def finalize_metrics(stats: dict) -> dict:
  """Weighted sums -> weighted means (clip fraction, ratio mean, KL, entropy)."""
  out = dict(stats)
  denom = jnp.maximum(stats["weight_sum"], 1e-30)
  for k in _MEANS:
    if k in out:
      out[k] = stats[k] / denom
  return out


def policy_loss(logp, old_logp, advantages, loss_mask, *, group_ids=None, ref_logp=None,
                entropy=None, aggregation="traj_mean", clip_low=0.2, clip_high=0.2,
                kl_coef=0.0, entropy_coef=0.0, dual_clip=0.0):
  """Per-trajectory clipped objective; returns (loss, metrics).

  logp, old_logp, ref_logp, entropy: [N, T] log-probabilities of token t under the current,
  sampling and reference policies and the current policy's entropy at t; advantages [N] (or
  [N, T]); loss_mask [N, T] True on the policy's own tokens (prompt and observation tokens
  False); group_ids [N] for 'traj_mean_group_mean'.
  """
  w = leaf_token_weights(loss_mask, group_ids, aggregation)
  pos, neg = split_by_sign(advantages, w)
  loss, stats = weighted_policy_loss(logp, old_logp, pos, neg, w, ref_logp=ref_logp,
                                     entropy=entropy, clip_low=clip_low, clip_high=clip_high,
                                     kl_coef=kl_coef, entropy_coef=entropy_coef,
                                     dual_clip=dual_clip)
  return loss, finalize_metrics(stats)
