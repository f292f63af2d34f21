"""Named sweeps reproducing the papers' ablations: `names()`, `get(name)`, `register(name, fn)`.

`get` builds the sweep (its factory reads the base configs), refuses one whose `equal_budget`
entries differ by more than 10% in planned cost (`build.check_equal_budget`), and raises
`sampler.num_pages` in entries whose rollout needs more KV pages than their config has (see
`build.fit_pages`).
`launch/sweep.py NAME` expands a sweep into one `experiments.train` command per run.
"""

from __future__ import annotations

from typing import Callable

from experiments.sweeps import budget, patr, report, tree_grpo
from experiments.sweeps.core import CONFIG_KEY, Run, Sweep, axis, format_value, one_at_a_time

_FACTORIES: dict[str, Callable[[], Sweep]] = {**patr.SWEEPS, **tree_grpo.SWEEPS, **budget.SWEEPS,
                                               **report.SWEEPS}
_BUILT: dict[str, Sweep] = {}


def register(name: str, factory: Callable[[], Sweep]) -> None:
  """Add (or replace) a sweep; `factory()` returns a `Sweep` named `name`."""
  _FACTORIES[name] = factory
  _BUILT.pop(name, None)


def names() -> list[str]:
  return sorted(_FACTORIES)


def get(name: str) -> Sweep:
  if name not in _FACTORIES:
    raise KeyError(f"unknown sweep {name!r}; known: {names()}")
  if name not in _BUILT:
    from experiments.sweeps.build import check_equal_budget, fit_pages
    sweep = _FACTORIES[name]()
    if sweep.name != name:
      raise ValueError(f"sweep registered as {name!r} is named {sweep.name!r}")
    check_equal_budget(sweep)
    _BUILT[name] = fit_pages(sweep)
  return _BUILT[name]


__all__ = ["CONFIG_KEY", "Run", "Sweep", "axis", "format_value", "get", "names", "one_at_a_time",
           "register"]
