"""Array digests for checkpoint integrity: a position-mixed checksum of every saved array.

`tree_digest(tree)` maps each array leaf (by its key path) to its dtype, shape and a 64-bit
checksum of its bits: on the host for arrays this process holds in full, on device (the same
uint32 arithmetic) for arrays sharded over several hosts. Every bit of an array enters at its
position: any single-bit change alters the digest, and a random change of more bits leaves it
equal with probability about 2^-64.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_WORD = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}


def _checksum(words, xp):
  """Two position-mixed uint32 sums of the words. x -> (x ^ mask_i) * odd_i is a bijection of
  uint32 at every position i, so flipping bit k of one word changes a sum by an odd multiple of
  2^k, never by 0 (mod 2^32)."""
  u = xp.uint32
  idx = xp.arange(words.shape[0], dtype=u)
  a = xp.sum((words ^ (idx * u(0x9E3779B9))) * (idx * u(2) + u(1)), dtype=u)
  b = xp.sum((words ^ (idx * u(0x85EBCA6B) + u(0x6A09E667)))
             * ((idx * u(0xC2B2AE34) + u(0x27D4EB2F)) | u(1)), dtype=u)
  return a, b


@jax.jit
def _device_checksum(x):
  words = jax.lax.bitcast_convert_type(x, _WORD[x.dtype.itemsize]).astype(jnp.uint32).reshape(-1)
  return jnp.stack(_checksum(words, jnp))


def array_digest(x) -> str:
  """"dtype[shape]:checksum" of one array (numpy or jax, any sharding)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if x.dtype == jnp.bool_:
      x = x.astype(jnp.uint8)
    a, b = _device_checksum(x) if x.size else (0, 0)
    dtype, shape = x.dtype, x.shape
  else:
    v = np.asarray(jax.device_get(x))
    dtype, shape = v.dtype, v.shape
    if v.dtype == np.bool_:
      v = v.astype(np.uint8)
    words = np.ascontiguousarray(v).reshape(-1).view(_WORD[v.dtype.itemsize]).astype(np.uint32)
    a, b = _checksum(words, np) if words.size else (0, 0)
  return f"{np.dtype(dtype).name}{list(shape)}:{int(a):08x}{int(b):08x}"


def tree_digest(tree) -> dict[str, str]:
  """{key path: array_digest} of every leaf of `tree`."""
  return {jax.tree_util.keystr(p): array_digest(leaf)
          for p, leaf in jax.tree_util.tree_leaves_with_path(tree)}
