"""Code-repair expert: read the module, run the tests, replace the buggy line, test, submit.

    expert = CodefixExpert(epsilon=0.1)
    for text, noisy in expert.plan(task, np.random.default_rng(0)):
      ...                                  # one action per reply, in the env's syntax

Before each step of the intended plan, with probability `epsilon`, a noisy action comes first
that leaves the workspace as it is: reading test_visible.py, a replace whose OLD text does not
occur (the buggy line, mistyped), or an extra `<test/>`; the intended steps still follow, so
the episode succeeds. With probability `epsilon / 4` per episode the noise is a premature
`<submit/>` before one of the first three steps (the module is still buggy there): the plan
ends with it, a failed episode. Host side, pure Python.
"""

from __future__ import annotations

import numpy as np

from tree_rl.envs.codefix.gen import VISIBLE, CodefixTask

SEPARATOR = " ||| "
SUBMIT = "<submit/>"
TEST = "<test/>"


def read(path: str) -> str:
  return f"<read>{path}</read>"


def replace(path: str, old: str, new: str) -> str:
  return f'<replace path="{path}">{old}{SEPARATOR}{new}</replace>'


def intended_plan(task: CodefixTask) -> list[str]:
  """The noiseless actions: read, test, fix, test, submit."""
  return [read(task.path), TEST, replace(task.path, task.buggy, task.fixed), TEST, SUBMIT]


def missing_text(task: CodefixTask) -> str:
  """The buggy line mistyped: text found neither in the buggy nor in the fixed module."""
  module = task.files[task.path]
  fixed = module.replace(task.buggy, task.fixed, 1)
  for old in (task.buggy.replace(" ", "  ", 1), task.buggy + "  #", "  # " + task.buggy):
    if old not in module and old not in fixed:
      return old
  raise ValueError(f"task {task.task_id}: no mistyped copy of the buggy line is absent from the module")


class CodefixExpert:
  """`plan(task, rng)` -> [(action text, noisy)]; premature submits happen before the fix."""

  def __init__(self, epsilon: float):
    if not 0.0 <= float(epsilon) <= 1.0:
      raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    self.epsilon = float(epsilon)

  intended_plan = staticmethod(intended_plan)

  def plan(self, task: CodefixTask, rng: np.random.Generator) -> list[tuple[str, bool]]:
    steps = intended_plan(task)
    early = int(rng.integers(3)) if rng.random() < self.epsilon / 4 else -1
    noise = (read(VISIBLE), replace(task.path, missing_text(task), task.fixed), TEST)
    out: list[tuple[str, bool]] = []
    for i, step in enumerate(steps):
      if i == early:
        out.append((SUBMIT, True))
        return out
      if rng.random() < self.epsilon:
        out.append((noise[int(rng.integers(len(noise)))], True))
      out.append((step, False))
    return out


def for_env(env, epsilon: float) -> CodefixExpert:
  """The registered warm-start expert (read, test, fix, test, submit; `epsilon` noise)."""
  del env
  return CodefixExpert(epsilon)
