"""FrozenLake on device: jitted map generation with BFS reachability, gymnasium dynamics.

Tiles: FROZEN=0, HOLE=1, GOAL=2, PAD=3 (outside the map); maps are padded to `max_size` so a batch
vmaps. Actions (gymnasium): LEFT=0, DOWN=1, RIGHT=2, UP=3. An agent turn is one action or a vector
of up to `max_actions` moves (NOOP=-1 pads); any other entry makes the whole turn invalid: the
agent stays, the move budget is unchanged and the reward is `format_penalty`.

Slippery (gymnasium): the intended direction with probability `success_rate`, each perpendicular
direction with (1 - success_rate) / 2. The episode ends on a hole, on the goal (reward 1), after
`max_steps` moves or after `max_turns` turns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from tree_rl.envs.base import Environment

FROZEN, HOLE, GOAL, PAD = 0, 1, 2, 3
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
NOOP, INVALID = -1, -2
ACTION_NAMES = ("Left", "Down", "Right", "Up")
# observation codes: the grid as the agent sees it
OBS_PAD, OBS_FROZEN, OBS_HOLE, OBS_GOAL, OBS_PLAYER, OBS_PLAYER_IN_HOLE, OBS_PLAYER_ON_GOAL = range(7)
# status of the last turn, shown in the observation text
ST_START, ST_MOVED, ST_INVALID, ST_HOLE, ST_GOAL, ST_OUT_OF_STEPS = range(6)

_DR = jnp.array([0, 1, 0, -1], jnp.int32)  # row delta per action
_DC = jnp.array([-1, 0, 1, 0], jnp.int32)  # column delta per action


@struct.dataclass
class FrozenLakeParams:
  min_size: Any = 2           # map side, sampled uniformly in [min_size, max_size]
  max_size: Any = 9
  p_min: Any = 0.6            # frozen-tile probability ~ U(p_min, p_max)
  p_max: Any = 0.85
  slippery: Any = False
  success_rate: Any = 1.0 / 3.0
  max_steps: Any = 8          # moves per episode; maps need a path of at most this many moves
  max_turns: Any = 10         # agent turns per episode
  format_penalty: Any = 0.0   # reward of an invalid turn


@struct.dataclass
class FrozenLakeState:
  tiles: jax.Array            # int32[M, M]
  nrow: jax.Array
  ncol: jax.Array
  start: jax.Array            # int32[2] (row, col)
  pos: jax.Array              # int32[2]
  steps: jax.Array            # moves taken
  turns: jax.Array            # turns taken (valid or not)
  done: jax.Array
  won: jax.Array
  fell: jax.Array
  status: jax.Array           # ST_* of the last turn
  invalid_turns: jax.Array


PRESETS = {
    # rLLM: random size 2..9, p ~ U(0.6, 0.85), not slippery, 8 moves, 10 turns, one move per turn.
    "rllm": dict(params=dict(min_size=2, max_size=9, p_min=0.6, p_max=0.85, slippery=False,
                             max_steps=8, max_turns=10, format_penalty=0.0),
                 max_size=9, max_actions=1, action_format="last_word"),
    # rLLM's rules on maps of side 2..5: episodes a 2-core CPU can train on in minutes.
    "rllm_small": dict(params=dict(min_size=2, max_size=5, p_min=0.6, p_max=0.85, slippery=False,
                                   max_steps=8, max_turns=10, format_penalty=0.0),
                       max_size=5, max_actions=1, action_format="last_word"),
    # RAGEN: 4x4, p = 0.8, slippery, up to 2 moves per turn in <answer>..</answer>, 5 turns.
    "ragen": dict(params=dict(min_size=4, max_size=4, p_min=0.8, p_max=0.8, slippery=True,
                              max_steps=10, max_turns=5, format_penalty=-0.1),
                  max_size=4, max_actions=2, action_format="answer_tag"),
}


def _passable_rows(tiles, nrow, ncol):
  """uint32[M]: bit c of row r is set when (r, c) is inside the map and not a hole."""
  m = tiles.shape[0]
  r = jnp.arange(m)[:, None]
  c = jnp.arange(m)[None, :]
  ok = (r < nrow) & (c < ncol) & (tiles != HOLE) & (tiles != PAD)
  return jnp.sum(jnp.where(ok, jnp.left_shift(jnp.uint32(1), c.astype(jnp.uint32)), 0), 1,
                 dtype=jnp.uint32)


def bfs_distance(tiles, nrow, ncol, src, dst):
  """Shortest number of moves from src to dst avoiding holes (BFS on row bitmasks); -1 if none."""
  m = tiles.shape[0]
  passable = _passable_rows(tiles, nrow, ncol)
  one = jnp.uint32(1)
  rows = jnp.arange(m)
  reached0 = jnp.where(rows == src[0], jnp.left_shift(one, src[1].astype(jnp.uint32)), 0
                       ).astype(jnp.uint32)
  goal_bit = jnp.left_shift(one, dst[1].astype(jnp.uint32))

  def hit(reached):
    return (reached[dst[0]] & goal_bit) != 0

  def cond(c):
    reached, d, changed = c
    return ~hit(reached) & changed

  def body(c):
    reached, d, _ = c
    z = jnp.zeros((1,), jnp.uint32)
    grown = (reached | jnp.left_shift(reached, 1) | jnp.right_shift(reached, 1)
             | jnp.concatenate([z, reached[:-1]]) | jnp.concatenate([reached[1:], z]))
    new = reached | (grown & passable)
    return new, d + 1, jnp.any(new != reached)

  reached, d, _ = jax.lax.while_loop(cond, body, (reached0, jnp.int32(0), jnp.bool_(True)))
  return jnp.where(hit(reached), d, -1)


def generate_map(key, params: FrozenLakeParams, max_size: int):
  """(tiles int32[M, M], size, start, goal): size and p drawn once, then tiles and distinct
  start/goal resampled until the goal is reachable within `params.max_steps` moves."""
  k_size, k_p, k_loop = jax.random.split(key, 3)
  size = jax.random.randint(k_size, (), params.min_size, params.max_size + 1)
  p = jax.random.uniform(k_p, (), minval=params.p_min, maxval=params.p_max)
  r = jnp.arange(max_size)[:, None]
  c = jnp.arange(max_size)[None, :]
  inside = (r < size) & (c < size)

  def sample(k):
    k_tiles, k_start, k_goal = jax.random.split(k, 3)
    frozen = jax.random.uniform(k_tiles, (max_size, max_size)) < p
    s = jax.random.randint(k_start, (), 0, size * size)
    g = jax.random.randint(k_goal, (), 0, size * size - 1)
    g = jnp.where(g >= s, g + 1, g)
    start = jnp.stack([s // size, s % size])
    goal = jnp.stack([g // size, g % size])
    tiles = jnp.where(inside, jnp.where(frozen, FROZEN, HOLE), PAD)
    tiles = tiles.at[start[0], start[1]].set(FROZEN).at[goal[0], goal[1]].set(GOAL)
    d = bfs_distance(tiles, size, size, start, goal)
    return tiles.astype(jnp.int32), start, goal, (d >= 0) & (d <= params.max_steps)

  def body(carry):
    k, *_ = carry
    k, sub = jax.random.split(k)
    return (k,) + sample(sub)

  init = (k_loop,) + jax.tree.map(jnp.zeros_like, jax.eval_shape(sample, k_loop))
  _, tiles, start, goal, _ = jax.lax.while_loop(lambda c: ~c[-1], body, init)
  return tiles, size, start, goal


def observation_grid(state: FrozenLakeState) -> jax.Array:
  """int32[M, M] of OBS_* codes: the map with the player drawn on it."""
  base = jnp.array([OBS_FROZEN, OBS_HOLE, OBS_GOAL, OBS_PAD], jnp.int32)[state.tiles]
  here = base[state.pos[0], state.pos[1]]
  player = jnp.where(here == OBS_HOLE, OBS_PLAYER_IN_HOLE,
                     jnp.where(here == OBS_GOAL, OBS_PLAYER_ON_GOAL, OBS_PLAYER))
  return base.at[state.pos[0], state.pos[1]].set(player)


def goal_position(state: FrozenLakeState) -> jax.Array:
  m = state.tiles.shape[0]
  flat = jnp.argmax((state.tiles == GOAL).reshape(-1))
  return jnp.stack([flat // m, flat % m]).astype(jnp.int32)


def distance_to_goal(state: FrozenLakeState) -> jax.Array:
  """BFS moves from the player to the goal avoiding holes; -1 when unreachable (e.g. in a hole)."""
  d = bfs_distance(state.tiles, state.nrow, state.ncol, state.pos, goal_position(state))
  return jnp.where(state.fell, -1, d)


class FrozenLake(Environment):
  """FrozenLake with static set-up (max map side, moves per turn, action text format, tokenizer).

  `FrozenLake(preset="rllm" | "ragen", tokenizer=None, **overrides)`; overrides may name any
  FrozenLakeParams field or max_size / max_actions / action_format / max_reply_tokens / goal_hint
  (goal_hint: every observation also says where the goal lies relative to the player, e.g.
  "Goal: 2 Down, 1 Right." -- an aid for policies too small to read the grid; off in the presets).
  Token methods (`initial_prompt_tokens`, `observation_tokens`, `parse_action`) need a tokenizer.
  """

  name = "frozenlake"

  def __init__(self, preset: str = "rllm", tokenizer=None, max_reply_tokens: int = 64,
               max_reply_bytes: int | None = None, **overrides):
    if preset not in PRESETS:
      raise ValueError(f"unknown frozenlake preset {preset!r} (config.env.preset); known: {sorted(PRESETS)}")
    spec = PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(FrozenLakeParams)}
    statics = {"max_size", "max_actions", "action_format", "goal_hint"}
    unknown = set(overrides) - fields - statics
    if unknown:
      raise ValueError(f"unknown frozenlake option(s) {sorted(unknown)}; known: "
                       f"{sorted(fields | statics | {'max_reply_tokens', 'max_reply_bytes'})}")
    p = dict(spec["params"], **{k: v for k, v in overrides.items() if k in fields})
    self.max_size = int(overrides.get("max_size", max(spec["max_size"], p["max_size"])))
    self.max_actions = int(overrides.get("max_actions", spec["max_actions"]))
    self.action_format = overrides.get("action_format", spec["action_format"])
    self.goal_hint = bool(overrides.get("goal_hint", False))
    self.preset = preset
    _validate(p, self.max_size, self.max_actions, self.action_format)
    self._params = FrozenLakeParams(**{k: jnp.asarray(v) for k, v in p.items()})
    self._host_params = p
    self.max_reply_tokens = max_reply_tokens
    self.max_reply_bytes = max_reply_bytes
    self.tokenizer = tokenizer
    self.text = None
    if tokenizer is not None:
      from tree_rl.envs.frozenlake_text import FrozenLakeText
      self.text = FrozenLakeText(self, tokenizer)

  def reply_byte_capacity(self, num_tokens: int) -> int:
    """Bytes of a reply the parser reads: max_reply_bytes, or 8 per token of the reply buffer."""
    return self.max_reply_bytes or 8 * num_tokens

  @property
  def default_params(self) -> FrozenLakeParams:
    return self._params

  def init_state(self, tiles, nrow, ncol, start) -> FrozenLakeState:
    """A fresh state on a given map (tiles int[M, M] padded with PAD)."""
    z = jnp.int32(0)
    f = jnp.bool_(False)
    start = jnp.asarray(start, jnp.int32)
    return FrozenLakeState(jnp.asarray(tiles, jnp.int32), jnp.asarray(nrow, jnp.int32),
                           jnp.asarray(ncol, jnp.int32), start, start, z, z, f, f, f,
                           jnp.int32(ST_START), z)

  def reset(self, key, params=None):
    params = self._params if params is None else params
    tiles, size, start, _ = generate_map(key, params, self.max_size)
    state = self.init_state(tiles, size, size, start)
    return state, observation_grid(state)

  def step(self, key, state, action, params=None):
    params = self._params if params is None else params
    moves = jnp.atleast_1d(jnp.asarray(action, jnp.int32))
    invalid = jnp.any((moves != NOOP) & ((moves < 0) | (moves > 3)))
    keys = jax.random.split(key, moves.shape[0])
    active0 = ~state.done

    def one(carry, xs):
      pos, steps, won, fell, moved = carry
      a, k = xs
      go = active0 & ~invalid & (a != NOOP) & ~won & ~fell & (steps < params.max_steps)
      u = jax.random.uniform(k)
      fail = (1.0 - params.success_rate) / 2.0
      slip = jnp.where(u < fail, (a - 1) % 4, jnp.where(u < 2 * fail, (a + 1) % 4, a))
      d = jnp.where(params.slippery, slip, a) % 4
      nr = jnp.clip(pos[0] + _DR[d], 0, state.nrow - 1)
      nc = jnp.clip(pos[1] + _DC[d], 0, state.ncol - 1)
      new = jnp.where(go, jnp.stack([nr, nc]), pos)
      tile = state.tiles[new[0], new[1]]
      return (new, steps + go, won | (go & (tile == GOAL)), fell | (go & (tile == HOLE)),
              moved | go), None

    init = (state.pos, state.steps, state.won, state.fell, jnp.bool_(False))
    (pos, steps, won, fell, _), _ = jax.lax.scan(one, init, (moves, keys))
    turns = state.turns + active0
    won_now = won & ~state.won
    reward = jnp.where(active0, won_now.astype(jnp.float32)
                       + jnp.where(invalid, params.format_penalty, 0.0), 0.0)
    out_of_steps = steps >= params.max_steps
    done = state.done | won | fell | out_of_steps | (turns >= params.max_turns)
    status = jnp.where(invalid, ST_INVALID, jnp.where(won, ST_GOAL, jnp.where(
        fell, ST_HOLE, jnp.where(out_of_steps, ST_OUT_OF_STEPS, ST_MOVED))))
    new_state = state.replace(pos=pos, steps=steps, turns=turns, done=done, won=won, fell=fell,
                              status=jnp.where(active0, status, state.status),
                              invalid_turns=state.invalid_turns + (active0 & invalid))
    info = {"won": won, "fell": fell, "invalid": active0 & invalid, "steps": steps, "turns": turns}
    return new_state, observation_grid(new_state), reward, done, info

  # ---- process-scorer signals
  def distance_to_goal(self, state):
    return distance_to_goal(state)

  def remaining_steps(self, state, params=None):
    params = self._params if params is None else params
    return jnp.maximum(params.max_steps - state.steps, 0)

  # ---- tokens (need a tokenizer)
  def _need_text(self):
    if self.text is None:
      raise ValueError("this FrozenLake was built without a tokenizer: make('frozenlake', tokenizer=...)")
    return self.text

  def initial_prompt_tokens(self, state, params=None):
    """(int32[prompt_capacity], length): first user message with chat markup + generation prompt."""
    return self._need_text().initial_prompt_tokens(state, self._params if params is None else params)

  def observation_tokens(self, state, turn_closed, params=None):
    """(int32[obs_capacity], length): closes the agent turn unless `turn_closed` (the reply ended with
    the end-of-turn token), then the user message with the new observation + generation prompt."""
    return self._need_text().observation_tokens(state, turn_closed,
                                                self._params if params is None else params)

  def parse_action(self, tokens, length):
    """int32[max_actions] action for step() from generated token ids (INVALID when malformed)."""
    return self._need_text().parse_action(tokens, length)


def _validate(p, max_size, max_actions, action_format):
  if not 2 <= p["min_size"] <= p["max_size"] <= max_size:
    raise ValueError(f"frozenlake sizes need 2 <= min_size <= max_size <= {max_size}, "
                     f"got min_size={p['min_size']} max_size={p['max_size']}")
  if max_size > 32:
    raise ValueError(f"frozenlake max_size must be <= 32 (row bitmasks), got {max_size}")
  if not 0.0 < p["p_min"] <= p["p_max"] <= 1.0:
    raise ValueError(f"frozenlake needs 0 < p_min <= p_max <= 1, got {p['p_min']}, {p['p_max']}")
  if not 1 <= p["max_steps"] <= 99:
    raise ValueError(f"frozenlake max_steps must be in [1, 99], got {p['max_steps']}")
  if p["max_turns"] < 1:
    raise ValueError(f"frozenlake max_turns must be >= 1, got {p['max_turns']}")
  if max_actions < 1:
    raise ValueError(f"frozenlake max_actions must be >= 1, got {max_actions}")
  if action_format not in ("last_word", "fenced", "answer_tag"):
    raise ValueError("frozenlake action_format must be 'last_word', 'fenced' or 'answer_tag', "
                     f"got {action_format!r}")
