"""Whole-config validation: impossible settings fail before any compute, naming the fields."""

from __future__ import annotations

import os

from tree_rl import envs
from tree_rl.config import range_errors
from tree_rl.learner.logprobs import ATTENTION as LEARNER_ATTENTION
from tree_rl.learner.train_step import validate_config as validate_learner
from tree_rl.models.config import PRESETS
from tree_rl.models.factory import DTYPES
from tree_rl.rollout import build as rollout_build
from tree_rl.rollout.budget import trajectory_cost
from tree_rl.rollout.capacity import pages_needed
from tree_rl.sampling.api import ATTENTION
from tree_rl.sampling.cache import KV_DTYPES


class ConfigError(ValueError):
  """A config that cannot run; the message names the fields and the fix."""


def _check(ok: bool, message: str):
  if not ok:
    raise ConfigError(message)


def _check_shipped_policy(config) -> None:
  """A shipped warm-start policy the run would load exists and was made for this setting
  (its digest and tokenizer are checked when it loads)."""
  w = config.warmstart
  if not w.policy or w.from_scratch or not w.enabled or config.model.preset == "hf":
    return
  from tree_rl.warmstart import shipped
  made_for = shipped.read_manifest(w.policy)["settings"]
  ours = shipped.bound_settings(config)
  differ = [f"config.{k}={ours[k]!r} (policy: {made_for.get(k)!r})" for k in ours
            if made_for.get(k) != ours[k]]
  _check(not differ, f"config.warmstart.policy={w.policy!r} was made for another setting: "
         f"{', '.join(differ)}; set --config.warmstart.from_scratch=true to run the SFT instead")


def _check_demo_weights(config) -> None:
  """`warmstart.hard_turn_weight` != 1 and `hard_fraction` > 0 read the expert's `hard(state)`:
  an expert class registered without one is refused before any model is built (an expert
  made by a factory function is checked when the warm start builds it)."""
  w = config.warmstart
  if not w.enabled or (float(w.hard_turn_weight) == 1.0 and float(w.hard_fraction) == 0.0):
    return
  entry = envs.entry(config.env.name)
  expert = entry.part("expert") if entry.expert is not None else None
  _check(not isinstance(expert, type) or hasattr(expert, "hard"),
         f"config.warmstart.hard_turn_weight={w.hard_turn_weight} and hard_fraction="
         f"{w.hard_fraction} need an expert with hard(state); env {config.env.name!r}'s "
         f"{getattr(expert, '__name__', '')} has none: set them to 1 and 0")


def validate(config, *, engine=None, layout=None) -> None:
  """Check names against their registries and budgets against capacities.

  Without `engine`/`layout` only the config itself is checked; with them (after the env and
  the engine exist, still before any rollout) the KV page pool is checked too.
  """
  errors = range_errors(config)   # every numeric field against its declared range, first
  _check(not errors, "; ".join(errors))
  m, r, t, s = config.model, config.rollout, config.train, config.sampler
  _check(m.preset in set(PRESETS) | {"hf"},
         f"config.model.preset={m.preset!r}; known: {sorted(PRESETS) + ['hf']}")
  _check(m.dtype in DTYPES and m.param_dtype in DTYPES,
         f"config.model.dtype={m.dtype!r} / param_dtype={m.param_dtype!r}; known: {sorted(DTYPES)}")
  _check(config.env.name in envs.registered(),
         f"config.env.name={config.env.name!r}; registered: {envs.registered()}")
  _check(envs.entry(config.env.name).tasks is not None,
         f"config.env.name={config.env.name!r} was registered without a task set: "
         f"tree_rl.envs.register({config.env.name!r}, factory, tasks=...)")
  import jax
  per_process = int(r.prompts_per_step) // jax.process_count()
  _check(int(t.minibatches) <= per_process,
         f"config.train.minibatches={t.minibatches} exceeds config.rollout.prompts_per_step="
         f"{r.prompts_per_step} ({per_process} per process): every minibatch needs at least one "
         "prompt on every process")
  _check(s.kv_dtype in KV_DTYPES, f"config.sampler.kv_dtype={s.kv_dtype!r}; known: {KV_DTYPES}")
  _check(s.attention in ATTENTION, f"config.sampler.attention={s.attention!r}; known: {ATTENTION}")
  _check_shards(config)
  _check_env(config.env)
  if m.preset == "hf":
    path = m.hf_path
    _check(bool(path) and os.path.isfile(os.path.join(path, "config.json")),
           f"config.model.hf_path={path!r} is not a local checkpoint directory with a config.json "
           f"(model=hf reads local files only)")
  try:
    rollout_build.validate(config)
    validate_learner(config)
  except (KeyError, ValueError) as e:
    raise ConfigError(str(e).strip("'\"")) from e
  for field, off in (("top_k", 0), ("top_p", 1.0)):
    _check(r[field] == off,
           f"config.rollout.{field}={r[field]}: training refuses top-k / top-p filters (the "
           f"learner's policy is the unfiltered softmax(logits / temperature), so the gradient "
           f"would be for a policy the samples did not come from); set it to {off}")
  _check(config.warmstart.attention in LEARNER_ATTENTION,
         f"config.warmstart.attention={config.warmstart.attention!r}; known: {LEARNER_ATTENTION}")
  _check_shipped_policy(config)
  _check_demo_weights(config)
  if int(r.budget) > 0:
    calls = int(config.env.max_calls) if "max_calls" in envs.entry(config.env.name).config_fields else None
    one = trajectory_cost(r.budget_unit, max_turns=int(r.max_turns),
                          max_tokens_per_turn=int(r.max_tokens_per_turn), max_calls=calls,
                          prompt_tokens=None if engine is None else engine.prompt_capacity,
                          obs_tokens=None if engine is None else engine.obs_capacity)
    _check(one is None or int(r.budget) >= one,
           f"config.rollout.budget={r.budget} {r.budget_unit} per prompt is less than one "
           f"trajectory can take ({one}: config.rollout.max_turns={r.max_turns}, "
           f"config.rollout.max_tokens_per_turn={r.max_tokens_per_turn}"
           + (f", config.env.max_calls={calls}" if calls is not None and r.budget_unit == "tool_calls" else "")
           + "): raise the budget")
  rows = int(config.learner.row_tokens)
  _check(engine is None or rows == 0 or rows >= engine.max_context(),
         f"config.learner.row_tokens={rows} is shorter than the longest trajectory this rollout "
         f"can make ({0 if engine is None else engine.max_context()} tokens: prompt + "
         f"config.rollout.max_turns={r.max_turns} x (config.rollout.max_tokens_per_turn="
         f"{r.max_tokens_per_turn} + observation)); raise it (a multiple of "
         f"config.learner.attention_block={config.learner.attention_block})")
  if engine is not None and layout is not None and int(s.num_pages) > 0:
    from tree_rl.rollout.capacity import rollout_shards
    page, shards = int(s.page_size), rollout_shards(config)
    need = -(-pages_needed(engine, layout, page) // shards)   # num_pages is per data shard
    _check(int(s.num_pages) >= need,
           f"config.sampler.num_pages={s.num_pages} is too small for this rollout: "
           f"{layout.num_prompts // shards} prompts per data shard (config.rollout.prompts_per_step "
           f"over {shards} shard(s)) x {layout.slots} live branches of up to "
           f"{engine.max_context()} tokens need up to {need} pages of {page} tokens "
           f"(config.sampler.page_size) per shard; raise config.sampler.num_pages to >= {need}")
  chunk = int(config.scorer.prm_chunk_rows)
  if layout is not None and chunk and config.scorer.name == "prm":
    from tree_rl.rollout.capacity import rollout_shards
    per_shard = layout.num_prompts // rollout_shards(config) * layout.slots
    _check(per_shard <= chunk or per_shard % chunk == 0,
           f"config.scorer.prm_chunk_rows={chunk} must divide the PRM's rows per data shard "
           f"({per_shard}: {layout.num_prompts // rollout_shards(config)} prompts x "
           f"{layout.slots} branch slots)")


def _check_shards(config) -> None:
  """The prompts split over the processes; an explicit `sampler.data_shards` must divide each
  process's prompts and fit its devices."""
  import jax
  from tree_rl.rollout.capacity import tensor_size
  want, r = int(config.sampler.data_shards), config.rollout
  _check(int(r.prompts_per_step) % jax.process_count() == 0,
         f"config.rollout.prompts_per_step={r.prompts_per_step} does not split over the job's "
         f"{jax.process_count()} processes: use a multiple of {jax.process_count()}")
  per = int(r.prompts_per_rollout)
  _check(per == 0 or (int(r.prompts_per_step) % per == 0 and per % jax.process_count() == 0),
         f"config.rollout.prompts_per_rollout={per} must divide prompts_per_step="
         f"{r.prompts_per_step} and split over the job's {jax.process_count()} processes (0: the "
         f"whole step in one rollout)")
  if want == 0:
    return
  procs, tensor = jax.process_count(), tensor_size(config.mesh)
  prompts = (per or int(r.prompts_per_step)) // procs
  field = f"prompts_per_rollout={per}" if per else f"prompts_per_step={r.prompts_per_step}"
  _check(prompts % want == 0,
         f"config.rollout.{field} ({prompts} per process over "
         f"{procs} process(es)) does not split over config.sampler.data_shards={want}: use a "
         f"multiple of {want * procs} prompts or another shard count (0: automatic)")
  _check(want * tensor <= jax.local_device_count(),
         f"config.sampler.data_shards={want} x tensor {tensor} needs {want * tensor} devices; "
         f"this process has {jax.local_device_count()}")


def _check_env(env) -> None:
  """The registered envs' checks of their `config.env` fields (the first problem is raised)."""
  problems = envs.problems(env)
  if problems:
    raise ConfigError(problems[0])
