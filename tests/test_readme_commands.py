"""Every quick fenced command of README.md and docs/*.md runs as written: `--print_config`,
`--list`, `--dry-run` (sweep targets that would submit get `--dry-run` added) and the launch
scripts under `DRY_RUN=1`. Commands that train are exercised by the other tests."""

import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ("--print_config", "--list", "--dry-run")


def doc_files() -> list[str]:
  """README.md, then every page under docs/ (paths relative to the repository root)."""
  docs = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
  return ["README.md"] + [os.path.relpath(p, ROOT) for p in docs]


def commands(path: str) -> list[str]:
  """The lines of `path`'s fenced bash blocks (a backslash continues a line)."""
  text = open(os.path.join(ROOT, path)).read()
  out = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    for line in block.replace("\\\n", " ").splitlines():
      if line.strip():
        out.append(line.strip())
  return out


def readme_commands() -> list[str]:
  return commands("README.md")


def plan(line: str):
  """(argv, env) to run `line` quickly, or None when it would train or install."""
  words = shlex.split(line, comments=True)
  env = {}
  while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
    key, _, value = words.pop(0).partition("=")
    env[key] = value
  if not words or "&&" in words:
    return None
  if words[0].startswith("launch/") and words[0].endswith(".sh"):
    return words, env | {"DRY_RUN": "1"}
  if words[0] not in ("python", ".venv/bin/python"):
    return None
  words = [sys.executable] + words[1:]
  if "launch/sweep.py" in words and "--target" in words and "--dry-run" not in words:
    words.append("--dry-run")   # would submit: print the commands instead
  return (words, env) if any(q in words for q in QUICK) else None


README_CASES = [c for c in readme_commands() if plan(c)]
CASES = list(dict.fromkeys(c for f in doc_files() for c in commands(f) if plan(c)))


def test_the_readme_and_docs_have_quick_commands_of_every_kind():
  kinds = {q for c in CASES for q in QUICK if q in c} | {"DRY_RUN" for c in CASES if "launch/" in c}
  assert {"--print_config", "--list", "--dry-run", "DRY_RUN"} <= kinds, CASES
  assert len(README_CASES) >= 7, README_CASES


@pytest.mark.parametrize("line", CASES)
def test_documented_command_runs_as_written(line):
  argv, env = plan(line)
  proc = subprocess.run(argv, cwd=ROOT, env=dict(os.environ, **env), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, f"{line}\n{proc.stderr[-3000:]}"
  assert proc.stdout.strip(), line
