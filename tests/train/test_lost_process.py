"""A multi-process job that loses a process stops the others within a bound, each with one line
naming the lost process (`tree_rl.hosts.watch_peers`): two `jax.distributed` processes (CPU,
gloo) looping on a tiny collective (`lost_peer_worker.py`)."""

import os
import signal
import socket
import subprocess
import sys
import time

from tree_rl import coordination, hosts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The documented bound (watch_peers), plus slack for a loaded machine.
BOUND_S = hosts.LOST_AFTER_S + 2 * hosts.HEARTBEAT_S + 3.0


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(tmp_path, then=None):
  """Both processes, once each one is watching: [(Popen, stdout path, stderr path)]; process i
  does `then[i]` ("raise" or "finish") after a few collectives (lost_peer_worker.py)."""
  port, env = _free_port(), dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  procs = []
  for i in range(2):
    out, err = tmp_path / f"out{i}.txt", tmp_path / f"err{i}.txt"
    cmd = [sys.executable, os.path.join(HERE, "lost_peer_worker.py"), str(port), str(i), "2"]
    with open(out, "w") as o, open(err, "w") as e:
      procs.append((subprocess.Popen(cmd + ([then[i]] if then and i in then else []), cwd=ROOT, env=env,
                                     stdout=o, stderr=e), out, err))
  deadline = time.monotonic() + 120
  while not all("ready" in out.read_text() for _, out, _ in procs):
    if time.monotonic() > deadline or any(p.poll() is not None for p, _, _ in procs):
      _kill(procs)
      raise AssertionError("the processes did not start:\n"
                           + "\n".join(err.read_text()[-2000:] for _, _, err in procs))
    time.sleep(0.1)
  return procs


def _kill(procs):
  for p, _, _ in procs:
    if p.poll() is None:
      p.kill()
      p.wait()


def _exit_within(proc, seconds):
  """(return code, seconds it took) of `proc`; fails if it runs longer than `seconds`."""
  start = time.monotonic()
  try:
    rc = proc.wait(timeout=seconds)
  except subprocess.TimeoutExpired:
    raise AssertionError(f"still running {seconds:.0f} s after its peer was lost") from None
  return rc, time.monotonic() - start


def _error_lines(text):
  return [line for line in text.splitlines() if line.startswith("error:")]


def test_a_killed_process_is_named_by_the_survivor_within_the_bound(tmp_path):
  procs = _start(tmp_path)
  try:
    time.sleep(1.5)   # both deep in their collective loop
    procs[1][0].send_signal(signal.SIGKILL)
    rc, took = _exit_within(procs[0][0], BOUND_S)
  finally:
    _kill(procs)
  err = procs[0][2].read_text()
  assert rc == hosts.LOST_EXIT_STATUS, err[-3000:]
  # the survivor's collective failed at once (gloo); the watcher's line, not a traceback, ends it
  assert _error_lines(err) == ["error: process 1 of 2 stopped responding (no heartbeat for 10 s);"
                               " stopping process 0"], err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  assert took > hosts.LOST_AFTER_S - hosts.HEARTBEAT_S - 0.5, took


def test_a_process_that_fails_stops_the_others_with_a_line(tmp_path):
  procs = _start(tmp_path, {0: "raise"})   # process 0, the coordinator, raises
  service = _service_pid(procs[0][1])
  try:
    rc1, took = _exit_within(procs[1][0], BOUND_S)
    rc0, _ = _exit_within(procs[0][0], 10)
    # a planned exit ends the service with it (the grace is for an unplanned death)
    assert _gone_within(service, 3.0)
  finally:
    _kill(procs)
    if _running(service):
      os.kill(service, signal.SIGKILL)
  err0, err1 = procs[0][2].read_text(), procs[1][2].read_text()
  assert rc0 == 1 and "RuntimeError: a bug in this process" in err0, err0[-3000:]
  assert rc1 == hosts.LOST_EXIT_STATUS, err1[-3000:]
  assert _error_lines(err1) == ["error: process 0 of 2 failed (see its output); stopping "
                                "process 1"], err1[-3000:]
  assert "Traceback" not in err1, err1[-3000:]


def _service_pid(out) -> int:
  """The coordination service's process, as process 0 printed it."""
  return int(next(line.split()[1] for line in out.read_text().splitlines()
                  if line.startswith("service ")))


def _running(pid: int) -> bool:
  """Whether `pid` runs (an exited child not yet reaped by its new parent does not)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def _gone_within(pid: int, seconds: float) -> bool:
  end = time.monotonic() + seconds
  while _running(pid):
    if time.monotonic() > end:
      return False
    time.sleep(0.2)
  return True


def test_a_killed_coordinator_is_named_by_the_survivor_within_the_bound(tmp_path):
  """Process 0's coordination service runs in a child process (tree_rl.coordination): it
  outlives a killed process 0, so the survivor names process 0 as it names any other; the
  service then ends on its own, `GRACE_S` after process 0."""
  procs = _start(tmp_path)
  service = _service_pid(procs[0][1])
  try:
    time.sleep(1.5)
    procs[0][0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    rc, took = _exit_within(procs[1][0], BOUND_S)
    assert _running(service), "the service ended before the survivor named process 0"
    assert _gone_within(service, coordination.GRACE_S - (time.monotonic() - killed) + 5.0)
  finally:
    _kill(procs)
    if _running(service):
      os.kill(service, signal.SIGKILL)
  err = procs[1][2].read_text()
  assert rc == hosts.LOST_EXIT_STATUS, err[-3000:]
  assert _error_lines(err) == ["error: process 0 of 2 stopped responding (no heartbeat for 10 s);"
                               " stopping process 1"], err[-3000:]
  assert "Traceback" not in err and "Terminating process" not in err, err[-3000:]
  assert took > hosts.LOST_AFTER_S - hosts.HEARTBEAT_S - 0.5, took


def test_a_job_that_ends_normally_ends_its_coordination_service(tmp_path):
  procs = _start(tmp_path, {0: "finish", 1: "finish"})
  service = _service_pid(procs[0][1])
  try:
    rc0, _ = _exit_within(procs[0][0], 60)
    rc1, _ = _exit_within(procs[1][0], 60)
    assert _gone_within(service, 10.0)
  finally:
    _kill(procs)
  assert (rc0, rc1) == (0, 0), procs[0][2].read_text()[-3000:] + procs[1][2].read_text()[-3000:]


def test_process_zero_is_known_before_initialize_on_a_slurm_cluster(monkeypatch):
  """The coordination service's process is chosen before `jax.distributed.initialize`: the ids a
  cluster gives (SLURM here) are read as initialize would read them; explicit ones are kept."""
  from tree_rl.learner.sharding import _detect_unset
  env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[07-08]", "SLURM_NTASKS": "4",
         "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
  monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS", raising=False)
  found = _detect_unset({})
  # the port SLURM's job id gives (4242 % 4096 + 61440) on the first node of the step
  assert found == {"coordinator_address": "node07:61586", "num_processes": 4, "process_id": 0,
                   "local_device_ids": [0]}
  assert _detect_unset({"coordinator_address": "h:1", "num_processes": 2, "process_id": 1})[
      "process_id"] == 1


def test_a_port_something_listens_on_is_refused_in_one_line():
  """gRPC binds with SO_REUSEPORT: a second service would share a port with one still serving
  (a killed job's, in its grace). `coordination.start` refuses such a port first."""
  import pytest
  with socket.socket() as busy:
    busy.bind(("localhost", 0))
    busy.listen()
    port = busy.getsockname()[1]
    with pytest.raises(RuntimeError, match=f"cannot listen at \\[::\\]:{port}"):
      coordination.start(f"localhost:{port}", 2)
