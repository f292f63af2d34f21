"""One process of the multi-host RL-step test: the smoke config's first RL step from the
model's initial weights, on NUM_PROCESSES processes of LOCAL_DEVICES CPU devices each.

  python multihost_loop_worker.py PORT PROCESS_ID NUM_PROCESSES LOCAL_DEVICES DATA_DIR OUT_DIR

Writes OUT_DIR/prompts_<i>.npy (the prompt ids process i trained on) and, from process 0,
OUT_DIR/params.npz (the updated weights, gathered).
"""

import os
import sys

port, pid, nproc, local, data_dir, out = sys.argv[1:7]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402

from configs import frozenlake  # noqa: E402
from configs.common import apply  # noqa: E402
from tree_rl import hosts, train  # noqa: E402
from tree_rl.learner.sharding import maybe_initialize_distributed  # noqa: E402

c = frozenlake.get_config("algo=chain,smoke")
apply(c, {"env.data_dir": data_dir, "rollout.prompts_per_step": 4, "learner.entropy_coef": 0.01,
          "mesh.distributed": int(nproc) > 1, "mesh.coordinator_address": f"localhost:{port}",
          "mesh.num_processes": int(nproc), "mesh.process_id": int(pid)})
maybe_initialize_distributed(c.mesh)
assert jax.process_count() == int(nproc) and jax.local_device_count() == int(local)

parts = train.build_parts(c)
state = parts.train_step.init()
initial = jax.tree.map(np.asarray, parts.train_step._init_params)
cache = train.new_cache(parts, state.params)
trees, drawn, cache, _ = train._rollouts(parts, cache, step=0, position=0)
np.save(os.path.join(out, f"prompts_{hosts.index()}.npy"), np.array(sorted({t.group_id for t in trees})))
state, cache, metrics, drawn = train.rl_step(parts, state, state.params, cache, 0, 0)
assert drawn == 4 and metrics["learner/updates"] == 1
if jax.process_count() > 1:
  from jax.experimental import multihost_utils
  params = multihost_utils.process_allgather(state.params, tiled=True)
else:
  params = state.params
if hosts.is_main():
  np.savez(os.path.join(out, "params.npz"),
           **{f"p{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))},
           **{f"init{i}": x for i, x in enumerate(jax.tree.leaves(initial))},
           loss=np.asarray(metrics["learner/loss"]))
if jax.process_count() > 1:
  jax.distributed.shutdown()
