"""The `jax.distributed` coordination service in a process of its own on process 0's host.

`jax.distributed.initialize` hosts the service inside process 0. When that process dies, every
other process loses the service and jaxlib aborts it within about a second (SIGABRT, its own
log lines), before `hosts.watch_peers` can name the lost process. Hosted by a small child
process instead, the service outlives a killed process 0 for `GRACE_S`: the others' watchers
then find process 0's heartbeat gone and stop with one line naming it, as for any other
process.

`start` spawns the child (`python -m tree_rl.coordination ADDRESS N PARENT_PID ...`) and
waits until it serves; `service_started_by` makes `jax.distributed.initialize` in process 0
use it rather than start its own. The child ends when its parent calls the service's
`shutdown` (jax's own exit path, after every process has passed its shutdown barrier), when
process 0 stops on purpose (`stop_here`, before `hosts`' `os._exit`), or `GRACE_S` after its
parent is gone. Losing process 0's whole host still takes the service with it (jaxlib's abort).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

GRACE_S = 30.0        # the service outlives a lost parent this long (the watchers need 9-12 s)
START_TIMEOUT_S = 60.0


class _Service:
  """What process 0's `jax.distributed` state holds in place of an in-process service."""

  def __init__(self, proc: subprocess.Popen):
    self.proc = proc

  def kill(self) -> None:
    """End the service at once (a graceful shutdown would wait for clients that are gone)."""
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()

  def shutdown(self) -> None:
    """jax's exit path: every process has passed its shutdown barrier."""
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def bind_address(coordinator_address: str) -> str:
  """Where the service listens, as `jax.distributed.initialize` binds it: the
  `JAX_COORDINATOR_BIND_ADDRESS` variable, else every interface at the coordinator's port."""
  return os.environ.get("JAX_COORDINATOR_BIND_ADDRESS",
                        "[::]:" + coordinator_address.rsplit(":", 1)[1])


def _check_port_free(address: str) -> None:
  """Refuse a port something listens on: gRPC binds with SO_REUSEPORT, so a second service
  (say, a killed job's, inside its grace) would share the port with ours and take half the
  connections. A plain socket's bind fails on it."""
  host, port = address.rsplit(":", 1)
  host = host.strip("[]")
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  try:
    probe = socket.socket(family, socket.SOCK_STREAM)
  except OSError:   # no IPv6 on this host: gRPC binds what it can, nothing to check here
    return
  with probe as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT is no listener
    try:
      s.bind((host or "::", int(port)))
    except OSError as e:
      raise RuntimeError(f"the coordination service cannot listen at {address}: {e.strerror} "
                         f"(a job still running, or one that ended less than {GRACE_S:.0f} s "
                         f"ago, may hold it)") from None


def start(coordinator_address: str, num_processes: int, heartbeat_timeout_s: int = 100,
          shutdown_timeout_s: int = 300, recoverable: bool = False) -> _Service:
  """The service, serving at `coordinator_address`'s port in a child process of this one."""
  address = bind_address(coordinator_address)
  _check_port_free(address)
  cmd = [sys.executable, "-m", "tree_rl.coordination", address, str(num_processes),
         str(os.getpid()), str(heartbeat_timeout_s), str(shutdown_timeout_s), str(int(recoverable))]
  # jaxlib's log lines go to a file nobody reads unless the start fails (a pipe left unread
  # would fill and block the service); its own session: a Ctrl-C meant for the job reaches
  # the job, whose exit ends the service
  with tempfile.TemporaryFile("w+") as log:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""     # "serving", or nothing when it failed
    proc.stdout.close()
    if line.strip() != "serving":
      if proc.poll() is None:
        proc.kill()
      proc.wait()
      log.seek(0)
      last = (log.read().strip().splitlines() or ["(no output)"])[-1]
      raise RuntimeError(f"the coordination service did not start at {address}: {last}")
  return _Service(proc)


def stop_here() -> None:
  """End this process's service now, if it hosts one (process 0 before `os._exit`, once the
  others have had their time to see it go): the grace is for an unplanned death only."""
  from jax._src import distributed
  service = distributed.global_state.service
  if isinstance(service, _Service):
    service.kill()


@contextlib.contextmanager
def service_started_by(service: _Service):
  """While inside, `jax.distributed.initialize` takes `service` as process 0's service."""
  from jax._src.lib import _jax
  original = _jax.get_distributed_runtime_service
  _jax.get_distributed_runtime_service = lambda *args, **kwargs: service
  try:
    yield
  finally:
    _jax.get_distributed_runtime_service = original


def _serve(address: str, num_processes: int, parent: int, heartbeat_timeout_s: int,
           shutdown_timeout_s: int, recoverable: bool) -> None:
  from jax._src.lib import _jax
  service = _jax.get_distributed_runtime_service(
      address, num_processes, heartbeat_timeout=heartbeat_timeout_s,
      shutdown_timeout=shutdown_timeout_s, recoverable=recoverable)
  stop = []
  signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  print("serving", flush=True)
  while not stop and os.getppid() == parent:
    time.sleep(0.2)
  if not stop:        # the parent is gone without a shutdown: give the others time to name it
    end = time.monotonic() + GRACE_S
    while not stop and time.monotonic() < end:
      time.sleep(0.2)
  service.shutdown()


if __name__ == "__main__":
  address, n, parent, heartbeat, shutdown, recoverable = sys.argv[1:7]
  _serve(address, int(n), int(parent), int(heartbeat), int(shutdown), bool(int(recoverable)))
