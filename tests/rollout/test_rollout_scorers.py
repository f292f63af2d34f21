"""Process scorers: registry, random, heuristic, judge parsing, mixing and stage-aware prompts,
PRM serialisation and aggregation, and weights passed per call (never the weights built with)."""

import dataclasses
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import CAPACITY, moves_model, rollout_config  # noqa: E402

from tree_rl import envs, sampling  # noqa: E402
from tree_rl.config import base_config  # noqa: E402
from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, FrozenLake  # noqa: E402
from tree_rl.envs.toolcall import ToolCallEnv  # noqa: E402
from tree_rl.models.config import tiny  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.models.transformer import Transformer  # noqa: E402
from tree_rl.rollout import methods, scorers  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout  # noqa: E402

TOK = BuiltinTokenizer()


def cfg(**kw):
  c = base_config().scorer
  c.update(kw)
  return c


def batch(tokens, lengths, step_ends, num_steps, env_state=None, root=None, prompt_len=None):
  b = len(lengths)
  return scorers.ScoreInput(
      tokens=jnp.asarray(tokens, jnp.int32), lengths=jnp.asarray(lengths, jnp.int32),
      prompt_len=jnp.asarray(np.zeros(b) if prompt_len is None else prompt_len, jnp.int32),
      step_ends=jnp.asarray(step_ends, jnp.int32), num_steps=jnp.asarray(num_steps, jnp.int32),
      env_state=env_state, root_env_state=root, prompt_id=jnp.zeros((b,), jnp.int32),
      mask=jnp.ones((b,), bool))


def test_registry_custom_and_unknown():
  @scorers.register("length_fraction")
  def make(c, **_):
    return lambda weights, b, key: b.lengths / 10.0

  fn = scorers.build(cfg(name="length_fraction"))
  assert fn.weights_for(("policy weights",)) is None   # no model: no weights
  out = fn(None, batch(np.zeros((2, 4)), [3, 25], -np.ones((2, 1)), [0, 0]), jax.random.key(0))
  np.testing.assert_allclose(np.asarray(out), [0.3, 1.0])   # clipped to [0, 1]
  with pytest.raises(KeyError, match="length_fraction"):
    scorers.get("nope")
  assert {"heuristic", "judge", "prm", "random"} <= set(scorers.names())


def test_random_scorer_uniform_and_seeded():
  fn = scorers.build(cfg(name="random"))
  b = batch(np.zeros((4000, 2)), np.ones(4000), -np.ones((4000, 1)), np.zeros(4000))
  s1, s2 = fn(None, b, jax.random.key(1)), fn(None, b, jax.random.key(1))
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
  np.testing.assert_allclose(np.asarray(fn(None, b, None)), [0.0, 0.5, 5 / 6, 1.0, 0.0], atol=1e-6)


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

  def generate(weights, tokens, lengths, key):
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
  s = np.asarray(fn(None, b, jax.random.key(0)))
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
  with pytest.raises(ValueError, match="prm_aggregate"):
    scorers.aggregate_steps(steps, n, "median", 1.0)


def test_prm_serialises_question_and_separated_steps_and_reads_each_separator():
  model = policy(seed=3)
  c = base_config()
  c.scorer.name, c.scorer.prm_aggregate = "prm", "mean"
  c.scorer.prm_template, c.scorer.prm_step_separator = "Q: {question}\nA: {steps}", "<s>"
  fn = scorers.from_config(c, tokenizer=TOK, policy_model=model)
  q, s1, s2 = TOK.encode("Map P_G"), TOK.encode("Right"), TOK.encode("Down Left")
  row0 = q + s1 + s2
  row1 = q + s1
  toks = np.zeros((2, len(row0)), np.int32)
  toks[0], toks[1, :len(row1)] = row0, row1
  b = batch(toks, [len(row0), len(row1)],
            [[len(q + s1), len(row0)], [len(row1), -1]], [2, 1], prompt_len=[len(q)] * 2)
  # By hand: the serialised rows and the position of each separator's last token.
  pre, mid, sep = TOK.encode("Q: "), TOK.encode("\nA: "), TOK.encode("<s>")
  want0 = pre + q + mid + s1 + sep + s2 + sep
  want1 = pre + q + mid + s1 + sep
  reads0 = [len(pre + q + mid + s1 + sep) - 1, len(want0) - 1]
  reads1 = [len(want1) - 1]
  tokens, lengths, reads = scorers.prm_inputs(b, scorers.PrmFormat.from_config(c.scorer, TOK))
  assert np.asarray(lengths).tolist() == [len(want0), len(want1)]
  assert np.asarray(tokens[0, :len(want0)]).tolist() == want0
  assert np.asarray(tokens[1, :len(want1)]).tolist() == want1
  assert np.asarray(reads[0]).tolist() == reads0 and np.asarray(reads[1, :1]).tolist() == reads1
  # Scores: the model's own softmax at those positions of the hand-built rows, then the mean.
  good, bad = TOK.encode("+")[0], TOK.encode("-")[0]
  lp = jax.nn.log_softmax(model(jnp.asarray([want0, want1 + [0] * (len(want0) - len(want1))])))
  expect = [np.mean([jax.nn.sigmoid(lp[r, i, good] - lp[r, i, bad]) for i in at])
            for r, at in enumerate((reads0, reads1))]                # causal: the padding is unread
  got = fn(fn.weights_for(weights(model)), b, None)
  np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-5)


def test_prm_config_errors_name_the_field():
  c = base_config()
  c.scorer.name = "prm"
  for field, value in (("prm_template", "{steps} then {question}"), ("prm_aggregate", "median"),
                       ("prm_model", "mine")):
    bad = c.copy_and_resolve_references()
    bad.scorer[field] = value
    with pytest.raises(ValueError, match=f"config.scorer.{field}"):
      scorers.from_config(bad, tokenizer=TOK, policy_model=policy())


# ---------------------------------------------------------------------------------------------
# Weights are arguments: after a policy update, scorers that read the policy score with the new
# weights (equal to a scorer built fresh from them); a scorer with its own checkpoint does not move.

UNTIED = dataclasses.replace(tiny(TOK.vocab_size), tie_word_embeddings=False)
SEVEN, PLUS = TOK.encode("7")[0], TOK.encode("+")[0]


def policy(seed=0, dominant=None):
  """A random tiny model; with `dominant`, the same model after an update that makes that token
  the greedy next token everywhere (the final norm keeps one unit, large and positive in every
  embedding, and only `dominant`'s unembedding reads it)."""
  m = Transformer(UNTIED, rngs=nnx.Rngs(seed))
  if dominant is not None:
    m.embed[...] = m.embed[...].at[:, 0].set(100.0)
    m.final_norm.weight[...] = jnp.zeros_like(m.final_norm.weight[...]).at[0].set(1.0)
    m.lm_head[...] = jnp.zeros_like(m.lm_head[...]).at[0, dominant].set(1.0)
  return m


def weights(model):
  """The weights a rollout cache bound to `model` holds (what the driver passes)."""
  return sampling.init_cache(model, max_seqs=1, num_pages=1, max_pages_per_seq=1).params


def trajectories():
  toks = np.array([TOK.encode("Map P_G Right Down"), TOK.encode("Map P_G Left Left")])
  n = toks.shape[1]
  return batch(toks, [n, n], [[n - 2, n]] * 2, [2, 2], prompt_len=[n - 4] * 2)


def model_scorer(name, policy_model, own=None, **fields):
  c = base_config()
  c.scorer.name = name
  c.scorer.update(fields)
  return scorers.from_config(c, tokenizer=TOK, policy_model=policy_model, judge_model=own,
                             prm_model=own, max_batch=2)


@pytest.mark.parametrize("name, dominant, fields, updated", [
    ("judge", SEVEN, dict(judge_lambda=1.0, judge_max_tokens=1, judge_context_tokens=12), 0.7),
    ("prm", PLUS, dict(prm_aggregate="last"), 1.0)])
def test_model_scorers_follow_the_policy_and_own_checkpoints_stay_fixed(name, dominant, fields,
                                                                         updated):
  before, after = policy(), policy(dominant=dominant)
  w_before, w_after = weights(before), weights(after)
  b, key = trajectories(), jax.random.key(0)
  own_field = {"judge": "judge_model", "prm": "prm_model"}[name]
  live = model_scorer(name, before, **fields)                    # built before the update
  fixed = model_scorer(name, before, own=before, **fields, **{own_field: "hf"})
  assert live.weights_from == "policy" and fixed.weights_from == "own"
  s_before = np.asarray(live(live.weights_for(w_before), b, key))
  s_after = np.asarray(live(live.weights_for(w_after), b, key))
  fresh = model_scorer(name, after, **fields)                    # built from the new weights
  np.testing.assert_allclose(s_after, np.asarray(fresh(fresh.weights_for(w_after), b, key)))
  np.testing.assert_allclose(s_after, [updated, updated], atol=1e-4)   # by hand: "7" -> 0.7; P(+) -> 1
  assert np.abs(s_after - s_before).max() > 0.1
  for w in (w_before, w_after):                                  # the checkpoint judge never moves
    np.testing.assert_allclose(np.asarray(fixed(fixed.weights_for(w), b, key)), s_before)


def test_model_scorer_refuses_weights_of_another_architecture():
  prm = model_scorer("prm", policy())
  other = Transformer(tiny(TOK.vocab_size), rngs=nnx.Rngs(0))   # tied head: other arrays
  with pytest.raises(ValueError, match="do not fit"):
    prm(weights(other), trajectories(), None)


def test_rollout_scores_with_the_weights_its_cache_is_bound_to():
  """driver.run scores with `cache.params`: a PRM built from the first policy scores a rollout
  of the updated cache exactly as a PRM built from the updated policy."""
  env = FrozenLake("rllm", tokenizer=TOK, min_size=4, max_size=4, max_reply_tokens=6)
  first, updated = moves_model(TOK), moves_model(TOK, seed=5)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  row_buckets="full")
  states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(3), 2))
  c = rollout_config()
  method = methods.get("patr")(c.rollout)
  prm = model_scorer("prm", first)                               # as build_parts: once, at start
  cache = new_cache(first, [(engine, Layout(2, CAPACITY, 4, 2))], num_pages=200, page_size=16,
                    kv_dtype="float32")
  cache = sampling.reset(cache, updated)                         # as the loop after an update
  out, _ = run(engine, method, cache, states, jax.random.key(1), scorer=prm, capacity=CAPACITY)
  t = jax.device_get(out.tree)
  scored = t.used & (t.depth > 0) & np.isfinite(t.score)
  assert scored.sum() >= 2
  nodes = jnp.asarray(np.where(scored, np.arange(t.used.shape[1]), -1))
  inp = scorers.score_input(out.tree, nodes, engine.max_context(), engine.max_turns)
  fresh = model_scorer("prm", updated)
  want = np.asarray(fresh(weights(updated), inp, None)).reshape(scored.shape)[scored]
  old = np.asarray(prm(weights(first), inp, None)).reshape(scored.shape)[scored]   # stale weights
  np.testing.assert_allclose(t.score[scored], want, rtol=1e-5, atol=1e-6)
  assert np.abs(want - old).max() > 1e-3                         # the old capture would differ


# ---------------------------------------------------------------------------------------------
# judge: stage-aware templates per env


def test_env_judge_templates_differ_and_name_their_stages():
  lake, tool = envs.entry("frozenlake").part("judge"), envs.entry("toolcall").part("judge")
  code = envs.entry("codefix").part("judge")
  assert lake.stages == ("plan", "move") and tool.stages == ("search", "answer")
  assert code.stages == ("diagnose", "edit", "verify")
  assert len({lake.text, tool.text, code.text}) == 3
  for t in (lake, tool, code):
    assert "{stage}" in t.text and "{trajectory}" in t.text
    assert all(f"{s} (" in t.text for s in t.stages)            # each stage is explained


def judge_prompts(env, states, template=""):
  """The prompts the judge writes for `states` (stacked), read from a recording generator."""
  seen = []

  def generate(weights, tokens, lengths, key):
    seen.extend(TOK.decode(np.asarray(tokens[i, :lengths[i]])) for i in range(tokens.shape[0]))
    return jnp.zeros((tokens.shape[0], 1), jnp.int32), jnp.zeros((tokens.shape[0],), jnp.int32)

  generate.host = True
  fn = scorers.build(cfg(name="judge", judge_lambda=1.0, judge_template=template), tokenizer=TOK,
                     generate=generate, env=env, env_params=env.default_params)
  n = jax.tree.leaves(states)[0].shape[0]
  fn(None, batch(np.ones((n, 3)), [3] * n, [[3]] * n, [1] * n, states, states), jax.random.key(0))
  return seen


def test_judge_fills_in_the_stage_of_each_trajectory():
  lake = FrozenLake("rllm", max_size=4, tokenizer=TOK)
  start = lake.init_state(jnp.full((4, 4), FROZEN).at[3, 3].set(GOAL), 4, 4, jnp.array([0, 0]))
  moved = start.replace(steps=jnp.int32(2), pos=jnp.array([1, 1]))
  stack = lambda *xs: jax.tree.map(lambda *x: jnp.stack(x), *xs)  # noqa: E731
  got = judge_prompts(lake, stack(start, moved))
  assert ["Stage: plan" in p for p in got] == [True, False]
  assert ["Stage: move" in p for p in got] == [False, True]
  assert got[0].startswith("<|im_start|>system\nYou judge an agent walking on a FrozenLake")
  tool = ToolCallEnv(tokenizer=TOK, max_reply_tokens=6, max_calls=2)
  q = tool.init_state(jnp.int32(0))
  states = stack(q, q.replace(calls=jnp.int32(1)), q.replace(calls=jnp.int32(2)),
                 q.replace(calls=jnp.int32(1), answered=jnp.bool_(True)))
  got = judge_prompts(tool, states)
  assert [p.split("Stage: ")[1].split("\n")[0] for p in got] == ["search", "search", "answer", "answer"]
  # codefix: the stage comes from the host env's info scalars (0-1 diagnose, 2 edit, 3 verify)
  from tree_rl.envs.codefix.env import CodeFix
  code = CodeFix(TOK, [])
  st = code.initial_states(np.zeros(4, np.int32))
  st = st.replace(info=st.info.at[:, code.info_fields.index("stage")].set(jnp.arange(4.0)))
  got = judge_prompts(code, st)
  assert [p.split("Stage: ")[1].split("\n")[0] for p in got] == ["diagnose", "diagnose", "edit", "verify"]
  assert got[0].startswith("<|im_start|>system\nYou judge an agent repairing a bug")
  # config.scorer.judge_template overrides the text; a {stage} slot still takes the env's stages
  got = judge_prompts(lake, stack(start, moved), template="[{stage}] {trajectory} ->")
  assert [p.split("]")[0] for p in got] == ["[plan", "[move"]


def test_stage_slot_needs_an_env_with_stages():
  class Env:
    name = "stageless"
    default_params = None

  envs.register("stageless", Env, overwrite=True)
  with pytest.raises(ValueError, match="config.scorer.judge_template"):
    scorers.judge_prompt(cfg(judge_template="{stage}: {trajectory}"), Env(), TOK)
  assert scorers.judge_prompt(cfg(), Env(), TOK).template is None   # built-in, stage-less
