"""One small name -> object registry behind every extension point (advantage estimators,
rollout methods, process scorers, task sets), so a notebook registers a function and names it
in the config, and config validation asks the registry for the names it knows."""

from __future__ import annotations

from typing import Any, Callable


class Registry:
  """`register(name)` (a decorator), `get(name)`, `names()`; `get` of an unknown name raises a
  KeyError naming the config field and every registered name."""

  def __init__(self, kind: str, field: str = ""):
    self.kind, self.field = kind, field
    self._items: dict[str, Any] = {}

  def register(self, name: str, *, overwrite: bool = True) -> Callable[[Any], Any]:
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

    def deco(obj):
      if name in self._items and not overwrite and self._items[name] is not obj:
        raise ValueError(f"{self.kind} {name!r} is already registered; pass overwrite=True")
      self._items[name] = obj
      return obj

    return deco

  def get(self, name: str) -> Any:
    try:
      return self._items[name]
    except KeyError:
      where = f" ({self.field})" if self.field else ""
      raise KeyError(f"unknown {self.kind} {name!r}{where}; known: {self.names()}") from None

  def names(self) -> list[str]:
    return sorted(self._items)

  def ordered(self) -> list[str]:
    """The names in registration order (a replaced one keeps its place)."""
    return list(self._items)

  def __contains__(self, name: str) -> bool:
    return name in self._items
