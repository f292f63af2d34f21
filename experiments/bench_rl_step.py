"""Benchmark of steady RL steps of a config against their compute floor.

    python -m experiments.bench_rl_step                                  # the main job's config
    python -m experiments.bench_rl_step --config=configs/frozenlake.py:algo=chain --steps=3 \
        --config.warmstart.steps=100

Runs the config's warm start (deterministic for its seed), the rollout warm-up (`train.warm_up`:
every rollout program of the run built before the first step, counted and timed apart), then
1 + --steps RL steps exactly as the training loop does (`train.rl_step`, the cache rebound after
each update), then --evals evaluations (the first builds the few per-rollout programs the
warm-up does not; later ones show the evaluation alone). --warm_cache keeps the warm start's weights between runs. Every sampler and learner call is timed (each synchronised), so a steady step splits
into decode / prefill / env + turn boundary / reference log-probs / update / other. Counted:
real vs executed tokens of the sampler (rows x loop steps of each decode, rows x width of each
prefill) and of the learner (real root-to-leaf tokens vs rows x length), and the programs the
backend builds (jax.monitoring's compile events: loads from the persistent cache count too, at
a fraction of the seconds).

The floor: FLOPs of the real work over the FLOP rate of a float32 1024^3 matmul measured in this
process. Sampler: every token of the rollout tree once (generated and prefilled; shared prefixes
are not recomputed), 2 x matmul params + causal attention over its context. Learner: each valid
leaf's root-to-leaf tokens, forward + backward (3 forward-equivalents) + the reference forward
when KL is on. The last JSON line carries step_s, floor_s, floor_ratio and compiles_after_step1.
"""

from __future__ import annotations

import collections
import contextlib
import json
import platform
import time

from absl import app, flags
from ml_collections import config_flags

from tree_rl import compile_cache
from tree_rl.config import exit_on_bad_input, parse_flags_or_exit

_CACHE = compile_cache.define_flag()
_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_STEPS = flags.DEFINE_integer("steps", 3, "Steady RL steps timed after the first (compiling) one.")
_EVAL = flags.DEFINE_integer("evals", 2, "Evaluations timed after the steps (the first builds the "
                             "evaluation's programs in this process, later ones reuse them).")
_OUT = flags.DEFINE_string("out", "", "Also write the JSON rows to this file.")
_WARM = flags.DEFINE_string("warm_cache", "", "An .npz of the warm-start weights: read when it exists "
                            "(for the same config), else written after the warm start.")


class Meter:
  """Wall time, calls, real and executed tokens per part; programs built (`compile_cache`)."""

  def __init__(self):
    self.wall = collections.defaultdict(float)
    self.calls = collections.Counter()
    self.tokens = collections.defaultdict(lambda: [0, 0])   # part -> [real, executed]

  @property
  def compiles(self) -> int:
    return compile_cache.programs_built()[0]

  @property
  def compile_s(self) -> float:
    return compile_cache.programs_built()[1]

  @staticmethod
  def built_since(start: int) -> dict:
    """Programs built since the `start`-th, by name, with their counts."""
    return dict(collections.Counter(compile_cache.built_since(start)).most_common())

  @contextlib.contextmanager
  def timed(self, part: str):
    t = time.perf_counter()
    yield
    self.wall[part] += time.perf_counter() - t
    self.calls[part] += 1

  def snapshot(self) -> dict:
    return dict(wall=dict(self.wall), calls=dict(self.calls),
                tokens={k: list(v) for k, v in self.tokens.items()}, compiles=self.compiles,
                compile_s=self.compile_s)


def instrument(meter: Meter, parts):
  """Wrap the sampler operations the engine calls and the learner's two jitted calls."""
  import jax
  import numpy as np

  from tree_rl import sampling

  def wrap(module, name, part, count=None):
    fn = getattr(module, name)

    def timed(*args, **kwargs):
      with meter.timed(part):
        out = jax.block_until_ready(fn(*args, **kwargs))
      if count is not None:
        real, executed = count(args, kwargs, out)
        meter.tokens[part][0] += int(real)
        meter.tokens[part][1] += int(executed)
      return out
    setattr(module, name, timed)

  def decode_count(args, kwargs, out):
    lengths = np.asarray(out[1].lengths)
    return lengths.sum(), lengths.shape[0] * max(int(lengths.max()), 1)

  def prefill_count(args, kwargs, out):
    tokens, lengths = args[2], np.asarray(args[3])
    valid = np.ones(lengths.shape, bool) if len(args) < 5 or args[4] is None else np.asarray(args[4])
    return lengths[valid].sum(), np.asarray(tokens).shape[0] * np.asarray(tokens).shape[1]

  # the engine calls sampling.decode / prefill / fork / release through the module
  wrap(sampling, "decode", "rollout/decode", decode_count)
  wrap(sampling, "prefill", "rollout/prefill", prefill_count)
  wrap(sampling, "fork", "rollout/fork")
  wrap(sampling, "release", "rollout/release")
  parts.train_step = _TimedStep(parts.train_step, meter)


class _TimedStep:
  """The train step with its two jitted calls timed (everything else delegated)."""

  def __init__(self, step, meter):
    self._step, self._meter = step, meter

  def __getattr__(self, name):
    return getattr(self._step, name)

  def with_ref_logprobs(self, *args):
    import jax
    with self._meter.timed("learner/ref_logprobs"):
      return jax.block_until_ready(self._step.with_ref_logprobs(*args))

  def __call__(self, *args):
    import jax
    with self._meter.timed("learner/update"):
      return jax.block_until_ready(self._step(*args))


def tree_flops(out, model_config, forward_passes_learner: int) -> tuple[float, float, int, int]:
  """(sampler FLOPs, learner FLOPs, tree tokens, leaf tokens) of one rollout's real work."""
  import numpy as np

  import jax
  c = model_config
  e, layers = c.hidden_size, c.num_layers
  per_layer = e * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * e \
      + 3 * e * c.intermediate_size
  mm = 2.0 * (layers * per_layer + e * c.vocab_size)          # FLOPs per token, matmuls
  att = 4.0 * layers * c.num_heads * c.head_dim               # FLOPs per (token, context key)
  t = jax.device_get(out.tree)
  sampler, tree_tokens = 0.0, 0
  for p in range(t.parent.shape[0]):
    for n in np.nonzero(t.used[p])[0]:
      k = int(t.policy_len[p, n] + t.obs_len[p, n])
      c0 = 0 if t.parent[p, n] < 0 else int(t.ctx_len[p, t.parent[p, n]])
      sampler += k * mm + att * (k * c0 + k * (k + 1) / 2)
      tree_tokens += k
  learner, leaf_tokens = 0.0, 0
  leaf, valid = np.asarray(out.leaf), np.asarray(out.valid)
  for p, j in zip(*np.nonzero(valid)):
    n = int(t.ctx_len[p, leaf[p, j]])
    learner += forward_passes_learner * (n * mm + att * n * (n + 1) / 2)
    leaf_tokens += n
  return sampler, learner, tree_tokens, leaf_tokens


def matmul_flops_per_s(m: int = 1024, k: int = 1024, n: int = 1024) -> float:
  """FLOP/s of a jitted float32 [m, k] @ [k, n] product (best of 5)."""
  import jax
  import jax.numpy as jnp
  a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2 * m * k * n / best


def _warm_params(parts):
  """The config's warm start, or its weights from --warm_cache (leaves in tree order)."""
  import os

  import jax
  import numpy as np
  from flax import nnx

  from tree_rl import train
  path = _WARM.value
  if path and os.path.exists(path):
    like = nnx.to_pure_dict(nnx.state(parts.model, nnx.Param))
    leaves, treedef = jax.tree.flatten(like)
    with np.load(path) as f:
      saved = [f[f"leaf_{i}"] for i in range(len(leaves))]
    if [a.shape for a in saved] != [np.shape(a) for a in leaves]:
      raise SystemExit(f"--warm_cache={path} holds weights of another model shape")
    return jax.tree.unflatten(treedef, saved)
  params, _ = train._warm_start(parts)
  if path:
    np.savez(path, **{f"leaf_{i}": np.asarray(a) for i, a in enumerate(jax.tree.leaves(params))})
  return params


def main(argv):
  del argv
  cache_dir = compile_cache.enable(_CACHE.value)
  import jax
  import numpy as np

  from tree_rl import train
  from tree_rl.learner import from_rollout
  from tree_rl.learner.train_step import copy_params

  config = _CONFIG.value
  meter = Meter()
  meter.compiles   # starts counting (compile_cache's jax.monitoring listener)
  t0 = time.perf_counter()
  parts = train.build_parts(config)
  warm_params = _warm_params(parts)
  warm_s = time.perf_counter() - t0
  state = parts.train_step.init(warm_params)
  ref = copy_params(state.params)
  startup = meter.compiles   # programs built by the warm start and the set-up
  t_warm_up = time.perf_counter()
  cache = train.warm_up(parts, train.new_cache(parts, state.params))
  warm_up_s = time.perf_counter() - t_warm_up
  warm_up_programs = meter.compiles - startup
  instrument(meter, parts)
  rates = matmul_flops_per_s()
  # the model's own shapes: a learner micro-batch's tokens through its MLP input projection
  # (what the tiny model's matmuls can reach, against the square product the floor uses)
  mc = parts.model_config
  model_rate = matmul_flops_per_s(int(config.learner.microbatch_rows) * int(config.learner.row_tokens or 1024),
                                  mc.hidden_size, mc.intermediate_size)
  kl = float(config.learner.kl_coef) > 0
  passes = 3 + (1 if kl else 0)
  outs = []
  real_run = train.run

  def run_and_keep(*args, **kwargs):
    out, c = real_run(*args, **kwargs)
    outs.append(out)
    return out, c
  train.run = run_and_keep
  real_batches = from_rollout.make_batches

  def batches_and_count(cfg, trees, row_multiple=1):
    batches = real_batches(cfg, trees, row_multiple)
    epochs = int(cfg.train.ppo_epochs)
    meter.tokens["learner/update"][1] += epochs * sum(
        int(np.prod(m.tokens.shape)) for b in batches for m in (b if isinstance(b, list) else [b]))
    return batches
  from_rollout.make_batches = batches_and_count
  rows = []
  position = 0
  for step in range(1 + _STEPS.value):
    before = meter.snapshot()
    compiles0 = meter.compiles
    t, cpu = time.perf_counter(), time.process_time()
    state, cache, metrics, drawn = train.rl_step(parts, state, ref, cache, step, position)
    position += drawn
    cache = jax.block_until_ready(train.sampling.reset(cache, train._to_model(parts, state.params)))
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    after = meter.snapshot()
    sampler_f, learner_f, tree_tokens, leaf_tokens = tree_flops(outs[-1], parts.model_config, passes)
    split = {k: after["wall"].get(k, 0.0) - before["wall"].get(k, 0.0) for k in after["wall"]}
    meter.tokens["learner/update"][0] += int(config.train.ppo_epochs) * leaf_tokens
    tokens = {k: [a - b for a, b in zip(v, before["tokens"].get(k, [0, 0]))]
              for k, v in meter.snapshot()["tokens"].items()}
    rollout_s = metrics["throughput/rollout_share"] * metrics["time/step_s"]
    split["rollout/env_and_boundary"] = rollout_s - sum(v for k, v in split.items()
                                                        if k.startswith("rollout/"))
    floor = (sampler_f + learner_f) / rates
    rows.append(dict(kind="step", step=step, wall_s=wall, cpu_s=cpu, split_s=split,
                     other_s=wall - sum(split.values()), tokens_real_executed=tokens,
                     tree_tokens=tree_tokens, leaf_tokens=leaf_tokens, sampler_gflop=sampler_f / 1e9,
                     learner_gflop=learner_f / 1e9, floor_s=floor, floor_ratio=wall / floor,
                     compiles=meter.compiles - compiles0, built=meter.built_since(compiles0),
                     success=metrics.get("rollout/success_rate"),
                     trajectories=metrics.get("rollout/trajectories")))
    print(json.dumps(rows[-1]), flush=True)
  eval_s = []
  for _ in range(_EVAL.value):
    compiles0 = meter.compiles
    before = meter.snapshot()
    t = time.perf_counter()
    _, cache = parts.evaluator(cache, train.eval_key(config))
    eval_s.append(time.perf_counter() - t)
    after = meter.snapshot()
    split = {k: after["wall"].get(k, 0.0) - before["wall"].get(k, 0.0) for k in after["wall"]}
    tokens = {k: [a - b for a, b in zip(v, before["tokens"].get(k, [0, 0]))]
              for k, v in after["tokens"].items() if k.startswith("rollout/")}
    rows.append(dict(kind="eval", wall_s=eval_s[-1], split_s=split, tokens_real_executed=tokens,
                     other_s=eval_s[-1] - sum(split.values()), compiles=meter.compiles - compiles0,
                     built=meter.built_since(compiles0),
                     prompts=parts.evaluator.num_prompts, samples=parts.evaluator.k))
    print(json.dumps(rows[-1]), flush=True)
  steady = [r for r in rows if r["kind"] == "step" and r["step"] > 0] or rows[:1]
  mean = lambda k: float(np.mean([r[k] for r in steady]))  # noqa: E731
  summary = dict(kind="summary", config=config.rollout.method,
                 prompts_per_step=int(config.rollout.prompts_per_step),
                 device=jax.devices()[0].device_kind, backend=jax.default_backend(),
                 jax=jax.__version__, host=platform.node(), cache_dir=cache_dir,
                 matmul_gflop_per_s=rates / 1e9, model_matmul_gflop_per_s=model_rate / 1e9,
                 warm_start_s=warm_s, step_s=mean("wall_s"),
                 cpu_s=mean("cpu_s"), floor_s=mean("floor_s"), floor_ratio=mean("floor_ratio"),
                 eval_s=eval_s[-1] if eval_s else None, eval_first_s=eval_s[0] if eval_s else None,
                 compiles_startup=startup, compiles_warm_up=warm_up_programs,
                 warm_up_s=warm_up_s, compiles_step1=rows[0]["compiles"],
                 compiles_after_step1=sum(r["compiles"] for r in rows[1:] if r["kind"] == "step"),
                 compiles_total=meter.compiles, compile_s_total=meter.compile_s)
  print()
  print(f"{'part (steady step mean)':<28}{'wall s':>9}   real / executed tokens")
  for k in sorted({k for r in steady for k in r["split_s"]}) + ["other"]:
    w = float(np.mean([r["other_s"] if k == "other" else r["split_s"].get(k, 0.0) for r in steady]))
    tok = [r["tokens_real_executed"][k] for r in steady if k in r["tokens_real_executed"]]
    ratio = f"{sum(x[0] for x in tok):>9} / {sum(x[1] for x in tok)}" if tok else ""
    print(f"{k:<28}{w:>9.3f}   {ratio}")
  print(f"step {summary['step_s']:.2f} s (cpu {summary['cpu_s']:.2f} s), floor "
        f"{summary['floor_s']:.3f} s ({summary['matmul_gflop_per_s']:.0f} GFLOP/s matmul; "
        f"{summary['model_matmul_gflop_per_s']:.0f} at the model's shapes): "
        f"{summary['floor_ratio']:.1f}x; eval {[round(e, 2) for e in eval_s]} s; "
        f"compiles step 1 {summary['compiles_step1']}, after {summary['compiles_after_step1']}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump(rows + [summary], f, indent=1)
  print(json.dumps(summary), flush=True)


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
