"""Process scorers: registry, random, heuristic, judge parsing and mixing, PRM aggregation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tree_rl import envs
from tree_rl.config import base_config
from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, FrozenLake
from tree_rl.models.config import tiny
from tree_rl.models.tokenizers import BuiltinTokenizer
from tree_rl.models.transformer import Transformer
from tree_rl.rollout import scorers

TOK = BuiltinTokenizer()


def cfg(**kw):
  c = base_config().scorer
  c.update(kw)
  return c


def batch(tokens, lengths, step_ends, num_steps, env_state=None, root=None):
  b = len(lengths)
  return scorers.ScoreInput(
      tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.asarray(lengths, jnp.int32),
      step_ends=jnp.asarray(step_ends, jnp.int32), num_steps=jnp.asarray(num_steps, jnp.int32),
      env_state=env_state, root_env_state=root, prompt_id=jnp.zeros((b,), jnp.int32),
      mask=jnp.ones((b,), bool))


def test_registry_custom_and_unknown():
  @scorers.register("length_fraction")
  def make(c, **_):
    return lambda b, key: b.lengths / 10.0

  fn = scorers.build(cfg(name="length_fraction"))
  out = fn(batch(np.zeros((2, 4)), [3, 25], -np.ones((2, 1)), [0, 0]), jax.random.key(0))
  np.testing.assert_allclose(np.asarray(out), [0.3, 1.0])   # clipped to [0, 1]
  with pytest.raises(KeyError, match="length_fraction"):
    scorers.get("nope")
  assert {"heuristic", "judge", "prm", "random"} <= set(scorers.names())


def test_random_scorer_uniform_and_seeded():
  fn = scorers.build(cfg(name="random"))
  b = batch(np.zeros((4000, 2)), np.ones(4000), -np.ones((4000, 1)), np.zeros(4000))
  s1, s2 = fn(b, jax.random.key(1)), fn(b, jax.random.key(1))
  np.testing.assert_array_equal(np.asarray(s1), np.asarray(s2))
  assert 0.0 <= float(s1.min()) and float(s1.max()) <= 1.0
  assert abs(float(s1.mean()) - 0.5) < 0.02


def test_frozenlake_heuristic_is_bfs_progress():
  env = FrozenLake("rllm", max_size=4)
  f, h, g = FROZEN, HOLE, GOAL
  tiles = jnp.array([[f, f, f, f], [f, h, h, f], [f, f, f, f], [f, f, f, g]])
  start = env.init_state(tiles, 4, 4, jnp.array([0, 0]))          # 6 moves from the goal
  states = [start.replace(pos=jnp.array(p)) for p in ([0, 0], [0, 3], [2, 3], [3, 3])]
  states[3] = states[3].replace(won=jnp.bool_(True), done=jnp.bool_(True))
  fell = start.replace(pos=jnp.array([1, 1]), fell=jnp.bool_(True), done=jnp.bool_(True))
  stack = jax.tree.map(lambda *x: jnp.stack(x), *(states + [fell]))
  roots = jax.tree.map(lambda *x: jnp.stack(x), *([start] * 5))
  fn = scorers.build(cfg(name="heuristic"), env=env)
  b = batch(np.zeros((5, 2)), np.ones(5), -np.ones((5, 1)), np.zeros(5), stack, roots)
  # BFS distances 6, 3, 1, 0 (won) and a hole.
  np.testing.assert_allclose(np.asarray(fn(b, None)), [0.0, 0.5, 5 / 6, 1.0, 0.0], atol=1e-6)


def test_parse_score_from_generated_tokens():
  numbers = jnp.asarray(scorers.number_table(TOK, TOK.vocab_size))
  enc = lambda s: TOK.encode(s)  # noqa: E731
  texts = ["Score: 7", "I think 10 points", "no number here", "3", "x 42 then 5"]
  rows = [enc(t) for t in texts]
  width = max(map(len, rows))
  toks = np.array([r + [0] * (width - len(r)) for r in rows])
  got = np.asarray(scorers.parse_score(jnp.asarray(toks), jnp.array([len(r) for r in rows]),
                                       numbers, 10.0))
  np.testing.assert_allclose(got[[0, 1, 3, 4]], [0.7, 1.0, 0.3, 4.2])
  assert np.isnan(got[2])
  # a number after the reply's length does not count
  cut = scorers.parse_score(jnp.asarray(toks[:1]), jnp.array([2]), numbers, 10.0)
  assert np.isnan(np.asarray(cut)[0])


def test_judge_builds_prompt_parses_and_mixes_with_heuristic():
  seen = {}

  def generate(tokens, lengths, key):
    seen["text"] = TOK.decode(np.asarray(tokens[0, :lengths[0]]))
    out = jnp.array([TOK.encode("8") + [3, 0, 0, 0], TOK.encode("oops") + [3]])
    return out, jnp.array([2, 5])

  generate.host = True   # like the sampler's generator: runs outside jit

  c = cfg(name="judge", judge_lambda=0.5, judge_context_tokens=4)

  def fake(env, params, state, root):
    return state * 0.1

  class Env:
    name = "fake"
    default_params = None

  envs.register("fake", Env, heuristic=fake, overwrite=True)

  fn = scorers.build(c, tokenizer=TOK, generate=generate, env=Env())
  toks = np.array([TOK.encode("ABCDEFGH"), TOK.encode("ABCDEFGH")])
  b = batch(toks, [8, 8], -np.ones((2, 1)), [1, 1], jnp.array([2.0, 6.0]), jnp.zeros(2))
  s = np.asarray(fn(b, jax.random.key(0)))
  # parsed 8/10 mixed half-half with 0.2; an unparsable reply falls back to the heuristic 0.6
  np.testing.assert_allclose(s, [0.5 * 0.8 + 0.5 * 0.2, 0.6], atol=1e-6)
  assert "EFGH" in seen["text"] and "ABCD" not in seen["text"] and seen["text"].endswith("assistant\n")


def test_prm_aggregations_against_hand_values():
  steps = jnp.array([[0.2, 0.9, 0.5, 0.0], [0.4, 0.0, 0.0, 0.0]])
  n = jnp.array([3, 1])
  agg = lambda how, d=0.5: np.asarray(scorers.aggregate_steps(steps, n, how, d))  # noqa: E731
  np.testing.assert_allclose(agg("last"), [0.5, 0.4])
  np.testing.assert_allclose(agg("mean"), [1.6 / 3, 0.4])
  np.testing.assert_allclose(agg("max"), [0.9, 0.4])
  np.testing.assert_allclose(agg("min"), [0.2, 0.4])
  np.testing.assert_allclose(agg("weighted"), [(0.25 * 0.2 + 0.5 * 0.9 + 0.5) / 1.75, 0.4],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="prm_aggregation"):
    scorers.aggregate_steps(steps, n, "median", 1.0)


def test_prm_token_probability_equals_model_softmax():
  model = Transformer(tiny(TOK.vocab_size), rngs=nnx.Rngs(0))
  c = base_config()
  c.scorer.name, c.scorer.prm_aggregation = "prm", "mean"
  fn = scorers.from_config(c, tokenizer=TOK, policy_model=model)
  toks = jnp.asarray([TOK.encode("Up Down Left Right")[:6] + [0, 0]])
  b = batch(toks, [6], [[3, 6]], [2])
  logits = model(toks)[0]
  good, bad = TOK.encode("+")[0], TOK.encode("-")[0]
  lp = jax.nn.log_softmax(logits)
  want = np.mean([jax.nn.sigmoid(lp[i, good] - lp[i, bad]) for i in (2, 5)])
  np.testing.assert_allclose(np.asarray(fn(b, None)), [want], rtol=1e-5)
