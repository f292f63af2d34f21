"""Codefix tasks: the generator's properties (checked by running the test sources in-process),
the TFDS builder round trip, and the scripted expert."""

from __future__ import annotations

import collections
import sys
import types

import numpy as np
import pytest

from tree_rl.envs.codefix.dataset import Codefix, CodefixConfig, load_codefix
from tree_rl.envs.codefix.expert import SUBMIT, CodefixExpert, intended_plan
from tree_rl.envs.codefix.gen import (BUG_KINDS, SOLUTION, TEMPLATES, VISIBLE, combinations,
                                      generate, task_key)


def run_tests(module: str, tests: str) -> dict[str, bool]:
  """{test name: passed} for `tests` run against `module` imported as a fresh `solution`."""
  solution = types.ModuleType("solution")
  saved = sys.modules.get("solution")
  sys.modules["solution"] = solution
  try:
    exec(compile(module, SOLUTION, "exec"), solution.__dict__)
    scope: dict = {}
    exec(compile(tests, "tests.py", "exec"), scope)
    out = {}
    for name, fn in scope.items():
      if name.startswith("test_") and callable(fn):
        try:
          fn()
          out[name] = True
        except Exception:
          out[name] = False
    return out
  finally:
    if saved is None:
      sys.modules.pop("solution", None)
    else:
      sys.modules["solution"] = saved


def fixed_module(task) -> str:
  return task.files[task.path].replace(task.buggy, task.fixed, 1)


def apply_replace(files: dict[str, str], action: str) -> dict[str, str]:
  """The workspace after a `<replace path="P">OLD ||| NEW</replace>` action (unchanged if OLD is absent)."""
  head, body = action.split(">", 1)
  path = head.split('"')[1]
  old, new = body[:-len("</replace>")].split(" ||| ")
  if old not in files[path]:
    return dict(files)
  return {**files, path: files[path].replace(old, new, 1)}


@pytest.fixture(scope="module")
def tasks():
  return generate(7, 600, 60)


def test_templates_cover_every_bug_kind():
  assert len(TEMPLATES) >= 12
  per_kind = collections.Counter(kind for _, kind in combinations())
  assert set(per_kind) == set(BUG_KINDS) and min(per_kind.values()) >= 3


def test_generated_tasks_are_valid(tasks):
  caught = 0
  everything = tasks["train"] + tasks["test"]
  for t in everything:
    module = t.files[t.path]
    assert t.path == SOLUTION and set(t.files) == {SOLUTION, VISIBLE} and t.bug in BUG_KINDS
    assert t.visible_tests == t.files[VISIBLE] and t.hidden_tests not in t.files.values()
    assert module.count(t.buggy) == 1 and "\n" not in t.buggy and t.buggy == t.buggy.strip()
    assert len(module) <= 220 and len(t.visible_tests) <= 260
    visible, hidden = run_tests(module, t.visible_tests), run_tests(module, t.hidden_tests)
    assert 2 <= len(visible) <= 3 and 3 <= len(hidden) <= 5
    assert not all(hidden.values()), t
    good = fixed_module(t)
    assert all(run_tests(good, t.visible_tests).values()) and all(run_tests(good, t.hidden_tests).values()), t
    hidden_asserts = {line for line in t.hidden_tests.splitlines() if "assert" in line}
    assert hidden_asserts - set(t.visible_tests.splitlines())
    caught += not all(visible.values())
  share = caught / len(everything)
  print(f"visible tests catch the bug in {share:.0%} of {len(everything)} tasks")
  assert share >= 0.5


def test_generation_is_deterministic_and_splits_are_disjoint(tasks):
  again = generate(7, 600, 60)
  assert again == tasks
  assert [t.task_id for t in tasks["train"]] == list(range(600))
  train, test = {task_key(t) for t in tasks["train"]}, {task_key(t) for t in tasks["test"]}
  assert len(train) == 600 and len(test) == 60 and not train & test
  assert generate(7, 20, 60)["test"] == tasks["test"]           # the test split ignores num_train
  assert generate(8, 20, 10)["test"] != tasks["test"][:10]
  seen = collections.Counter((t.name, t.bug) for t in tasks["train"])
  assert set(seen) == set(combinations())


def test_builder_round_trip(tmp_path):
  config = CodefixConfig(name="small", seed=3, num_train=50, num_test=10)
  Codefix(data_dir=str(tmp_path), config=config).download_and_prepare(file_format="array_record")
  assert "tensorflow" not in sys.modules
  ref = generate(3, 50, 10)
  for split in ("train", "test"):
    assert load_codefix(str(tmp_path), split, config="small") == ref[split]


def test_expert_noiseless_plan_fixes_the_module(tasks):
  expert = CodefixExpert(0.0)
  for t in tasks["test"]:
    plan = expert.plan(t, np.random.default_rng(0))
    assert [text for text, _ in plan] == intended_plan(t) and not any(noisy for _, noisy in plan)
    assert plan[0][0] == "<read>solution.py</read>" and plan[-1][0] == SUBMIT
    files = apply_replace(t.files, plan[2][0])
    assert files[SOLUTION] == fixed_module(t) and files[VISIBLE] == t.visible_tests


def test_expert_noise(tasks):
  eps = 0.2
  expert = CodefixExpert(eps)
  noisy = steps = failed = 0
  for i, t in enumerate(tasks["train"]):
    plan = expert.plan(t, np.random.default_rng(i))
    assert plan == expert.plan(t, np.random.default_rng(i))
    files = dict(t.files)
    for text, is_noise in plan:
      if text.startswith("<replace"):
        after = apply_replace(files, text)
        assert (after == files) == is_noise
        files = after
    noisy += sum(n for _, n in plan)
    steps += sum(not n for _, n in plan)
    if plan[-1] == (SUBMIT, True):
      failed += 1
      assert files[SOLUTION] == t.files[SOLUTION]             # submitted before the fix
    else:
      assert plan[-1] == (SUBMIT, False) and files[SOLUTION] == fixed_module(t)
  assert abs(noisy / steps - eps) < 0.05
  assert abs(failed / len(tasks["train"]) - eps / 4) < 0.03
