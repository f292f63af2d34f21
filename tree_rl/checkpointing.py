"""Orbax checkpoints of the whole training state, with exact resume.

A checkpoint holds one pytree of arrays (params, optimizer state, reference params, RNG key data,
...) and one JSON document (step, data position, config, eval metrics). The last `keep` steps and
the best by `best_metric` are kept. Non-finite arrays are refused, so a diverged update can never
reach disk; a checkpoint that cannot be read raises `CheckpointRestoreError` naming the step and
directory.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies


class CheckpointRestoreError(RuntimeError):
  """A checkpoint exists but does not match the expected state."""


def _all_finite(tree) -> bool:
  leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


class Checkpointer:
  """Save and restore (state pytree, metadata dict) under `directory`."""

  def __init__(self, directory: str, keep: int = 3, best_metric: str | None = None,
               best_mode: str = "max"):
    self.directory = os.path.abspath(directory)
    self.best_metric = best_metric
    preservation = [policies.LatestN(n=keep)]
    if best_metric:
      sign = 1.0 if best_mode == "max" else -1.0
      preservation.append(policies.BestN(
          get_metric_fn=lambda m: sign * float(m[best_metric]), n=1, reverse=False,
          keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=policies.AnyPreservationPolicy(preservation),
        enable_async_checkpointing=False, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options,
                                          item_names=("state", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, meta: dict[str, Any], metrics: dict[str, float] | None = None):
    """Write step `step`; refuses state with NaN/Inf. `metrics` feed the best-checkpoint choice."""
    if not _all_finite(state):
      raise ValueError(f"refusing to checkpoint step {step}: the state holds non-finite values")
    if self.best_metric and metrics is not None and self.best_metric not in metrics:
      metrics = None
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)),
                       metrics=metrics, force=True)
    self._manager.wait_until_finished()

  def restore(self, abstract_state: Any, step: int | None = None) -> tuple[int, Any, dict] | None:
    """(step, state, meta) of `step` (default the latest), or None if there is none."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
    except Exception as e:  # orbax raises many types for unreadable or mismatched trees
      raise CheckpointRestoreError(
          f"checkpoint step {step} in {self.directory} cannot be restored into the current state "
          f"({type(e).__name__}: {e}); remove that step directory or use another --workdir") from e
    return step, out.state, out.meta

  def read(self, step: int) -> tuple[Any, dict]:
    """(state, meta) of `step` as saved, without a target structure (for inspection)."""
    out = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore()))
    return out.state, out.meta

  def close(self):
    self._manager.close()
