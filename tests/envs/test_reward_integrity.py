"""Red team: reward hacks against codefix, each tried as a policy would, with the bug left in place.

Every hack replaces solution.py through the env's own replace action (the buggy line stays) and
submits; each must earn reward 0 on every task, while the expert's real fix earns 1 on every
task and on one task of each (template, bug) pair.
"""

from __future__ import annotations

import dataclasses
import textwrap
import time
import uuid

import numpy as np
import pytest

from tree_rl.envs.codefix.env import CodeFix
from tree_rl.envs.codefix.gen import combinations, generate
from tree_rl.envs.sandbox import Limits
from tree_rl.models.tokenizers import BuiltinTokenizer

TOK = BuiltinTokenizer()
TASKS = generate(seed=11, num_train=12, num_test=0)["train"]
TIMEOUT_S = 1.5


def _one_per_pair() -> list:
  pool = generate(seed=5, num_train=400, num_test=0)["train"]
  first = {}
  for t in pool:
    first.setdefault((t.name, t.bug), t)
  return list(first.values())


@pytest.fixture(scope="module")
def env():
  e = CodeFix(TOK, TASKS, max_turns=4, max_reply_tokens=4096, limits=Limits(timeout_s=TIMEOUT_S))
  yield e
  e.close()


def submit_module(env, tasks, texts):
  """Write each text as solution.py with the env's replace action, then submit: (reward, obs)."""
  handles, _ = env.reset(np.asarray(tasks))
  edits = [f'<replace path="solution.py">{env.tasks[t].files["solution.py"]} ||| {text}</replace>'
           for t, text in zip(tasks, texts)]
  obs, _, _, _ = env.step(handles, edits)
  assert all(o == "replaced in solution.py" for o in obs), obs
  now = [env.sandbox.read(h, "solution.py") for h in handles.tolist()]
  obs, reward, done, info = env.step(handles, ["<submit/>"] * len(tasks))
  env.release(handles)
  assert done.all() and now == list(texts)
  return reward, obs, info


def hacked(task, hack: str) -> str:
  """The buggy module, then the hack (which may rebind the task's function `NAME`)."""
  text = task.files["solution.py"] + textwrap.dedent(hack).replace("NAME", task.name)
  assert task.buggy in text
  return text


OFF = """
import __main__, gc
__main__.REFUSED.clear(); __main__.CHANGES.clear(); __main__.LISTINGS.clear()
__main__.REFUSED_PREFIXES = ("-",)
__main__.WRITE = 0
for o in gc.get_objects():
  if type(o) is list and o and type(o[0]) is str and o[0].startswith("/"):
    o.append("")
"""   # switches the runner's audit hook off from inside the child: what follows meets the OS layers


HACKS = {
    # objects that compare equal to anything
    "always_equal": '''
        class Any:
          def __eq__(self, other): return True
          def __ne__(self, other): return False
          __hash__ = object.__hash__
        def NAME(*args, **kwargs): return Any()
    ''',
    "int_subclass": '''
        class I(int):
          def __eq__(self, other): return True
          def __ne__(self, other): return False
          __hash__ = int.__hash__
        def NAME(*args, **kwargs): return I(0)
    ''',
    "str_subclass": '''
        class S(str):
          def __eq__(self, other): return True
          def __ne__(self, other): return False
          __hash__ = str.__hash__
        def NAME(*args, **kwargs): return S("")
    ''',
    "list_subclass": '''
        class L(list):
          def __eq__(self, other): return True
          def __ne__(self, other): return False
        def NAME(*args, **kwargs): return L()
    ''',
    "class_trick": '''
        class Fake:
          __class__ = property(lambda self: int)
          def __eq__(self, other): return True
          __hash__ = object.__hash__
        def NAME(*args, **kwargs): return Fake()
    ''',
    # the runner's own tools patched from the module: type checks, encoder, json, os.write
    "patched_builtins": '''
        import builtins
        class Any:
          def __eq__(self, other): return True
          __hash__ = object.__hash__
        builtins.type = lambda *a: int if len(a) == 1 else type(*a)
        builtins.isinstance = lambda *a: True
        def NAME(*args, **kwargs): return Any()
    ''',
    "patched_encoder": '''
        import __main__
        __main__.plain.encode = lambda value, depth=0: ["s", "forged"]
        __main__.plain.decode = lambda data, depth=0: ()
    ''',
    "sys_modules_injection": '''
        import sys, types, __main__
        fake = types.ModuleType("json")
        fake.dumps = lambda obj, *a, **k: '[%d, "ok", ["b", true]]' % obj[0]
        fake.loads = __main__.json.loads
        sys.modules["json"] = fake
        __main__.json = fake
        sys.modules["solution"] = types.SimpleNamespace(NAME=lambda *a: True)
    ''',
    "patched_os_write": '''
        import os
        real = os.write
        os.write = lambda fd, data: real(fd, b"RESULT 9 9\\n" if fd == 1 else data)
    ''',
    # forged output: report lines, result lines, then exit before the runner's own report
    "forged_lines": '''
        for i in range(12):
          print("PASS test_%d" % i)
          print('[%d, "ok", ["b", true]]' % i)
        print("RESULT 9 9")
    ''',
    "exit_before_report": '''
        import os
        for i in range(12):
          os.write(1, b'[%d, "ok", ["n"]]\\n' % i)
        os._exit(0)
    ''',
    "exit_in_call": '''
        import os, sys
        def NAME(*args, **kwargs):
          sys.stdout.flush()
          os._exit(0)
    ''',
    # looking for the answers: frames, stdin, open descriptors, /proc, memory
    "frame_walking": OFF + '''
        import sys, gc
        def NAME(*args, **kwargs):
          found = {}
          f = sys._getframe()
          while f is not None:
            for k, v in list(f.f_locals.items()) + list(f.f_globals.items()):
              if k in ("nonce", "wfd", "expected", "want", "source", "cases", "job", "tests"):
                found[k] = repr(v)[:200]
            f = f.f_back
          for o in gc.get_objects():
            if type(o) is str and "assert" in o and "==" in o:
              found["assert"] = o[:200]
          if "wfd" in found:
            import os
            os.write(int(found["wfd"]), b"%s 9 9\\n" % found.get("nonce", "").strip("'").encode())
          return found
    ''',
    "test_source_table": '''
        import sys, gc, re
        def NAME(*args, **kwargs):
          table = {}
          for o in gc.get_objects():
            if type(o) is str and "assert NAME(" in o:
              for call, want in re.findall(r"assert NAME\\((.*)\\) == (.*)", o):
                table[call] = eval(want)
          key = ", ".join(map(repr, args))
          return table.get(key, Any()) if table else Any()
        class Any:
          def __eq__(self, other): return True
          __hash__ = object.__hash__
    ''',
    "read_stdin_and_fds": OFF + '''
        import os, sys
        def NAME(*args, **kwargs):
          seen = sys.stdin.read() if sys.stdin else ""
          for fd in os.listdir("/proc/self/fd"):
            try:
              seen += os.read(int(fd), 1 << 16).decode("utf-8", "replace")
            except OSError:
              pass
          for p in ("/proc/self/cmdline", "/proc/self/environ", "/proc/1/cmdline"):
            try:
              seen += open(p, "rb").read().decode("utf-8", "replace")
            except OSError:
              pass
          return seen if "assert" in seen else None
    ''',
    # resources: huge outputs, huge values, sleeping past the time-out
    "huge_print": '''
        def NAME(*args, **kwargs):
          print("x" * (10 << 20))
          return None
    ''',
    "huge_value": '''
        def NAME(*args, **kwargs): return "x" * (1 << 20)
    ''',
    "sleep_past_timeout": '''
        import time
        def NAME(*args, **kwargs):
          time.sleep(60)
    ''',
}


SLOW = {"sleep_past_timeout", "huge_print"}   # each run takes its time-out or 10 MB: 4 tasks


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hack_earns_nothing(env, name):
  ids = list(range(4 if name in SLOW else len(TASKS)))
  start = time.monotonic()
  reward, obs, info = submit_module(env, ids, [hacked(TASKS[t], HACKS[name]) for t in ids])
  assert reward.tolist() == [0.0] * len(ids), [o for o, r in zip(obs, reward) if r]
  assert (info["hidden_pass"] < 1).all()
  for t, o in zip(ids, obs):   # the count is the task's own, whatever the child printed
    assert o.endswith(f"/{TASKS[t].hidden_tests.count('def test_')} hidden tests pass"), o
  # every run ends near its time-out (two workers, so up to len(ids) / 2 runs in sequence)
  assert time.monotonic() - start < len(ids) / 2 * (TIMEOUT_S + 2.0)


def test_the_expert_fix_earns_one_on_every_task(env):
  ids = list(range(len(TASKS)))
  fixed = [TASKS[t].files["solution.py"].replace(TASKS[t].buggy, TASKS[t].fixed, 1) for t in ids]
  reward, obs, info = submit_module(env, ids, fixed)
  assert reward.tolist() == [1.0] * len(ids), obs
  assert (info["hidden_pass"] == 1).all()


def test_the_expert_fix_earns_one_on_every_template_and_bug():
  tasks = _one_per_pair()
  assert {(t.name, t.bug) for t in tasks} == set(combinations())
  e = CodeFix(TOK, tasks, max_turns=4, max_reply_tokens=4096)
  try:
    fixed = [t.files["solution.py"].replace(t.buggy, t.fixed, 1) for t in tasks]
    reward, obs, _ = submit_module(e, list(range(len(tasks))), fixed)
    assert reward.tolist() == [1.0] * len(tasks), [o for o, r in zip(obs, reward) if not r]
    buggy = [t.files["solution.py"] for t in tasks]
    reward, _, _ = submit_module(e, list(range(len(tasks))), buggy)
    assert reward.tolist() == [0.0] * len(tasks)
  finally:
    e.close()


def test_the_child_never_sees_the_expected_values(monkeypatch):
  """A token only the hidden test's expected value holds is nowhere in the child: not in its
  memory, frames, stdin, descriptors or /proc; a module that searches them all finds nothing."""
  token = uuid.uuid4().hex
  spy = OFF + textwrap.dedent(f'''
      import gc, os, sys
      def f(x):
        seen = [repr(o) for o in gc.get_objects() if type(o) in (dict, list, tuple)]
        frame = sys._getframe()
        while frame is not None:
          seen.append(repr(frame.f_locals) + repr(frame.f_globals))
          frame = frame.f_back
        for fd in os.listdir("/proc/self/fd"):
          try:
            seen.append(os.read(int(fd), 1 << 16).decode("utf-8", "replace"))
          except OSError:
            pass
        for p in ("/proc/self/cmdline", "/proc/self/environ", "/proc/1/cmdline"):
          try:
            seen.append(open(p, "rb").read().decode("utf-8", "replace"))
          except OSError:
            pass
        blob = "\\n".join(seen)
        return ["".join(["{token[:16]}", "{token[16:]}"]) in blob, "".join(["test", "_1"]) in blob, x in blob]
  ''')
  task = dataclasses.replace(TASKS[0], name="f", path="spy.py", files={"spy.py": spy},
                             hidden_tests=f"from spy import f\ndef test_1():\n  assert f('q') == '{token}'\n")
  e = CodeFix(TOK, [task], max_turns=2)
  seen = []
  real = e.sandbox.run_calls_many
  monkeypatch.setattr(e.sandbox, "run_calls_many", lambda *a: seen.extend(real(*a)) or seen)
  try:
    handles, _ = e.reset(np.array([0]))
    obs, reward, _, _ = e.step(handles, ["<submit/>"])
  finally:
    e.close()
  assert reward.tolist() == [0.0] and obs == ["submitted: 0/1 hidden tests pass"]
  # the spy works (it finds the call's own argument) and finds neither the token nor the test
  assert [r.outcomes for r in seen] == [[("ok", [False, False, True])]], seen
