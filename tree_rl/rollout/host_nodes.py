"""The host state of a rollout's nodes: one handle of a `HostEnv` per node that holds a sampler
sequence (the rollout's side of `tree_rl.envs.host`, driven by `steppers.HostEnvStepper`).

`HostNodes` owns the int64 [P, N] handle table (-1: none) and the env calls on it, each at the
engine's turn boundary: `start` resets the prompts' episodes (every root its own copy), `fork`
gives each planned child its parent's state where its KV pages fork, `step` acts in place with
the decoded replies, `release` frees the handles of released nodes, `close` every handle left.
The table is mutated in place, so every copy of a `RolloutState` sees the same handles (a
failed rollout's `close` finds the children forked just before the failure).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from tree_rl.envs.host import HostStep, text_hash


@dataclasses.dataclass
class HostNodes:
  env: object
  handles: np.ndarray   # int64 [P, N]

  @classmethod
  def start(cls, env, tasks: np.ndarray, capacity: int, num_trees: int):
    """Episodes of `tasks` [P]: -> (nodes, prompt tokens, lengths, the roots' situation keys)."""
    first, texts = env.reset(tasks)
    nodes = cls(env, np.full((len(tasks), capacity), -1, np.int64))
    nodes.handles[:, 0] = first
    try:
      if num_trees > 1:
        more = env.fork(nodes.handles[:, 0], np.full((len(tasks),), num_trees - 1))
        nodes.handles[:, 1:num_trees] = np.asarray(more).reshape(len(tasks), num_trees - 1)
      toks, lens = env.prompt_tokens(texts)
      keys = np.asarray(env.start_keys(first), np.int32)
    except BaseException:
      nodes.close()
      raise
    return nodes, toks, lens, keys

  def fork(self, plan, drop) -> tuple:
    """Every planned child gets its own copy of its parent's state, where its pages fork; a
    parent released after this turn's decode (`drop` [P, N]) hands its state to its first child
    instead (a chain's continuation copies nothing), after its other children copied it.
    Returns the rows to step: (prompt, child, row indices)."""
    wp, par, child, valid, fork, drop = (np.asarray(x) for x in jax.device_get(
        (plan.prompt, plan.parent, plan.child, plan.valid, plan.fork, drop)))
    moved = valid & ~fork & drop[wp, np.maximum(par, 0)]
    rows = np.nonzero(valid & ~moved)[0]
    if rows.size:
      src = self.handles[wp[rows], par[rows]]
      self.handles[wp[rows], child[rows]] = self.env.fork(src, np.ones(len(rows), np.int64))
    m = np.nonzero(moved)[0]
    self.handles[wp[m], child[m]] = self.handles[wp[m], par[m]]
    self.handles[wp[m], par[m]] = -1
    return wp, child, np.nonzero(valid)[0]

  def step(self, rows_of, out, eot: int, obs_capacity: int) -> HostStep:
    """Step the children's states in place with their decoded replies (`out`, the decode's
    output); -> the results for every decode row (zeros on padding rows)."""
    env = self.env
    wp, child, rows = rows_of
    toks, lens = (np.asarray(x) for x in jax.device_get((out.tokens, out.lengths)))
    w = toks.shape[0]
    handles = self.handles[wp[rows], child[rows]]
    replies = [toks[r, :lens[r]].tolist() for r in rows]
    texts = [env.reply_text(ids) for ids in replies]
    closed = np.array([bool(ids) and ids[-1] == eot for ids in replies], bool)
    obs_text, reward, done, info = env.step(handles, texts)
    obs, obs_len = env.observation_tokens(obs_text, closed)

    def full(values, dtype, shape=()):
      a = np.zeros((w,) + shape, dtype)
      a[rows] = values
      return a

    fields = env.info_fields
    scalars = (np.stack([np.asarray(info[f], np.float32) for f in fields], 1) if fields
               else np.zeros((len(rows), 0), np.float32))
    return HostStep(
        handle=full(handles, np.int32), reward=full(reward, np.float32), done=full(done, bool),
        info=full(scalars, np.float32, (len(fields),)),
        key=full(info.get("state_key", handles), np.int32),
        obs=full(obs, np.int32, (obs_capacity,)), obs_len=full(obs_len, np.int32),
        action=full([text_hash(env.action_key(t)) for t in texts], np.int32),
        tool_calls=full(info.get("tool_calls", 1), np.int32))

  def release(self, mask: np.ndarray) -> None:
    """Free the handles of nodes `mask` [P, N] (those without one are skipped)."""
    held = self.handles[mask]
    self.handles[mask] = -1
    held = held[held >= 0]
    if held.size:
      self.env.release(held)

  def close(self) -> None:
    self.release(self.handles >= 0)
