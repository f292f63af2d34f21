"""`train_and_evaluate(config, workdir)`: warm start -> RL loop -> evaluation, with exact resume.

One RL step: a batch of train prompts (in a seeded order) -> rollout with the configured method
on the shared engine -> advantages (registry) -> `train.ppo_epochs` x `train.minibatches`
sharded updates (tree-packed or per-leaf) -> the sampler's cache is rebuilt on the new weights.
Every random choice of step s derives from (seed, s), so a run resumed from a checkpoint
continues exactly as if it had never stopped; the RL steps take `rl_seed(config)`, the init,
warm start and evaluations config.seed. Importable from a notebook.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tree_rl import compile_cache, console, hosts, tasks
from tree_rl.checkpointing import Checkpointer
from tree_rl.evaluation import Evaluator
from tree_rl.learner import from_rollout
from tree_rl.learner.train_step import copy_params, make_train_step
from tree_rl.metrics import MetricsWriter, NullWriter, plot_curves, read_jsonl
from tree_rl.models import build_model, build_tokenizer
from tree_rl.rollout import build as rollout_build, capacity
from tree_rl.rollout.driver import merge_statistics, run, warm_up as warm_up_rollouts
from tree_rl.rollout.engine import Layout
from tree_rl import sampling
from tree_rl.validation import validate


@dataclasses.dataclass
class Parts:
  """Everything built once from the config."""
  config: Any
  tokenizer: Any
  model: Any                 # NNX policy model (the sampler's weights are copied into it)
  model_config: Any
  tasks: tasks.TaskSet
  method: Any                # the rollout method (branching rule)
  engine: Any
  scorer: Any
  layout: Layout
  train_step: Any
  evaluator: Evaluator
  rollout_mesh: Any = None   # this process's (data, tensor) mesh of the rollouts; None: one device


def build_parts(config) -> Parts:
  validate(config)
  tokenizer = build_tokenizer(config.tokenizer, config.model.hf_path)
  model, model_config = build_model(config.model, tokenizer, seed=int(config.seed))
  task_set = tasks.build(config, tokenizer)
  try:
    method, engine, layout = rollout_build.make_training_engine(config, task_set.train_env, tokenizer)
    mesh = capacity.rollout_mesh(config)
    scorer = rollout_build.make_scorer(config, method, env=task_set.train_env, tokenizer=tokenizer,
                                       policy_model=model, mesh=mesh)
    validate(config, engine=engine, layout=layout)
    train_step = make_train_step(config, model)
    evaluator = Evaluator(config, task_set.test_env, task_set.test_states, tokenizer,
                          shards=_shards(mesh))
  except BaseException:   # a refused config leaves no host env state behind
    task_set.close()
    raise
  return Parts(config, tokenizer, model, model_config, task_set, method, engine, scorer, layout,
               train_step, evaluator, mesh)


def _shards(mesh) -> int:
  return 1 if mesh is None else mesh.shape["data"]


# ----------------------------------------------------------------------------- state


def new_cache(parts: Parts, params, extra: list[tuple] = ()):
  """One sampler cache for training rollouts and evaluation (and the `extra` (engine, layout)
  rollouts), bound to `params`."""
  return capacity.config_cache(parts.config.sampler, _to_model(parts, params),
                               [(parts.engine, parts.layout)] + parts.evaluator.rollouts()
                               + list(extra), mesh=parts.rollout_mesh)


def warm_up(parts: Parts, cache):
  """Build every rollout program the run can meet (training turns at each row bucket, the
  evaluation's) before its first step; prints how many and how long. Returns the cache."""
  built0, s0 = compile_cache.programs_built()
  t = time.perf_counter()
  p = parts.layout.num_prompts   # one rollout's prompts
  states = tasks.take(parts.tasks.train_states, np.arange(p) % parts.tasks.num_train)
  cache = warm_up_rollouts(parts.engine, parts.method, cache, states,
                           budget=int(parts.config.rollout.budget))
  cache = parts.evaluator.warm_up(cache)
  built, s = compile_cache.programs_built()
  if hosts.is_main():
    console.write(f"rollout programs: {built - built0} built (or loaded) in "
                  f"{time.perf_counter() - t:.1f} s ({s - s0:.1f} s compiling)")
  return cache


def _to_model(parts: Parts, params) -> nnx.Module:
  return model_with(parts.model, params)


def model_with(model: nnx.Module, params) -> nnx.Module:
  """A copy of `model` carrying `params` (float32 master weights cast to the model's dtypes)."""
  graphdef, state = nnx.split(model)
  pure = nnx.to_pure_dict(state)
  cast = jax.tree.map(lambda new, old: jnp.asarray(new, old.dtype), params, pure)
  nnx.replace_by_pure_dict(state, cast)
  return nnx.merge(graphdef, state)


def _prompt_order(config, num_tasks: int, position: int, count: int) -> np.ndarray:
  """Task indices [position, position + count) of the seeded epoch-wise shuffled stream."""
  out = []
  for i in range(position, position + count):
    epoch, offset = divmod(i, num_tasks)
    perm = np.random.default_rng([rl_seed(config), epoch]).permutation(num_tasks)
    out.append(perm[offset])
  return np.asarray(out, np.int32)


def _prompt_batch(config, num_tasks: int, position: int, count: int
                  ) -> tuple[np.ndarray, np.ndarray]:
  """(task indices, group ids) of the prompts at stream positions [position, position + count).

  The group id is the stream position: an epoch boundary inside the batch can draw a task
  twice, and each copy is its own advantage group. Both derive from the step (exact resume).
  """
  return (_prompt_order(config, num_tasks, position, count),
          np.arange(position, position + count, dtype=np.int32))


def rl_seed(config) -> int:
  """The seed of the RL steps' prompt order and rollout keys: `train.rl_seed`, or config.seed
  when it is -1 (the default, so a run without it draws as before the knob existed)."""
  seed = int(config.train.rl_seed)
  return int(config.seed) if seed < 0 else seed


def rollout_key(config, step: int) -> jax.Array:
  """The key of step `step`'s first rollout draw: key(rl_seed) folded in with (step, 0)."""
  return _folded_key(rl_seed(config), (step, 0))


def _step_key(config, *path: int) -> jax.Array:
  """key(config.seed) folded in with `path` (a stream of the warm start or evaluation)."""
  return _folded_key(int(config.seed), path)


@jax.jit
def _folded_key(seed, path):
  """key(seed) folded in with each entry of `path` in turn (one program per path length)."""
  key = jax.random.key(seed)
  for x in path:
    key = jax.random.fold_in(key, x)
  return key


def eval_key(config) -> jax.Array:
  """One key for every evaluation: the same episodes' randomness at every step (common random
  numbers), so eval curves move only with the weights."""
  return _step_key(config, 2**31 - 2)


# ----------------------------------------------------------------------------- one RL step


def draw_prompts(config) -> int:
  """Prompts of one draw of a step: prompts_per_step, or draw_factor times as many with dynamic
  sampling (DAPO's generation batch of 3x the prompts)."""
  p = int(config.rollout.prompts_per_step)
  return p * int(config.rollout.draw_factor) if config.rollout.dynamic_sampling else p


def _draw(parts: Parts, cache, step: int, position: int, draw: int):
  """Draw `draw` of step `step`: this process's share of the prompts at stream positions
  [position, position + `draw_prompts`) (`hosts.share`), in rollouts of `parts.layout.num_prompts` prompts
  one after the other (`rollout.prompts_per_rollout`). Every random choice of a rollout folds
  in the prompt's id, so how the prompts are cut into rollouts changes nothing but memory.
  Returns (the rollouts' outputs, cache, task ids)."""
  config = parts.config
  offset, count = hosts.share(draw_prompts(config))
  ids, groups = _prompt_batch(config, parts.tasks.num_train, position + offset, count)
  key = rollout_key(config, step)
  key = key if draw == 0 else jax.random.fold_in(key, draw)
  outs, chunk = [], parts.layout.num_prompts
  for lo in range(0, count, chunk):
    states = tasks.take(parts.tasks.train_states, ids[lo:lo + chunk])
    out, cache = run(parts.engine, parts.method, cache, states, key,
                     prompt_ids=compile_cache.to_device(groups[lo:lo + chunk]), scorer=parts.scorer,
                     budget=int(config.rollout.budget), budget_unit=config.rollout.budget_unit)
    outs.append(out)
  return outs, cache, ids


def _rollouts(parts: Parts, cache, step: int, position: int):
  """The step's rollouts as training trees; returns (trees, prompts drawn, cache, metrics). With
  `rollout.dynamic_sampling` (DAPO), each draw rolls out `draw_prompts` (draw_factor x
  prompts_per_step) prompts, groups whose leaves all succeed or all fail (`informative_groups`)
  are dropped, and draws go on (at most `rollout.max_draws` in all) until `prompts_per_step`
  informative groups are kept; the extras are dropped (the batch is cut to the prompt count).
  Fewer after the last draw: the step trains on those, says so in one line and logs
  `rollout/groups_short` (the recipe raises an error there). Draw d of step s uses the prompts
  after those of draw d - 1 and a key of (rl_seed, s, d), and the stream position after the step
  is checkpointed, so a resumed run draws the same."""
  config = parts.config
  p = draw_prompts(config)
  mine = hosts.share(int(config.rollout.prompts_per_step))[1]   # groups this process trains on
  dynamic = bool(config.rollout.dynamic_sampling)
  eot = int(parts.tokenizer.end_of_turn_id)
  trees, first, spent, repeated = [], None, 0.0, 0
  kept = draws = 0
  missing = mine   # the most any process still lacks (every process draws as often)
  while draws < (int(config.rollout.max_draws) if dynamic else 1) and missing > 0:
    outs, cache, ids = _draw(parts, cache, step, position + draws * p, draws)
    jax.block_until_ready(outs[-1].tree.tokens)
    first = outs if first is None else first
    repeated += len(ids) - len(np.unique(ids))
    draws += 1
    for out in outs:
      spent += float(np.sum(np.asarray(out.budget.spent(config.rollout.budget_unit))))
      rows = np.arange(out.leaf.shape[0])
      if dynamic:
        rows = np.nonzero(from_rollout.informative_groups(out))[0][:mine - kept]
      trees += from_rollout.rollout_trees(
          config.learner, out, max_turns=int(config.rollout.max_turns),
          max_tokens_per_turn=int(config.rollout.max_tokens_per_turn), end_of_turn_id=eot,
          prompts=rows)
      kept += len(rows)
    missing = hosts.agree_max({"missing": mine - kept})["missing"]
  stats = merge_statistics([out.stats for out in first])
  metrics = {f"rollout/{k}": v for k, v in stats.items()}
  metrics["rollout/repeated_tasks"] = repeated   # copies beyond the first within a draw
  if dynamic:
    per_draw = hosts.share(p)[1]
    metrics.update({"rollout/draws": draws, "rollout/groups_kept": kept,
                    "rollout/groups_dropped": draws * per_draw - kept,
                    "rollout/groups_short": mine - kept,
                    "rollout/cost_per_kept_group": spent / max(kept, 1)})
    if missing > 0 and hosts.is_main():
      console.write(f"step {step + 1}: dynamic sampling kept {kept} of {mine} groups after "
                    f"{draws} draws of {p} prompts (rollout.max_draws); training on {kept}")
  return trees, draws * p, cache, metrics


def rl_step(parts: Parts, train_state, ref_params, cache, step: int, position: int):
  """Rollout(s) + updates for RL step `step` from stream position `position`; returns
  (train_state, cache, metrics, prompts drawn)."""
  config = parts.config
  t0 = time.perf_counter()
  trees, drawn, cache, metrics = _rollouts(parts, cache, step, position)
  cache = sampling.free(cache)   # the KV pool is not resident while the learner runs
  rollout_s = time.perf_counter() - t0
  t1 = time.perf_counter()
  batches = from_rollout.make_batches(config.learner, trees,
                                      minibatches=int(config.train.minibatches),
                                      row_multiple=parts.train_step.row_multiple)
  # A batch is one update: one array batch, or a list of fixed-shape micro-batches.
  each = lambda fn: [[fn(m) for m in b] if isinstance(b, list) else fn(b) for b in batches]  # noqa: E731
  tokens = sum(int(np.sum(np.asarray(m.loss_mask))) for b in batches
               for m in (b if isinstance(b, list) else [b])) * int(config.train.ppo_epochs)
  if hosts.count() > 1:   # this process's rows of each global batch
    batches = each(parts.train_step.shard_batch)
  if float(config.learner.kl_coef):
    batches = each(lambda b: parts.train_step.with_ref_logprobs(ref_params, b))
  learner_metrics = []
  for _ in range(int(config.train.ppo_epochs)):
    for batch in batches:
      train_state, m = parts.train_step(train_state, batch)
      learner_metrics.append(m)
  learner_metrics = jax.device_get(learner_metrics)
  learner_s = time.perf_counter() - t1
  metrics = hosts.mean_metrics(metrics)   # rollout numbers: the mean over processes
  metrics["learner/updates"] = len(learner_metrics)   # 0 when dynamic sampling kept no group
  for k in (learner_metrics[0] if learner_metrics else ()):
    # ratio_dev = mean |pi / pi_old - 1| of the first epoch: how far the learner's policy is
    # from the sampler's on the same tokens (bf16 KV, other kernels), before later epochs move it.
    ms = learner_metrics[:len(batches)] if k == "ratio_dev" else learner_metrics
    values = [float(m[k]) for m in ms]
    metrics[f"learner/{k}"] = sum(values) if k == "skipped" else float(np.mean(values))
  generated = metrics.get("rollout/budget/generated", 0)
  metrics.update({"throughput/rollout_tokens_per_s": generated / max(rollout_s, 1e-9),
                  "throughput/learner_tokens_per_s": tokens / max(learner_s, 1e-9),
                  "throughput/rollout_share": rollout_s / max(rollout_s + learner_s, 1e-9),
                  "time/step_s": rollout_s + learner_s})
  return train_state, cache, metrics, drawn


# ----------------------------------------------------------------------------- the program


class _StopRequest:
  """Ctrl-C (SIGINT) or SIGTERM: finish the current step, checkpoint, exit cleanly."""

  def __init__(self):
    self.requested = False
    self._old = {}

  def __enter__(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      try:
        self._old[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread (e.g. some notebook kernels): no handler
        pass
    return self

  def _handle(self, signum, frame):
    if self.requested:  # a second Ctrl-C stops at once
      raise KeyboardInterrupt
    self.requested = True
    print("\nstop requested: finishing this step, then saving a checkpoint", flush=True)

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, old)


def _checkpoint_state(train_state, ref_params):
  return {"train": train_state, "ref_params": ref_params}


def train_and_evaluate(config, workdir: str, parts: Parts | None = None) -> dict:
  """Run (or resume) the experiment in `workdir`; returns the final evaluation metrics.
  Multi-host (`mesh.distributed`): every process runs this; only process 0 writes files other
  than the checkpoints' arrays. `parts` (from `build_parts(config)`, its owner closes them)
  lets runs that differ only in `train.rl_seed` share their compiled programs."""
  from tree_rl.learner.sharding import maybe_initialize_distributed
  maybe_initialize_distributed(config.mesh)   # before anything touches a device
  start = compile_cache.programs_built()   # the programs this run builds count from here
  if parts is not None:
    if parts.config is not config:
      raise ValueError("train_and_evaluate: parts were built from another config")
    return _train_and_evaluate(config, workdir, parts, start)
  parts = build_parts(config)   # validates the config first: a bad one writes nothing
  try:
    return _train_and_evaluate(config, workdir, parts, start)
  finally:
    parts.tasks.close()   # a host env's workspaces end with the run


def _train_and_evaluate(config, workdir: str, parts: Parts, start: tuple[int, float]) -> dict:
  os.makedirs(workdir, exist_ok=True)
  if hosts.is_main():
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))
  # a computed warm start (step 0) is kept: the run's reference point, which other methods of
  # one seed start from (experiments/reports/run_reproductions.py)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep=int(config.checkpoint.keep),
                      best_metric="eval/greedy_success",
                      keep_steps=(0,) if _warm_starts(config) else ())
  writer = (MetricsWriter(workdir, tensorboard=bool(config.logging.tensorboard))
            if hosts.is_main() else NullWriter())
  train_state = parts.train_step.init()
  restored = ckpt.restore(_checkpoint_state(jax.eval_shape(lambda: train_state),
                                            jax.eval_shape(lambda: train_state.params)))
  num_params = sum(x.size for x in jax.tree.leaves(nnx.state(parts.model, nnx.Param)))
  if hosts.is_main():
    print(console.startup_block(
        config, workdir, num_params=int(num_params), mesh=parts.train_step.mesh,
        rollout_mesh=parts.rollout_mesh,
        resumed_from=None if restored is None else f"step {restored[0]} of {ckpt.directory}"),
        flush=True)
  meta = lambda step: {"step": step, "data_position": position, "history": history,
                       "config": config.to_json(), "tokenizer": parts.tokenizer.fingerprint()}
  position = 0   # prompts drawn so far from the seeded stream (dynamic sampling draws more)
  if restored is None:
    writer.truncate_after(-1)   # rows of an attempt killed before its first checkpoint
    warm_params, warm_stats = _warm_start(parts)
    train_state = parts.train_step.init(warm_params)
    ref_params = copy_params(train_state.params)
    step = 0
    cache = warm_up(parts, new_cache(parts, train_state.params))
    before, cache = parts.evaluator(cache, eval_key(config))
    history = {"warm_start": warm_stats, "eval_before": before}
    writer.write(0, before)
    ckpt.save(0, _checkpoint_state(train_state, ref_params), meta(0), metrics=before)
  else:
    step, state, saved = restored
    check_tokenizer(saved, parts.tokenizer, ckpt.directory)
    train_state, ref_params = state["train"], state["ref_params"]
    history = saved.get("history", {})
    position = int(saved.get("data_position", step * int(config.rollout.prompts_per_step)))
    cache = warm_up(parts, new_cache(parts, train_state.params))
    writer.truncate_after(step)
  num_steps = int(config.train.num_steps)
  since = lambda: [a - b for a, b in zip(compile_cache.programs_built(), start)]  # noqa: E731
  before_rl = since()
  bar = console.progress(config.logging.progress_bar, num_steps, "RL steps", initial=step)
  last_eval = None
  with _StopRequest() as stop:
    while step < num_steps and not stop.requested:
      built0, _ = compile_cache.programs_built()
      train_state, cache, metrics, drawn = rl_step(parts, train_state, ref_params, cache, step,
                                                   position)
      step += 1
      position += drawn
      cache = sampling.reset(cache, _to_model(parts, train_state.params))
      # programs this step compiled (or loaded): 0 once every shape a run meets has been seen
      built = compile_cache.built_since(built0)
      metrics["time/compiles"] = len(built)
      if built and step > 1:
        print(f"step {step} built {len(built)} XLA program(s) for new shapes: "
              f"{', '.join(sorted(set(built)))}", flush=True)
      if metrics.get("learner/skipped", 0):
        print(f"step {step}: {int(metrics['learner/skipped'])} update(s) skipped "
              f"(non-finite loss or gradient); parameters unchanged", flush=True)
      eval_now = step % int(config.train.eval_every) == 0 or step == num_steps
      if eval_now:
        last_eval, cache = parts.evaluator(cache, eval_key(config))
        metrics.update(last_eval)
      if step % int(config.logging.every_steps) == 0 or eval_now:
        writer.write(step, metrics)
      if step % int(config.checkpoint.every_steps) == 0 or step == num_steps or stop.requested:
        ckpt.save(step, _checkpoint_state(train_state, ref_params), meta(step),
                  metrics=last_eval if eval_now else None)
      bar.update(1)
      bar.set_postfix(success=f"{metrics['rollout/success_rate']:.2f}",
                      loss=f"{metrics.get('learner/loss', float('nan')):.3f}")
  bar.close()
  writer.close()
  ckpt.close()
  if last_eval is None:
    last_eval, cache = parts.evaluator(cache, eval_key(config))
  total = since()
  summary = {"step": step, "eval_before": history.get("eval_before", {}), "eval_after": last_eval,
             "warm_start": history.get("warm_start", {}), "stopped_early": step < num_steps,
             # XLA programs built (or loaded from the persistent cache) and seconds spent
             "programs": {"before_rl": before_rl[0], "before_rl_s": round(before_rl[1], 1),
                          "total": total[0], "total_s": round(total[1], 1)}}
  if hosts.is_main():
    console.write(f"programs built (or loaded): {before_rl[0]} before the first RL step "
                  f"({before_rl[1]:.1f} s), {total[0]} in all ({total[1]:.1f} s)")
  if hosts.is_main():
    _plot(workdir)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return summary


def evaluate_checkpoint(config, workdir: str, step: int | None = None) -> dict:
  """Evaluate the policy saved at `step` (default the latest) in `workdir` on the held-out split,
  exactly as the training loop does (same eval key): with the run's own config this reproduces
  the eval row logged at that step; raise `train.eval_samples` for a tighter sampled estimate."""
  parts = build_parts(config)
  try:
    step, params = restore_params(parts.train_step, workdir, step, parts.tokenizer)
    metrics, _ = parts.evaluator(new_cache(parts, params), eval_key(config))
  finally:
    parts.tasks.close()
  return {"step": step} | metrics


def check_tokenizer(meta: dict, tokenizer, directory: str) -> None:
  """Refuse a checkpoint saved with a tokenizer whose ids mean other tokens (older checkpoints
  carry no fingerprint and are taken as they are)."""
  from tree_rl.checkpointing import CheckpointRestoreError
  saved = meta.get("tokenizer")
  if saved is not None and saved != tokenizer.fingerprint():
    raise CheckpointRestoreError(
        f"the checkpoint in {directory} was saved with another tokenizer (fingerprint {saved}, "
        f"now {tokenizer.fingerprint()}): its token ids would mean other tokens")


def restore_params(train_step, workdir: str, step: int | None = None, tokenizer=None
                   ) -> tuple[int, Any]:
  """(step, float32 policy params) of the checkpoint at `step` (default the latest) in
  `workdir`, verified against its digests (and, given `tokenizer`, its tokenizer)."""
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"))
  train_state = jax.eval_shape(train_step.init)
  saved = ckpt.all_steps()
  if not saved or (step is not None and step not in saved):
    ckpt.close()
    raise FileNotFoundError(f"no checkpoint {'' if step is None else f'step {step} '}in "
                            f"{ckpt.directory} (saved steps: {saved})")
  restored = ckpt.restore(_checkpoint_state(train_state, train_state.params), step)
  ckpt.close()
  step, state, meta = restored
  if tokenizer is not None:
    check_tokenizer(meta, tokenizer, ckpt.directory)
  return step, state["train"].params


def _warm_starts(config) -> bool:
  """Whether the run begins with a supervised warm start (a from-scratch model with it on)."""
  return config.model.preset != "hf" and bool(config.warmstart.enabled)


def _warm_start(parts: Parts) -> tuple[Any, dict]:
  """Supervised warm start for from-scratch models (pure-dict params, stats); skipped for a
  pretrained checkpoint (config.model.preset=hf) or with config.warmstart.enabled=False. With
  `warmstart.policy` naming a shipped policy (and not `warmstart.from_scratch`), its verified
  weights instead of the SFT (`tree_rl.warmstart.shipped`)."""
  from tree_rl.warmstart import warm_start
  config = parts.config
  if not _warm_starts(config):
    return nnx.to_pure_dict(nnx.state(parts.model, nnx.Param)), {"skipped": True}
  if config.warmstart.policy and not config.warmstart.from_scratch:
    from tree_rl.warmstart import shipped
    params, manifest = shipped.load(config.warmstart.policy, config, parts.tokenizer, parts.model)
    if hosts.is_main():
      console.write(f"warm start: shipped policy {config.warmstart.policy!r} (sha256 "
                    f"{manifest['sha256'][:16]}..., verified); --config.warmstart.from_scratch=true "
                    f"runs the SFT instead")
    return params, {"policy": config.warmstart.policy, "sha256": manifest["sha256"]}
  stream = (2**31 - 1, 0)   # a stream no RL step uses
  key = _step_key(config, *stream)
  evaluate = fresh_model = None
  if float(config.warmstart.target_success) < 1.0:
    # Early stopping looks at train tasks only: the held-out split stays unseen until RL's eval.
    n = min(int(config.warmstart.eval_prompts), parts.tasks.num_train)
    states = tasks.take(parts.tasks.train_states, np.arange(n))
    if parts.tasks.train_env is parts.tasks.test_env:   # the held-out evaluator's programs
      train_eval, extra = parts.evaluator.on(states), []
    else:   # its own engine (the train split's env), in the cache beside the run's rollouts,
      # and greedy chains only (the check reads nothing else)
      train_eval = Evaluator(config, parts.tasks.train_env, states, parts.tokenizer,
                             shards=_shards(parts.rollout_mesh), prompts=n, samples=0)
      extra = train_eval.rollouts()
    every = int(config.warmstart.eval_every)
    at_step = [0]                  # the SFT step of the attempt's latest check

    def evaluate(params):
      # placed like the learner's weights, so the check runs the evaluation's own programs
      params = jax.device_put(nnx.to_pure_dict(params), parts.train_step.param_shardings)
      cache = new_cache(parts, params, extra)
      success = train_eval.greedy_success(cache, _step_key(config, *stream, 1))[0]
      at_step[0] += every
      console.write(f"warm start: step {at_step[0]}, greedy success {success:.2f} on {n} train "
                    f"tasks (target {float(config.warmstart.target_success):.2f})")
      return success

    def fresh_model(attempt):
      at_step[0] = 0
      console.write(f"warm start: no check met the target; attempt {attempt + 1} of "
                    f"{int(config.warmstart.attempts)} from a fresh init")
      return build_model(config.model, parts.tokenizer, seed=_attempt_seed(config, attempt))[0]
  params, stats = warm_start(config.warmstart, parts.model, parts.tokenizer,
                             parts.tasks.train_env, key, env_name=config.env.name,
                             evaluate=evaluate, fresh_model=fresh_model,
                             progress_bar=config.logging.progress_bar)
  stats = {k: v for k, v in stats.items() if k != "loss"} | {
      "first_loss": stats["loss"][0] if stats["loss"] else None,
      "last_loss": stats["loss"][-1] if stats["loss"] else None}
  return nnx.to_pure_dict(params), stats


def _attempt_seed(config, attempt: int) -> int:
  """The init seed of warm-start attempt `attempt` >= 1, drawn from (config.seed, attempt)."""
  key = jax.random.fold_in(jax.random.key(int(config.seed)), attempt)
  return int(jax.random.randint(key, (), 0, 2**31 - 1))


def _plot(workdir: str):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return
  rows = read_jsonl(path)
  keys = ["rollout/success_rate", "learner/loss", "eval/greedy_success", "eval/sampled_success"]
  plot_curves(rows, [k for k in keys if any(k in r for r in rows)], os.path.join(workdir, "curves.png"))
