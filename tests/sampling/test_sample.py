"""Sampling filters against hand-computed expectations."""

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.sampling.sample import _top_p_filter, sample

LOGITS = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4096))


def _freq(tokens):
  return np.bincount(np.asarray(tokens), minlength=4) / tokens.shape[0]


def test_greedy_at_temperature_zero_and_logprob_under_the_tempered_policy():
  tok, lp = sample(jax.random.key(0), LOGITS[:3], jnp.float32(0.0))
  np.testing.assert_array_equal(tok, [0, 0, 0])
  np.testing.assert_allclose(lp, np.log(0.5), rtol=1e-6)        # greedy: under temperature 1
  tok, lp = sample(jax.random.key(0), LOGITS, jnp.float32(2.0))
  tempered = np.sqrt([0.5, 0.3, 0.15, 0.05])                     # p^(1/2), renormalised
  tempered /= tempered.sum()
  np.testing.assert_allclose(lp, np.log(tempered)[np.asarray(tok)], rtol=1e-5)
  # the same tokens were drawn from that tempered distribution
  np.testing.assert_allclose(_freq(tok), tempered, atol=0.03)


def test_top_p_keeps_smallest_prefix_reaching_mass():
  vals = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  kept = np.isfinite(np.asarray(_top_p_filter(vals, 0.7)))
  np.testing.assert_array_equal(kept, [[True, True, False, False]])     # 0.5 < 0.7 <= 0.8
  kept = np.isfinite(np.asarray(_top_p_filter(vals, 0.5)))
  np.testing.assert_array_equal(kept, [[True, False, False, False]])


def test_top_k_and_top_p_sampling_frequencies():
  f = _freq(sample(jax.random.key(1), LOGITS, jnp.float32(1.0), top_k=2)[0])
  np.testing.assert_allclose(f, [0.625, 0.375, 0, 0], atol=0.03)       # renormalised 0.5 : 0.3
  f = _freq(sample(jax.random.key(2), LOGITS, jnp.float32(1.0), top_p=0.7)[0])
  np.testing.assert_allclose(f, [0.625, 0.375, 0, 0], atol=0.03)
  f = _freq(sample(jax.random.key(3), LOGITS, jnp.float32(1.0))[0])
  np.testing.assert_allclose(f, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_per_row_temperatures_draw_as_each_row_alone():
  """Temperatures [B]: a greedy row takes the argmax (logprob under T = 1), a tempered row draws
  exactly what a batch at its scalar temperature draws with the same per-row keys."""
  keys = jax.random.split(jax.random.key(3), 64)
  logits = jax.random.normal(jax.random.key(4), (64, 7)) * 2.0
  temps = jnp.where(jnp.arange(64) % 3 == 0, 0.0, jnp.where(jnp.arange(64) % 3 == 1, 1.0, 0.5))
  tok, lp = sample(keys, logits, temps)
  for t in (0.0, 1.0, 0.5):
    rows = np.nonzero(np.asarray(temps) == t)[0]
    want_tok, want_lp = sample(keys[rows], logits[rows], jnp.float32(t))
    np.testing.assert_array_equal(np.asarray(tok)[rows], np.asarray(want_tok))
    np.testing.assert_allclose(np.asarray(lp)[rows], np.asarray(want_lp), rtol=1e-6, atol=1e-6)
  greedy = np.asarray(temps) == 0
  np.testing.assert_array_equal(np.asarray(tok)[greedy], np.argmax(np.asarray(logits), -1)[greedy])
  logp1 = np.asarray(jax.nn.log_softmax(logits, -1))
  np.testing.assert_allclose(np.asarray(lp)[greedy],
                             logp1[greedy, np.asarray(tok)[greedy]], rtol=1e-5, atol=1e-6)
