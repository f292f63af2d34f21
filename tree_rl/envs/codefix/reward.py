"""The codefix reward, judged in the trainer's process from plain data the sandbox returns.

    cases = hidden_cases(task.hidden_tests)          # parsed here; never sent to the sandbox
    run = sandbox.run_calls(handle, cases.module, cases.function, cases.calls)
    passed = score(cases, run)                       # resolved when passed == len(cases)

A hidden test is `def test_k():` whose body is one `assert f(<literals>) == <literal>` (the form
`tree_rl.envs.codefix.gen` writes); anything else is refused here, so the count of tests is the
task's own. Only the calls' arguments reach the sandboxed child, which returns each call's value
as plain data (`tree_rl.envs.plain`); the expected values, the comparison and the count stay in
this process, and a value is right only when `plain.same` holds (exact types, recursively).
"""

from __future__ import annotations

import ast
import dataclasses

from tree_rl.envs import plain


@dataclasses.dataclass(frozen=True)
class Cases:
  module: str                 # the module under test (imported from the workspace)
  function: str               # the function each test calls
  calls: tuple[tuple, ...]    # each test's positional arguments
  expected: tuple             # each test's expected return value

  def __len__(self) -> int:
    return len(self.calls)


def _literal(node: ast.AST, what: str):
  try:
    value = ast.literal_eval(node)
  except ValueError:
    raise ValueError(f"{what} is not a literal: {ast.unparse(node)!r}") from None
  plain.encode(value)   # TypeError for sets, bytes, ...: only plain data crosses
  return value


def hidden_cases(source: str) -> Cases:
  """The calls and expected values of hidden tests in the generator's form; ValueError otherwise."""
  tree = ast.parse(source)
  imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
  if len(imports) != 1 or len(imports[0].names) != 1 or imports[0].level:
    raise ValueError("hidden tests must import one function: `from MODULE import NAME`")
  module, function = imports[0].module, imports[0].names[0].name
  calls, expected, names = [], [], set()
  for node in tree.body:
    if node is imports[0]:
      continue
    if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
      raise ValueError(f"hidden tests hold only test functions, not {ast.unparse(node)[:60]!r}")
    if node.name in names:
      raise ValueError(f"hidden test {node.name} is defined twice")
    names.add(node.name)
    test = node.body[0] if len(node.body) == 1 and isinstance(node.body[0], ast.Assert) else None
    cmp = test.test if test is not None else None
    if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and isinstance(cmp.ops[0], ast.Eq)
            and isinstance(cmp.left, ast.Call) and isinstance(cmp.left.func, ast.Name)
            and cmp.left.func.id == function and not cmp.left.keywords):
      raise ValueError(f"hidden test {node.name} is not `assert {function}(...) == VALUE`")
    calls.append(tuple(_literal(a, f"{node.name}'s argument") for a in cmp.left.args))
    expected.append(_literal(cmp.comparators[0], f"{node.name}'s expected value"))
  if not calls:
    raise ValueError("hidden tests hold no test function")
  return Cases(module, function, tuple(calls), tuple(expected))


def score(cases: Cases, outcomes: list | None) -> int:
  """How many calls returned exactly their expected value (0 for a void run: None)."""
  if outcomes is None or len(outcomes) != len(cases):
    return 0
  return sum(kind == "ok" and plain.same(value, want)
             for (kind, value), want in zip(outcomes, cases.expected))
