"""FrozenLake as text: host reference renderer/parser and the jitted token versions.

Observation text (the user message):
    [instructions on the first turn | a status line after a turn]
    the grid, one row per line, cells separated by spaces:
      P player, _ frozen, O hole, G goal, X player in a hole, V player on the goal
    with goal_hint: where the goal lies from the player, e.g. "Goal: 2 Down, 1 Right." ("Goal: here.")
    "Remaining steps: N"
    with local_view, four last lines: what each move leads onto, the moves towards the goal
      first (vertical, then horizontal: the hint's order), then the others (Down, Right, Up,
      Left), e.g. "O:Down", "_:Right", "G:Up", "#:Left" (# = the map's edge). Each line is 4
      tokens of the built-in tokenizer, the cell before the move word (so, under causal
      attention, the move word's token sees its cell; the word is the very token a reply uses),
      and the lines end the message, so each sits at a fixed distance from the reply: a policy
      too small to find its neighbours in the grid text reads them here

Action rules (on the reply's UTF-8 bytes, the first `env.reply_byte_capacity(T)` of a T-token reply:
`max_reply_bytes` if set, else 8 bytes per token):
  * last_word (rLLM preset): the action is the LAST occurrence of one of the words `Left`, `Down`,
    `Right`, `Up` (exact case) that is not part of a longer ASCII-letter word; none -> invalid.
    A reply ending in a fenced block ```Up``` therefore gives Up.
  * fenced (option, rLLM's own rule): the content of the last complete fenced block (the last
    match of the regex ```(.*?)```), stripped of ASCII whitespace, must be exactly one action word.
  * answer_tag (RAGEN preset): the leftmost complete `<answer>...</answer>` (regex
    `<answer>(.*?)</answer>`), split on `||`; the first `max_actions` parts are executed in order
    and each, stripped of ASCII whitespace, must be exactly one action word; parts beyond
    `max_actions` are ignored. No block, an empty part or a wrong word -> invalid turn.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.envs.frozenlake import dynamics as fl
from tree_rl.envs import text as tx

CELL_CHARS = {fl.OBS_PAD: "", fl.OBS_FROZEN: "_", fl.OBS_HOLE: "O", fl.OBS_GOAL: "G",
              fl.OBS_PLAYER: "P", fl.OBS_PLAYER_IN_HOLE: "X", fl.OBS_PLAYER_ON_GOAL: "V"}
NEAR_CHARS = {fl.OBS_PAD: "#", fl.OBS_FROZEN: "_", fl.OBS_HOLE: "O", fl.OBS_GOAL: "G"}
STATUS_TEXT = {fl.ST_START: "", fl.ST_MOVED: "", fl.ST_INVALID: "Invalid action. You did not move.\n",
               fl.ST_HOLE: "You fell into a hole.\n", fl.ST_GOAL: "You reached the goal.\n",
               fl.ST_OUT_OF_STEPS: "No steps remaining.\n"}
INTRO = ("You are on a frozen lake grid. Reach the goal G without falling into a hole O. "
         "You are the player P; _ is frozen ice.\n")
FIRST, MIDDLE, LAST, ONLY = range(4)   # position of a cell in its row
_NUMBERS = 100


def instructions(action_format: str, max_actions: int) -> str:
  if action_format == "last_word":
    return INTRO + "Move with one word: Up, Down, Left or Right. Your last such word is your move.\n\n"
  if action_format == "fenced":
    return INTRO + "End your reply with your move in a fenced block: ```Up```, ```Down```, ```Left``` or ```Right```.\n\n"
  return (INTRO + f"Answer with up to {max_actions} moves, e.g. <answer>Left || Up</answer>. "
          "Moves: Up, Down, Left, Right.\n\n")


def hint_text(down: int, right: int) -> str:
  """Where the goal lies from the player: "Goal: 2 Down, 1 Right.\n", "Goal: here.\n"."""
  parts = [f"{abs(n)} {word}" for n, word in ((down, "Down" if down > 0 else "Up"),
                                              (right, "Right" if right > 0 else "Left")) if n]
  return "Goal: " + (", ".join(parts) if parts else "here") + ".\n"


def near_text(move: int, code: int) -> str:
  """The local view's line for one move, e.g. "\nO:Down" (Down leads into a hole)."""
  return f"\n{NEAR_CHARS[code]}:{fl.ACTION_NAMES[move]}"


def steps_text(n: int) -> str:
  return f"Remaining steps: {n}"


def cell_text(code: int, where: int) -> str:
  ch = CELL_CHARS[code]
  if not ch:
    return ""
  return {FIRST: ch, MIDDLE: " " + ch, LAST: " " + ch + "\n", ONLY: ch + "\n"}[where]


# ---------------------------------------------------------------- host reference

def grid_text(grid: np.ndarray, nrow: int, ncol: int) -> str:
  return "".join(" ".join(CELL_CHARS[int(c)] for c in grid[r, :ncol]) + "\n" for r in range(nrow))


def host_grid(state) -> np.ndarray:
  """OBS_* codes of the map with the player drawn on it (numpy)."""
  tiles = np.asarray(state.tiles)
  grid = np.array([fl.OBS_FROZEN, fl.OBS_HOLE, fl.OBS_GOAL, fl.OBS_PAD])[tiles]
  r, c = (int(x) for x in np.asarray(state.pos))
  grid[r, c] = {fl.HOLE: fl.OBS_PLAYER_IN_HOLE, fl.GOAL: fl.OBS_PLAYER_ON_GOAL}.get(int(tiles[r, c]),
                                                                                   fl.OBS_PLAYER)
  return grid


def host_near(state) -> list[tuple[int, int]]:
  """(move, OBS_* code of the cell it leads onto; OBS_PAD off the map) in the local view's order:
  the moves towards the goal (vertical first), then Down, Right, Up, Left."""
  tiles = np.asarray(state.tiles)
  r, c = (int(x) for x in np.asarray(state.pos))
  gr, gc = (int(x) for x in np.argwhere(tiles == fl.GOAL)[0])
  first = ([fl.DOWN if gr > r else fl.UP] if gr != r else []) + (
      [fl.RIGHT if gc > c else fl.LEFT] if gc != c else [])
  out = []
  for a in first + [a for a in (fl.DOWN, fl.RIGHT, fl.UP, fl.LEFT) if a not in first]:
    nr, nc = r + (a == fl.DOWN) - (a == fl.UP), c + (a == fl.RIGHT) - (a == fl.LEFT)
    inside = 0 <= nr < int(state.nrow) and 0 <= nc < int(state.ncol)
    out.append((a, [fl.OBS_FROZEN, fl.OBS_HOLE, fl.OBS_GOAL][tiles[nr, nc]] if inside else fl.OBS_PAD))
  return out


def content_text(state, params, head: str, goal_hint: bool = False, local_view: bool = False,
                 grid: bool = True) -> str:
  remaining = max(int(params.max_steps) - int(state.steps), 0)
  near = "".join(near_text(*mc) for mc in host_near(state)) if local_view else ""
  hint = ""
  if goal_hint:
    goal = np.argwhere(np.asarray(state.tiles) == fl.GOAL)[0]
    down, right = (int(g) - int(p) for g, p in zip(goal, np.asarray(state.pos)))
    hint = hint_text(down, right)
  drawn = grid_text(host_grid(state), int(state.nrow), int(state.ncol)) if grid else ""
  return head + drawn + hint + steps_text(remaining) + near


def initial_prompt_text(env, markup: tx.ChatMarkup, state, params) -> str:
  head = instructions(env.action_format, env.max_actions)
  body = content_text(state, params, head, env.goal_hint, env.local_view, env.grid)
  return markup.prompt_prefix + body + markup.gen_suffix


def observation_text(markup: tx.ChatMarkup, state, params, turn_closed: bool,
                     goal_hint: bool = False, local_view: bool = False, grid: bool = True) -> str:
  between = markup.between_closed if turn_closed else markup.between_open
  head = STATUS_TEXT[int(state.status)]
  return (between + content_text(state, params, head, goal_hint, local_view, grid)
          + markup.gen_suffix)


_WORD_RE = re.compile(rb"(?<![A-Za-z])(Left|Down|Right|Up)(?![A-Za-z])")
_ANSWER_RE = re.compile(rb"<answer>(.*?)</answer>", re.DOTALL)
_FENCE_RE = re.compile(rb"```(.*?)```", re.DOTALL)


def parse_action_bytes(reply: bytes, action_format: str, max_actions: int) -> list[int]:
  """The host reference parser: int list of length max_actions (see the module docstring)."""
  names = [n.encode() for n in fl.ACTION_NAMES]
  out = [fl.NOOP] * max_actions
  if action_format == "last_word":
    found = _WORD_RE.findall(reply)
    out[0] = names.index(found[-1]) if found else fl.INVALID
    return out
  if action_format == "fenced":
    blocks = _FENCE_RE.findall(reply)
    word = blocks[-1].strip() if blocks else None
    out[0] = names.index(word) if word in names else fl.INVALID
    return out
  m = _ANSWER_RE.search(reply)
  if not m:
    return [fl.INVALID] + out[1:]
  for k, part in enumerate(m.group(1).split(b"||")[:max_actions]):
    word = part.strip()
    if word not in names:
      return [fl.INVALID] + [fl.NOOP] * (max_actions - 1)
    out[k] = names.index(word)
  return out


# ---------------------------------------------------------------- device

class FrozenLakeText:
  """Token tables for one (env, tokenizer) pair; methods are jittable and vmappable."""

  def __init__(self, env, tokenizer):
    self.env, self.tokenizer = env, tokenizer
    self.markup = tx.ChatMarkup.from_tokenizer(tokenizer)
    self.pad_id = tokenizer.pad_id
    m = self.markup
    wide = [m.prompt_prefix, m.between_open, m.between_closed, m.gen_suffix,
            instructions(env.action_format, env.max_actions)]
    wide += [STATUS_TEXT[s] for s in range(len(STATUS_TEXT))]
    self._status0 = 5
    self.wide = tx.FragmentTable.build(tokenizer, wide, self.pad_id)
    codes = sorted(CELL_CHARS)
    cells = [cell_text(c, w) for c in codes for w in range(4)]
    self.cells = tx.FragmentTable.build(tokenizer, cells, self.pad_id)
    self.numbers = tx.FragmentTable.build(tokenizer, [steps_text(n) for n in range(_NUMBERS)],
                                          self.pad_id)
    self.bytes = tx.ByteTable.from_tokenizer(tokenizer)
    m = env.max_size
    offsets = [(d, r) for d in range(1 - m, m) for r in range(1 - m, m)]   # index (d+m-1)*(2m-1)+r+m-1
    self.hints = tx.FragmentTable.build(tokenizer, [hint_text(d, r) for d, r in offsets], self.pad_id)
    # index move * 4 + OBS code (OBS_PAD..OBS_GOAL are 0..3)
    self.near = tx.FragmentTable.build(tokenizer, [near_text(a, c) for a in range(4) for c in range(4)],
                                       self.pad_id)
    wl = self.wide.lengths
    grid_cap = env.max_size * env.max_size * self.cells.max_length() if env.grid else 0
    tail = self.numbers.max_length() + int(wl[3]) + (self.hints.max_length() if env.goal_hint else 0)
    tail += 4 * self.near.max_length() if env.local_view else 0
    self.prompt_capacity = int(wl[0] + wl[4]) + grid_cap + tail
    self.obs_capacity = int(max(wl[1], wl[2]) + wl[self._status0:].max()) + grid_cap + tail

  def _grid_groups(self, state):
    grid = fl.observation_grid(state)
    msz = grid.shape[0]
    col = jnp.arange(msz)[None, :]
    where = jnp.where(state.ncol == 1, ONLY, jnp.where(col == 0, FIRST,
                      jnp.where(col == state.ncol - 1, LAST, MIDDLE)))
    where = jnp.broadcast_to(where, grid.shape)
    idx = jnp.where(grid == fl.OBS_PAD, fl.OBS_PAD * 4, grid * 4 + where).reshape(-1)
    cells = jnp.asarray(self.cells.tokens)[idx], jnp.asarray(self.cells.lengths)[idx]
    return cells

  def _render(self, state, params, head_ids, capacity):
    wt, wl = jnp.asarray(self.wide.tokens), jnp.asarray(self.wide.lengths)
    head_ids = jnp.stack(head_ids)
    remaining = jnp.clip(params.max_steps - state.steps, 0, _NUMBERS - 1)
    groups = [(wt[head_ids], wl[head_ids])]
    if self.env.grid:
      groups.append(self._grid_groups(state))
    if self.env.goal_hint:
      m = self.env.max_size
      d = fl.goal_position(state) - state.pos + (m - 1)
      i = d[0] * (2 * m - 1) + d[1]
      groups.append((jnp.asarray(self.hints.tokens)[i][None], jnp.asarray(self.hints.lengths)[i][None]))
    groups.append((jnp.asarray(self.numbers.tokens)[remaining][None],
                   jnp.asarray(self.numbers.lengths)[remaining][None]))
    if self.env.local_view:
      moves = fl.preferred_moves(state)
      i = moves * 4 + fl.neighbour_cells(state)[moves]
      groups.append((jnp.asarray(self.near.tokens)[i], jnp.asarray(self.near.lengths)[i]))
    groups.append((wt[3][None], wl[3][None]))
    return tx.concat_segments(groups, capacity, self.pad_id)

  def initial_prompt_tokens(self, state, params):
    return self._render(state, params, [jnp.int32(0), jnp.int32(4)], self.prompt_capacity)

  def observation_tokens(self, state, turn_closed, params):
    between = jnp.where(turn_closed, 2, 1).astype(jnp.int32)
    return self._render(state, params, [between, self._status0 + state.status], self.obs_capacity)

  def parse_action(self, tokens, length):
    env = self.env
    buf, n = tx.tokens_to_bytes(self.bytes, tokens, length, env.reply_byte_capacity(tokens.shape[-1]))
    if env.action_format == "last_word":
      return self._parse_last_word(buf, n)
    if env.action_format == "fenced":
      return self._parse_fenced(buf, n)
    return self._parse_answer(buf, n)

  def _word_at(self, buf, n):
    """int32[N]: index of the action word starting at each position (-1 if none)."""
    out = jnp.full(buf.shape, -1, jnp.int32)
    for a, name in enumerate(fl.ACTION_NAMES):
      out = jnp.where(tx.match_at(buf, n, name.encode()), a, out)
    return out

  def _parse_last_word(self, buf, n):
    size = buf.shape[0]
    pos = jnp.arange(size)
    letter = tx.is_letter(buf)
    before_ok = jnp.concatenate([jnp.ones((1,), bool), ~letter[:-1]])
    word = self._word_at(buf, n)
    word_len = jnp.array([len(x) for x in fl.ACTION_NAMES], jnp.int32)[jnp.maximum(word, 0)]
    after = jnp.clip(pos + word_len, 0, size - 1)
    after_ok = (pos + word_len >= n) | ~letter[after]
    hit = (word >= 0) & before_ok & after_ok
    last = jnp.max(jnp.where(hit, pos, -1))
    action = jnp.where(last >= 0, word[jnp.maximum(last, 0)], fl.INVALID)
    return jnp.full((self.env.max_actions,), fl.NOOP, jnp.int32).at[0].set(action)

  def _single_word(self, buf, start, end):
    """The action word that buf[start:end] is, once stripped of whitespace; INVALID otherwise."""
    size = buf.shape[0]
    f, l = tx.strip_span(buf, start, end)
    w = self._word_at(buf, jnp.int32(size))[jnp.clip(f, 0, size - 1)]
    lens = jnp.array([len(x) for x in fl.ACTION_NAMES], jnp.int32)
    return jnp.where((w >= 0) & (l - f == lens[jnp.maximum(w, 0)]), w, fl.INVALID)

  def _parse_fenced(self, buf, n):
    size = buf.shape[0]
    pos = jnp.arange(size)
    tick = (buf == ord("`")) & (pos < n)
    run_start = jax.lax.cummax(jnp.where(tick & ~jnp.concatenate([jnp.zeros((1,), bool), tick[:-1]]),
                                         pos, 0))
    # non-overlapping leftmost occurrences of ``` (as a regex scan finds them); pairs (0,1), (2,3), ...
    fence = tx.match_at(buf, n, b"```") & ((pos - run_start) % 3 == 0)
    rank = jnp.cumsum(fence) - 1
    pairs = jnp.sum(fence) // 2
    close_rank = 2 * pairs - 1
    open_pos = jnp.min(jnp.where(fence & (rank == close_rank - 1), pos, size))
    close_pos = jnp.min(jnp.where(fence & (rank == close_rank), pos, size))
    action = jnp.where(pairs > 0, self._single_word(buf, open_pos + 3, close_pos), fl.INVALID)
    return jnp.full((self.env.max_actions,), fl.NOOP, jnp.int32).at[0].set(action)

  def _parse_answer(self, buf, n):
    a_max = self.env.max_actions
    size = buf.shape[0]
    pos = jnp.arange(size)
    found, _, s, e = tx.first_block(buf, n, b"<answer>", b"</answer>")
    bar = (buf == ord("|")) & (pos >= s) & (pos < e)
    run_start = jax.lax.cummax(jnp.where(bar & ~jnp.concatenate([jnp.zeros((1,), bool), bar[:-1]]),
                                         pos, 0))
    pair = bar & jnp.concatenate([bar[1:], jnp.zeros((1,), bool)]) & (pos + 2 <= e)
    sep = pair & ((pos - run_start) % 2 == 0)
    rank = jnp.cumsum(sep) - 1
    n_sep = jnp.sum(sep)
    sep_pos = jnp.stack([jnp.min(jnp.where(sep & (rank == k), pos, e)) for k in range(a_max)])
    word = self._word_at(buf, jnp.int32(size))
    word_len = jnp.array([len(x) for x in fl.ACTION_NAMES], jnp.int32)
    actions, ok = [], found
    for k in range(a_max):
      start = s if k == 0 else sep_pos[k - 1] + 2
      f, l = tx.strip_span(buf, start, sep_pos[k])
      w = word[jnp.clip(f, 0, size - 1)]
      valid = (w >= 0) & (l - f == word_len[jnp.maximum(w, 0)])
      exists = n_sep >= k
      ok = ok & (valid | ~exists)
      actions.append(jnp.where(exists, w, fl.NOOP))
    actions = jnp.stack(actions).astype(jnp.int32)
    bad = jnp.full((a_max,), fl.NOOP, jnp.int32).at[0].set(fl.INVALID)
    return jnp.where(ok, actions, bad)
