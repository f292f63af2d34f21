"""Engine, rollout method and scorer from a config (`config.rollout`, `config.scorer`), with validation."""

from __future__ import annotations

from tree_rl.rollout import methods, scorers
from tree_rl.rollout.budget import check_unit
from tree_rl.rollout.engine import Engine, Layout, check_turn_limits


def validate(config) -> None:
  """Fail before any compute on unknown names or impossible rollout settings (naming the field);
  each numeric field's range is checked with the schema's (`tree_rl.config.range_errors`)."""
  from tree_rl.config import range_errors
  errors = range_errors(config, ("rollout", "scorer"))
  if errors:
    raise ValueError("; ".join(errors))
  r = config.rollout
  methods.get(r.method)                        # raises with the known methods
  check_unit(r.budget_unit)
  check_turn_limits(r.max_turns, r.max_tokens_per_turn)
  method = methods.get(r.method)(r)            # raises on bad method fields
  if method.score_every:
    scorers.get(method.scorer_override or config.scorer.name)


def make_method(config) -> methods.RolloutMethod:
  validate(config)
  return methods.get(config.rollout.method)(config.rollout)


def make_engine(config, env, tokenizer, **kwargs) -> Engine:
  """The engine for `env` under config.rollout (sampling settings) and config.sampler.attention;
  it reports no entropy unless `entropy_tokens` is passed (the training engine passes the
  method's; evaluation needs none)."""
  r = config.rollout
  kwargs.setdefault("attention", config.sampler.attention)
  kwargs.setdefault("max_shared_pages", int(config.sampler.max_shared_pages))
  kwargs.setdefault("obs_chunk", int(config.sampler.obs_chunk))
  kwargs.setdefault("temperature", float(r.temperature))
  return Engine(env, tokenizer, max_turns=int(r.max_turns), max_tokens_per_turn=int(r.max_tokens_per_turn),
                top_k=int(r.top_k), top_p=float(r.top_p), **kwargs)


def make_training_engine(config, env, tokenizer) -> tuple[methods.RolloutMethod, Engine, Layout]:
  """(method, engine, layout) of the training loop's rollouts, this process's share of one
  rollout's prompts (`prompts_per_rollout`, or all `prompts_per_step`): each
  turn decodes and prefills only the live branches (power-of-two row buckets), observations as
  wide as the longest one; the sampler reports entropy only for a method that branches on it."""
  method = make_method(config)
  engine = make_engine(config, env, tokenizer, entropy_tokens=method.entropy_tokens,
                       entropy_top=method.entropy_top)
  from tree_rl.rollout.capacity import rollout_prompts
  layout = Layout(rollout_prompts(config.rollout), method.capacity(engine.max_turns),
                  method.slots, method.num_trees)
  return method, engine, layout


def make_scorer(config, method: methods.RolloutMethod, *, env=None, tokenizer=None, policy_model=None,
                judge_model=None, prm_model=None, mesh=None, abstract: bool = False):
  """The process scorer the rollout method needs (None for chain / tree_grpo). Built once: it
  takes the weights at every call (`scorers.Scorer`), so policy updates need no rebuild.
  mesh: the rollouts' mesh (`capacity.rollout_mesh`), which a model scorer splits its rows
  over; abstract: shapes only, for compiling ahead of time (`scorers.from_config`)."""
  if not method.score_every:
    return None
  from tree_rl.rollout.capacity import rollout_prompts   # one rollout's prompts are scored at once
  return scorers.from_config(config, env=env, tokenizer=tokenizer, policy_model=policy_model,
                             judge_model=judge_model, prm_model=prm_model,
                             name=method.scorer_override,
                             max_batch=rollout_prompts(config.rollout) * method.slots, mesh=mesh,
                             abstract=abstract)
