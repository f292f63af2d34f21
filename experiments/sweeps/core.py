"""The declarative sweep form: a base config, named entries of `--config.` overrides, seeds.

An entry is a dict `{"rollout.expand_children": 3, ...}` of dotted config fields; the reserved
key `"config"` replaces the sweep's config file and argument for that entry
(`"configs/frozenlake.py:algo=tree_random"`). `Sweep.runs()` expands entries x seeds into
`Run`s, each with `seed` set and one workdir `ROOT/SWEEP/ENTRY_seedS`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Any, Mapping, Sequence

CONFIG_KEY = "config"
DEFAULT_SEEDS = (0, 1, 2)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def format_value(value: Any) -> str:
  """A config value as `--config.x=` text (what absl parses back to the same value)."""
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, (int, str)):
    return str(value)
  if isinstance(value, float):
    return repr(value)
  raise TypeError(f"override value {value!r} of type {type(value).__name__}: use bool, int, "
                  "float or str")


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a sweep: the config argument and its overrides (seed last)."""

  sweep: str
  entry: str
  seed: int
  config: str
  overrides: tuple[tuple[str, Any], ...]

  @property
  def name(self) -> str:
    return f"{self.entry}_seed{self.seed}"

  def workdir(self, root: str) -> str:
    return posixpath.join(root, self.sweep, self.name)

  def train_args(self, root: str) -> list[str]:
    """The arguments of `python -m experiments.train` for this run."""
    return [f"--config={self.config}", f"--workdir={self.workdir(root)}",
            *(f"--config.{k}={format_value(v)}" for k, v in self.overrides)]


@dataclasses.dataclass(frozen=True)
class Sweep:
  """`entries` maps entry names to override dicts; `overrides` apply to every entry first
  (an entry's own value wins). `equal_budget`: groups of entries compared at an equal budget,
  whose planned costs must agree within 10% (`build.check_equal_budget`)."""

  name: str
  config: str
  entries: Mapping[str, Mapping[str, Any]]
  seeds: tuple[int, ...] = DEFAULT_SEEDS
  overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  description: str = ""
  equal_budget: tuple[tuple[str, ...], ...] = ()

  def __post_init__(self):
    for n in (self.name, *self.entries):
      if not _NAME.match(n):
        raise ValueError(f"sweep/entry name {n!r}: use letters, digits, '_', '.', '-'")
    if not self.entries:
      raise ValueError(f"sweep {self.name!r} has no entries")
    for group in self.equal_budget:
      unknown = [e for e in group if e not in self.entries]
      if unknown:
        raise ValueError(f"sweep {self.name!r}: equal_budget names unknown entries {unknown}")
    for n, e in self.entries.items():
      for key, value in {**self.overrides, **e}.items():
        if key == "seed":
          raise ValueError(f"sweep {self.name!r} entry {n!r}: seeds come from Sweep.seeds")
        if key != CONFIG_KEY:
          format_value(value)

  def entry_config(self, entry: str) -> str:
    return self.entries[entry].get(CONFIG_KEY, self.config)

  def entry_overrides(self, entry: str) -> dict[str, Any]:
    merged = {**self.overrides, **self.entries[entry]}
    merged.pop(CONFIG_KEY, None)
    return merged

  def run(self, entry: str, seed: int) -> Run:
    return Run(self.name, entry, int(seed), self.entry_config(entry),
               (*self.entry_overrides(entry).items(), ("seed", int(seed))))

  def runs(self, seeds: Sequence[int] | None = None) -> list[Run]:
    """Seed-major: every entry with the first seed, then every entry with the next."""
    seeds = tuple(self.seeds if seeds is None else seeds)
    return [self.run(entry, s) for s in seeds for entry in self.entries]

  def replace(self, **changes) -> "Sweep":
    return dataclasses.replace(self, **changes)


def axis(label: str, key: str, values: Sequence[Any]) -> dict[str, dict[str, Any]]:
  """Entries `{label}{value}` setting one field, e.g. axis("K", "rollout.score_every", (1, 3))."""
  return {f"{label}{format_value(v)}": {key: v} for v in values}


def one_at_a_time(base_values: Mapping[str, Any], *entry_sets: Mapping[str, Mapping[str, Any]]
                  ) -> dict[str, dict[str, Any]]:
  """Union of entry sets around one base: entries that only restate `base_values` (the base
  config's own values) become the single entry `base`, listed first."""
  out: dict[str, dict[str, Any]] = {"base": {}}
  for entries in entry_sets:
    for name, overrides in entries.items():
      if name in out:
        raise ValueError(f"duplicate entry name {name!r}")
      restates = all(k != CONFIG_KEY and k in base_values and base_values[k] == v
                     for k, v in overrides.items())
      if not restates:
        out[name] = dict(overrides)
  return out
