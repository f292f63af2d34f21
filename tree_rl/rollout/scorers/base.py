"""The scorer interface: partial-trajectory batches, the registry, `build` and the `Scorer`
object that takes its weights per call."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl import fields as fields_lib
from tree_rl.registry import Registry


@struct.dataclass
class ScoreInput:
  """Partial trajectories x = prompt, tau = steps so far, flattened over [P * S] branches."""

  tokens: jax.Array        # int32 [B, L] root..node tokens (prompt first), zero padded
  lengths: jax.Array       # int32 [B]
  prompt_len: jax.Array    # int32 [B] tokens of the prompt (the root), where step 1 starts
  step_ends: jax.Array     # int32 [B, D] end (exclusive) of each step after the prompt; -1 pad
  num_steps: jax.Array     # int32 [B]
  env_state: Any           # env state after the last step, leading [B]
  root_env_state: Any      # env state at the start of the episode, leading [B]
  prompt_id: jax.Array     # int32 [B]
  mask: jax.Array          # bool [B] real branches


class ScoreFn(Protocol):

  def __call__(self, weights: Any, batch: ScoreInput, key: jax.Array) -> jax.Array:
    ...


Factory = Callable[..., ScoreFn]
_REGISTRY = Registry("process scorer", "config.scorer.name")
get = _REGISTRY.get
names = _REGISTRY.names
WEIGHTS_FROM = (None, "policy", "own")


def register(name: str, fields: dict[str, Any] | None = None, *, overwrite: bool = True):
  """Decorator: `@register("name", fields={...})` on a `factory(cfg, **resources) -> score_fn`
  registers it and declares its own `config.scorer` fields (name -> `tree_rl.fields.Field`)."""

  def deco(factory: Factory) -> Factory:
    fields_lib.declare("scorer", name, fields)
    return _REGISTRY.register(name, overwrite=overwrite)(factory)

  return deco


@dataclasses.dataclass(frozen=True, eq=False)
class Scorer:
  """A built process scorer: `scorer(weights, batch, key) -> float32 [B]` in [0, 1], 0 on
  masked rows.

  weights_from: None (no model: the weights passed are ignored), "policy" (scores with the
  policy's weights) or "own" (a fixed checkpoint: `weights`, flat as `sampling.Cache.params`).
  """

  name: str
  fn: Callable                 # (weights, batch, key) -> scores, clipped and masked
  weights_from: str | None = None
  weights: Any = None

  def __post_init__(self):
    if self.weights_from not in WEIGHTS_FROM:
      raise ValueError(f"scorer {self.name!r}: weights_from={self.weights_from!r}; known: {WEIGHTS_FROM}")
    if (self.weights_from == "own") != (self.weights is not None):
      raise ValueError(f"scorer {self.name!r}: own weights go with weights_from='own' only")

  def weights_for(self, policy_weights: Any) -> Any:
    """The weights to call this scorer with when the policy's are `policy_weights`."""
    return policy_weights if self.weights_from == "policy" else self.weights

  def __call__(self, weights: Any, batch: ScoreInput, key: jax.Array) -> jax.Array:
    return self.fn(weights if self.weights_from else None, batch, key)


def build(cfg, *, weights_from: str | None = None, weights: Any = None, **resources) -> Scorer:
  """The scorer named by `cfg.name` (config.scorer), its output clipped to [0, 1] and masked.

  weights_from / weights: see `Scorer` (`from_config` sets them for the judge and the PRM).
  """
  fn = get(cfg.name)(cfg, **resources)
  # Scorers that call the sampler or carry a model run op by op around their own jitted parts.
  host = getattr(fn, "host", False) or any(getattr(r, "host", False) for r in resources.values())

  def score(w, batch: ScoreInput, key: jax.Array) -> jax.Array:
    s = jnp.asarray(fn(w, batch, key), jnp.float32)
    s = jnp.clip(jnp.nan_to_num(s, nan=0.5), 0.0, 1.0)
    return jnp.where(batch.mask, s, 0.0)

  return Scorer(cfg.name, score if host else jax.jit(score), weights_from, weights)


def place_rows(out: jax.Array, start: jax.Array, values: jax.Array, lengths: jax.Array) -> jax.Array:
  """out[b, start[b] + j] = values[b, j] for j < lengths[b] (rows [B, W] into out [B, T])."""
  j = jnp.arange(values.shape[1])[None]
  dest = jnp.where(j < lengths[:, None], start[:, None] + j, out.shape[1])
  return out.at[jnp.arange(out.shape[0])[:, None], dest].set(values, mode="drop")


def per_state(fn, env, env_params, batch: ScoreInput) -> jax.Array:
  """fn(env, env_params, state, root_state) of one unbatched state, over the batch's rows."""
  return jax.vmap(lambda st, root: fn(env, env_params, st, root))(batch.env_state, batch.root_env_state)


def score_input(tree, node_ids: jax.Array, max_len: int, max_depth: int) -> ScoreInput:
  """The partial trajectories ending at `node_ids` [P, S] (-1: no branch), flattened to [P*S]."""
  from tree_rl.rollout.sequences import path_sequences
  from tree_rl.rollout.tree import gather_env, path_nodes

  seqs = path_sequences(tree, node_ids, max_len, max_depth)
  paths = path_nodes(tree, max_depth)
  p_idx = jnp.arange(tree.num_prompts)[:, None]
  rows = jnp.where(node_ids[..., None] >= 0, paths[p_idx, jnp.maximum(node_ids, 0)], -1)
  seg_len = jnp.where(rows >= 0, tree.length[p_idx[..., None], jnp.maximum(rows, 0)], 0)
  ends = jnp.cumsum(seg_len, axis=-1)
  steps = jnp.sum(rows[..., 1:] >= 0, axis=-1)
  step_ends = jnp.where(rows[..., 1:] >= 0, jnp.minimum(ends[..., 1:], max_len), -1)  # skip the root
  rows_n = node_ids.shape[0] * node_ids.shape[1]
  flat = lambda x: x.reshape((rows_n,) + x.shape[2:])  # noqa: E731
  root = rows[..., 0]
  return ScoreInput(
      tokens=flat(seqs.tokens), lengths=flat(seqs.lengths),
      prompt_len=flat(jnp.minimum(ends[..., 0], max_len)).astype(jnp.int32),
      step_ends=flat(step_ends), num_steps=flat(steps).astype(jnp.int32),
      env_state=jax.tree.map(flat, gather_env(tree.env_state, node_ids)),
      root_env_state=jax.tree.map(flat, gather_env(tree.env_state, root)),
      prompt_id=flat(jnp.broadcast_to(tree.prompt_id[:, None], node_ids.shape)),
      mask=flat(node_ids >= 0))
