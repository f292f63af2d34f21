"""Multi-host training on one machine: two `jax.distributed` processes (CPU, gloo).

The real entry point starts, trains, checkpoints and resumes with two processes; and two
processes of one device each, two prompts each, take the same RL step as one process with two
devices and all four prompts (each process rolling out its own prompts)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np

from loop_helpers import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(devices: int):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE]), JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  return env


def _wait(procs, timeout=900):
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, log in zip(procs, logs):
    assert p.returncode == 0, log[-4000:]
  return logs


def _train(workdir, data_dir, steps):
  port = _free_port()
  cmd = lambda i: [sys.executable, "-m", "experiments.train",   # noqa: E731
                   "--config=configs/frozenlake.py:algo=chain,smoke", f"--workdir={workdir}",
                   f"--config.env.data_dir={data_dir}", f"--config.train.num_steps={steps}",
                   "--config.warmstart.enabled=false",   # not what this test is about
                   "--config.mesh.distributed=true",
                   f"--config.mesh.coordinator_address=localhost:{port}",
                   "--config.mesh.num_processes=2", f"--config.mesh.process_id={i}"]
  return _wait([subprocess.Popen(cmd(i), cwd=ROOT, env=_env(1), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for i in range(2)])


def test_the_entry_point_trains_and_resumes_on_two_processes(tmp_path, data_dir):
  workdir = str(tmp_path / "run")
  logs = _train(workdir, data_dir, 1)
  assert "devices   2 x cpu (2 process(es))" in logs[0]
  assert "devices   2 x cpu" not in logs[1]          # only process 0 speaks and writes
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in rows] == [0, 1]       # one row per step: process 0 alone writes
  assert "learner/loss" in rows[1] and "eval/greedy_success" in rows[1]
  assert os.path.exists(os.path.join(workdir, "summary.json"))
  ckpt = os.path.join(workdir, "checkpoints")
  assert sorted(os.listdir(ckpt)) == ["0", "1"]
  logs = _train(workdir, data_dir, 2)               # both restart and resume from step 1
  assert "resumed from step 1 of" in logs[0]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert sorted(os.listdir(ckpt)) == ["0", "1", "2"]


def test_two_processes_take_the_step_of_one_with_all_prompts(tmp_path, data_dir):
  worker = os.path.join(HERE, "multihost_loop_worker.py")
  split, whole = tmp_path / "split", tmp_path / "whole"
  split.mkdir()
  whole.mkdir()
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, worker, str(port), str(i), "2", "1", data_dir,
                             str(split)], cwd=ROOT, env=_env(1), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  procs.append(subprocess.Popen([sys.executable, worker, "0", "0", "1", "2", data_dir, str(whole)],
                                cwd=ROOT, env=_env(2), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True))
  _wait(procs)
  # Each process rolled out its own half of the step's four prompts (stream positions).
  assert np.load(split / "prompts_0.npy").tolist() == [0, 1]
  assert np.load(split / "prompts_1.npy").tolist() == [2, 3]
  assert np.load(whole / "prompts_0.npy").tolist() == [0, 1, 2, 3]
  got, want = np.load(split / "params.npz"), np.load(whole / "params.npz")
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  moved = 0.0
  for k in (k for k in want.files if k.startswith("p")):
    np.testing.assert_allclose(got[k], want[k], atol=2e-6, err_msg=k)
    moved = max(moved, float(np.abs(want[k] - want["init" + k[1:]]).max()))
  assert moved > 1e-4   # the step moved the weights by far more than the tolerance


def test_importing_the_package_starts_no_backend():
  """jax.distributed.initialize must come before any backend: no module may build an array on
  import (the entry points initialise first thing)."""
  code = ("from jax._src import xla_bridge as xb\n"
          "import tree_rl.train, tree_rl.validation, tree_rl.export, experiments.train\n"
          "assert not xb._backends, 'a module started a JAX backend on import'\n")
  subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(1), check=True, timeout=300)
