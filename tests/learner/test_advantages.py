"""Advantage estimators against values worked out by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.learner import advantages

EPS = 1e-6
S13 = math.sqrt(1 / 3)          # unbiased std of {1, 0, 1} and of {0, 0, 1}
S03 = math.sqrt(0.3)            # unbiased std of {1, 0, 1, 0, 0, 1}


def run(name, rewards, prompts, trees=None, valid=None, eps=EPS, jit=True):
  n = len(rewards)
  trees = np.zeros(n, np.int32) if trees is None else np.asarray(trees, np.int32)
  valid = np.ones(n, bool) if valid is None else np.asarray(valid, bool)
  fn = advantages.get(name)
  call = lambda r, p, t, v: fn(r, p, t, v, eps=eps)
  if jit:
    call = jax.jit(call)
  return np.asarray(call(jnp.asarray(rewards, jnp.float32), jnp.asarray(prompts, jnp.int32),
                         jnp.asarray(trees), jnp.asarray(valid)))


def test_grpo_groups_ties_single_all_equal_and_masked():
  # prompt 7: {1, 0, 1} (a tie); prompt 3: {2, 2} (all equal); prompt 42: one member;
  # the last slot is invalid and must neither count nor receive an advantage.
  r = [1, 0, 2, 1, 2, 5, 100]
  p = [7, 7, 3, 7, 3, 42, 7]
  v = [1, 1, 1, 1, 1, 1, 0]
  got = run("grpo", r, p, valid=v)
  want = [(1 / 3) / (S13 + EPS), (-2 / 3) / (S13 + EPS), 0.0, (1 / 3) / (S13 + EPS), 0.0,
          5 / (1 + EPS), 0.0]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_single_member_group_uses_mean_zero_std_one():
  got = run("grpo", [1.0, 3.0], [0, 1], eps=0.5)
  np.testing.assert_allclose(got, [1 / 1.5, 3 / 1.5], rtol=1e-6)


def test_rloo_and_drgrpo():
  r = [1, 0, 1, 4, 9]
  p = [0, 0, 0, 1, 2]
  v = [1, 1, 1, 1, 0]
  # rloo: r_i - mean of the others; alone -> baseline 0.
  np.testing.assert_allclose(run("rloo", r, p, valid=v), [0.5, -1.0, 0.5, 4.0, 0.0], atol=1e-6)
  # drgrpo: r_i - group mean (a single member keeps r: mean 0 convention).
  np.testing.assert_allclose(run("drgrpo", r, p, valid=v), [1 / 3, -2 / 3, 1 / 3, 4.0, 0.0],
                             atol=1e-6)


# One prompt, two trees: tree 0 leaves {1, 0, 1}, tree 1 leaves {0, 0, 1}; tree 2 of prompt 5
# is a single leaf; the last slot is padding.
TR = [1, 0, 1, 0, 0, 1, 1, 0]
TP = [0, 0, 0, 0, 0, 0, 5, 0]
TT = [0, 0, 0, 1, 1, 1, 2, 0]
TV = [1, 1, 1, 1, 1, 1, 1, 0]
INTER = [0.5 / (S03 + EPS) * s for s in (1, -1, 1, -1, -1, 1)] + [1 / (1 + EPS), 0.0]
INTRA = [(1 / 3) / (S13 + EPS), (-2 / 3) / (S13 + EPS), (1 / 3) / (S13 + EPS),
         (-1 / 3) / (S13 + EPS), (-1 / 3) / (S13 + EPS), (2 / 3) / (S13 + EPS),
         1 / (1 + EPS), 0.0]


def test_tree_inter_intra_and_tree_grpo():
  np.testing.assert_allclose(run("tree_inter", TR, TP, TT, TV), INTER, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run("tree_intra", TR, TP, TT, TV), INTRA, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run("tree_grpo", TR, TP, TT, TV), np.add(INTRA, INTER), rtol=1e-5,
                             atol=1e-6)


def test_tree_ids_are_local_to_their_prompt():
  # Tree id 0 under prompts 0 and 1 are two different trees.
  got = run("tree_intra", [1, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 0])
  a = 0.5 / (math.sqrt(0.5) + EPS)
  np.testing.assert_allclose(got, [a, -a, -a, a], rtol=1e-5)


def test_tree_2norm():
  # Prompt-normalised values are +-a; within each tree they re-normalise like the raw rewards
  # (the normalisation is scale and shift invariant), up to eps.
  got = run("tree_2norm", TR, TP, TT, TV)
  first_single = 1 / (1 + EPS)
  want = INTRA[:6] + [first_single / (1 + EPS), 0.0]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_eager_equals_jit_for_every_builtin():
  for name in ("grpo", "rloo", "drgrpo", "tree_grpo", "tree_intra", "tree_inter", "tree_2norm"):
    np.testing.assert_allclose(run(name, TR, TP, TT, TV, jit=False), run(name, TR, TP, TT, TV),
                               rtol=1e-6, atol=1e-7)


def test_custom_estimator_by_name_and_unknown_name_lists_known():
  @advantages.register("test_sign")
  def sign(rewards, prompt_ids, tree_ids, valid, *, eps=1e-6):
    return jnp.where(valid, jnp.sign(rewards - 0.5), 0.0)

  assert "test_sign" in advantages.names()
  np.testing.assert_array_equal(run("test_sign", [1, 0, 1], [0, 0, 0], valid=[1, 1, 0]),
                                [1.0, -1.0, 0.0])
  with pytest.raises(KeyError) as err:
    advantages.get("no_such_estimator")
  for known in ("grpo", "rloo", "tree_grpo", "test_sign"):
    assert known in str(err.value)


@pytest.mark.parametrize("value", [1.465617, 0.1])
def test_all_equal_groups_get_exactly_zero_advantage_under_every_builtin(value):
  # 16 equal non-dyadic rewards (one prompt, four trees of four), and a second prompt whose
  # four leaves are all `value` beside a prompt with real spread: the plain float32 mean of the
  # equal ones lands an ulp off and (r - mean) / (std + 1e-6) gave up to ~0.1 (public code too).
  r = [value] * 16 + [value] * 4 + [0.0, 1.0, 0.3, 0.7]
  p = [0] * 16 + [1] * 4 + [2] * 4
  t = [i // 4 for i in range(16)] + [0, 0, 1, 1] + [0, 0, 1, 1]
  for name in ("grpo", "drgrpo", "rloo", "tree_inter", "tree_intra", "tree_grpo", "tree_2norm"):
    got = run(name, r, p, trees=t)
    assert np.all(got[:20] == 0.0), (name, got[:20])
    assert np.any(got[20:] != 0.0), name    # a group with spread still gets advantages
