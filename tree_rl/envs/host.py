"""Environments whose state lives outside JAX: a workspace, a process, a browser.

A `HostEnv` keeps its state on the host behind integer handles; the rollout engine calls it in
batches at turn boundaries (where it already meets the host once per turn):

    handles, observations = env.reset(tasks)                         # task ids -> handles, text
    observations, rewards, done, info = env.step(handles, actions)   # in place; actions: reply text
    children = env.fork(handles, counts)                             # independent copies
    env.release(handles)

A subclass fills in those four, `num_tasks`-style task bookkeeping of its own, `max_turns` and
the token capacities `prompt_capacity` / `obs_capacity`; `info_fields` names the float scalars
`step` reports per row (`info[name]`, shape [B]) that scorers read on device.

On device a node's state is a `HostState`: its handle, task, turn count, done flag, the
`info_fields` values and a `key` (equal keys: the agent faces the same situation; `step` may
report it as `info["state_key"]`, int32, else every step is a new situation). The rollout tree
stores it like any env state, so process scorers, state keys and budgets work unchanged; only
the engine touches handles. It forks a node's handle where it forks the node's KV pages, steps
the child's copy in place, and releases a handle when it frees the node's pages (and every
handle on an error or Ctrl-C), so a rollout leaves nothing behind.

Text and tokens: `prompt_tokens` / `observation_tokens` render text with the tokenizer's chat
markup into fixed capacities (content cut to fit, ending in "[cut]"; the generation prompt always
kept);
`reply_text` decodes a reply for `step`.
"""

from __future__ import annotations

import abc
import zlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.envs.text import ChatMarkup


@struct.dataclass
class HostState:
  handle: jax.Array   # int32 host handle (-1: none yet)
  task: jax.Array     # int32 task id
  turns: jax.Array    # int32 turns taken
  done: jax.Array     # bool
  info: jax.Array     # float32 [len(info_fields)] the last step's info scalars
  key: jax.Array      # int32 situation key


@struct.dataclass
class HostParams:
  max_turns: int = struct.field(pytree_node=False, default=8)


@struct.dataclass
class HostStep:
  """A turn's host results for the engine's rows (arrays [W, ...])."""
  handle: jax.Array
  reward: jax.Array
  done: jax.Array
  info: jax.Array
  key: jax.Array
  obs: jax.Array
  obs_len: jax.Array
  action: jax.Array    # int32 hash of the reply text
  tool_calls: jax.Array


CUT = "\n[cut]"   # ends a message cut to its token capacity


def text_hash(text: str) -> int:
  """An int32 hash of a text (equal texts hash equal)."""
  return zlib.crc32(text.encode("utf-8")) & 0x7FFFFFFF


class HostEnv(abc.ABC):
  """A batched environment over host state (see the module docstring)."""

  name: str = ""
  has_tools: bool = True
  info_fields: tuple[str, ...] = ()
  prompt_capacity: int = 256
  obs_capacity: int = 256

  def __init__(self, tokenizer, max_turns: int):
    self.tokenizer = tokenizer
    self.max_turns = int(max_turns)
    self.markup = ChatMarkup.from_tokenizer(tokenizer)
    self._enc = {}

  # ------------------------------------------------------------------ what a subclass fills in
  @abc.abstractmethod
  def reset(self, tasks: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """New episodes of task ids `tasks` [B] -> (handles int [B], first user messages)."""

  @abc.abstractmethod
  def step(self, handles: np.ndarray, actions: Sequence[str]
           ) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Act in place -> (observations, rewards float [B], done bool [B], info {name: [B]})."""

  @abc.abstractmethod
  def fork(self, handles: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`counts[i]` independent copies of handle `handles[i]` as it is now, in order."""

  @abc.abstractmethod
  def release(self, handles: np.ndarray) -> None:
    """Free the state behind `handles`."""

  # ------------------------------------------------------------------ optional hooks
  def start_keys(self, handles: np.ndarray) -> np.ndarray:
    """Situation keys (int32 [B]) of freshly reset episodes: what `step` would report as
    `info["state_key"]` for the same situation. Default: 0."""
    return np.zeros((len(handles),), np.int32)

  def action_key(self, reply: str) -> str:
    """The part of a reply that names its action (equal keys: the same action, for repeated-
    action counts). Default: the whole text."""
    return reply

  # ------------------------------------------------------------------ what the engine calls
  @property
  def default_params(self) -> HostParams:
    return HostParams(max_turns=self.max_turns)

  def initial_states(self, tasks) -> HostState:
    """Device states [B] of episodes of task ids `tasks` not started yet (a task set's states)."""
    tasks = jnp.asarray(tasks, jnp.int32)
    b = tasks.shape[0]
    return HostState(handle=jnp.full((b,), -1, jnp.int32), task=tasks,
                     turns=jnp.zeros((b,), jnp.int32), done=jnp.zeros((b,), bool),
                     info=jnp.zeros((b, len(self.info_fields)), jnp.float32),
                     key=jnp.zeros((b,), jnp.int32))

  def state_example(self) -> HostState:
    return jax.tree.map(lambda x: x[0], self.initial_states(np.zeros((1,), np.int32)))

  def state_key(self, state: HostState) -> jax.Array:
    return state.key

  def info(self, state: HostState, name: str) -> jax.Array:
    """The `info_fields` value `name` of a device state (any leading shape)."""
    return state.info[..., self.info_fields.index(name)]

  def child_state(self, parent: HostState, step: HostStep) -> HostState:
    """The device state after a turn from `parent` (jittable, rows [W])."""
    return HostState(handle=step.handle, task=parent.task, turns=parent.turns + 1, done=step.done,
                     info=step.info, key=step.key)

  def reply_text(self, ids: Sequence[int]) -> str:
    """A reply's text without its trailing end-of-turn token."""
    ids = list(ids)
    if ids and ids[-1] == self.tokenizer.end_of_turn_id:
      ids = ids[:-1]
    return self.tokenizer.decode(ids)

  def _ids(self, text: str) -> list[int]:
    if text not in self._enc:
      self._enc[text] = self.tokenizer.encode(text)
    return self._enc[text]

  def _render(self, head: str, contents: Sequence[str], capacity: int) -> tuple[np.ndarray, np.ndarray]:
    tail, cut = self._ids(self.markup.gen_suffix), self._ids(CUT)
    room = capacity - len(tail)
    out = np.full((len(contents), capacity), self.tokenizer.pad_id, np.int32)
    lens = np.zeros((len(contents),), np.int32)
    for i, text in enumerate(contents):
      ids = self._ids(head) + self.tokenizer.encode(text)
      if len(ids) > room:   # cut, and say so
        ids = ids[:room - len(cut)] + cut
      ids = ids + tail
      out[i, :len(ids)], lens[i] = ids, len(ids)
    return out, lens

  def prompt_tokens(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The first user messages with chat markup: (int32 [B, prompt_capacity], lengths)."""
    return self._render(self.markup.prompt_prefix, texts, self.prompt_capacity)

  def observation_tokens(self, texts: Sequence[str], closed: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Observations as later user turns (the agent turn closed unless `closed`):
    (int32 [B, obs_capacity], lengths)."""
    out = np.full((len(texts), self.obs_capacity), self.tokenizer.pad_id, np.int32)
    lens = np.zeros((len(texts),), np.int32)
    for shut, head in ((False, self.markup.between_open), (True, self.markup.between_closed)):
      rows = [i for i in range(len(texts)) if bool(closed[i]) == shut]
      if rows:
        out[rows], lens[rows] = self._render(head, [texts[i] for i in rows], self.obs_capacity)
    return out, lens


def is_host_env(env) -> bool:
  return isinstance(env, HostEnv)
