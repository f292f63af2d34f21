"""Supervised fine-tuning on demonstrations: masked next-token cross-entropy on reply tokens.

The model is split once (`nnx.split` into graph, Params and the rest); the jitted step takes and
returns plain pytrees of arrays, donates the parameters and optimizer state, and gathers its
batch from the on-device demo pool by index.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from tree_rl import console, optim
from tree_rl.learner.logprobs import ATTENTION, sequence_logprobs
from tree_rl.warmstart.demos import DemoGenerator, Demos
from tree_rl.warmstart.experts import make_expert
from tree_rl.warmstart.rows import SFTRows, one_per_row, pack


def validate(w) -> None:
  """Check `config.warmstart`; errors name the field."""
  positive = ("num_demos", "max_len", "steps", "batch_size", "eval_every", "eval_prompts")
  for name in positive:
    if int(w[name]) < 1:
      raise ValueError(f"warmstart.{name} must be >= 1, got {w[name]}")
  if not 0.0 <= float(w.epsilon) <= 1.0:
    raise ValueError(f"warmstart.epsilon must be in [0, 1], got {w.epsilon}")
  if float(w.learning_rate) <= 0:
    raise ValueError(f"warmstart.learning_rate must be > 0, got {w.learning_rate}")
  if int(w.warmup_steps) < 0:
    raise ValueError(f"warmstart.warmup_steps must be >= 0, got {w.warmup_steps}")
  if float(w.grad_clip) < 0 or float(w.weight_decay) < 0:
    raise ValueError(f"warmstart.grad_clip and warmstart.weight_decay must be >= 0, "
                     f"got {w.grad_clip}, {w.weight_decay}")
  if not 0.0 <= float(w.hard_fraction) <= 1.0:
    raise ValueError(f"warmstart.hard_fraction must be in [0, 1], got {w.hard_fraction}")
  if not (float(w.hard_turn_weight) > 0 and np.isfinite(float(w.hard_turn_weight))):
    raise ValueError(f"warmstart.hard_turn_weight must be > 0, got {w.hard_turn_weight}")
  if w.attention not in ATTENTION:
    raise ValueError(f"warmstart.attention={w.attention!r}; known: {ATTENTION}")
  if int(w.stop_window) < 1:
    raise ValueError(f"warmstart.stop_window must be >= 1, got {w.stop_window}")
  if int(w.attempts) < 1:
    raise ValueError(f"warmstart.attempts must be >= 1, got {w.attempts}")
  if int(w.attempts) > 1 and float(w.target_success) >= 1.0:
    raise ValueError(f"warmstart.attempts={w.attempts} needs checks with a target: set "
                     f"warmstart.target_success below 1 (got {w.target_success})")


def make_optimizer(w) -> optax.GradientTransformation:
  """`optim.adamw` with a linear warm-up, then cosine decay to 10% at `warmstart.steps`."""
  steps = int(w.steps)
  warm = max(min(int(w.warmup_steps), steps - 1), 0)
  lr = optim.schedule(w.learning_rate, kind="cosine", warmup_steps=warm, total_steps=max(steps, warm + 1),
                      end_fraction=0.1)
  return optim.adamw(lr, grad_clip=w.grad_clip, weight_decay=w.weight_decay)


def sft_loss(model, rows: SFTRows, attention: str = "auto"):
  """(negative log-likelihood of the trained tokens, averaged with their `loss_mask` weights;
  the weights' sum); packed rows attend within each demo, at its own positions."""
  logp, _ = sequence_logprobs(model, rows.tokens, positions=rows.positions,
                              attention_mask=rows.attention_mask(), attention=attention)
  n = jnp.sum(rows.loss_mask)
  return -jnp.sum(logp * rows.loss_mask) / jnp.where(n > 0, n, 1.0), n


class SFTTrainer:
  """Holds the split model and the jitted step `(params, opt_state, rows, idx)`."""

  def __init__(self, model: nnx.Module, w):
    self.graphdef, params, self.rest = nnx.split(model, nnx.Param, ...)
    self.dtypes = jax.tree.map(lambda a: a.dtype, params)
    self.tx = make_optimizer(w)
    # one program each (eager casts, copies and the optimizer init would build one per array)
    self.params, self.opt_state = jax.jit(self._fresh)(params)
    self.attention = w.attention
    self.batch_size = int(w.batch_size)
    self.step_fn = jax.jit(self._step, donate_argnums=(0, 1))
    self._copy = jax.jit(lambda p: jax.tree.map(lambda a, d: jnp.copy(a.astype(d)), p, self.dtypes))
    self._draw = jax.jit(lambda key, step, pool: jax.random.randint(
        jax.random.fold_in(key, step), (self.batch_size,), 0, pool), static_argnums=(2,))

  def _fresh(self, params):
    params = jax.tree.map(_to_master, params)
    return params, self.tx.init(params)

  def _step(self, params, opt_state, rows, idx):
    def loss_fn(p):
      model = nnx.merge(self.graphdef, p, self.rest)
      return sft_loss(model, rows.take(idx), self.attention)

    (loss, n), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = self.tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def step(self, rows: SFTRows, idx) -> jax.Array:
    """One update on rows `idx` of the pool (`rows.SFTRows`); returns the loss (a device
    scalar)."""
    self.params, self.opt_state, loss = self.step_fn(self.params, self.opt_state, rows, idx)
    return loss

  def draw(self, key, step: int, pool: int) -> jax.Array:
    """The `batch_size` rows of step `step`: uniform over [0, pool), drawn with
    fold_in(key, step) (one program for every step)."""
    return self._draw(key, np.int32(step), pool)

  def params_state(self) -> nnx.State:
    """A copy of the trained Params (an nnx.State) in the model's own parameter dtypes; later
    steps donate the trainer's buffers, never the copy's."""
    return self._copy(self.params)


@jax.jit
def _split2(key):
  return tuple(jax.random.split(key))   # two keys, one program (unpacking an array builds another)


def _to_master(a):
  return a.astype(jnp.float32) if jnp.issubdtype(a.dtype, jnp.floating) else a


HARD_POOL = 8   # episodes generated per demonstration kept when hard ones are oversampled


def draw_demos(gen, expert, key, n: int, hard_fraction: float) -> Demos:
  """`n` demonstrations; with `hard_fraction` > 0, that share of them (as far as a pool of
  HARD_POOL * n episodes holds) start where the right move needs the state read
  (`Expert.hard`), the rest elsewhere, each in pool order."""
  if hard_fraction <= 0:
    return gen(key, n)
  if not hasattr(expert, "hard"):
    raise ValueError(f"warmstart.hard_fraction={hard_fraction} needs an expert with hard(state); "
                     f"{type(expert).__name__} has none")
  pool = gen(key, HARD_POOL * n)
  hard = np.asarray(jax.device_get(pool.hard))
  want = min(int(round(hard_fraction * n)), int(hard.sum()))
  pick = np.concatenate([np.flatnonzero(hard)[:want], np.flatnonzero(~hard)[:n - want]])
  return jax.tree.map(lambda x: x[pick], pool)


def warm_start(w, model: nnx.Module, tokenizer, env, key: jax.Array, *, env_name: str,
               evaluate: Callable[[nnx.State], float] | None = None,
               fresh_model: Callable[[int], nnx.Module] | None = None,
               progress_bar: bool = False) -> tuple[nnx.State, dict[str, Any]]:
  """Under `w` (config.warmstart): generate `warmstart.num_demos` episodes of the expert that
  env `env_name` registers (on device; a host env on the host), then train for `warmstart.steps` SFT updates (fewer once the mean of the last
  `warmstart.stop_window` checks, one every `warmstart.eval_every` steps, is >=
  `warmstart.target_success`: a window of 1 stops on the first check that meets it, a longer
  one does not stop on one lucky check). When checks ran, the params of the best check so far
  come back (the latest among ties: a check on a few maps ties often, and later params trained
  longer), not the last step's: SFT on a noisy expert can drift after it peaks.

  Attempts: with checks and `warmstart.attempts` = A > 1, an attempt whose checks never meet the
  target is followed by another on the same demos, from `fresh_model(a)` (a new init; the same
  init when None) and a new batch order, up to A attempts; the first attempt to meet the target
  comes back, else the best check of all (the latest among ties). The first attempt is the
  single-attempt warm start exactly.

  Returns the trained Params (an nnx.State; `nnx.update(model, params)` loads them) and stats:
  loss (per step), steps, returned_step (whose params come back), evals ([(step, success)]),
  stopped_early (all of the returned attempt), attempt (its index), attempt_evals (every
  attempt's evals), demo_success / demo_return / demo_tokens / demo_truncated / demo_hard (the
  share of demos starting where the right move needs the state read, `Expert.hard`:
  `warmstart.hard_fraction` oversamples them), rows (SFT rows: one per demo, fewer when
  `warmstart.pack`), row_fill (real demo tokens over the rows' tokens), seconds (demo
  generation and packing, training). The model itself is not changed. With
  `warmstart.enabled=False` the model's Params come back untouched.
  """
  validate(w)
  if not w.enabled:
    return nnx.state(model, nnx.Param), dict(loss=[], steps=0, returned_step=0, evals=[],
                                               stopped_early=False)
  t0 = time.perf_counter()
  expert = make_expert(env_name, env, w.epsilon)
  from tree_rl.envs.host import is_host_env
  from tree_rl.warmstart.host_demos import HostDemoGenerator
  # a host env plays its expert on the host
  make = HostDemoGenerator if is_host_env(env) else DemoGenerator
  gen = make(env, tokenizer, expert, max_len=int(w.max_len), loss_on_noise=bool(w.loss_on_noise),
             hard_turn_weight=float(w.hard_turn_weight))
  k_demo, k_train = _split2(key)
  demos: Demos = draw_demos(gen, expert, k_demo, int(w.num_demos), float(w.hard_fraction))
  if not np.asarray(demos.loss_mask).any():
    raise ValueError("the warm-start demos hold no trained reply tokens: raise warmstart.max_len "
                     f"(={w.max_len}) above the prompt length or lower warmstart.epsilon")
  rows = pack(demos, tokenizer.pad_id) if w.pack else one_per_row(demos)
  t1 = time.perf_counter()
  tries = []
  for attempt in range(int(w.attempts) if evaluate is not None else 1):
    start = model if attempt == 0 or fresh_model is None else fresh_model(attempt)
    order = k_train if attempt == 0 else jax.random.fold_in(k_train, attempt)
    tries.append(_train(w, start, rows, order, evaluate, progress_bar))
    if tries[-1]["stopped_early"]:
      break
  # the attempt that met the target (the last one run), else the best check of all
  chosen = (len(tries) - 1 if tries[-1]["stopped_early"]
            else max(range(len(tries)), key=lambda a: (tries[a]["best"], a)))
  run = tries[chosen]
  success, reward, length, truncated = jax.device_get(
      (demos.success, demos.reward, demos.length, demos.truncated))
  stats = dict(loss=run["loss"], steps=run["steps"], evals=run["evals"],
               stopped_early=run["stopped_early"], returned_step=run["returned_step"],
               attempt=chosen, attempt_evals=[t["evals"] for t in tries],
               demo_success=float(np.mean(success)), demo_return=float(np.mean(reward)),
               demo_tokens=float(np.mean(length)), demo_truncated=float(np.mean(truncated)),
               demo_hard=float(np.mean(jax.device_get(demos.hard))), rows=rows.num_rows,
               row_fill=rows.fill(int(np.sum(length))),
               seconds=dict(demos=t1 - t0, train=time.perf_counter() - t1))
  return run["params"], stats


def _train(w, model, rows: SFTRows, key, evaluate, progress_bar: bool) -> dict[str, Any]:
  """One SFT attempt from `model`'s params: up to `warmstart.steps` updates with checks; its
  params (the best check's, or the last step's without checks), best success, loss, evals."""
  trainer = SFTTrainer(model, w)
  losses, evals, stopped = [], [], False
  best = None                                     # (success, step, params) of the best check
  n = rows.num_rows
  step = 0
  bar = console.progress(progress_bar, int(w.steps), "warm start")
  for step in range(1, int(w.steps) + 1):
    bar.update(1)
    losses.append(trainer.step(rows, trainer.draw(key, step, n)))
    if evaluate is not None and step % int(w.eval_every) == 0:
      params = trainer.params_state()
      success = float(evaluate(params))
      evals.append((step, success))
      if best is None or success >= best[0]:
        best = (success, step, params)
      window = [s for _, s in evals[-int(w.stop_window):]]
      if len(window) == int(w.stop_window) and np.mean(window) >= float(w.target_success):
        stopped = True
        break
  bar.close()
  # The best check (the latest among ties) beats the last step: SFT on a noisy expert can drift.
  score, returned_step, final = best if best is not None else (-1.0, step, trainer.params_state())
  return dict(params=final, best=score, returned_step=returned_step, steps=step, evals=evals,
              stopped_early=stopped, loss=[float(x) for x in jax.device_get(losses)])
