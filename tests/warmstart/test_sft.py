"""SFT step and warm_start: the masked loss, trace once, early stop, disabled, bad config."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tree_rl import warmstart

from warmstart_helpers import _config, _model


def test_sft_step_traces_once(tok, small_env):
  w = _config(max_len=136, batch_size=4, steps=3, warmup_steps=0).warmstart
  gen = warmstart.DemoGenerator(small_env, tok, warmstart.make_expert("frozenlake", small_env, 0.3),
                                max_len=w.max_len)
  demos = gen(jax.random.key(2), 8)
  trainer = warmstart.SFTTrainer(_model(tok), w)
  trainer.step_fn = jax.jit(chex.assert_max_traces(trainer._step, n=1), donate_argnums=(0, 1))
  before = jax.tree.map(np.asarray, trainer.params)
  for s in range(3):
    loss = trainer.step(warmstart.one_per_row(demos), jnp.arange(4) + s)
    assert np.isfinite(float(loss))
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, trainer.params)
  assert all(jax.tree.leaves(changed))


def test_sft_loss_is_masked_mean_nll(tok):
  """sft_loss == hand computation from the model's logits on the masked positions."""
  model = _model(tok, seed=3)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, tok.vocab_size, (2, 12)), jnp.int32)
  mask = jnp.zeros((2, 12)).at[0, 3:5].set(1.0).at[1, 9].set(1.0)
  loss, n = warmstart.sft_loss(model, warmstart.SFTRows(tokens, mask), attention="einsum")
  logp = jax.nn.log_softmax(model(tokens), -1)
  want = -(logp[0, 2, tokens[0, 3]] + logp[0, 3, tokens[0, 4]] + logp[1, 8, tokens[1, 9]]) / 3
  assert float(n) == 3 and float(loss) == pytest.approx(float(want), rel=1e-5)
  # weights (warmstart.hard_turn_weight): a weighted mean, the weights' sum beside it
  loss, n = warmstart.sft_loss(model, warmstart.SFTRows(tokens, mask.at[1, 9].set(3.0)),
                               attention="einsum")
  want = -(logp[0, 2, tokens[0, 3]] + logp[0, 3, tokens[0, 4]] + 3 * logp[1, 8, tokens[1, 9]]) / 5
  assert float(n) == 5 and float(loss) == pytest.approx(float(want), rel=1e-5)


def test_warm_start_early_stop_and_api(tok, small_env):
  c = _config(num_demos=8, max_len=136, steps=6, batch_size=4, eval_every=2, target_success=0.5)
  c.unlock()
  c.env.name = "frozenlake"
  model = _model(tok)
  original = jax.tree.map(np.asarray, nnx.state(model, nnx.Param))
  seen = []

  def evaluate(params):
    seen.append(params)
    return [0.0, 0.75, 1.0][len(seen) - 1]

  params, stats = warmstart.warm_start(c.warmstart, model, tok, small_env, jax.random.key(0),
      env_name="frozenlake", evaluate=evaluate)
  assert stats["steps"] == 4 and stats["stopped_early"] and stats["evals"] == [(2, 0.0), (4, 0.75)]
  assert len(stats["loss"]) == 4 and all(np.isfinite(stats["loss"]))
  assert stats["demo_success"] > 0.5 and 0 < stats["demo_tokens"] <= 136
  assert isinstance(params, nnx.State)
  # params handed to evaluate stay valid after later (donating) steps, and differ from the end
  assert not np.array_equal(np.asarray(seen[0]["embed"][...]), np.asarray(params["embed"][...]))
  assert jax.tree.structure(params) == jax.tree.structure(nnx.state(model, nnx.Param))
  # the model is untouched; the returned params load into it
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, original,
                                          jax.tree.map(np.asarray, nnx.state(model, nnx.Param)))))
  nnx.update(model, params)
  assert not np.array_equal(np.asarray(model.embed[...]), original["embed"])

  c.warmstart.enabled = False
  params, stats = warmstart.warm_start(c.warmstart, model, tok, small_env, jax.random.key(0),
      env_name="frozenlake")
  assert stats["steps"] == 0


@pytest.mark.parametrize("field,value", [("steps", 0), ("batch_size", 0), ("epsilon", 1.5),
                                         ("learning_rate", 0.0), ("attention", "flash"),
                                         ("hard_fraction", 1.5), ("stop_window", 0),
                                         ("hard_turn_weight", 0.0), ("hard_turn_weight", float("inf"))])
def test_bad_config_names_the_field(tok, small_env, field, value):
  c = _config(**{field: value})
  with pytest.raises(ValueError, match=f"warmstart.{field}"):
    warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake")


def test_warm_start_keeps_the_best_check_when_the_target_is_missed(tok, small_env):
  """No check meets the target: the params evaluated best come back (the latest of a tie), not
  the last step's."""
  c = _config(num_demos=8, max_len=136, steps=8, batch_size=4, eval_every=2, target_success=0.9)
  c.unlock()
  c.env.name = "frozenlake"
  seen = []

  def evaluate(params):
    seen.append(jax.tree.map(np.array, params))
    return [0.5, 0.25, 0.5, 0.4][len(seen) - 1]   # best at steps 2 and 6: step 6's come back

  params, stats = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake",
                                       evaluate=evaluate)
  assert stats["steps"] == 8 and not stats["stopped_early"] and stats["returned_step"] == 6
  same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), seen[2], params)
  assert all(jax.tree.leaves(same))
  for other in (seen[0], seen[3]):
    assert not np.array_equal(np.asarray(other["embed"][...]), np.asarray(params["embed"][...]))


def test_stop_window_does_not_stop_on_one_lucky_check(tok, small_env):
  """stop_window=2: a single check above the target (step 2) does not stop the SFT; the first
  pair of checks whose mean meets it (steps 6 and 8: 0.85, 0.8) does, and the best check so far
  (step 6) comes back, not step 2's lucky one tied below it."""
  c = _config(num_demos=8, max_len=136, steps=12, batch_size=4, eval_every=2, target_success=0.8,
              stop_window=2)
  c.unlock()
  c.env.name = "frozenlake"
  seen = []

  def evaluate(params):
    seen.append(jax.tree.map(np.array, params))
    return [0.85, 0.5, 0.85, 0.8, 0.9, 0.9][len(seen) - 1]

  params, stats = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake",
                                       evaluate=evaluate)
  assert stats["stopped_early"] and stats["steps"] == 8 and len(seen) == 4
  assert stats["returned_step"] == 6
  same = jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)), seen[2], params)
  assert all(jax.tree.leaves(same))


def test_an_attempt_that_misses_the_target_is_redone_from_a_fresh_init(tok, small_env):
  """attempts=3: the first attempt misses the target and the second, from fresh_model(1), meets
  it: the second's check params come back, no third attempt starts, and the first attempt is
  the single-attempt warm start exactly (same checks' params)."""
  c = _config(num_demos=8, max_len=136, steps=4, batch_size=4, eval_every=2, target_success=0.9,
              attempts=3)
  c.unlock()
  c.env.name = "frozenlake"
  scores = iter([0.5, 0.6, 0.3, 0.95])
  seen, built = [], []

  def evaluate(params):
    seen.append(jax.tree.map(np.array, params))
    return next(scores)

  def fresh_model(attempt):
    built.append(attempt)
    return _model(tok, seed=10 + attempt)

  params, stats = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake",
                                       evaluate=evaluate, fresh_model=fresh_model)
  assert built == [1] and stats["attempt"] == 1 and stats["stopped_early"]
  assert stats["attempt_evals"] == [[(2, 0.5), (4, 0.6)], [(2, 0.3), (4, 0.95)]]
  assert stats["evals"] == [(2, 0.3), (4, 0.95)] and stats["returned_step"] == 4
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)),
                                          seen[3], params)))
  # the second attempt started from the fresh init: its first check is not the first attempt's
  assert not np.array_equal(np.asarray(seen[0]["embed"][...]), np.asarray(seen[2]["embed"][...]))

  c.warmstart.attempts = 1
  single = []
  _, one = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake",
                                evaluate=lambda p: single.append(jax.tree.map(np.array, p)) or 0.5)
  assert one["attempt"] == 0 and one["attempt_evals"] == [[(2, 0.5), (4, 0.5)]]
  for a, b in zip(single, seen[:2]):
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))


def test_when_no_attempt_meets_the_target_the_best_check_of_all_comes_back(tok, small_env):
  c = _config(num_demos=8, max_len=136, steps=4, batch_size=4, eval_every=2, target_success=0.9,
              attempts=2)
  c.unlock()
  c.env.name = "frozenlake"
  scores = iter([0.7, 0.5, 0.6, 0.4])
  seen = []

  def evaluate(params):
    seen.append(jax.tree.map(np.array, params))
    return next(scores)

  params, stats = warmstart.warm_start(c.warmstart, _model(tok), tok, small_env, jax.random.key(0),
      env_name="frozenlake",
                                       evaluate=evaluate)   # no fresh_model: same init, new order
  assert stats["attempt"] == 0 and not stats["stopped_early"] and stats["returned_step"] == 2
  assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, np.asarray(b)),
                                          seen[0], params)))
  assert not np.array_equal(np.asarray(seen[0]["embed"][...]), np.asarray(seen[2]["embed"][...]))


@pytest.mark.parametrize("overrides,match", [
    (dict(attempts=0), "warmstart.attempts must be >= 1"),
    (dict(attempts=2, target_success=1.0), "warmstart.attempts=2 needs checks with a target")])
def test_bad_attempts_are_refused(tok, small_env, overrides, match):
  with pytest.raises(ValueError, match=match):
    warmstart.warm_start(_config(**overrides).warmstart, _model(tok), tok, small_env,
                         jax.random.key(0), env_name="frozenlake")
