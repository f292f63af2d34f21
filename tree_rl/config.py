"""The config schema shared by every experiment family, and `key=value` argument parsing.

Every knob lives here with a comment, except an advantage estimator's own and an environment's
own: each declares them where it is registered (`tree_rl.learner.advantages.register`,
`tree_rl.envs.register(..., fields=...)`) and `base_config` adds them to `learner` / `env`.
`configs/*.py` start from `base_config()` and override.
Configs are locked, so a misspelled `--config.section.field=...` fails with the known fields.
"""

from __future__ import annotations

import math
from typing import Any

import ml_collections
from absl import flags


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parse `"model=tiny,smoke"` into a ConfigDict over `defaults`.

  A bare word is a boolean flag set to True; values take the type of their default (booleans
  parse as command-line boolean flags do). Unknown keys and bad values fail naming the key.
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
    elif isinstance(default, bool):   # the parser of command-line boolean flags: same values, same error
      try:
        out[key] = flags.BooleanParser().parse(value)
      except ValueError as e:
        raise ValueError(f"config argument {key}={value!r}: {e.args[0]} (true/false, 1/0, t/f)"
                         ) from None
    else:
      out[key] = type(default)(value) if default is not None else value
  return out


def base_config(imports: tuple[str, ...] = ()) -> ml_collections.ConfigDict:
  """All sections and fields with their defaults (unlocked; call `lock` when done).

  imports: modules to import first, each registering components (envs, rollout methods,
  process scorers, advantage estimators) whose own fields then join the schema; they are kept
  in `config.imports`, so a run's config.json reads back (`from_json`, `experiments.evaluate`)
  with the same fields.
  """
  import importlib

  for module in imports:
    importlib.import_module(module)
  c = ml_collections.ConfigDict()
  c.seed = 0                   # init, warm start, eval and (rl_seed -1) RL steps
  c.imports = tuple(imports)   # modules imported first: their components' fields join the schema

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
      preset="rllm",            # env preset (frozenlake: rllm | rllm_small | ragen; toolcall: default)
      data_dir="",              # TFDS dir of prepared task sets (map sets, KB, ...); "" = ~/tensorflow_datasets (prepared there from data_seed when missing)
      data_seed=42,             # seed of the fixed FrozenLake map sets (rLLM: 42) and of the toolcall KB
                                # (+ every registered env's own fields, e.g. frozenlake's goal_hint)
  )
  c.sampler = dict(
      page_size=16,             # tokens per KV page
      num_pages=4096,           # KV pages per data shard (0: the rollouts' worst case, computed); a pool too small is refused up front
      kv_dtype="bfloat16",      # KV cache dtype: bfloat16 | float32
      attention="auto",         # paged attention: auto (pallas on TPU, else cascade) | cascade | pallas | reference
      max_shared_pages=256,     # cascade: most pages read once per step for all rows (rest go per row)
      obs_chunk=64,             # observation tokens prefilled per call, as many calls as the longest
                                # needs: one program per row count (0: the whole observation capacity at once)
      data_shards=0,            # rollouts' data shards on this process's devices (each owns its prompts' slots
                                # and pages); 0: the most that divide rollout.prompts_per_step and fit the devices
      # the page-table width is not a knob: it is the longest context the rollout can reach
  )
  c.rollout = dict(
      method="patr",            # a name in tree_rl.rollout.methods' registry
      prompts_per_step=8,       # prompts sampled per RL step
      prompts_per_rollout=0,    # prompts rolled out together: a step runs prompts_per_step / this
                                # rollouts in turn and the KV pool holds one (0: all at once)
      max_tokens_per_turn=64,   # new tokens per agent turn
      temperature=1.0,          # sampling temperature; the learner trains softmax(logits / temperature)
      top_k=0,                  # 0 disables top-k
      top_p=1.0,                # 1 disables top-p (training refuses top-k / top-p filters)
      max_turns=10,             # agent turns per episode and tree depth limit (the env's max_turns)
                                # (+ every registered method's own fields, e.g. patr's score_every)
      budget=0,                 # per-prompt budget in budget_unit; 0 = unlimited
      budget_unit="generated",  # generated | computed (generated + prefilled) | tool_calls | env_steps
      dynamic_sampling=False,   # DAPO: drop groups that all succeed or all fail and draw more prompts
                                # until prompts_per_step informative groups (or max_draws draws)
      draw_factor=3,            # dynamic sampling: a draw rolls out draw_factor x prompts_per_step prompts (DAPO: 3)
      max_draws=10,             # dynamic sampling: draws per RL step at most (DAPO: 10; then the step trains
                                # on the groups it has, with a warning and rollout/groups_short)
  )
  c.scorer = dict(
      name="heuristic",         # process scorer: heuristic | judge | prm | random | a registered name
                                # (+ every registered scorer's own fields, e.g. the judge's judge_lambda)
  )
  c.learner = dict(
      advantage="grpo",         # a name in tree_rl.learner.advantages' registry
      adv_eps=1e-6,             # std guard of the advantage normalisation
                                # (+ every registered estimator's knobs, e.g. gigpo's step_weight)
      shared_advantage="per_leaf",  # per_leaf: a shared prefix token is trained once per leaf with each
                                # leaf's advantage (ARPO's soft attribution) | mean: with the mean of
                                # the advantages of the leaves below it (ARPO's hard attribution)
      overlong_window=0.0,      # DAPO overlong shaping: penalty window as a fraction of the most tokens a
                                # trajectory can generate (max_turns x max_tokens_per_turn); 0 off (DAPO: 0.2)
      overlong_truncated="keep",  # a trajectory with a reply cut at max_tokens_per_turn: keep (soft penalty
                                # only) | penalize (reward - overlong_penalty) | mask (not trained on); needs overlong_window > 0
      overlong_penalty=1.0,     # the most overlong shaping takes off (DAPO: 1 on +-1 rewards, half their
                                # range; its preset here 0.5, half the range of 0/1 success rewards)
      packed=True,              # tree-packed batches (each node's tokens once) vs one row per leaf
      aggregation="traj_mean_group_mean",  # traj_mean | traj_mean_group_mean | token_mean | token_sum (configs' algo presets set each method's own)
      clip_low=0.28,            # rho clipped below at 1 - clip_low (PATR: 0.28)
      clip_high=0.28,           # rho clipped above at 1 + clip_high
      dual_clip=0.0,            # dual-clip PPO: a token of A < 0 adds at most dual_clip * |A| (verl's
                                # clip_ratio_c: 3 by default, DAPO's recipe 10); 0 off, else > 1
      kl_coef=0.001,            # k3 KL-to-reference coefficient (0 disables)
      entropy_coef=0.0,         # entropy bonus coefficient (0 disables)
      log_entropy=True,         # compute the policy entropy metric (one more pass over the logits)
      learning_rate=1e-6,       # AdamW peak learning rate
      lr_schedule="constant",   # constant | cosine (after warm-up)
      warmup_steps=0,           # linear learning-rate warm-up steps
      total_steps=400,          # schedule length (cosine decay ends here)
      weight_decay=0.0,         # AdamW decoupled weight decay
      b1=0.9,                   # AdamW beta1
      b2=0.999,                 # AdamW beta2
      adam_eps=1e-8,            # AdamW epsilon
      grad_clip=1.0,            # global-norm gradient clipping (0 disables)
      microbatches=1,           # gradient accumulation: micro-batches per update (with row_tokens=0)
      row_tokens=0,             # >0: fixed-shape micro-batches of microbatch_rows rows of this many tokens,
                                # trees (packed) or root-to-leaf paths (not packed) several per row, as
                                # many micro-batches as the step needs; 0: one bucketed batch per update
      microbatch_rows=8,        # rows of each fixed-shape micro-batch (with row_tokens > 0)
      attention="auto",         # auto (cuDNN flash on GPU for causal rows) | einsum | xla | cudnn
      remat="none",             # none | full | dots: per-layer rematerialisation in the backward
      logits_chunk=0,           # >0: vocabulary projection + log-softmax over chunks of this many tokens
      packed_attention="auto",  # packed rows: auto (pallas on TPU, blocks of 128n; else block) | block | pallas | dense
      attention_block=32,       # packed rows: attention block size (pack_trees' block)
  )
  c.mesh = dict(
      shape=(-1, 1, 1),         # devices along (data, fsdp, tensor); -1 fills the rest
      axis_names=("data", "fsdp", "tensor"),  # names of the mesh axes, in shape's order
      distributed=False,        # call jax.distributed.initialize (multi-host)
      coordinator_address="",   # host:port of process 0 ("" lets the cluster environment decide)
      num_processes=0,          # processes in the job (0: from the cluster environment)
      process_id=-1,            # this process's index (-1: from the cluster environment)
      # logical axis -> mesh axes; a dim that does not divide its mesh axes stays replicated
      rules=(("batch", ("data", "fsdp")), ("vocab", "tensor"), ("embed", "fsdp"),
             ("mlp", "tensor"), ("heads", "tensor"), ("kv_heads", "tensor"), ("head_dim", None)),
  )
  c.train = dict(
      num_steps=100,            # RL steps (rollout -> advantages -> PPO epochs)
      rl_seed=-1,               # seed of the RL steps' prompt order and rollout keys (-1 = config.seed);
                                # init, warm start and eval keep config.seed: runs differing only here
                                # share a warm start and eval episodes (a control for run-to-run spread)
      ppo_epochs=1,             # passes over each step's rollouts
      minibatches=1,            # updates per epoch (the step's prompts split evenly)
      eval_every=25,            # evaluate every N RL steps (and before the first, and at the end)
      eval_prompts=0,           # held-out prompts per evaluation (0 = the whole test split)
      eval_samples=4,           # sampled episodes per prompt for the sampled success and pass@k
      eval_chunk=0,             # held-out prompts per evaluation rollout (0 = all in one rollout per mode)
      num_train_tasks=0,        # train-split size to prepare (0 = the dataset preset's own)
      num_test_tasks=0,         # test-split size to prepare (0 = the dataset preset's own)
  )
  c.checkpoint = dict(
      every_steps=50,           # save every N RL steps
      keep=3,                   # last N checkpoints kept (plus the best by eval)
  )
  c.logging = dict(
      every_steps=1,            # write metrics every N RL steps
      tensorboard=True,         # also write TensorBoard event files
      progress_bar=True,        # a progress bar on the console (process 0)
  )
  c.warmstart = dict(
      enabled=True,             # supervised warm start on expert demos before RL (off for a pretrained checkpoint)
      policy="",                # a shipped warm-start policy (tree_rl/warmstart/policies/<name>, verified on
                                # load): RL starts from it instead of the SFT below; "" = run the SFT
      from_scratch=False,       # run the SFT below even when `policy` names a shipped one
      num_demos=512,            # demonstration episodes generated on device
      epsilon=0.1,              # expert noise: per-move chance of a random move / distractor reply
      loss_on_noise=False,      # also train on the noisy replies (else only their context is kept)
      hard_fraction=0.0,        # share of demos starting where the right move needs the state read
                                # (FrozenLake: next to a hole), drawn from 8x as many episodes; 0 = as generated
      hard_turn_weight=1.0,     # loss weight of the replies of turns taken where the right move needs the
                                # state read (FrozenLake: a hole next to the player); the others weigh 1
      max_len=256,              # tokens per demo sequence (prompt, replies, observations); longer are cut
      pack=False,               # pack several whole demos into each max_len row (each attends within itself
                                # from position 0): fewer padded tokens; batch_size counts rows either way
      steps=100,                # SFT updates
      batch_size=16,            # demo sequences per update
      learning_rate=3e-3,       # AdamW peak learning rate
      warmup_steps=20,          # linear warm-up, then cosine decay to 10% of the peak
      weight_decay=0.0,         # AdamW decoupled weight decay (matrices only)
      grad_clip=1.0,            # global-norm gradient clipping (0 disables)
      eval_every=25,            # SFT steps between evaluate(params) calls (when a callback is given)
      target_success=1.0,       # stop once greedy success on train tasks >= this (1.0: run all steps)
      eval_prompts=64,          # train prompts of that check (the held-out split is never used)
      stop_window=1,            # the stopping rule: stop once the mean of the last n checks >= target_success
      attempts=1,               # attempts that miss the target are redone from a fresh init, up to this many
      attention="auto",         # learner attention implementation (see learner.attention)
  )
  _add_declared(c)
  return c


def _add_declared(c) -> None:
  """Every field a registered component declares (`tree_rl.fields`: envs, rollout methods,
  process scorers, advantage estimators), at its default in its section; their ranges join
  `RANGES`."""
  from tree_rl import envs, fields   # noqa: F401 (importing registers the built-ins)
  from tree_rl.learner import advantages  # noqa: F401
  from tree_rl.rollout import methods, scorers  # noqa: F401

  for section in fields.sections():
    for name, (owners, f) in fields.declared(section).items():
      if name in c[section]:
        raise ValueError(f"{owners[0]!r} declares the field {name!r}, which is already "
                         f"config.{section}.{name}")
      c[section][name] = f.default
      if f.range:
        RANGES[f"{section}.{name}"] = f.range


# ----------------------------------------------------------------------------- numeric ranges

# The range of every numeric field of `base_config`, beside the schema: "int" or "num" (a finite
# float), then bounds, "[" / "]" closed, "(" / ")" open, "_" unbounded. Checked by
# `check_ranges` (called by tree_rl.validation.validate) before anything runs or is written;
# tests/configs/test_ranges.py fails on a numeric field that has none.
_INT_POS, _INT_NN, _UNIT, _NN, _POS = "int [1 _)", "int [0 _)", "num [0 1]", "num [0 _)", "num (0 _)"
RANGES = {
    "seed": "int [0 2147483648)",
    "env.data_seed": _INT_NN,
    "sampler.page_size": _INT_POS, "sampler.num_pages": _INT_NN, "sampler.max_shared_pages": _INT_NN,
    "sampler.obs_chunk": _INT_NN, "sampler.data_shards": _INT_NN,
    "rollout.prompts_per_step": _INT_POS, "rollout.prompts_per_rollout": _INT_NN, "rollout.max_tokens_per_turn": _INT_POS,
    "rollout.temperature": "num (0 100]", "rollout.top_k": _INT_NN, "rollout.top_p": "num (0 1]",
    "rollout.max_turns": _INT_POS,
    "rollout.budget": _INT_NN, "rollout.max_draws": _INT_POS,
    "rollout.draw_factor": _INT_POS,
    "learner.adv_eps": "num (0 1]", "learner.overlong_window": _UNIT, "learner.overlong_penalty": _NN, "learner.clip_low": "num [0 1)", "learner.clip_high": _NN,
    "learner.dual_clip": "num [0 100]",
    "learner.kl_coef": "num [0 100]", "learner.entropy_coef": "num [0 1]",
    "learner.learning_rate": "num (0 1]", "learner.warmup_steps": _INT_NN,
    "learner.total_steps": _INT_POS, "learner.weight_decay": _NN, "learner.b1": "num [0 1)",
    "learner.b2": "num [0 1)", "learner.adam_eps": "num (0 1]", "learner.grad_clip": _NN,
    "learner.microbatches": _INT_POS, "learner.row_tokens": _INT_NN,
    "learner.microbatch_rows": _INT_POS, "learner.logits_chunk": _INT_NN,
    "learner.attention_block": _INT_POS,
    "mesh.num_processes": _INT_NN, "mesh.process_id": "int [-1 _)",
    "train.num_steps": _INT_POS, "train.rl_seed": "int [-1 2147483648)", "train.ppo_epochs": _INT_POS,
    "train.minibatches": _INT_POS, "train.eval_every": _INT_POS, "train.eval_prompts": _INT_NN,
    "train.eval_samples": _INT_POS, "train.eval_chunk": _INT_NN, "train.num_train_tasks": _INT_NN,
    "train.num_test_tasks": _INT_NN,
    "checkpoint.every_steps": _INT_POS, "checkpoint.keep": _INT_POS, "logging.every_steps": _INT_POS,
    "warmstart.num_demos": _INT_POS, "warmstart.epsilon": _UNIT, "warmstart.hard_fraction": _UNIT,
    "warmstart.hard_turn_weight": _POS,
    "warmstart.max_len": _INT_POS, "warmstart.steps": _INT_NN, "warmstart.batch_size": _INT_POS,
    "warmstart.learning_rate": "num (0 1]", "warmstart.warmup_steps": _INT_NN,
    "warmstart.weight_decay": _NN, "warmstart.grad_clip": _NN, "warmstart.eval_every": _INT_POS,
    "warmstart.target_success": _UNIT, "warmstart.eval_prompts": _INT_POS,
    "warmstart.attempts": _INT_POS, "warmstart.stop_window": _INT_POS,
}


def _in_range(value, spec: str) -> bool:
  kind, lo, hi = spec.split()
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return False
  if kind == "int" and not isinstance(value, int) or not math.isfinite(value):
    return False
  low, high = lo[1:], hi[:-1]
  if low != "_" and (value < float(low) or lo[0] == "(" and value == float(low)):
    return False
  return high == "_" or value < float(high) or hi[-1] == "]" and value == float(high)


def describe(spec: str) -> str:
  """A range as words: "an integer >= 1", "a finite number in (0, 1]"."""
  kind, lo, hi = spec.split()
  what = "an integer" if kind == "int" else "a finite number"
  if hi == "_)":
    return f"{what} {'>=' if lo[0] == '[' else '>'} {lo[1:]}" if lo != "(_" else what
  return f"{what} in {lo[0]}{lo[1:]}, {hi}".replace("(_", "(-inf")


def range_errors(config, sections: tuple[str, ...] | None = None) -> list[str]:
  """One message per numeric field (of `sections`, default all) outside its declared range (or
  of the wrong type)."""
  out = []
  for key, spec in RANGES.items():
    section, _, field = key.rpartition(".")
    if sections is not None and section not in sections:
      continue
    node = config[section] if section else config
    if field in node and not _in_range(node[field], spec):
      out.append(f"config.{key}={node[field]!r} must be {describe(spec)}")
  return out


def lock(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Lock the field set: overriding a field that does not exist now raises."""
  config.lock()
  return config


def _shipped_config_path(arg: str) -> str:
  """`--config=configs/NAME.py[:args]` names the shipped config file when no such file is under
  the working directory (a run started outside the repository root)."""
  import os

  prefix = "--config=configs/"
  if not arg.startswith(prefix):
    return arg
  path, colon, rest = arg[len("--config="):].partition(":")
  if os.path.exists(path):
    return arg
  import configs
  shipped = os.path.join(os.path.dirname(configs.__file__), path[len("configs/"):])
  return f"--config={shipped}{colon}{rest}" if os.path.exists(shipped) else arg


def parse_flags_or_exit(argv):
  """absl flags parser for `app.run(main, flags_parser=...)`: a bad --config override
  (unknown field, wrong type) prints one clear line and exits with status 2. Library logs
  (orbax, TFDS, jax) stay at WARNING unless `--verbosity` asks for more."""
  import sys

  from tree_rl import console

  try:
    rest = flags.FLAGS([_shipped_config_path(a) for a in argv])
    console.quiet_libraries()
    return rest
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
    message = str(e).strip("'\"").replace("\\n", "\n").replace("\\'", "'")
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if any(line.startswith("Traceback (most recent call last)") for line in lines):
      # a config file's get_config raised: its own last line is the message
      message = f"{lines[0].rstrip(':')}: {lines[-1]}"
    else:
      message = " ".join(lines)
    print(f"error: bad command-line flag or config override: {message}", file=sys.stderr)
    sys.exit(2)


def exit_on_bad_input(main):
  """Wrap an entry point's `main`: a config that cannot run (or a ValueError naming a `config.`
  field, such as an env's unknown preset or split), a checkpoint that cannot be read
  or an unusable HF checkpoint prints one line naming the problem and exits with status 2
  (before any compute when it is the config), instead of a traceback."""
  import functools
  import sys

  @functools.wraps(main)
  def wrapped(argv):
    from tree_rl.checkpointing import CheckpointRestoreError, CheckpointSaveError
    from tree_rl.models.hf_io import CheckpointError
    from tree_rl.validation import ConfigError
    try:
      return main(argv)
    except (ConfigError, CheckpointRestoreError, CheckpointSaveError, CheckpointError) as e:
      print(f"error: {type(e).__name__}: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
      sys.exit(2)
    except ValueError as e:   # raised where a config value is used (an env's unknown preset, ...)
      if "config." not in str(e):
        raise
      print(f"error: ConfigError: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
      sys.exit(2)

  return wrapped


# ----------------------------------------------------------------------------- saved configs

# Fields that change neither the policy nor the held-out set: an evaluation may override them.
EVAL_ONLY = ("train.eval_samples", "train.eval_prompts", "train.eval_chunk", "sampler.num_pages",
             "sampler.attention",
             "sampler.max_shared_pages", "sampler.data_shards", "logging.", "mesh.", "checkpoint.")


def _flat(c, prefix="") -> dict:
  out = {}
  for k, v in c.items():
    if isinstance(v, (dict, ml_collections.ConfigDict)):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _tuples(v):
  return tuple(_tuples(x) for x in v) if isinstance(v, (list, tuple)) else v


def from_json(text: str) -> ml_collections.ConfigDict:
  """A locked config from a run's saved `config.json` (the schema's types restored)."""
  import json

  saved = json.loads(text)
  try:
    c = base_config(tuple(saved.get("imports", ())))
  except ImportError as e:
    raise ValueError(f"saved config.imports names a module that does not import here: {e}") from None
  for key, value in _flat(saved).items():
    section, _, field = key.partition(".")
    if section not in c or (field and field not in c[section]):
      raise ValueError(f"saved config field {key!r} is not in this version's schema")
    if field:
      c[section][field] = _tuples(value)
    else:
      c[section] = value
  return lock(c)


def differences(a, b) -> list[str]:
  """Dotted fields whose values differ between configs `a` and `b`."""
  fa, fb = _flat(a), _flat(b)
  return sorted(k for k in set(fa) | set(fb) if _tuples(fa.get(k)) != _tuples(fb.get(k)))


def _eval_only(key: str) -> bool:
  return any(key == e or (e.endswith(".") and key.startswith(e)) for e in EVAL_ONLY)


def eval_config(workdir: str, given=None, *, overrides=None) -> ml_collections.ConfigDict:
  """The config to evaluate `workdir`'s checkpoints with: the run's saved config.json.

  given: a config from the command line. With `overrides` (the dotted fields set by
  --config.x=... when no --config file was named) only those fields are taken from it; without,
  `given` is an explicit --config and is compared whole. Either way, a field outside `EVAL_ONLY`
  that differs from the run's is refused, naming the fields.
  """
  import os

  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} not found: is {workdir!r} a training run directory?")
  with open(path) as f:
    saved = from_json(f.read())
  if given is None:
    return saved
  flat_given, flat_saved = _flat(given), _flat(saved)
  fields = (differences(saved, given) if overrides is None else
            sorted(k for k in overrides if _tuples(flat_given[k]) != _tuples(flat_saved[k])))
  bad = [k for k in fields if not _eval_only(k)]
  if bad:
    shown = ", ".join(f"{k}={flat_given.get(k)!r} (run: {flat_saved.get(k)!r})" for k in bad[:8])
    shown += f" and {len(bad) - 8} more" if len(bad) > 8 else ""
    raise ValueError(f"the given config differs from {path} in fields that change the policy or "
                     f"the evaluation set: {shown}; evaluate with the run's own config (omit "
                     f"--config) and override only {', '.join(e + '*' if e.endswith('.') else e for e in EVAL_ONLY)}")
  out = saved.copy_and_resolve_references()
  for k in fields:
    section, field = k.split(".", 1)
    out[section][field] = _tuples(flat_given[k])
  return lock(out)
