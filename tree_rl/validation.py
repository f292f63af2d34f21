"""Whole-config validation: impossible settings fail before any compute, naming the fields."""

from __future__ import annotations

from tree_rl import envs
from tree_rl.learner.train_step import validate_config as validate_learner
from tree_rl.models.config import PRESETS
from tree_rl.models.factory import DTYPES
from tree_rl.rollout import build as rollout_build
from tree_rl.rollout.capacity import pages_needed


class ConfigError(ValueError):
  """A config that cannot run; the message names the fields and the fix."""


def _check(ok: bool, message: str):
  if not ok:
    raise ConfigError(message)


def validate(config, *, engine=None, layout=None) -> None:
  """Check names against their registries and budgets against capacities.

  Without `engine`/`layout` only the config itself is checked; with them (after the env and
  the engine exist, still before any rollout) the KV page pool is checked too.
  """
  m = config.model
  _check(m.preset in set(PRESETS) | {"hf"},
         f"config.model.preset={m.preset!r}; known: {sorted(PRESETS) + ['hf']}")
  _check(m.dtype in DTYPES and m.param_dtype in DTYPES,
         f"config.model.dtype={m.dtype!r} / param_dtype={m.param_dtype!r}; known: {sorted(DTYPES)}")
  _check(config.env.name in envs.registered(),
         f"config.env.name={config.env.name!r}; registered: {envs.registered()}")
  _check(envs.entry(config.env.name).tasks is not None,
         f"config.env.name={config.env.name!r} was registered without a task set: "
         f"tree_rl.envs.register({config.env.name!r}, factory, tasks=...)")
  t = config.train
  for field in ("num_steps", "ppo_epochs", "minibatches", "eval_every", "eval_samples"):
    _check(int(t[field]) >= 1, f"config.train.{field} must be >= 1, got {t[field]}")
  _check(int(t.minibatches) <= int(config.rollout.prompts_per_step),
         f"config.train.minibatches={t.minibatches} exceeds config.rollout.prompts_per_step="
         f"{config.rollout.prompts_per_step}: every minibatch needs at least one prompt")
  _check(int(config.checkpoint.every_steps) >= 1, "config.checkpoint.every_steps must be >= 1")
  _check(int(config.checkpoint.keep) >= 1, "config.checkpoint.keep must be >= 1")
  try:
    rollout_build.validate(config)
    validate_learner(config)
  except (KeyError, ValueError) as e:
    raise ConfigError(str(e).strip("'\"")) from e
  r = config.rollout
  if int(r.budget) > 0 and r.budget_unit == "generated":
    one = int(r.max_turns) * int(r.max_tokens_per_turn)
    _check(int(r.budget) >= one,
           f"config.rollout.budget={r.budget} generated tokens per prompt is less than one "
           f"trajectory can take (config.rollout.max_turns={r.max_turns} x "
           f"config.rollout.max_tokens_per_turn={r.max_tokens_per_turn} = {one}): raise the budget")
  if engine is not None and layout is not None:
    s = config.sampler
    page = int(s.page_size)
    need = pages_needed(engine, layout, page)
    _check(int(s.num_pages) >= need,
           f"config.sampler.num_pages={s.num_pages} is too small for this rollout: "
           f"{layout.num_prompts} prompts (config.rollout.prompts_per_step) x {layout.slots} live "
           f"branches of up to {engine.max_context()} tokens need up to {need} pages of "
           f"{page} tokens (config.sampler.page_size); raise config.sampler.num_pages to >= {need}")
