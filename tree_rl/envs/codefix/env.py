"""Code repair in a real workspace: read files, edit, run the visible tests, submit (a host env).

Each episode is a `gen.CodefixTask`: a tiny Python module with one injected
bug, its visible tests in the workspace and hidden tests kept outside it. The workspace is a
directory of a `tree_rl.envs.sandbox.Sandbox`; a branch of a rollout tree forks it (a hard-link
tree), so two branches never see each other's edits. One action per reply, the first found:

    <read>PATH</read>                       the file's text
    <replace path="PATH">OLD ||| NEW</replace>   OLD must occur exactly once
    <test/>                                 the visible tests' results
    <submit/>                               ends the episode: reward 1 when every hidden test passes

The reward is judged outside the agent's process (`reward`): a sandboxed child only
makes the hidden tests' calls and returns their values as plain data; the expected values, the
exact comparison and the count (the task's own number of hidden tests) stay in this process.
`<test/>` runs the visible test file with the friendlier test runner; it never feeds the reward.

A reply with no action, or a refused one (a path leaving the workspace, an oversized edit), gets
a one-line message as its observation and changes nothing.

Info scalars (`info_fields`, on device in the rollout tree): `visible_pass` (fraction of the
visible tests the workspace passes now; run after every edit, cached by file contents),
`hidden_pass` (at submit), `stage` (0 start, 1 read a file or ran the tests, 2 edited, 3 tested
after the last edit: the read -> edit -> test progress PATR's judge and the heuristic score),
`resolved`. A parsed action is one tool call (a reply without one is none); the situation key is
a hash of the task, the stage and the files' contents.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import re
from typing import Sequence

import numpy as np

from tree_rl.envs.codefix import reward as verdict
from tree_rl.envs.host import HostEnv
from tree_rl.envs.sandbox import Limits, Sandbox, SandboxError

ACTIONS = re.compile(r'<read>(?P<read>.*?)</read>|<replace path="(?P<path>[^"]*)">(?P<body>.*?)</replace>'
                     r'|(?P<test><test/>)|(?P<submit><submit/>)', re.S)
SEPARATOR = " ||| "
VISIBLE_CACHE = 4096   # file contents whose visible pass fraction is remembered
HELP = 'Use one of <read>PATH</read>, <replace path="PATH">OLD ||| NEW</replace>, <test/>, <submit/>.'


def parse(reply: str) -> tuple[str, tuple[str, ...]]:
  """The first action of a reply: (kind, arguments); kind '' when there is none."""
  m = ACTIONS.search(reply)
  if m is None:
    return "", ()
  if m.group("read") is not None:
    return "read", (m.group("read").strip(),)
  if m.group("path") is not None:
    old, sep, new = m.group("body").partition(SEPARATOR)
    return ("replace", (m.group("path"), old, new)) if sep else ("bad_replace", ())
  return ("test", ()) if m.group("test") else ("submit", ())


@dataclasses.dataclass
class _Episode:
  task: int
  stage: int = 0
  visible: float = 0.0
  hidden: float = 0.0
  done: bool = False


class CodeFix(HostEnv):
  """The code-repair env over `tasks` (a list of CodefixTask; task ids index it)."""

  name = "codefix"
  info_fields = ("visible_pass", "hidden_pass", "stage", "resolved")

  def __init__(self, tokenizer, tasks: Sequence, *, max_turns: int = 6, max_reply_tokens: int = 96,
               prompt_capacity: int = 160, obs_capacity: int = 320, scratch_dir: str = "",
               limits: Limits = Limits(), workers: int = 2, sandbox: Sandbox | None = None):
    super().__init__(tokenizer, max_turns)
    self.tasks = list(tasks)
    self.max_reply_tokens = int(max_reply_tokens)
    self.prompt_capacity, self.obs_capacity = int(prompt_capacity), int(obs_capacity)
    self._sandbox, self._sandbox_args = sandbox, (scratch_dir or None, limits, workers)
    self.episodes: dict[int, _Episode] = {}
    self._cases: dict[int, verdict.Cases] = {}   # task id -> its hidden tests, parsed once
    # (task, file digest) -> visible pass fraction, for the last VISIBLE_CACHE contents measured
    self._visible: collections.OrderedDict[tuple[int, str], float] = collections.OrderedDict()

  @property
  def sandbox(self) -> Sandbox:
    """The workspaces' sandbox, made at the first episode (building the env touches no disk)."""
    if self._sandbox is None:
      self._sandbox = Sandbox(*self._sandbox_args)
    return self._sandbox

  @property
  def num_tasks(self) -> int:
    return len(self.tasks)

  def prompt(self, task) -> str:
    names = ", ".join(sorted(task.files))
    return f"Fix the bug in {task.path} so that its tests pass. Files: {names}. {HELP}"

  # ------------------------------------------------------------------ the host protocol
  def reset(self, tasks):
    handles, texts = [], []
    for t in np.asarray(tasks).tolist():
      if not 0 <= t < len(self.tasks):
        raise ValueError(f"codefix task id {t} is outside the task set's {len(self.tasks)} tasks")
      h = self.sandbox.create(self.tasks[t].files)
      self.episodes[h] = _Episode(t)
      handles.append(h)
      texts.append(self.prompt(self.tasks[t]))
    return np.asarray(handles, np.int64), texts

  def fork(self, handles, counts):
    out = []
    try:
      for h, c in zip(np.asarray(handles).tolist(), np.asarray(counts).tolist()):
        for _ in range(int(c)):
          child = self.sandbox.fork(h)
          self.episodes[child] = dataclasses.replace(self.episodes[h])
          out.append(child)
    except BaseException:   # the copies made so far never reach the caller
      self.release(out)
      raise
    return np.asarray(out, np.int64)

  def start_keys(self, handles):
    return np.array([self._key(h) for h in np.asarray(handles).tolist()], np.int32)

  def action_key(self, reply: str) -> str:
    return repr(parse(reply))

  def release(self, handles):
    for h in np.asarray(handles).tolist():
      self.sandbox.release(h)
      del self.episodes[h]

  def close(self) -> None:
    self.episodes.clear()
    if self._sandbox is not None:
      self._sandbox.close()

  def step(self, handles, actions):
    handles = np.asarray(handles).tolist()
    obs, reward = [""] * len(handles), np.zeros((len(handles),), np.float32)
    runs = []   # (row, kind) of the rows whose tests run, all in one pool call
    calls = np.zeros((len(handles),), np.int32)
    for i, (h, reply) in enumerate(zip(handles, actions)):
      ep = self.episodes[h]
      kind, args = parse(reply)
      calls[i] = kind in ("read", "replace", "test", "submit")
      try:
        if kind == "read":
          obs[i] = self.sandbox.read(h, args[0])
          ep.stage = max(ep.stage, 1)
        elif kind == "replace":
          self.sandbox.replace(h, *args)
          ep.stage = 2
          runs.append((i, "visible"))
          obs[i] = f"replaced in {args[0]}"
        elif kind == "test":
          runs.append((i, "test"))
        elif kind == "submit":
          runs.append((i, "submit"))
        elif kind == "bad_replace":
          obs[i] = f"refused: a replace needs OLD{SEPARATOR}NEW. {HELP}"
        else:
          obs[i] = f"no action found. {HELP}"
      except SandboxError as e:
        obs[i] = str(e)
    self._run(handles, runs, obs, reward)
    eps = [self.episodes[h] for h in handles]
    info = {"visible_pass": np.array([e.visible for e in eps], np.float32),
            "hidden_pass": np.array([e.hidden for e in eps], np.float32),
            "stage": np.array([e.stage for e in eps], np.float32),
            "resolved": reward.copy(), "tool_calls": calls,
            "state_key": np.array([self._key(h) for h in handles], np.int64)}
    return obs, reward, np.array([e.done for e in eps]), info

  # ------------------------------------------------------------------ tests
  def _digest(self, h: int) -> str:
    task = self.tasks[self.episodes[h].task]
    text = "\0".join(self.sandbox.read(h, p) for p in sorted(task.files))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()

  def _key(self, h: int) -> int:
    ep = self.episodes[h]
    return int(hashlib.sha1(f"{ep.task}:{ep.stage}:{self._digest(h)}".encode()).hexdigest()[:7], 16)

  def hidden_cases(self, task: int) -> verdict.Cases:
    """A task's hidden tests as calls and expected values (parsed once; ValueError if malformed)."""
    if task not in self._cases:
      try:
        self._cases[task] = verdict.hidden_cases(self.tasks[task].hidden_tests)
      except (ValueError, SyntaxError) as e:
        raise ValueError(f"codefix task {task}: {e}") from None
    return self._cases[task]

  def _run(self, handles, runs, obs, reward) -> None:
    """Run the tests the rows asked for (visible after an edit or on <test/>, hidden at submit)."""
    jobs, submits = [], []
    for i, kind in runs:
      ep = self.episodes[handles[i]]
      if kind == "submit":
        submits.append((i, self.hidden_cases(ep.task)))
        continue
      key = (ep.task, self._digest(handles[i]))
      if kind == "visible" and key in self._visible:
        ep.visible = self._visible[key]
        self._visible.move_to_end(key)
        continue
      jobs.append((i, kind, key, self.tasks[ep.task].visible_tests))
    judged = self.sandbox.run_calls_many(
        [handles[i] for i, _ in submits], [c.module for _, c in submits],
        [c.function for _, c in submits], [c.calls for _, c in submits])
    for (i, cases), run in zip(submits, judged):
      ep = self.episodes[handles[i]]
      passed = verdict.score(cases, run.outcomes)
      ep.hidden, ep.done = passed / len(cases), True
      reward[i] = float(passed == len(cases))
      obs[i] = f"submitted: {passed}/{len(cases)} hidden tests pass"
    results = self.sandbox.run_tests_many([handles[i] for i, *_ in jobs], [s for *_, s in jobs])
    for (i, kind, key, _), res in zip(jobs, results):
      ep = self.episodes[handles[i]]
      ep.visible = res.fraction
      if res.total > 0 and not res.timed_out:   # a crash or a busy machine is not a measurement
        self._visible[key] = res.fraction
        while len(self._visible) > VISIBLE_CACHE:
          self._visible.popitem(last=False)
      if kind == "test":
        ep.stage = 3 if ep.stage >= 2 else max(ep.stage, 1)
        obs[i] = res.output


# token capacities per preset: `default` fits a module of ~220 characters (byte-level builtin
# tokenizer) in one observation and the task statement in the prompt
PRESETS = {"default": dict(prompt_capacity=224, obs_capacity=256)}


def make_codefix(tokenizer=None, *, max_turns: int, max_reply_tokens: int, tasks: Sequence = (),
                 preset: str = "default", scratch_dir: str = "", **kwargs) -> CodeFix:
  """The registered factory (`config.env`: preset, scratch_dir; the task list from the task set)."""
  if preset not in PRESETS:
    raise ValueError(f"config.env.preset={preset!r} for codefix; known: {sorted(PRESETS)}")
  return CodeFix(tokenizer, tasks, max_turns=max_turns, max_reply_tokens=max_reply_tokens,
                 scratch_dir=scratch_dir, **(PRESETS[preset] | kwargs))
