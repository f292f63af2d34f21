"""Demonstration episodes generated on device: one jitted call, vmapped over episodes.

An episode becomes one token sequence of fixed capacity `max_len`:

    prompt | reply_1 obs_1 | reply_2 obs_2 | ... | reply_n

Replies (the expert's text + end-of-turn token) get loss weight 1, prompt and observation tokens
0; with `loss_on_noise=False` the noisy replies get 0 too (their tokens stay in the context).
With `hard_turn_weight` w, the replies of turns taken where the right move needs the state read
(`Expert.hard` of the turn's state) weigh w instead of 1.
Tokens past `max_len` are dropped (`truncated`). The observation after the last turn is left out.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.compile_cache import light_jit, to_device
from tree_rl.warmstart.experts import Expert


@struct.dataclass
class Demos:
  tokens: jax.Array        # int32[N, L] padded with the tokenizer's pad id
  loss_mask: jax.Array     # float32[N, L] the loss weight: 1 (or hard_turn_weight) on trained
                           # reply tokens, 0 elsewhere
  reply_mask: jax.Array    # bool[N, L] every reply token (trained or not)
  length: jax.Array        # int32[N] tokens kept
  prompt_len: jax.Array    # int32[N]
  rows: jax.Array          # int32[N, T] expert reply row per turn (-1: no turn)
  intended: jax.Array      # int32[N, T] the noiseless expert's row per turn (-1: no turn)
  noisy: jax.Array         # bool[N, T]
  turns: jax.Array         # int32[N] turns taken
  reward: jax.Array        # float32[N] episode return
  success: jax.Array       # bool[N]
  truncated: jax.Array     # bool[N] the episode did not fit in L tokens
  hard: jax.Array          # bool[N] it starts where the right move needs the state read
                           # (`Expert.hard`; False for an expert without it)


class ReplyTable:
  """The expert's replies as tokens: row r is encode(reply_texts[r]) + [end_of_turn_id]."""

  def __init__(self, expert: Expert, tokenizer, min_width: int = 1):
    enc = [tokenizer.encode(t) + [tokenizer.end_of_turn_id] for t in expert.reply_texts]
    width = max(min_width, max(len(e) for e in enc))
    tokens = np.full((len(enc), width), tokenizer.pad_id, np.int32)
    for i, e in enumerate(enc):
      tokens[i, :len(e)] = e
    self.tokens = to_device(tokens)
    self.lengths = to_device([len(e) for e in enc], np.int32)
    self.width = width
    self.max_length = max(len(e) for e in enc)


def _write(buf, start, tokens, n):
  """buf with tokens[:n] written at start (positions past the end are dropped)."""
  w = tokens.shape[0]
  idx = jnp.where(jnp.arange(w) < n, start + jnp.arange(w), buf.shape[0])
  return buf.at[idx].set(tokens.astype(buf.dtype), mode="drop")


def _span(size, start, n):
  pos = jnp.arange(size)
  return (pos >= start) & (pos < start + n)


def _hard(expert, state) -> jax.Array:
  return expert.hard(state) if hasattr(expert, "hard") else jnp.bool_(False)


def episode(env, expert: Expert, table: ReplyTable, key, params, *, max_len: int, max_turns: int,
            pad_id: int, loss_on_noise: bool, hard_turn_weight: float = 1.0) -> Demos:
  """One demonstration episode (unbatched); vmap over keys for a batch."""
  k_reset, k_run = jax.random.split(key)
  state, _ = env.reset(k_reset, params)
  hard = _hard(expert, state)
  prompt, plen = env.initial_prompt_tokens(state, params)
  tokens = _write(jnp.full((max_len,), pad_id, jnp.int32), 0, prompt, plen)
  zeros = jnp.zeros((max_len,), bool)

  def turn(carry, k):
    state, tokens, train, reply, pos, ret = carry
    active = ~state.done
    k_act, k_step = jax.random.split(k)
    row, noisy, intended = expert.act(k_act, state, params)
    rtoks, rlen = table.tokens[row], table.lengths[row]
    action = env.parse_action(rtoks, rlen)
    new, _, r, done, _ = env.step(k_step, state, action, params)
    rlen = jnp.where(active, rlen, 0)
    tokens = _write(tokens, pos, rtoks, rlen)
    span = _span(max_len, pos, rlen)
    reply = reply | span
    weight = jnp.where(_hard(expert, state), jnp.float32(hard_turn_weight), jnp.float32(1.0))
    train = jnp.where(span & (loss_on_noise | ~noisy), weight, train)
    pos = pos + rlen
    obs, olen = env.observation_tokens(new, True, params)
    olen = jnp.where(active & ~done, olen, 0)
    tokens = _write(tokens, pos, obs, olen)
    pos = pos + olen
    out = (jnp.where(active, row, -1), jnp.where(active, intended, -1), active & noisy)
    return (new, tokens, train, reply, pos, ret + jnp.where(active, r, 0.0)), out

  init = (state, tokens, jnp.zeros((max_len,), jnp.float32), zeros, plen.astype(jnp.int32),
          jnp.float32(0))
  (state, tokens, train, reply, pos, ret), (rows, intended, noisy) = jax.lax.scan(
      turn, init, jax.random.split(k_run, max_turns))
  return Demos(tokens=tokens, loss_mask=train, reply_mask=reply,
               length=jnp.minimum(pos, max_len), prompt_len=jnp.minimum(plen, max_len).astype(jnp.int32),
               rows=rows, intended=intended, noisy=noisy, turns=state.turns.astype(jnp.int32),
               reward=ret, success=expert.success(state), truncated=pos > max_len, hard=hard)


class DemoGenerator:
  """`gen(key, num_episodes) -> Demos`, jitted once per episode count."""

  def __init__(self, env, tokenizer, expert: Expert, *, max_len: int, loss_on_noise: bool = False,
               hard_turn_weight: float = 1.0, params: Any = None):
    if max_len < 2:
      raise ValueError(f"warmstart.max_len must be >= 2, got {max_len}")
    if hard_turn_weight != 1.0 and not hasattr(expert, "hard"):
      raise ValueError(f"warmstart.hard_turn_weight={hard_turn_weight} needs an on-device expert "
                       f"with hard(state); {type(expert).__name__} has none")
    self.env, self.expert, self.tokenizer = env, expert, tokenizer
    self.params = env.default_params if params is None else params
    self.table = ReplyTable(expert, tokenizer, getattr(env, "max_reply_tokens", 1))
    self.max_turns = int(self.params.max_turns)
    self.max_len = max_len
    self._one = lambda key, params: episode(
        env, expert, self.table, key, params, max_len=max_len, max_turns=self.max_turns,
        pad_id=tokenizer.pad_id, loss_on_noise=loss_on_noise, hard_turn_weight=hard_turn_weight)
    self._batch = light_jit(lambda key, n, params: jax.vmap(self._one, in_axes=(0, None))(
        jax.random.split(key, n), params), static_argnums=(1,))

  def reply_text(self, row: int) -> str:
    """The text of reply `row` as it appears in a sequence (with the end-of-turn token)."""
    return self.expert.reply_texts[row] + self.tokenizer.decode([self.tokenizer.end_of_turn_id])

  def __call__(self, key, num_episodes: int) -> Demos:
    return self._batch(key, int(num_episodes), self.params)
