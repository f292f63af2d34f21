"""One process of the two-process `jax.distributed` test (CPU devices, gloo collectives).

  python multihost_worker.py PORT PROCESS_ID NUM_PROCESSES LOCAL_DEVICES OUT_DIR
"""

import os
import sys

port, pid, nproc, local, out = sys.argv[1:6]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from tree_rl.learner import batches, maybe_initialize_distributed, make_train_step  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import multihost_case as case  # noqa: E402

c = case.config(shape=(-1, 2, 1))
c.mesh.distributed = True
c.mesh.coordinator_address = f"localhost:{port}"
c.mesh.num_processes = int(nproc)
c.mesh.process_id = int(pid)
maybe_initialize_distributed(c.mesh)
assert jax.process_count() == int(nproc) and jax.device_count() == int(nproc) * int(local)

step = make_train_step(c, case.model(), compiler_options=case.FAST_COMPILE)
state = step.init()
# Each process packs its own trees (whole groups), normalised by the totals of the whole batch.
per = len(case.trees()) // jax.process_count()
mine = list(range(jax.process_index() * per, (jax.process_index() + 1) * per))
totals = batches.global_totals([case.trees()[i] for i in mine])
batch = step.shard_batch(case.batch(mine, rows=4, totals=totals))
for _ in range(case.STEPS):
  state, metrics = step(state, batch)
params = multihost_utils.process_allgather(state.params, tiled=True)
if jax.process_index() == 0:
  flat = {f"p{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))}
  flat.update({f"m_{k}": np.asarray(v) for k, v in metrics.items()})
  flat["traces"] = np.asarray(step.trace_count)
  np.savez(os.path.join(out, "result.npz"), **flat)
jax.distributed.shutdown()
