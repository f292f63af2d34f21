"""Process reward model: the partial trajectory serialised as question + separated steps, one
score per step read at its separator, aggregated."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from tree_rl.fields import Field
from tree_rl.rollout.scorers.base import ScoreInput, place_rows, register


# ---------------------------------------------------------------------------------------------
# prm: a causal LM scores every step of the serialised trajectory; the step scores are aggregated.

AGGREGATIONS = ("last", "mean", "max", "min", "weighted")


def aggregate_steps(step_scores: jax.Array, num_steps: jax.Array, how: str, decay: float
                    ) -> jax.Array:
  """Combine per-step scores [B, D] (the first `num_steps` valid) into [B].

  weighted: sum_k decay^(n-1-k) s_k / sum_k decay^(n-1-k) (later steps weigh more for decay < 1).
  """
  if how not in AGGREGATIONS:
    raise ValueError(f"config.scorer.prm_aggregate={how!r}; known: {AGGREGATIONS}")
  d = step_scores.shape[1]
  k = jnp.arange(d)[None]
  valid = k < num_steps[:, None]
  n = jnp.maximum(num_steps, 1)
  if how == "last":
    out = jnp.take_along_axis(step_scores, (n - 1)[:, None], axis=1)[:, 0]
  elif how == "mean":
    out = jnp.sum(jnp.where(valid, step_scores, 0.0), axis=1) / n
  elif how == "max":
    out = jnp.max(jnp.where(valid, step_scores, -jnp.inf), axis=1)
  elif how == "min":
    out = jnp.min(jnp.where(valid, step_scores, jnp.inf), axis=1)
  else:
    w = jnp.where(valid, decay ** jnp.maximum(n[:, None] - 1 - k, 0).astype(jnp.float32), 0.0)
    out = jnp.sum(w * step_scores, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1e-30)
  return jnp.where(num_steps > 0, out, 0.5)


def token_id(tokenizer, text: str, field: str) -> int:
  ids = tokenizer.encode(text)
  if len(ids) != 1:
    raise ValueError(f"{field}={text!r} must encode to exactly one token, got {ids}")
  return ids[0]


@dataclasses.dataclass(frozen=True)
class PrmFormat:
  """`config.scorer.prm_template` = prefix {question} middle {steps}, and the step separator,
  as token ids (tuples)."""

  prefix: tuple[int, ...]
  middle: tuple[int, ...]
  separator: tuple[int, ...]

  @classmethod
  def from_config(cls, cfg, tokenizer) -> "PrmFormat":
    t = cfg.prm_template
    if t.count("{question}") != 1 or not t.endswith("{steps}") or t.count("{steps}") != 1:
      raise ValueError(f"config.scorer.prm_template={t!r} must hold '{{question}}' once and end "
                       "with '{steps}' (a causal PRM reads nothing after the last step)")
    pre, mid = t[:-len("{steps}")].split("{question}")
    enc = lambda x: tuple(tokenizer.encode(x)) if x else ()  # noqa: E731
    return cls(enc(pre), enc(mid), enc(cfg.prm_step_separator))


def prm_inputs(batch: ScoreInput, fmt: PrmFormat) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The partial trajectory serialised for a PRM: prefix + question + middle + step_1 + sep +
  ... + step_n + sep, where the question is the env's prompt and a step is one agent turn (the
  policy's reply and the observation after it). Returns tokens [B, W] (zero padded), lengths
  [B] and reads [B, D]: the position of each step's score, the separator's last token (the
  step's last token with an empty separator)."""
  npre, nmid, nsep = len(fmt.prefix), len(fmt.middle), len(fmt.separator)
  b, l = batch.tokens.shape
  d = batch.step_ends.shape[1]
  ends = jnp.where(batch.step_ends >= 0, batch.step_ends, l + 1)              # [B, D]
  t = jnp.arange(l)[None]
  seps_before = jnp.sum(ends[:, None, :] <= t[..., None], axis=-1)             # [B, L]
  dest = npre + t + nmid * (t >= batch.prompt_len[:, None]) + nsep * seps_before
  width = npre + l + nmid + d * nsep
  out = jnp.zeros((b, width), jnp.int32)
  out = out.at[jnp.arange(b)[:, None], jnp.where(t < batch.lengths[:, None], dest, width)].set(
      batch.tokens, mode="drop")
  sep_at = npre + nmid + ends + nsep * jnp.arange(d)[None]                    # [B, D]
  rows = lambda x, n: jnp.broadcast_to(jnp.asarray(x or (0,), jnp.int32), (n, max(len(x), 1)))  # noqa: E731
  full = lambda n: jnp.full((b,), n, jnp.int32)  # noqa: E731
  out = place_rows(out, jnp.zeros((b,), jnp.int32), rows(fmt.prefix, b), full(npre))
  out = place_rows(out, npre + batch.prompt_len, rows(fmt.middle, b), full(nmid))
  if nsep:
    k = jnp.arange(d)[None]
    at = sep_at[..., None] + jnp.arange(nsep)                                  # [B, D, nsep]
    at = jnp.where((k < batch.num_steps[:, None])[..., None], at, width).reshape(b, d * nsep)
    sep = jnp.broadcast_to(jnp.asarray(fmt.separator, jnp.int32), (b, d, nsep)).reshape(b, d * nsep)
    out = out.at[jnp.arange(b)[:, None], at].set(sep, mode="drop")
  lengths = npre + batch.lengths + nmid + nsep * batch.num_steps
  reads = jnp.clip(sep_at + nsep - 1, 0, width - 1)
  return out, lengths.astype(jnp.int32), reads.astype(jnp.int32)


@register("prm", dict(
    prm_model=Field("policy", "", "policy (the PRM reads the current policy) | hf (a fixed local "
                    "checkpoint)"),
    prm_hf_path=Field("", "", "PRM checkpoint directory when prm_model=hf"),
    prm_template=Field("{question}{steps}", "", "PRM input: {question} = the env's prompt, {steps} "
                       "= the agent steps so far (reply + observation), each + prm_step_separator"),
    prm_step_separator=Field("\n\n", "", "text after every step; its last token's output scores "
                             "the step"),
    prm_head=Field("token", "", "token: P(good token) after each step | scalar: sigmoid(value head)"),
    prm_good_token=Field("+", "", "designated \"good\" token (must be one token)"),
    prm_bad_token=Field("-", "", "normalise P(good) against this token; \"\" = plain P(good)"),
    prm_aggregate=Field("last", "", "last | mean | max | min | weighted over the steps"),
    prm_decay=Field(0.8, "num [0 1]", "weighted: weight decay^(steps after) per step"),
    prm_chunk_rows=Field(0, "int [0 _)", "rows per data shard the PRM runs at once (0: all): "
                         "bounds its memory"),
))
def make_prm(cfg, *, lm=None, tokenizer=None, value_head=None, **_):
  """Process reward model over `prm_inputs`' serialisation; the step scores are aggregated by
  `config.scorer.prm_aggregate`. `lm(weights, tokens [B, L], positions [B, L], reads [B, D]) ->
  logits [B, D, V]` at the step reads (the [B, L, V] logits of a long trajectory are never made).

  Step score: P(good token | the serialisation up to the step's separator), normalised against
  the bad token when `prm_bad_token` is set; or, with `value_head(weights, tokens, positions)
  -> [B, L]` given and `prm_head='scalar'`, sigmoid of the head at the separator.
  """
  head = cfg.prm_head
  if head not in ("token", "scalar"):
    raise ValueError(f"config.scorer.prm_head={head!r}; known: token, scalar")
  if tokenizer is None or (head == "token" and lm is None):
    raise ValueError("scorer 'prm' needs a `tokenizer` (and `lm` with prm_head='token')")
  if head == "scalar" and value_head is None:
    raise ValueError("scorer 'prm' with prm_head='scalar' needs a `value_head` function")
  aggregate_steps(jnp.zeros((1, 1)), jnp.ones((1,), jnp.int32), cfg.prm_aggregate, 1.0)
  fmt = PrmFormat.from_config(cfg, tokenizer)
  good = token_id(tokenizer, cfg.prm_good_token, "config.scorer.prm_good_token") if head == "token" else 0
  bad = (token_id(tokenizer, cfg.prm_bad_token, "config.scorer.prm_bad_token")
         if head == "token" and cfg.prm_bad_token else None)
  serialise = jax.jit(lambda batch: prm_inputs(batch, fmt))

  @jax.jit
  def step_scores(out, reads):
    if head == "scalar":
      return jax.nn.sigmoid(jnp.take_along_axis(out, reads, axis=1).astype(jnp.float32))
    logp = jax.nn.log_softmax(out.astype(jnp.float32))        # [B, D, V] at the reads already
    return jnp.exp(logp[..., good]) if bad is None else jax.nn.sigmoid(logp[..., good] - logp[..., bad])

  def score(weights, batch, key):
    del key
    tokens, _, reads = serialise(batch)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    out = (value_head(weights, tokens, pos) if head == "scalar"
           else lm(weights, tokens, pos, reads))
    return aggregate_steps(step_scores(out, reads), batch.num_steps, cfg.prm_aggregate,
                           float(cfg.prm_decay))

  return score
