"""The config schema shared by every experiment family, and `key=value` argument parsing.

Every knob lives here with a comment; `configs/*.py` start from `base_config()` and override.
Configs are locked, so a misspelled `--config.section.field=...` fails with the known fields.
"""

from __future__ import annotations

from typing import Any

import ml_collections


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parse `"model=tiny,smoke"` into a ConfigDict over `defaults`.

  A bare word is a boolean flag set to True; values take the type of their default.
  Unknown keys fail with the known ones.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    key, _, value = item.partition("=")
    key = key.strip()
    if key not in defaults:
      raise KeyError(f"unknown config argument {key!r}; known: {sorted(defaults)}")
    default = defaults[key]
    if not _:
      out[key] = True
    elif isinstance(default, bool):
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = type(default)(value) if default is not None else value
  return out


def base_config() -> ml_collections.ConfigDict:
  """All sections and fields with their defaults (unlocked; call `lock` when done)."""
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = dict(
      preset="tiny",            # tiny | small | hf
      hf_path="",               # local HF checkpoint directory when preset=hf
      dtype="float32",          # compute dtype: float32 | bfloat16
      param_dtype="float32",    # parameter (master) dtype
  )
  c.tokenizer = dict(
      kind="builtin",           # builtin | hf
      path="",                  # local tokenizer directory when kind=hf (defaults to model.hf_path)
  )
  c.env = dict(
      name="frozenlake",        # a name in tree_rl.envs' registry
      preset="rllm",            # env preset (frozenlake: rllm | ragen)
      max_turns=10,             # agent turns per episode
  )
  c.sampler = dict(
      page_size=16,             # tokens per KV page
      num_pages=4096,           # KV pages per data shard; raise when rollouts report exhaustion
      kv_dtype="bfloat16",      # KV cache dtype: bfloat16 | float32
      attention="auto",         # paged attention implementation: auto | reference | pallas
  )
  c.rollout = dict(
      method="patr",            # chain | tree_grpo | patr | tree_random
      prompts_per_step=8,       # prompts sampled per RL step
      max_tokens_per_turn=64,   # new tokens per agent turn
      temperature=1.0,
      top_k=0,                  # 0 disables top-k
      top_p=1.0,
  )
  c.learner = dict(
      advantage="grpo",         # a name in tree_rl.learner.advantages' registry
      learning_rate=1e-6,
  )
  c.mesh = dict(
      shape=(-1, 1, 1),         # devices along (data, fsdp, tensor); -1 fills the rest
      axis_names=("data", "fsdp", "tensor"),
      distributed=False,        # call jax.distributed.initialize (multi-host)
  )
  c.checkpoint = dict(
      every_steps=50,           # save every N RL steps
      keep=3,                   # last N checkpoints kept (plus the best by eval)
  )
  c.logging = dict(
      every_steps=1,
      tensorboard=True,
      progress_bar=True,
  )
  return c


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Lock the field set: overriding a field that does not exist now raises."""
  config.lock()
  return config


def parse_flags_or_exit(argv):
  """absl flags parser for `app.run(main, flags_parser=...)`: a bad --config override
  (unknown field, wrong type) prints one clear line and exits with status 2."""
  import sys

  from absl import flags
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
    message = str(e).strip("'\"").replace("\\n", " ").replace("\\'", "'")
    print(f"error: bad command-line flag or config override: {message}", file=sys.stderr)
    sys.exit(2)
