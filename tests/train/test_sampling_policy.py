"""One policy on both sides: the sampler's old log-probs and the learner's log-probs are both
of softmax(logits / rollout.temperature), checked against a dense forward of the model."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from configs import frozenlake
from tree_rl import train
from tree_rl.learner.batches import LeafBatch
from tree_rl.learner.from_rollout import learner_batches
from tree_rl.rollout.driver import run

from loop_helpers import smoke

T = 0.5


def test_old_and_new_logprobs_are_of_the_tempered_policy(data_dir):
  c = smoke(frozenlake, "chain", data_dir, **{"rollout.temperature": T, "learner.packed": False,
                                               "learner.row_tokens": 0})   # per-leaf rows
  parts = train.build_parts(c)
  state = parts.train_step.init()
  cache = train.new_cache(parts, state.params)
  states = jax.tree.map(lambda x: x[:2], parts.tasks.train_states)
  out, cache = run(parts.engine, parts.method, cache, states, jax.random.key(3))
  (batch,) = learner_batches(c, out, row_multiple=parts.train_step.row_multiple)
  assert isinstance(batch, LeafBatch)
  mask = np.asarray(batch.loss_mask)
  assert mask.sum() > 0

  logits = np.asarray(parts.model(batch.tokens, jnp.broadcast_to(
      jnp.arange(batch.tokens.shape[1]), batch.tokens.shape)), np.float64)
  tok = np.asarray(batch.tokens)

  def logp(temp):   # log p(token t | tokens < t), aligned with the tokens
    z = logits[:, :-1] / temp
    z = z - np.logaddexp.reduce(z, axis=-1, keepdims=True)
    return np.take_along_axis(z, tok[:, 1:, None], axis=-1)[..., 0]

  old = np.asarray(batch.old_logp)[:, 1:]
  m = mask[:, 1:]
  np.testing.assert_allclose(old[m], logp(T)[m], atol=2e-4)        # the sampler's
  assert np.abs(old[m] - logp(1.0)[m]).max() > 1e-2                 # not the temperature-1 one

  arrays = {"tokens": batch.tokens}
  graphdef, params = nnx.split(parts.model)
  new, _ = parts.train_step._logprobs(nnx.to_pure_dict(params), arrays, False)
  np.testing.assert_allclose(np.asarray(new)[:, 1:][m], logp(T)[m], atol=2e-4)   # the learner's

  _, _, metrics, _ = train.rl_step(parts, state, state.params, cache, 0, 0)
  assert 0.0 <= metrics["learner/ratio_dev"] < 1e-3    # float32 KV: the two sides agree
