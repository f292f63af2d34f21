"""Held-out evaluation through the rollout engine: greedy and sampled chains per test prompt.

Metrics: greedy success, sampled success (mean over `train.eval_samples` episodes per prompt;
both also per group of prompts where the env names groups, `TokenEnv.eval_groups`, e.g.
`eval/greedy_success/side_3` for FrozenLake maps of side 3),
pass@k as `eval/pass_at_k` (any of the k sampled episodes succeeds), mean turns, generated tokens
and, where the env has tools, tool calls per episode; a host env's `info_fields` (codefix:
visible / hidden test pass fractions) as their mean over the episodes' last states.

One rollout holds both kinds of episode: 1 + k chains per prompt, chain 0 decoded greedily and
chains 1..k at `rollout.temperature` (the engine's per-slot temperatures), so an evaluation
builds one set of rollout programs and runs one loop of turns. Prompts run in chunks of
`train.eval_chunk` (default all in one rollout; the last one padded); each turn decodes and
prefills only the live episodes (the engine's row buckets), and the same weights and key give
the same numbers. The evaluator runs on the caller's sampler cache (bound to the weights to
evaluate), so training and evaluation share one cache shape and its compiled sampler functions;
`rollouts` tells the caller what that cache must hold (`rollout.capacity.new_cache`).
"""

from __future__ import annotations

import copy

import numpy as np

import jax

from tree_rl import console, hosts, tasks
from tree_rl.compile_cache import to_device
from tree_rl.rollout import build as rollout_build
from tree_rl.rollout.driver import run, warm_up
from tree_rl.rollout.engine import Layout


def _at_leaves(field, leaf):
  """field[p, leaf[p, j]] [P, L, ...] on the host (nothing compiled); -1 leaves read node 0."""
  field, leaf = np.asarray(field), np.asarray(leaf)
  return field[np.arange(leaf.shape[0])[:, None], np.maximum(leaf, 0)]


class Evaluator:

  def __init__(self, config, env, states, tokenizer, shards: int = 1, prompts: int | None = None,
               samples: int | None = None):
    """Evaluates the first `prompts` of `states` (default `train.eval_prompts`; 0: all) with
    `samples` sampled chains beside the greedy one (default `train.eval_samples`)."""
    self.config = config
    count = int(config.train.eval_prompts) if prompts is None else prompts
    n = jax.tree.leaves(states)[0].shape[0]
    self.num_prompts = min(count, n) if count > 0 else n
    self.states = tasks.take(states, np.arange(self.num_prompts))
    self._groups_of = getattr(env, "eval_groups", lambda _: None)
    self.groups = self._groups_of(self.states)
    # a chunk splits over the processes and each process's data shards (padding prompts are
    # not counted); process i evaluates its share of every chunk, and the results are gathered
    split = shards * hosts.count()
    want = int(config.train.eval_chunk) or self.num_prompts   # 0: one rollout
    self.chunk = -(-min(want, self.num_prompts) // split) * split
    self.local = self.chunk // hosts.count()
    self.k = int(config.train.eval_samples) if samples is None else samples
    self.has_tools = bool(env.has_tools)
    self.info_fields = tuple(getattr(env, "info_fields", ()))
    c = config.copy_and_resolve_references()
    c.rollout.method = "chain"
    c.rollout.group_size = 1 + self.k   # chain 0 greedy, chains 1..k sampled
    c.rollout.budget = 0
    self.method = rollout_build.make_method(c)
    self.engine = rollout_build.make_engine(
        c, env, tokenizer, temperature=(0.0,) + (float(config.rollout.temperature),) * self.k)
    self.layout = Layout(self.local, self.method.capacity(self.engine.max_turns), self.method.slots,
                         self.method.num_trees)

  def on(self, states) -> "Evaluator":
    """This evaluator on other initial states of its env (e.g. train tasks): the same engine,
    layout and chunk, so it runs the programs this one builds (a short set pads its chunk)."""
    other = copy.copy(self)
    other.num_prompts = jax.tree.leaves(states)[0].shape[0]
    other.states = states
    other.groups = self._groups_of(states)
    return other

  def warm_up(self, cache):
    """Build the evaluation's rollout programs ahead of its first call (`driver.warm_up`);
    returns the cache."""
    states = tasks.take(self.states, np.minimum(np.arange(self.local), self.num_prompts - 1))
    return warm_up(self.engine, self.method, cache, states, capacity=self.layout.capacity)

  def rollouts(self) -> list[tuple]:
    """The (engine, layout) of the evaluation rollout, to size a cache for it."""
    return [(self.engine, self.layout)]

  def episodes(self, cache, key, final: bool = False):
    """Per leaf [prompts, L]: reward, valid, greedy (chain 0), turns, tool calls, generated
    tokens, info fields (or None), with `final` also the env state each episode ended in (for
    analyses; the metrics do not gather it); and the cache."""
    cols = {k: [] for k in ("reward", "valid", "greedy", "turns", "calls", "generated", "info",
                            "final")}
    bar = console.progress(self.config.logging.progress_bar, -(-self.num_prompts // self.chunk),
                           "eval", leave=False, unit="chunk")
    for lo in range(0, self.num_prompts, self.chunk):
      bar.update(1)
      mine = lo + hosts.index() * self.local + np.arange(self.local)
      idx = np.minimum(mine, self.num_prompts - 1)
      states = tasks.take(self.states, idx)
      # one key for every chunk: each node's keys fold in its prompt's id, so the numbers do
      # not depend on how the held-out set is chunked over processes and shards
      out, cache = run(self.engine, self.method, cache, states, key,
                       prompt_ids=to_device(idx, np.int32), capacity=self.layout.capacity)
      real = (np.arange(lo, lo + self.chunk) < self.num_prompts)
      every = lambda x: hosts.gather(np.asarray(x)).reshape((self.chunk,) + np.shape(x)[1:])[real]  # noqa: E731
      t = jax.device_get(out.tree.replace(tokens=None, logprobs=None))
      first, generated, calls = _path_sums(t, np.asarray(out.leaf))
      cols["reward"].append(every(out.reward))
      cols["valid"].append(every(out.valid))
      cols["greedy"].append(every(first == self.method.num_trees))   # chain 0's first node
      cols["turns"].append(every(_at_leaves(t.depth, out.leaf)))
      cols["calls"].append(every(calls))
      cols["generated"].append(every(generated))
      if self.info_fields:
        cols["info"].append(every(_at_leaves(t.env_state.info, out.leaf)))
      if final:
        cols["final"].append(jax.tree.map(lambda f: every(_at_leaves(f, out.leaf)), t.env_state))
    bar.close()
    states = cols.pop("final")
    states = jax.tree.map(lambda *xs: np.concatenate(xs), *states) if states else None
    return {k: np.concatenate(v) if v else None for k, v in cols.items()} | {"final": states}, cache

  def greedy_success(self, cache, key) -> tuple[float, object]:
    """(greedy success rate, cache) for the weights `cache` is bound to."""
    e, cache = self.episodes(cache, key)
    greedy = e["valid"] & e["greedy"]
    return float(((e["reward"] > 0) & greedy).sum() / max(greedy.sum(), 1)), cache

  def __call__(self, cache, key) -> tuple[dict, object]:
    """(metrics, cache) for the weights `cache` is bound to."""
    e, cache = self.episodes(cache, key)
    out = {}
    won = e["reward"] > 0
    for mode, mask in (("greedy", e["greedy"]), ("sampled", ~e["greedy"])):
      v = e["valid"] & mask
      episodes = max(int(v.sum()), 1)
      out[f"eval/{mode}_success"] = float((won & v).sum() / episodes)
      if self.groups is not None:
        name, labels = self.groups
        for g in np.unique(labels):
          vg = v & (labels == g)[:, None]
          out[f"eval/{mode}_success/{name}_{g}"] = float((won & vg).sum() / max(int(vg.sum()), 1))
      out[f"eval/{mode}_mean_turns"] = float(e["turns"][v].sum() / episodes)
      if self.has_tools:
        out[f"eval/{mode}_tool_calls"] = float(e["calls"][v].sum() / episodes)
      out[f"eval/{mode}_tokens_per_episode"] = float(e["generated"][v].sum() / episodes)
      for j, name in enumerate(self.info_fields):
        out[f"eval/{mode}_{name}"] = float(e["info"][..., j][v].sum() / episodes)
      if mode == "sampled":
        out[f"eval/pass_at_{self.k}"] = float(np.mean((won & v).any(axis=1)))
    return out, cache


def _path_sums(tree, leaf):
  """Per leaf [P, L] (host arrays): its depth-1 ancestor (the chain's first node), and the
  generated tokens and tool calls summed over its root-to-leaf path."""
  p_idx = np.arange(leaf.shape[0])[:, None]
  node = np.maximum(leaf, 0)
  first = node.copy()
  generated = np.zeros(leaf.shape, np.int64)
  calls = np.zeros(leaf.shape, np.int64)
  for _ in range(int(tree.depth.max()) + 1):
    on = (node >= 0) & (tree.depth[p_idx, np.maximum(node, 0)] > 0)
    at = np.maximum(node, 0)
    generated += np.where(on, tree.policy_len[p_idx, at], 0)
    calls += np.where(on, tree.tool_calls[p_idx, at], 0)
    first = np.where(on, at, first)
    node = np.where(on, tree.parent[p_idx, at], -1)
  return first, generated, calls
