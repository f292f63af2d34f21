"""One process of the lost-process test: initialise `jax.distributed` (CPU, gloo), watch the
others (`hosts.watch_peers`), then loop on a tiny collective until stopped.

  python lost_peer_worker.py PORT PROCESS_ID NUM_PROCESSES [raise|finish]

Prints "ready" once watching (process 0 first prints "service PID", the coordination service's
process); with `raise` it raises an error after a few collectives, with `finish` it ends
normally there.
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
from jax._src import distributed  # noqa: E402

service = distributed.global_state.service
if service is not None:
  print("service", service.proc.pid, flush=True)
print("ready", flush=True)
then = sys.argv[4] if len(sys.argv) > 4 else ""
step = 0
while True:
  hosts.gather(np.array([step]))
  step += 1
  if then == "raise" and step == 20:
    raise RuntimeError("a bug in this process")
  if then == "finish" and step == 20:
    break
