"""A tool that lives outside JAX (a Python function, e.g. a real search client) called from jit.

`ExternalTool(fn, tokenizer)` wraps `fn(query: str) -> list[str]` with
`jax.experimental.io_callback`: the query arrives as UTF-8 bytes, the results come back as token
ids of "result\\n" lines in a fixed-capacity buffer (truncated to `capacity`). Under `vmap` JAX calls
the function once per batch element, in order. The call is skipped (empty result) where `active`
is false, so a batched step only queries for envs that actually searched.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback


class ExternalTool:

  def __init__(self, fn: Callable[[str], Sequence[str]], tokenizer, capacity: int = 128,
               max_results: int = 3):
    self.fn, self.tokenizer = fn, tokenizer
    self.capacity, self.max_results = capacity, max_results
    self.pad_id = tokenizer.pad_id

  def result_text(self, query: str) -> str:
    """The host text for a query: the first `max_results` results, one per line."""
    return "".join(f"{r}\n" for r in list(self.fn(query))[:self.max_results])

  def _host(self, text, length, active):
    out = np.full((self.capacity,), self.pad_id, np.int32)
    if not bool(active):
      return out, np.int32(0)
    query = bytes(np.asarray(text[:int(length)], np.uint8)).decode("utf-8", errors="replace")
    ids = self.tokenizer.encode(self.result_text(query))[:self.capacity]
    out[:len(ids)] = ids
    return out, np.int32(len(ids))

  def __call__(self, text: jax.Array, length: jax.Array, active: jax.Array):
    """(int32[capacity] result tokens, length) for the query bytes text[:length]."""
    shapes = (jax.ShapeDtypeStruct((self.capacity,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
    return io_callback(self._host, shapes, text, length, active, ordered=False)
