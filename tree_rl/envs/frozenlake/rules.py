"""Rule policies on FrozenLake maps: the grid-blind baselines a learned policy has to beat, what
reading the local view alone achieves, and the expert's ceiling.

    hint    plays the goal hint's first direction word (Down, else Up, else Left, else Right:
            the order the hint names offsets in), never looking at holes
    random  a uniformly random move among those that stay on the map (holes not avoided)
    local   reads only the local view: its first listed move whose cell is neither a hole nor
            the map's edge (the hint's directions first, vertical first, then Down, Right, Up,
            Left), else the hint's word
    expert  the move with the fewest breadth-first-search moves left to the goal (reads the grid)

`success(env, states, rule, key, episodes)` plays `episodes` single-move turns per map, up to
the env's turn limit, in one jitted program, and returns who reached the goal [N, episodes].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.envs.frozenlake import dynamics as fl
from tree_rl.envs.frozenlake.env import FrozenLake
from tree_rl.envs.frozenlake.expert import best_move


def hint_move(state) -> jax.Array:
  """The hint's first word: Down or Up while the goal is on another row, then Left or Right
  (the first of the dynamics' `preferred_moves`)."""
  return fl.preferred_moves(state)[0]


def random_move(state, key) -> jax.Array:
  """A uniformly random move among those that keep the player on the map."""
  stays = jnp.stack([jnp.any(fl.neighbour(state, state.pos, a) != state.pos) for a in range(4)])
  return jax.random.choice(key, 4, p=stays / jnp.sum(stays)).astype(jnp.int32)


def local_move(state) -> jax.Array:
  """The first move of the local view's order whose cell is safe, else the hint's word."""
  moves = fl.preferred_moves(state)
  cells = fl.neighbour_cells(state)[moves]
  safe = (cells != fl.OBS_PAD) & (cells != fl.OBS_HOLE)
  return jnp.where(jnp.any(safe), moves[jnp.argmax(safe)], hint_move(state)).astype(jnp.int32)


MOVES = {"hint": lambda state, key: hint_move(state), "random": random_move,
         "local": lambda state, key: local_move(state),
         "expert": lambda state, key: best_move(state)}
RULES = tuple(MOVES)


def success(env: FrozenLake, states, rule: str, key, episodes: int = 1) -> np.ndarray:
  """bool [N, episodes]: whether `rule` reaches the goal of each map in batched initial `states`
  within the env's turn and move limits (one move per turn; episode e of map i draws its random
  moves from fold_in(fold_in(key, i), e))."""
  if rule not in RULES:
    raise ValueError(f"unknown rule {rule!r}; known: {RULES}")
  params = env.default_params
  turns = int(params.max_turns)
  pad = jnp.full((env.max_actions - 1,), fl.NOOP, jnp.int32)

  def episode(state, k):
    def turn(s, kt):
      k_move, k_step = jax.random.split(kt)
      action = jnp.concatenate([MOVES[rule](s, k_move)[None], pad])
      s, *_ = env.step(k_step, s, action, params)
      return s, None
    end, _ = jax.lax.scan(turn, state, jax.random.split(k, turns))
    return end.won

  def one_map(state, i):
    keys = jax.vmap(lambda e: jax.random.fold_in(jax.random.fold_in(key, i), e))(
        jnp.arange(episodes))
    return jax.vmap(lambda k: episode(state, k))(keys)

  n = jax.tree.leaves(states)[0].shape[0]
  return np.asarray(jax.jit(jax.vmap(one_map))(states, jnp.arange(n)))
