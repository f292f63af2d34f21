"""Process scorers: one registry, one interface `scorer(weights, batch, key) -> [B] in [0, 1]`.

A scorer is built by a factory registered under a name::

    @register("mine")
    def make_mine(cfg, **resources):              # cfg: config.scorer; resources: see below
      def score(weights, batch: ScoreInput, key):  # weights: None unless it runs a model
        return jnp.clip(..., 0.0, 1.0)            # float32 [B]
      return score

and selected by `config.scorer.name`; `build` wraps it in a `Scorer`. The score only allocates
rollout budget (PATR): it never enters rewards or advantages.

Weights are arguments, never captured (as optax passes `params` to `update`). A model scorer
(the judge, the PRM) scores with the flat weights it is called with, laid out as
`sampling.Cache.params` (the leaves of `nnx.split(model)`). `scorer.weights_for(policy_weights)`
names the right ones: the policy's for a scorer that reads the policy (`judge_model='policy'`,
the policy judging itself; `prm_model='policy'`), or the scorer's own fixed checkpoint
(`judge_model='hf'`, `prm_model='hf'`), which the `Scorer` holds as data. The rollout driver
calls `scorer(scorer.weights_for(cache.params), batch, key)` with the rollout cache, which the
training loop rebinds to the new weights after every update: a scorer that reads the policy
always scores with the current policy. Scorers without a model (heuristic, random, most
registered ones) are called with `weights=None` inside one jit.

`resources` is what the engine has at hand: `env`, `env_params`, `tokenizer`,
`generate(weights, tokens [B, L], lengths [B], key) -> (new_tokens [B, G], new_lengths [B])`
(greedy decoding through the sampler, for judges) and `lm(weights, tokens [B, L],
positions [B, L]) -> logits [B, L, V]` (a causal-LM forward, for PRMs). A factory takes what it
needs and ignores the rest.
"""

from __future__ import annotations

import dataclasses
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
  prompt_len: jax.Array    # int32 [B] tokens of the prompt (the root), where step 1 starts
  step_ends: jax.Array     # int32 [B, D] end (exclusive) of each step after the prompt; -1 pad
  num_steps: jax.Array     # int32 [B]
  env_state: Any           # env state after the last step, leading [B]
  root_env_state: Any      # env state at the start of the episode, leading [B]
  prompt_id: jax.Array     # int32 [B]
  mask: jax.Array          # bool [B] real branches


class ScoreFn(Protocol):

  def __call__(self, weights: Any, batch: ScoreInput, key: jax.Array) -> jax.Array:
    ...


Factory = Callable[..., ScoreFn]
_REGISTRY = Registry("process scorer", "config.scorer.name")
register = _REGISTRY.register   # decorator: `factory(cfg, **resources) -> score_fn`
get = _REGISTRY.get
names = _REGISTRY.names
WEIGHTS_FROM = (None, "policy", "own")


@dataclasses.dataclass(frozen=True, eq=False)
class Scorer:
  """A built process scorer: `scorer(weights, batch, key) -> float32 [B]` in [0, 1], 0 on
  masked rows.

  weights_from: None (no model: the weights passed are ignored), "policy" (scores with the
  policy's weights) or "own" (a fixed checkpoint: `weights`, flat as `sampling.Cache.params`).
  """

  name: str
  fn: Callable                 # (weights, batch, key) -> scores, clipped and masked
  weights_from: str | None = None
  weights: Any = None

  def __post_init__(self):
    if self.weights_from not in WEIGHTS_FROM:
      raise ValueError(f"scorer {self.name!r}: weights_from={self.weights_from!r}; known: {WEIGHTS_FROM}")
    if (self.weights_from == "own") != (self.weights is not None):
      raise ValueError(f"scorer {self.name!r}: own weights go with weights_from='own' only")

  def weights_for(self, policy_weights: Any) -> Any:
    """The weights to call this scorer with when the policy's are `policy_weights`."""
    return policy_weights if self.weights_from == "policy" else self.weights

  def __call__(self, weights: Any, batch: ScoreInput, key: jax.Array) -> jax.Array:
    return self.fn(weights if self.weights_from else None, batch, key)


def build(cfg, *, weights_from: str | None = None, weights: Any = None, **resources) -> Scorer:
  """The scorer named by `cfg.name` (config.scorer), its output clipped to [0, 1] and masked.

  weights_from / weights: see `Scorer` (`from_config` sets them for the judge and the PRM).
  """
  fn = get(cfg.name)(cfg, **resources)
  # Scorers that call the sampler or carry a model run op by op around their own jitted parts.
  host = getattr(fn, "host", False) or any(getattr(r, "host", False) for r in resources.values())

  def score(w, batch: ScoreInput, key: jax.Array) -> jax.Array:
    s = jnp.asarray(fn(w, batch, key), jnp.float32)
    s = jnp.clip(jnp.nan_to_num(s, nan=0.5), 0.0, 1.0)
    return jnp.where(batch.mask, s, 0.0)

  return Scorer(cfg.name, score if host else jax.jit(score), weights_from, weights)


# ---------------------------------------------------------------------------------------------
# random


@register("random")
def make_random(cfg, **_):
  """Uniform scores: PATR's routing with this scorer is Tree-Random."""
  del cfg

  def score(weights, batch, key):
    del weights
    return jax.random.uniform(key, batch.mask.shape)

  return score


# ---------------------------------------------------------------------------------------------
# heuristic: observable progress signals, one function per environment, registered with the env
# (`tree_rl.envs.register(name, factory, heuristic=fn)`, fn(env, env_params, state, root_state)
# -> [0, 1] for one unbatched state).


def per_state(fn, env, env_params, batch: ScoreInput) -> jax.Array:
  """fn(env, env_params, state, root_state) of one unbatched state, over the batch's rows."""
  return jax.vmap(lambda st, root: fn(env, env_params, st, root))(batch.env_state, batch.root_env_state)


@register("heuristic")
def make_heuristic(cfg, *, env=None, env_params=None, **_):
  """Progress of the env state: FrozenLake BFS distance, tool-call facts retrieved, ..."""
  del cfg
  name = getattr(env, "name", None)
  try:
    one = envs.entry(name).part("heuristic")
  except KeyError as e:
    raise ValueError(f"no heuristic process score for env {name!r}: {e.args[0]}") from None

  def score(weights, batch, key):
    del weights, key
    return per_state(one, env, env_params, batch)

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


@dataclasses.dataclass(frozen=True)
class JudgeTemplate:
  """An env's stage-aware judge prompt, registered with the env (`envs.register(..., judge=...)`).

  text: the prompt with a `{trajectory}` slot (the last tokens of the partial trajectory) and a
  `{stage}` slot (the name of the stage the trajectory is in); stages: the stage names;
  stage(env, env_params, state, root_state) -> int32 index into `stages` for one unbatched state.
  """

  text: str
  stages: tuple[str, ...]
  stage: Callable


@dataclasses.dataclass(frozen=True)
class _Pieces:
  """Token pieces, one row per stage: tokens int32 [S, W] (zero padded), lengths int32 [S]."""

  tokens: jax.Array
  lengths: jax.Array

  @classmethod
  def encode(cls, tokenizer, texts) -> "_Pieces":
    ids = [tokenizer.encode(t) for t in texts]
    width = max(1, max(map(len, ids)))
    return cls(jnp.asarray([i + [0] * (width - len(i)) for i in ids], jnp.int32),
               jnp.asarray([len(i) for i in ids], jnp.int32))


@dataclasses.dataclass(frozen=True)
class JudgePrompt:
  """The judge's prompt as token pieces around the trajectory, one variant per stage."""

  prefix: _Pieces
  suffix: _Pieces
  template: JudgeTemplate | None   # the env's stages (None: a prompt without a {stage} slot)

  @property
  def width(self) -> int:
    """Prompt tokens besides the trajectory, at most."""
    return int(self.prefix.tokens.shape[1] + self.suffix.tokens.shape[1])

  def stage(self, env, env_params, batch: ScoreInput) -> jax.Array:
    if self.template is None:
      return jnp.zeros(batch.mask.shape, jnp.int32)
    return per_state(self.template.stage, env, env_params, batch).astype(jnp.int32)


def judge_prompt(cfg, env, tokenizer) -> JudgePrompt:
  """The judge prompt: `config.scorer.judge_template` when set, else the env's registered
  stage-aware template, else `DEFAULT_JUDGE_TEMPLATE`. A `{stage}` slot is filled with the env's
  stage names (the env must register a judge template for it)."""
  name = getattr(env, "name", None)
  entry = envs.entry(name) if name in envs.registered() else None
  env_tmpl = entry.part("judge") if entry is not None and entry.judge is not None else None
  text = cfg.judge_template or (env_tmpl.text if env_tmpl else DEFAULT_JUDGE_TEMPLATE)
  if text.count("{trajectory}") != 1:
    raise ValueError("config.scorer.judge_template must contain '{trajectory}' exactly once")
  staged = "{stage}" in text
  if staged and env_tmpl is None:
    raise ValueError(f"config.scorer.judge_template has a '{{stage}}' slot but env {name!r} "
                     f"registers no judge stages (tree_rl.envs.register(..., judge=...))")
  variants = [text.replace("{stage}", st) for st in env_tmpl.stages] if staged else [text]
  pre, suf = zip(*(v.split("{trajectory}") for v in variants))
  return JudgePrompt(_Pieces.encode(tokenizer, pre), _Pieces.encode(tokenizer, suf),
                     env_tmpl if staged else None)


def _place(out: jax.Array, start: jax.Array, values: jax.Array, lengths: jax.Array) -> jax.Array:
  """out[b, start[b] + j] = values[b, j] for j < lengths[b] (rows [B, W] into out [B, T])."""
  j = jnp.arange(values.shape[1])[None]
  dest = jnp.where(j < lengths[:, None], start[:, None] + j, out.shape[1])
  return out.at[jnp.arange(out.shape[0])[:, None], dest].set(values, mode="drop")


def judge_inputs(batch: ScoreInput, prompt: JudgePrompt, stage: jax.Array, context: int
                 ) -> tuple[jax.Array, jax.Array]:
  """prefix[stage] + the last `context` tokens of each trajectory + suffix[stage], left-aligned
  [B, prompt.width + context], and the lengths [B]."""
  bsz = batch.tokens.shape[0]
  take = jnp.minimum(batch.lengths, context)
  idx = (batch.lengths - take)[:, None] + jnp.arange(context)[None]
  tail = jnp.take_along_axis(batch.tokens, jnp.clip(idx, 0, batch.tokens.shape[1] - 1), axis=1)
  npre, nsuf = prompt.prefix.lengths[stage], prompt.suffix.lengths[stage]
  out = jnp.zeros((bsz, prompt.width + context), jnp.int32)
  out = _place(out, jnp.zeros_like(npre), prompt.prefix.tokens[stage], npre)
  out = _place(out, npre, tail, take)
  out = _place(out, npre + take, prompt.suffix.tokens[stage], nsuf)
  return out, (npre + take + nsuf).astype(jnp.int32)


@register("judge")
def make_judge(cfg, *, tokenizer=None, generate=None, env=None, env_params=None, **_):
  """LLM-as-judge mixed with the heuristic: s = lambda * s_judge + (1 - lambda) * s_heur.

  `generate(weights, tokens [B, L], lengths [B], key) -> (new_tokens [B, G], new_lengths [B])`
  runs the judge model (or the policy) through the sampler with `weights`; the prompt is
  `judge_prompt`'s, its `{stage}` filled per branch from the env state; an unparsable reply
  scores as the heuristic.
  """
  if tokenizer is None or generate is None:
    raise ValueError("scorer 'judge' needs a tokenizer and the sampler's generate function")
  prompt = judge_prompt(cfg, env, tokenizer)
  numbers = jnp.asarray(number_table(tokenizer, tokenizer.vocab_size))
  lam = float(cfg.judge_lambda)
  heur = make_heuristic(cfg, env=env, env_params=env_params) if lam < 1.0 else None
  context = int(cfg.judge_context_tokens)
  inputs = jax.jit(lambda batch: judge_inputs(batch, prompt, prompt.stage(env, env_params, batch),
                                              context))

  def score(weights, batch, key):
    k1, k2 = jax.random.split(key)
    out, out_len = generate(weights, *inputs(batch), k1)
    s_judge = parse_score(out, out_len, numbers, float(cfg.judge_scale))
    if heur is None:
      return jnp.nan_to_num(s_judge, nan=0.5)
    s_heur = heur(None, batch, k2)
    s_judge = jnp.where(jnp.isnan(s_judge), s_heur, jnp.clip(s_judge, 0.0, 1.0))
    return lam * s_judge + (1.0 - lam) * s_heur

  return score


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
  out = _place(out, jnp.zeros((b,), jnp.int32), rows(fmt.prefix, b), full(npre))
  out = _place(out, npre + batch.prompt_len, rows(fmt.middle, b), full(nmid))
  if nsep:
    k = jnp.arange(d)[None]
    at = sep_at[..., None] + jnp.arange(nsep)                                  # [B, D, nsep]
    at = jnp.where((k < batch.num_steps[:, None])[..., None], at, width).reshape(b, d * nsep)
    sep = jnp.broadcast_to(jnp.asarray(fmt.separator, jnp.int32), (b, d, nsep)).reshape(b, d * nsep)
    out = out.at[jnp.arange(b)[:, None], at].set(sep, mode="drop")
  lengths = npre + batch.lengths + nmid + nsep * batch.num_steps
  reads = jnp.clip(sep_at + nsep - 1, 0, width - 1)
  return out, lengths.astype(jnp.int32), reads.astype(jnp.int32)


@register("prm")
def make_prm(cfg, *, lm=None, tokenizer=None, value_head=None, **_):
  """Process reward model over `prm_inputs`' serialisation; the step scores are aggregated by
  `config.scorer.prm_aggregate`. `lm(weights, tokens [B, L], positions [B, L]) -> logits [B, L, V]`.

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
    logp = jax.nn.log_softmax(jnp.take_along_axis(out, reads[..., None], axis=1).astype(jnp.float32))
    return jnp.exp(logp[..., good]) if bad is None else jax.nn.sigmoid(logp[..., good] - logp[..., bad])

  def score(weights, batch, key):
    del key
    tokens, _, reads = serialise(batch)
    pos = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    out = (value_head if head == "scalar" else lm)(weights, tokens, pos)
    return aggregate_steps(step_scores(out, reads), batch.num_steps, cfg.prm_aggregate,
                           float(cfg.prm_decay))

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
  ends = jnp.cumsum(seg_len, axis=-1)
  steps = jnp.sum(rows[..., 1:] >= 0, axis=-1)
  step_ends = jnp.where(rows[..., 1:] >= 0, jnp.minimum(ends[..., 1:], max_len), -1)  # skip the root
  rows_n = node_ids.shape[0] * node_ids.shape[1]
  flat = lambda x: x.reshape((rows_n,) + x.shape[2:])  # noqa: E731
  root = rows[..., 0]
  return ScoreInput(
      tokens=flat(seqs.tokens), lengths=flat(seqs.lengths),
      prompt_len=flat(jnp.minimum(ends[..., 0], max_len)).astype(jnp.int32),
      step_ends=flat(step_ends), num_steps=flat(steps).astype(jnp.int32),
      env_state=jax.tree.map(flat, gather_env(tree.env_state, node_ids)),
      root_env_state=jax.tree.map(flat, gather_env(tree.env_state, root)),
      prompt_id=flat(jnp.broadcast_to(tree.prompt_id[:, None], node_ids.shape)),
      mask=flat(node_ids >= 0))


# ---------------------------------------------------------------------------------------------
# the built-in envs' scorer parts (registered in tree_rl.envs): heuristics and judge templates.


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


def frozenlake_stage(env, env_params, state, root_state):
  """0 (plan) until the agent's first move on the board, 1 (move) after it."""
  del env, env_params, root_state
  return (state.steps > 0).astype(jnp.int32)


def toolcall_stage(env, env_params, state, root_state):
  """0 (search) while searches are left and nothing is answered, 1 (answer) after."""
  del root_state
  params = env.default_params if env_params is None else env_params
  return (state.answered | (state.calls >= params.max_calls)).astype(jnp.int32)


_JUDGE_ASK = (" Reply with one integer from 0 (hopeless) to 10 (certain to succeed).<|im_end|>\n"
              "<|im_start|>user\nStage: {stage}\nTrajectory so far:\n{trajectory}\n"
              "Score:<|im_end|>\n<|im_start|>assistant\n")
FROZENLAKE_JUDGE = JudgeTemplate(
    text="<|im_start|>system\nYou judge an agent walking on a FrozenLake grid to the goal G "
         "without falling into a hole O. Its stages: plan (it reads the map and picks a route, "
         "no move made yet) and move (it moves on the board toward the goal)." + _JUDGE_ASK,
    stages=("plan", "move"), stage=frozenlake_stage)
TOOLCALL_JUDGE = JudgeTemplate(
    text="<|im_start|>system\nYou judge an agent answering a multi-hop question with a search "
         "tool. Its stages: search (it gathers the facts the question needs) and answer (no "
         "searches left or an answer given: the answer must follow from the facts found)."
         + _JUDGE_ASK,
    stages=("search", "answer"), stage=toolcall_stage)


# ---------------------------------------------------------------------------------------------
# resources: the sampler as a judge's text generator, a model as a PRM's forward. Both take the
# weights per call (flat, as `sampling.Cache.params`) and check they fit the model they were
# built for.


def model_weights(model) -> tuple:
  """The flat weights of an NNX model, in the layout of `sampling.Cache.params`."""
  from flax import nnx
  return tuple(jax.tree.leaves(nnx.split(model)[1]))


def sampler_generate(model, *, max_seqs: int, max_len: int, max_new: int, stop_ids,
                     page_size: int = 16, kv_dtype: str = "float32", num_pages: int | None = None):
  """`generate(weights, tokens [B, L], lengths [B], key) -> (new_tokens [B, max_new], lengths [B])`:
  greedy decoding through the paged sampler of `model`'s architecture with `weights`. One
  cache is reused: rebound to the call's weights, released and unbound after every call."""
  from tree_rl import sampling

  pages_per_seq = -(-(max_len + max_new + 1) // page_size)
  box = [sampling.unbind(sampling.init_cache(
      model, max_seqs=max_seqs, page_size=page_size, kv_dtype=kv_dtype,
      num_pages=num_pages or max_seqs * pages_per_seq, max_pages_per_seq=pages_per_seq))]
  stops = tuple(stop_ids)

  def generate(weights, tokens, lengths, key):
    b = tokens.shape[0]
    if b > max_seqs:
      raise ValueError(f"judge batch {b} exceeds the judge cache's {max_seqs} sequences")
    slots = jnp.arange(b, dtype=jnp.int32)
    valid = lengths > 0
    cache = sampling.rebind(box[0], weights)
    cache, _ = sampling.prefill(cache, slots, tokens, jnp.maximum(lengths, 1), valid,
                                read_cache=False)
    cache, out = sampling.decode(cache, slots, key, max_new=max_new, stop_ids=stops,
                                 temperature=0.0, valid=valid)
    box[0] = sampling.unbind(sampling.release(cache, slots))
    return jnp.where(out.tokens >= 0, out.tokens, 0), jnp.where(valid, out.lengths, 0)

  generate.host = True  # calls the sampler's host API: not jittable as a whole
  return generate


def dense_lm(model):
  """`lm(weights, tokens, positions) -> logits`: a jitted causal forward of `model`'s
  architecture with the given flat weights (`model_weights` layout)."""
  from flax import nnx

  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  shapes = [(x.shape, x.dtype) for x in leaves]

  @jax.jit
  def fwd(weights, tokens, positions):
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, list(weights)))(tokens, positions)

  def lm(weights, tokens, positions):
    weights = tuple(weights)
    if [(x.shape, x.dtype) for x in weights] != shapes:
      raise ValueError(f"scorer 'prm': the {len(weights)} weight arrays passed do not fit its "
                       f"model ({len(shapes)} arrays): another architecture?")
    return fwd(weights, tokens, positions)

  lm.host = True
  return lm


def from_config(config, *, env=None, tokenizer=None, policy_model=None, judge_model=None,
                prm_model=None, max_batch: int = 256, name: str | None = None) -> Scorer:
  """The scorer of `config.scorer` with the resources it needs built from the given models.

  judge / prm: `config.scorer.judge_model` / `prm_model` = 'policy' reads the policy's weights
  at every call (`policy_model` gives the architecture); 'hf' holds a fixed checkpoint: the
  `judge_model` / `prm_model` given, else the one at `judge_hf_path` / `prm_hf_path`.
  `name` overrides config.scorer.name.
  """
  sc = config.scorer
  if name is not None:
    sc = sc.copy_and_resolve_references()
    sc.name = name
  res = dict(env=env, env_params=getattr(env, "default_params", None), tokenizer=tokenizer)
  if sc.name not in ("judge", "prm"):
    return build(sc, **res)
  model, weights_from = _scorer_model(sc, sc.name, policy_model,
                                      judge_model if sc.name == "judge" else prm_model)
  if sc.name == "judge":
    prompt = judge_prompt(sc, env, tokenizer)
    res["generate"] = sampler_generate(
        model, max_seqs=max_batch, max_len=prompt.width + int(sc.judge_context_tokens),
        max_new=int(sc.judge_max_tokens), stop_ids=tokenizer.stop_ids)
  else:
    res["lm"] = dense_lm(model)
  return build(sc, weights_from=weights_from,
               weights=model_weights(model) if weights_from == "own" else None, **res)


def _scorer_model(sc, kind: str, policy_model, own_model):
  """(model, weights_from) of the judge or the PRM under `config.scorer.{kind}_model`."""
  which = sc[f"{kind}_model"]
  if which not in ("policy", "hf"):
    raise ValueError(f"config.scorer.{kind}_model={which!r}; known: policy, hf")
  if which == "policy":
    if policy_model is None:
      raise ValueError(f"scorer {kind!r} with {kind}_model='policy' needs the policy model")
    return policy_model, "policy"
  if own_model is None:
    path = sc[f"{kind}_hf_path"]
    if not path:
      raise ValueError(f"config.scorer.{kind}_hf_path must name a local checkpoint when "
                       f"{kind}_model=hf")
    from tree_rl.models.hf_io import load_hf_checkpoint
    own_model, _ = load_hf_checkpoint(path)   # must share the policy's tokenizer
  return own_model, "own"
