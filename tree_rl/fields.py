"""Config fields declared by the component that reads them.

An environment, a rollout method, a process scorer or an advantage estimator declares its own
fields of one config section when it registers::

    declare("rollout", "patr", dict(score_every=Field(5, "int [1 _)", "turns between scoring rounds")))

`tree_rl.config.base_config` adds every declared field to its section at its default and checks
its range (`tree_rl.config.RANGES` notation) with the schema's own, so a component registered
from a notebook round-trips its fields through a run's config.json and `experiments.evaluate`
(which reads config.json with the same schema, once the component is imported). Two components
of a section may share a field (PATR's and ARPO's `initial_branches`) when they give it one
default; a component that registers again replaces its declaration.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class Field:
  default: Any
  range: str = ""   # a numeric field's range ("int [1 _)", "num [0 1]"); "" for none
  doc: str = ""     # one line for the config reference


_DECLARED: dict[str, dict[str, dict[str, Field]]] = {}   # section -> owner -> name -> Field


def as_fields(values: Mapping[str, Any] | None, ranges: Mapping[str, str] | None = None
              ) -> dict[str, Field]:
  """{name: Field}: plain values become defaults; `ranges` (name -> range) fill in ranges."""
  out = {k: v if isinstance(v, Field) else Field(v) for k, v in (values or {}).items()}
  unknown = sorted(set(ranges or {}) - set(out))
  if unknown:
    raise ValueError(f"ranges of {unknown} name no declared field")
  return {k: dataclasses.replace(f, range=(ranges or {}).get(k, f.range)) for k, f in out.items()}


def declare(section: str, owner: str, fields: Mapping[str, Any] | None,
            ranges: Mapping[str, str] | None = None) -> dict[str, Field]:
  """Declare `owner`'s fields of `config.<section>` (replacing its earlier declaration); a
  field another owner declares must have the same default. Returns them as Fields."""
  fields = as_fields(fields, ranges)
  for name, (owners, other) in declared(section, skip=owner).items():
    if name in fields and fields[name].default != other.default:
      raise ValueError(f"{owner!r}: config.{section}.{name} defaults to {fields[name].default!r}, "
                       f"but {owners[0]!r} declares it with {other.default!r}; a shared field "
                       f"has one default")
  _DECLARED.setdefault(section, {})[owner] = fields
  return fields


def declared(section: str, skip: str = "") -> dict[str, tuple[tuple[str, ...], Field]]:
  """{name: (the owners declaring it, its Field)} over `config.<section>`'s declared fields
  (but `skip`'s), in declaration order."""
  out: dict[str, tuple[tuple[str, ...], Field]] = {}
  for owner, fields in _DECLARED.get(section, {}).items():
    if owner != skip:
      for name, f in fields.items():
        owners, first = out.get(name, ((), f))   # the first declaration's Field (doc, range)
        out[name] = (owners + (owner,), first)
  return out


def owned(section: str, owner: str) -> dict[str, Field]:
  """`owner`'s own declared fields of `config.<section>`."""
  return dict(_DECLARED.get(section, {}).get(owner, {}))


def sections() -> list[str]:
  return list(_DECLARED)
