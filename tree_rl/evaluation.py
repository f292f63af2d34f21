"""Held-out evaluation through the rollout engine: greedy and sampled chains per test prompt.

Metrics: greedy success, sampled success (mean over `train.eval_samples` episodes per prompt),
pass@k as `eval/pass_at_k` (any of the k sampled episodes succeeds), mean turns, generated tokens
and, where the env has tools, tool calls per episode; a host env's `info_fields` (codefix:
visible / hidden test pass fractions) as their mean over the episodes' last states. Prompts run in chunks of `train.eval_chunk` (default all in one rollout per mode; the last one padded); each turn decodes and prefills only
the live episodes (the engine's power-of-two buckets), and the same weights and key give the
same numbers. The evaluator runs on the caller's sampler
cache (bound to the weights to evaluate), so training and evaluation share one cache shape and
its compiled sampler functions; `rollouts` tells the caller what that cache must hold
(`rollout.capacity.new_cache`).
"""

from __future__ import annotations

import copy

import numpy as np

import jax
import jax.numpy as jnp

from tree_rl import console, hosts, tasks
from tree_rl.rollout import build as rollout_build
from tree_rl.rollout.driver import run, warm_up
from tree_rl.rollout.engine import Layout


def _at_leaves(field, leaf):
  """field[p, leaf[p, j]] [P, L, ...] on the host (nothing compiled); -1 leaves read node 0."""
  field, leaf = np.asarray(field), np.asarray(leaf)
  return field[np.arange(leaf.shape[0])[:, None], np.maximum(leaf, 0)]


class Evaluator:

  def __init__(self, config, env, states, tokenizer, shards: int = 1):
    self.config = config
    count = int(config.train.eval_prompts)
    n = jax.tree.leaves(states)[0].shape[0]
    self.num_prompts = min(count, n) if count > 0 else n
    self.states = jax.tree.map(lambda x: x[:self.num_prompts], states)
    # a chunk splits over the processes and each process's data shards (padding prompts are
    # not counted); process i evaluates its share of every chunk, and the results are gathered
    split = shards * hosts.count()
    want = int(config.train.eval_chunk) or self.num_prompts   # 0: one rollout per mode
    self.chunk = -(-min(want, self.num_prompts) // split) * split
    self.local = self.chunk // hosts.count()
    self.k = int(config.train.eval_samples)
    self.has_tools = bool(env.has_tools)
    self.info_fields = tuple(getattr(env, "info_fields", ()))
    self.modes = {}
    for mode, temperature, group in (("greedy", 0.0, 1), ("sampled", float(config.rollout.temperature), self.k)):
      c = config.copy_and_resolve_references()
      c.rollout.method = "chain"
      c.rollout.group_size = group
      c.rollout.temperature = temperature
      c.rollout.budget = 0
      method = rollout_build.make_method(c)
      engine = rollout_build.make_engine(c, env, tokenizer)
      layout = Layout(self.local, method.capacity(engine.max_turns), method.slots, method.num_trees)
      self.modes[mode] = (method, engine, layout)

  def on(self, states) -> "Evaluator":
    """This evaluator on other initial states of its env (e.g. train tasks): the same engines,
    layouts and chunk, so it runs the programs this one builds (a short set pads its chunk)."""
    other = copy.copy(self)
    other.num_prompts = jax.tree.leaves(states)[0].shape[0]
    other.states = states
    return other

  def warm_up(self, cache):
    """Build both modes' rollout programs ahead of the first evaluation (`driver.warm_up`);
    returns the cache."""
    states = tasks.take(self.states, np.minimum(np.arange(self.local), self.num_prompts - 1))
    for method, engine, layout in self.modes.values():
      cache = warm_up(engine, method, cache, states, capacity=layout.capacity)
    return cache

  def rollouts(self) -> list[tuple]:
    """The (engine, layout) of every evaluation rollout, to size a cache for them."""
    return [(engine, layout) for _, engine, layout in self.modes.values()]

  def _rollouts(self, mode: str, cache, key):
    """Per prompt: rewards [N, L], valid [N, L], turns [N, L], per-prompt budget sums; cache."""
    method, engine, layout = self.modes[mode]
    rewards, valid, turns, calls, generated, info = [], [], [], [], [], []
    bar = console.progress(self.config, -(-self.num_prompts // self.chunk), f"eval {mode}",
                           leave=False, unit="chunk")
    for lo in range(0, self.num_prompts, self.chunk):
      bar.update(1)
      mine = lo + hosts.index() * self.local + np.arange(self.local)
      idx = np.minimum(mine, self.num_prompts - 1)
      states = tasks.take(self.states, idx)
      # one key for every chunk: each node's keys fold in its prompt's id, so the numbers do
      # not depend on how the held-out set is chunked over processes and shards
      out, cache = run(engine, method, cache, states, key,
                       prompt_ids=jnp.asarray(idx, jnp.int32), capacity=layout.capacity)
      real = (np.arange(lo, lo + self.chunk) < self.num_prompts)
      every = lambda x: hosts.gather(np.asarray(x)).reshape((self.chunk,) + np.shape(x)[1:])[real]  # noqa: E731
      rewards.append(every(out.reward))
      valid.append(every(out.valid))
      turns.append(every(_at_leaves(out.tree.depth, out.leaf)))
      calls.append(every(out.budget.tool_calls))
      generated.append(every(out.budget.generated))
      if self.info_fields:
        info.append(every(_at_leaves(out.tree.env_state.info, out.leaf)))
    bar.close()
    cat = np.concatenate
    return (cat(rewards), cat(valid), cat(turns), cat(calls), cat(generated),
            cat(info) if info else None), cache

  def greedy_success(self, cache, key) -> tuple[float, object]:
    """(greedy success rate, cache) for the weights `cache` is bound to."""
    (r, v, *_), cache = self._rollouts("greedy", cache, key)
    return float(((r > 0) & v).sum() / max(v.sum(), 1)), cache

  def __call__(self, cache, key) -> tuple[dict, object]:
    """(metrics, cache) for the weights `cache` is bound to."""
    out = {}
    for i, mode in enumerate(("greedy", "sampled")):
      (r, v, turns, calls, generated, info), cache = self._rollouts(mode, cache, jax.random.fold_in(key, i))
      episodes = max(int(v.sum()), 1)
      success = (r > 0) & v
      out[f"eval/{mode}_success"] = float(success.sum() / episodes)
      out[f"eval/{mode}_mean_turns"] = float(turns[v].sum() / episodes)
      if self.has_tools:
        out[f"eval/{mode}_tool_calls"] = float(calls.sum() / episodes)
      out[f"eval/{mode}_tokens_per_episode"] = float(generated.sum() / episodes)
      for j, name in enumerate(self.info_fields):
        out[f"eval/{mode}_{name}"] = float(info[..., j][v].sum() / episodes)
      if mode == "sampled":
        out[f"eval/pass_at_{self.k}"] = float(np.mean(success.any(axis=1)))
    return out, cache
