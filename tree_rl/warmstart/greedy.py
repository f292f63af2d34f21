"""Greedy first replies of a policy to demo prompts, and how often they match the expert; the
teacher-forced first token of every turn.

A small dense decode (the whole buffer recomputed per token), meant for tests and quick checks
of the warm start on short replies, not for rollouts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tree_rl.warmstart.demos import DemoGenerator, Demos


def greedy_replies(graphdef, params, rest, prompts, prompt_len, num_tokens: int, stop_ids):
  """(int32[B, num_tokens] reply, int32[B] length incl. the stop token) after each prompt.

  prompts int32[B, P] left-aligned with lengths prompt_len; jittable.
  """
  model = nnx.merge(graphdef, params, rest)
  b, p = prompts.shape
  buf = jnp.concatenate([prompts, jnp.zeros((b, num_tokens), prompts.dtype)], 1)
  rows = jnp.arange(b)
  stops = jnp.asarray(stop_ids, jnp.int32)

  def body(i, carry):
    buf, length, done = carry
    logits = model(buf)
    nxt = jnp.argmax(logits[rows, prompt_len + i - 1], -1).astype(buf.dtype)
    write = ~done
    buf = buf.at[rows, prompt_len + i].set(jnp.where(write, nxt, buf[rows, prompt_len + i]))
    length = length + write
    return buf, length, done | jnp.any(nxt[:, None] == stops[None], -1)

  init = (buf, jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
  buf, length, _ = jax.lax.fori_loop(0, num_tokens, body, init)
  reply = jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (num_tokens,)))(buf, prompt_len)
  return reply, length


def first_move_accuracy(model: nnx.Module, params: nnx.State, demos: Demos, gen: DemoGenerator,
                        num_tokens: int | None = None) -> tuple[float, jax.Array, jax.Array]:
  """Fraction of demo first turns where the parsed greedy reply equals the parsed intended
  (noiseless) expert reply; also returns the replies and their lengths."""
  ok, reply, length = first_move_hits(model, params, demos, gen, num_tokens)
  return float(jnp.mean(ok)), reply, length


def first_move_hits(model: nnx.Module, params: nnx.State, demos: Demos, gen: DemoGenerator,
                    num_tokens: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
  """bool[N]: whether each demo's parsed greedy first reply equals the parsed intended
  (noiseless) expert reply; also the replies and their lengths."""
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)
  env, table = gen.env, gen.table
  num_tokens = num_tokens or table.max_length
  p = int(jnp.max(demos.prompt_len))
  width = table.width

  @jax.jit
  def run(params, tokens, plen, intended):
    reply, length = greedy_replies(graphdef, params, rest, tokens[:, :p], plen, num_tokens,
                                   gen.tokenizer.stop_ids)
    n = min(num_tokens, width)
    buf = jnp.zeros((reply.shape[0], width), jnp.int32).at[:, :n].set(reply[:, :n])
    got = jax.vmap(env.parse_action)(buf, jnp.minimum(length, width))
    want = jax.vmap(env.parse_action)(table.tokens[intended], table.lengths[intended])
    same = jax.tree.map(lambda a, b: jnp.all((a == b).reshape(a.shape[0], -1), -1), got, want)
    return jnp.all(jnp.stack(jax.tree.leaves(same)), 0), reply, length

  return run(params, demos.tokens, demos.prompt_len, demos.intended[:, 0])


def turn_hits(model: nnx.Module, params: nnx.State, demos: Demos, max_turns: int,
              batch: int = 64) -> tuple[np.ndarray, np.ndarray]:
  """Teacher-forced: (bool[N, max_turns] whether the argmax at each turn's first reply token is
  the demo's token, bool[N, max_turns] whether that turn is in the sequence). Measures every
  turn at its own context length, cheaply (one forward pass per `batch` demos)."""
  graphdef, _, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def run(params, tokens, reply):
    logits = nnx.merge(graphdef, params, rest)(tokens)
    guess = jnp.argmax(logits[:, :-1], -1) == tokens[:, 1:]
    first = reply[:, 1:] & ~reply[:, :-1]                       # a reply's first token
    turn = jnp.cumsum(first, -1) - 1
    onehot = first[..., None] & (turn[..., None] == jnp.arange(max_turns))
    return jnp.any(onehot & guess[..., None], 1), jnp.any(onehot, 1)

  out = [run(params, demos.tokens[i:i + batch], demos.reply_mask[i:i + batch])
         for i in range(0, demos.tokens.shape[0], batch)]
  return tuple(np.concatenate([np.asarray(o[j]) for o in out]) for j in (0, 1))
