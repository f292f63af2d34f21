"""Guess-the-number as a token env: the prompt and answers as text, replies parsed to a digit.

    first message   "Guess my number from 0 to 9. Reply with one digit."
    later messages  "Higher." / "Lower." / "Correct." / "Reply with one digit."
    a reply         its last digit is the guess; none: an invalid turn
"""

from __future__ import annotations

import jax.numpy as jnp

from tree_rl.compile_cache import to_device
from tree_rl.envs import text as tx
from tree_rl.envs.base import TokenEnv
from tree_rl.envs.guessnumber import dynamics as dyn

ANSWERS = {dyn.START: "", dyn.HIGHER: "Higher.", dyn.LOWER: "Lower.", dyn.CORRECT: "Correct.",
           dyn.NO_DIGIT: "Reply with one digit."}


def intro(max_secret: int) -> str:
  return f"Guess my number from 0 to {max_secret}. Reply with one digit."


class GuessNumber(TokenEnv):
  """`GuessNumber(preset="default", tokenizer=None, max_turns=5, max_secret=9)`; the token
  methods need a tokenizer."""

  name = "guessnumber"

  def __init__(self, preset: str = "default", tokenizer=None, max_turns: int = 5,
               max_reply_tokens: int = 8, max_secret: int = 9):
    if preset != "default":
      raise ValueError(f"unknown guessnumber preset {preset!r} (config.env.preset); "
                       "known: ['default']")
    if not 1 <= int(max_secret) <= 9:
      raise ValueError(f"guessnumber max_secret must be in [1, 9] (one digit), got {max_secret}")
    del max_reply_tokens   # the parser reads the whole reply buffer
    self.max_secret = int(max_secret)
    self._params = dyn.GuessParams(max_secret=to_device(self.max_secret, "int32"),
                                   max_turns=to_device(int(max_turns), "int32"))
    self.tokenizer = tokenizer
    if tokenizer is not None:
      self._build_text(tokenizer)

  def _build_text(self, tokenizer):
    """Encode every fragment once: chat markup, the intro and the answers."""
    m = tx.ChatMarkup.from_tokenizer(tokenizer)
    texts = [m.prompt_prefix, m.between_open, m.between_closed, m.gen_suffix,
             intro(self.max_secret)] + [ANSWERS[a] for a in sorted(ANSWERS)]
    self._pad = tokenizer.pad_id
    self._frag = tx.FragmentTable.build(tokenizer, texts, self._pad)
    self._bytes = tx.ByteTable.from_tokenizer(tokenizer)
    n = self._frag.lengths
    self._prompt_capacity = int(n[0] + n[4] + n[3])
    self._obs_capacity = int(max(n[1], n[2]) + n[5:].max() + n[3])

  @property
  def default_params(self) -> dyn.GuessParams:
    return self._params

  def reset(self, key, params=None):
    state = dyn.reset(key, self._params if params is None else params)
    return state, state.answer

  def step(self, key, state, action, params=None):
    del key
    return dyn.transition(state, action, self._params if params is None else params)

  def _need_text(self):
    if self.tokenizer is None:
      raise ValueError("this GuessNumber was built without a tokenizer: "
                       "make('guessnumber', tokenizer=...)")

  def _render(self, fragments, capacity):
    self._need_text()
    ids = jnp.stack([jnp.asarray(i, jnp.int32) for i in fragments])
    tokens, lengths = jnp.asarray(self._frag.tokens), jnp.asarray(self._frag.lengths)
    return tx.concat_segments([(tokens[ids], lengths[ids])], capacity, self._pad)

  def initial_prompt_tokens(self, state, params=None):
    del state, params
    return self._render([0, 4, 3], self._prompt_capacity)

  def observation_tokens(self, state, turn_closed, params=None):
    del params
    return self._render([jnp.where(turn_closed, 2, 1), 5 + state.answer, 3], self._obs_capacity)

  def parse_action(self, tokens, length):
    """The reply's last digit (int32), INVALID if it has none."""
    self._need_text()
    buf, n = tx.tokens_to_bytes(self._bytes, tokens, length, 8 * tokens.shape[-1])
    pos = jnp.arange(buf.shape[0])
    last = jnp.max(jnp.where((buf >= 48) & (buf <= 57) & (pos < n), pos, -1))
    return jnp.where(last >= 0, buf[jnp.maximum(last, 0)] - 48, dyn.INVALID).astype(jnp.int32)
