"""Host reference for the tool-call env: the text parser, BM25, EM/F1 and the renderer, in plain
Python, against which the jitted versions are tested."""

from __future__ import annotations

import collections
import re

import numpy as np

from tree_rl.envs.toolcall.env import (HEADS, KIND_ANSWER, KIND_INVALID, KIND_SEARCH, ST_SEARCH,
                                       TAIL, ToolCallEnv, calls_text, host_words)

_BLOCK_RE = re.compile(rb"<(search|answer)>(.*?)</\1>", re.DOTALL)


def parse_reply_bytes(reply: bytes) -> tuple[int, bytes]:
  """Host reference: (KIND_*, content bytes) of the reply."""
  m = _BLOCK_RE.search(reply)
  if not m:
    return KIND_INVALID, b""
  return (KIND_SEARCH if m.group(1) == b"search" else KIND_ANSWER), m.group(2)


def host_bm25(facts: list[str], query: bytes, max_words: int, k1=1.2, b=0.75) -> np.ndarray:
  docs = [host_words(f.encode(), 10 ** 6) for f in facts]
  q = host_words(query, max_words)
  n = len(docs)
  avgdl = np.mean([len(d) for d in docs])
  scores = np.zeros(n)
  for term in q:
    df = sum(term in d for d in docs)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    for i, d in enumerate(docs):
      tf = d.count(term)
      scores[i] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
  return scores


def host_em_f1(pred: bytes, gold: str, max_words: int) -> tuple[bool, float]:
  p, g = host_words(pred, max_words), host_words(gold.encode(), max_words)
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  if common == 0:
    return p == g, 0.0
  prec, rec = common / len(p), common / len(g)
  return p == g, 2 * prec * rec / (prec + rec)


def initial_prompt_text(env: ToolCallEnv, state, params=None) -> str:
  params = env.default_params if params is None else params
  left = int(params.max_calls) - int(state.calls)
  return (env.markup.prompt_prefix + env.question_content(int(state.question)) + calls_text(left)
          + env.markup.gen_suffix)


def observation_text(env: ToolCallEnv, state, turn_closed: bool, params=None) -> str:
  params = env.default_params if params is None else params
  status = int(state.status)
  out = env.markup.between_closed if turn_closed else env.markup.between_open
  out += HEADS[status]
  if status == ST_SEARCH:
    if env.tool is None:
      out += "".join(env.kb.facts[int(f)] + "\n" for f, s in zip(state.facts, state.shown) if s)
    else:
      out += env.tokenizer.decode(np.asarray(state.ext_tokens)[:int(state.ext_len)])
    out += TAIL
  left = int(params.max_calls) - int(state.calls)
  return out + calls_text(left) + env.markup.gen_suffix
