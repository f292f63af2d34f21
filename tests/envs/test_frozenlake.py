"""FrozenLake: gymnasium parity, map generation, snapshots, tracing and batching."""

import collections

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl import envs
from tree_rl.envs.frozenlake.json_maps import rows_of, shortest_path
from tree_rl.envs import frozenlake as fl

KEY = jax.random.key(0)


def _host_bfs(tiles, size, src, dst):
  """Plain breadth-first search on the host (independent of the device bitmask BFS)."""
  return shortest_path(np.asarray(tiles)[:size, :size], src, dst)


@pytest.fixture(scope="module")
def maps():
  env = fl.FrozenLake("rllm")
  states, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(KEY, 2000),
                                                              env.default_params)
  return env, jax.tree.map(np.asarray, states)


def _all_pairs_step(env, params):
  """Step every (cell, action) of one map: vmapped once over positions and actions."""
  def one(state, r, c, a, key):
    s = state.replace(pos=jnp.stack([r, c]))
    s2, _, reward, done, info = env.step(key, s, a, params)
    return s2.pos, reward, done
  return jax.jit(jax.vmap(one, in_axes=(None, 0, 0, 0, 0)))


def test_transitions_equal_gymnasium_when_not_slippery(maps):
  env, states = maps
  params = env.default_params.replace(max_steps=jnp.int32(99), max_turns=jnp.int32(99))
  step_all = _all_pairs_step(env, params)
  m = env.max_size
  rr, cc, aa = np.meshgrid(np.arange(m), np.arange(m), np.arange(4), indexing="ij")
  rr, cc, aa = rr.ravel(), cc.ravel(), aa.ravel()
  keys = jax.random.split(KEY, rr.size)
  checked = 0
  for i in range(0, 2000, 97):   # ~20 maps of all sizes
    s = jax.tree.map(lambda x: x[i], states)
    size = int(s.nrow)
    g = gym.make("FrozenLake-v1", desc=rows_of(s.tiles, size, size, s.start),
                 is_slippery=False).unwrapped
    pos, reward, done = jax.tree.map(np.asarray, step_all(s, rr, cc, aa, keys))
    for j in range(rr.size):
      r, c, a = rr[j], cc[j], aa[j]
      if r >= size or c >= size or s.tiles[r, c] in (fl.HOLE, fl.GOAL):
        continue
      (prob, ns, rew, term), = g.P[r * size + c][a]
      assert (pos[j][0] * size + pos[j][1], reward[j], done[j]) == (ns, rew, term), (i, r, c, a)
      checked += 1
  assert checked > 1000


def test_slippery_distribution_matches_gymnasium():
  env = fl.FrozenLake("ragen")
  params = env.default_params.replace(max_steps=jnp.int32(99), max_turns=jnp.int32(99))
  state, _ = env.reset(jax.random.key(5), params)
  s = jax.tree.map(np.asarray, state)
  g = gym.make("FrozenLake-v1", desc=rows_of(s.tiles, 4, 4, s.start), is_slippery=True).unwrapped
  n = 4000
  step_all = _all_pairs_step(env, params)
  cells = [(r, c) for r in range(4) for c in range(4) if s.tiles[r, c] == fl.FROZEN][:4]
  for r, c in cells:
    for a in range(4):
      pos, reward, done = jax.tree.map(np.asarray, step_all(
          state, np.full(n, r), np.full(n, c), np.full(n, a), jax.random.split(jax.random.key(r * 4 + c + 10 * a), n)))
      expected = collections.Counter()
      for prob, ns, rew, term in g.P[r * 4 + c][a]:
        expected[(ns, rew, term)] += prob
      seen = collections.Counter(zip(pos[:, 0] * 4 + pos[:, 1], reward, done))
      assert set(seen) <= set(expected)
      for outcome, p in expected.items():
        freq = seen[outcome] / n
        assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (r, c, a, outcome, freq, p)


def test_generated_maps_reachable_and_within_ranges(maps):
  env, s = maps
  hp = env._host_params
  sizes = s.nrow
  assert np.all(s.nrow == s.ncol)
  assert sizes.min() == hp["min_size"] and sizes.max() == hp["max_size"]
  counts = np.bincount(sizes, minlength=10)[2:]
  assert np.all(np.abs(counts / 2000 - 1 / 8) < 5 * np.sqrt(1 / 8 * 7 / 8 / 2000))  # sizes uniform
  frozen_fracs = []
  for i in range(2000):
    size = int(sizes[i])
    tiles = s.tiles[i]
    assert np.all(tiles[size:, :] == fl.PAD) and np.all(tiles[:, size:] == fl.PAD)
    goal = np.argwhere(tiles == fl.GOAL)
    assert len(goal) == 1 and tuple(goal[0]) != tuple(s.start[i])
    assert tiles[tuple(s.start[i])] == fl.FROZEN
    d = _host_bfs(tiles, size, s.start[i], goal[0])
    assert 1 <= d <= hp["max_steps"]
    if size >= 5:
      inner = tiles[:size, :size]
      frozen_fracs.append(((inner == fl.FROZEN).sum() - 1) / (size * size - 2))
  # reachability rejection favours frozen maps a little; the mean stays inside [p_min, p_max]
  assert hp["p_min"] <= np.mean(frozen_fracs) <= hp["p_max"]


def test_the_long_preset_draws_sides_5_to_7_whose_shortest_path_is_4_to_16_moves():
  env = fl.FrozenLake("long")
  states, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(KEY, 300),
                                                              env.default_params)
  s = jax.tree.map(np.asarray, states)
  assert set(np.unique(s.nrow)) == {5, 6, 7} and env.max_size == 7
  d = [_host_bfs(s.tiles[i], int(s.nrow[i]), s.start[i], np.argwhere(s.tiles[i] == fl.GOAL)[0])
       for i in range(300)]
  assert min(d) >= 4 and max(d) <= 16 and min(d) == 4   # the bound binds, and is met
  with pytest.raises(ValueError, match="min_steps"):
    fl.FrozenLake("long", min_size=2)   # no path of 4 moves fits every 2x2 map


def test_distance_to_goal_matches_host_bfs(maps):
  env, s = maps
  d = np.asarray(jax.jit(jax.vmap(fl.distance_to_goal))(s))
  for i in range(0, 2000, 7):
    goal = np.argwhere(s.tiles[i] == fl.GOAL)[0]
    assert d[i] == _host_bfs(s.tiles[i], int(s.nrow[i]), s.start[i], goal)


def test_step_rules_invalid_noop_limits():
  env = fl.FrozenLake("rllm", max_steps=3, max_turns=4)
  tiles = np.full((9, 9), fl.PAD)
  tiles[:3, :3] = [[0, 0, 1], [0, 0, 0], [0, 0, 2]]
  s = env.init_state(tiles, 3, 3, (0, 0))
  p = env.default_params
  s1, _, r, d, info = env.step(KEY, s, fl.INVALID, p)
  assert (tuple(s1.pos), float(r), bool(d), int(s1.steps), int(s1.turns), bool(info["invalid"])) == (
      (0, 0), 0.0, False, 0, 1, True)
  s2, _, r, d, _ = env.step(KEY, s1, fl.UP, p)          # wall: stays, uses a move
  assert tuple(s2.pos) == (0, 0) and int(s2.steps) == 1
  s3, _, r, d, _ = env.step(KEY, s2, fl.DOWN, p)
  s4, _, r, d, info = env.step(KEY, s3, fl.RIGHT, p)    # third move: step limit
  assert tuple(s4.pos) == (1, 1) and bool(d) and float(r) == 0.0 and int(s4.status) == fl.ST_OUT_OF_STEPS
  s5, _, r, d, _ = env.step(KEY, s4, fl.RIGHT, p)       # done: nothing changes
  assert tuple(s5.pos) == (1, 1) and float(r) == 0.0 and int(s5.turns) == int(s4.turns)
  # multi-move turn stops at the goal; reward 1 once
  env2 = fl.FrozenLake("ragen", max_actions=3, slippery=False, max_size=9)
  g = env2.init_state(tiles, 3, 3, (1, 1))
  g2, _, r, d, info = env2.step(KEY, g, jnp.array([fl.DOWN, fl.RIGHT, fl.UP]), env2.default_params)
  assert tuple(g2.pos) == (2, 2) and float(r) == 1.0 and bool(d) and int(g2.steps) == 2
  # ragen format penalty on an invalid turn
  _, _, r, _, _ = env2.step(KEY, g, jnp.array([fl.INVALID, fl.NOOP, fl.NOOP]), env2.default_params)
  assert float(r) == pytest.approx(-0.1)


def test_snapshot_restore_replays_identically():
  from tree_rl.models.tokenizers import BuiltinTokenizer
  env = envs.make("frozenlake", preset="ragen", tokenizer=BuiltinTokenizer())
  p = env.default_params
  batch = 16
  states, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(KEY, batch), p)
  step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
  render = jax.jit(jax.vmap(env.observation_tokens, in_axes=(0, None, None)))
  rng = np.random.default_rng(0)
  acts = rng.integers(0, 4, size=(8, batch, 2)).astype(np.int32)
  keys = jax.random.split(jax.random.key(9), 8 * batch).reshape(8, batch)
  for t in range(3):
    states, *_ = step(keys[t], states, acts[t], p)
  snap = envs.snapshot(states)

  def run(s):
    out = []
    for t in range(3, 8):
      s, obs, r, d, _ = step(keys[t], s, acts[t], p)
      out.append((np.asarray(obs), np.asarray(r), np.asarray(d), np.asarray(render(s, True, p)[0])))
    return out

  a, b = run(states), run(envs.restore(snap))
  for x, y in zip(a, b):
    for u, v in zip(x, y):
      np.testing.assert_array_equal(u, v)
  # branching one env into 4 copies: every branch starts from the same state
  branches = envs.repeat(envs.take(snap, 3), 4)
  np.testing.assert_array_equal(branches.pos, np.broadcast_to(np.asarray(snap.pos[3]), (4, 2)))


def test_each_function_traces_once_and_batch_of_1024():
  from tree_rl.models.tokenizers import BuiltinTokenizer
  env = fl.FrozenLake("rllm", tokenizer=BuiltinTokenizer())
  p = env.default_params
  n = 1024
  reset = jax.jit(jax.vmap(chex.assert_max_traces(env.reset, n=1), in_axes=(0, None)))
  step = jax.jit(jax.vmap(chex.assert_max_traces(env.step, n=1), in_axes=(0, 0, 0, None)))
  prompt = jax.jit(jax.vmap(chex.assert_max_traces(env.initial_prompt_tokens, n=1), in_axes=(0, None)))
  obs_tok = jax.jit(jax.vmap(chex.assert_max_traces(env.observation_tokens, n=1), in_axes=(0, 0, None)))
  parse = jax.jit(jax.vmap(chex.assert_max_traces(env.parse_action, n=1)))
  dist = jax.jit(jax.vmap(chex.assert_max_traces(fl.distance_to_goal, n=1)))
  states, _ = reset(jax.random.split(KEY, n), p)
  toks, lens = prompt(states, p)
  assert toks.shape == (n, env.text.prompt_capacity) and int(lens.max()) <= env.text.prompt_capacity
  for t in range(2):
    reply = jnp.zeros((n, env.max_reply_tokens), jnp.int32)
    acts = parse(reply, jnp.zeros((n,), jnp.int32))
    assert np.all(np.asarray(acts)[:, 0] == fl.INVALID)
    acts = jax.random.randint(jax.random.key(t), (n, 1), 0, 4)
    states, obs, r, d, _ = step(jax.random.split(jax.random.key(t), n), states, acts, p)
    otoks, olens = obs_tok(states, jnp.ones((n,), bool), p)
    dd = dist(states)
    assert obs.shape == (n, 9, 9) and r.shape == (n,) and otoks.shape == (n, env.text.obs_capacity)
  assert np.all(np.asarray(dd)[np.asarray(states.fell)] == -1)
  # batched results equal the unbatched call for one env
  one = jax.tree.map(lambda x: x[7], states)
  np.testing.assert_array_equal(env.observation_tokens(one, True, p)[0], otoks[7])


def test_registry_make_register_and_config(builtin_tok):
  from tree_rl import config as cfg
  assert {"frozenlake", "toolcall"} <= set(envs.registered())
  with pytest.raises(KeyError, match="config.env.name"):
    envs.make("nope")

  class Tiny(fl.FrozenLake):     # a notebook can register its own env
    pass

  envs.register("tiny_lake", lambda tokenizer=None, preset="rllm", **kw: Tiny(preset, tokenizer=tokenizer, **kw),
                config_fields=("preset",), overwrite=True)
  assert isinstance(envs.make("tiny_lake"), Tiny)
  c = cfg.base_config()
  env = envs.from_config(c, builtin_tok)
  assert isinstance(env, fl.FrozenLake) and int(env.default_params.max_turns) == c.rollout.max_turns
  c.env.name, c.env.preset, c.env.max_calls = "toolcall", "default", 2
  tool_env = envs.from_config(c, builtin_tok)
  assert int(tool_env.default_params.max_calls) == 2 and tool_env.split == "train"
  c.env.name = "tiny_lake"
  c.env.preset = "ragen"
  assert envs.from_config(c, builtin_tok).max_size == 4
