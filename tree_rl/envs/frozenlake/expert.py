"""FrozenLake expert: the move whose neighbour cell is closest (BFS, avoiding holes) to the goal.

Ties go to vertical moves first (Down, Up, then Left, Right), the order in which the goal hint
names the offsets ("Goal: 2 Down, 1 Right."), so the noiseless expert is a function of the
observation and, where no hole is in the way, moves along the hint's first direction. A turn holds up to `env.max_actions` moves, planned as if the lake
were not slippery and stopping at the goal; with probability `epsilon` each move is replaced by a
uniformly random one. The reply is the move list in the env's action format (last_word: `Up`;
fenced: ```Up```; answer_tag: `<answer>Left || Up</answer>`).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from tree_rl.envs.frozenlake import dynamics as fl

_FORMATS = {"last_word": "{}", "fenced": "```{}```", "answer_tag": "<answer>{}</answer>"}
_FAR = 1 << 20
TIE_ORDER = (fl.DOWN, fl.UP, fl.LEFT, fl.RIGHT)


def neighbour_distances(state, pos=None) -> jax.Array:
  """int32[4]: BFS moves to the goal after each action from `pos` (default: the player);
  a large number for a hole, a wall or no path."""
  pos = state.pos if pos is None else pos
  goal = fl.goal_position(state)
  out = []
  for a in range(4):
    n = fl.neighbour(state, pos, a)
    d = fl.bfs_distance(state.tiles, state.nrow, state.ncol, n, goal)
    ok = jnp.any(n != pos) & (state.tiles[n[0], n[1]] != fl.HOLE) & (d >= 0)
    out.append(jnp.where(ok, d, _FAR))
  return jnp.stack(out).astype(jnp.int32)


def best_move(state, pos=None) -> jax.Array:
  """int32: the move with the fewest BFS steps left, ties broken by TIE_ORDER."""
  order = jnp.asarray(TIE_ORDER, jnp.int32)
  return order[jnp.argmin(neighbour_distances(state, pos)[order])]


class FrozenLakeExpert:
  """Row 0..3: the single moves Left, Down, Right, Up (row == action id); then every sequence
  of 2..max_actions moves, in lexicographic order."""

  def __init__(self, env, epsilon: float):
    fmt = _FORMATS.get(env.action_format)
    if fmt is None:
      raise ValueError(f"no FrozenLake expert reply for action_format={env.action_format!r}")
    self.max_actions = int(env.max_actions)
    if self.max_actions > 4:
      raise ValueError(f"the FrozenLake expert plans at most 4 moves per turn, env has {self.max_actions}")
    self.sequences = [s for k in range(1, self.max_actions + 1)
                      for s in itertools.product(range(4), repeat=k)]
    self.reply_texts = tuple(fmt.format(" || ".join(fl.ACTION_NAMES[a] for a in s))
                             for s in self.sequences)
    self.epsilon = epsilon

  def _row(self, moves, count):
    """Row of the first `count` of `moves` (int32[max_actions])."""
    row = jnp.int32(0)
    offset = 0
    for k in range(1, self.max_actions + 1):
      code = jnp.int32(0)
      for i in range(k):
        code = code * 4 + moves[i]
      row = jnp.where(count == k, offset + code, row)
      offset += 4 ** k
    return row

  def act(self, key, state, params):
    goal = fl.goal_position(state)
    keys = jax.random.split(key, self.max_actions)
    pos, count, best, taken, stop = state.pos, jnp.int32(0), [], [], jnp.bool_(False)
    for i in range(self.max_actions):
      a = best_move(state, pos)
      k_noise, k_move = jax.random.split(keys[i])
      explore = jax.random.uniform(k_noise) < self.epsilon
      b = jnp.where(explore, jax.random.randint(k_move, (), 0, 4), a).astype(jnp.int32)
      count = count + ~stop
      best.append(a)
      taken.append(b)
      pos = fl.neighbour(state, pos, a)
      stop = stop | jnp.all(pos == goal)
    # the noiseless plan stops at the goal; the noisy turn has the same number of moves
    intended = self._row(jnp.stack(best), count)
    row = self._row(jnp.stack(taken), count)
    return row, row != intended, intended

  def success(self, state):
    return state.won

  def hard(self, state):
    """A hole is next to the start: the right first move depends on where it lies (in the
    hint's direction, so the expert turns away, or elsewhere, so the hint's move is safe). Demos
    that oversample only the first kind teach "a hole in view: take the second move" (measured:
    docs/measurements.md, "testbed"); holes on either side make the policy read which move has it."""
    return jnp.any(fl.neighbour_cells(state) == fl.OBS_HOLE)

