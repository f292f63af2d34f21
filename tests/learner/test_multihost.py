"""Two local processes with jax.distributed (CPU, gloo) agree with one process."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np

import multihost_case as case
from tree_rl.learner import make_mesh, make_train_step

HERE = os.path.dirname(__file__)


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def single_process():
  c = case.config(shape=(1, 1, 1))
  step = make_train_step(c, case.model(), mesh=make_mesh(c.mesh, jax.devices()[:1]),
                         compiler_options=case.FAST_COMPILE)
  state = step.init()
  for _ in range(case.STEPS):
    state, metrics = step(state, case.batch())
  return [np.asarray(x) for x in jax.tree.leaves(state.params)], metrics


def test_two_processes_match_one(tmp_path):
  port = free_port()
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(HERE)), HERE,
                                       env.get("PYTHONPATH", "")])
  env.pop("XLA_FLAGS", None)
  procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_worker.py"), str(port),
                             str(i), "2", "2", str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-3000:]
  got = np.load(tmp_path / "result.npz")
  want_params, want_metrics = single_process()
  assert int(got["traces"]) == 1
  for k in ("loss", "grad_norm", "kl", "clip_frac"):
    np.testing.assert_allclose(got[f"m_{k}"], float(want_metrics[k]), rtol=2e-5, err_msg=k)
  for i, w in enumerate(want_params):
    np.testing.assert_allclose(got[f"p{i}"], w, atol=2e-5)
