"""The processes of a multi-host job: which share of a step each one rolls out, and the few
collectives the host-side loop needs (every one is a no-op with one process).

Process i of n rolls out prompts [i * P / n, (i + 1) * P / n) of each batch of P, builds its own
learner rows and evaluates its share of the held-out tasks; `gather` and `agree_max` make
every process see the same numbers and pick the same shapes; only `is_main()` writes files.
"""

from __future__ import annotations

import jax
import numpy as np


def count() -> int:
  return jax.process_count()


def index() -> int:
  return jax.process_index()


def is_main() -> bool:
  """Process 0 writes metrics, summaries and checkpoint metadata; orbax saves every array."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Wait until every process reaches the barrier `name` (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def main_first(fn):
  """fn() on process 0, then (after a barrier) on the others: files one process prepares
  (a TFDS task set) are never written by several at once."""
  if jax.process_count() == 1:
    return fn()
  out = fn() if is_main() else None
  barrier(f"tree_rl main_first {getattr(fn, '__name__', '')}")
  return out if is_main() else fn()


def share(total: int) -> tuple[int, int]:
  """(offset, size) of this process's equal share of `total` items (validated to divide)."""
  n = jax.process_count()
  if total % n:
    raise ValueError(f"{total} items do not split over {n} processes")
  size = total // n
  return jax.process_index() * size, size


def gather(x: np.ndarray) -> np.ndarray:
  """Every process's `x` (same shape everywhere) stacked along a new leading axis [n, ...]."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x[None]
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x)).reshape((jax.process_count(),) + x.shape)


def agree_max(values: dict[str, int]) -> dict[str, int]:
  """The largest value of each key over all processes (every process passes the same keys)."""
  if jax.process_count() == 1:
    return dict(values)
  keys = sorted(values)
  most = gather(np.array([int(values[k]) for k in keys], np.int64)).max(axis=0)
  return {k: int(v) for k, v in zip(keys, most)}


def mean_metrics(metrics: dict) -> dict:
  """Numeric metrics averaged over processes (each rolled out an equal share of prompts)."""
  if jax.process_count() == 1:
    return metrics
  keys = sorted(k for k, v in metrics.items() if np.ndim(v) == 0)
  avg = gather(np.array([float(metrics[k]) for k in keys], np.float64)).mean(axis=0)
  return dict(metrics, **{k: float(v) for k, v in zip(keys, avg)})
