"""Demonstrations in a host environment: the expert's plans played in the real env, as `Demos`.

The host counterpart of `demos.DemoGenerator`, with the same sequence layout and masks
(prompt | reply_1 obs_1 | ... | reply_n, replies trained, noisy replies too only with
`loss_on_noise`). The expert gives whole plans, `expert.plan(task, rng) -> [(text, noisy)]`
(cut at the env's turn limit); episodes draw their tasks uniformly from the env's task list. A
reply longer than a turn may generate (`env.max_reply_tokens`) is refused up front: the policy
could never give it.
There is no reply table on the host: `Demos.rows` holds the turn index and `intended` -1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.warmstart.demos import Demos


class HostDemoGenerator:
  """`gen(key, num_episodes) -> Demos` for a `tree_rl.envs.host.HostEnv` with a plan expert."""

  def __init__(self, env, tokenizer, expert, *, max_len: int, loss_on_noise: bool = False,
               hard_turn_weight: float = 1.0):
    if max_len < 2:
      raise ValueError(f"warmstart.max_len must be >= 2, got {max_len}")
    if hard_turn_weight != 1.0:   # a plan expert does not say which turns are hard
      raise ValueError(f"warmstart.hard_turn_weight={hard_turn_weight} needs an on-device expert "
                       f"with hard(state); a host env's plan expert has none")
    self.env, self.tokenizer, self.expert = env, tokenizer, expert
    self.max_len, self.loss_on_noise = int(max_len), bool(loss_on_noise)
    self.max_turns = env.max_turns
    self.max_reply = int(getattr(env, "max_reply_tokens", 1 << 30))   # a reply the policy can give

  def __call__(self, key, num_episodes: int) -> Demos:
    env, n, t_max = self.env, int(num_episodes), self.max_turns
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    tasks = rng.integers(0, env.num_tasks, n)
    plans = [self.expert.plan(env.tasks[t], rng)[:t_max] for t in tasks]
    handles, texts = env.reset(tasks)
    try:
      prompts, plens = env.prompt_tokens(texts)
      seqs = [prompts[i, :plens[i]].tolist() for i in range(n)]
      train = [[0] * len(s) for s in seqs]
      reply = [[0] * len(s) for s in seqs]
      noisy = np.zeros((n, t_max), bool)
      rows = np.full((n, t_max), -1, np.int32)
      ret, done = np.zeros((n,), np.float32), np.zeros((n,), bool)
      turns = np.zeros((n,), np.int32)
      for t in range(t_max):
        go = [i for i in range(n) if not done[i] and t < len(plans[i])]
        if not go:
          break
        obs, r, d, _ = env.step(handles[go], [plans[i][t][0] for i in go])
        obs_tok, obs_len = env.observation_tokens(obs, np.ones((len(go),), bool))
        for j, i in enumerate(go):
          text, is_noise = plans[i][t]
          ids = self.tokenizer.encode(text) + [self.tokenizer.end_of_turn_id]
          if len(ids) > self.max_reply:
            raise ValueError(f"an expert reply takes {len(ids)} tokens, more than a turn may "
                             f"generate ({self.max_reply}): raise config.rollout.max_tokens_per_turn")
          seqs[i] += ids
          reply[i] += [1] * len(ids)
          train[i] += [int(self.loss_on_noise or not is_noise)] * len(ids)
          rows[i, t], noisy[i, t] = t, is_noise
          ret[i] += r[j]
          turns[i] += 1
          done[i] = d[j]
          if not d[j]:
            o = obs_tok[j, :obs_len[j]].tolist()
            seqs[i] += o
            train[i] += [0] * len(o)
            reply[i] += [0] * len(o)
    finally:
      env.release(handles)
    return self._pack(seqs, train, reply, plens, rows, noisy, turns, ret)

  def _pack(self, seqs, train, reply, plens, rows, noisy, turns, ret) -> Demos:
    n, L = len(seqs), self.max_len
    tokens = np.full((n, L), self.tokenizer.pad_id, np.int32)
    loss, rep = np.zeros((n, L), np.float32), np.zeros((n, L), bool)
    for i, s in enumerate(seqs):
      k = min(len(s), L)
      tokens[i, :k], loss[i, :k], rep[i, :k] = s[:k], train[i][:k], reply[i][:k]
    length = np.array([len(s) for s in seqs])
    return Demos(tokens=jnp.asarray(tokens), loss_mask=jnp.asarray(loss), reply_mask=jnp.asarray(rep),
                 length=jnp.asarray(np.minimum(length, L), jnp.int32),
                 prompt_len=jnp.asarray(np.minimum(plens, L), jnp.int32), rows=jnp.asarray(rows),
                 intended=jnp.full(rows.shape, -1, jnp.int32), noisy=jnp.asarray(noisy),
                 turns=jnp.asarray(turns), reward=jnp.asarray(ret), success=jnp.asarray(ret > 0),
                 truncated=jnp.asarray(length > L), hard=jnp.zeros((n,), bool))
