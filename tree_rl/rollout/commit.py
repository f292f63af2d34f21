"""A turn's results into the rollout: each plan row's child node written into the tree and the
turn charged to the budget (pure, jittable pieces of the engine's commit)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tree_rl.rollout import tree as tree_lib
from tree_rl.rollout.budget import Budget
from tree_rl.rollout.rows import TurnPlan
from tree_rl.rollout.steppers import EnvStep


def _put(tree: tree_lib.Tree, plan: TurnPlan, field, value):
  """`field` [P, N, ...] with each valid row's child set to `value` [W, ...]."""
  rows = jnp.where(plan.valid, plan.child, tree.capacity)   # invalid rows are dropped
  return field.at[plan.prompt, rows].set(value.astype(field.dtype), mode="drop")


def _per_prompt(plan: TurnPlan, x, num_prompts: int):
  """Row values [W] summed per prompt over the valid rows -> [P]."""
  return jax.ops.segment_sum(jnp.where(plan.valid, x, 0), plan.prompt, num_segments=num_prompts)


def node_content(toks, lens, logprobs, obs, obs_len, width: int):
  """A child's node tokens [W, width] (the reply, then the observation, then 0) and log-probs
  (the reply's, 0 elsewhere)."""
  t = jnp.arange(width)[None]
  turn_part = jnp.pad(toks, ((0, 0), (0, max(0, width - toks.shape[1]))))[:, :width]
  obs_idx = jnp.clip(t - lens[:, None], 0, obs.shape[1] - 1)
  obs_part = jnp.take_along_axis(obs, obs_idx, axis=1)
  tokens = jnp.where(t < lens[:, None], turn_part,
                     jnp.where(t < (lens + obs_len)[:, None], obs_part, 0))
  lp = jnp.pad(logprobs.astype(jnp.float32),
               ((0, 0), (0, max(0, width - logprobs.shape[1]))))[:, :width]
  return tokens, jnp.where(t < lens[:, None], lp, 0.0)


def write_children(tree: tree_lib.Tree, plan: TurnPlan, toks, lens, logprobs, step: EnvStep,
                   obs_len, truncated) -> tree_lib.Tree:
  """The tree with each valid row's child node: its reply `toks[:lens]` (log-probs), the env's
  `step` (observation cut to `obs_len`: 0 where the branch ends), its counters and state."""
  wp, par = plan.prompt, jnp.maximum(plan.parent, 0)
  put = lambda field, value: _put(tree, plan, field, value)  # noqa: E731
  node_tok, node_lp = node_content(toks, lens, logprobs, step.obs, obs_len, tree.node_tokens)
  run = jnp.where(step.action == tree.action[wp, par], tree.action_run[wp, par] + 1, 1)
  w = wp.shape[0]
  rows = jnp.where(plan.valid, plan.child, tree.capacity)
  return tree.replace(
      parent=put(tree.parent, plan.parent), depth=put(tree.depth, tree.depth[wp, par] + 1),
      tree_id=put(tree.tree_id, tree.tree_id[wp, par]),
      used=put(tree.used, jnp.ones((w,), bool)), tokens=put(tree.tokens, node_tok),
      logprobs=put(tree.logprobs, node_lp), policy_len=put(tree.policy_len, lens),
      obs_len=put(tree.obs_len, obs_len),
      ctx_len=put(tree.ctx_len, tree.ctx_len[wp, par] + lens + obs_len),
      action=put(tree.action, step.action), action_run=put(tree.action_run, run),
      reward=put(tree.reward, step.reward), ret=put(tree.ret, tree.ret[wp, par] + step.reward),
      finished=put(tree.finished, step.done), tool_calls=put(tree.tool_calls, step.tool_calls),
      truncated=put(tree.truncated, truncated),
      num_children=tree.num_children.at[wp, jnp.where(plan.valid, par, tree.capacity)].add(
          1, mode="drop"),
      env_state=jax.tree.map(lambda f, s: f.at[wp, rows].set(s, mode="drop"), tree.env_state,
                             step.state),
      size=tree.size + _per_prompt(plan, jnp.ones((w,), jnp.int32), tree.num_prompts))


def write_entropy(tree: tree_lib.Tree, plan: TurnPlan, entropy, lens, tokens: int,
                  top: int) -> tree_lib.Tree:
  """The children's reply entropy from `entropy` [W, max_new] (0 after the first `tokens` and
  after the length): its mean over the first min(tokens, length) tokens, or with `top` > 0
  (a top-m listing's measure) its sum."""
  count = 1 if top else jnp.maximum(jnp.minimum(lens, tokens), 1)
  return tree.replace(entropy=_put(tree, plan, tree.entropy, jnp.sum(entropy, axis=1) / count))


def charge_turn(budget: Budget, tree: tree_lib.Tree, plan: TurnPlan, lens, tool_calls,
                share_prefix: bool) -> Budget:
  """The turn's generated tokens, env steps, tool calls and forks per prompt; with shared
  prefixes, each fork's reused context (its parent's tokens)."""
  seg = lambda x: _per_prompt(plan, x, tree.num_prompts)  # noqa: E731
  w = plan.prompt.shape[0]
  par = jnp.maximum(plan.parent, 0)
  return budget.add(generated=seg(lens), env_steps=seg(jnp.ones((w,), jnp.int32)),
                    tool_calls=seg(tool_calls), forks=seg(plan.fork.astype(jnp.int32)),
                    reused=seg(jnp.where(plan.fork & share_prefix,
                                         tree.ctx_len[plan.prompt, par], 0)))


def ended_nodes(tree: tree_lib.Tree, plan: TurnPlan, ended) -> jax.Array:
  """bool [P, N]: the children of rows `ended` [W] (valid rows only)."""
  ended = plan.valid & ended
  return jnp.zeros(tree.used.shape, bool).at[
      plan.prompt, jnp.where(ended, plan.child, tree.capacity)].set(True, mode="drop")
