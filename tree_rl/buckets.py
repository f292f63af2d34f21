"""Shape buckets: the rules that turn a data-dependent size into one of few compiled shapes.

`pow2_bucket` wastes up to half a dimension with the fewest shapes; `fine_bucket` (2^k or
3 * 2^(k-1)) wastes at most a third with about twice as many.
"""

from __future__ import annotations


def pow2_bucket(n: int, lo: int = 1, hi: int | None = None) -> int:
  """The smallest power of two >= n, raised to at least `lo`, then capped at `hi` (the cap
  wins over `lo`); n <= 0 gives min(lo, hi)."""
  p = lo if n <= 0 else max(lo, 1 << (int(n) - 1).bit_length())
  return p if hi is None else min(hi, p)


def fine_bucket(n: int, lo: int = 1, hi: int | None = None) -> int:
  """The smallest 2^k or 3 * 2^(k-1) >= n (1, 2, 3, 4, 6, 8, 12, 16, 24, ...), raised to at
  least `lo`, then capped at `hi`."""
  p = pow2_bucket(n)
  q = 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p
  q = max(lo, q)
  return q if hi is None else min(hi, q)
