"""Step-level advantages (GiGPO, ARPO's shared-prefix mean), their inputs from a rollout tree,
and DAPO's reward-side pieces (overlong shaping, informative groups), against hand values."""

import math
import types

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl import envs
from tree_rl.learner import advantages
from tree_rl.learner import from_rollout
from tree_rl.rollout import tree as tree_lib

EPS = 1e-6
G = 0.9


def _cell_states(cells):
  """FrozenLake states on one 3x3 map (S . . / . . . / . . G) with the agent at `cells`."""
  env = envs.make("frozenlake", preset="rllm_small")
  tiles = np.zeros((env.max_size, env.max_size), np.int32)
  base = env.init_state(jnp.asarray(tiles), 3, 3, jnp.array([0, 0]))
  return env, [base.replace(pos=jnp.array(c, jnp.int32), steps=jnp.int32(k))
               for k, c in enumerate(cells)]


def test_gigpo_groups_turns_by_anchor_state_on_a_3x3_map():
  # Four trajectories of one prompt; the cells each turn acted from, and the step rewards.
  paths = [[(0, 0), (0, 1), (1, 1)], [(0, 0), (1, 0), (1, 1)], [(0, 0), (0, 1)],
           [(0, 0), (0, 1), (1, 1)]]
  rewards = [[0, 0, 1], [0, 0, 0], [0, 0], [0, 0, 1]]
  env, states = _cell_states([c for p in paths for c in p])
  keys = [int(env.state_key(s)) for s in states]   # the move counter differs; the cell decides
  cells = [c for p in paths for c in p]
  for a in range(len(cells)):
    for b in range(len(cells)):
      assert (keys[a] == keys[b]) == (cells[a] == cells[b])
  d = 3
  key = np.zeros((4, d), np.int32)
  rew = np.zeros((4, d), np.float32)
  mask = np.zeros((4, d), bool)
  it = iter(keys)
  for i, (p, r) in enumerate(zip(paths, rewards)):
    for t in range(len(p)):
      key[i, t], rew[i, t], mask[i, t] = next(it), r[t], True
  steps = advantages.StepInputs(node=np.where(mask, 1, -1), state_key=jnp.asarray(key),
                                reward=jnp.asarray(rew), mask=jnp.asarray(mask))
  outcome = jnp.asarray([1.0, 0.0, 0.0, 1.0])
  got = np.asarray(jax.jit(lambda r, s: advantages.compute(
      "gigpo", r, jnp.zeros(4, jnp.int32), jnp.zeros(4, jnp.int32), jnp.ones(4, bool),
      eps=EPS, steps=s, step_weight=0.5, step_gamma=G, episode_stats="trajectories"))(
          outcome, steps))
  # Episode level, each trajectory once: rewards {1, 0, 0, 1}: +-0.5 / sqrt(1/3).
  ep = 0.5 / (math.sqrt(1 / 3) + EPS)
  a_e = [ep, -ep, -ep, ep]
  # Step level, discounted returns (gamma 0.9): tau1 = tau4 = (0.81, 0.9, 1), tau2 = 0, tau3 = 0.
  # (0,0): {0.81, 0, 0, 0.81} -> +-0.405 / (0.405 sqrt(4/3)); (0,1): {0.9, 0, 0.9} (tau1, tau3,
  # tau4); (1,1): {1, 0, 1} (tau1, tau2, tau4); (1,0) is reached by tau2 only: 0.
  s00 = 0.405 / (0.405 * math.sqrt(4 / 3) + EPS)
  s01 = 0.3 / (math.sqrt(0.27) + EPS)
  s11 = (1 / 3) / (math.sqrt(1 / 3) + EPS)
  a_s = [[s00, s01, s11], [-s00, 0.0, -2 * s11], [-s00, -2 * s01, 0.0], [s00, s01, s11]]
  want = np.array([[a_e[i] + 0.5 * a_s[i][t] if mask[i, t] else 0.0 for t in range(d)]
                   for i in range(4)])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gigpo_masks_padding_and_separates_prompts():
  # Two prompts with the same anchor keys: their turns never share a group; an invalid slot
  # and masked turns get 0.
  key = jnp.array([[5, 6], [5, 6], [5, 6], [5, 6], [5, 6]], jnp.int32)
  rew = jnp.array([[0, 1], [0, 0], [0, 1], [0, 1], [9, 9]], jnp.float32)
  mask = jnp.array([[1, 1], [1, 1], [1, 1], [1, 0], [1, 1]], bool)
  steps = advantages.StepInputs(node=jnp.ones((5, 2), jnp.int32), state_key=key, reward=rew,
                                mask=mask)
  r = jnp.array([1.0, 0.0, 1.0, 0.0, 9.0])
  got = np.asarray(advantages.compute("gigpo_mean", r, jnp.array([0, 0, 1, 1, 1]),
                                      jnp.zeros(5, jnp.int32), jnp.array([1, 1, 1, 1, 0], bool),
                                      steps=steps, step_weight=1.0, step_gamma=1.0))
  # mean_norm: prompt 0 episode (0.5, -0.5), anchors 5: returns (1, 0) -> (0.5, -0.5), anchor
  # 6: (1, 0) -> (0.5, -0.5). Prompt 1: the episode mean over step rows, 2 of reward 1 and 1 of
  # 0, is 2/3: episode (1/3, -2/3); anchor 5: returns (1, 0) -> (0.5, -0.5); anchor 6: only
  # slot 2 (slot 3's turn is masked) -> 0.
  want = [[1.0, 1.0], [-1.0, -1.0], [1 / 3 + 0.5, 1 / 3], [-2 / 3 - 0.5, 0.0], [0.0, 0.0]]
  np.testing.assert_allclose(got, want, atol=1e-6)


def _episode_only(turns):
  """StepInputs of trajectories of `turns` turns, every turn from its own state, no step
  rewards: A_step is 0 and the advantage is the episode term alone."""
  d = max(turns)
  mask = np.arange(d)[None] < np.asarray(turns)[:, None]
  key = np.arange(len(turns) * d, dtype=np.int32).reshape(len(turns), d)
  return advantages.StepInputs(node=jnp.asarray(np.where(mask, 1, -1)), state_key=jnp.asarray(key),
                               reward=jnp.zeros(mask.shape, jnp.float32), mask=jnp.asarray(mask))


def test_gigpo_episode_statistics_run_over_step_rows():
  # R = [1, 1, 0, 0] over [2, 2, 8, 8] turns. Step rows: 4 rows of 1 and 16 of 0, mean 0.2,
  # unbiased std sqrt((4 * 0.8^2 + 16 * 0.2^2) / 19) = sqrt(3.2 / 19): A = 0.8 / 0.4104 = +1.949
  # and -0.2 / 0.4104 = -0.487. Each trajectory once: mean 0.5, std sqrt(1/3): +-0.866.
  steps = _episode_only([2, 2, 8, 8])
  r, pid, valid = jnp.array([1.0, 1.0, 0.0, 0.0]), jnp.zeros(4, jnp.int32), jnp.ones(4, bool)
  std = math.sqrt(3.2 / 19)
  for stats, hi, lo in (("step_rows", 0.8 / (std + EPS), -0.2 / (std + EPS)),
                        ("trajectories", 0.5 / (math.sqrt(1 / 3) + EPS),
                         -0.5 / (math.sqrt(1 / 3) + EPS))):
    got = np.asarray(advantages.compute("gigpo", r, pid, pid, valid, eps=EPS, steps=steps,
                                        episode_stats=stats))
    want = np.where(np.asarray(steps.mask), np.array([hi, hi, lo, lo])[:, None], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose([1.949, -0.487], [0.8 / std, -0.2 / std], atol=1e-3)
  # the default is the public code's
  np.testing.assert_allclose(
      np.asarray(advantages.compute("gigpo", r, pid, pid, valid, eps=EPS, steps=steps))[:, 0],
      [0.8 / (std + EPS)] * 2 + [-0.2 / (std + EPS)] * 2, rtol=1e-5)
  # a prompt with one trajectory: of 3 turns its rows are all equal (0); of one turn it is a
  # group of one row (mean 0, std 1: r / (1 + eps))
  for turns, want in (([3], 0.0), ([1], 2.0 / (1 + EPS))):
    got = advantages.compute("gigpo", jnp.array([2.0]), jnp.zeros(1, jnp.int32),
                             jnp.zeros(1, jnp.int32), jnp.ones(1, bool), eps=EPS,
                             steps=_episode_only(turns))
    np.testing.assert_allclose(np.asarray(got)[0, 0], want, rtol=1e-6)


def test_pair_ids_are_exact_pairs():
  a = jnp.array([0, 0, 1, 1, 0, 3])
  b = jnp.array([5, 5, 5, 7, 7, 5])
  ids = np.asarray(advantages.pair_ids(a, b, jnp.array([1, 1, 1, 1, 1, 0], bool)))
  assert ids[0] == ids[1] and len({ids[0], ids[2], ids[3], ids[4], ids[5]}) == 5


def test_shared_prefix_tokens_take_the_mean_of_their_leaves():
  # Prompt 0: leaves a (nodes 1, 2), b (nodes 1, 3), c (node 4); prompt 1: leaf d through a
  # node also numbered 1 (another prompt's node: not shared).
  node = jnp.array([[1, 2], [1, 3], [4, -1], [1, 5]])
  steps = advantages.StepInputs(node=node, state_key=jnp.zeros((4, 2), jnp.int32),
                                reward=jnp.zeros((4, 2)), mask=node >= 0)
  adv = jnp.array([1.0, -1.0, 0.5, 3.0])
  got = np.asarray(advantages.shared_mean(adv, jnp.array([0, 0, 0, 1]), jnp.ones(4, bool), steps))
  np.testing.assert_allclose(got, [[0.0, 1.0], [0.0, -1.0], [0.5, 0.0], [3.0, 3.0]])
  # An invalid leaf neither counts in its nodes' mean nor gets a value.
  got = np.asarray(advantages.shared_mean(adv, jnp.array([0, 0, 0, 1]),
                                          jnp.array([1, 0, 1, 1], bool), steps))
  np.testing.assert_allclose(got, [[1.0, 1.0], [0.0, 0.0], [0.5, 0.0], [3.0, 3.0]])


def _hand_tree():
  """One prompt: root 0 -> 1 -> {2, 3}; rewards 0, 0.5 (node 2), 1 (node 3); 8-token nodes."""
  t = tree_lib.empty(1, 6, 8, jnp.zeros((), jnp.int32))
  parent = jnp.array([[-1, 0, 1, 1, -1, -1]])
  used = jnp.array([[1, 1, 1, 1, 0, 0]], bool)
  depth = jnp.array([[0, 1, 2, 2, 0, 0]])
  reward = jnp.array([[0.0, 0.0, 0.5, 1.0, 0, 0]])
  policy_len = jnp.array([[0, 3, 8, 2, 0, 0]])
  tokens = jnp.zeros((1, 6, 8), jnp.int32).at[0, 2, 7].set(5).at[0, 3, 1].set(9).at[0, 1, 2].set(9)
  t = t.replace(parent=parent, used=used, depth=depth, reward=reward, ret=reward,
                policy_len=policy_len, tokens=tokens, num_children=jnp.array([[1, 2, 0, 0, 0, 0]]),
                size=jnp.array([4]))
  return types.SimpleNamespace(tree=t, leaf=jnp.array([[2, 3, -1]]),
                               valid=jnp.array([[1, 1, 0]], bool),
                               reward=jnp.array([[0.5, 1.0, 0.0]]),
                               state_key=jnp.array([[70, 71, 72, 73, 0, 0]]))


def test_step_inputs_follow_each_leaf_path():
  s = from_rollout.step_inputs(_hand_tree(), max_turns=3)
  np.testing.assert_array_equal(s.node, [[1, 2, -1], [1, 3, -1], [-1, -1, -1]])
  # a turn's anchor is the state it acted from: its parent node's
  np.testing.assert_array_equal(s.state_key, [[70, 71, 0], [70, 71, 0], [0, 0, 0]])
  np.testing.assert_allclose(s.reward, [[0, 0.5, 0], [0, 1.0, 0], [0, 0, 0]])


def test_overlong_penalty_by_hand():
  # limit 100 tokens, window 20: none up to 80, linear to -1 at 100, -1 beyond.
  np.testing.assert_allclose(from_rollout.overlong_penalty([70, 80, 90, 100, 120], 100, 20.0),
                             [0.0, 0.0, -0.5, -1.0, -1.0])
  np.testing.assert_allclose(from_rollout.overlong_penalty([90, 120], 100, 20.0, scale=0.5),
                             [-0.25, -0.5])


def test_overlong_shaping_of_a_hand_tree_takes_off_at_most_the_scale():
  # _hand_tree's leaves: 11 and 5 generated tokens, the first truncated; rewards 0.5 and 1.
  # Limit 2 turns x 8 = 16, window 0.5 x 16 = 8 (from 8 tokens on), scale 0.5: the 11-token
  # leaf loses 0.5 x 3 / 8 = 0.1875, the 5-token one nothing.
  from tree_rl.config import base_config
  c = base_config()
  c.rollout.max_turns, c.rollout.max_tokens_per_turn = 2, 8
  c.learner.overlong_window, c.learner.overlong_penalty = 0.5, 0.5
  for mode, want, train in (("keep", [0.3125, 1.0, 0.0], [1, 1, 1]),
                            ("penalize", [0.0, 1.0, 0.0], [1, 1, 1]),
                            ("mask", [0.3125, 1.0, 0.0], [0, 1, 1])):
    c.learner.overlong_truncated = mode
    reward, trainable = from_rollout.shaped_rewards(
        c.learner, _hand_tree(), max_turns=c.rollout.max_turns,
        max_tokens_per_turn=c.rollout.max_tokens_per_turn, end_of_turn_id=9)
    np.testing.assert_allclose(reward, [want], atol=1e-6)
    np.testing.assert_array_equal(trainable, [np.asarray(train, bool)])


def test_leaf_lengths_and_truncation():
  # eot id 9, 8 tokens per turn: node 2 ran to 8 tokens ending in 5 (cut); node 1 ended in 9.
  gen, trunc = from_rollout.leaf_lengths(_hand_tree(), end_of_turn_id=9, max_tokens_per_turn=8)
  np.testing.assert_array_equal(gen, [[11, 5, 0]])
  np.testing.assert_array_equal(trunc, [[True, False, False]])


def test_informative_groups_are_those_with_both_successes_and_failures():
  # success is reward > 0: a format penalty (-0.1 against 0) is a failure either way, and two
  # successes of different reward are both successes
  out = types.SimpleNamespace(
      reward=jnp.array([[1, 1, 0], [1, 1, 0], [0, 0, 0], [2, 0, 0], [0, -0.1, 0], [1, 0.5, 1],
                        [-0.1, 0.9, 0]], jnp.float32),
      valid=jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 1],
                       [1, 1, 1]], bool))
  np.testing.assert_array_equal(from_rollout.informative_groups(out),
                                [True, False, False, False, False, False, True])
