r"""Host environment costs: forking a workspace against replaying its actions, and env steps/s.

    python -m experiments.bench_sandbox                      # 2-core CPU defaults
    python -m experiments.bench_sandbox --episodes=64 --workers=2 --json_out=/tmp/bench_sandbox.json

fork: a codefix workspace padded to `--files` files (the task's two plus filler modules of about
1 KB) is forked `--forks` times; ms per fork and the bytes it adds on disk (new inodes' data plus
directory entries). The stateless alternative rebuilds a branch's workspace from the task by
replaying its action prefix (read / replace / test in the expert's proportions) at depths 2, 5
and 10: `replay_all` replays every action (a stateless env cannot tell which ones changed
state), `replay_edits` only the edits (its lower bound). steps: `--episodes` episodes stepped
in one batch through the expert's plans (read, test, replace + visible run, test, submit: the
sandbox runs every test in a subprocess, over `--workers` threads); env steps/s over the batch.
The last JSON line carries `fork_ms`, `replay_ms` (per depth), `steps_per_s` and the goals.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time

from absl import app, flags
import numpy as np

from tree_rl.envs.codefix.env import CodeFix
from tree_rl.envs.codefix.expert import intended_plan
from tree_rl.envs.codefix.gen import generate
from tree_rl.envs.sandbox import Limits, Sandbox
from tree_rl.models.tokenizers import BuiltinTokenizer

_FILES = flags.DEFINE_integer("files", 20, "files per workspace in the fork benchmark")
_FORKS = flags.DEFINE_integer("forks", 200, "forks timed")
_DEPTHS = flags.DEFINE_list("depths", ["2", "5", "10"], "replay depths")
_EPISODES = flags.DEFINE_integer("episodes", 64, "episodes stepped together")
_WORKERS = flags.DEFINE_integer("workers", 2, "sandbox test workers")
_JSON = flags.DEFINE_string("json_out", "", "also write the results here")


def _disk_bytes(root: str, seen: set) -> int:
  """Bytes of the files under `root` whose inode is not in `seen` (hard links add none), plus
  directory sizes."""
  total = 0
  for d, _, names in os.walk(root):
    total += os.stat(d).st_size
    for n in names:
      st = os.lstat(os.path.join(d, n))
      if st.st_ino not in seen:
        total += st.st_size
  return total


def _inodes(root: str) -> set:
  return {os.lstat(os.path.join(d, n)).st_ino for d, _, ns in os.walk(root) for n in ns}


def _workspace(task, files: int) -> dict:
  out = dict(task.files)
  for i in range(files - len(out)):
    body = "".join(f"def helper_{i}_{k}(x):\n    return x * {k} + {i}\n\n" for k in range(24))
    out[f"lib/module_{i}.py"] = body
  return out


def _actions(task, depth: int) -> list[str]:
  """`depth` actions in the expert's mix, cycling read, test, replace (a no-op edit), test."""
  edit = f'<replace path="{task.path}">{task.buggy} ||| {task.buggy}</replace>'
  cycle = [f"<read>{task.path}</read>", "<test/>", edit, "<test/>"]
  return [cycle[i % len(cycle)] for i in range(depth)]


def bench_fork(task, tok) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    box = Sandbox(os.path.join(tmp, "ws"), Limits(), workers=1)
    env = CodeFix(tok, [dataclasses.replace(task, files=_workspace(task, _FILES.value))], sandbox=box)
    (root,), _ = env.reset(np.array([0]))
    seen = _inodes(box.path(root))
    times, sizes = [], []
    for _ in range(_FORKS.value):
      t0 = time.perf_counter()
      (child,) = env.fork(np.array([root]), np.array([1]))
      times.append(time.perf_counter() - t0)
      sizes.append(_disk_bytes(box.path(child), seen))
      env.release(np.array([child]))
    replay = {}
    for depth in map(int, _DEPTHS.value):
      acts = _actions(task, depth)
      out = {}
      for mode in ("replay_all", "replay_edits"):
        keep = acts if mode == "replay_all" else [a for a in acts if a.startswith("<replace")]
        runs = []
        for _ in range(5):
          t0 = time.perf_counter()
          (h,), _ = env.reset(np.array([0]))
          for a in keep:
            env.step(np.array([h]), [a])
          runs.append(time.perf_counter() - t0)
          env.release(np.array([h]))
        out[mode] = 1e3 * statistics.median(runs)
      replay[depth] = out
    env.close()
  return dict(fork_ms=1e3 * statistics.median(times), fork_bytes=int(statistics.median(sizes)),
              replay_ms=replay)


def bench_steps(tasks, tok) -> dict:
  env = CodeFix(tok, tasks, max_turns=6, workers=_WORKERS.value)
  n = _EPISODES.value
  ids = np.arange(n) % len(tasks)
  handles, _ = env.reset(ids)
  plans = [intended_plan(tasks[i]) for i in ids]
  t0 = time.perf_counter()
  steps = 0
  resolved = 0.0
  for turn in range(5):
    _, reward, _, _ = env.step(handles, [p[turn] for p in plans])
    steps += n
    resolved = float(reward.mean())
  seconds = time.perf_counter() - t0
  enforced = env.sandbox.enforcement()
  env.release(handles)
  env.close()
  return dict(steps=steps, seconds=seconds, steps_per_s=steps / seconds, resolved=resolved,
              enforcement=enforced)


def main(_):
  tok = BuiltinTokenizer()
  tasks = generate(seed=0, num_train=max(_EPISODES.value, 8), num_test=1)["train"]
  fork = bench_fork(tasks[0], tok)
  steps = bench_steps(tasks, tok)
  d5 = fork["replay_ms"].get(5, {}).get("replay_all")
  result = dict(
      device=f"{platform.processor() or platform.machine()} x{os.cpu_count()}", python=platform.python_version(),
      files=_FILES.value, **fork, **steps, workers=_WORKERS.value,
      fork_vs_replay5=None if d5 is None else d5 / fork["fork_ms"],
      goal_fork_10x_cheaper=None if d5 is None else d5 >= 10 * fork["fork_ms"],
      goal_50_steps_per_s=steps["steps_per_s"] >= 50)
  print(f"{'measure':<28}{'value':>14}")
  print(f"{'fork ms / bytes':<28}{fork['fork_ms']:>9.2f} / {fork['fork_bytes']}")
  for depth, r in fork["replay_ms"].items():
    print(f"{'replay d=' + str(depth) + ' all / edits ms':<28}{r['replay_all']:>9.2f} / {r['replay_edits']:.2f}")
  print(f"{'env steps/s':<28}{steps['steps_per_s']:>14.1f}")
  line = json.dumps(result)
  print(line)
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      f.write(line + "\n")


if __name__ == "__main__":
  app.run(main)
