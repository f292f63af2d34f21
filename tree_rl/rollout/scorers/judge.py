"""LLM-as-judge: a stage-aware prompt per env, the judge's greedy reply parsed to a number,
mixed with the heuristic."""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl import envs
from tree_rl.fields import Field
from tree_rl.rollout.scorers.base import ScoreInput, per_state, place_rows, register
from tree_rl.rollout.scorers.heuristic import make_heuristic


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
  out = place_rows(out, jnp.zeros_like(npre), prompt.prefix.tokens[stage], npre)
  out = place_rows(out, npre, tail, take)
  out = place_rows(out, npre + take, prompt.suffix.tokens[stage], nsuf)
  return out, (npre + take + nsuf).astype(jnp.int32)


@register("judge", dict(
    judge_template=Field("", "", "judge prompt: {trajectory} slot, optional {stage} slot; \"\" = "
                         "the env's stage-aware template (FrozenLake: plan/move; tool-call: search/answer)"),
    judge_context_tokens=Field(256, "int [1 _)", "last tokens of the partial trajectory shown to "
                               "the judge"),
    judge_max_tokens=Field(8, "int [1 _)", "tokens the judge may write"),
    judge_scale=Field(10.0, "num (0 _)", "the judge's number is divided by this"),
    judge_lambda=Field(0.5, "num [0 1]", "s = lambda * s_judge + (1 - lambda) * s_heuristic"),
    judge_model=Field("policy", "", "policy (the current policy judges itself) | hf (a fixed "
                      "local checkpoint)"),
    judge_hf_path=Field("", "", "judge checkpoint directory when judge_model=hf"),
))
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


# the request that ends a stage-aware judge prompt, after the env's system text
JUDGE_ASK = (" Reply with one integer from 0 (hopeless) to 10 (certain to succeed).<|im_end|>\n"
             "<|im_start|>user\nStage: {stage}\nTrajectory so far:\n{trajectory}\n"
             "Score:<|im_end|>\n<|im_start|>assistant\n")
