"""The sandbox's child program: set up the layers, run the tests or the calls, report.

`tree_rl.envs.sandbox` runs this file by path, `python -P -s -S -B <this file> <args>` (see
`to_argv` / `parse`), with the test source or a calls job on stdin. The interpreter reads and
compiles the whole file before `main` runs, so nothing of it has to exist in the view the runner
then builds (the minimal view holds only the workspace, the stdlib and three devices); `-P` keeps
its directory off `sys.path`, so neither the runner nor the code under test can import the rest of
the package. Its one sibling, `plain.py` (the calls' data encoding, standard library only), is
read by path at start-up, before any namespace exists. Beyond that the runner uses the standard
library alone. It can also be imported, for its helpers' tests; importing it runs nothing.

A run has a root half, which makes the namespaces and mounts, waits and reports, and a tests half
forked from it, which enters rlimits, no-new-privs, the unprivileged user, the import path and the
audit hook, then runs the code (see the threat model in `tree_rl.envs.sandbox`). Without root the
root half first makes a user namespace (NEWUSER in its flags) and the tests half, the PID
namespace's init, makes the minimal view (with its proc) and drops every capability in place of
the user: there is no second uid to drop to.
"""

import _signal
import collections
import ctypes
import json
import os
import platform
import resource
import select
import signal
import sys
import time

NEWNS, NEWUSER, NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(platform.machine(), -1)
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
REFUSED = {"subprocess.Popen", "os.system", "os.posix_spawn", "os.kill", "os.killpg",
           "signal.pthread_kill", "socket.connect", "socket.bind", "socket.sendto",
           "socket.sendmsg", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function"}
REFUSED_PREFIXES = ("os.exec", "os.spawn")
CHANGES = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
           "os.symlink", "os.truncate", "os.utime", "os.setxattr", "os.removexattr",
           "shutil.rmtree", "shutil.copyfile", "shutil.move"}
LISTINGS = {"os.listdir", "os.scandir", "glob.glob"}
XCPU_EXIT = 128 + _signal.SIGXCPU   # the tests' exit status once past the CPU limit
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
TIMED_OUT, SETUP_FAILED = 124, 125  # exit statuses of a tests run that timed out / could not start
# the root half's exit status in calls mode, read by the parent alone (the tests cannot forge it)
CALLS_OK, CALLS_TIMEOUT, CALLS_SETUP, CALLS_CPU, CALLS_EXIT, CALLS_KILLED = 0, 124, 125, 3, 4, 5
libc = ctypes.CDLL(None, use_errno=True)

# The command line after the program: these fields in order, then the stdlib dirs to mount. mode is
# "tests" (test source on stdin) or "calls" (a JSON job on stdin); uid -1 keeps the user, nproc -1
# leaves RLIMIT_NPROC unset; scratch "" mounts no scratch tmpfs.
FIELDS = {"mode": str, "ws": str, "timeout": float, "cpu": int, "memory": int, "fsize": int,
          "nproc": int, "uid": int, "gid": int, "flags": int, "read_only": bool, "minimal": bool,
          "scratch": str, "scratch_bytes": int}
Args = collections.namedtuple("Args", [*FIELDS, "libdirs"])


def to_argv(args):
  """The command-line words for `args` (an Args), read back by `parse`."""
  words = [str(int(v)) if kind is bool else repr(float(v)) if kind is float else str(v)
           for v, kind in zip(args, FIELDS.values())]
  return words + [str(d) for d in args.libdirs]


def parse(words):
  """The Args of the words after the program; ValueError for a short list or a bad number."""
  if len(words) < len(FIELDS) or words[0] not in ("tests", "calls"):
    raise ValueError(f"usage: runner {' '.join(FIELDS)} [stdlib dirs...]; got {words!r}")
  values = [w == "1" if kind is bool else kind(w) for w, kind in zip(words, FIELDS.values())]
  return Args(*values, list(words[len(FIELDS):]))


def _load_plain():
  """`plain.py` from beside this file, as a module that is not entered in `sys.modules`."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain.py")
  module = type(sys)("plain")
  module.__file__ = path
  with open(path, encoding="utf-8") as f:
    exec(compile(f.read(), path, "exec"), module.__dict__)
  return module


plain = _load_plain()


# -- output --

def flush():
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except BaseException:
      pass


def emit(line):
  flush()
  try:
    os.write(1, (line + "\n").encode("utf-8", "replace"))
  except OSError:
    pass


def one_line(e):
  """str(e) on one line, or a placeholder when str itself fails."""
  try:
    return " ".join(str(e).splitlines())
  except BaseException:
    return "<unprintable>"


def signal_name(n):
  try:
    return signal.Signals(n).name
  except ValueError:
    return f"signal {n}"


# -- namespaces and mounts (root half) --

def call(rc, what):
  if rc != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def read_only_mounts():
  class Attr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns_fd")]
  attr = Attr(1 | 2, 0, 0, 0)   # MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID
  call(libc.syscall(ctypes.c_long(442), ctypes.c_long(-100), b"/", ctypes.c_long(0x8000),
                    ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), "mount_setattr /")


def tmpfs(where, size, mode):
  opts = f"size={size},nr_inodes=4096,mode={mode}".encode()
  call(libc.mount(b"tmpfs", where.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"tmpfs {where}")


def minimal_root(new, ws, libdirs, proc=False):
  """pivot_root into a tmpfs at `new` that holds the workspace, the stdlib dirs (each at its own
  path) and three devices; the host's root is detached, so no other host file exists any more.
  With `proc` (the init of a PID namespace made in a user namespace), a proc of that namespace is
  mounted first, while the host's is still visible: the kernel lets a user namespace mount a proc
  only then. Where it refuses even that (a host /proc with masked entries), /proc stays empty."""
  if PIVOT_ROOT < 0:
    raise OSError(0, f"pivot_root: unknown syscall number on {platform.machine()}")
  os.umask(0o022)
  tmpfs(new, 1 << 20, "755")
  def place(path, directory=True):
    target = new + path
    os.makedirs(target if directory else os.path.dirname(target), 0o755, exist_ok=True)
    if not directory:
      os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
    return target.encode()
  for d in [ws] + libdirs:
    call(libc.mount(d.encode(), place(d), None, MS_BIND | MS_REC, None), f"bind {d}")
  for dev in DEVICES:
    call(libc.mount(dev.encode(), place(dev, False), None, MS_BIND, None), f"bind {dev}")
  for d in ("/proc", "/dev/shm", "/old"):
    place(d)
  if proc:
    try:
      own_proc(new + "/proc", unshare=False)
    except OSError:
      pass
  os.chdir(new)
  call(libc.syscall(ctypes.c_long(PIVOT_ROOT), b".", b"old"), "pivot_root")
  os.chdir("/")
  call(libc.umount2(b"/old", MNT_DETACH), "umount the old root")
  os.rmdir("/old")


def write_file(path, text):
  fd = os.open(path, os.O_WRONLY)
  try:
    os.write(fd, text.encode())
  finally:
    os.close(fd)


def own_user_namespace(uid, gid):
  """Map the caller's uid and gid (outside) to 0 (inside) in the user namespace just entered, the
  one id each that exists there; no supplementary groups can be set; no namespace below it."""
  write_file("/proc/self/setgroups", "deny")   # required before an unprivileged gid_map
  write_file("/proc/self/uid_map", f"0 {uid} 1")
  write_file("/proc/self/gid_map", f"0 {gid} 1")
  write_file("/proc/sys/user/max_user_namespaces", "0")   # this namespace's own limit


def setup(flags, read_only, minimal, scratch, scratch_bytes, libdirs, ws):
  """Namespaces and mounts (root half); returns [(stdlib dir, where the tests see it)]."""
  if flags:
    uid, gid = os.getuid(), os.getgid()
    call(libc.unshare(flags), "unshare")
    if flags & NEWUSER:
      own_user_namespace(uid, gid)
  if not flags & NEWPID:
    call(libc.prctl(36, 1, 0, 0, 0), "prctl(PR_SET_CHILD_SUBREAPER)")
  remap = []
  if flags & NEWNS:
    call(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    if minimal and flags & NEWUSER:
      return remap   # the tests half makes the view (user_view)
    if minimal:
      minimal_root(scratch, ws, libdirs)
    if read_only:
      read_only_mounts()
    if minimal:
      tmpfs("/dev/shm", scratch_bytes, "1777")
      os.chdir(ws)
    elif scratch:
      tmpfs(scratch, scratch_bytes, "1777")
      base = os.path.join(scratch, ".python")
      os.mkdir(base, 0o755)
      for i, d in enumerate(libdirs):
        seen = os.path.join(base, str(i))
        os.mkdir(seen, 0o755)
        call(libc.mount(d.encode(), seen.encode(), None, MS_BIND | MS_REC, None), f"bind {d}")
        remap.append((d, seen))
  return remap


def remapped(path, remap):
  """Where the tests see `path` once the stdlib dirs are mounted elsewhere ([(dir, seen)])."""
  for d, seen in remap:
    if path == d or path.startswith(d + os.sep):
      return seen + path[len(d):]
  return path


def rlimits(args):
  """[(resource, (soft, hard))] for the tests half."""
  out = [(resource.RLIMIT_CPU, (args.cpu, args.cpu + 1)),
         (resource.RLIMIT_AS, (args.memory,) * 2),
         (resource.RLIMIT_FSIZE, (args.fsize,) * 2), (resource.RLIMIT_CORE, (0, 0))]
  if args.nproc >= 0:
    out.append((resource.RLIMIT_NPROC, (args.nproc, args.nproc)))
  return out


# -- the tests half --

def audit_hook(allowed):
  """The audit hook: refuses the events above, writes, and reads or listings outside `allowed`."""
  def inside(path):
    real = os.path.realpath(path)
    return any(real == a or real.startswith(a + os.sep) for a in allowed)

  def hook(event, args):
    if event in REFUSED or event.startswith(REFUSED_PREFIXES):
      raise PermissionError(f"sandbox: {event} refused")
    if event == "open":
      path, mode, flags = args
      if isinstance(path, int):
        return
      path = os.fsdecode(path)
      if (flags or 0) & WRITE or any(c in (mode or "") for c in "wax+"):
        raise PermissionError(f"sandbox: open {path!r} for writing refused")
      if not inside(path):
        raise PermissionError(f"sandbox: open {path!r} refused (outside the workspace)")
    elif event in CHANGES:
      raise PermissionError(f"sandbox: {event} refused")
    elif event in LISTINGS:
      target = "." if not args or args[0] is None else args[0]
      if not isinstance(target, int) and not inside(os.fsdecode(target) or "."):
        raise PermissionError(f"sandbox: {event} {os.fsdecode(target)!r} refused")
  return hook


CAPSET_VERSION_3 = 0x20080522
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 28, 47, 4
SECURE_ALL_LOCKED = 0xEF   # NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, locked; KEEP_CAPS off


def drop_capabilities():
  """Give up every capability for good: the bounding set emptied, the securebits locked so that
  uid 0 gains none at exec, no ambient set, then capset to nothing (checked with capget)."""
  cap = 0
  while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
    cap += 1
  if cap == 0:
    call(-1, "prctl(PR_CAPBSET_DROP)")
  call(libc.prctl(PR_SET_SECUREBITS, SECURE_ALL_LOCKED, 0, 0, 0), "prctl(PR_SET_SECUREBITS)")
  call(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "prctl(PR_CAP_AMBIENT)")
  header = (ctypes.c_uint32 * 2)(CAPSET_VERSION_3, 0)
  data = (ctypes.c_uint32 * 6)()
  call(libc.capset(header, data), "capset")
  call(libc.capget(header, data), "capget")
  if any(data):
    raise OSError(0, f"capabilities left after capset: {list(data)}")


def own_proc(where="/proc", unshare=True):
  """A /proc of this PID namespace (in a mount namespace of its own), so the host's are hidden."""
  if unshare:
    call(libc.unshare(NEWNS), "unshare")
  call(libc.mount(b"proc", where.encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None),
       f"mount {where}")


def user_view(args):
  """The minimal view, made in a user namespace by the tests half, the init of the PID namespace
  (so that it can mount that namespace's proc), in a mount namespace of its own."""
  call(libc.unshare(NEWNS), "unshare")
  minimal_root(args.scratch, args.ws, args.libdirs, proc=bool(args.flags & NEWPID))
  if args.read_only:
    read_only_mounts()
  tmpfs("/dev/shm", args.scratch_bytes, "1777")
  os.chdir(args.ws)


def enter(args, limits, remap):
  """The tests' side of the set-up: in a user namespace the minimal view, else an own /proc;
  rlimits, no new privileges, the capabilities (in a user namespace) or the user, the import path
  and the audit hook (a tripwire with readable messages; the boundary is the layers before)."""
  try:
    os.setpgid(0, 0)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)   # stdin was read to its end by the root half
    os.close(null)
    ws, uid, gid, flags = args.ws, args.uid, args.gid, args.flags
    if flags & NEWNS and flags & NEWUSER and args.minimal:
      user_view(args)
    elif flags & NEWPID and flags & NEWNS:
      own_proc()
    for res, value in limits:
      resource.setrlimit(res, value)
    # As a PID namespace's init this process would ignore SIGXCPU's default action.
    _signal.signal(_signal.SIGXCPU, lambda *_: os._exit(XCPU_EXIT))
    call(libc.prctl(38, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if flags & NEWUSER:
      drop_capabilities()
    if uid >= 0:
      os.setgroups([])
      os.setgid(gid)
      os.setuid(uid)
    sys.path[:] = [ws] + [remapped(p, remap) for p in sys.path]
    for m in list(sys.modules.values()):
      p = getattr(m, "__path__", None)
      if isinstance(p, list):
        p[:] = [remapped(x, remap) for x in p]
    sys.path_importer_cache.clear()
    allowed = [os.path.realpath(ws)] + [os.path.realpath(p) for p in sys.path[1:] if p]
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    sys.addaudithook(audit_hook(allowed))
  except BaseException as e:
    emit(f"sandbox: test set-up failed: {type(e).__name__}: {one_line(e)}")
    os._exit(SETUP_FAILED)


def tests_half(args, source, limits, remap, nonce, wfd):
  """Exec the source as a module and call its test_* functions in order, printing PASS / FAIL
  lines; the counts go to the root half over `wfd`, prefixed with `nonce`."""
  enter(args, limits, remap)
  passed = total = 0
  me = os.getpid()   # a process the tests fork that comes back into this loop exits silently
  module = type(sys)("__tests__")
  sys.modules["__tests__"] = module
  try:
    exec(compile(source, "<tests>", "exec"), module.__dict__)
  except BaseException as e:
    emit(f"ERROR loading tests: {type(e).__name__}: {one_line(e)}")
  else:
    tests = [(n, f) for n, f in list(module.__dict__.items())
             if n.startswith("test_") and callable(f)]
    total = len(tests)
    for name, fn in tests:
      try:
        fn()
      except BaseException as e:
        if os.getpid() != me:
          os._exit(0)
        emit(f"FAIL {name}: {type(e).__name__}: {one_line(e)}")
      else:
        if os.getpid() != me:
          os._exit(0)
        passed += 1
        emit(f"PASS {name}")
  if os.getpid() != me:
    os._exit(0)
  flush()
  os.write(wfd, f"{nonce} {passed} {total}\n".encode())
  os._exit(0)


# -- the calls half --

def calls_half(args, job, limits, remap):
  """Import the module, make each call, write one JSON line per call: [i, "ok", value] (plain
  data), [i, "error", exception type] or [i, "bad", type name]; nothing else."""
  enter(args, limits, remap)
  me = os.getpid()
  job = json.loads(job)
  try:
    fn = getattr(__import__(job["module"]), job["function"])
  except BaseException:
    os._exit(CALLS_EXIT)
  for i, args in enumerate(job["calls"]):
    try:
      value = fn(*plain.decode(args))
      try:
        line = [i, "ok", plain.encode(value)]
      except TypeError:
        line = [i, "bad", type(value).__name__]
    except BaseException as e:
      line = [i, "error", type(e).__name__]
    if os.getpid() != me:
      os._exit(0)
    flush()
    os.write(1, (json.dumps(line) + "\n").encode())
  flush()
  os._exit(0)


# -- the root half: wait, clean up, report --

def children():
  try:
    with open(f"/proc/self/task/{os.getpid()}/children") as f:
      return [int(p) for p in f.read().split()]
  except OSError:
    return []


def kill_leftovers(pgid):
  """Kill the tests' group and every child of this subreaper (orphans land here); reap them all."""
  end = time.monotonic() + 2.0
  while time.monotonic() < end:
    for kill, target in [(os.killpg, pgid)] + [(os.kill, p) for p in children()]:
      try:
        kill(target, 9)
      except OSError:
        pass
    try:
      while os.waitpid(-1, os.WNOHANG)[0]:
        pass
    except ChildProcessError:
      return
    time.sleep(0.002)


def wait_exit(pid, timeout):
  """The tests' exit (waitid info, not yet reaped, so its group id stays taken) and whether it was
  killed at the time-out."""
  deadline = time.monotonic() + timeout
  try:
    pidfd = os.pidfd_open(pid)
  except (AttributeError, OSError):
    pidfd = -1
  try:
    while True:
      info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
      if info is not None:
        return info, False
      left = deadline - time.monotonic()
      if left <= 0:
        os.kill(pid, 9)
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT), True
      if pidfd >= 0:
        select.select([pidfd], [], [], left)
      else:
        time.sleep(min(left, 0.005))
  finally:
    if pidfd >= 0:
      os.close(pidfd)


def calls_status(info, timed_out):
  """The root half's exit status in calls mode, from the calls' exit."""
  if timed_out:
    return CALLS_TIMEOUT
  if info.si_code == os.CLD_EXITED:
    return {0: CALLS_OK, XCPU_EXIT: CALLS_CPU}.get(info.si_status, CALLS_EXIT)
  return CALLS_KILLED


def tests_report(report, nonce, info, timed_out, timeout, cpu):
  """The closing lines and exit status of a tests run, from what came over the report pipe (bytes)
  and the tests' exit: counts only from a well-formed line carrying the nonce."""
  words = report.split(b"\n")[0].decode("ascii", "replace").split()
  if len(words) == 3 and words[0] == nonce and all(w.isdigit() for w in words[1:]):
    return [f"RESULT {int(words[1])} {int(words[2])}"], 0
  if timed_out:
    why = f"sandbox: timed out after {timeout:g} s; the test processes were killed"
  elif info.si_code == os.CLD_EXITED and info.si_status == XCPU_EXIT:
    why = f"sandbox: the tests ran past the CPU limit of {cpu} s"
  elif info.si_code == os.CLD_EXITED:
    why = f"sandbox: the test process exited with status {info.si_status} before reporting"
  else:
    why = f"sandbox: the test process was killed by {signal_name(info.si_status)}"
  return [why, "RESULT 0 0"], TIMED_OUT if timed_out else 0


def main(argv):
  args = parse(argv[1:])
  calls = args.mode == "calls"
  source = sys.stdin.buffer.read().decode("utf-8", "surrogateescape")
  try:
    remap = setup(args.flags, args.read_only, args.minimal, args.scratch, args.scratch_bytes,
                  args.libdirs, args.ws)
  except OSError as e:
    if calls:
      sys.exit(CALLS_SETUP)
    emit(f"sandbox: set-up failed: {one_line(e)}")
    emit("RESULT 0 0")
    sys.exit(SETUP_FAILED)
  limits = rlimits(args)
  nonce = os.urandom(8).hex()
  if not calls:
    rfd, wfd = os.pipe()
  pid = os.fork()
  if pid == 0:
    if calls:
      calls_half(args, source, limits, remap)
    os.close(rfd)
    tests_half(args, source, limits, remap, nonce, wfd)
  info, timed_out = wait_exit(pid, args.timeout)
  kill_leftovers(pid)
  if calls:   # nothing on stdout from this half: the parent reads the verdict from the status
    sys.exit(calls_status(info, timed_out))
  os.close(wfd)
  os.set_blocking(rfd, False)
  try:
    report = os.read(rfd, 256)
  except OSError:
    report = b""
  lines, status = tests_report(report, nonce, info, timed_out, args.timeout, args.cpu)
  for line in lines:
    emit(line)
  sys.exit(status)


if __name__ == "__main__":
  main(sys.argv)
