"""Tool-call env: scripted agents, rewards, format penalty, tool-call limit, device == host."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl import envs
from tree_rl.envs import text as tx
from tree_rl.envs import toolcall as tc
from tree_rl.envs.toolcall import reference as ref

KEY = jax.random.key(0)


def _encode(tok, texts, cap):
  ids = np.zeros((len(texts), cap), np.int32)
  lens = np.zeros((len(texts),), np.int32)
  for i, t in enumerate(texts):
    e = tok.encode(t)[:cap]
    ids[i, :len(e)], lens[i] = e, len(e)
  return ids, lens


@pytest.fixture(scope="module")
def env(builtin_tok):
  return envs.make("toolcall", tokenizer=builtin_tok, split="test", max_calls=3)


@pytest.fixture(scope="module")
def fns(env):
  return dict(parse=jax.jit(jax.vmap(env.parse_action)),
              step=jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None))),
              obs=jax.jit(jax.vmap(env.observation_tokens, in_axes=(0, None, None))),
              progress=jax.jit(jax.vmap(env.retrieval_progress)))


def _turn(env, fns, states, replies, closed=True):
  ids, lens = _encode(env.tokenizer, replies, env.max_reply_tokens)
  acts = fns["parse"](ids, lens)
  n = len(replies)
  states, _, reward, done, info = fns["step"](jax.random.split(KEY, n), states, acts, env.default_params)
  toks, tl = fns["obs"](states, closed, env.default_params)
  texts = [env.tokenizer.decode(np.asarray(toks[i, :tl[i]])) for i in range(n)]
  return states, np.asarray(reward), np.asarray(done), jax.tree.map(np.asarray, info), texts


def test_scripted_agent_solves_every_test_question(env, fns):
  qs = env.questions
  n = len(qs)
  assert n == 100 and {q.hops for q in qs} == {1, 2, 3}
  states = jax.vmap(env.init_state)(jnp.arange(n))
  for hop in range(3):
    replies = [f"I will look it up. <search>{q.queries[hop]}</search>" if hop < q.hops
               else f"<answer>{q.answer}</answer>" for q in qs]
    states, reward, done, info, texts = _turn(env, fns, states, replies)
    for i, q in enumerate(qs):
      if hop < q.hops:   # the fact this hop needs is among the retrieved ones
        assert env.kb.facts[q.needed[hop]] + "\n" in texts[i], (q, texts[i])
        assert not done[i] and reward[i] == 0
  progress = np.asarray(fns["progress"](states))
  assert np.all(progress[~np.asarray(states.done)] == 1.0)
  replies = [f"<answer>{q.answer}</answer>" for q in qs]
  states, reward, done, info, _ = _turn(env, fns, states, replies)
  # every episode ended with reward 1: on this turn or on the 3rd turn (one-hop / two-hop answered earlier)
  assert np.all(np.asarray(states.correct)) and np.all(np.asarray(states.done))
  assert np.all(np.asarray(states.calls) == np.array([q.hops for q in qs]))


def test_wrong_answers_score_zero_and_f1_matches_host(env, fns):
  qs = env.questions
  n = len(qs)
  states = jax.vmap(env.init_state)(jnp.arange(n))
  rng = np.random.default_rng(0)
  preds = []
  for q in qs:
    other = qs[rng.integers(0, n)].answer
    preds.append(rng.choice([other, q.answer.split()[0], q.answer.upper() + " x", q.answer + " " + other,
                             " " + q.answer.lower() + "! ", ""]))
  states, reward, done, info, _ = _turn(env, fns, states, [f"<answer>{p}</answer>" for p in preds])
  for i, q in enumerate(qs):
    em, f1 = ref.host_em_f1(preds[i].encode(), q.answer, env.max_words)
    assert reward[i] == float(em) and bool(info["em"][i]) == em
    assert info["f1"][i] == pytest.approx(f1, abs=1e-6)
    assert done[i]
  assert 0 < reward.sum() < n and np.any((info["f1"] > 0) & (reward == 0))


def test_malformed_gets_penalty_and_limit_holds(env, fns):
  bad = ["Shen", "<answer>Shen", "<search>Tail founded", "<answer>Shen</answ>", "</search>x<search>",
         "<Search>x</Search>", ""]
  n = len(bad)
  states = jax.vmap(env.init_state)(jnp.zeros((n,), jnp.int32))
  states, reward, done, info, texts = _turn(env, fns, states, bad)
  assert np.allclose(reward, -0.1) and np.all(info["invalid"]) and not done.any()
  assert all("Invalid format." in t for t in texts)
  # the tool-call limit (3 here): a 4th and 5th search are refused and not counted
  states = jax.vmap(env.init_state)(jnp.zeros((2,), jnp.int32))
  for t in range(5):
    states, reward, done, info, texts = _turn(env, fns, states, ["<search>Tail founded</search>"] * 2)
    assert np.all(np.asarray(states.calls) == min(t + 1, 3))
    assert ("No tool calls left." in texts[0]) == (t >= 3)
  assert not done.any()
  states, reward, done, info, texts = _turn(env, fns, states, ["<search>Tail founded</search>"] * 2)
  assert np.all(done) and np.all(np.asarray(states.turns) == 6)   # max_turns ends the episode


REPLIES = ["<search>Tail founded</search>", "<answer>Shen</answer>", "<search>a</search><answer>b</answer>",
           "<answer>b</answer><search>a</search>", "<search>x<answer>Shen</answer>", "<answer><search>q</search>",
           "<search></search>", "<SEARCH>Tail</SEARCH>", "<search>Tail  founded!!</search>", "<answer>Tail",
           "<search>capital of what country?</search>", "think <search>Kor's city</search> more</search>",
           "<answer>\u00e9t\u00e9 caf\u00e9</answer>", "<search>" + "word " * 30 + "</search>"]
PIECES = ["<search>", "</search>", "<answer>", "</answer>", "<search", "</answ", "Tail", " founded", " born",
          "Shen", " ", "\n", "?", "'s", "Raix", " Saisi", "capital", "x", "<|im_end|>", "\u00e9", "9"]


@pytest.mark.parametrize("tok_name", ["builtin_tok", "hf_tok"])
def test_parse_device_equals_host(tok_name, request):
  tok = request.getfixturevalue(tok_name)
  env = tc.ToolCallEnv(tok, split="test", max_reply_tokens=48, max_reply_bytes=120, max_text_bytes=40)
  rng = np.random.default_rng(1)
  texts = REPLIES + ["".join(rng.choice(PIECES, size=rng.integers(0, 14))) for _ in range(300)]
  ids, lens = _encode(tok, texts, env.max_reply_tokens)
  # plus replies of random ids, byte tokens included: invalid UTF-8 that decode() would replace
  tags = np.array([tok.encode(p)[0] for p in ("<search>", "</search>", "<answer>", "</answer>")])
  noise = rng.integers(0, tok.vocab_size, size=(300, env.max_reply_tokens)).astype(np.int32)
  noise = np.where(rng.random(noise.shape) < 0.15, rng.choice(tags, size=noise.shape), noise)
  n_text = len(texts)
  ids = np.concatenate([ids, noise])
  lens = np.concatenate([lens, rng.integers(0, env.max_reply_tokens + 1, size=300).astype(np.int32)])
  texts = texts + [f"random ids {i}" for i in range(300)]
  acts = jax.tree.map(np.asarray, jax.jit(jax.vmap(env.parse_action))(ids, lens))
  kinds, invalid_utf8 = set(), 0
  for i in range(len(texts)):
    raw = tx.host_reply_bytes(tok, ids[i, :lens[i]])
    if i < n_text:   # replies of real text: the raw bytes are what decode() gives
      assert raw == tok.decode(ids[i, :lens[i]]).encode("utf-8"), texts[i]
    try:
      raw.decode("utf-8")
    except UnicodeDecodeError:
      invalid_utf8 += 1
    kind, content = ref.parse_reply_bytes(raw[:env.reply_byte_capacity(ids.shape[1])])
    kinds.add(kind)
    assert acts.kind[i] == kind, texts[i]
    words = tc.host_words(content, env.max_words)
    assert acts.n_words[i] == len(words), texts[i]
    assert [tuple(h) for h in acts.words[i, :len(words)]] == [tx.host_word_hash(w) for w in words]
    assert np.all(acts.words[i, len(words):] == 0)
    assert bytes(acts.text[i, :acts.text_len[i]].astype(np.uint8)) == content[:env.max_text_bytes]
  assert kinds == {0, 1, 2}
  assert invalid_utf8 > 0   # the random replies did exercise bytes that are not valid UTF-8


def test_bm25_matches_host(env):
  rng = np.random.default_rng(3)
  vocab = sorted({w.decode() for f in env.kb.facts for w in tc.host_words(f.encode(), 99)})
  queries = [" ".join(rng.choice(vocab, size=rng.integers(1, 5))) + rng.choice(["", " zzz", "?"])
             for _ in range(40)]
  ids, lens = _encode(env.tokenizer, [f"<search>{q}</search>" for q in queries], env.max_reply_tokens)
  acts = jax.jit(jax.vmap(env.parse_action))(ids, lens)
  scores = np.asarray(jax.jit(jax.vmap(env.bm25))(acts.words, acts.n_words))
  for i, q in enumerate(queries):
    want = ref.host_bm25(list(env.kb.facts), q.encode(), env.max_words)
    np.testing.assert_allclose(scores[i], want, rtol=1e-5, atol=1e-5)


def test_render_device_equals_host(env, fns, hf_tok):
  for e in (env, tc.ToolCallEnv(hf_tok, split="test", max_calls=3)):
    f = fns if e is env else dict(parse=jax.jit(jax.vmap(e.parse_action)),
                                  step=jax.jit(jax.vmap(e.step, in_axes=(0, 0, 0, None))),
                                  obs=jax.jit(jax.vmap(e.observation_tokens, in_axes=(0, None, None))))
    n = 12
    states = jax.vmap(e.init_state)(jnp.arange(n))
    toks, tl = jax.jit(jax.vmap(e.initial_prompt_tokens, in_axes=(0, None)))(states, e.default_params)
    for i in range(n):
      want = ref.initial_prompt_text(e, jax.tree.map(lambda x: x[i], states))
      assert e.tokenizer.decode(np.asarray(toks[i, :tl[i]])) == want
      assert list(np.asarray(toks[i, :tl[i]])) == e.tokenizer.encode(want)
    rng = np.random.default_rng(4)
    choices = ["<search>{q}</search>", "<search>zzz</search>", "oops", "<answer>{a}</answer>"]
    statuses = set()
    for t in range(4):
      replies = [rng.choice(choices).format(q=e.questions[i].queries[0], a=e.questions[i].answer)
                 for i in range(n)]
      ids, lens = _encode(e.tokenizer, replies, e.max_reply_tokens)
      states, *_ = f["step"](jax.random.split(KEY, n), states, f["parse"](ids, lens), e.default_params)
      closed = t % 2 == 0
      toks, tl = f["obs"](states, closed, e.default_params)
      for i in range(n):
        s = jax.tree.map(lambda x: x[i], states)
        statuses.add(int(s.status))
        want = ref.observation_text(e, s, closed)
        got = list(np.asarray(toks[i, :tl[i]]))
        assert e.tokenizer.decode(got) == want
        assert got == e.tokenizer.encode(want)
    assert {tc.ST_SEARCH, tc.ST_INVALID, tc.ST_ANSWERED, tc.ST_NO_RESULTS} <= statuses


def test_external_tool_through_io_callback(builtin_tok):
  calls = []

  def search(query):
    calls.append(query)
    return [f"Result about {query}.", "Another line."]

  tool = envs.ExternalTool(search, builtin_tok, capacity=40)
  e = tc.ToolCallEnv(builtin_tok, split="test", tool=tool)
  replies = ["<search>Tail founded</search>", "no tags", "<search>caf\u00e9 born</search>", "<answer>x</answer>"]
  ids, lens = _encode(builtin_tok, replies, e.max_reply_tokens)
  states = jax.vmap(e.init_state)(jnp.arange(4))
  acts = jax.jit(jax.vmap(e.parse_action))(ids, lens)
  states, _, reward, done, info = jax.jit(jax.vmap(e.step, in_axes=(0, 0, 0, None)))(
      jax.random.split(KEY, 4), states, acts, e.default_params)
  assert calls == ["Tail founded", "caf\u00e9 born"]   # only the envs that searched called the tool
  toks, tl = jax.jit(jax.vmap(e.observation_tokens, in_axes=(0, None, None)))(states, True, e.default_params)
  for i in range(4):
    s = jax.tree.map(lambda x: x[i], states)
    assert builtin_tok.decode(np.asarray(toks[i, :tl[i]])) == ref.observation_text(e, s, True)
  assert "Result about Tail founded." in builtin_tok.decode(np.asarray(toks[0, :tl[0]]))
  np.testing.assert_array_equal(np.asarray(states.calls), [1, 0, 1, 0])
  # unbatched under jit too
  one = jax.jit(e.step)(KEY, e.init_state(0), jax.tree.map(lambda x: x[0], acts), e.default_params)
  assert int(one[0].ext_len) > 0 and len(calls) == 3


def test_traces_once_and_batch_of_1024(env):
  n = 1024
  p = env.default_params
  reset = jax.jit(jax.vmap(chex.assert_max_traces(env.reset, n=1), in_axes=(0, None)))
  parse = jax.jit(jax.vmap(chex.assert_max_traces(env.parse_action, n=1)))
  step = jax.jit(jax.vmap(chex.assert_max_traces(env.step, n=1), in_axes=(0, 0, 0, None)))
  obs = jax.jit(jax.vmap(chex.assert_max_traces(env.observation_tokens, n=1), in_axes=(0, 0, None)))
  prompt = jax.jit(jax.vmap(chex.assert_max_traces(env.initial_prompt_tokens, n=1), in_axes=(0, None)))
  states, _ = reset(jax.random.split(KEY, n), p)
  prompt(states, p)
  texts = [f"<search>{q.queries[0]}</search>" for q in env.questions] * 11
  ids, lens = _encode(env.tokenizer, texts[:n], env.max_reply_tokens)
  for t in range(2):
    acts = parse(jnp.asarray(ids), jnp.asarray(lens))
    states, o, r, d, info = step(jax.random.split(jax.random.key(t), n), states, acts, p)
    toks, tl = obs(states, jnp.zeros((n,), bool), p)
  assert toks.shape == (n, env.obs_capacity) and np.all(np.asarray(states.calls) == 2)
  assert o.shape == (n, env.top_k)
