"""Workspaces and test runs for a code-repair environment.

A `Sandbox` owns a scratch root; every workspace is a directory under it, addressed by a small int
handle that is never reused. `fork` is a hard-link tree (files linked, directories created) and the
tools write by replace (a temp file in the same directory, then `os.replace`), so a fork costs one
link per file and a write never shows through to a sibling. Files are 0644 and directories 0755,
owned by the sandbox's user.

Tools (read / write / replace) take workspace-relative paths. `SandboxError` refuses: an empty or
absolute path, any `..` component, a path whose any existing component is a symlink, a path that
resolves outside the workspace, a non-regular file, reading a file larger than `file_bytes` and a
write whose UTF-8 size exceeds it. Its one-line message is what the agent sees.

`run_tests` runs test code given as text: it reaches the runner on stdin and is never written to
disk, so an agent cannot read hidden tests from the workspace. The runner
(`tree_rl.envs.sandbox_runner`, a file run by path with the flags below) has a root half that sets
up, waits and reports, and a test half forked from it that execs the source as a module (workspace
first on `sys.path`) and calls its `test_*` functions in definition order, printing `PASS name` or
`FAIL name: ExcType: message`. The root half prints the last line, `RESULT <passed> <total>`, from a
report sent over a private pipe, so a test that prints its own RESULT line and exits scores 0/0;
after a time-out or a crash a `sandbox: ...` line says why. `run_calls` (the codefix reward,
`envs.codefix.reward`) uses the same runner in calls mode: the child imports a module and makes given
calls, writing one JSON line of plain data per call and nothing else; the parent accepts exactly one
line per call, in order, from a child that exited 0 by itself (the root half's exit status, which
the child cannot forge), and voids the run otherwise. The child gets no expected value, no test
source and no report channel. The set-up lives in the runner rather than in a preexec_fn: spawning
needs no fork of a large, threaded parent, and the root half stays to reap (an init that never reaps
would otherwise keep zombies of the tests' uid, which count against RLIMIT_NPROC for good).

Layers, and what each stops:

1. Process: `cwd` = workspace; an environment of PATH, LANG, HOME (the workspace) and
   PYTHONHASHSEED=0 only; `setsid` (its own process group); `-P -s -S -B` (`-I` less `-E`,
   which would drop PYTHONHASHSEED; the environment is scrubbed instead). The root half SIGKILLs
   the tests at `timeout_s`, then kills and reaps whatever is left (as a child subreaper where there is no PID
   namespace); the parent kills that process group after every run, and everything at
   `timeout_s` + 5 s. Output is read as it comes and only its first `output_bytes` are kept.
2. rlimits (test half): CPU (past `cpu_s` the tests end, reported), AS (large allocations raise
   MemoryError), FSIZE (no file past `file_bytes`), CORE=0, and NPROC when the tests run as nobody
   or in a user namespace (layer 4) on Linux 5.14+, which counts it per (user namespace, uid): there
   only the run's own processes count (on older kernels every process of the trainer's uid would,
   so it stays unset).
3. Unprivileged user: as root, the test half drops to nobody (65534) once the namespaces exist,
   so RLIMIT_NPROC holds (the kernel never applies it to root: a fork bomb stops at `processes`),
   the workspace (root-owned, 0644/0755) cannot be written and root-only files cannot be read;
   no-new-privs makes setuid binaries grant nothing. Kept only when nobody can reach the root.
   Without root there is no second uid to drop to: see the user namespace below.
4. Namespaces (what holds is probed once at start-up): network (a loopback that is down, so
   nothing connects), PID (the test half is its init: when it exits every process it started dies
   and is reaped; its own /proc shows no other process) and mount: the minimal view pivots into a
   tmpfs holding only the workspace and the stdlib directories (each at its own path), /dev/null,
   /dev/zero, /dev/urandom, /proc and /dev/shm, and detaches the host's root, so no other host
   file, no shell and no binary exist for the tests; every mount read-only and nosuid, /dev/shm
   a small private tmpfs, the one writable place. Where pivot_root fails the fallback keeps the
   host's tree read-only (the stdlib bind-mounted under /dev/shm, so nobody can import it).
   Without root the runner first makes a user namespace of its own (one unshare with the others;
   the trainer's uid and gid mapped to 0, setgroups denied, no user namespace allowed below it),
   and the same namespaces and view follow. There the test half, the PID namespace's init, makes
   the view itself: the kernel lets a user namespace mount a proc only while a full one is
   visible, so the tests' proc is mounted before the host's root is detached (where even that is
   refused, as under a host /proc with masked entries, /proc stays empty). The tests run as root
   of that namespace, which is the trainer's uid outside it, and drop every capability for good
   before no-new-privs (bounding set emptied, securebits locked so that uid 0 regains nothing at
   exec, ambient set cleared, capset to nothing, checked with capget). So the kernel checks their
   files as the trainer's uid: the workspace is the trainer's own, and only the read-only mount
   keeps it unwritten; nothing else of the host is in the view. The trainer's processes could be
   signalled or traced by uid, but the PID namespace gives the tests no name for any of them.
   Where the kernel refuses the user namespace (or a step after it), the probe falls back to
   none of layers 3 and 4.
5. An audit hook, installed before the source runs: `open` for reading outside the workspace and
   the stdlib, `open` for writing anywhere, file-system changes, listing outside directories,
   subprocess / os.system / os.exec* / os.spawn* / os.posix_spawn, socket connect / bind / sendto,
   ctypes and os.kill raise PermissionError, which fails the test.

`enforcement()` says which layers hold on this machine; the namespaces count only where the tests
cannot leave them: with the drop to nobody (root could leave them), or in the user namespace with
every capability dropped. Leaving a namespace (setns), unmounting, remounting or unsharing the view,
or bringing up an interface needs a capability (CAP_SYS_ADMIN, CAP_NET_ADMIN) in the user namespace
that owns the namespace in question: the host's are owned by one above the tests', where they never
held any, and their own by the one whose capabilities they gave up; a nested user namespace, which
would grant capabilities over new namespaces of its own only, cannot be made (its limit is 0).
`user_namespace` says which of the two ways holds. Not enforced: the audit hook is a tripwire, not a
boundary: its policy is state in the tests' own process, which code under test can clear (layers 1-4
are set up before that code runs, by a process it cannot reach, and hold regardless). In `run_tests`
(the visible tests) the tests share their process with the code under test, which can read and patch
them: fine for the agent's own `<test/>`, never used for a reward. Without the namespaces (no root
and no user namespace) a test can reach the network, read what the trainer's uid can, outlive its
run by leaving its process group (the subreaper still kills what it can find) and signal the
processes of its uid; there NPROC is unset and the tests can write the workspace. As nobody,
RLIMIT_NPROC counts every process of nobody on the machine, so concurrent runs share that budget (in
a user namespace each run has its own); memory is limited per process (AS), not per run; IPC (SysV,
POSIX message queues) is not namespaced.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

from tree_rl.envs import plain
from tree_rl.envs import sandbox_runner as runner

NOBODY = 65534
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
_PYTHON_FLAGS = ("-P", "-s", "-S", "-B")
_RUNNER = os.path.abspath(runner.__file__)   # run by path (see its docstring)
_SCRATCH = "/dev/shm"
_SCRATCH_BYTES = 8 << 20
_BACKSTOP_S = 5.0        # the parent kills the whole run this long after the runner's own time-out
_TAIL_BYTES = 4096
_CALLS_BYTES = 1 << 16   # the most output a calls run may write; past it, every call fails


class SandboxError(Exception):
  """A refused action; str(e) is the one-line message the agent sees as its observation."""


@dataclasses.dataclass(frozen=True)
class Limits:
  timeout_s: float = 5.0          # wall clock per test run
  cpu_s: int = 5                  # RLIMIT_CPU
  memory_bytes: int = 512 << 20   # RLIMIT_AS
  file_bytes: int = 1 << 20       # RLIMIT_FSIZE for test code; the largest file a tool may write
  processes: int = 32             # RLIMIT_NPROC
  output_bytes: int = 2000        # test output kept (truncated, with a marker)


@dataclasses.dataclass(frozen=True)
class TestRun:
  passed: int
  total: int
  output: str
  timed_out: bool

  @property
  def fraction(self) -> float:
    return self.passed / self.total if self.total else 0.0


@dataclasses.dataclass(frozen=True)
class CallRun:
  """A calls run: per call ("ok", value) | ("error", exception type) | ("bad", type name), or
  None when the run as a whole counts for nothing (`note` says why)."""
  outcomes: list | None
  note: str


# Checks, as the tests' user, that a configuration really holds; formatted with its expectations.
_PROBE_SOURCE = '''
import os, math, collections
import probe_module
def test_probe():
  assert os.getuid() == {uid} or {uid} < 0
  if {nproc}:   # the process limit leaves the tests room to fork
    pid = os.fork()
    if pid == 0:
      os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
  assert (os.getpid() == 1) == {pid_ns}
  if {net_ns}:
    import socket
    assert [n for _, n in socket.if_nameindex()] == ["lo"]
  if {read_only}:
    assert os.statvfs(".").f_flag & os.ST_RDONLY
  if {minimal}:
    assert not os.path.exists("/etc") and not os.path.exists("/bin")
  try:
    open("/")
  except PermissionError as e:
    assert "sandbox" in str(e)
  else:
    raise AssertionError("the audit hook is not installed")
'''


@dataclasses.dataclass(frozen=True)
class _Config:
  uid: int                # the tests' uid; -1 keeps the trainer's
  flags: int              # CLONE_NEW* for the runner's unshare
  read_only: bool
  minimal: bool = False   # pivot_root into a view of the workspace, the stdlib and 3 devices

  @property
  def user_namespace(self) -> bool:
    return bool(self.flags & CLONE_NEWUSER)

  @property
  def contained(self) -> bool:
    """Whether the tests cannot leave their namespaces: as nobody (no root to undo them), or in a
    user namespace of their own with every capability dropped (root there is nothing outside)."""
    return self.uid >= 0 or self.user_namespace

  @property
  def nproc(self) -> bool:
    """Whether RLIMIT_NPROC is set: never for root (the kernel would not apply it); in a user
    namespace only where the kernel counts it per namespace (5.14+), not per uid on the host."""
    return self.uid >= 0 or (self.user_namespace and _NPROC_PER_NAMESPACE)


class Sandbox:
  """Workspaces under one scratch root, their file tools and their test runs."""

  def __init__(self, root: str | None = None, limits: Limits = Limits(), workers: int = 2):
    if workers < 1:
      raise ValueError(f"workers must be >= 1, got {workers}")
    self.limits, self.workers = limits, workers
    self._made_root = root is None or not os.path.exists(root)
    if root is None:
      root = tempfile.mkdtemp(prefix="tree_rl_sandbox_")
    os.makedirs(root, exist_ok=True)
    if self._made_root:
      os.chmod(root, 0o755)
    self.root = os.path.realpath(root)
    self._spaces: dict[int, str] = {}
    self._next = 0
    self._lock = threading.Lock()
    self._pool: ThreadPoolExecutor | None = None
    self._closed = False
    try:
      self._libdirs = _stdlib_dirs()
      self._config = self._probe()
    except BaseException:
      if self._made_root:
        shutil.rmtree(self.root, ignore_errors=True)
      raise

  # -- workspaces --

  def create(self, files: Mapping[str, str]) -> int:
    """A new workspace holding these text files (relative paths); returns its handle."""
    handle, ws = self._new()
    try:
      for rel, text in files.items():
        self.write(handle, rel, text)
    except BaseException:
      self.release(handle)
      raise
    return handle

  def fork(self, handle: int) -> int:
    """An independent copy of the workspace as it is now: a hard-link tree."""
    src = self.path(handle)
    new, dst = self._new()
    try:
      self._link_tree(src, dst)
    except BaseException:   # a half-built copy is not left registered
      self.release(new)
      raise
    return new

  @staticmethod
  def _link_tree(src: str, dst: str) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
      out = os.path.join(dst, os.path.relpath(dirpath, src))
      for name in dirnames + filenames:
        s, d = os.path.join(dirpath, name), os.path.join(out, name)
        mode = os.lstat(s).st_mode
        if stat.S_ISLNK(mode):
          os.symlink(os.readlink(s), d)
        elif stat.S_ISDIR(mode):
          os.mkdir(d)
          os.chmod(d, 0o755)
        elif stat.S_ISREG(mode):
          try:
            os.link(s, d, follow_symlinks=False)
          except OSError:   # e.g. EMLINK: too many links to one inode
            shutil.copyfile(s, d, follow_symlinks=False)
            os.chmod(d, 0o644)

  def release(self, handle: int) -> None:
    """Delete the workspace; an unknown or released handle raises KeyError."""
    with self._lock:
      if handle not in self._spaces:
        raise KeyError(f"unknown or released workspace handle {handle}")
      ws = self._spaces.pop(handle)
    shutil.rmtree(ws, ignore_errors=True)

  def release_all(self) -> None:
    for handle in self.live():
      self.release(handle)

  def live(self) -> list[int]:
    with self._lock:
      return sorted(self._spaces)

  def path(self, handle: int) -> str:
    with self._lock:
      if handle not in self._spaces:
        raise KeyError(f"unknown or released workspace handle {handle}")
      return self._spaces[handle]

  def _new(self) -> tuple[int, str]:
    with self._lock:
      if self._closed:
        raise RuntimeError("the sandbox is closed")
      while True:   # a shared or stale root (a killed run) may hold w<n> already: skip it
        handle, self._next = self._next, self._next + 1
        ws = os.path.join(self.root, f"w{handle}")
        try:
          os.mkdir(ws)
          break
        except FileExistsError:
          continue
      os.chmod(ws, 0o755)
      self._spaces[handle] = ws
    return handle, ws

  # -- tools --

  def read(self, handle: int, path: str) -> str:
    full = self._resolve(handle, path)
    try:
      st = os.lstat(full)
    except FileNotFoundError:
      raise SandboxError(f"no such file: {path!r}") from None
    self._check_file(path, st)
    if st.st_size > self.limits.file_bytes:
      raise SandboxError(f"refused: {path!r} is larger than {self.limits.file_bytes} bytes")
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
      self._check_file(path, os.fstat(f.fileno()))
      data = f.read(self.limits.file_bytes + 1)
    if len(data) > self.limits.file_bytes:
      raise SandboxError(f"refused: {path!r} is larger than {self.limits.file_bytes} bytes")
    return data.decode("utf-8", "replace")

  def write(self, handle: int, path: str, text: str) -> None:
    """Write by replace (temp file + os.replace), so hard-linked forks never see the change."""
    if not isinstance(text, str):
      raise SandboxError(f"refused: the text for {path!r} is not a string")
    full = self._resolve(handle, path)
    data = text.encode("utf-8", "surrogateescape")
    if len(data) > self.limits.file_bytes:
      raise SandboxError(f"refused: writing {len(data)} bytes to {path!r} exceeds the "
                         f"{self.limits.file_bytes}-byte file limit")
    if os.path.lexists(full):
      self._check_file(path, os.lstat(full))
    parent = os.path.dirname(full)
    self._makedirs(self.path(handle), parent)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=".write-")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), 0o644)
      os.replace(tmp, full)
    except BaseException:
      if os.path.lexists(tmp):
        os.unlink(tmp)
      raise

  def replace(self, handle: int, path: str, old: str, new: str) -> None:
    """Replace `old`, which must occur exactly once in the file, with `new`."""
    if not old:
      raise SandboxError("refused: the text to replace is empty")
    text = self.read(handle, path)
    count = text.count(old)
    if count == 0:
      raise SandboxError(f"replace: the old text was not found in {path!r}")
    if count > 1:
      raise SandboxError(
          f"replace: the old text occurs {count} times in {path!r}; it must occur once")
    self.write(handle, path, text.replace(old, new, 1))

  def files(self, handle: int) -> list[str]:
    """Relative paths of the workspace's regular files, sorted."""
    ws = self.path(handle)
    out = []
    for dirpath, _, filenames in os.walk(ws):
      for name in filenames:
        full = os.path.join(dirpath, name)
        if stat.S_ISREG(os.lstat(full).st_mode):
          out.append(os.path.relpath(full, ws))
    return sorted(out)

  def _resolve(self, handle: int, path: str) -> str:
    """The absolute path for a tool's relative path, or SandboxError when the policy refuses it."""
    ws = self.path(handle)
    if not isinstance(path, str) or not path:
      raise SandboxError("refused: empty path")
    if "\0" in path:
      raise SandboxError(f"refused: path {path!r} contains a NUL byte")
    if os.path.isabs(path):
      raise SandboxError(f"refused: absolute path {path!r}")
    parts = path.split("/")
    if ".." in parts:
      raise SandboxError(f"refused: path {path!r} leaves the workspace")
    parts = [p for p in parts if p not in ("", ".")]
    if not parts:
      raise SandboxError(f"refused: path {path!r} names no file")
    cur = ws
    for i, part in enumerate(parts):
      cur = os.path.join(cur, part)
      try:
        mode = os.lstat(cur).st_mode
      except FileNotFoundError:
        break
      prefix = "/".join(parts[:i + 1])
      if stat.S_ISLNK(mode):
        raise SandboxError(f"refused: path {path!r} goes through a symlink ({prefix!r})")
      if i < len(parts) - 1 and not stat.S_ISDIR(mode):
        raise SandboxError(f"refused: path {path!r}: {prefix!r} is not a directory")
    full = os.path.join(ws, *parts)
    if not os.path.realpath(full).startswith(ws + os.sep):
      raise SandboxError(f"refused: path {path!r} leaves the workspace")
    return full

  @staticmethod
  def _check_file(path: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
      raise SandboxError(f"refused: {path!r} is a symlink")
    if not stat.S_ISREG(st.st_mode):
      raise SandboxError(f"refused: {path!r} is not a regular file")

  @staticmethod
  def _makedirs(ws: str, directory: str) -> None:
    missing = []
    while directory != ws and not os.path.isdir(directory):
      missing.append(directory)
      directory = os.path.dirname(directory)
    for d in reversed(missing):
      os.mkdir(d)
      os.chmod(d, 0o755)

  # -- test runs --

  def run_tests(self, handle: int, source: str) -> TestRun:
    """Run test code given as text against the workspace (see the module docstring)."""
    return self._run(self.path(handle), source, self._config, self.limits)

  def run_tests_many(self, handles: Sequence[int], sources: Sequence[str]) -> list[TestRun]:
    """run_tests over a pool of `workers` threads; results in the order of `handles`."""
    if len(handles) != len(sources):
      raise ValueError(f"{len(handles)} handles but {len(sources)} sources")
    paths = [self.path(h) for h in handles]
    return list(self._map(lambda p, s: self._run(p, s, self._config, self.limits), paths, sources))

  def run_calls(self, handle: int, module: str, function: str,
                calls: Sequence[tuple]) -> CallRun:
    """Import `module` from the workspace and call `function(*args)` for each argument tuple in a
    sandboxed child that returns only plain data (see `envs.codefix.reward`)."""
    return self.run_calls_many([handle], module, function, [calls])[0]

  def run_calls_many(self, handles: Sequence[int], module: str | Sequence[str],
                     function: str | Sequence[str], calls: Sequence[Sequence[tuple]]) -> list[CallRun]:
    """run_calls over the pool; `module` and `function` are one name or one per handle."""
    n = len(handles)
    modules = [module] * n if isinstance(module, str) else list(module)
    functions = [function] * n if isinstance(function, str) else list(function)
    if not len(modules) == len(functions) == len(calls) == n:
      raise ValueError(f"{n} handles but {len(modules)} modules, {len(functions)} functions "
                       f"and {len(calls)} call lists")
    jobs = [json.dumps({"module": m, "function": f, "calls": [plain.encode(tuple(a)) for a in c]})
            for m, f, c in zip(modules, functions, calls)]
    paths = [self.path(h) for h in handles]
    return list(self._map(lambda p, j, c: self._calls(p, j, len(c)), paths, jobs, calls))

  def enforcement(self) -> dict[str, bool]:
    """Which layers hold on this machine (see the module docstring)."""
    c = self._config
    held = c.contained   # root outside the user namespace could leave them: they count only so
    return {"unprivileged_user": c.uid >= 0, "user_namespace": c.user_namespace,
            "process_limit": c.nproc,
            "network_namespace": held and bool(c.flags & CLONE_NEWNET),
            "pid_namespace": held and bool(c.flags & CLONE_NEWPID),
            "read_only_filesystem": held and c.read_only,
            "minimal_filesystem": held and c.minimal, "rlimits": True, "audit_hook": True}

  def _map(self, fn, *iterables):
    with self._lock:
      if self._pool is None:
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
      pool = self._pool
    return pool.map(fn, *iterables)

  def _argv(self, mode: str, ws: str, config: _Config, lim: Limits) -> list[str]:
    mounts = bool(config.flags & CLONE_NEWNS)
    args = runner.Args(mode, ws, lim.timeout_s, lim.cpu_s, lim.memory_bytes, lim.file_bytes,
                       lim.processes if config.nproc else -1, config.uid, config.uid,
                       config.flags, config.read_only, config.minimal,
                       _SCRATCH if mounts else "", _SCRATCH_BYTES,
                       self._libdirs if mounts else [])
    return [sys.executable, *_PYTHON_FLAGS, _RUNNER, *runner.to_argv(args)]

  def _spawn(self, mode: str, ws: str, text: str, config: _Config, limits: Limits, cap: int):
    """Run the runner with `text` on stdin: (head, tail, size, killed, exit status), or the
    OSError that kept it from starting."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": ws,
           "PYTHONHASHSEED": "0"}
    err = subprocess.DEVNULL if mode == "calls" else subprocess.STDOUT
    try:
      proc = subprocess.Popen(self._argv(mode, ws, config, limits), cwd=ws, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                              start_new_session=True)
    except OSError as e:
      return e
    with proc:
      try:
        proc.stdin.write(text.encode("utf-8", "surrogateescape"))
        proc.stdin.close()
      except BrokenPipeError:
        pass
      head, tail, size, killed = _collect(proc, cap, limits.timeout_s + _BACKSTOP_S)
      os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)   # a zombie still holds its group id
      _killpg(proc.pid)
      code = proc.wait()
    return head, tail, size, killed, code

  def _run(self, ws: str, source: str, config: _Config, limits: Limits) -> TestRun:
    out = self._spawn("tests", ws, source, config, limits, limits.output_bytes)
    if isinstance(out, OSError):
      return TestRun(0, 0, f"sandbox: could not start the test process: {out}", False)
    return _result(*out, limits)

  def _calls(self, ws: str, job: str, n: int) -> CallRun:
    out = self._spawn("calls", ws, job, self._config, self.limits, _CALLS_BYTES)
    if isinstance(out, OSError):
      return CallRun(None, f"could not start the child: {out}")
    head, _, size, killed, code = out
    return _call_outcomes(head, size, killed, code, n, self.limits)

  # -- start-up probe --

  def _probe(self) -> _Config:
    """The strongest configuration whose probe test passes here (see _PROBE_SOURCE)."""
    net, pid, mnt = CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS
    levels = [(net | pid | mnt, True), (net | pid | mnt, False), (net | pid, False), (net, False)]
    if os.geteuid() == 0:
      users = [NOBODY, -1] if _reachable(self.root) else [-1]
      # the minimal view makes its own path to the workspace, so nobody reaches any scratch root
      candidates = [_Config(NOBODY, net | pid | mnt, True, True)]
      candidates += [_Config(u, f, ro) for u in users for f, ro in levels + [(0, False)]]
    else:   # the same namespaces, made inside a user namespace of the trainer's own
      user = CLONE_NEWUSER
      candidates = [_Config(-1, user | net | pid | mnt, True, True)]
      candidates += [_Config(-1, user | f, ro) for f, ro in levels] + [_Config(-1, 0, False)]
    ws = tempfile.mkdtemp(prefix="probe-", dir=self.root)
    os.chmod(ws, 0o755)
    with open(os.path.join(ws, "probe_module.py"), "w") as f:
      os.fchmod(f.fileno(), 0o644)
    try:
      for config in candidates:
        source = _PROBE_SOURCE.format(uid=config.uid, pid_ns=bool(config.flags & pid),
                                      net_ns=bool(config.flags & net), read_only=config.read_only,
                                      minimal=config.minimal, nproc=config.nproc)
        run = self._run(ws, source, config, Limits())
        if (run.passed, run.total) == (1, 1):
          return config
      raise RuntimeError(f"sandbox: no configuration runs tests here; last output: {run.output!r}")
    finally:
      shutil.rmtree(ws, ignore_errors=True)

  # -- life cycle --

  def close(self) -> None:
    """Release every workspace and remove the root (when this sandbox made it)."""
    with self._lock:
      if self._closed:
        return
      self._closed = True
      pool, self._pool = self._pool, None
    if pool is not None:
      pool.shutdown(wait=True)
    self.release_all()
    if self._made_root:
      shutil.rmtree(self.root, ignore_errors=True)

  def __enter__(self) -> Sandbox:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _collect(proc: subprocess.Popen, cap: int, limit_s: float) -> tuple[bytes, bytes, int, bool]:
  """Read the run's output until EOF, keeping its head and tail; kill the whole run past limit_s."""
  fd = proc.stdout.fileno()
  poll = select.poll()
  poll.register(fd, select.POLLIN)
  head, tail, size = bytearray(), b"", 0
  deadline = time.monotonic() + limit_s
  while True:
    left = deadline - time.monotonic()
    if left <= 0:
      for child in _children(proc.pid):   # the tests' process: killing it ends its namespace
        _kill(child)
      _killpg(proc.pid)
      return bytes(head), tail, size, True
    if not poll.poll(left * 1000):
      continue
    chunk = os.read(fd, 1 << 16)
    if not chunk:
      return bytes(head), tail, size, False
    size += len(chunk)
    if len(head) < cap:
      head += chunk[:cap - len(head)]
    tail = (tail + chunk)[-_TAIL_BYTES:]


def _result(head: bytes, tail: bytes, size: int, killed: bool, code: int,
            limits: Limits) -> TestRun:
  """The TestRun of a run's output: counts from its last line (the RESULT line), output cut."""
  cap = limits.output_bytes
  lines = tail.decode("utf-8", "replace").rstrip("\n").split("\n")
  passed = total = 0
  words = lines[-1].split() if lines else []
  if not killed and len(words) == 3 and words[0] == "RESULT" and all(map(str.isdigit, words[1:])):
    passed, total = int(words[1]), int(words[2])
  output = head.decode("utf-8", "replace")
  if size > cap:   # the marker repeats the runner's closing lines (a reason, RESULT)
    trailer = [l[:200] for l in lines[-2:] if l.startswith(("sandbox: ", "RESULT "))]
    output += "\n".join([f"\n[output truncated: {size - cap} more bytes]"] + trailer)
  if killed:
    output += f"\nsandbox: no result within {limits.timeout_s + _BACKSTOP_S:g} s; killed"
  return TestRun(passed, total, output, killed or code == runner.TIMED_OUT)


_CALL_VOID = {runner.CALLS_TIMEOUT: "timed out",
              runner.CALLS_SETUP: "the sandbox could not be set up",
              runner.CALLS_CPU: "ran past the CPU limit",
              runner.CALLS_EXIT: "the child exited early or with an error",
              runner.CALLS_KILLED: "the child was killed by a signal"}


def _call_outcomes(head: bytes, size: int, killed: bool, code: int, n: int,
                   limits: Limits) -> CallRun:
  """The outcomes of a calls run's output: exactly n lines [i, kind, payload] in order, from a
  child that exited 0 by itself; anything else voids the run."""
  if killed:
    return CallRun(None, f"no result within {limits.timeout_s + _BACKSTOP_S:g} s; killed")
  if code != 0:
    return CallRun(None, _CALL_VOID.get(code, f"the runner exited with status {code}"))
  if size > _CALLS_BYTES:
    return CallRun(None, f"more than {_CALLS_BYTES} bytes of output")
  text = head.decode("utf-8", "replace")
  lines = text.split("\n")
  if lines[-1] != "" or len(lines) != n + 1:
    return CallRun(None, f"{len(lines) - 1} output lines for {n} calls")
  outcomes = []
  for i, line in enumerate(lines[:-1]):
    try:
      j, kind, payload = json.loads(line)
      if type(j) is not int or j != i or kind not in ("ok", "error", "bad"):
        raise ValueError(line[:80])
      if kind == "ok":
        outcomes.append((kind, plain.decode(payload)))
      elif type(payload) is str:
        outcomes.append((kind, payload[:100]))
      else:
        raise ValueError(line[:80])
    except (ValueError, TypeError, RecursionError):
      return CallRun(None, f"output line {i + 1} is not a result")
  return CallRun(outcomes, "")


def _kernel_at_least(version: tuple[int, int]) -> bool:
  try:
    return tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2]) >= version
  except ValueError:
    return False


# Linux 5.14 counts RLIMIT_NPROC per (user namespace, uid): inside the tests' namespace only the
# run's own processes count; before it, every process of the trainer's uid would.
_NPROC_PER_NAMESPACE = _kernel_at_least((5, 14))


def _stdlib_dirs() -> list[str]:
  """The runner's import path (stdlib and its extension modules), outermost directories only."""
  code = "import sys; print(*sys.path, sep='\\n')"
  out = subprocess.run([sys.executable, *_PYTHON_FLAGS, "-c", code], capture_output=True, text=True,
                       check=True, env={}).stdout.split("\n")
  dirs = [d for d in out if d and os.path.isdir(d)]
  return [d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs if o != d)]


def _reachable(path: str) -> bool:
  """Whether any user may traverse every directory down to `path` (o+x all the way)."""
  while True:
    if not os.stat(path).st_mode & stat.S_IXOTH:
      return False
    if path == os.path.dirname(path):
      return True
    path = os.path.dirname(path)


def _children(pid: int) -> list[int]:
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(p) for p in f.read().split()]
  except OSError:
    return []


def _kill(pid: int) -> None:
  try:
    os.kill(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _killpg(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
