"""The one optimizer builder of the warm start and the RL learner: AdamW after global-norm
clipping, weight decay on matrices only, a linear warm-up into a constant or cosine schedule."""

from __future__ import annotations

import jax
import optax

SCHEDULES = ("constant", "cosine")


def schedule(lr: float, *, kind: str = "constant", warmup_steps: int = 0, total_steps: int = 1,
             end_fraction: float = 0.0, field: str = "lr_schedule") -> optax.Schedule:
  """Linear warm-up from 0 over `warmup_steps`, then `kind`: constant at `lr`, or cosine decay
  to `end_fraction * lr` at `total_steps`."""
  lr, warm = float(lr), int(warmup_steps)
  if kind == "constant":
    after = optax.constant_schedule(lr)
  elif kind == "cosine":
    after = optax.cosine_decay_schedule(lr, max(1, int(total_steps) - warm), alpha=float(end_fraction))
  else:
    raise ValueError(f"{field}={kind!r}; known: {SCHEDULES}")
  if warm <= 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warm), after], [warm])


def adamw(lr_schedule: optax.Schedule, *, grad_clip: float = 0.0, weight_decay: float = 0.0,
          b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """AdamW with decoupled weight decay on parameters of rank >= 2, after global-norm clipping
  (grad_clip <= 0 turns it off)."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
  parts = [optax.clip_by_global_norm(float(grad_clip))] if float(grad_clip) > 0 else []
  parts.append(optax.adamw(lr_schedule, b1=float(b1), b2=float(b2), eps=float(eps),
                           weight_decay=float(weight_decay), mask=decay_mask))
  return optax.chain(*parts)
