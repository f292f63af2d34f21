"""FrozenLake as a token env: presets, static set-up and the token methods the engine calls.

The dynamics are `dynamics`, the text `text`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from tree_rl.compile_cache import to_device
from tree_rl.envs.base import TokenEnv, pytree_hash
from tree_rl.envs.frozenlake.dynamics import (FrozenLakeParams, distance_to_goal, generate_map,
                                              init_state, observation_grid, transition)
from tree_rl.envs.frozenlake.text import FrozenLakeText

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
    # Long episodes for a CPU policy: maps of side 5..7 whose shortest safe path takes 4..16
    # moves (5.8 on average; the holes make the goal hint's straight walk fail on most of them),
    # one move per turn, 16 moves and 16 turns (docs/envs.md measures the rule baselines).
    "long": dict(params=dict(min_size=5, max_size=7, p_min=0.7, p_max=0.9, slippery=False,
                             max_steps=16, min_steps=4, max_turns=16, format_penalty=0.0),
                 max_size=7, max_actions=1, action_format="last_word"),
}


class FrozenLake(TokenEnv):
  """FrozenLake with static set-up (max map side, moves per turn, action text format, tokenizer).

  `FrozenLake(preset="rllm" | "ragen", tokenizer=None, **overrides)`; overrides may name any
  FrozenLakeParams field or max_size / max_actions / action_format / max_reply_tokens / goal_hint /
  local_view (goal_hint: every observation also says where the goal lies relative to the player,
  e.g. "Goal: 2 Down, 1 Right."; local_view: what each move leads onto, one line per move, e.g.
  "O:Down" -- aids for policies too small to read the grid; off in the presets; grid: the map
  drawn as text in every observation, on in the presets: off, a policy that reads only the
  hint and the local view gets short observations over long episodes).
  Token methods (`initial_prompt_tokens`, `observation_tokens`, `parse_action`) need a tokenizer.
  """

  name = "frozenlake"

  def __init__(self, preset: str = "rllm", tokenizer=None, max_reply_tokens: int = 64,
               max_reply_bytes: int | None = None, **overrides):
    if preset not in PRESETS:
      raise ValueError(f"unknown frozenlake preset {preset!r} (config.env.preset); known: {sorted(PRESETS)}")
    spec = PRESETS[preset]
    fields = {f.name for f in dataclasses.fields(FrozenLakeParams)}
    statics = {"max_size", "max_actions", "action_format", "goal_hint", "local_view", "grid"}
    unknown = set(overrides) - fields - statics
    if unknown:
      raise ValueError(f"unknown frozenlake option(s) {sorted(unknown)}; known: "
                       f"{sorted(fields | statics | {'max_reply_tokens', 'max_reply_bytes'})}")
    p = dict(spec["params"], **{k: v for k, v in overrides.items() if k in fields})
    self.max_size = int(overrides.get("max_size", max(spec["max_size"], p["max_size"])))
    self.max_actions = int(overrides.get("max_actions", spec["max_actions"]))
    self.action_format = overrides.get("action_format", spec["action_format"])
    self.goal_hint = bool(overrides.get("goal_hint", False))
    self.local_view = bool(overrides.get("local_view", False))
    self.grid = bool(overrides.get("grid", True))
    self.preset = preset
    _validate(p, self.max_size, self.max_actions, self.action_format)
    self._params = FrozenLakeParams(**{k: to_device(v) for k, v in p.items()})
    self._host_params = p
    self.max_reply_tokens = max_reply_tokens
    self.max_reply_bytes = max_reply_bytes
    self.tokenizer = tokenizer
    self.text = None if tokenizer is None else FrozenLakeText(self, tokenizer)

  def reply_byte_capacity(self, num_tokens: int) -> int:
    """Bytes of a reply the parser reads: max_reply_bytes, or 8 per token of the reply buffer."""
    return self.max_reply_bytes or 8 * num_tokens

  @property
  def default_params(self) -> FrozenLakeParams:
    return self._params

  def init_state(self, tiles, nrow, ncol, start):
    """A fresh state on a given map (tiles int[M, M] padded with PAD)."""
    return init_state(tiles, nrow, ncol, start)

  def reset(self, key, params=None):
    params = self._params if params is None else params
    tiles, size, start, _ = generate_map(key, params, self.max_size)
    state = init_state(tiles, size, size, start)
    return state, observation_grid(state)

  def step(self, key, state, action, params=None):
    return transition(key, state, action, self._params if params is None else params)

  def eval_groups(self, states):
    """The maps' side (a rectangle's longer one): evaluation reports success per side."""
    return "side", np.maximum(np.asarray(states.nrow), np.asarray(states.ncol))

  def state_key(self, state):
    """The anchor of a state: the agent's cell on its map (and whether the episode is over);
    move and turn counters are left out, so revisits of a cell share an anchor."""
    return pytree_hash((state.tiles, state.pos, state.done))

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
  # a path of min_steps must exist on the smallest map (corner to corner), or generation never ends
  if not 0 <= p.get("min_steps", 0) <= min(p["max_steps"], 2 * (p["min_size"] - 1)):
    raise ValueError(f"frozenlake min_steps must be in [0, min(max_steps, 2 * (min_size - 1))], "
                     f"got {p.get('min_steps')}")
  if p["max_turns"] < 1:
    raise ValueError(f"frozenlake max_turns must be >= 1, got {p['max_turns']}")
  if max_actions < 1:
    raise ValueError(f"frozenlake max_actions must be >= 1, got {max_actions}")
  if action_format not in ("last_word", "fenced", "answer_tag"):
    raise ValueError("frozenlake action_format must be 'last_word', 'fenced' or 'answer_tag', "
                     f"got {action_format!r}")
