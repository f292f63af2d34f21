"""Decode one agent turn for a batch of sequences in one `lax.while_loop` (one shard, jittable).

Attention of each new token reads three parts (see `attention.attend`):
  * shared: pages referenced by >= 2 rows of the batch at turn start (a full page is immutable,
    so this set is fixed for the whole turn), read once per step for all rows;
  * private: each row's other cached pages, gathered once per turn into a window of
    `window_pages` pages, or (window_kernel) read in place from the pool at every step by the
    Pallas kernel `paged_kernel.window_attention`;
  * turn: the keys/values of this turn's tokens, kept in a dense [B, max_new] buffer and
    written into freshly allocated pages when the turn ends.
With shared_pages=0 and window_pages=max_pages_per_seq this is the plain reference layout.
Pages a row will need are reserved step by step while decoding, so pool exhaustion stops that
row (reason OUT_OF_PAGES) before it could write anywhere.
"""

from __future__ import annotations

import enum
import functools

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl.sampling import cache as C
from tree_rl.sampling.attention import attend, gather_pages
from tree_rl.sampling.paged_kernel import pack_window, window_attention
from tree_rl.sampling.sample import listed_entropy, policy_entropy, sample

class StopReason(enum.IntEnum):
  """Why a decoded row stopped (`StopReason(code).name` names a code)."""

  NOT_RUN = 0        # masked-out row
  STOP_TOKEN = 1     # sampled one of stop_ids (the stop token is included in the output)
  TURN_LIMIT = 2     # reached max_tokens (or the static max_new)
  BUDGET = 3         # reached its remaining token budget
  OUT_OF_PAGES = 4   # page pool exhausted: release sequences or raise config.sampler.num_pages
  SEQ_CAPACITY = 5   # sequence reached max_pages_per_seq * page_size tokens
  NOT_LIVE = 6       # the slot holds no sequence (or a duplicate row)
  WINDOW = 7         # more private pages than window_pages (pass a larger window)



@struct.dataclass
class DecodeOutput:
  tokens: jax.Array        # [B, max_new] int32, -1 after each row's length
  logprobs: jax.Array      # [B, max_new] float32 log p(token) under softmax(logits / T) (T = 1 when greedy)
  lengths: jax.Array       # [B] int32 new tokens per row
  stop_reason: jax.Array   # [B] int32, one of the codes above
  steps: jax.Array         # [] or [shards] int32 loop iterations run
  entropy: jax.Array | None = None  # [B, max_new] float32 entropy (nats) of the distribution each
                           # token was drawn from, softmax(logits / T) (T = 1 when greedy), for
                           # the first `entropy_tokens` tokens of each row (0 after them and
                           # after the row's length); None when entropy_tokens = 0


def turn_layout(state: C.CacheState, sl: jax.Array, run: jax.Array):
  """Pages used by each row at turn start, and the candidates for sharing (count >= 2)."""
  ps, n = state.k.shape[2], state.k.shape[1]
  mp = state.page_table.shape[1]
  start = state.lens[sl]
  table = state.page_table[sl]
  used = run[:, None] & (jnp.arange(mp)[None, :] < C.cdiv(start, ps)[:, None])
  count = jnp.zeros((n,), jnp.int32).at[jnp.where(used, table, n)].add(1, mode="drop")
  return start, table, used, count >= 2


def plan(state: C.CacheState, slots: jax.Array, valid: jax.Array) -> jax.Array:
  """[shared candidates, max private pages if all are shared, max pages used] for sizing."""
  s = state.lens.shape[0]
  sl = jnp.clip(slots, 0, s - 1)
  run = C.first_occurrence(slots, valid, s) & state.live[sl]
  _, table, used, cand = turn_layout(state, sl, run)
  private = used & ~cand[jnp.clip(table, 0, cand.shape[0] - 1)]
  return jnp.stack([cand.sum(), private.sum(1).max(), used.sum(1).max()]).astype(jnp.int32)


def decode(model, state: C.CacheState, slots, valid, keys, max_tokens, budget, stop_ids,
           temperature, *, max_new: int, top_k: int = 0, top_p: float = 1.0,
           shared_pages: int = 0, window_pages: int | None = None, turn_segments: int = 1,
           entropy_tokens: int = 0, entropy_top: int = 0, window_kernel: str = ""):
  """Generate up to max_new tokens for rows `slots` [B] (local ids) where `valid` [B].

  keys [B]: one random key per row (step i of row b draws with fold_in(keys[b], i)).
  Each row starts from its pending token and stops at a stop id, at min(max_tokens, budget,
  max_new) new tokens, or when it cannot store more KV. The last sampled token becomes the
  row's pending token. Returns (state, DecodeOutput).

  turn_segments > 1 splits the loop into that many consecutive while-loops; segment c attends
  only the turn buffers of segments 0..c, so early steps read less (one compiled body each).
  entropy_tokens > 0 also reports the sampling distribution's entropy at each row's first
  entropy_tokens steps (`DecodeOutput.entropy`); 0 computes and carries nothing extra.
  entropy_top > 0 reports instead what a listing of the top entropy_top log-probs shows, / ln V
  (`listed_entropy`: ARPO's per-token entropy).
  window_kernel: "" gathers each row's private window once per turn; "tpu" reads it in place
  at every step with the Pallas kernel (compiled for TPU), "interpret" runs that kernel in
  Pallas' interpret mode (any backend: the tests' CPU path).
  """
  ps, n = state.k.shape[2], state.k.shape[1]
  s, mp = state.lens.shape[0], state.page_table.shape[1]
  w = mp if window_pages is None else min(window_pages, mp)
  ns = shared_pages
  b = slots.shape[0]
  sl = jnp.clip(slots, 0, s - 1)
  uniq = C.first_occurrence(slots, valid, s)
  run0 = uniq & state.live[sl]
  start, table, used, cand = turn_layout(state, sl, run0)

  # Shared pages (fixed for the turn) and each row's private window.
  if ns > 0:
    shared_list = jnp.nonzero(cand, size=ns, fill_value=n)[0]
    inv = jnp.full((n + 1,), -1, jnp.int32).at[shared_list].set(jnp.arange(ns, dtype=jnp.int32))[:n]
    row_inv = jnp.where(used, inv[jnp.clip(table, 0, n - 1)], -1)
    smask = jnp.zeros((b, ns + 1), bool).at[jnp.arange(b)[:, None], jnp.where(row_inv >= 0, row_inv, ns)].set(True)
    shared_tok_mask = jnp.repeat(smask[:, :ns], ps, axis=1)[:, None, :]      # [B, 1, ns*ps]
    private = used & (row_inv < 0)
  else:
    private = used
  priv_count = private.sum(1)
  order = jnp.argsort(~private, axis=1, stable=True)[:, :w]                 # private columns first
  priv_table = jnp.take_along_axis(table, order, axis=1)
  tok_pos = order[:, :, None] * ps + jnp.arange(ps)[None, None, :]
  priv_mask = ((jnp.arange(w)[None, :, None] < priv_count[:, None, None]) & (tok_pos < start[:, None, None]))
  priv_mask = priv_mask.reshape(b, 1, w * ps)
  overflow = run0 & (priv_count > w)
  run0 = run0 & ~overflow

  limit = jnp.minimum(jnp.minimum(max_tokens, budget), max_new)
  by_budget = budget < jnp.minimum(max_tokens, max_new)
  S = StopReason
  reason = jnp.where(~valid, S.NOT_RUN, jnp.where(overflow, S.WINDOW,
                                                  jnp.where(run0, S.NOT_RUN, S.NOT_LIVE)))
  empty = run0 & (limit <= 0)
  reason = jnp.where(empty, jnp.where(by_budget, S.BUDGET, S.TURN_LIMIT), reason)
  running = run0 & ~empty

  nl = state.k.shape[0]
  kvh, hd, kvdt = model.cfg.num_kv_heads, model.cfg.head_dim, state.k.dtype
  shared_k = state.k[:, shared_list].reshape(nl, ns * ps, kvh, hd) if ns > 0 else None
  shared_v = state.v[:, shared_list].reshape(nl, ns * ps, kvh, hd) if ns > 0 else None
  if window_kernel:
    valid_tokens = jnp.clip(start[:, None] - order * ps, 0, ps)
    window = pack_window(priv_table, jnp.where(jnp.arange(w)[None] < priv_count[:, None],
                                               valid_tokens, 0), n)
    window_count = jnp.where(run0, jnp.minimum(priv_count, w), 0).astype(jnp.int32)
  else:
    priv_k = [gather_pages(state.k[l], priv_table, kvh) for l in range(nl)]
    priv_v = [gather_pages(state.v[l], priv_table, kvh) for l in range(nl)]
  # Turn buffers: per layer, one array per segment (never sliced inside the loop).
  nseg = max(1, min(turn_segments, max_new))
  bounds = [round(c * max_new / nseg) for c in range(nseg + 1)]
  sizes = [bounds[c + 1] - bounds[c] for c in range(nseg)]
  kbuf = tuple(tuple(jnp.zeros((b, z, kvh, hd), state.k.dtype) for z in sizes) for _ in range(nl))
  vbuf = tuple(tuple(jnp.zeros((b, z, kvh, hd), state.v.dtype) for z in sizes) for _ in range(nl))
  stop_ids = jnp.asarray(stop_ids, jnp.int32).reshape(-1)

  def one_entropy(logits, lp):
    if entropy_top:
      return listed_entropy(logits, temperature, entropy_top, lp)
    return policy_entropy(logits, temperature)

  def step_entropy(i, logits, lp):   # only the first entropy_tokens steps compute it
    if entropy_tokens >= max_new:
      return one_entropy(logits, lp)
    zeros = lambda lg, l: jnp.zeros(lg.shape[:1], jnp.float32)  # noqa: E731
    return jax.lax.cond(i < entropy_tokens, one_entropy, zeros, logits, lp)

  def body(seg, carry):
    i, running, reason, pending, nnew, kbuf, vbuf, toks, lps, ents, free_left = carry
    pos = start + nnew
    need = running & (pos % ps == 0)
    cap = need & (pos // ps >= mp)
    want = need & ~cap
    rank = jnp.cumsum(want) - 1
    oom = want & (rank >= free_left)
    free_left = free_left - (want & ~oom).sum()
    reason = jnp.where(cap, S.SEQ_CAPACITY, jnp.where(oom, S.OUT_OF_PAGES, reason))
    running = running & ~cap & ~oom
    lo = bounds[seg]
    turn_mask = jnp.broadcast_to((jnp.arange(sizes[seg]) <= i - lo)[None, None, :], (b, 1, sizes[seg]))

    def attend_fn(layer, q, k, v, bufs):
      kb, vb = bufs
      kl = jax.lax.dynamic_update_slice(kb[layer][seg], k.astype(kvdt), (0, i - lo, 0, 0))
      vl = jax.lax.dynamic_update_slice(vb[layer][seg], v.astype(kvdt), (0, i - lo, 0, 0))
      kb = kb[:layer] + (kb[layer][:seg] + (kl,) + kb[layer][seg + 1:],) + kb[layer + 1:]
      vb = vb[:layer] + (vb[layer][:seg] + (vl,) + vb[layer][seg + 1:],) + vb[layer + 1:]
      parts = [] if window_kernel else [(priv_k[layer], priv_v[layer], priv_mask)]
      parts += [(kb[layer][c], vb[layer][c], jnp.ones((b, 1, sizes[c]), bool)) for c in range(seg)]
      parts.append((kl, vl, turn_mask))
      if ns > 0:
        parts.append((shared_k[layer], shared_v[layer], shared_tok_mask))
      partial = None
      if window_kernel:
        partial = window_attention(q[:, 0], state.k, state.v, window, window_count, layer=layer,
                                   interpret=window_kernel == "interpret")
      return attend(q, parts, partial), (kb, vb)

    hidden, (kbuf, vbuf) = model.forward(pending[:, None], pos[:, None], attend_fn, (kbuf, vbuf))
    logits = model.logits(hidden[:, 0])
    tok, lp = sample(jax.vmap(lambda k: jax.random.fold_in(k, i))(keys), logits, temperature,
                     top_k, top_p)
    toks = toks.at[:, i].set(jnp.where(running, tok, -1))
    lps = lps.at[:, i].set(jnp.where(running, lp, 0.0))
    if ents is not None:
      ents = ents.at[:, i].set(jnp.where(running, step_entropy(i, logits, lp), 0.0))
    nnew = nnew + running
    pending = jnp.where(running, tok, pending)
    stop = running & (tok[:, None] == stop_ids[None, :]).any(1)
    lim = running & ~stop & (nnew >= limit)
    reason = jnp.where(stop, S.STOP_TOKEN,
                       jnp.where(lim, jnp.where(by_budget, S.BUDGET, S.TURN_LIMIT), reason))
    running = running & ~stop & ~lim
    return i + 1, running, reason, pending, nnew, kbuf, vbuf, toks, lps, ents, free_left

  ents = jnp.zeros((b, max_new), jnp.float32) if entropy_tokens > 0 else None
  carry = (jnp.int32(0), running, reason, state.pending[sl], jnp.zeros((b,), jnp.int32), kbuf, vbuf,
           jnp.full((b, max_new), -1, jnp.int32), jnp.zeros((b, max_new), jnp.float32), ents,
           state.num_free[0])
  for seg in range(nseg):
    hi = bounds[seg + 1]
    carry = jax.lax.while_loop(lambda c, hi=hi: (c[0] < hi) & c[1].any(),
                               functools.partial(body, seg), carry)
  steps, _, reason, pending, nnew, kbuf, vbuf, toks, lps, ents, _ = carry
  kbuf = [jnp.concatenate(x, axis=1) if nseg > 1 else x[0] for x in kbuf]
  vbuf = [jnp.concatenate(x, axis=1) if nseg > 1 else x[0] for x in vbuf]

  # Allocate the pages the turn filled (reserved above, so always available) and store its KV.
  have = C.cdiv(start, ps)
  need = jnp.where(run0, C.cdiv(start + nnew, ps) - have, 0)
  _, offset = C.grant_pages(need, state.num_free[0])
  width = C.cdiv(max_new, ps) + 1
  new_pages, pop_ok = C.pop_pages(state, offset, need, width)
  state = C.commit_pop(state, new_pages, pop_ok)
  cols = jnp.clip(have[:, None] + jnp.arange(width)[None, :], 0, mp - 1)
  table = C.set_table_entries(state.page_table, sl, cols, new_pages, pop_ok)
  rows_table = table[sl]
  j = jnp.arange(max_new)
  wpos = start[:, None] + j[None, :]
  wok = run0[:, None] & (j[None, :] < nnew[:, None])
  page = jnp.take_along_axis(rows_table, jnp.clip(wpos // ps, 0, mp - 1), axis=1)
  page = jnp.where(wok, page, n)
  k, v = state.k, state.v
  for l in range(nl):
    k = k.at[l, page, wpos % ps].set(kbuf[l].reshape(b, max_new, -1), mode="drop")
    v = v.at[l, page, wpos % ps].set(vbuf[l].reshape(b, max_new, -1), mode="drop")
  rows = jnp.where(run0, sl, s)
  state = state.replace(k=k, v=v, page_table=table,
                        lens=state.lens.at[rows].add(nnew, mode="drop"),
                        pending=state.pending.at[rows].set(pending, mode="drop"))
  out = DecodeOutput(tokens=toks, logprobs=lps, lengths=nnew, stop_reason=reason.astype(jnp.int32),
                    steps=steps[None], entropy=ents)
  return state, out
