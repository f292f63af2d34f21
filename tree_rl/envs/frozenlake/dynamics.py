"""FrozenLake dynamics on device: jitted map generation with BFS reachability, gymnasium rules.

Tiles: FROZEN=0, HOLE=1, GOAL=2, PAD=3 (outside the map); maps are padded to `max_size` so a batch
vmaps. Actions (gymnasium): LEFT=0, DOWN=1, RIGHT=2, UP=3. An agent turn is one action or a vector
of up to `max_actions` moves (NOOP=-1 pads); any other entry makes the whole turn invalid: the
agent stays, the move budget is unchanged and the reward is `format_penalty`.

Slippery (gymnasium): the intended direction with probability `success_rate`, each perpendicular
direction with (1 - success_rate) / 2. The episode ends on a hole, on the goal (reward 1), after
`max_steps` moves or after `max_turns` turns.

The token env (`env.FrozenLake`) and its text rendering (`text`) build on this
module; it depends on neither.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["FROZEN", "HOLE", "GOAL", "PAD", "LEFT", "DOWN", "RIGHT", "UP", "NOOP", "INVALID",
           "ACTION_NAMES", "OBS_PAD", "OBS_FROZEN", "OBS_HOLE", "OBS_GOAL", "OBS_PLAYER",
           "OBS_PLAYER_IN_HOLE", "OBS_PLAYER_ON_GOAL", "ST_START", "ST_MOVED", "ST_INVALID",
           "ST_HOLE", "ST_GOAL", "ST_OUT_OF_STEPS", "FrozenLakeParams", "FrozenLakeState",
           "bfs_distance", "generate_map", "observation_grid", "goal_position", "distance_to_goal",
           "init_state", "transition", "neighbour", "neighbour_cells", "preferred_moves"]

FROZEN, HOLE, GOAL, PAD = 0, 1, 2, 3
LEFT, DOWN, RIGHT, UP = 0, 1, 2, 3
NOOP, INVALID = -1, -2
ACTION_NAMES = ("Left", "Down", "Right", "Up")
# observation codes: the grid as the agent sees it
OBS_PAD, OBS_FROZEN, OBS_HOLE, OBS_GOAL, OBS_PLAYER, OBS_PLAYER_IN_HOLE, OBS_PLAYER_ON_GOAL = range(7)
# status of the last turn, shown in the observation text
ST_START, ST_MOVED, ST_INVALID, ST_HOLE, ST_GOAL, ST_OUT_OF_STEPS = range(6)

# row / column delta per action (numpy: importing the module must not start a JAX backend, so
# a multi-host job can still call jax.distributed.initialize)
_DR = np.array([0, 1, 0, -1], np.int32)
_DC = np.array([-1, 0, 1, 0], np.int32)


@struct.dataclass
class FrozenLakeParams:
  min_size: Any = 2           # map side, sampled uniformly in [min_size, max_size]
  max_size: Any = 9
  p_min: Any = 0.6            # frozen-tile probability ~ U(p_min, p_max)
  p_max: Any = 0.85
  slippery: Any = False
  success_rate: Any = 1.0 / 3.0
  max_steps: Any = 8          # moves per episode; maps need a path of at most this many moves
  min_steps: Any = 0          # ... and of at least this many (long episodes on every map)
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
  start/goal resampled until the shortest safe path to the goal takes between
  `params.min_steps` and `params.max_steps` moves."""
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
    ok = (d >= 0) & (d >= params.min_steps) & (d <= params.max_steps)
    return tiles.astype(jnp.int32), start, goal, ok

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


def neighbour(state: FrozenLakeState, pos, a) -> jax.Array:
  """int32[2]: the cell move `a` leads to from `pos` (`pos` itself against the map's edge)."""
  r = jnp.clip(pos[0] + jnp.asarray(_DR)[a], 0, state.nrow - 1)
  c = jnp.clip(pos[1] + jnp.asarray(_DC)[a], 0, state.ncol - 1)
  return jnp.stack([r, c])


def neighbour_cells(state: FrozenLakeState) -> jax.Array:
  """int32[4]: what each move (Left, Down, Right, Up) leads onto from the player: OBS_FROZEN,
  OBS_HOLE, OBS_GOAL, or OBS_PAD against the map's edge."""
  codes = jnp.array([OBS_FROZEN, OBS_HOLE, OBS_GOAL, OBS_PAD], jnp.int32)
  out = []
  for a in range(4):
    n = neighbour(state, state.pos, a)
    out.append(jnp.where(jnp.any(n != state.pos), codes[state.tiles[n[0], n[1]]], OBS_PAD))
  return jnp.stack(out)


def _move_orders() -> np.ndarray:
  """int32[9, 4]: for each (sign of the goal's row offset + 1) * 3 + (sign of its column offset
  + 1), the moves toward the goal (vertical, then horizontal) and then the others in the order
  Down, Right, Up, Left."""
  table = []
  for down in (-1, 0, 1):
    for right in (-1, 0, 1):
      first = ([DOWN if down > 0 else UP] if down else []) + ([RIGHT if right > 0 else LEFT] if right else [])
      table.append(first + [a for a in (DOWN, RIGHT, UP, LEFT) if a not in first])
  return np.array(table, np.int32)


MOVE_ORDERS = _move_orders()


def preferred_moves(state: FrozenLakeState) -> jax.Array:
  """int32[4]: the four moves, those toward the goal first (the goal hint's order: vertical, then
  horizontal), then the others in the order Down, Right, Up, Left."""
  d = jnp.sign(goal_position(state) - state.pos) + 1
  return jnp.asarray(MOVE_ORDERS)[d[0] * 3 + d[1]]


def goal_position(state: FrozenLakeState) -> jax.Array:
  m = state.tiles.shape[0]
  flat = jnp.argmax((state.tiles == GOAL).reshape(-1))
  return jnp.stack([flat // m, flat % m]).astype(jnp.int32)


def distance_to_goal(state: FrozenLakeState) -> jax.Array:
  """BFS moves from the player to the goal avoiding holes; -1 when unreachable (e.g. in a hole)."""
  d = bfs_distance(state.tiles, state.nrow, state.ncol, state.pos, goal_position(state))
  return jnp.where(state.fell, -1, d)


def init_state(tiles, nrow, ncol, start) -> FrozenLakeState:
  """A fresh state on a given map (tiles int[M, M] padded with PAD)."""
  z = jnp.int32(0)
  f = jnp.bool_(False)
  start = jnp.asarray(start, jnp.int32)
  return FrozenLakeState(jnp.asarray(tiles, jnp.int32), jnp.asarray(nrow, jnp.int32),
                         jnp.asarray(ncol, jnp.int32), start, start, z, z, f, f, f,
                         jnp.int32(ST_START), z)


def transition(key, state: FrozenLakeState, action, params: FrozenLakeParams):
  """One agent turn of moves -> (state, obs grid, reward, done, info); a done state stays put
  with reward 0."""
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
    new = jnp.where(go, neighbour(state, pos, d), pos)
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
