"""Multi-process rollout benchmark: the training loop's rollouts on 1 and on N `jax.distributed`
processes, each pinned to its own core (`taskset`), one CPU device each.

For each (processes, prompts) pair the processes roll out a step's prompts with the config's
method (each process its share, `tree_rl.hosts`), after one untimed rollout that compiles; the
timed rollouts report trajectories per second over the slowest process's wall time. Goals
(issue: multi-host rollouts): N processes at >= 1.7x one process's trajectories/s for the same
global prompts, and N x P prompts on N processes no slower than P prompts on one.

  python -m experiments.bench_hosts                      # 1 vs 2 processes, main-job config
  python -m experiments.bench_hosts --processes=2 --prompts=8 --repeats=3 \\
      --config_args=algo=patr,model=tiny
The policy is the config's model with its initial weights (no warm start): the rollout cost, not
its quality, is measured. Prints one JSON line per run, then a table.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from absl import app, flags

_PROCS = flags.DEFINE_integer("processes", 2, "Processes of the multi-process runs.")
_PROMPTS = flags.DEFINE_integer("prompts", 8, "Prompts per step of the one-process run.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rollouts after the compiling one.")
_ARGS = flags.DEFINE_string("config_args", "algo=patr,model=tiny", "configs/frozenlake.py arguments.")
_OUT = flags.DEFINE_string("out", "", "Also write the JSON lines to this file.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: PORT,PROCESS_ID,NUM_PROCESSES,PROMPTS,DATA_DIR.")


def worker(spec: str) -> None:
  port, pid, nproc, prompts, data_dir = spec.split(",")
  import jax
  import numpy as np

  from configs import frozenlake
  from configs.common import apply
  from tree_rl import hosts, train
  from tree_rl.learner.sharding import maybe_initialize_distributed

  c = frozenlake.get_config(_ARGS.value)
  apply(c, {"env.data_dir": data_dir, "rollout.prompts_per_step": int(prompts),
            "warmstart.enabled": False, "mesh.distributed": int(nproc) > 1,
            "mesh.coordinator_address": f"localhost:{port}", "mesh.num_processes": int(nproc),
            "mesh.process_id": int(pid)})
  maybe_initialize_distributed(c.mesh)
  parts = train.build_parts(c)
  cache = train.new_cache(parts, parts.train_step.init().params)
  walls, trajectories = [], 0
  for r in range(1 + _REPEATS.value):
    hosts.barrier(f"bench rollout {r}")
    t = time.perf_counter()
    out, cache, _ = train._draw(parts, cache, r, r * int(prompts), 0)
    jax.block_until_ready(out.tree.tokens)
    wall = time.perf_counter() - t
    if r:
      walls.append(wall)
      trajectories += int(np.asarray(out.valid).sum())
  slowest = hosts.gather(np.array(walls)).max(axis=0)        # per rollout, the slowest process
  total = int(hosts.gather(np.array(trajectories)).sum())
  if hosts.is_main():
    print("RESULT " + json.dumps({"processes": int(nproc), "prompts": int(prompts),
                                  "rollout_s": float(np.mean(slowest)),
                                  "trajectories": total / _REPEATS.value,
                                  "trajectories_per_s": total / float(np.sum(slowest))}), flush=True)
  if int(nproc) > 1:
    jax.distributed.shutdown()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def run(nproc: int, prompts: int, data_dir: str) -> dict:
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  pin = shutil.which("taskset")
  cores = os.cpu_count() or 1
  procs = []
  for i in range(nproc):
    cmd = [sys.executable, "-m", "experiments.bench_hosts",
           f"--worker={port},{i},{nproc},{prompts},{data_dir}", f"--config_args={_ARGS.value}",
           f"--repeats={_REPEATS.value}"]
    if pin:
      cmd = [pin, "-c", str(i % cores)] + cmd
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True))
  logs = [p.communicate()[0] for p in procs]
  for p, log in zip(procs, logs):
    if p.returncode:
      raise RuntimeError(f"worker failed:\n{log[-3000:]}")
  line = next(l for l in logs[0].splitlines() if l.startswith("RESULT "))
  return json.loads(line[len("RESULT "):]) | {"pinned": bool(pin)}


def main(argv):
  del argv
  if _WORKER.value:
    return worker(_WORKER.value)
  import platform

  import jax
  n, p = _PROCS.value, _PROMPTS.value
  data_dir = tempfile.mkdtemp(prefix="bench_hosts_tfds_")
  rows = [run(1, p, data_dir), run(n, p, data_dir), run(n, n * p, data_dir)]
  speedup = rows[1]["trajectories_per_s"] / rows[0]["trajectories_per_s"]
  weak = rows[2]["rollout_s"] / rows[0]["rollout_s"]
  summary = {"kind": "summary", "config": _ARGS.value, "processes": n, "prompts": p,
             "speedup_same_prompts": speedup, "goal_speedup": 1.7, "speedup_met": speedup >= 1.7,
             "scaled_time_ratio": weak, "scaled_met": weak <= 1.0,
             "cpu_count": os.cpu_count(), "jax": jax.__version__, "python": platform.python_version()}
  lines = [json.dumps(r) for r in rows] + [json.dumps(summary)]
  print("\n".join(lines))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(lines) + "\n")
  print(f"\n{'processes':>9} {'prompts':>8} {'rollout s':>10} {'traj/s':>8}")
  for r in rows:
    print(f"{r['processes']:>9} {r['prompts']:>8} {r['rollout_s']:>10.2f} {r['trajectories_per_s']:>8.2f}")
  print(f"speedup with {n} processes, same prompts: {speedup:.2f}x (goal >= 1.7x); "
        f"{n * p} prompts on {n} vs {p} on 1: {weak:.2f}x the time (goal <= 1.0x)")


if __name__ == "__main__":
  app.run(main)
