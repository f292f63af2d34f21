"""Tool-call demos: the noiseless expert answers every question, search replies retrieve the
needed facts hop by hop, replies parse to the intended search/answer, the loss mask is exact."""

import jax
import numpy as np
import pytest

from tree_rl import envs, warmstart
from tree_rl.envs import toolcall as tc
from tree_rl.envs.toolcall import reference as ref

GEN_PROMPT = "<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def env(tok):
  return envs.make("toolcall", tokenizer=tok, split="test", max_calls=4, max_turns=6)


def _np(demos):
  return jax.tree.map(np.asarray, demos)


def _parse_rows(env, gen, rows):
  acts = jax.jit(jax.vmap(env.parse_action))(gen.table.tokens[rows], gen.table.lengths[rows])
  return jax.tree.map(np.asarray, acts)


def test_noiseless_expert_answers_every_question(tok, env):
  expert = warmstart.make_expert("toolcall", env, 0.0)
  gen = warmstart.DemoGenerator(env, tok, expert, max_len=1024)
  d = _np(gen(jax.random.key(0), 128))
  assert d.success.all() and np.allclose(d.reward, 1.0) and not d.truncated.any()
  qs = env.questions
  for i in range(128):
    text = tok.decode(d.tokens[i, :d.length[i]])
    q = next(q for q in qs if f"Question: {q.text}\n" in text)
    rows = [r for r in d.rows[i] if r >= 0]
    # hop by hop: the i-th search is the query for the i-th needed fact, then the answer
    assert [expert.reply_texts[r] for r in rows] == (
        [f"<search>{x}</search>" for x in q.queries] + [f"<answer>{q.answer}</answer>"])
    for k, fact in enumerate(q.needed):     # each search showed the fact it was after
      after = text.split(GEN_PROMPT)[k + 1]
      assert env.kb.facts[fact] in after
    replies = "".join(gen.reply_text(r) for r in rows)
    assert tok.decode(d.tokens[i][d.loss_mask[i] > 0]) == replies
    for piece, r in zip(text.split(GEN_PROMPT)[1:], rows):
      assert piece.startswith(gen.reply_text(r))


def test_replies_parse_to_intended_actions(tok, env):
  expert = warmstart.make_expert("toolcall", env, 0.0)
  gen = warmstart.DemoGenerator(env, tok, expert, max_len=16)
  rows = np.arange(len(expert.reply_texts))
  acts = _parse_rows(env, gen, rows)
  for r in rows:
    text = expert.reply_texts[r]
    kind, content = ref.parse_reply_bytes(text.encode())
    assert acts.kind[r] == kind == (tc.KIND_SEARCH if text.startswith("<search>") else tc.KIND_ANSWER)
    assert bytes(acts.text[r, :acts.text_len[r]].astype(np.uint8)) == content
    assert content.decode() == text.split(">", 1)[1].rsplit("<", 1)[0]


def test_noisy_expert_distractors_and_mask(tok, env):
  expert = warmstart.make_expert("toolcall", env, 0.3)
  gen = warmstart.DemoGenerator(env, tok, expert, max_len=1024, loss_on_noise=True)
  d = _np(gen(jax.random.key(1), 96))
  assert d.noisy.any() and 0 < d.success.mean() < 1
  assert np.array_equal(d.noisy, (d.rows != d.intended) & (d.rows >= 0))
  texts = expert.reply_texts
  for i in range(96):
    rows = [r for r in d.rows[i] if r >= 0]
    # loss_on_noise=True: every reply is trained, distractors included
    assert tok.decode(d.tokens[i][d.loss_mask[i] > 0]) == "".join(gen.reply_text(r) for r in rows)
    for r, want, nz in zip(d.rows[i], d.intended[i], d.noisy[i]):
      if nz:   # a distractor has the kind of the intended reply but other content
        assert texts[r][:8] == texts[want][:8] and texts[r] != texts[want]


def test_a_turn_weight_needs_an_expert_that_knows_hard_turns(tok, env):
  """The tool-call expert has no `hard(state)`: warmstart.hard_turn_weight != 1 is refused in one
  line before any demo is generated."""
  from flax import nnx

  from tree_rl import config as config_lib
  from tree_rl.models import Transformer
  from tree_rl.models.config import tiny
  c = config_lib.base_config()
  c.warmstart.hard_turn_weight = 2.0
  model = Transformer(tiny(tok.vocab_size), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="warmstart.hard_turn_weight=2.0 needs an on-device expert "
                                       "with hard"):
    warmstart.warm_start(c.warmstart, model, tok, env, jax.random.key(0), env_name="toolcall")
  with pytest.raises(ValueError, match="hard_turn_weight=2.0 needs an on-device expert with hard"):
    warmstart.DemoGenerator(env, tok, warmstart.make_expert("toolcall", env, 0.0), max_len=64,
                            hard_turn_weight=2.0)
