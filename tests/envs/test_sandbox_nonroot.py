"""The sandbox run by a trainer that is not root: the tests' namespaces and minimal view made
inside a user namespace of the trainer's own, or, where the kernel refuses one, the fallback and
its report.

Each test runs a helper as a non-root user (nobody when pytest is root, else pytest's own user)
that makes a `Sandbox` under a scratch root it owns and runs test sources in it. The sources
switch the audit hook off first (OFF), so what stops them is the layers beneath it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from tree_rl.envs import sandbox as sb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sandbox import MODULE, OFF  # noqa: E402  (the hook switched off from inside)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Run by the non-root user: the job on stdin, one JSON line out. The package is entered without
# its __init__ files (which import JAX), so any Python 3.11+ the user can run will do.
HELPER = r'''
import json, os, signal, socket, sys, time, types
job = json.load(sys.stdin)
for name, sub in [("tree_rl", "tree_rl"), ("tree_rl.envs", "tree_rl/envs")]:
  module = types.ModuleType(name)
  module.__path__ = [os.path.join(job["repo"], sub)]
  sys.modules[name] = module
from tree_rl.envs import sandbox as sb
if job["refuse_user_namespace"]:   # an invalid unshare flag: the kernel answers EINVAL
  sb.CLONE_NEWUSER |= 1
out = {"uid": os.getuid(), "pid": os.getpid()}
with open(job["host_file"]) as f:   # what this user reads and reaches outside the sandbox
  out["outside_read"] = f.read()
with socket.create_connection(("127.0.0.1", job["port"]), timeout=2):
  out["outside_connect"] = True
sleepers = []   # other processes of this user, which the tests' process limit must not count
for _ in range(job["sleepers"]):
  pid = os.fork()
  if pid == 0:
    time.sleep(60)
    os._exit(0)
  sleepers.append(pid)
try:
  with sb.Sandbox(job["root"], limits=sb.Limits(**job["limits"])) as s:
    h = s.create({"m.py": job["module"]})
    out["enforcement"] = s.enforcement()
    out["runs"] = []
    for source in job["sources"]:
      run = s.run_tests(h, source.replace("HELPER_PID", str(os.getpid())))
      out["runs"].append([run.passed, run.total, run.output])
    out["module_after"] = s.read(h, "m.py")
finally:
  for pid in sleepers:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(json.dumps(out))
'''

# Whether the kernel gives this user what the sandbox needs: a user namespace with its own mount,
# network and PID namespaces, the user's ids mapped to 0 and a mount made there.
USERNS_PROBE = r'''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
def write(path, text):
  with open(path, "w") as f:
    f.write(text)
try:
  assert libc.unshare(0x10000000 | 0x00020000 | 0x40000000 | 0x20000000) == 0
  write("/proc/self/setgroups", "deny")
  write("/proc/self/uid_map", f"0 {uid} 1")
  write("/proc/self/gid_map", f"0 {gid} 1")
  assert libc.mount(None, b"/", None, (1 << 14) | (1 << 18), None) == 0
  assert libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, b"size=64k") == 0
  print("yes")
except (AssertionError, OSError):
  print("no")
'''


def src(text: str) -> str:
  return textwrap.dedent(text)


def interpreter() -> str:
  """A Python 3.11+ the non-root user can run (this venv's may sit under a root-only home)."""
  if os.geteuid() != 0:
    return sys.executable
  names = [sys.executable, shutil.which("python3"), "/usr/local/bin/python3", "/usr/bin/python3"]
  for name in names:
    candidate = os.path.realpath(name or "/nonexistent")
    if (os.path.isfile(candidate) and sb._reachable(os.path.dirname(candidate))
        and os.stat(candidate).st_mode & 1):
      version = run_as_user([candidate, "-c", "import sys; print(sys.version_info >= (3, 11))"])
      if version.strip() == "True":
        return candidate
  pytest.fail("no Python 3.11+ that user nobody can run: the non-root sandbox cannot be tried")


def run_as_user(argv: list[str], stdin: str = "", cwd: str = "/") -> str:
  """stdout of argv run as nobody (pytest as root) or as pytest's own user."""
  kwargs = dict(user=sb.NOBODY, group=sb.NOBODY, extra_groups=[]) if os.geteuid() == 0 else {}
  proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd=cwd, env={},
                        timeout=120, **kwargs)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


@pytest.fixture
def host():
  """A scratch dir the non-root user owns, a world-readable host file outside it holding a token,
  and a TCP server on the host's loopback."""
  scratch = tempfile.mkdtemp(prefix="sandbox_nonroot_")
  os.chmod(scratch, 0o755)
  if os.geteuid() == 0:
    os.chown(scratch, sb.NOBODY, sb.NOBODY)
  token = uuid.uuid4().hex
  fd, host_file = tempfile.mkstemp(prefix="host_", suffix=".txt", dir="/tmp")
  os.write(fd, token.encode())
  os.close(fd)
  os.chmod(host_file, 0o644)
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(8)
  try:
    yield scratch, host_file, token, server
  finally:
    server.close()
    os.remove(host_file)
    shutil.rmtree(scratch, ignore_errors=True)


def staged_package(scratch: str) -> str:
  """A copy of the sandbox's modules under `scratch`, which the non-root user can read wherever
  the repository sits (a checkout under a root-only home would not do)."""
  envs = os.path.join(scratch, "pkg", "tree_rl", "envs")
  os.makedirs(envs, exist_ok=True)
  for name in ("sandbox.py", "sandbox_runner.py", "plain.py"):
    shutil.copy(os.path.join(REPO, "tree_rl", "envs", name), envs)
  for d, _, files in os.walk(os.path.join(scratch, "pkg")):
    os.chmod(d, 0o755)
    for f in files:
      os.chmod(os.path.join(d, f), 0o644)
  return os.path.join(scratch, "pkg")


def run_helper(host, sources, refuse=False, sleepers=0, limits=None):
  scratch, host_file, token, server = host
  job = {"repo": staged_package(scratch), "root": os.path.join(scratch, "root"), "host_file": host_file,
         "port": server.getsockname()[1], "module": MODULE, "sources": sources,
         "refuse_user_namespace": refuse, "sleepers": sleepers,
         "limits": limits or {"timeout_s": 5.0}}
  out = json.loads(run_as_user([interpreter(), "-c", HELPER], json.dumps(job), cwd=scratch))
  assert out["uid"] != 0 and out["outside_read"] == token and out["outside_connect"]
  return out


def userns_allowed() -> bool:
  return run_as_user([interpreter(), "-c", USERNS_PROBE]).strip() == "yes"


# With the hook off: what the code under test reaches of the host (the file, the network, the
# trainer's processes, the workspace, capabilities).
ESCAPES = OFF + src('''
  import errno, os, socket
  import __main__
  def test_host_file():
    print("read:", open("HOST_FILE").read())
  def test_connect():
    socket.create_connection(("127.0.0.1", PORT), timeout=1)
    print("connected")
  def test_processes():
    print("pid:", os.getpid(), "pids:", [p for p in os.listdir("/proc") if p.isdigit()])
    os.kill(HELPER_PID, 0)
    print("signalled the helper")
  def test_write_workspace():
    fd = os.open("m.py", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"hacked")
  def test_capabilities():
    libc = __main__.libc
    for what, rc in [("unshare a mount namespace", libc.unshare(0x00020000)),
                     ("unshare a user namespace", libc.unshare(0x10000000)),
                     ("umount /", libc.umount2(b"/", 2))]:
      assert rc != 0, what
''')


def escapes(host):
  _, host_file, _, server = host
  return ESCAPES.replace("HOST_FILE", host_file).replace("PORT", str(server.getsockname()[1]))


def test_non_root_gets_namespaces_of_its_own_or_reports_the_fallback(host):
  token, server = host[2], host[3]
  out = run_helper(host, [escapes(host), "import m, os\ndef test_m():\n  assert m.f() == 3\n"
                          "  print('uid', os.getuid(), os.stat('m.py').st_uid)\n"])
  report = out["enforcement"]
  (passed, total, output), (ok, ok_total, ok_output) = out["runs"]
  assert (ok, ok_total) == (1, 1), ok_output
  assert out["module_after"] == MODULE
  server.settimeout(0.2)
  if not userns_allowed():   # the kernel refuses: today's behaviour, reported as such
    assert report == {"unprivileged_user": False, "user_namespace": False, "process_limit": False,
                      "network_namespace": False, "pid_namespace": False,
                      "read_only_filesystem": False, "minimal_filesystem": False,
                      "rlimits": True, "audit_hook": True}, report
    assert f"read: {token}" in output and "connected" in output   # what the report admits
    return
  assert report == {"unprivileged_user": False, "user_namespace": True,
                    "process_limit": sb._NPROC_PER_NAMESPACE, "network_namespace": True,
                    "pid_namespace": True, "read_only_filesystem": True,
                    "minimal_filesystem": True, "rlimits": True, "audit_hook": True}, report
  assert (passed, total) == (1, 5), output
  assert token not in output
  assert "FAIL test_host_file: FileNotFoundError" in output
  assert "FAIL test_connect: OSError: [Errno 101] Network is unreachable" in output
  assert "pid: 1 pids: ['1']" in output or "pid: 1 pids: []" in output   # its own proc, or none
  assert "FAIL test_processes: ProcessLookupError" in output
  assert "FAIL test_write_workspace: OSError: [Errno 30] Read-only file system" in output
  assert "PASS test_capabilities" in output
  assert "uid 0 0" in ok_output   # root inside the namespace, the trainer's uid outside
  server.accept()[0].close()   # the helper's own connection, made outside the sandbox
  with pytest.raises(socket.timeout):
    server.accept()   # and none from the tests


def test_a_refused_user_namespace_falls_back_and_says_so(host):
  _, _, token, _ = host
  out = run_helper(host, [escapes(host)], refuse=True)
  assert out["enforcement"] == {
      "unprivileged_user": False, "user_namespace": False, "process_limit": False,
      "network_namespace": False, "pid_namespace": False, "read_only_filesystem": False,
      "minimal_filesystem": False, "rlimits": True, "audit_hook": True}
  passed, total, output = out["runs"][0]
  assert f"read: {token}" in output and "PASS test_host_file" in output, output


def test_the_process_limit_counts_only_the_run(host):
  if not userns_allowed():
    out = run_helper(host, [])
    assert not out["enforcement"]["process_limit"]
    return
  forks = src('''
    import os
    def test_three():
      pids = [os.fork() or os._exit(0) for _ in range(3)]
      for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    def test_bomb():
      while True:
        os.fork()
  ''')
  start = time.monotonic()
  out = run_helper(host, [forks], sleepers=12, limits={"timeout_s": 3.0, "processes": 8})
  assert out["enforcement"]["process_limit"] == sb._NPROC_PER_NAMESPACE
  passed, total, output = out["runs"][0]
  if sb._NPROC_PER_NAMESPACE:   # 12 other processes of the user; the run still forks, up to 8
    assert "PASS test_three" in output and "FAIL test_bomb: BlockingIOError" in output, output
    assert (passed, total) == (1, 2)
  assert time.monotonic() - start < 30
