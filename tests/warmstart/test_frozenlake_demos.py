"""FrozenLake demos: the noiseless expert always wins, replies parse to the intended moves, the
loss mask covers exactly the trained replies, episodes are cut at max_len."""

import jax
import numpy as np
import pytest

from tree_rl import envs, warmstart
from tree_rl.envs import frozenlake as fl
from tree_rl.envs.frozenlake import text as flt

GEN_PROMPT = "<|im_start|>assistant\n"


def _np(demos):
  return jax.tree.map(np.asarray, demos)


def _check_replies_follow_generation_prompts(tok, gen, d, i):
  """The text after the k-th generation prompt starts with the reply of turn k."""
  text = tok.decode(d.tokens[i, :d.length[i]])
  pieces = text.split(GEN_PROMPT)[1:]
  rows = [r for r in d.rows[i] if r >= 0]
  assert len(pieces) == len(rows)
  for piece, r in zip(pieces, rows):
    assert piece.startswith(gen.reply_text(r)), (piece, gen.reply_text(r))


def _masked_text(tok, d, i, mask):
  return tok.decode(d.tokens[i][mask[i].astype(bool)])


@pytest.fixture(scope="module")
def noiseless(tok, rllm_env):
  expert = warmstart.make_expert("frozenlake", rllm_env, 0.0)
  gen = warmstart.DemoGenerator(rllm_env, tok, expert, max_len=2048)
  return gen, _np(gen(jax.random.key(1), 96))


def test_noiseless_expert_solves_every_map_and_replies_parse(tok, rllm_env, noiseless):
  gen, d = noiseless
  assert gen.expert.reply_texts[:4] == ("Left", "Down", "Right", "Up")
  assert d.success.all() and np.allclose(d.reward, 1.0) and not d.truncated.any()
  assert not d.noisy.any() and np.array_equal(d.rows, d.intended)
  assert (d.turns >= 1).all() and (d.turns <= 8).all()
  for i in range(96):
    _check_replies_follow_generation_prompts(tok, gen, d, i)
    replies = "".join(gen.reply_text(r) for r in d.rows[i] if r >= 0)
    assert _masked_text(tok, d, i, d.loss_mask) == replies
    assert _masked_text(tok, d, i, d.reply_mask) == replies
    assert d.reply_mask[i].sum() == d.loss_mask[i].sum() == 2 * d.turns[i]  # word + end of turn
  # reply tokens parse (device parser) to the move of their row, and the host parser agrees
  rows = np.arange(4)
  acts = np.asarray(jax.jit(jax.vmap(rllm_env.parse_action))(gen.table.tokens[rows],
                                                             gen.table.lengths[rows]))
  np.testing.assert_array_equal(acts[:, 0], rows)
  for r in rows:
    reply = tok.decode(list(np.asarray(gen.table.tokens[r, :gen.table.lengths[r]])))
    assert reply.endswith("<|im_end|>")
    assert flt.parse_action_bytes(reply.encode(), "last_word", 1) == [r]


def test_expert_takes_shortest_paths(tok, noiseless):
  """Turns of the noiseless expert == BFS distance from start to goal, computed independently
  on the host from the decoded first grid."""
  gen, d = noiseless
  for i in range(96):
    text = tok.decode(d.tokens[i, :d.prompt_len[i]])
    grid = [line.split(" ") for line in text.split("\n") if line and set(line) <= set("_OGP ")]
    assert _host_bfs(grid) == d.turns[i], (text, d.turns[i])


def test_expert_breaks_ties_in_the_hints_order(tok, noiseless):
  """The first move is, among the moves with the fewest BFS steps left (host BFS on the decoded
  grid), the first in the order Down, Up, Left, Right; so on a clear path it is the goal hint's
  first direction."""
  gen, d = noiseless
  names = ("Left", "Down", "Right", "Up")
  moves = {"Down": (1, 0), "Up": (-1, 0), "Left": (0, -1), "Right": (0, 1)}
  for i in range(96):
    text = tok.decode(d.tokens[i, :d.prompt_len[i]])
    grid = [line.split(" ") for line in text.split("\n") if line and set(line) <= set("_OGP ")]
    n, m = len(grid), len(grid[0])
    r, c = next((r, c) for r in range(n) for c in range(m) if grid[r][c] == "P")
    after = {}
    for name, (dr, dc) in moves.items():
      rr, cc = min(max(r + dr, 0), n - 1), min(max(c + dc, 0), m - 1)
      if (rr, cc) != (r, c) and grid[rr][cc] != "O":
        dist = _host_bfs(grid, (rr, cc))
        after[name] = dist if dist >= 0 else 1 << 20
    best = min(after.values())
    want = next(name for name in ("Down", "Up", "Left", "Right") if after.get(name) == best)
    assert names[d.rows[i][0]] == want, (text, after)


def _host_bfs(grid, start=None):
  n, m = len(grid), len(grid[0])
  start = start or next((r, c) for r in range(n) for c in range(m) if grid[r][c] == "P")
  seen, frontier, dist = {start}, [start], 0
  while frontier:
    if any(grid[r][c] == "G" for r, c in frontier):
      return dist
    nxt = []
    for r, c in frontier:
      for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
        rr, cc = min(max(r + dr, 0), n - 1), min(max(c + dc, 0), m - 1)
        if (rr, cc) not in seen and grid[rr][cc] != "O":
          seen.add((rr, cc))
          nxt.append((rr, cc))
    frontier, dist = nxt, dist + 1
  return -1


def test_noisy_expert_mask(tok, rllm_env):
  loss_on_noise = False
  gen = warmstart.DemoGenerator(rllm_env, tok, warmstart.make_expert("frozenlake", rllm_env, 0.4),
                                max_len=2048, loss_on_noise=loss_on_noise)
  d = _np(gen(jax.random.key(3), 64))
  assert d.noisy.any() and not d.success.all() and d.success.any()
  assert np.array_equal(d.noisy, (d.rows != d.intended) & (d.rows >= 0))
  for i in range(64):
    _check_replies_follow_generation_prompts(tok, gen, d, i)
    rows = [(r, nz) for r, nz in zip(d.rows[i], d.noisy[i]) if r >= 0]
    trained = "".join(gen.reply_text(r) for r, nz in rows if loss_on_noise or not nz)
    assert _masked_text(tok, d, i, d.loss_mask) == trained
    assert _masked_text(tok, d, i, d.reply_mask) == "".join(gen.reply_text(r) for r, _ in rows)
    # a lost episode ended in a hole or out of turns; a won one on its last turn
    assert d.success[i] == (d.reward[i] == 1.0)


def test_truncation_keeps_prefix(tok, rllm_env, noiseless):
  gen = warmstart.DemoGenerator(rllm_env, tok, warmstart.make_expert("frozenlake", rllm_env, 0.0),
                                max_len=200)
  d = _np(gen(jax.random.key(1), 96))
  full = noiseless[1]
  assert d.truncated.any() and not d.truncated.all()
  np.testing.assert_array_equal(d.length, np.minimum(full.length, 200))
  np.testing.assert_array_equal(d.tokens, full.tokens[:, :200])
  np.testing.assert_array_equal(d.loss_mask, full.loss_mask[:, :200])
  assert (d.truncated == (full.length > 200)).all()


def test_ragen_two_moves_per_turn(tok):
  env = envs.make("frozenlake", preset="ragen", tokenizer=tok, slippery=False)
  expert = warmstart.make_expert("frozenlake", env, 0.0)
  assert len(expert.reply_texts) == 4 + 16 and expert.reply_texts[4 + 4 * fl.UP + fl.LEFT] == \
      "<answer>Up || Left</answer>"
  gen = warmstart.DemoGenerator(env, tok, expert, max_len=1024)
  d = _np(gen(jax.random.key(4), 64))
  assert d.success.all() and not d.truncated.any()
  rows = d.rows[d.rows >= 0]
  acts = np.asarray(jax.jit(jax.vmap(env.parse_action))(gen.table.tokens[rows], gen.table.lengths[rows]))
  for r, a in zip(rows, acts):
    want = list(expert.sequences[r]) + [fl.NOOP] * (2 - len(expert.sequences[r]))
    assert list(a) == want
    text = expert.reply_texts[r].encode()
    assert flt.parse_action_bytes(text, "answer_tag", 2) == want


def test_registry(rllm_env):
  assert {"frozenlake", "toolcall"} <= set(warmstart.registered_experts())
  with pytest.raises(KeyError, match="no warm-start expert for env 'nope'"):
    warmstart.make_expert("nope", rllm_env, 0.0)
  with pytest.raises(ValueError, match="warmstart.epsilon"):
    warmstart.make_expert("frozenlake", rllm_env, 1.5)

  class Always:
    reply_texts = ("Up",)
    def __init__(self, env, epsilon):
      pass
    def act(self, key, state, params):
      import jax.numpy as jnp
      return jnp.int32(0), jnp.bool_(False), jnp.int32(0)
    def success(self, state):
      return state.won

  envs.register("frozenlake_up", fl.FrozenLake, expert=Always)
  assert "frozenlake_up" in warmstart.registered_experts()
  assert isinstance(warmstart.make_expert("frozenlake_up", rllm_env, 0.0), Always)
  with pytest.raises(ValueError, match="already registered"):
    envs.register("frozenlake_up", fl.FrozenLake, expert=lambda env, eps: None)


def _next_to_a_hole(prompt: str) -> bool:
  """From the first observation's grid text: is a hole next to the player (P)?"""
  rows = [line.split() for line in prompt.split("\n") if line and set(line.split()) <= set("P_OG")]
  r = next(i for i, row in enumerate(rows) if "P" in row)
  c = rows[r].index("P")
  cells = [rows[r + dr][c + dc] for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))
           if 0 <= r + dr < len(rows) and 0 <= c + dc < len(rows[r])]
  return "O" in cells


def test_hard_demos_start_next_to_a_hole(tok):
  """`Expert.hard` (FrozenLake) is true exactly where a hole is next to the start, whether the
  hint points into it or not; hard_fraction draws that share of the demos from a larger pool,
  the rest from easy ones."""
  from tree_rl.envs.frozenlake.rules import hint_move
  from tree_rl.warmstart.sft import HARD_POOL, draw_demos
  env = envs.make("frozenlake", preset="rllm_small", tokenizer=tok, goal_hint=True)
  expert = warmstart.make_expert("frozenlake", env, 0.0)
  tiles = np.full((5, 5), fl.PAD, np.int32)
  # "SF/HG": the hint says Down, into the hole (the expert goes Right first)
  tiles[:2, :2] = [[fl.FROZEN, fl.FROZEN], [fl.HOLE, fl.GOAL]]
  state = env.init_state(tiles, 2, 2, (0, 0))
  assert int(hint_move(state)) == fl.DOWN and bool(expert.hard(state))
  # "SH/FG": the hint's Down is safe, the hole lies Right: hard too
  tiles[:2, :2] = [[fl.FROZEN, fl.HOLE], [fl.FROZEN, fl.GOAL]]
  assert bool(expert.hard(env.init_state(tiles, 2, 2, (0, 0))))
  # no hole next to the start
  tiles[:2, :2] = [[fl.FROZEN, fl.FROZEN], [fl.FROZEN, fl.GOAL]]
  assert not bool(expert.hard(env.init_state(tiles, 2, 2, (0, 0))))
  tiles[:3, :3] = [[fl.FROZEN, fl.FROZEN, fl.FROZEN], [fl.FROZEN, fl.FROZEN, fl.FROZEN],
                   [fl.FROZEN, fl.FROZEN, fl.HOLE]]
  tiles[0, 2] = fl.GOAL
  assert not bool(expert.hard(env.init_state(tiles, 3, 3, (0, 0))))   # a hole, but not adjacent

  gen = warmstart.DemoGenerator(env, tok, expert, max_len=256)
  natural = _np(gen(jax.random.key(3), 64))
  mixed = _np(draw_demos(gen, expert, jax.random.key(3), 64, 0.875))
  pool = _np(gen(jax.random.key(3), HARD_POOL * 64))
  assert 0.2 < natural.hard.mean() < 0.8 and mixed.hard.sum() == 56
  # the hard ones are the pool's first 56 hard episodes, in order, then the first 8 easy ones
  np.testing.assert_array_equal(mixed.tokens[:56], pool.tokens[np.flatnonzero(pool.hard)[:56]])
  np.testing.assert_array_equal(mixed.tokens[56:], pool.tokens[np.flatnonzero(~pool.hard)[:8]])
  # read back from each demo's own first grid: a hole next to the player exactly in the hard ones
  for i in range(64):
    text = tok.decode(list(mixed.tokens[i, :mixed.length[i]]))
    assert _next_to_a_hole(text.split(GEN_PROMPT)[0]) == (i < 56), text



def test_hard_turn_weight_weighs_the_replies_of_turns_next_to_a_hole(tok):
  """warmstart.hard_turn_weight: each reply weighs 3 where the grid its turn was taken on (read
  back from the demo's own text) has a hole next to the player, else 1; the tokens and the
  trained positions are those of the unweighted demos."""
  env = envs.make("frozenlake", preset="rllm_small", tokenizer=tok, goal_hint=True)
  expert = warmstart.make_expert("frozenlake", env, 0.0)
  plain = _np(warmstart.DemoGenerator(env, tok, expert, max_len=1024)(jax.random.key(5), 48))
  gen = warmstart.DemoGenerator(env, tok, expert, max_len=1024, hard_turn_weight=3.0)
  d = _np(gen(jax.random.key(5), 48))
  np.testing.assert_array_equal(d.tokens, plain.tokens)
  np.testing.assert_array_equal(d.loss_mask > 0, plain.loss_mask > 0)
  assert not d.truncated.any() and set(np.unique(d.loss_mask)) == {0.0, 1.0, 3.0}
  hard_turns = 0
  for i in range(48):
    pieces = tok.decode(list(d.tokens[i, :d.length[i]])).split(GEN_PROMPT)
    weights = d.loss_mask[i][d.reply_mask[i]].reshape(d.turns[i], 2)   # word + end of turn
    assert (weights[:, 0] == weights[:, 1]).all()
    for k in range(d.turns[i]):   # turn k was taken on the grid just before its generation prompt
      want = 3.0 if _next_to_a_hole(pieces[k]) else 1.0
      assert weights[k, 0] == want, (i, k, pieces[k])
      hard_turns += want == 3.0
  assert 0 < hard_turns < int(d.turns.sum())


def test_a_turn_weight_leaves_untrained_noisy_replies_at_zero(tok):
  """With loss_on_noise=False a noisy reply weighs 0 whatever its turn; the trained ones weigh
  1 or 3 exactly where the unweighted demos train."""
  env = envs.make("frozenlake", preset="rllm_small", tokenizer=tok, goal_hint=True)
  expert = warmstart.make_expert("frozenlake", env, 0.4)
  plain = _np(warmstart.DemoGenerator(env, tok, expert, max_len=1024)(jax.random.key(6), 48))
  d = _np(warmstart.DemoGenerator(env, tok, expert, max_len=1024, hard_turn_weight=3.0)(
      jax.random.key(6), 48))
  assert d.noisy.any()
  np.testing.assert_array_equal(d.loss_mask > 0, plain.loss_mask > 0)
  noisy_tokens = d.reply_mask & (plain.loss_mask == 0)
  assert noisy_tokens.any() and (d.loss_mask[noisy_tokens] == 0).all()
  assert set(np.unique(d.loss_mask[plain.loss_mask > 0])) == {1.0, 3.0}
