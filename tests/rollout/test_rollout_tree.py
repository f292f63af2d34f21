"""Tree structure and root-to-leaf sequences on a hand-built tree."""

import jax.numpy as jnp
import numpy as np

from tree_rl.rollout import sequences, tree as tree_lib

# Prompt 0:   root r (prompt 10 11 12)
#             |- a: policy 20 21, obs 22
#             |    `- c: policy 40 41 42 (leaf)
#             `- b: policy 30, obs 31 32 (leaf)
# Prompt 1:   root (prompt 50 51) `- d: policy 60, obs 61 (leaf)
NODES = {
    0: [(-1, [], [10, 11, 12]), (0, [20, 21], [22]), (0, [30], [31, 32]), (1, [40, 41, 42], [])],
    1: [(-1, [], [50, 51]), (0, [60], [61])],
}


def hand_tree(capacity=6, width=4):
  t = tree_lib.empty(2, capacity, width, {"pos": jnp.zeros((), jnp.int32)})
  f = {k: np.array(getattr(t, k)) for k in ("parent", "depth", "used", "tokens", "logprobs",
                                            "policy_len", "obs_len")}
  for p, nodes in NODES.items():
    for i, (par, pol, obs) in enumerate(nodes):
      f["parent"][p, i] = par
      f["depth"][p, i] = 0 if par < 0 else f["depth"][p, par] + 1
      f["used"][p, i] = True
      toks = pol + obs
      f["tokens"][p, i, :len(toks)] = toks
      f["logprobs"][p, i, :len(pol)] = -0.1 * np.array(pol, np.float32)
      f["policy_len"][p, i], f["obs_len"][p, i] = len(pol), len(obs)
  nc = np.zeros((2, capacity), np.int32)
  for p in range(2):
    for i in range(capacity):
      if f["used"][p, i] and f["parent"][p, i] >= 0:
        nc[p, f["parent"][p, i]] += 1
  return t.replace(**{k: jnp.asarray(v) for k, v in f.items()}, num_children=jnp.asarray(nc),
                   size=jnp.array([4, 2], jnp.int32))


def test_paths_and_leaves():
  t = hand_tree()
  paths = np.array(tree_lib.path_nodes(t, max_depth=3))
  np.testing.assert_array_equal(paths[0, 3], [0, 1, 3, -1])
  np.testing.assert_array_equal(paths[0, 2], [0, 2, -1, -1])
  np.testing.assert_array_equal(paths[1, 1], [0, 1, -1, -1])
  np.testing.assert_array_equal(paths[1, 4], [-1, -1, -1, -1])
  ids, mask = tree_lib.leaf_ids(t, 3)
  np.testing.assert_array_equal(np.array(ids), [[2, 3, -1], [1, -1, -1]])


def test_allocate_and_scatter():
  t = hand_tree()
  ids, overflow = tree_lib.allocate(t, jnp.array([[1, 0, 1, 1], [1, 1, 1, 1]], bool))
  np.testing.assert_array_equal(np.array(ids), [[4, -1, 5, -1], [2, 3, 4, 5]])
  np.testing.assert_array_equal(np.array(overflow), [True, False])
  out = tree_lib.scatter(jnp.zeros((2, 6)), ids, jnp.ones((2, 4)))
  assert float(out.sum()) == 6.0


def test_path_sequences_match_hand_concatenation():
  t = hand_tree()
  batch = sequences.path_sequences(t, jnp.array([[3, 2], [1, -1]]), max_len=12, max_depth=3)
  toks = np.array(batch.tokens)
  np.testing.assert_array_equal(toks[0, 0, :9], [10, 11, 12, 20, 21, 22, 40, 41, 42])
  np.testing.assert_array_equal(np.array(batch.loss_mask)[0, 0, :10],
                                [0, 0, 0, 1, 1, 0, 1, 1, 1, 0])
  np.testing.assert_array_equal(toks[0, 1, :6], [10, 11, 12, 30, 31, 32])
  np.testing.assert_array_equal(np.array(batch.loss_mask)[0, 1, :6], [0, 0, 0, 1, 0, 0])
  np.testing.assert_array_equal(toks[1, 0, :4], [50, 51, 60, 61])
  np.testing.assert_array_equal(np.array(batch.lengths), [[9, 6], [4, 0]])
  lp = np.array(batch.logprobs)[0, 0]
  np.testing.assert_allclose(lp[[3, 4, 6, 7, 8]], [-2.0, -2.1, -4.0, -4.1, -4.2], rtol=1e-6)
  assert np.all(lp[[0, 1, 2, 5, 9]] == 0)
  assert not np.array(batch.valid)[1, 1].any()
