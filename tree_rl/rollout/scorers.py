"""Process scorers: one registry, one interface `score(batch, key) -> [B] in [0, 1]`.

A scorer is built by a factory registered under a name::

    @register("mine")
    def make_mine(cfg, **resources):          # cfg: config.scorer; resources: see `build`
      def score(batch: ScoreInput, key):      # batch of partial trajectories
        return jnp.clip(..., 0.0, 1.0)        # float32 [B]
      return score

and selected by `config.scorer.name`. `resources` carries what the engine has at hand:
`env`, `env_params`, `tokenizer`, `generate` (the sampler as a batched text generator, for
judges), `lm` (a causal-LM forward `lm(tokens, positions) -> logits`, for PRMs). A factory takes
what it needs and ignores the rest. The score only allocates rollout budget (PATR): it never
enters rewards or advantages.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl import envs
from tree_rl.registry import Registry


@struct.dataclass
class ScoreInput:
  """Partial trajectories x = prompt, tau = steps so far, flattened over [P * S] branches."""

  tokens: jax.Array        # int32 [B, L] root..node tokens (prompt first), zero padded
  lengths: jax.Array       # int32 [B]
  step_ends: jax.Array     # int32 [B, D] end (exclusive) of each step after the prompt; -1 pad
  num_steps: jax.Array     # int32 [B]
  env_state: Any           # env state after the last step, leading [B]
  root_env_state: Any      # env state at the start of the episode, leading [B]
  prompt_id: jax.Array     # int32 [B]
  mask: jax.Array          # bool [B] real branches


class ScoreFn(Protocol):

  def __call__(self, batch: ScoreInput, key: jax.Array) -> jax.Array:
    ...


Factory = Callable[..., ScoreFn]
_REGISTRY = Registry("process scorer", "config.scorer.name")
register = _REGISTRY.register   # decorator: `factory(cfg, **resources) -> score_fn`
get = _REGISTRY.get
names = _REGISTRY.names


def build(cfg, **resources) -> ScoreFn:
  """The scorer named by `cfg.name` (config.scorer), its output clipped to [0, 1] and masked."""
  fn = get(cfg.name)(cfg, **resources)
  # Scorers that call the sampler or carry a model run op by op around their own jitted parts.
  host = getattr(fn, "host", False) or any(getattr(r, "host", False) for r in resources.values())

  def score(batch: ScoreInput, key: jax.Array) -> jax.Array:
    s = jnp.asarray(fn(batch, key), jnp.float32)
    s = jnp.clip(jnp.nan_to_num(s, nan=0.5), 0.0, 1.0)
    return jnp.where(batch.mask, s, 0.0)

  return score if host else jax.jit(score)


# ---------------------------------------------------------------------------------------------
# random


@register("random")
def make_random(cfg, **_):
  """Uniform scores: PATR's routing with this scorer is Tree-Random."""
  del cfg

  def score(batch, key):
    return jax.random.uniform(key, batch.mask.shape)

  return score


# ---------------------------------------------------------------------------------------------
# heuristic: observable progress signals, one function per environment, registered with the env
# (`tree_rl.envs.register(name, factory, heuristic=fn)`, fn(env, env_params, state, root_state)
# -> [0, 1] for one unbatched state).


@register("heuristic")
def make_heuristic(cfg, *, env=None, env_params=None, **_):
  """Progress of the env state: FrozenLake BFS distance, tool-call facts retrieved, ..."""
  del cfg
  name = getattr(env, "name", None)
  try:
    one = envs.entry(name).part("heuristic")
  except KeyError as e:
    raise ValueError(f"no heuristic process score for env {name!r}: {e.args[0]}") from None

  def score(batch, key):
    del key
    return jax.vmap(lambda s, r: one(env, env_params, s, r))(batch.env_state, batch.root_env_state)

  return score


# ---------------------------------------------------------------------------------------------
# judge: an LLM reads the partial trajectory and writes a score.


def number_table(tokenizer, vocab_size: int) -> np.ndarray:
  """int32 [vocab]: the integer a token spells when its text is 1-3 digits, else -1."""
  table = np.full((vocab_size,), -1, np.int32)
  for i in range(min(vocab_size, getattr(tokenizer, "vocab_size", vocab_size))):
    try:
      text = tokenizer.decode([i]).strip()
    except Exception:  # noqa: BLE001 - unknown ids in padded vocabularies
      continue
    if 0 < len(text) <= 3 and text.isascii() and text.isdigit():
      table[i] = int(text)
  return table


def parse_score(tokens: jax.Array, lengths: jax.Array, numbers: jax.Array, scale: float
                ) -> jax.Array:
  """The first number written in each generation, over `scale`; NaN when there is none.

  tokens [B, G], lengths [B], numbers: `number_table` as an array. Two adjacent number tokens
  join ("1" "0" -> 10).
  """
  g = tokens.shape[1]
  val = numbers[tokens]
  inside = jnp.arange(g)[None] < lengths[:, None]
  is_num = (val >= 0) & inside
  first = jnp.argmax(is_num, axis=1)
  has = jnp.any(is_num, axis=1)
  b = jnp.arange(tokens.shape[0])
  v0 = val[b, first]
  nxt = jnp.minimum(first + 1, g - 1)
  v1 = val[b, nxt]
  joined = (first + 1 < g) & is_num[b, nxt]
  digits1 = jnp.where(v1 >= 100, 1000, jnp.where(v1 >= 10, 100, 10))
  value = jnp.where(joined, v0 * digits1 + v1, v0).astype(jnp.float32)
  return jnp.where(has, value / scale, jnp.nan)


DEFAULT_JUDGE_TEMPLATE = (
    "<|im_start|>system\nYou judge an agent's progress. Reply with one integer from 0 (hopeless) "
    "to 10 (certain to succeed).<|im_end|>\n<|im_start|>user\nTrajectory so far:\n{trajectory}\n"
    "Score:<|im_end|>\n<|im_start|>assistant\n")


def judge_inputs(batch: ScoreInput, prefix: jax.Array, suffix: jax.Array, context: int
                 ) -> tuple[jax.Array, jax.Array]:
  """prefix + the last `context` tokens of each trajectory + suffix, left-aligned [B, L]."""
  bsz = batch.tokens.shape[0]
  npre, nsuf = prefix.shape[0], suffix.shape[0]
  take = jnp.minimum(batch.lengths, context)
  start = batch.lengths - take
  idx = start[:, None] + jnp.arange(context)[None]
  tail = jnp.take_along_axis(batch.tokens, jnp.clip(idx, 0, batch.tokens.shape[1] - 1), axis=1)
  width = npre + context + nsuf
  out = jnp.zeros((bsz, width), jnp.int32).at[:, :npre].set(prefix[None])
  pos = jnp.arange(width)[None]
  k = pos - npre
  out = jnp.where((k >= 0) & (k < take[:, None]),
                  jnp.take_along_axis(tail, jnp.clip(k, 0, context - 1), axis=1), out)
  ks = pos - npre - take[:, None]
  out = jnp.where((ks >= 0) & (ks < nsuf), suffix[jnp.clip(ks, 0, max(nsuf - 1, 0))], out)
  return out, (npre + take + nsuf).astype(jnp.int32)


@register("judge")
def make_judge(cfg, *, tokenizer=None, generate=None, env=None, env_params=None, **_):
  """LLM-as-judge mixed with the heuristic: s = lambda * s_judge + (1 - lambda) * s_heur.

  `generate(tokens [B, L], lengths [B], key) -> (new_tokens [B, G], new_lengths [B])` runs the
  judge model (or the policy) through the sampler; an unparsable reply scores as the heuristic.
  """
  if tokenizer is None or generate is None:
    raise ValueError("scorer 'judge' needs a tokenizer and the sampler's generate function")
  template = cfg.judge_template or DEFAULT_JUDGE_TEMPLATE
  if "{trajectory}" not in template:
    raise ValueError("config.scorer.judge_template must contain '{trajectory}'")
  pre, suf = template.split("{trajectory}", 1)
  prefix = jnp.asarray(tokenizer.encode(pre), jnp.int32)
  suffix = jnp.asarray(tokenizer.encode(suf), jnp.int32)
  numbers = jnp.asarray(number_table(tokenizer, tokenizer.vocab_size))
  lam = float(cfg.judge_lambda)
  heur = make_heuristic(cfg, env=env, env_params=env_params) if lam < 1.0 else None

  def score(batch, key):
    k1, k2 = jax.random.split(key)
    toks, lens = judge_inputs(batch, prefix, suffix, int(cfg.judge_context_tokens))
    out, out_len = generate(toks, lens, k1)
    s_judge = parse_score(out, out_len, numbers, float(cfg.judge_scale))
    if heur is None:
      return jnp.nan_to_num(s_judge, nan=0.5)
    s_heur = heur(batch, k2)
    s_judge = jnp.where(jnp.isnan(s_judge), s_heur, jnp.clip(s_judge, 0.0, 1.0))
    return lam * s_judge + (1.0 - lam) * s_heur

  return score


# ---------------------------------------------------------------------------------------------
# prm: a causal LM scores every step; the step scores are aggregated.

AGGREGATIONS = ("last", "mean", "max", "min", "weighted")


def aggregate_steps(step_scores: jax.Array, num_steps: jax.Array, how: str, decay: float
                    ) -> jax.Array:
  """Combine per-step scores [B, D] (the first `num_steps` valid) into [B].

  weighted: sum_k decay^(n-1-k) s_k / sum_k decay^(n-1-k) (later steps weigh more for decay < 1).
  """
  if how not in AGGREGATIONS:
    raise ValueError(f"config.scorer.prm_aggregation={how!r}; known: {AGGREGATIONS}")
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


@register("prm")
def make_prm(cfg, *, lm=None, tokenizer=None, value_head=None, **_):
  """Process reward model. `lm(tokens [B, L], positions [B, L]) -> logits [B, L, V]`.

  Step score: P(good token | context up to the step's end), normalised against the bad token
  when `prm_bad_token` is set; or, with `value_head(tokens, positions) -> [B, L]` given and
  `prm_head='scalar'`, sigmoid of the head at the step's last token.
  """
  head = cfg.prm_head
  if head not in ("token", "scalar"):
    raise ValueError(f"config.scorer.prm_head={head!r}; known: token, scalar")
  if head == "token" and (lm is None or tokenizer is None):
    raise ValueError("scorer 'prm' with prm_head='token' needs `lm` and `tokenizer`")
  if head == "scalar" and value_head is None:
    raise ValueError("scorer 'prm' with prm_head='scalar' needs a `value_head` function")
  aggregate_steps(jnp.zeros((1, 1)), jnp.ones((1,), jnp.int32), cfg.prm_aggregation, 1.0)
  good = token_id(tokenizer, cfg.prm_good_token, "config.scorer.prm_good_token") if head == "token" else 0
  bad = (token_id(tokenizer, cfg.prm_bad_token, "config.scorer.prm_bad_token")
         if head == "token" and cfg.prm_bad_token else None)

  def score(batch, key):
    del key
    b, l = batch.tokens.shape
    pos = jnp.broadcast_to(jnp.arange(l, dtype=jnp.int32), (b, l))
    at = jnp.clip(batch.step_ends - 1, 0, l - 1)                    # last token of each step
    if head == "scalar":
      vals = value_head(batch.tokens, pos)
      step = jax.nn.sigmoid(jnp.take_along_axis(vals, at, axis=1).astype(jnp.float32))
    else:
      logits = lm(batch.tokens, pos)
      logp = jax.nn.log_softmax(jnp.take_along_axis(logits, at[..., None], axis=1).astype(jnp.float32))
      if bad is None:
        step = jnp.exp(logp[..., good])
      else:
        step = jax.nn.sigmoid(logp[..., good] - logp[..., bad])
    return aggregate_steps(step, batch.num_steps, cfg.prm_aggregation, float(cfg.prm_decay))

  return score


def score_input(tree, node_ids: jax.Array, max_len: int, max_depth: int) -> ScoreInput:
  """The partial trajectories ending at `node_ids` [P, S] (-1: no branch), flattened to [P*S]."""
  from tree_rl.rollout.sequences import path_sequences
  from tree_rl.rollout.tree import gather_env, path_nodes

  seqs = path_sequences(tree, node_ids, max_len, max_depth)
  paths = path_nodes(tree, max_depth)
  p_idx = jnp.arange(tree.num_prompts)[:, None]
  rows = jnp.where(node_ids[..., None] >= 0, paths[p_idx, jnp.maximum(node_ids, 0)], -1)
  seg_len = jnp.where(rows >= 0, tree.length[p_idx[..., None], jnp.maximum(rows, 0)], 0)
  ends = jnp.cumsum(seg_len, axis=-1)[..., 1:]                  # skip the root (prompt)
  steps = jnp.sum(rows[..., 1:] >= 0, axis=-1)
  step_ends = jnp.where(rows[..., 1:] >= 0, jnp.minimum(ends, max_len), -1)
  rows_n = node_ids.shape[0] * node_ids.shape[1]
  flat = lambda x: x.reshape((rows_n,) + x.shape[2:])  # noqa: E731
  root = rows[..., 0]
  return ScoreInput(
      tokens=flat(seqs.tokens), lengths=flat(seqs.lengths), step_ends=flat(step_ends),
      num_steps=flat(steps).astype(jnp.int32),
      env_state=jax.tree.map(flat, gather_env(tree.env_state, node_ids)),
      root_env_state=jax.tree.map(flat, gather_env(tree.env_state, root)),
      prompt_id=flat(jnp.broadcast_to(tree.prompt_id[:, None], node_ids.shape)),
      mask=flat(node_ids >= 0))


def frozenlake_progress(env, env_params, state, root_state):
  """1 - d / d0 with d the BFS moves left to the goal and d0 those at the episode start;
  1 on the goal, 0 in a hole (or when the goal became unreachable)."""
  del env_params
  d = env.distance_to_goal(state).astype(jnp.float32)
  d0 = env.distance_to_goal(root_state).astype(jnp.float32)
  prog = 1.0 - d / jnp.maximum(d0, 1.0)
  prog = jnp.where(d < 0, 0.0, prog)
  return jnp.where(state.won, 1.0, jnp.where(state.fell, 0.0, jnp.clip(prog, 0.0, 1.0)))


def toolcall_progress(env, env_params, state, root_state):
  """Fraction of the facts the question needs that searches have shown; 1 once answered right."""
  del env_params, root_state
  return jnp.where(state.correct, 1.0, env.retrieval_progress(state).astype(jnp.float32))


# ---------------------------------------------------------------------------------------------
# resources: the sampler as a judge's text generator, a model as a PRM's forward.


def sampler_generate(model, *, max_seqs: int, max_len: int, max_new: int, stop_ids,
                     page_size: int = 16, kv_dtype: str = "float32", num_pages: int | None = None):
  """`generate(tokens [B, L], lengths [B], key) -> (new_tokens [B, max_new], lengths [B])`:
  greedy decoding of `model` through the paged sampler (one cache reused, released per call).

  The cache is bound to the model's weights at this call: rebuild after a weight update.
  """
  from tree_rl import sampling

  pages_per_seq = -(-(max_len + max_new + 1) // page_size)
  box = [sampling.init_cache(model, max_seqs=max_seqs, page_size=page_size, kv_dtype=kv_dtype,
                             num_pages=num_pages or max_seqs * pages_per_seq,
                             max_pages_per_seq=pages_per_seq)]
  stops = tuple(stop_ids)

  def generate(tokens, lengths, key):
    b = tokens.shape[0]
    if b > max_seqs:
      raise ValueError(f"judge batch {b} exceeds the judge cache's {max_seqs} sequences")
    slots = jnp.arange(b, dtype=jnp.int32)
    valid = lengths > 0
    cache, _ = sampling.prefill(box[0], slots, tokens, jnp.maximum(lengths, 1), valid)
    cache, out = sampling.decode(cache, slots, key, max_new=max_new, stop_ids=stops,
                                 temperature=0.0, valid=valid)
    box[0] = sampling.release(cache, slots)
    return jnp.where(out.tokens >= 0, out.tokens, 0), jnp.where(valid, out.lengths, 0)

  generate.host = True  # calls the sampler's host API: not jittable as a whole
  return generate


def dense_lm(model):
  """`lm(tokens, positions) -> logits`: a jitted causal forward of `model` (split once)."""
  from flax import nnx

  graphdef, state = nnx.split(model)

  @jax.jit
  def fwd(state, tokens, positions):
    return nnx.merge(graphdef, state)(tokens, positions)

  lm = lambda tokens, positions: fwd(state, tokens, positions)  # noqa: E731
  lm.host = True
  return lm


def from_config(config, *, env=None, tokenizer=None, policy_model=None, judge_model=None,
                prm_model=None, max_batch: int = 256, name: str | None = None) -> ScoreFn:
  """The scorer of `config.scorer` with the resources it needs built from the given models.

  judge: `judge_model` (or the policy when config.scorer.judge_model == 'policy');
  prm: `prm_model` (default: the policy model). `name` overrides config.scorer.name.
  """
  sc = config.scorer
  if name is not None:
    sc = sc.copy_and_resolve_references()
    sc.name = name
  res = dict(env=env, env_params=getattr(env, "default_params", None), tokenizer=tokenizer)
  if sc.name == "judge":
    if sc.judge_model not in ("policy", "hf"):
      raise ValueError(f"config.scorer.judge_model={sc.judge_model!r}; known: policy, hf")
    model = policy_model if sc.judge_model == "policy" else judge_model
    if model is None and sc.judge_model == "hf":
      if not sc.judge_hf_path:
        raise ValueError("config.scorer.judge_hf_path must name a local checkpoint when judge_model=hf")
      from tree_rl.models.hf_io import load_hf_checkpoint
      model, _ = load_hf_checkpoint(sc.judge_hf_path)   # must share the policy's tokenizer
    if model is None:
      raise ValueError("scorer 'judge' needs a judge model (config.scorer.judge_model)")
    tmpl = sc.judge_template or DEFAULT_JUDGE_TEMPLATE
    res["generate"] = sampler_generate(
        model, max_seqs=max_batch, max_len=len(tokenizer.encode(tmpl)) + int(sc.judge_context_tokens),
        max_new=int(sc.judge_max_tokens), stop_ids=tokenizer.stop_ids)
  if sc.name == "prm":
    model = prm_model or policy_model
    if model is None:
      raise ValueError("scorer 'prm' needs a model (prm_model or the policy)")
    res["lm"] = dense_lm(model)
  return build(sc, **res)
