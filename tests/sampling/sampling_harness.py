"""A thin driver over the sampler that mirrors every sequence as a Python token list."""

import jax
import numpy as np

from tree_rl import sampling

B = 4          # rows per call (fixed so each operation compiles once)
T = 12         # prefill chunk width
MAX_NEW = 8


class Driver:

  def __init__(self, model, *, max_seqs=8, num_pages=64, page_size=4, max_pages_per_seq=16,
               attention="reference", mesh=None):
    self.cache = sampling.init_cache(model, max_seqs=max_seqs, num_pages=num_pages, page_size=page_size,
                                     max_pages_per_seq=max_pages_per_seq, kv_dtype="float32", mesh=mesh)
    self.seqs = {}
    self.attention = attention

  def _pad(self, rows, fill=0):
    rows = list(rows)
    assert len(rows) <= B
    return np.array(rows + [fill] * (B - len(rows)), np.int32), np.arange(B) < len(rows)

  def prefill(self, chunks, **kw):
    """chunks: {slot: token list}."""
    slots, valid = self._pad(chunks)
    toks = np.zeros((B, T), np.int32)
    lens = np.zeros(B, np.int32)
    for i, c in enumerate(chunks.values()):
      toks[i, :len(c)] = c
      lens[i] = len(c)
    self.cache, out = sampling.prefill(self.cache, slots, toks, lens, valid, **kw)
    status = np.asarray(out.status)
    for i, (s, c) in enumerate(chunks.items()):
      if status[i] == sampling.Status.OK:
        self.seqs[s] = self.seqs.get(s, []) + list(c)
    return out

  def fork(self, pairs):
    """pairs: list of (parent, child)."""
    par, valid = self._pad([p for p, _ in pairs])
    chi, _ = self._pad([c for _, c in pairs])
    self.cache, status = sampling.fork(self.cache, par, chi, valid)
    status = np.asarray(status)
    for i, (p, c) in enumerate(pairs):
      if status[i] == sampling.Status.OK:
        self.seqs[c] = list(self.seqs[p])
    return status

  def decode(self, slots, key=0, max_tokens=None, **kw):
    rows, valid = self._pad(slots)
    mt = None
    if max_tokens is not None:
      mt, _ = self._pad(max_tokens, fill=MAX_NEW)
    if kw.get("budget") is not None:
      kw["budget"], _ = self._pad(kw["budget"], fill=MAX_NEW)
    kw.setdefault("temperature", 0.0)
    kw.setdefault("attention", self.attention)
    before = {s: list(self.seqs[s]) for s in slots if s in self.seqs}
    self.cache, out = sampling.decode(self.cache, rows, jax.random.key(key), max_new=MAX_NEW,
                                      max_tokens=mt, valid=valid, **kw)
    toks, lps, lens = (np.asarray(x) for x in (out.tokens, out.logprobs, out.lengths))
    result = {}
    for i, s in enumerate(slots):
      new = toks[i, :lens[i]].tolist()
      assert (toks[i, lens[i]:] == -1).all()
      if s in self.seqs:
        self.seqs[s] = self.seqs[s] + new
      result[s] = (before.get(s, []), new, lps[i, :lens[i]])
    return out, result

  def release(self, slots):
    slots = list(slots)
    for i in range(0, len(slots), B):
      rows, valid = self._pad(slots[i:i + B])
      self.cache = sampling.release(self.cache, rows, valid)
    for s in slots:
      self.seqs.pop(s, None)
