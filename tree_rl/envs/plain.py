"""Plain data across a process boundary: builtin values as tagged JSON, decoded strictly.

    text = json.dumps(encode([1, 2.0, ("a", None)]))
    decode(json.loads(text)) == [1, 2.0, ("a", None)]          # same types, exactly

Only these exact types cross (subclasses do not): None, bool, int, float, str, list, tuple and
dict. A value is `[tag, payload]` (`["n"]`, `["b", true]`, `["i", "12"]`, `["f", "1.5"]`,
`["s", "x"]`, `["l", [...]]`, `["t", [...]]`, `["d", [[k, v], ...]]`); ints and floats travel
as text, so no JSON reader converts them. `encode` raises TypeError on any other type and
`decode` raises ValueError on anything that is not such a value, so what a decoder returns
holds builtin objects only, whatever produced the text. The module imports nothing but `math`
because the sandbox's runner (`tree_rl.envs.sandbox_runner`) reads it by path, with the standard
library alone on its import path.
"""

import math

MAX_DEPTH = 32


def encode(value, depth=0):
  """The tagged form of a builtin value; TypeError for any other type (subclasses included)."""
  if depth > MAX_DEPTH:
    raise TypeError(f"a value nested deeper than {MAX_DEPTH}")
  kind = type(value)
  if value is None:
    return ["n"]
  if kind is bool:
    return ["b", value]
  if kind is int:
    return ["i", int.__repr__(value)]
  if kind is float:
    return ["f", float.__repr__(value)]
  if kind is str:
    return ["s", str.__str__(value)]
  if kind is list or kind is tuple:
    return ["l" if kind is list else "t", [encode(v, depth + 1) for v in value]]
  if kind is dict:
    return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
  raise TypeError(f"a value of type {kind.__name__!r} is not plain data")


def decode(data, depth=0):
  """The builtin value of a tagged form; ValueError for anything malformed."""
  if depth > MAX_DEPTH:
    raise ValueError(f"a value nested deeper than {MAX_DEPTH}")
  if type(data) is not list or not data or type(data[0]) is not str:
    raise ValueError("not a tagged value")
  tag, body = data[0], data[1:]
  if tag == "n" and not body:
    return None
  if len(body) != 1:
    raise ValueError(f"tag {tag!r} with {len(body)} payloads")
  (x,) = body
  if tag == "b" and type(x) is bool:
    return x
  if tag == "i" and type(x) is str and x.lstrip("-").isdigit() and x.isascii():
    return int(x)
  if tag == "f" and type(x) is str and x.isascii() and len(x) <= 32:
    out = float(x)
    if math.isnan(out) and x not in ("nan", "-nan"):
      raise ValueError(f"float text {x!r}")
    return out
  if tag == "s" and type(x) is str:
    return x
  if tag in ("l", "t") and type(x) is list:
    items = [decode(v, depth + 1) for v in x]
    return items if tag == "l" else tuple(items)
  if tag == "d" and type(x) is list:
    out = {}
    for pair in x:
      if type(pair) is not list or len(pair) != 2:
        raise ValueError("a dict item is not a [key, value] pair")
      key, value = decode(pair[0], depth + 1), decode(pair[1], depth + 1)
      try:
        out[key] = value
      except TypeError:
        raise ValueError("an unhashable dict key") from None
    if len(out) != len(x):
      raise ValueError("a repeated dict key")
    return out
  raise ValueError(f"bad tagged value with tag {tag!r}")


def same(got, want) -> bool:
  """Exact equality of plain values: the same types all the way down, then equal values."""
  if type(got) is not type(want):
    return False
  if type(want) in (list, tuple):
    return len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
  if type(want) is dict:
    if len(got) != len(want):
      return False
    return all(any(same(gk, wk) and same(gv, wv) for wk, wv in want.items())
               for gk, gv in got.items())
  if type(want) is float and math.isnan(want):
    return math.isnan(got)
  return got == want
