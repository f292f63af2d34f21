"""The processes of a multi-host job: which share of a step each one rolls out, and the few
collectives the host-side loop needs (every one is a no-op with one process).

Process i of n rolls out prompts [i * P / n, (i + 1) * P / n) of each batch of P, builds its own
learner rows and evaluates its share of the held-out tasks; `gather` and `agree_max` make
every process see the same numbers and pick the same shapes; only `is_main()` writes files.
`watch_peers` stops every process, with one line naming it, when one process of the job is lost.
"""

from __future__ import annotations

import os
import sys
import time

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


# ----------------------------------------------------------------------------- a lost process

HEARTBEAT_S = 1.0      # how often each process posts a heartbeat and reads the others'
LOST_AFTER_S = 10.0    # a process whose heartbeat has not changed for this long is lost
LOST_EXIT_STATUS = 1   # the exit status of a process that stops because another was lost
_KEY = "tree_rl/heartbeat/"
_watcher = None


class _PeerWatcher:
  """The threads behind `watch_peers` (one per process)."""

  def __init__(self, client, me: int, n: int, heartbeat_s: float, lost_after_s: float):
    import threading
    self.client, self.me, self.n = client, me, n
    self.heartbeat_s, self.lost_after_s = heartbeat_s, lost_after_s
    self.lock = threading.Lock()
    self.stopped = threading.Event()
    now = time.monotonic()
    self.values = {}                                  # peer -> its last posted value
    self.seen = {j: now for j in range(n) if j != me}   # peer -> when its value last changed
    self.changes = {j: 0 for j in self.seen}          # peer -> how often its value changed
    self.contact = now                                # the last exchange with the coordinator
    self.failed_since = {}                            # peer -> when we first saw it "failed"
    self.threads = [threading.Thread(target=self._post_and_read, daemon=True,
                                     name="tree_rl peer heartbeat"),
                    threading.Thread(target=self._judge, daemon=True, name="tree_rl peer judge")]

  def start(self):
    for t in self.threads:
      t.start()

  def _post_and_read(self):
    beat = 0
    while not self.stopped.is_set():
      try:
        self.client.key_value_set(f"{_KEY}{self.me}", str(beat), allow_overwrite=True)
        entries = self.client.key_value_dir_get(_KEY)
      except Exception:   # the coordinator is gone or slow: `_judge` times the silence
        self.stopped.wait(self.heartbeat_s)
        continue
      beat += 1
      now = time.monotonic()
      with self.lock:
        self.contact = now
        for key, value in entries:
          j = int(key.rsplit("/", 1)[-1])
          if j in self.seen and self.values.get(j) != value:
            self.values[j], self.seen[j] = value, now
            self.changes[j] += 1
      self.stopped.wait(self.heartbeat_s)

  def _judge(self):
    last = time.monotonic()
    while not self.stopped.wait(self.heartbeat_s):
      now = time.monotonic()
      with self.lock:
        if now - last > 2 * self.heartbeat_s:   # this process was stalled: it cannot judge
          self.contact = max(self.contact, now)
          self.seen = {j: max(t, now) for j, t in self.seen.items()}
        last = now
        watched = {j for j in self.seen if self.values.get(j) != "done"}
        failed = sorted(j for j in watched if self.values.get(j) == "failed")
        for j in failed:
          self.failed_since.setdefault(j, now)
        lost = sorted(j for j in watched
                      if j not in failed and now - self.seen[j] > self.lost_after_s)
        coordinator_silent = now - self.contact > self.lost_after_s
      if lost:
        self._stop_process(f"{_processes(lost)} of {self.n} stopped responding (no heartbeat for "
                           f"{self.lost_after_s:.0f} s)")
      elif coordinator_silent:
        self._stop_process(f"lost contact with the coordination service (process 0 of {self.n}) "
                           f"for {self.lost_after_s:.0f} s")
      elif failed and all(now - self.failed_since[j] >= 2 * self.heartbeat_s for j in failed):
        # the grace: a job that fails everywhere at once (a bad config) prints its own errors
        self._stop_process(f"{_processes(failed)} of {self.n} failed (see its output)")

  def _stop_process(self, what: str):
    if self.stopped.is_set():
      return
    print(f"error: {what}; stopping process {self.me}", file=sys.stderr, flush=True)
    if self.me == 0 and self.n > 2:   # the coordinator stays a moment: the others print first
      time.sleep(2 * self.heartbeat_s)
    _exit(LOST_EXIT_STATUS)

  def settle(self, timeout: float) -> None:
    """Until every watched peer has posted again (it is alive) or `timeout` passes; a lost peer
    stops this process meanwhile (from `_judge`)."""
    with self.lock:
      before = dict(self.changes)
    end = time.monotonic() + timeout
    while time.monotonic() < end and not self.stopped.is_set():
      with self.lock:
        pending = [j for j in before if self.changes[j] < before[j] + 2
                   and self.values.get(j) not in ("done", "failed")]
      if not pending:
        return
      time.sleep(0.1)

  def stop(self, status: str) -> None:
    """Stop watching and post `status` ("done" or "failed") for the others."""
    if self.stopped.is_set():
      return
    self.stopped.set()
    for t in self.threads:
      t.join(timeout=2 * self.heartbeat_s)
    try:
      self.client.key_value_set(f"{_KEY}{self.me}", status, allow_overwrite=True)
    except Exception:
      pass


def _exit(status: int) -> None:
  """`os._exit` (the main thread may be blocked in a collective), ending process 0's
  coordination service first (`tree_rl.coordination`: its grace is for an unplanned death)."""
  from tree_rl import coordination
  coordination.stop_here()
  os._exit(status)


def _processes(ids) -> str:
  return ("process " if len(ids) == 1 else "processes ") + ", ".join(map(str, ids))


def watch_peers(heartbeat_s: float = HEARTBEAT_S, lost_after_s: float = LOST_AFTER_S) -> None:
  """Stop this process, with one line naming the lost process, when another process of the
  job is lost (killed, crashed, hung, its host gone). Call it right after `jax.distributed` is
  initialised (every process at about the same time); a no-op with one process or when already
  watching.

  Every process posts a heartbeat counter to the coordination service's key-value store every
  `heartbeat_s` seconds and reads the others'. A process whose counter has not changed for
  `lost_after_s` seconds is lost: each of the others prints one line to stderr,

    error: process 1 of 2 stopped responding (no heartbeat for 10 s); stopping process 0

  and exits with status `LOST_EXIT_STATUS` (`os._exit`: its main thread may be blocked in a
  collective). The bound: between `lost_after_s - heartbeat_s` and `lost_after_s + 2 *
  heartbeat_s` after the other process died, so 9 to 12 s with the defaults (measured: 10.2 to
  10.9 s; process 0 of a job of more than two processes waits two heartbeats more, so that the
  others print their line before its coordination service goes). jax's own heartbeat, at its
  default, would abort the job after 100 s, naming the task among jaxlib's log lines. Ten
  seconds without a heartbeat is far beyond a stall of a loaded machine (the posting thread
  needs the GIL for a moment each second), and a process that was stalled itself restarts its
  clocks rather than blame the others.

  A collective that fails in the main thread first (gloo: "Connection closed by peer", at
  once) does not bury that line under a traceback: an uncaught exception first waits until
  every other process has posted twice more (they are alive: the traceback follows) or one is
  found lost (the line above, no traceback). A process that dies of an exception posts
  "failed", prints its traceback and exits with status 1 (process 0 four heartbeats later: jax's
  own exit would wait for the others at its shutdown barrier until its heartbeat timeout, then
  abort); the others stop two heartbeats later with `process i of n failed (see its output)`.
  A process that ends normally posts "done" and is watched no more (at exit, or
  `stop_watching()` before `jax.distributed.shutdown()`).

  The coordination service runs in a child process of process 0 (`tree_rl.coordination`,
  started by `maybe_initialize_distributed` with the ids given or detected from the cluster as
  jax detects them): it outlives a killed process 0 for 30 s, so the others name process 0
  within the same bound. Where process 0's whole host is lost, jaxlib aborts every other
  process within about a second instead (exit status 134, SIGABRT), with its own message:
  "Terminating process because the JAX distributed service detected fatal errors ... Either the
  leader task was preempted/died/restarted unexpectedly" (jaxlib's `missed_heartbeat_callback`
  is no way out: in jaxlib 0.10.2 calling it aborts too, std::bad_cast). A service that hangs
  rather than dies leaves the others without contact, which they report after `lost_after_s`
  as `lost contact with the coordination service (process 0 of n)`.
  """
  global _watcher
  if jax.process_count() == 1 or _watcher is not None:
    return
  import atexit
  from jax._src import distributed
  _watcher = _PeerWatcher(distributed.global_state.client, jax.process_index(),
                          jax.process_count(), heartbeat_s, lost_after_s)
  _watcher.start()
  atexit.register(stop_watching)
  previous = sys.excepthook

  def excepthook(kind, value, tb):
    w = _watcher
    if w is None or not issubclass(kind, Exception):
      return previous(kind, value, tb)
    w.settle(w.lost_after_s + 3 * w.heartbeat_s)   # a lost peer: the watcher's line instead
    stop_watching("failed")
    previous(kind, value, tb)
    # The others stop on "failed"; jax's exit would wait for them at its shutdown barrier until
    # its own heartbeat timeout (100 s), then abort: exit now, with the traceback's status.
    import logging
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if w.me == 0:   # the coordinator stays until the others have seen "failed" and printed
      time.sleep(4 * w.heartbeat_s)
    _exit(1)

  sys.excepthook = excepthook


def stop_watching(status: str = "done") -> None:
  """Stop `watch_peers` and tell the others this process ended (`status`: "done" or "failed")."""
  global _watcher
  w, _watcher = _watcher, None
  if w is not None:
    w.stop(status)
