"""FrozenLake tokens on device agree with the host text renderer and parser."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.envs import frozenlake as fl
from tree_rl.envs.frozenlake import text as ft

FRAGMENTS = ["Up", "Down", "Left", "Right", "up", "LEFT", "down", " ", "\n", "  ", "<answer>", "</answer>",
             "<answer", "answer>", "</answ", "||", "|", " || ", "```", "Upward", "xUp", "I think ", "Right.",
             "<search>", "go", "Le", "ft", "Downhill", "<|im_end|>", "é", "Up|", ",", "Left||Up"]


def _random_replies(rng, n):
  """Half free-form fragment soup, half near-miss <answer> blocks (spacing, case, separators)."""
  def noise(k):
    return "".join(FRAGMENTS[i] for i in rng.integers(0, len(FRAGMENTS), size=k))
  out = []
  for j in range(n):
    if j % 4 == 0:
      out.append(noise(rng.integers(0, 12)))
      continue
    if j % 4 == 1:
      fences = ["```", "```", "````", "``"]
      body = ["Up", " Down\n", "Left", "right", "Up Down", ""]
      out.append(noise(rng.integers(0, 3)) + "".join(
          rng.choice(fences, p=[.4, .4, .1, .1]) + rng.choice(body) for _ in range(rng.integers(1, 4)))
          + rng.choice(["```", "", "``` ok"]) + noise(rng.integers(0, 2)))
      continue
    words = ["Up", "Down", "Left", "Right", "up", " Left ", "Right\n", ""]
    parts = [words[i] for i in rng.choice(len(words), size=rng.integers(1, 4), p=[.2, .2, .2, .2, .05, .1, .04, .01])]
    sep = ["||", " || ", "|", "|||"][rng.choice(4, p=[.45, .45, .05, .05])]
    close = "</answer>" if rng.random() < 0.9 else "</answ"
    out.append(noise(rng.integers(0, 3)) + "<answer>" + sep.join(parts) + close + noise(rng.integers(0, 3)))
  return out


ADVERSARIAL = [
    "", "Up", "up", "UP", "I go Left, no wait: Right", "```\nDown\n```", "Upstairs", "Left-Up",
    "<answer>Left</answer>", "<answer>left</answer>", "<answer>Left || Up</answer>",
    "<answer>Left||Up||Down</answer>", "<answer> Down </answer><answer>Up</answer>", "<answer>Up",
    "<answer>Up</answer", "<answer></answer>", "<answer> || </answer>", "<answer>Left |||Up</answer>",
    "<answer><answer>Right</answer>", "</answer><answer>Down</answer>", "<answer>Right ||</answer>",
    "<answer>Up Down</answer>", "Right<|im_end|>", "<think>Up</think><answer>Down</answer>",
    "```Up```", "```\nLeft\n```", "```Up``` then ```Down```", "```Up``` ```", "````Up````", "```Up", "``Up``",
    "```up```", "```Up Down```", "```Right```<|im_end|>", "``````", "```Left```` ```Down```",
]


def _batch(tok, texts, cap):
  ids = np.zeros((len(texts), cap), np.int32)
  lens = np.zeros((len(texts),), np.int32)
  for i, t in enumerate(texts):
    e = tok.encode(t)[:cap]
    ids[i, :len(e)] = e
    lens[i] = len(e)
  return ids, lens


@pytest.mark.parametrize("preset,fmt", [("rllm", "last_word"), ("rllm", "fenced"), ("ragen", "answer_tag")])
@pytest.mark.parametrize("tok_name", ["builtin_tok", "hf_tok"])
def test_parse_device_equals_host(preset, fmt, tok_name, request):
  tok = request.getfixturevalue(tok_name)
  env = fl.FrozenLake(preset, tokenizer=tok, max_reply_tokens=48, max_reply_bytes=96, action_format=fmt)
  texts = ADVERSARIAL + _random_replies(np.random.default_rng(1), 300)
  ids, lens = _batch(tok, texts, env.max_reply_tokens)
  got = np.asarray(jax.jit(jax.vmap(env.parse_action))(ids, lens))
  n_valid = 0
  for i in range(len(texts)):
    reply = tok.decode(ids[i, :lens[i]]).encode("utf-8")[:env.reply_byte_capacity(ids.shape[1])]
    want = ft.parse_action_bytes(reply, env.action_format, env.max_actions)
    assert list(got[i]) == want, (texts[i], got[i], want)
    n_valid += want[0] >= 0
  assert 20 < n_valid < len(texts) - 20   # both outcomes well represented


def test_parse_random_token_ids(builtin_tok):
  """Uniformly random ids (text pieces and ASCII bytes, so decoding is exact) still agree."""
  tok = builtin_tok
  safe = [i for i in range(tok.vocab_size) if i < len(tok._pieces)
          and (isinstance(tok.piece(i), str) or tok.piece(i)[0] < 128)]
  rng = np.random.default_rng(2)
  for preset, fmt in (("rllm", "last_word"), ("rllm", "fenced"), ("ragen", "answer_tag")):
    env = fl.FrozenLake(preset, tokenizer=tok, max_reply_tokens=32, action_format=fmt)
    ids = rng.choice(safe, size=(300, 32)).astype(np.int32)
    lens = rng.integers(0, 33, size=300).astype(np.int32)
    got = np.asarray(jax.jit(jax.vmap(env.parse_action))(ids, lens))
    for i in range(300):
      reply = tok.decode(ids[i, :lens[i]]).encode("utf-8")[:env.reply_byte_capacity(ids.shape[1])]
      assert list(got[i]) == ft.parse_action_bytes(reply, env.action_format, env.max_actions)


def _random_states(env, n, seed):
  p = env.default_params
  states, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(seed), n), p)
  step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
  out = [states]
  rng = np.random.default_rng(seed)
  for t in range(4):
    acts = rng.integers(-2, 4, size=(n, env.max_actions)).astype(np.int32)
    acts[:, 1:] = np.maximum(acts[:, 1:], -1)
    states, *_ = step(jax.random.split(jax.random.key(100 + t), n), states, acts, p)
    out.append(states)
  return out


@pytest.mark.parametrize("preset,hint,near,grid", [
    ("rllm", False, False, True), ("ragen", False, False, True), ("rllm_small", True, False, True),
    ("rllm_small", True, True, True), ("long", True, True, False)])
@pytest.mark.parametrize("tok_name", ["builtin_tok", "hf_tok"])
def test_render_device_equals_host(preset, hint, near, grid, tok_name, request):
  tok = request.getfixturevalue(tok_name)
  env = fl.FrozenLake(preset, tokenizer=tok, goal_hint=hint, local_view=near, grid=grid)
  p = env.default_params
  prompt = jax.jit(jax.vmap(env.initial_prompt_tokens, in_axes=(0, None)))
  obs = jax.jit(jax.vmap(env.observation_tokens, in_axes=(0, 0, None)))
  n = 24
  all_states = _random_states(env, n, seed=3)
  statuses = set()
  for k, states in enumerate(all_states):
    closed = np.arange(n) % 2 == 0
    toks, lens = prompt(states, p) if k == 0 else obs(states, closed, p)
    toks, lens, states = np.asarray(toks), np.asarray(lens), jax.tree.map(np.asarray, states)
    for i in range(n):
      s = jax.tree.map(lambda x: x[i], states)
      statuses.add(int(s.status))
      if k == 0:
        want = ft.initial_prompt_text(env, env.text.markup, s, p)
      else:
        want = ft.observation_text(env.text.markup, s, p, bool(closed[i]), hint, near, grid)
      got = list(np.asarray(toks[i, :lens[i]]))
      assert tok.decode(got) == want
      assert got == tok.encode(want)      # the canonical tokenization of the same text
  assert {fl.ST_START, fl.ST_MOVED, fl.ST_INVALID} <= statuses and len(statuses) >= 4


def test_markup_closes_the_turn_once(builtin_tok):
  env = fl.FrozenLake("rllm", tokenizer=builtin_tok)
  m = env.text.markup
  assert m.between_open == "<|im_end|>\n<|im_start|>user\n"
  assert m.between_closed == "\n<|im_start|>user\n"
  assert m.prompt_prefix == "<|im_start|>user\n" and m.gen_suffix == "<|im_end|>\n<|im_start|>assistant\n"


def test_missing_tokenizer_and_bad_options_name_the_field():
  with pytest.raises(ValueError, match="tokenizer"):
    fl.FrozenLake("rllm").parse_action(jnp.zeros((4,), jnp.int32), 0)
  with pytest.raises(ValueError, match="preset"):
    fl.FrozenLake("nope")
  with pytest.raises(ValueError, match="p_min"):
    fl.FrozenLake("rllm", p_min=0.9, p_max=0.5)
  with pytest.raises(ValueError, match="slipery"):
    fl.FrozenLake("rllm", slipery=True)


def test_local_view_names_what_each_move_leads_onto(builtin_tok):
  # 3x3 map, player at the middle of the left column: the edge, a hole, the goal, frozen ice
  tiles = np.full((5, 5), fl.PAD, np.int32)
  tiles[:3, :3] = [[fl.FROZEN, fl.FROZEN, fl.FROZEN], [fl.FROZEN, fl.GOAL, fl.FROZEN],
                   [fl.HOLE, fl.FROZEN, fl.FROZEN]]
  env = fl.FrozenLake("rllm_small", tokenizer=builtin_tok, local_view=True)
  state = env.init_state(tiles, 3, 3, (1, 0))
  text = ft.initial_prompt_text(env, env.text.markup, state, env.default_params)
  # the goal is right of the player: Right first, then Down, Up, Left
  assert "P G _\nO _ _\nRemaining steps: 8\nG:Right\nO:Down\n_:Up\n#:Left<|im_end|>" in text
  toks, n = jax.jit(env.initial_prompt_tokens)(state)
  assert builtin_tok.decode(list(np.asarray(toks[:n]))) == text
  # every line is 4 built-in tokens, its cell first and its move word (the reply's own token) last
  for a in range(4):
    for c in range(4):
      ids = builtin_tok.encode(ft.near_text(a, c))
      assert len(ids) == 4 and ids[3] == builtin_tok.encode(fl.ACTION_NAMES[a])[0]
      assert builtin_tok.decode(ids[1:2]) == ft.NEAR_CHARS[c]
  # a corner of a 2x2 map: two edges
  state = env.init_state(tiles, 2, 2, (1, 1))
  assert [int(c) for c in fl.neighbour_cells(state)] == [fl.OBS_FROZEN, fl.OBS_PAD, fl.OBS_PAD,
                                                        fl.OBS_FROZEN]


def test_goal_hint_text():
  assert ft.hint_text(2, 1) == "Goal: 2 Down, 1 Right.\n"
  assert ft.hint_text(-3, 0) == "Goal: 3 Up.\n"
  assert ft.hint_text(0, -1) == "Goal: 1 Left.\n"
  assert ft.hint_text(0, 0) == "Goal: here.\n"
