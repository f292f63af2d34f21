"""Guess-the-number on device: a secret in 0..max_secret, one guess a turn, told higher or lower.

A guess is a number; INVALID (a reply without a digit) is a turn that tells nothing. The episode
ends on the right guess (reward 1) or after `max_turns` turns (reward 0). `low` / `high` are the
numbers the answers so far leave possible (a heuristic reads how far they have narrowed).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

INVALID = -1
# the answer to the last turn, shown in the observation
START, HIGHER, LOWER, CORRECT, NO_DIGIT = range(5)


@struct.dataclass
class GuessParams:
  max_secret: Any = 9     # the secret is drawn from 0..max_secret
  max_turns: Any = 5      # guesses per episode


@struct.dataclass
class GuessState:
  secret: jax.Array       # int32
  low: jax.Array          # int32: the smallest number the answers so far allow
  high: jax.Array         # int32: the largest
  turns: jax.Array        # int32: turns taken
  answer: jax.Array       # int32: START / HIGHER / LOWER / CORRECT / NO_DIGIT
  done: jax.Array         # bool
  won: jax.Array          # bool


def init_state(secret, max_secret) -> GuessState:
  """A fresh episode with this secret."""
  i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
  return GuessState(secret=i32(secret), low=i32(0), high=i32(max_secret), turns=i32(0),
                    answer=i32(START), done=jnp.bool_(False), won=jnp.bool_(False))


def reset(key, params: GuessParams) -> GuessState:
  return init_state(jax.random.randint(key, (), 0, params.max_secret + 1), params.max_secret)


def transition(state: GuessState, guess, params: GuessParams):
  """One turn -> (state, answer, reward, done, info); a done state stays put with reward 0."""
  guess = jnp.asarray(guess, jnp.int32)
  valid = (guess >= 0) & (guess <= params.max_secret)
  won = valid & (guess == state.secret)
  up, down = valid & (guess < state.secret), valid & (guess > state.secret)
  answer = jnp.where(won, CORRECT, jnp.where(up, HIGHER, jnp.where(down, LOWER, NO_DIGIT)))
  turns = state.turns + 1
  new = state.replace(low=jnp.where(up, jnp.maximum(state.low, guess + 1), state.low),
                      high=jnp.where(down, jnp.minimum(state.high, guess - 1), state.high),
                      turns=turns, answer=answer.astype(jnp.int32), won=won,
                      done=won | (turns >= params.max_turns))
  new = jax.tree.map(lambda old, x: jnp.where(state.done, old, x), state, new)
  reward = jnp.where(state.done, 0.0, won.astype(jnp.float32))
  return new, new.answer, reward, new.done, {"won": new.won, "turns": new.turns}
