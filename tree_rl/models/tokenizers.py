"""Tokenizers behind one small interface: a local HF tokenizer, or the built-in one.

The built-in tokenizer needs no download: special tokens, a fixed list of whole-word pieces
for the FrozenLake and tool-call texts, and a byte fallback, so every string round-trips. It is
a `tokenizers.Tokenizer` (the pieces are added tokens, matched leftmost-longest; everything
between them is one byte-level token per byte, a BPE model without merges), so encoding is
greedy longest match, identical on every machine, and `hf_tokenizer()` saves it with its ChatML
chat template in a form transformers loads back (also as the Qwen2 tokenizer an exported
checkpoint's config selects).
"""

from __future__ import annotations

import abc
from typing import Sequence

Message = dict  # {"role": ..., "content": ...}

SPECIALS = ("<pad>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
WORDS = (
    # chat roles and markup
    "system", "user", "assistant", "\n", "\n\n", " ", "```",
    # FrozenLake
    "Up", "Down", "Left", "Right", " Up", " Down", " Left", " Right", "||", " || ",
    "P", "_", "O", "G", "X", "V", "You", " are", " on", " a", " frozen", " lake", " grid", ".",
    " Reach", " the", " goal", " G", " without", " falling", " into", " hole", " O", " player", " P",
    " Move", " move", ":", " steps", " step", " left", " remaining", "Remaining", "Action",
    " fell", " reached", " Invalid", " action", "Invalid", " You", "Map", "map", ",",
    # tool use / QA
    "<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>",
    "<information>", "</information>", "Question", " Question", "Answer", " answer", " search",
    " of", " is", " was", " what", "What", " who", "Who", " in", " by", " to", "?", "'s", " and",
    "Fact", " fact", "Tool", " calls", " call", " no", "No", " results", " result", "Use",
    " born", " capital", " founded", " located", " works", " for", " city", " country", " company",
    " person", " river", " mother", " father", " spouse", " author", " director",
)
_RESERVED_TO = 512  # vocabulary padded to a round size with unused reserved tokens


class Tokenizer(abc.ABC):
  """encode/decode text, special ids, and chat rendering."""

  vocab_size: int
  eos_id: int
  end_of_turn_id: int
  pad_id: int

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    ...

  @abc.abstractmethod
  def decode(self, ids: Sequence[int]) -> str:
    ...

  @abc.abstractmethod
  def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
    ...

  def encode_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
    return self.encode(self.render_chat(messages, add_generation_prompt))

  def fingerprint(self) -> str:
    """A digest of the id -> text mapping: checkpoints record it, so a policy is never resumed
    or evaluated with a tokenizer whose ids mean other tokens."""
    import hashlib
    text = "\x00".join(self.decode([i]) for i in range(self.vocab_size))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """Token ids that end an agent turn."""
    return tuple(sorted({self.eos_id, self.end_of_turn_id}))


def _chatml(messages: Sequence[Message], add_generation_prompt: bool) -> str:
  text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def _checked_ids(ids: Sequence[int], vocab_size: int) -> list[int]:
  ids = [int(i) for i in ids]
  bad = [i for i in ids if not 0 <= i < vocab_size]
  if bad:
    raise ValueError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
  return ids


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _byte_symbols() -> list[str]:
  """The byte-level BPE alphabet (GPT-2's): byte b -> one printable character."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
  out, extra = {}, 0
  for b in range(256):
    if b in keep:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return [out[b] for b in range(256)]


class BuiltinTokenizer(Tokenizer):
  """Specials, whole-word pieces, then the 256 bytes; ChatML chat format.

  A single-byte piece would only duplicate its byte token, so pieces are the specials and the
  words of two or more bytes; everything else is one token per UTF-8 byte. The `tokenizers`
  form is byte-level BPE without merges plus the pieces as added tokens, the layout
  transformers' Qwen2 tokenizer reads back unchanged.
  """

  def __init__(self, extra_words: Sequence[str] = ()):
    from tokenizers import AddedToken, Tokenizer as Core, decoders, models, pre_tokenizers

    words = [w for w in dict.fromkeys(list(WORDS) + list(extra_words))
             if w not in SPECIALS and len(w.encode("utf-8")) > 1]
    pieces = list(SPECIALS) + words
    self._pieces: list[str | bytes] = pieces + [bytes([b]) for b in range(256)]
    self._byte_offset = len(pieces)
    vocab = {p: i for i, p in enumerate(pieces)}
    vocab.update({c: len(pieces) + b for b, c in enumerate(_byte_symbols())})
    core = Core(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in words])
    self.core = core
    self.vocab_size = max(_RESERVED_TO, -(-len(self._pieces) // 64) * 64)
    self.pad_id, self.eos_id = 0, 1
    self.end_of_turn_id = vocab["<|im_end|>"]

  def encode(self, text: str) -> list[int]:
    return self.core.encode(text, add_special_tokens=False).ids

  def hf_tokenizer(self):
    """This tokenizer as a `transformers.PreTrainedTokenizerFast` (for `save_pretrained`)."""
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=self.core, eos_token="<|endoftext|>",
                                  pad_token="<pad>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.chat_template = CHATML_TEMPLATE
    return tok

  def decode(self, ids: Sequence[int]) -> str:
    """Text of `ids`; ids past the pieces but inside the (padded) vocabulary are unused and stand
    for no text; an id outside [0, vocab_size) raises."""
    ids = _checked_ids(ids, self.vocab_size)
    out, pending = [], bytearray()
    for i in ids:
      piece = self._pieces[i] if i < len(self._pieces) else ""
      if isinstance(piece, bytes):
        pending.extend(piece)
        continue
      if pending:
        out.append(pending.decode("utf-8", errors="replace"))
        pending = bytearray()
      out.append(piece)
    if pending:
      out.append(pending.decode("utf-8", errors="replace"))
    return "".join(out)

  def piece(self, token_id: int) -> str | bytes:
    return self._pieces[token_id]

  def render_chat(self, messages, add_generation_prompt=True):
    return _chatml(messages, add_generation_prompt)


class HFTokenizer(Tokenizer):
  """A local HF tokenizer directory (no download, no remote code)."""

  def __init__(self, path: str, end_of_turn: str | None = None):
    from transformers import AutoTokenizer
    self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    self.vocab_size = len(self._tok)
    if self._tok.eos_token_id is None:
      raise ValueError(f"tokenizer in {path} defines no eos token")
    self.eos_id = self._tok.eos_token_id
    eot = end_of_turn or ("<|im_end|>" if "<|im_end|>" in self._tok.get_vocab() else None)
    self.end_of_turn_id = self._tok.convert_tokens_to_ids(eot) if eot else self.eos_id
    self.pad_id = self._tok.pad_token_id if self._tok.pad_token_id is not None else self.eos_id

  def encode(self, text):
    return self._tok.encode(text, add_special_tokens=False)

  def hf_tokenizer(self):
    """The underlying transformers tokenizer (for `save_pretrained`)."""
    return self._tok

  def fingerprint(self) -> str:
    import hashlib
    items = sorted((i, t) for t, i in self._tok.get_vocab().items())
    return hashlib.sha256(repr(items).encode("utf-8")).hexdigest()[:16]

  def decode(self, ids):
    return self._tok.decode(_checked_ids(ids, self.vocab_size), skip_special_tokens=False)

  def render_chat(self, messages, add_generation_prompt=True):
    if self._tok.chat_template:
      return self._tok.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
    return _chatml(messages, add_generation_prompt)


def make_tokenizer(kind: str = "builtin", path: str = "") -> Tokenizer:
  """The tokenizer named by config.tokenizer: kind 'builtin' or 'hf' (path to a local directory)."""
  if kind == "builtin":
    return BuiltinTokenizer()
  if kind == "hf":
    if not path:
      raise ValueError("config.tokenizer.path must name a local HF tokenizer directory when kind='hf'")
    return HFTokenizer(path)
  raise ValueError(f"unknown config.tokenizer.kind {kind!r}; known: builtin, hf")
