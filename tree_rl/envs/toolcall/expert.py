"""Tool-call expert: search the needed facts hop by hop, then answer.

The next search is the query of the first needed fact that no search has shown yet (the KB's
`Question.queries`); once all are shown, or no tool calls are left, it answers with the gold
answer. With probability `epsilon` a turn is a distractor instead: the first-hop query of
another question, or another question's answer.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.envs.toolcall import env as tc


class ToolCallExpert:
  """`reply_texts`: every distinct `<search>query</search>` of every hop and `<answer>..</answer>`."""

  def __init__(self, env, epsilon: float):
    qs = env.questions
    rows: dict[str, int] = {}   # one row per distinct text, so a different row is a different reply
    row = lambda text: rows.setdefault(text, len(rows))
    search = np.full((len(qs), tc.MAX_HOPS), -1, np.int32)
    for i, q in enumerate(qs):
      for h, query in enumerate(q.queries):
        search[i, h] = row(f"<search>{query}</search>")
    answer = np.array([row(f"<answer>{q.answer}</answer>") for q in qs], np.int32)
    self.reply_texts = tuple(rows)
    self.search_rows, self.answer_rows = search, answer
    self.needed = env.needed
    self.num_questions = len(qs)
    self.epsilon = epsilon

  def act(self, key, state, params):
    search, answer = jnp.asarray(self.search_rows), jnp.asarray(self.answer_rows)
    q = state.question
    want = (self.needed[q] >= 0) & ~state.found
    hop = jnp.argmax(want)
    do_search = jnp.any(want) & (state.calls < params.max_calls)
    intended = jnp.where(do_search, search[q, hop], answer[q])
    k_noise, k_other = jax.random.split(key)
    other = (q + 1 + jax.random.randint(k_other, (), 0, max(self.num_questions - 1, 1))
             ) % self.num_questions
    distractor = jnp.where(do_search, search[other, 0], answer[other])
    explore = jax.random.uniform(k_noise) < self.epsilon
    row = jnp.where(explore, distractor, intended).astype(jnp.int32)
    return row, row != intended, intended.astype(jnp.int32)

  def success(self, state):
    return state.correct

