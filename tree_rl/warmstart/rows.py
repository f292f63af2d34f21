"""The rows SFT trains on: one demonstration per row, or several packed into each row.

A demo pool pads every episode to `warmstart.max_len`; when episodes are much shorter than that
(tool-call demos: 364 tokens on average in 640), most of each update is padding. `pack` puts
several whole demos into one row of the same length (first-fit, longest first), each with its
own positions from 0 and attending only within itself (`segments`), so a packed row computes
exactly what its demos compute in rows of their own, in fewer rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


@struct.dataclass
class SFTRows:
  tokens: jax.Array                  # int32[R, L]
  loss_mask: jax.Array               # float32[R, L] loss weights: > 0 on trained reply tokens
  positions: jax.Array | None = None  # int32[R, L] position within its demo (packed rows only)
  segments: jax.Array | None = None   # int32[R, L] 1.. the demo within the row, 0 padding

  @property
  def num_rows(self) -> int:
    return int(self.tokens.shape[0])

  def fill(self, real_tokens: int) -> float:
    """Real demo tokens over the tokens an SFT pass over every row executes."""
    return float(real_tokens) / float(self.tokens.size)

  def take(self, idx) -> "SFTRows":
    return jax.tree.map(lambda x: x[idx], self)

  def attention_mask(self) -> jax.Array | None:
    """bool[R, L, L]: causal and within one demo; None (plain causal) for one demo per row."""
    if self.segments is None:
      return None
    s = self.segments
    length = s.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    return causal[None] & (s[:, :, None] == s[:, None, :])


def one_per_row(demos) -> SFTRows:
  """The demo pool as it is: a row per demo."""
  return SFTRows(demos.tokens, demos.loss_mask)


def pack(demos, pad_id: int) -> SFTRows:
  """Whole demos packed first-fit, longest first, into rows of the pool's length (host numpy,
  once per warm start). A demo's first token (its prompt) is never trained, so no loss term
  crosses from one demo into the next."""
  tokens, mask, length = (np.asarray(x) for x in jax.device_get(
      (demos.tokens, demos.loss_mask, demos.length)))
  n, width = tokens.shape
  free = np.full(n, width)
  place = np.zeros((n, 2), np.int64)          # (row, start) per demo
  used = 0
  for i in np.argsort(-length, kind="stable"):
    row = int(np.argmax(free[:used + 1] >= length[i]))   # row `used` is empty: always fits
    place[i] = row, width - free[row]
    free[row] -= length[i]
    used += row == used
  out_tokens = np.full((used, width), pad_id, np.int32)
  out_mask = np.zeros((used, width), np.float32)
  positions = np.zeros((used, width), np.int32)
  segments = np.zeros((used, width), np.int32)
  count = np.zeros(used, np.int32)
  for i in range(n):
    row, start = place[i]
    k = int(length[i])
    count[row] += 1
    out_tokens[row, start:start + k] = tokens[i, :k]
    out_mask[row, start:start + k] = mask[i, :k]
    positions[row, start:start + k] = np.arange(k)
    segments[row, start:start + k] = count[row]
  return SFTRows(*(jnp.asarray(x) for x in (out_tokens, out_mask, positions, segments)))
