"""Token-level text machinery that runs inside jit, built from a tokenizer at set-up.

* `ByteTable`: the bytes of every token id, so generated token ids become a fixed-capacity byte
  buffer on device (`tokens_to_bytes`); action parsers then work on bytes, the common ground of
  every tokenizer. Host reference parsers work on `host_reply_bytes(tokenizer, ids)`, the same raw
  bytes, which equal `tokenizer.decode(ids).encode()` whenever the reply is valid UTF-8 (and keep
  the raw bytes where decoding would put replacement characters).
* Byte-pattern helpers: `match_at`, `first_block` (the leftmost `<tag>...</tag>`, like the regex
  `<tag>(.*?)</tag>`), `strip_span`, `word_hashes` (lower-cased alphanumeric words, hashed).
* `FragmentTable` + `concat_segments`: rendering is a concatenation of pre-encoded text fragments
  chosen by index, written into a fixed-capacity token buffer.
* `ChatMarkup`: the chat-template text around user messages and the assistant generation prompt.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.compile_cache import to_device
from tree_rl.models.tokenizers import BuiltinTokenizer, Tokenizer

WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() removes
_P1, _P2 = 1000003, 16777619      # odd multipliers of the two 32-bit polynomial word hashes
_LEN_MIX = 0x9E3779B1


# ---------------------------------------------------------------- token ids -> bytes

def _byte_level_decoder() -> dict[str, int]:
  """The inverse of GPT-2's byte-to-unicode map used by byte-level BPE vocabularies."""
  bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  cs, n = bs[:], 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
  """The bytes each token id stands for, so that decoding = concatenating (for valid UTF-8)."""
  if isinstance(tokenizer, BuiltinTokenizer):
    out = []
    for i in range(tokenizer.vocab_size):
      try:
        p = tokenizer.piece(i)
      except IndexError:
        p = b""
      out.append(p if isinstance(p, bytes) else p.encode("utf-8"))
    return out
  hf = getattr(tokenizer, "_tok", None)
  if hf is None:
    return [tokenizer.decode([i]).encode("utf-8") for i in range(tokenizer.vocab_size)]
  pieces = hf.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
  special = set(hf.all_special_tokens) | set(getattr(hf, "added_tokens_encoder", {}))
  inv = _byte_level_decoder()
  byte_level = all(p is None or p in special or all(ch in inv for ch in p) for p in pieces)
  out = []
  for i, p in enumerate(pieces):
    if p is None:
      out.append(b"")
    elif p in special:
      out.append(p.encode("utf-8"))
    elif byte_level:
      out.append(bytes(inv[ch] for ch in p))
    elif len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
      out.append(bytes([int(p[3:5], 16)]))
    else:  # sentencepiece-style pieces
      out.append(p.replace("\u2581", " ").encode("utf-8"))
  return out


@functools.lru_cache(maxsize=8)
def _token_bytes_of(tokenizer: Tokenizer) -> tuple[bytes, ...]:
  return tuple(token_bytes(tokenizer))


def host_reply_bytes(tokenizer: Tokenizer, ids, max_bytes: int | None = None) -> bytes:
  """Host reference of `tokens_to_bytes`: the raw bytes of `ids` (ids outside the vocabulary
  stand for none), the first `max_bytes` of them."""
  table = _token_bytes_of(tokenizer)
  out = b"".join(table[int(i)] for i in ids if 0 <= int(i) < len(table))
  return out if max_bytes is None else out[:max_bytes]


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class ByteTable:
  """Flat bytes of all token ids: token t is flat[offsets[t] : offsets[t] + lengths[t]]."""
  flat: jax.Array
  offsets: jax.Array
  lengths: jax.Array

  @classmethod
  def from_tokenizer(cls, tokenizer: Tokenizer) -> "ByteTable":
    pieces = token_bytes(tokenizer)
    lengths = np.array([len(p) for p in pieces], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    flat = np.frombuffer(b"".join(pieces) + b"\0", np.uint8)
    return cls(to_device(flat), to_device(offsets), to_device(lengths))

  def tree_flatten(self):
    return (self.flat, self.offsets, self.lengths), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(*children)


def tokens_to_bytes(table: ByteTable, tokens: jax.Array, length: jax.Array, max_bytes: int
                    ) -> tuple[jax.Array, jax.Array]:
  """The first `max_bytes` bytes of tokens[:length] -> (int32[max_bytes] zero-padded, n_bytes).

  Ids outside the vocabulary stand for no bytes.
  """
  tokens = jnp.asarray(tokens, jnp.int32)
  vocab = table.lengths.shape[0]
  in_vocab = (tokens >= 0) & (tokens < vocab)
  ids = jnp.where(in_vocab, tokens, 0)
  t = tokens.shape[0]
  lens = jnp.where((jnp.arange(t) < length) & in_vocab, table.lengths[ids], 0)
  ends = jnp.cumsum(lens)
  starts = ends - lens
  p = jnp.arange(max_bytes)
  # token holding byte p = (number of tokens starting at or before p) - 1; zero-length tokens sharing
  # a start come before the token that covers it, so the count lands on the covering one
  starts_hist = jnp.zeros((max_bytes + 1,), jnp.int32).at[jnp.minimum(starts, max_bytes)].add(1)
  j = jnp.clip(jnp.cumsum(starts_hist)[:max_bytes] - 1, 0, t - 1)
  src = table.offsets[ids[j]] + p - starts[j]
  n = jnp.minimum(ends[-1], max_bytes)
  buf = jnp.where(p < n, table.flat[jnp.clip(src, 0, table.flat.shape[0] - 1)], 0)
  return buf.astype(jnp.int32), n


# ---------------------------------------------------------------- byte patterns

def match_at(buf: jax.Array, n: jax.Array, pattern: bytes) -> jax.Array:
  """bool[N]: pattern occurs at position p, entirely inside buf[:n]."""
  size = buf.shape[0]
  ok = jnp.arange(size) + len(pattern) <= n
  for i, b in enumerate(pattern):
    shifted = jnp.concatenate([buf[i:], jnp.zeros((i,), buf.dtype)]) if i else buf
    ok = ok & (shifted == b)
  return ok


def first_block(buf, n, open_tag: bytes, close_tag: bytes):
  """The leftmost `open_tag ... close_tag` with the nearest close (regex `open(.*?)close`).

  Returns (found, open_pos, content_start, content_end); positions are len(buf) when not found.
  """
  size = buf.shape[0]
  pos = jnp.arange(size)
  om, cm = match_at(buf, n, open_tag), match_at(buf, n, close_tag)
  last_close = jnp.max(jnp.where(cm, pos, -1))
  o = jnp.min(jnp.where(om & (pos + len(open_tag) <= last_close), pos, size))
  found = o < size
  c = jnp.min(jnp.where(cm & (pos >= o + len(open_tag)), pos, size))
  return found, o, jnp.where(found, o + len(open_tag), size), jnp.where(found, c, size)


def is_space(buf):
  ws = jnp.zeros_like(buf, dtype=bool)
  for b in WHITESPACE:
    ws = ws | (buf == b)
  return ws


def strip_span(buf, start, end):
  """(first, last+1) of the non-whitespace bytes of buf[start:end]; (end, end) if none."""
  pos = jnp.arange(buf.shape[0])
  keep = (pos >= start) & (pos < end) & ~is_space(buf)
  first = jnp.min(jnp.where(keep, pos, end))
  last = jnp.max(jnp.where(keep, pos + 1, 0))
  return first, jnp.maximum(last, first)


def is_letter(buf):
  return ((buf >= 65) & (buf <= 90)) | ((buf >= 97) & (buf <= 122))


def _pow_table(base: int, size: int) -> np.ndarray:
  out = np.ones(size, np.uint64)
  for i in range(1, size):
    out[i] = (out[i - 1] * base) % (1 << 32)
  return out.astype(np.uint32)


def word_hashes(buf, start, end, max_words: int):
  """Words of buf[start:end] (maximal runs of ASCII letters/digits or bytes >= 128, lower-cased).

  Returns (uint32[max_words, 2] hashes, n_words); words past max_words are dropped, unused rows 0.
  """
  size = buf.shape[0]
  pos = jnp.arange(size)
  low = jnp.where((buf >= 65) & (buf <= 90), buf + 32, buf)
  wc = ((pos >= start) & (pos < end)
        & (((low >= 97) & (low <= 122)) | ((low >= 48) & (low <= 57)) | (low >= 128)))
  wstart = wc & ~jnp.concatenate([jnp.zeros((1,), bool), wc[:-1]])
  wid = jnp.cumsum(wstart) - 1
  rel = pos - jax.lax.cummax(jnp.where(wstart, pos, 0))
  b = low.astype(jnp.uint32)
  onehot = wc[:, None] & (wid[:, None] == jnp.arange(max_words)[None])
  lens = jnp.sum(onehot, 0).astype(jnp.uint32)
  out = []
  for base in (_P1, _P2):
    h = b * jnp.asarray(_pow_table(base, size))[rel]
    out.append(jnp.sum(jnp.where(onehot, h[:, None], jnp.uint32(0)), 0) + lens * jnp.uint32(_LEN_MIX))
  hashes = jnp.where((lens > 0)[:, None], jnp.stack(out, -1), jnp.uint32(0))
  return hashes, jnp.minimum(jnp.sum(wstart), max_words)


def host_word_hash(word: bytes) -> tuple[int, int]:
  """The hash `word_hashes` gives a lower-cased word, computed on the host (for tables)."""
  out = []
  for base in (_P1, _P2):
    h, p = 0, 1
    for b in word:
      h = (h + b * p) % (1 << 32)
      p = (p * base) % (1 << 32)
    out.append((h + len(word) * _LEN_MIX) % (1 << 32))
  return tuple(out)


# ---------------------------------------------------------------- rendering

@dataclasses.dataclass(frozen=True)
class FragmentTable:
  """Encoded text fragments padded to one width: tokens int32[F, W], lengths int32[F]."""
  texts: tuple[str, ...]
  tokens: np.ndarray
  lengths: np.ndarray

  @classmethod
  def build(cls, tokenizer: Tokenizer, texts: Sequence[str], pad_id: int = 0) -> "FragmentTable":
    enc = [tokenizer.encode(t) if t else [] for t in texts]
    width = max(1, max(len(e) for e in enc))
    tokens = np.full((len(enc), width), pad_id, np.int32)
    for i, e in enumerate(enc):
      tokens[i, :len(e)] = e
    return cls(tuple(texts), tokens, np.array([len(e) for e in enc], np.int32))

  @property
  def width(self) -> int:
    return self.tokens.shape[1]

  def max_length(self) -> int:
    return int(self.lengths.max())


def concat_segments(groups, capacity: int, pad_id: int) -> tuple[jax.Array, jax.Array]:
  """Concatenate segment groups, in order, into (int32[capacity] tokens, length).

  `groups` is a list of (tokens int32[S, W], lengths int32[S]); widths may differ per group so a
  table of short fragments (grid cells) is not padded to the width of long ones.
  """
  all_lens = jnp.concatenate([jnp.reshape(l, (-1,)) for _, l in groups])
  starts_all = jnp.cumsum(all_lens) - all_lens
  out = jnp.full((capacity,), pad_id, jnp.int32)
  first = 0
  for toks, lens in groups:
    toks = jnp.reshape(toks, (-1, toks.shape[-1]))
    s, w = toks.shape
    lens = jnp.reshape(lens, (-1,))
    starts = starts_all[first:first + s]
    first += s
    col = jnp.arange(w)[None]
    idx = jnp.where(col < lens[:, None], starts[:, None] + col, capacity)
    out = out.at[idx.reshape(-1)].set(toks.reshape(-1), mode="drop", unique_indices=True)
  return out, jnp.minimum(jnp.sum(all_lens), capacity)


@dataclasses.dataclass(frozen=True)
class ChatMarkup:
  """Chat-template text around user messages, read off `tokenizer.render_chat`.

  first turn:  prompt_prefix + content + gen_suffix
  later turns: (between_open | between_closed) + content + gen_suffix, where `between_closed` is used
  when the agent's reply already ended with the end-of-turn token.
  """
  prompt_prefix: str
  gen_suffix: str
  between_open: str
  between_closed: str

  @classmethod
  def from_tokenizer(cls, tokenizer: Tokenizer) -> "ChatMarkup":
    u1, a1, u2 = "@@USER_ONE@@", "@@AGENT_ONE@@", "@@USER_TWO@@"
    t1 = tokenizer.render_chat([{"role": "user", "content": u1}], add_generation_prompt=True)
    t3 = tokenizer.render_chat([{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                                {"role": "user", "content": u2}], add_generation_prompt=True)
    prefix, suffix = t1.split(u1)
    between = t3[t3.index(a1) + len(a1):t3.index(u2)]
    eot = tokenizer.decode([tokenizer.end_of_turn_id])
    closed = between[len(eot):] if eot and between.startswith(eot) else between
    return cls(prefix, t3[t3.index(u2) + len(u2):], between, closed)
