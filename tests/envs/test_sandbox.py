"""The workspace sandbox: workspaces and forks, the tools' path policy, and test runs, including
the escapes test code may try (each checked against what it would have changed)."""

from __future__ import annotations

import dataclasses
import os
import socket
import stat
import tempfile
import textwrap
import time
import uuid

import pytest

from tree_rl.envs import sandbox as sb

MODULE = "def f():\n  return 3\n"

# Switches the audit hook's policy off from inside the tests' process (its state is that
# process's own), so the layers beneath the hook are what stop what follows.
OFF = '''
import __main__, gc
__main__.REFUSED.clear()
__main__.CHANGES.clear()
__main__.LISTINGS.clear()
__main__.REFUSED_PREFIXES = ("-",)
__main__.WRITE = 0
for o in gc.get_objects():
  if type(o) is list and o and type(o[0]) is str and o[0].startswith("/"):
    o.append("")   # the hook's allowed prefixes: now every path is "inside"
'''


def src(text: str) -> str:
  return textwrap.dedent(text)


@pytest.fixture(scope="module")
def box():
  with sb.Sandbox() as s:
    yield s


@pytest.fixture
def ws(box):
  handle = box.create({"m.py": MODULE, "pkg/util.py": "X = 1\n"})
  yield handle
  if handle in box.live():
    box.release(handle)


def lines(run):
  return run.output.splitlines()


def inode(*parts):
  return os.stat(os.path.join(*parts)).st_ino


def processes_in(directory):
  """Live processes whose working directory is `directory`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.readlink(f"/proc/{pid}/cwd") == directory:
        found.append(int(pid))
    except OSError:
      pass
  return found


def orphaned_nobody_zombies():
  """Zombies of the tests' user left to the machine's init, which may never reap them."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/status") as f:
        fields = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
    except OSError:
      continue
    state, uid, ppid = fields["State"].split()[0], fields["Uid"].split()[0], fields["PPid"].strip()
    if (state, uid, ppid) == ("Z", str(sb.NOBODY), "1"):
      found.append(int(pid))
  return found


# -- workspaces --

def test_create_read_files_round_trip(box):
  h = box.create({"a.py": "A = 1\n", "sub/dir/b.txt": "héllo\n"})
  assert box.files(h) == ["a.py", "sub/dir/b.txt"]
  assert box.read(h, "a.py") == "A = 1\n"
  assert box.read(h, "sub/dir/b.txt") == "héllo\n"
  assert box.read(h, "./sub//dir/b.txt") == "héllo\n"
  root = box.path(h)
  assert os.path.dirname(root) == box.root
  assert stat.S_IMODE(os.stat(os.path.join(root, "sub/dir/b.txt")).st_mode) == 0o644
  assert stat.S_IMODE(os.stat(os.path.join(root, "sub/dir")).st_mode) == 0o755
  box.write(h, "new/c.py", "C = 3\n")
  assert box.files(h) == ["a.py", "new/c.py", "sub/dir/b.txt"]
  box.release(h)


def test_fork_is_a_hard_link_tree_and_isolated(box, ws):
  child = box.fork(ws)
  parent_dir, child_dir = box.path(ws), box.path(child)
  assert box.files(child) == box.files(ws) == ["m.py", "pkg/util.py"]
  for rel in box.files(ws):
    assert inode(parent_dir, rel) == inode(child_dir, rel)
  box.replace(child, "m.py", "return 3", "return 4")
  box.write(ws, "pkg/util.py", "X = 2\n")
  assert box.read(ws, "m.py") == MODULE
  assert box.read(child, "m.py") == "def f():\n  return 4\n"
  assert box.read(child, "pkg/util.py") == "X = 1\n"
  with open(os.path.join(parent_dir, "m.py")) as f:
    assert f.read() == MODULE
  with open(os.path.join(child_dir, "pkg/util.py")) as f:
    assert f.read() == "X = 1\n"
  assert inode(parent_dir, "m.py") != inode(child_dir, "m.py")
  grandchild = box.fork(child)
  assert box.read(grandchild, "m.py") == "def f():\n  return 4\n"
  box.release(child)
  assert box.read(grandchild, "m.py") == "def f():\n  return 4\n"
  box.release(grandchild)


def test_release_and_handles(box):
  a, b = box.create({"x.py": ""}), box.create({"y.py": ""})
  path = box.path(a)
  assert b > a and {a, b} <= set(box.live())
  box.release(a)
  assert not os.path.exists(path) and a not in box.live()
  with pytest.raises(KeyError, match=f"unknown or released workspace handle {a}"):
    box.release(a)
  with pytest.raises(KeyError):
    box.read(a, "x.py")
  c = box.create({})
  assert c > b   # never reused
  box.release(b)
  box.release(c)


def test_release_all_and_close():
  s = sb.Sandbox()
  try:
    handles = [s.create({"a.py": "A = 1\n"}) for _ in range(3)]
    handles.append(s.fork(handles[0]))
    s.release_all()
    assert s.live() == [] and os.listdir(s.root) == []
    s.create({"b.py": ""})
  finally:
    s.close()
  assert not os.path.exists(s.root)
  s.close()   # a second close is a no-op
  with pytest.raises(RuntimeError, match="closed"):
    s.create({})


def test_replace_exactly_once(box, ws):
  box.write(ws, "r.py", "a = 1\na = 1\nb = 2\n")
  with pytest.raises(sb.SandboxError, match="not found in 'r.py'"):
    box.replace(ws, "r.py", "c = 3", "c = 4")
  with pytest.raises(sb.SandboxError, match="occurs 2 times in 'r.py'"):
    box.replace(ws, "r.py", "a = 1", "a = 5")
  with pytest.raises(sb.SandboxError, match="empty"):
    box.replace(ws, "r.py", "", "x")
  assert box.read(ws, "r.py") == "a = 1\na = 1\nb = 2\n"
  box.replace(ws, "r.py", "b = 2", "b = 3")
  assert box.read(ws, "r.py") == "a = 1\na = 1\nb = 3\n"
  with pytest.raises(sb.SandboxError, match="no such file: 'missing.py'"):
    box.replace(ws, "missing.py", "a", "b")


# -- path policy --

def tool_calls(box, ws, path):
  return [lambda: box.read(ws, path), lambda: box.write(ws, path, "no"),
          lambda: box.replace(ws, path, "keep", "no")]


def test_refuses_dotdot_absolute_and_empty(box, ws, tmp_path):
  outside = tmp_path / "outside.txt"
  outside.write_text("keep\n")
  for path in ["../x", "pkg/../../x", os.path.relpath(outside, box.path(ws))]:
    for call in tool_calls(box, ws, path):
      with pytest.raises(sb.SandboxError, match=r"^refused: path .* leaves the workspace$"):
        call()
  for call in tool_calls(box, ws, str(outside)):
    with pytest.raises(sb.SandboxError, match="^refused: absolute path"):
      call()
  with pytest.raises(sb.SandboxError, match="^refused: absolute path '/etc/passwd'$"):
    box.read(ws, "/etc/passwd")
  with pytest.raises(sb.SandboxError, match="^refused: empty path$"):
    box.write(ws, "", "x")
  with pytest.raises(sb.SandboxError, match="names no file"):
    box.read(ws, "./")
  assert outside.read_text() == "keep\n"
  assert box.files(ws) == ["m.py", "pkg/util.py"]


def test_refuses_symlinks(box, ws, tmp_path):
  root = box.path(ws)
  outside = tmp_path / "secret.txt"
  outside.write_text("keep\n")
  os.symlink(outside, os.path.join(root, "out.txt"))                     # a file outside
  os.symlink(tmp_path, os.path.join(root, "outdir"))                      # a directory outside
  os.symlink(os.path.join(root, "pkg"), os.path.join(root, "alias"))      # a directory inside
  os.symlink(os.path.join(root, "m.py"), os.path.join(root, "m_link.py"))  # a file inside
  os.symlink(os.path.join(root, "outdir"), os.path.join(root, "chain"))   # to a symlinked dir
  paths = ["out.txt", "outdir/secret.txt", "outdir/new.txt", "alias/util.py", "m_link.py",
           "chain/secret.txt", "chain/new.txt"]
  for path in paths:
    for call in tool_calls(box, ws, path):
      with pytest.raises(sb.SandboxError, match=r"^refused: path .* goes through a symlink"):
        call()
  assert outside.read_text() == "keep\n"
  assert sorted(os.listdir(tmp_path)) == ["secret.txt"]
  assert box.read(ws, "pkg/util.py") == "X = 1\n" and box.read(ws, "m.py") == MODULE
  assert box.files(ws) == ["m.py", "pkg/util.py"]   # symlinks are not files


def test_refuses_non_regular_and_large_files(box, ws):
  root, limit = box.path(ws), box.limits.file_bytes
  with pytest.raises(sb.SandboxError, match="^refused: 'pkg' is not a regular file$"):
    box.read(ws, "pkg")
  with pytest.raises(sb.SandboxError, match="^refused: 'pkg' is not a regular file$"):
    box.write(ws, "pkg", "x")
  with pytest.raises(sb.SandboxError, match="'m.py' is not a directory"):
    box.write(ws, "m.py/x", "x")
  os.mkfifo(os.path.join(root, "fifo"))
  with pytest.raises(sb.SandboxError, match="not a regular file"):
    box.read(ws, "fifo")
  with pytest.raises(sb.SandboxError, match=f"exceeds the {limit}-byte file limit"):
    box.write(ws, "big.txt", "x" * (2 << 20))
  with pytest.raises(sb.SandboxError, match="exceeds"):
    box.replace(ws, "m.py", "return 3", "return '" + "y" * limit + "'")
  assert not os.path.exists(os.path.join(root, "big.txt"))
  assert box.read(ws, "m.py") == MODULE
  with open(os.path.join(root, "huge.txt"), "w") as f:   # placed from outside the tools
    f.write("z" * (limit + 1))
  with pytest.raises(sb.SandboxError, match=f"'huge.txt' is larger than {limit} bytes"):
    box.read(ws, "huge.txt")
  assert [f for f in os.listdir(root) if f.startswith(".")] == []   # no temp files left


# -- test runs: results --

COUNTS = src('''
  import m
  def test_one():
    assert m.f() == 3
  def test_two():
    print("hello from a test")
  def test_three():
    assert m.f() == 4, "f is not 4"
  def test_four():
    raise ValueError("bad\\nvalue")
  helper = 1
''')


def test_counts_and_lines(box, ws):
  run = box.run_tests(ws, COUNTS)
  assert (run.passed, run.total, run.timed_out) == (2, 4, False)
  assert run.fraction == 0.5
  assert lines(run) == ["PASS test_one", "hello from a test", "PASS test_two",
                        "FAIL test_three: AssertionError: f is not 4",
                        "FAIL test_four: ValueError: bad value", "RESULT 2 4"]
  assert sb.TestRun(0, 0, "", False).fraction == 0.0


def test_load_errors_and_forged_results(box, ws):
  run = box.run_tests(ws, "def test_x(:\n  pass\n")
  assert (run.passed, run.total) == (0, 0)
  assert lines(run)[0].startswith("ERROR loading tests: SyntaxError")
  run = box.run_tests(ws, "import no_such_module\ndef test_x():\n  pass\n")
  assert (run.passed, run.total) == (0, 0)
  assert "ERROR loading tests: ModuleNotFoundError: No module named 'no_such_module'" in run.output
  run = box.run_tests(ws, src('''
    import os
    def test_x():
      print("RESULT 9 9", flush=True)
      os._exit(0)
  '''))
  assert (run.passed, run.total) == (0, 0) and lines(run)[-1] == "RESULT 0 0"
  assert "exited with status 0 before reporting" in run.output
  run = box.run_tests(ws, "import sys\ndef test_exit():\n  sys.exit(3)\ndef test_ok():\n  pass\n")
  assert (run.passed, run.total) == (1, 2) and "FAIL test_exit: SystemExit: 3" in run.output


def test_output_truncation(box, ws):
  source = "def test_loud():\n  for i in range(500):\n    print('line', i, 'x' * 40)\n"
  run = box.run_tests(ws, source)
  assert (run.passed, run.total) == (1, 1)
  head, marker = run.output.split("\n[output truncated: ")
  assert len(head.encode()) <= box.limits.output_bytes and head.startswith("line 0 ")
  assert marker.split("]")[0].endswith("more bytes") and len(marker) < 200
  assert marker.endswith("RESULT 1 1")


def test_source_does_not_reach_the_workspace(box, ws):
  token = uuid.uuid4().hex
  before = {rel: box.read(ws, rel) for rel in box.files(ws)}
  run = box.run_tests(ws, f"SECRET = '{token}'\ndef test_a():\n  pass\n")
  assert (run.passed, run.total) == (1, 1)
  assert {rel: box.read(ws, rel) for rel in box.files(ws)} == before
  for dirpath, _, names in os.walk(box.root):
    for name in names:
      with open(os.path.join(dirpath, name), "rb") as f:
        assert token.encode() not in f.read()


def test_workspace_modules_and_stdlib_import(box, ws):
  run = box.run_tests(ws, src('''
    import m, pkg.util, json
    def test_a():
      assert m.f() + pkg.util.X == 4
      assert json.loads(json.dumps([1])) == [1]
  '''))
  assert (run.passed, run.total) == (1, 1), run.output


def test_environment_is_scrubbed(box, ws):
  source = src('''
    import os, sys
    def test_env():
      print(sorted(os.environ), os.environ["HOME"] == os.getcwd())
      print(hash("tree"), sys.flags.no_site, sys.flags.dont_write_bytecode, sys.flags.safe_path)
  ''')
  first, second = box.run_tests(ws, source), box.run_tests(ws, source)
  assert (first.passed, first.total) == (1, 1), first.output
  assert lines(first)[0] == "['HOME', 'LANG', 'PATH', 'PYTHONHASHSEED'] True"
  assert lines(first)[1].endswith(" 1 1 True")
  assert first.output == second.output   # the hash seed is fixed


def test_run_tests_many_matches_sequential(box):
  handles = [box.create({"m.py": f"def f():\n  return {i}\n"}) for i in range(8)]
  sources = [f"import m\ndef test_value():\n  assert m.f() == {i}\n"
             "def test_even():\n  assert m.f() % 2 == 0\n" for i in range(8)]
  sources[3] = "import m\ndef test_wrong():\n  assert m.f() == 0\n"
  sequential = [box.run_tests(h, s) for h, s in zip(handles, sources)]
  parallel = box.run_tests_many(handles, sources)
  assert parallel == sequential
  assert [(r.passed, r.total) for r in parallel] == [(2, 2), (1, 2), (2, 2), (0, 1), (2, 2),
                                                     (1, 2), (2, 2), (1, 2)]
  with pytest.raises(ValueError, match="8 handles but 1 sources"):
    box.run_tests_many(handles, sources[:1])
  for h in handles:
    box.release(h)


# -- test runs: escapes --

# a run ends within its time-out plus this (start-up and clean-up on a loaded 2-core CI machine;
# the parent's backstop is the time-out + 5 s)
SLACK_S = 4.0

def test_enforcement_report(box):
  report = box.enforcement()
  assert set(report) == {"unprivileged_user", "user_namespace", "process_limit",
                         "network_namespace", "pid_namespace", "read_only_filesystem",
                         "minimal_filesystem", "rlimits", "audit_hook"}
  assert report["rlimits"] and report["audit_hook"]
  if os.geteuid() == 0:   # as root every layer holds, with no user namespace (the drop to nobody)
    assert not report.pop("user_namespace") and all(report.values()), report
  # without root: tests/envs/test_sandbox_nonroot.py


def test_unreachable_root_runs_as_nobody_in_the_minimal_view(tmp_path):
  hidden = tmp_path / "private"
  hidden.mkdir(mode=0o700)
  with sb.Sandbox(str(hidden / "root")) as s:
    # the minimal view builds its own path to the workspace; without it the user stays
    if os.geteuid() == 0:
      assert s.enforcement()["unprivileged_user"] == s.enforcement()["minimal_filesystem"]
    h = s.create({"m.py": MODULE})
    run = s.run_tests(h, "import m, os\ndef test_a():\n  assert m.f() == 3\n  print(os.getuid())\n")
    assert (run.passed, run.total) == (1, 1), run.output
    if s.enforcement()["unprivileged_user"]:
      assert lines(run)[0] == str(sb.NOBODY)


def test_the_minimal_view_holds_only_the_workspace_stdlib_and_devices(box, ws, tmp_path):
  if not box.enforcement()["minimal_filesystem"]:   # root, or a user namespace without root
    return
  token = uuid.uuid4().hex
  host = tempfile.NamedTemporaryFile("w", dir="/tmp", prefix="host_", suffix=".txt")
  host.write(token)
  host.flush()
  os.chmod(host.name, 0o644)
  run = box.run_tests(ws, OFF + src(f'''
    import os, sys
    def test_view():
      print(sorted(os.listdir("/")), sorted(os.listdir("/dev")))
      for p in ["{host.name}", "/etc/passwd", "/etc/shadow", "/bin/sh", "/usr/bin/python3",
                sys.executable, "/proc/1/root/etc/passwd"]:
        assert not os.path.exists(p), p
      assert open("m.py").read() == {MODULE!r}
    def test_exec():
      import _posixsubprocess
      r, w = os.pipe()
      pid = _posixsubprocess.fork_exec([b"/bin/sh"], [b"/bin/sh"], True, (w,), None, None, -1, -1, -1,
                                 -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None,
                                 False)
      os.close(w)
      err = b""   # the child writes its exec error in pieces: read to the end, as subprocess does
      while chunk := os.read(r, 200):
        err += chunk
      os.waitpid(pid, 0)
      print("exec", err.decode())
  '''))
  host.close()
  assert lines(run)[0].endswith("['null', 'shm', 'urandom', 'zero']"), run.output
  assert "PASS test_view" in run.output and "exec OSError:2:" in run.output   # ENOENT
  assert token not in run.output


def test_infinite_loop_times_out():
  with sb.Sandbox(limits=sb.Limits(timeout_s=1.0)) as s:
    h = s.create({"m.py": MODULE})
    start = time.monotonic()
    run = s.run_tests(h, "import os\ndef test_spin():\n  os.fork()\n  while True:\n    pass\n")
    assert time.monotonic() - start < 1.0 + SLACK_S
    assert run.timed_out and (run.passed, run.total) == (0, 0)
    assert "timed out after 1 s" in run.output
    assert processes_in(s.path(h)) == []


def test_fork_bomb_is_contained():
  with sb.Sandbox(limits=sb.Limits(timeout_s=2.0, processes=8)) as s:
    h = s.create({"m.py": MODULE})
    start = time.monotonic()
    run = s.run_tests(h, "import os\ndef test_bomb():\n  while True:\n    os.fork()\n")
    assert time.monotonic() - start < 2.0 + SLACK_S
    if s.enforcement()["process_limit"]:   # the kernel refuses the ninth process
      assert "FAIL test_bomb: BlockingIOError" in run.output
      assert (run.passed, run.total) == (0, 1)
    assert processes_in(s.path(h)) == []
    stubborn = src('''
      import os
      def test_bomb():
        while True:
          try:
            os.fork()
          except OSError:
            pass
    ''')
    run = s.run_tests(h, stubborn)   # swallows the error: forks on until the time-out
    assert run.timed_out and time.monotonic() - start < 2 * (2.0 + SLACK_S)
    assert processes_in(s.path(h)) == []
    assert orphaned_nobody_zombies() == []
    run = s.run_tests(h, "import m\ndef test_after():\n  assert m.f() == 3\n")   # still usable
    assert (run.passed, run.total) == (1, 1)


def test_leftover_processes_die_without_a_pid_namespace():
  with sb.Sandbox() as s:
    s._config = dataclasses.replace(s._config, flags=0, read_only=False, minimal=False)
    h = s.create({"m.py": MODULE})
    run = s.run_tests(h, src('''
      import os, time
      def test_daemon():
        if os.fork() == 0:
          os.setsid()
          if os.fork() == 0:
            time.sleep(60)
          os._exit(0)
        time.sleep(0.1)
    '''))
    assert (run.passed, run.total) == (1, 1), run.output
    assert processes_in(s.path(h)) == []


def test_cpu_and_memory_limits(box, ws):
  with sb.Sandbox(limits=sb.Limits(cpu_s=1, timeout_s=10.0)) as s:
    h = s.create({})
    run = s.run_tests(h, "def test_spin():\n  while True:\n    pass\n")
    assert not run.timed_out   # stopped by its CPU time, well before the wall clock
    assert "sandbox: the tests ran past the CPU limit of 1 s" in run.output
  run = box.run_tests(ws, "def test_alloc():\n  b = bytearray(1 << 30)\ndef test_ok():\n  pass\n")
  assert (run.passed, run.total) == (1, 2) and "FAIL test_alloc: MemoryError" in run.output


def test_reading_outside_is_refused(box, ws):
  run = box.run_tests(ws, src('''
    import os
    def test_passwd():
      open("/etc/passwd").read()
    def test_listing():
      os.listdir("/etc")
    def test_local():
      assert open("m.py").read().startswith("def f")
  '''))
  assert (run.passed, run.total) == (1, 3)
  assert ("FAIL test_passwd: PermissionError: sandbox: open '/etc/passwd' refused "
          "(outside the workspace)") in run.output
  assert "FAIL test_listing: PermissionError: sandbox: os.listdir '/etc' refused" in run.output
  if box.enforcement()["unprivileged_user"] or box.enforcement()["minimal_filesystem"]:
    # beneath the hook: root-only files stay closed, or do not exist in the view
    shadow = OFF + "def test_shadow():\n  open('/etc/shadow').read()\n"
    run = box.run_tests(ws, shadow)
    assert (run.passed, run.total) == (0, 1), run.output
    assert ("FileNotFoundError" if box.enforcement()["minimal_filesystem"]
            else "PermissionError: [Errno 13]") in run.output


def test_processes_and_exec_are_refused(box, ws):
  run = box.run_tests(ws, src('''
    import os, subprocess
    def test_popen():
      subprocess.run(["true"])
    def test_system():
      os.system("true")
    def test_exec():
      os.execv("/bin/true", ["true"])
    def test_spawn():
      os.posix_spawn("/bin/true", ["true"], {})
    def test_ctypes():
      import ctypes
      ctypes.CDLL("libc.so.6")
    def test_runner_libc():
      import __main__
      __main__.libc.getpid()
  '''))
  assert (run.passed, run.total) == (0, 6)
  for name, event in [("popen", "subprocess.Popen"), ("system", "os.system"), ("exec", "os.exec"),
                      ("spawn", "os.posix_spawn"), ("ctypes", "ctypes.dlopen"),
                      ("runner_libc", "ctypes.dlsym")]:
    expected = f"FAIL test_{name}: PermissionError: sandbox: {event}"
    assert any(l.startswith(expected) for l in lines(run)), run.output


def test_network_is_refused(box, ws):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.5)
  port = server.getsockname()[1]
  try:
    run = box.run_tests(ws, src(f'''
      import socket
      def test_connect():
        socket.create_connection(("127.0.0.1", {port}), timeout=1)
      def test_bind():
        socket.socket().bind(("127.0.0.1", 0))
    '''))
    assert (run.passed, run.total) == (0, 2)
    assert "FAIL test_connect: PermissionError: sandbox: socket.connect refused" in run.output
    assert "FAIL test_bind: PermissionError: sandbox: socket.bind refused" in run.output
    if box.enforcement()["network_namespace"]:   # beneath the hook: no route to the host
      bypass = OFF + src(f'''
        import socket
        def test_tcp():
          socket.create_connection(("127.0.0.1", {port}), timeout=1)
      ''')
      run = box.run_tests(ws, bypass)
      assert (run.passed, run.total) == (0, 1), run.output
      assert "FAIL test_tcp: OSError: [Errno 101] Network is unreachable" in run.output
    with pytest.raises(socket.timeout):
      server.accept()
  finally:
    server.close()


def test_writes_are_refused(box, ws):
  tag, root, limit = uuid.uuid4().hex, box.path(ws), box.limits.file_bytes
  tmp, shm = f"/tmp/sandbox_{tag}", f"/dev/shm/sandbox_{tag}"
  run = box.run_tests(ws, src(f'''
    import os
    def test_tmp():
      open("{tmp}", "wb").write(b"x" * (1 << 30))
    def test_cwd():
      open("big.bin", "wb").write(b"x" * (1 << 30))
    def test_workspace():
      open("m.py", "w").write("hacked")
    def test_remove():
      os.remove("m.py")
  '''))
  assert (run.passed, run.total) == (0, 4)
  assert f"FAIL test_tmp: PermissionError: sandbox: open '{tmp}' for writing refused" in run.output
  assert "FAIL test_remove: PermissionError: sandbox: os.remove refused" in run.output
  # Beneath the hook: permissions or read-only mounts stop writes, RLIMIT_FSIZE caps file sizes.
  bypass = OFF + src(f'''
    import os, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    def fill(path, flags=os.O_WRONLY | os.O_CREAT):
      fd = os.open(path, flags, 0o644)
      try:
        for _ in range(1 << 12):
          os.write(fd, b"x" * (1 << 18))
      finally:
        os.close(fd)
    def refused(path, flags=os.O_WRONLY | os.O_CREAT):
      try:
        fill(path, flags)
      except OSError:
        return True
      return False
    def test_tmp():
      assert refused("{tmp}")
    def test_cwd():
      assert refused("m.py", os.O_WRONLY | os.O_TRUNC) and refused("big.bin")
    def test_shm():
      assert refused("{shm}")   # writable, but only up to the file-size limit
      assert {limit // 2} < os.stat("{shm}").st_size <= {limit}
  ''')
  try:
    run = box.run_tests(ws, bypass)
    assert (run.passed, run.total) == (3, 3), run.output
    for path in [tmp, shm, os.path.join(root, "big.bin")]:
      assert not os.path.exists(path) or os.path.getsize(path) <= limit
    if box.enforcement()["read_only_filesystem"]:
      assert not os.path.exists(tmp) and not os.path.exists(shm)
  finally:
    for path in [tmp, shm]:
      if os.path.exists(path):
        os.remove(path)
  if box.enforcement()["unprivileged_user"] or box.enforcement()["read_only_filesystem"]:
    assert box.files(ws) == ["m.py", "pkg/util.py"] and box.read(ws, "m.py") == MODULE
    with open(os.path.join(root, "m.py")) as f:
      assert f.read() == MODULE
