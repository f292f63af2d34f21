"""Code-repair tasks: a tiny Python module with one injected bug, visible tests, hidden tests.

    tasks = generate(seed=42, num_train=2000, num_test=100)    # {"train": [...], "test": [...]}
    task = tasks["test"][0]
    task.files["solution.py"].replace(task.buggy, task.fixed, 1)   # the correct module

Each template below writes one small function with randomized surface details (parameter
names, constants, literals) and lists, per bug kind it supports, the lines that can go wrong
(correct line, buggy line). A task takes one (template, bug) pair, swaps one line, and draws
test inputs from the template's ordinary and edge cases; expected values come from running the
correct function, and every case is labelled by whether the buggy one gets it wrong. Hidden
tests always hold a case the buggy module fails and one the visible tests do not cover (an
edge case where the template has them). Visible tests are drawn to catch the bug with
probability VISIBLE_CATCH (and whenever too few cases pass on the buggy module), about 90% of
tasks at the defaults; in the rest they pass on the buggy module and only reading finds it.

Splits hold out instances, not combinations: every (template, bug) pair appears in both, and
no test task equals a train task (key: solution.py + hidden tests). The test split is drawn
first from its own stream, so it does not depend on `num_train`. Pure Python, no TFDS.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import random
from typing import Callable

BUG_KINDS = ("off_by_one", "wrong_operator", "swapped_args", "wrong_constant", "missing_edge_case")
SOLUTION = "solution.py"
VISIBLE = "test_visible.py"
MAX_ASSERT = 56          # longest `assert f(...) == ...` line a test holds
MAX_SOLUTION = 220       # characters of solution.py
MAX_VISIBLE = 260        # characters of test_visible.py
VISIBLE_CATCH = 0.8      # share of tasks whose visible tests are chosen to fail on the bug

_WORDS = ("a", "an", "ox", "cat", "sky", "sun", "tree", "rain", "moon", "idea", "bird",
          "apple", "stone", "ocean", "queue", "echo", "road")
_SHORT = ("a", "an", "ox", "cat", "dog", "sun", "sky", "red")
_LIST = ("xs", "nums", "vals", "items", "data", "arr", "lst")
_TEXT = ("s", "text", "word", "line", "msg", "src")
_TOKEN = ("w", "tok", "piece", "term")
_INDEX = ("i", "j", "idx", "pos")
_BOUNDS = (("lo", "hi"), ("low", "high"), ("a", "b"), ("mn", "mx"), ("lower", "upper"))


@dataclasses.dataclass(frozen=True)
class CodefixTask:
  task_id: int
  name: str                 # template / function name
  bug: str                  # one of BUG_KINDS
  path: str                 # the file holding the bug
  files: dict[str, str]     # the workspace: solution.py (buggy) and test_visible.py
  visible_tests: str        # == files["test_visible.py"]
  hidden_tests: str         # run by the reward; never in the workspace
  buggy: str                # one line of files[path] (no indentation), occurring exactly once
  fixed: str                # its correction


@dataclasses.dataclass(frozen=True)
class _Spec:
  source: str                                    # the correct module
  bugs: dict[str, list[tuple[str, str]]]         # kind -> [(correct line, buggy line)]
  cases: list[tuple]                             # ordinary argument tuples
  edges: list[tuple]                             # edge-case argument tuples


TEMPLATES: dict[str, tuple[tuple[str, ...], Callable[[random.Random], _Spec]]] = {}


def _template(name: str, *kinds: str):
  def add(make):
    TEMPLATES[name] = (kinds, make)
    return make
  return add


def _src(*lines: str) -> str:
  return "\n".join(lines) + "\n"


def _ints(r: random.Random, lo: int, hi: int, n: int) -> list[int]:
  return [r.randint(lo, hi) for _ in range(n)]


def _word(r: random.Random, lo: int, hi: int, letters: str = "abcdefghijklmnoprstuw") -> str:
  return "".join(r.choice(letters) for _ in range(r.randint(lo, hi)))


@_template("clamp", "off_by_one", "wrong_operator")
def _clamp(r):
  v, (lo, hi) = r.choice(("x", "v", "n", "value", "val")), r.choice(_BOUNDS)
  src = _src(f"def clamp({v}, {lo}, {hi}):", f"  if {v} < {lo}:", f"    return {lo}",
             f"  if {v} > {hi}:", f"    return {hi}", f"  return {v}")
  cases, edges = [], []
  for _ in range(4):
    a = r.randint(-9, 9)
    b = a + r.randint(3, 12)
    cases += [(a - r.randint(1, 6), a, b), (r.randint(a + 1, b - 1), a, b), (b + r.randint(2, 9), a, b)]
    edges += [(r.choice((a, b)), a, b), (r.choice((a - 1, b + 1)), a, b)]
  return _Spec(src, {"off_by_one": [(f"if {v} > {hi}:", f"if {v} > {hi} + 1:"),
                                    (f"if {v} < {lo}:", f"if {v} < {lo} - 1:")],
                     "wrong_operator": [(f"if {v} > {hi}:", f"if {v} < {hi}:"),
                                        (f"if {v} < {lo}:", f"if {v} > {lo}:")]}, cases, edges)


@_template("count_vowels", "wrong_constant", "missing_edge_case")
def _count_vowels(r):
  s, n, c = r.choice(_TEXT), r.choice(("n", "count", "total", "hits")), r.choice(("c", "ch", "letter"))
  drop = r.choice("aeiou")
  src = _src(f"def count_vowels({s}):", f"  {n} = 0", f"  for {c} in {s}.lower():",
             f'    if {c} in "aeiou":', f"      {n} += 1", f"  return {n}")
  cases = [(r.choice(_WORDS) + r.choice(("", " " + r.choice(_WORDS))),) for _ in range(8)]
  edges = [("",), (r.choice(_WORDS[5:]).upper(),), (r.choice(_WORDS[5:]).capitalize(),)]
  fewer = "aeiou".replace(drop, "")
  return _Spec(src, {"wrong_constant": [(f'if {c} in "aeiou":', f'if {c} in "{fewer}":')],
                     "missing_edge_case": [(f"for {c} in {s}.lower():", f"for {c} in {s}:")]},
               cases, edges)


@_template("running_sum", "off_by_one", "wrong_operator", "wrong_constant")
def _running_sum(r):
  xs, out = r.choice(_LIST), r.choice(("out", "res", "acc", "result"))
  t = r.choice(("t", "s", "total", "run"))
  src = _src(f"def running_sum({xs}):", f"  {out}, {t} = [], 0", f"  for x in {xs}:",
             f"    {t} += x", f"    {out}.append({t})", f"  return {out}")
  cases = [(_ints(r, -3, 9, r.randint(2, 4)),) for _ in range(8)]
  edges = [([],), ([r.randint(1, 9)],)]
  return _Spec(src, {"off_by_one": [(f"for x in {xs}:", f"for x in {xs}[1:]:")],
                     "wrong_operator": [(f"{t} += x", f"{t} -= x"), (f"{t} += x", f"{t} *= x")],
                     "wrong_constant": [(f"{out}, {t} = [], 0", f"{out}, {t} = [], 1")]}, cases, edges)


@_template("last_index", "off_by_one", "wrong_operator", "wrong_constant")
def _last_index(r):
  xs, v, i = r.choice(_LIST), r.choice(("v", "target", "x", "item", "want")), r.choice(_INDEX)
  src = _src(f"def last_index({xs}, {v}):", f"  for {i} in range(len({xs}) - 1, -1, -1):",
             f"    if {xs}[{i}] == {v}:", f"      return {i}", "  return -1")
  cases = []
  for _ in range(8):
    seq = _ints(r, 0, 4, r.randint(3, 5))
    cases.append((seq, r.choice(seq) if r.random() < 0.7 else 7))
  a, b = r.randint(0, 4), r.randint(5, 9)
  edges = [([a, b, b], a), ([], a), ([b, a], a)]
  loop = f"for {i} in range(len({xs}) - 1, -1, -1):"
  return _Spec(src, {"off_by_one": [(loop, f"for {i} in range(len({xs}) - 1, 0, -1):"),
                                    (loop, f"for {i} in range(len({xs}) - 2, -1, -1):")],
                     "wrong_operator": [(f"if {xs}[{i}] == {v}:", f"if {xs}[{i}] != {v}:")],
                     "wrong_constant": [("return -1", "return 0")]}, cases, edges)


@_template("is_palindrome", "off_by_one", "wrong_operator", "missing_edge_case")
def _is_palindrome(r):
  s, i = r.choice(_TEXT), r.choice(_INDEX)
  src = _src(f"def is_palindrome({s}):", f"  for {i} in range(len({s}) // 2):",
             f"    if {s}[{i}].lower() != {s}[-{i} - 1].lower():", "      return False", "  return True")
  cases = []
  for _ in range(4):
    half = _word(r, 1, 3)
    p = half + r.choice(("", r.choice("abcxyz"))) + half[::-1]
    j = r.randrange(len(p))
    near = p[:j] + ("q" if p[j] != "q" else "z") + p[j + 1:]
    cases += [(p,), (near,)]
  half = _word(r, 2, 3)
  edges = [("",), (r.choice("abc"),), ((half + half[::-1]).capitalize(),)]
  cmp = f"if {s}[{i}].lower() != {s}[-{i} - 1].lower():"
  return _Spec(src, {"off_by_one": [(cmp, f"if {s}[{i}].lower() != {s}[-{i}].lower():"),
                                    (f"for {i} in range(len({s}) // 2):",
                                     f"for {i} in range(len({s}) // 2 - 1):")],
                     "wrong_operator": [(cmp, f"if {s}[{i}].lower() == {s}[-{i} - 1].lower():")],
                     "missing_edge_case": [(cmp, f"if {s}[{i}] != {s}[-{i} - 1]:")]}, cases, edges)


@_template("safe_div", "swapped_args", "wrong_constant", "missing_edge_case")
def _safe_div(r):
  a, b = r.choice((("a", "b"), ("num", "den"), ("x", "y"), ("n", "d"), ("top", "bottom"), ("p", "q")))
  d, other = r.sample(("0", "-1", "None"), 2)
  line = f"return {a} // {b} if {b} else {d}"
  src = _src(f"def safe_div({a}, {b}):", f"  {line}")
  cases = [(r.randint(0, 60), r.randint(2, 9)) for _ in range(8)]
  edges = [(r.randint(1, 60), 0), (0, r.randint(2, 9))]
  return _Spec(src, {"swapped_args": [(line, f"return {b} // {a} if {b} else {d}")],
                     "wrong_constant": [(line, f"return {a} // {b} if {b} else {other}")],
                     "missing_edge_case": [(line, f"return {a} // {b}")]}, cases, edges)


@_template("parse_kv", "swapped_args", "wrong_constant", "missing_edge_case")
def _parse_kv(r):
  s, pairs = r.choice(_TEXT), r.choice(("pairs", "kv", "items", "parts"))
  p = r.choice(("p", "part", "f", "field"))
  sep, wrong = r.sample(";,&|", 2)
  eq = r.choice("=:")
  comp = f'{pairs} = [{p}.split("{eq}") for {p} in {s}.split("{sep}") if {p}]'
  ret = f"return {{k: int(v) for k, v in {pairs}}}"
  src = _src(f"def parse_kv({s}):", f"  {comp}", f"  {ret}")

  def text(n):
    keys = r.sample("abcxyz", n)
    return sep.join(f"{k}{eq}{r.randint(0, 99)}" for k in keys)

  cases = [(text(r.randint(1, 3)),) for _ in range(8)]
  edges = [("",), (text(1) + sep,)]
  return _Spec(src, {"swapped_args": [(ret, f"return {{k: int(v) for v, k in {pairs}}}")],
                     "wrong_constant": [(comp, comp.replace(f'"{sep}"', f'"{wrong}"'))],
                     "missing_edge_case": [(comp, comp.replace(f" if {p}]", "]"))]}, cases, edges)


@_template("chunk", "off_by_one")
def _chunk(r):
  s, n = r.choice(_TEXT + ("seq",)), r.choice(("n", "size", "k", "width", "step"))
  line = f"return [{s}[i:i + {n}] for i in range(0, len({s}), {n})]"
  src = _src(f"def chunk({s}, {n}):", f"  {line}")
  cases = [(_word(r, 3, 7, "abcdefgh"), r.randint(2, 4)) for _ in range(8)]
  edges = [("", r.randint(1, 3)), (_word(r, 2, 4), 1)]
  return _Spec(src, {"off_by_one": [
      (line, line.replace(f"i + {n}]", f"i + {n} - 1]")),
      (line, line.replace(f"len({s}), {n}", f"len({s}) - 1, {n}")),
      (line, line.replace("range(0,", "range(1,"))]}, cases, edges)


@_template("dedupe", "off_by_one", "wrong_operator")
def _dedupe(r):
  xs, seen = r.choice(_LIST), r.choice(("seen", "done", "met", "found"))
  out = r.choice(("out", "res", "acc", "keep"))
  src = _src(f"def dedupe({xs}):", f"  {seen}, {out} = set(), []", f"  for x in {xs}:",
             f"    if x not in {seen}:", f"      {seen}.add(x)", f"      {out}.append(x)",
             f"  return {out}")
  cases = [(_ints(r, 0, 4, r.randint(3, 5)),) for _ in range(8)]
  edges = [([],), ([r.randint(0, 9)] * 2,)]
  return _Spec(src, {"off_by_one": [(f"for x in {xs}:", f"for x in {xs}[1:]:")],
                     "wrong_operator": [(f"if x not in {seen}:", f"if x in {seen}:")]}, cases, edges)


@_template("max_gap", "off_by_one", "wrong_operator", "missing_edge_case")
def _max_gap(r):
  xs, i, d = r.choice(_LIST), r.choice(_INDEX), r.choice(("0", "0", "-1", "None"))
  gen = f"return max(abs({xs}[{i} + 1] - {xs}[{i}]) for {i} in range(len({xs}) - 1))"
  src = _src(f"def max_gap({xs}):", f"  if len({xs}) < 2:", f"    return {d}", f"  {gen}")
  cases = [(_ints(r, 0, 20, r.randint(2, 4)),) for _ in range(8)]
  edges = [([],), ([r.randint(0, 20)],)]
  return _Spec(src, {"off_by_one": [(gen, gen.replace(f"len({xs}) - 1", f"len({xs}) - 2"))],
                     "wrong_operator": [(gen, gen.replace(f"] - {xs}", f"] + {xs}"))],
                     "missing_edge_case": [(f"if len({xs}) < 2:", f"if not {xs}:")]}, cases, edges)


@_template("digit_sum", "wrong_operator", "wrong_constant", "missing_edge_case")
def _digit_sum(r):
  n, t = r.choice(("n", "x", "num", "value", "k")), r.choice(("t", "total", "s", "acc", "out"))
  init = f"{t}, {n} = 0, abs({n})"
  src = _src(f"def digit_sum({n}):", f"  {init}", f"  while {n} > 0:", f"    {t} += {n} % 10",
             f"    {n} //= 10", f"  return {t}")
  cases = [(r.randint(10, 10 ** r.randint(2, 5)),) for _ in range(8)]
  edges = [(0,), (-r.randint(10, 999),)]
  return _Spec(src, {"wrong_operator": [(f"{t} += {n} % 10", f"{t} += {n} // 10")],
                     "wrong_constant": [(f"{n} //= 10", f"{n} //= 100"), (init, f"{t}, {n} = 1, abs({n})")],
                     "missing_edge_case": [(init, f"{t}, {n} = 0, {n}")]}, cases, edges)


@_template("rotate", "swapped_args", "missing_edge_case")
def _rotate(r):
  xs, k = r.choice(_LIST + ("seq",)), r.choice(("k", "n", "steps", "shift", "by"))
  first = f"{k} = {k} % len({xs}) if {xs} else 0"
  ret = f"return {xs}[{k}:] + {xs}[:{k}]"
  src = _src(f"def rotate({xs}, {k}):", f"  {first}", f"  {ret}")
  word = r.random() < 0.5
  make = (lambda m: _word(r, m, m, "abcdefg")) if word else (lambda m: _ints(r, 0, 9, m))
  cases = []
  for _ in range(8):
    seq = make(r.randint(3, 5))
    cases.append((seq, r.randint(1, len(seq) - 1)))
  seq = make(r.randint(3, 4))
  edges = [(make(0), r.randint(1, 3)), (seq, len(seq) + r.randint(1, 2))]
  return _Spec(src, {"swapped_args": [(ret, f"return {xs}[:{k}] + {xs}[{k}:]")],
                     "missing_edge_case": [(first, f"{k} = {k} % len({xs})"),
                                           (first, f"{k} = {k} if {xs} else 0")]}, cases, edges)


@_template("word_count", "wrong_constant", "missing_edge_case")
def _word_count(r):
  s, d, w = r.choice(_TEXT), r.choice(("d", "counts", "freq", "seen")), r.choice(_TOKEN)
  loop = f"for {w} in {s}.lower().split():"
  inc = f"{d}[{w}] = {d}.get({w}, 0) + 1"
  src = _src(f"def word_count({s}):", f"  {d} = {{}}", f"  {loop}", f"    {inc}", f"  return {d}")
  cases = []
  for _ in range(8):
    a, b = r.sample(_SHORT, 2)
    cases.append((" ".join(r.choice((a, a, b)) for _ in range(r.randint(2, 3))),))
  a, b = r.sample(_SHORT[1:], 2)
  edges = [("",), (f"{a.capitalize()} {a}",), (f"{a}  {b}",), (f" {a}",)]
  return _Spec(src, {"wrong_constant": [(inc, inc.replace(", 0)", ", 1)"))],
                     "missing_edge_case": [(loop, f"for {w} in {s}.split():"),
                                           (loop, f'for {w} in {s}.lower().split(" "):')]}, cases, edges)


@_template("count_long", "off_by_one", "wrong_operator", "wrong_constant")
def _count_long(r):
  s, w, n = r.choice(_TEXT), r.choice(_TOKEN), r.randint(3, 5)
  line = f"return sum(1 for {w} in {s}.split() if len({w}) >= {n})"
  src = _src(f"def count_long({s}):", f"  {line}")
  pool = [x for x in _WORDS if len(x) in (n - 1, n, n + 1)] + list(_WORDS[:4])
  cases = [(" ".join(r.sample(pool, r.randint(2, 3))),) for _ in range(8)]
  edges = [("",), (r.choice([x for x in _WORDS if len(x) == n]),)]
  return _Spec(src, {"off_by_one": [(line, line.replace(f">= {n}", f"> {n}"))],
                     "wrong_operator": [(line, line.replace(f">= {n}", f"<= {n}"))],
                     "wrong_constant": [(line, line.replace(f">= {n}", f">= {n + r.choice((-2, 2))}"))]},
               cases, edges)


@_template("sum_multiples", "wrong_operator", "wrong_constant")
def _sum_multiples(r):
  xs, k = r.choice(_LIST), r.randint(2, 5)
  line = f"return sum(x for x in {xs} if x % {k} == 0)"
  src = _src(f"def sum_multiples({xs}):", f"  {line}")
  cases = [(_ints(r, 0, 20, r.randint(3, 5)),) for _ in range(8)]
  edges = [([],), ([k * r.randint(1, 4), 1],)]
  other = r.choice([m for m in range(2, 7) if m != k])
  return _Spec(src, {"wrong_operator": [(line, line.replace("== 0", "!= 0"))],
                     "wrong_constant": [(line, line.replace(f"% {k}", f"% {other}"))]}, cases, edges)


@_template("int_pow", "off_by_one", "wrong_operator", "wrong_constant")
def _int_pow(r):
  b, e = r.choice(("b", "base", "x", "a")), r.choice(("e", "exp", "n", "k"))
  acc = r.choice(("r", "out", "acc", "res", "p"))
  loop = f"for _ in range({e}):"
  src = _src(f"def int_pow({b}, {e}):", f"  {acc} = 1", f"  {loop}", f"    {acc} *= {b}", f"  return {acc}")
  cases = []
  for _ in range(8):
    x = r.randint(2, 6)
    cases.append((x, r.randint(1, 4 if x < 5 else 3)))
  edges = [(r.randint(2, 9), 0), (0, r.randint(1, 3)), (1, r.randint(2, 5))]
  return _Spec(src, {"off_by_one": [(loop, f"for _ in range({e} - 1):"), (loop, f"for _ in range(1, {e}):"),
                                    (loop, f"for _ in range({e} + 1):")],
                     "wrong_operator": [(f"{acc} *= {b}", f"{acc} += {b}")],
                     "wrong_constant": [(f"{acc} = 1", f"{acc} = 0")]}, cases, edges)


@_template("mean", "swapped_args", "wrong_operator", "missing_edge_case")
def _mean(r):
  xs, d = r.choice(_LIST), r.choice(("0", "0.0", "None"))
  line = f"return sum({xs}) / len({xs}) if {xs} else {d}"
  src = _src(f"def mean({xs}):", f"  {line}")
  cases = [(_ints(r, 0, 9, r.choice((2, 2, 4))),) for _ in range(10)]
  edges = [([],), ([r.randint(1, 9)],)]
  swapped = line.replace(f"sum({xs}) / len({xs})", f"len({xs}) / sum({xs})")
  return _Spec(src, {"swapped_args": [(line, swapped)],
                     "wrong_operator": [(line, line.replace(" / ", " // "))],
                     "missing_edge_case": [(line, f"return sum({xs}) / len({xs})")]}, cases, edges)


@_template("truncate", "off_by_one")
def _truncate(r):
  s, n = r.choice(_TEXT), r.choice(("n", "width", "limit", "size", "m"))
  tail = r.choice(("...", "..", "~"))
  cut = f'return {s}[:{n} - {len(tail)}] + "{tail}"'
  src = _src(f"def truncate({s}, {n}):", f"  if len({s}) <= {n}:", f"    return {s}", f"  {cut}")
  cases = []
  for _ in range(8):
    m = r.randint(4, 7)
    cases.append((_word(r, m + 1, m + 4), m))
  m = r.randint(4, 7)
  edges = [(_word(r, m, m), m), (_word(r, m + 1, m + 1), m), (_word(r, 1, 3), m)]
  keep = f"{n} - {len(tail) - 1}" if len(tail) > 1 else n
  short = f'return {s}[:{keep}] + "{tail}"'
  return _Spec(src, {"off_by_one": [(f"if len({s}) <= {n}:", f"if len({s}) < {n}:"), (cut, short)]},
               cases, edges)


@_template("count_between", "off_by_one", "swapped_args")
def _count_between(r):
  xs, (lo, hi) = r.choice(_LIST), r.choice(_BOUNDS)
  line = f"return sum(1 for x in {xs} if {lo} <= x <= {hi})"
  src = _src(f"def count_between({xs}, {lo}, {hi}):", f"  {line}")
  cases = []
  for _ in range(8):
    a = r.randint(0, 5)
    b = a + r.randint(1, 4)
    vals = _ints(r, 0, 9, r.randint(2, 4)) + [r.choice((a, b))]
    r.shuffle(vals)
    cases.append((vals, a, b))
  a = r.randint(0, 5)
  edges = [([], a, a + 2), ([a, a + 3], a, a + 3)]
  return _Spec(src, {"off_by_one": [(line, line.replace(f"x <= {hi}", f"x < {hi}")),
                                    (line, line.replace(f"{lo} <= x", f"{lo} < x"))],
                     "swapped_args": [(line, line.replace(f"{lo} <= x <= {hi}", f"{hi} <= x <= {lo}"))]},
               cases, edges)


@_template("pad_left", "off_by_one", "swapped_args", "wrong_constant")
def _pad_left(r):
  s, n = r.choice(_TEXT), r.choice(("n", "width", "size", "length"))
  fill, wrong = r.sample("0*.-#", 2)
  line = f'return "{fill}" * ({n} - len({s})) + {s}'
  src = _src(f"def pad_left({s}, {n}):", f"  {line}")
  cases = []
  for _ in range(8):
    m = r.randint(1, 3)
    cases.append((str(r.randint(10 ** (m - 1), 10 ** m - 1)), m + r.randint(1, 3)))
  edges = [(str(r.randint(100, 999)), r.randint(1, 3)), ("", r.randint(1, 3))]
  return _Spec(src, {"off_by_one": [(line, line.replace(f"({n} - len({s}))", f"({n} - len({s}) - 1)"))],
                     "swapped_args": [(line, f'return {s} + "{fill}" * ({n} - len({s}))')],
                     "wrong_constant": [(line, line.replace(f'"{fill}"', f'"{wrong}"'))]}, cases, edges)


@dataclasses.dataclass(frozen=True)
class _Case:
  line: str       # `assert f(...) == expected`
  caught: bool    # the buggy module gets it wrong
  edge: bool


def _load(source: str, name: str):
  scope: dict = {}
  exec(compile(source, SOLUTION, "exec"), scope)
  return scope[name]


def _wrong(fn, args: tuple, want) -> bool:
  try:
    return not fn(*copy.deepcopy(args)) == want
  except Exception:
    return True


def _tests(name: str, cases: list[_Case]) -> str:
  body = "".join(f"def test_{i}():\n  {c.line}\n" for i, c in enumerate(cases, 1))
  return f"from solution import {name}\n{body}"


def _pick(r: random.Random, pool: list[_Case], count: int, taken: list[_Case]) -> list[_Case]:
  rest = [c for c in pool if c not in taken]
  return r.sample(rest, min(count, len(rest)))


def _make_task(r: random.Random, name: str, kind: str, task_id: int) -> CodefixTask | None:
  """One task, or None when this draw cannot make a valid one (no case catches the bug, ...)."""
  spec = TEMPLATES[name][1](r)
  fixed, buggy = r.choice(spec.bugs[kind])
  if spec.source.count(fixed) != 1:
    raise AssertionError(f"template {name}: bug line {fixed!r} is not unique")
  module = spec.source.replace(fixed, buggy, 1)
  if module.count(buggy) != 1 or module.replace(buggy, fixed, 1) != spec.source:
    return None
  good, bad = _load(spec.source, name), _load(module, name)
  cases, calls = [], set()
  for args, edge in [(a, False) for a in spec.cases] + [(a, True) for a in spec.edges]:
    call = f"{name}({', '.join(map(repr, args))})"
    if call in calls:
      continue
    calls.add(call)
    want = good(*copy.deepcopy(args))
    line = f"assert {call} == {want!r}"
    if len(line) <= MAX_ASSERT:
      cases.append(_Case(line, _wrong(bad, args, want), edge))
  caught = [c for c in cases if c.caught]
  passed = [c for c in cases if not c.caught]
  if not caught:
    return None
  n_visible, n_hidden = r.choice((2, 3)), r.randint(3, 5)
  plain = [c for c in passed if not c.edge]
  if r.random() < VISIBLE_CATCH or len(plain) < n_visible:
    first = r.choice([c for c in caught if not c.edge] or caught)
    visible = [first] + _pick(r, [c for c in cases if not c.edge] or cases, n_visible - 1, [first])
  else:
    visible = r.sample(plain, n_visible)
  if len(visible) < 2:
    return None
  # hidden: a failing case the visible tests lack (else the visible one), an edge case, then others
  hidden = _pick(r, caught, 1, visible) or [r.choice(caught)]
  hidden += _pick(r, [c for c in cases if c.edge], 1, visible + hidden)
  hidden += _pick(r, cases, n_hidden - len(hidden), visible + hidden)
  if len(hidden) < 3 or all(c in visible for c in hidden):
    return None
  r.shuffle(hidden)
  vis = _tests(name, visible)
  if len(module) > MAX_SOLUTION or len(vis) > MAX_VISIBLE:
    return None
  return CodefixTask(task_id=task_id, name=name, bug=kind, path=SOLUTION,
                     files={SOLUTION: module, VISIBLE: vis}, visible_tests=vis,
                     hidden_tests=_tests(name, hidden), buggy=buggy, fixed=fixed)


def task_key(task: CodefixTask) -> str:
  """The content a split is deduplicated on: the buggy module and the hidden tests."""
  return hashlib.sha256(f"{task.files[task.path]}\0{task.hidden_tests}".encode()).hexdigest()


def combinations() -> list[tuple[str, str]]:
  """Every (template, bug kind) pair a task can be drawn from."""
  return [(name, kind) for name, (kinds, _) in TEMPLATES.items() for kind in kinds]


def _split(r: random.Random, count: int, seen: set[str]) -> list[CodefixTask]:
  combos, tasks = combinations(), []
  for _ in range(50 * count + 1000):
    if len(tasks) == count:
      return tasks
    name, kind = r.choice(combos)
    task = _make_task(r, name, kind, len(tasks))
    if task is not None and task_key(task) not in seen:
      seen.add(task_key(task))
      tasks.append(task)
  if len(tasks) == count:
    return tasks
  raise RuntimeError(f"could only generate {len(tasks)} of {count} distinct codefix tasks")


def generate(seed: int, num_train: int, num_test: int) -> dict[str, list[CodefixTask]]:
  """{"train": [...], "test": [...]}: distinct tasks, task_id = index in the split."""
  seen: set[str] = set()
  test = _split(random.Random(f"codefix/{seed}/test"), num_test, seen)
  train = _split(random.Random(f"codefix/{seed}/train"), num_train, seen)
  return {"train": train, "test": test}
