"""Every third-party module the package, configs and experiments import is installed by
`pip install -e .` (install_requires), or, for the benchmark peers only, by the `bench` extra."""

import ast
import importlib.metadata as md
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCAL = {"tree_rl", "configs", "experiments", "launch", "tests"}
# Imported inside libraries on paths the README runs (not visible as our own imports).
TRIGGERED = {"jinja2": "transformers' apply_chat_template (model=hf)"}


def imported_modules(top: str) -> dict[str, set[str]]:
  """{top-level module: files importing it} over every .py under ROOT/top (nested imports too)."""
  out: dict[str, set[str]] = {}
  for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(dirpath, name)
      for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
          mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
          mods = [node.module]
        else:
          continue
        for m in mods:
          out.setdefault(m.split(".")[0], set()).add(os.path.relpath(path, ROOT))
  return out


def requirements(extra: str | None) -> set[str]:
  """Normalised distribution names tree_rl requires (with `extra`: only that extra's)."""
  names = set()
  for req in md.requires("tree_rl") or []:
    spec, _, marker = req.partition(";")
    in_extra = re.search(r'extra\s*==\s*"([^"]+)"', marker)
    if (in_extra.group(1) if in_extra else None) == extra:
      names.add(_norm(re.split(r"[\s\[<>=!~;]", spec.strip(), maxsplit=1)[0]))
  return names


def _norm(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_an_install_requirement():
  dists = md.packages_distributions()
  core, bench = requirements(None), requirements("bench")
  missing = []
  for top in ("tree_rl", "configs", "experiments", "launch"):
    for mod, files in imported_modules(top).items():
      if mod in LOCAL or mod in sys.stdlib_module_names or mod == "__future__":
        continue
      owners = {_norm(d) for d in dists.get(mod, [])}
      assert owners, f"module {mod!r} (imported by {sorted(files)}) belongs to no installed distribution"
      only_bench = all(os.path.basename(f).startswith("bench_") for f in files)
      if not owners & (core | (bench if only_bench else set())):
        missing.append((mod, sorted(owners), sorted(files)))
  for mod, why in TRIGGERED.items():
    if not {_norm(d) for d in dists.get(mod, [])} & core:
      missing.append((mod, why, []))
  assert not missing, f"imports without a requirement in setup.py: {missing}"


def test_test_only_packages_stay_out_of_install_requires():
  core = requirements(None)
  for dist in ("chex", "pytest", "torch", "gymnasium", "hypothesis"):
    assert dist not in core, dist
