"""One process of the lost-process test: initialise `jax.distributed` (CPU, gloo), watch the
others (`hosts.watch_peers`), then loop on a tiny collective until stopped.

  python lost_peer_worker.py PORT PROCESS_ID NUM_PROCESSES [raise]

Prints "ready" once watching; with `raise` it raises an error after a few collectives.
"""

import os
import sys
import types

port, pid, nproc = sys.argv[1:4]
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402

from tree_rl import hosts  # noqa: E402
from tree_rl.learner.sharding import maybe_initialize_distributed  # noqa: E402

maybe_initialize_distributed(types.SimpleNamespace(
    distributed=True, coordinator_address=f"localhost:{port}", num_processes=int(nproc),
    process_id=int(pid)))   # and hosts.watch_peers
print("ready", flush=True)
step = 0
while True:
  hosts.gather(np.array([step]))
  step += 1
  if len(sys.argv) > 4 and step == 20:
    raise RuntimeError("a bug in this process")
