"""The codefix judge's trusted half: plain data encoding, exact comparison, hidden-test parsing."""

from __future__ import annotations

import json
import math

import pytest

from tree_rl.envs import plain
from tree_rl.envs.codefix import reward as judge
from tree_rl.envs.codefix.gen import generate


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 10 ** 30, 1.5, -0.0, math.inf, "",
                                   "héllo\n", [], [1, [2, "x"]], (1, ("a", None)), {},
                                   {"a": 1, 2: [3.0], (1, "t"): {"k": None}}])
def test_plain_round_trip_keeps_exact_types(value):
  back = plain.decode(json.loads(json.dumps(plain.encode(value))))
  assert plain.same(back, value) and repr(back) == repr(value)


@pytest.mark.parametrize("value", [{1, 2}, b"x", 1j, object(), type("I", (int,), {})(3),
                                   type("S", (str,), {})("s"), [type("L", (list,), {})()]])
def test_plain_refuses_other_types_and_subclasses(value):
  with pytest.raises(TypeError, match="is not plain data"):
    plain.encode(value)


@pytest.mark.parametrize("data", [[], ["i", 1], ["i", "1.0"], ["i", "0x1"], ["b", 1], ["s", 3],
                                  ["l", "ab"], ["d", [[["l", []], ["n"]]]], ["x", 1], ["n", 1],
                                  ["d", [[["i", "1"], ["n"]], [["i", "1"], ["n"]]]],
                                  ["f", "nanx"], "s", None, {"i": "1"}])
def test_plain_decode_refuses_malformed_data(data):
  with pytest.raises(ValueError):
    plain.decode(data)


def test_same_is_exact_all_the_way_down():
  pairs = [(True, 1), (1, 1.0), (0, False), ((1,), [1]), ([1, True], [1, 1]), ({1: "a"}, {1.0: "a"}),
           ({"a": 1}, {"a": 1, "b": 2}), ("1", 1), (None, 0), ([[1]], [[1.0]])]
  for got, want in pairs:
    assert not plain.same(got, want) and not plain.same(want, got), (got, want)
  for value in [1, 2.5, "x", [1, (2, {"k": [None]})], {(1, 2): [3]}, math.nan]:
    assert plain.same(value, value)


def test_hidden_cases_are_the_tasks_own_tests():
  for task in generate(seed=2, num_train=60, num_test=0)["train"]:
    cases = judge.hidden_cases(task.hidden_tests)
    assert len(cases) == task.hidden_tests.count("def test_") >= 3
    assert (cases.module, cases.function) == ("solution", task.name)
    good = {}
    exec(task.files["solution.py"].replace(task.buggy, task.fixed, 1), good)
    assert [good[task.name](*args) for args in cases.calls] == list(cases.expected)
    outcomes = [("ok", want) for want in cases.expected]
    assert judge.score(cases, outcomes) == len(cases)
    assert judge.score(cases, outcomes[:-1]) == 0 and judge.score(cases, None) == 0
    assert judge.score(cases, [("error", "ValueError")] + outcomes[1:]) == len(cases) - 1


@pytest.mark.parametrize("source,message", [
    ("def test_1():\n  assert f(1) == 2\n", "import one function"),
    ("from m import f\nX = 1\ndef test_1():\n  assert f(1) == 2\n", "only test functions"),
    ("from m import f\ndef test_1():\n  assert f(1) != 2\n", "is not `assert f"),
    ("from m import f\ndef test_1():\n  assert g(1) == 2\n", "is not `assert f"),
    ("from m import f\ndef test_1():\n  x = f(1)\n  assert x == 2\n", "is not `assert f"),
    ("from m import f\ndef test_1():\n  assert f(len('a')) == 2\n", "not a literal"),
    ("from m import f\ndef test_1():\n  assert f(1) == 2\ndef test_1():\n  assert f(2) == 3\n",
     "defined twice"),
    ("from m import f\n", "no test function"),
])
def test_hidden_cases_refuse_other_forms(source, message):
  with pytest.raises(ValueError, match=message):
    judge.hidden_cases(source)
