"""The sandbox's child program, imported: its command line, output helpers, import-path remap,
rlimits, audit-hook policy, the root half's verdicts, and one run of the file by path."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import types

import pytest

from tree_rl.envs import plain
from tree_rl.envs import sandbox as sb
from tree_rl.envs import sandbox_runner as runner

ARGS = runner.Args("calls", "/srv/w 1", 2.5, 5, 512 << 20, 1 << 20, 32, 65534, 65534, 0x60020000,
                   True, False, "/dev/shm", 8 << 20, ["/usr/lib/python3.11", "/usr/lib/dyn"])


def exited(status):
  return types.SimpleNamespace(si_code=os.CLD_EXITED, si_status=status)


def killed(sig):
  return types.SimpleNamespace(si_code=os.CLD_KILLED, si_status=sig)


# -- command line --

def test_argv_round_trip():
  words = runner.to_argv(ARGS)
  assert all(type(w) is str for w in words)
  assert words[:3] == ["calls", "/srv/w 1", "2.5"] and words[10:12] == ["1", "0"]
  assert words[-2:] == ARGS.libdirs
  assert runner.parse(words) == ARGS
  no_dirs = ARGS._replace(mode="tests", scratch="", libdirs=[], timeout=0.1)
  assert runner.parse(runner.to_argv(no_dirs)) == no_dirs


@pytest.mark.parametrize("words", [[], ["tests"], ["run"] + runner.to_argv(ARGS)[1:]])
def test_parse_refuses_short_or_unknown(words):
  with pytest.raises(ValueError, match="usage"):
    runner.parse(words)


def test_parse_refuses_bad_numbers():
  words = runner.to_argv(ARGS)
  words[3] = "five"
  with pytest.raises(ValueError):
    runner.parse(words)


# -- output helpers --

def test_one_line():
  assert runner.one_line(ValueError("a\nb\r\nc")) == "a b c"
  assert runner.one_line(KeyError("k")) == "'k'"

  class Unprintable(Exception):
    def __str__(self):
      raise RuntimeError("no")

  assert runner.one_line(Unprintable()) == "<unprintable>"


def test_signal_name():
  assert runner.signal_name(9) == "SIGKILL"
  assert runner.signal_name(11) == "SIGSEGV"
  assert runner.signal_name(200) == "signal 200"


# -- the tests' set-up --

def test_remapped():
  remap = [("/usr/lib/python3.11", "/dev/shm/.python/0"), ("/usr/lib/dyn", "/dev/shm/.python/1")]
  assert runner.remapped("/usr/lib/python3.11", remap) == "/dev/shm/.python/0"
  assert runner.remapped("/usr/lib/python3.11/json", remap) == "/dev/shm/.python/0/json"
  assert runner.remapped("/usr/lib/dyn/x.so", remap) == "/dev/shm/.python/1/x.so"
  assert runner.remapped("/usr/lib/python3.11x", remap) == "/usr/lib/python3.11x"
  assert runner.remapped("/ws", remap) == "/ws" and runner.remapped("/ws", []) == "/ws"


def test_rlimits():
  limits = dict(runner.rlimits(ARGS))
  assert limits == {resource.RLIMIT_CPU: (5, 6), resource.RLIMIT_AS: (512 << 20,) * 2,
                    resource.RLIMIT_FSIZE: (1 << 20,) * 2, resource.RLIMIT_CORE: (0, 0),
                    resource.RLIMIT_NPROC: (32, 32)}
  assert resource.RLIMIT_NPROC not in dict(runner.rlimits(ARGS._replace(nproc=-1)))


@pytest.fixture
def hook(tmp_path):
  """The audit hook for a workspace and a stdlib dir under tmp_path, called directly."""
  for d in ("ws", "ws2", "lib", "other"):
    (tmp_path / d).mkdir()
    (tmp_path / d / "f.py").write_text("")
  (tmp_path / "ws" / "out").symlink_to(tmp_path / "other" / "f.py")
  return runner.audit_hook([str(tmp_path / "ws"), str(tmp_path / "lib")]), tmp_path


def refused(hook, event, *args):
  try:
    hook(event, args)
  except PermissionError as e:
    assert str(e).startswith("sandbox: "), e
    return str(e)
  return None


def test_audit_hook_reads_only_inside(hook):
  hook, root = hook
  assert refused(hook, "open", str(root / "ws" / "f.py"), "r", os.O_RDONLY) is None
  assert refused(hook, "open", str(root / "lib" / "f.py").encode(), "rb", 0) is None
  assert refused(hook, "open", 3, "r", 0) is None   # a descriptor already open
  for outside in [root / "other" / "f.py", root / "ws2" / "f.py", root / "ws" / "out", "/etc"]:
    assert "outside the workspace" in refused(hook, "open", str(outside), "r", 0)


def test_audit_hook_refuses_writes_and_changes(hook):
  hook, root = hook
  inside = str(root / "ws" / "f.py")
  for mode, flags in [("w", 0), ("a", 0), ("r+", 0), (None, os.O_WRONLY | os.O_CREAT), ("r", 0o2)]:
    assert "for writing refused" in refused(hook, "open", inside, mode, flags)
  for event in ["os.remove", "os.rename", "shutil.rmtree", "os.chmod"]:
    assert refused(hook, event, inside) == f"sandbox: {event} refused"


def test_audit_hook_refuses_processes_sockets_and_ctypes(hook):
  hook, _ = hook
  for event in sorted(runner.REFUSED) + ["os.execv", "os.spawnv", "os.execve"]:
    assert refused(hook, event) == f"sandbox: {event} refused"
  assert refused(hook, "import", "json", None, [], [], []) is None
  assert refused(hook, "os.getcwd") is None


def test_audit_hook_lists_only_inside(hook):
  hook, root = hook
  assert refused(hook, "os.listdir", str(root / "ws")) is None
  assert refused(hook, "os.scandir", 5) is None
  assert "refused" in refused(hook, "os.listdir", str(root / "other"))
  assert "refused" in refused(hook, "glob.glob", "/")


# -- the root half's verdicts --

def test_calls_status():
  assert runner.calls_status(exited(0), False) == runner.CALLS_OK
  assert runner.calls_status(exited(runner.XCPU_EXIT), False) == runner.CALLS_CPU
  assert runner.calls_status(exited(1), False) == runner.CALLS_EXIT
  assert runner.calls_status(exited(runner.SETUP_FAILED), False) == runner.CALLS_EXIT
  assert runner.calls_status(killed(9), False) == runner.CALLS_KILLED
  assert runner.calls_status(killed(9), True) == runner.CALLS_TIMEOUT


def test_tests_report_counts_only_a_line_with_the_nonce():
  def report(data, info=exited(0), timed_out=False):
    return runner.tests_report(data, "ab12", info, timed_out, 5.0, 3)

  assert report(b"ab12 2 3\n") == (["RESULT 2 3"], 0)
  assert report(b"ab12 2 3\nab12 9 9\n") == (["RESULT 2 3"], 0)   # the first line only
  gone = "sandbox: the test process exited with status 0 before reporting"
  for forged in [b"", b"ffff 9 9\n", b"ab12 9\n", b"ab12 x 9\n", b"ab12 -1 9\n", b"ab12 9 9 9\n"]:
    assert report(forged) == ([gone, "RESULT 0 0"], 0), forged
  assert report(b"", exited(runner.XCPU_EXIT)) == (
      ["sandbox: the tests ran past the CPU limit of 3 s", "RESULT 0 0"], 0)
  assert report(b"", killed(11)) == (
      ["sandbox: the test process was killed by SIGSEGV", "RESULT 0 0"], 0)
  assert report(b"", killed(9), True) == (
      ["sandbox: timed out after 5 s; the test processes were killed", "RESULT 0 0"],
      runner.TIMED_OUT)


def test_wait_exit_leaves_the_child_unreaped():
  proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
  info, timed_out = runner.wait_exit(proc.pid, 30.0)
  assert not timed_out and (info.si_code, info.si_status) == (os.CLD_EXITED, 3)
  assert proc.wait() == 3   # still there to reap


def test_wait_exit_kills_at_the_time_out():
  proc = subprocess.Popen(["sleep", "60"])
  info, timed_out = runner.wait_exit(proc.pid, 0.2)
  assert timed_out and (info.si_code, info.si_status) == (os.CLD_KILLED, 9)
  assert proc.wait() == -9


# -- the file itself --

def test_plain_is_read_from_beside_the_runner():
  assert runner.plain is not plain and "plain" not in sys.modules
  assert runner.plain.__file__ == os.path.abspath(plain.__file__)
  value = {"a": [1, 2.5, (None, True)]}
  assert runner.plain.encode(value) == plain.encode(value)


def test_runs_by_path_with_the_standard_library_alone(tmp_path):
  """One tests run without namespaces or a uid drop: the file runs by path under the sandbox's
  flags, and the code it runs cannot import the package."""
  args = runner.Args("tests", str(tmp_path), 10.0, 10, 1 << 30, 1 << 20, -1, -1, -1, 0, False,
                     False, "", 0, [])
  source = ("import sys\n"
            "def test_path():\n  assert not any('tree_rl' in p for p in sys.path), sys.path\n"
            "def test_import():\n  import tree_rl\n")
  out = subprocess.run([sys.executable, *sb._PYTHON_FLAGS, sb._RUNNER, *runner.to_argv(args)],
                       input=source.encode(), capture_output=True, cwd=tmp_path, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"})
  lines = out.stdout.decode().splitlines()
  assert out.returncode == 0 and lines[0] == "PASS test_path", out
  assert lines[1].startswith("FAIL test_import: ModuleNotFoundError") and lines[-1] == "RESULT 1 2"


def test_bad_command_line_exits_with_usage(tmp_path):
  out = subprocess.run([sys.executable, *sb._PYTHON_FLAGS, sb._RUNNER, "tests"],
                       capture_output=True, cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL)
  assert out.returncode == 1 and b"usage: runner mode ws timeout" in out.stderr
