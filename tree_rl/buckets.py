"""Shape buckets: the one rule that turns a data-dependent size into one of few compiled shapes."""

from __future__ import annotations


def pow2_bucket(n: int, lo: int = 1, hi: int | None = None) -> int:
  """The smallest power of two >= n, raised to at least `lo`, then capped at `hi` (the cap
  wins over `lo`); n <= 0 gives min(lo, hi)."""
  p = lo if n <= 0 else max(lo, 1 << (int(n) - 1).bit_length())
  return p if hi is None else min(hi, p)
