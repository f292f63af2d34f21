"""Multi-hop QA with a search tool, on device: BM25 retrieval, exact-match reward, tool-call count.

A reply's action is its leftmost complete `<search>...</search>` or `<answer>...</answer>` block
(regex `<(search|answer)>(.*?)</\\1>` on the first `reply_byte_capacity(T)` UTF-8 bytes of a T-token reply); no block is an
invalid turn (reward `format_penalty`). Text is compared as words: maximal runs of ASCII
letters/digits (or non-ASCII bytes), lower-cased, at most `max_words` of them (hashed on device).

* search: if tool calls remain, the top `top_k` facts by BM25 (query words vs fact words; facts with
  score 0 are not shown) become the observation and the call is counted; otherwise the observation
  says no calls are left and nothing is counted.
* answer: ends the episode; reward 1 when the answer's words equal the gold answer's words, else 0;
  `info["f1"]` is the word-level F1.
The episode also ends after `max_turns` turns.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from tree_rl.envs import text as tx
from tree_rl.envs.base import TokenEnv, pytree_hash
from tree_rl.envs.toolcall.kb import KnowledgeBase, generate_kb

KIND_INVALID, KIND_SEARCH, KIND_ANSWER = 0, 1, 2
ST_START, ST_SEARCH, ST_INVALID, ST_NO_CALLS, ST_ANSWERED, ST_NO_RESULTS = range(6)
HEADS = {ST_START: "", ST_SEARCH: "<information>\n",
         ST_INVALID: "Invalid format. Reply with <search>query</search> or <answer>name</answer>.\n",
         ST_NO_CALLS: "No tool calls left. Answer with <answer>name</answer>.\n",
         ST_ANSWERED: "Answer received.\n", ST_NO_RESULTS: "<information>\nNo results.\n"}
TAIL = "</information>\n"
MAX_HOPS = 3
_NUMBERS = 100


def instructions(top_k: int) -> str:
  return ("Answer the question. Search the knowledge base with <search>query</search>; each search "
          f"returns up to {top_k} facts. Give the final answer as <answer>name</answer>.\n")


def calls_text(n: int) -> str:
  return f"Tool calls left: {n}"


@struct.dataclass
class ToolCallParams:
  max_calls: Any = 4          # tool calls per episode
  max_turns: Any = 6          # agent turns per episode
  format_penalty: Any = -0.1  # reward of a turn with no complete <search>/<answer> block
  k1: Any = 1.2               # BM25 term-frequency saturation
  b: Any = 0.75               # BM25 length normalisation


@struct.dataclass
class ToolAction:
  kind: jax.Array             # KIND_*
  words: jax.Array            # uint32[max_words, 2] word hashes of the query / answer
  n_words: jax.Array
  text: jax.Array             # int32[max_text_bytes] the query / answer bytes (for external tools)
  text_len: jax.Array


@struct.dataclass
class ToolCallState:
  question: jax.Array         # index into the env's question split
  turns: jax.Array
  calls: jax.Array            # tool calls made (the budget the papers compare at)
  done: jax.Array
  answered: jax.Array
  correct: jax.Array
  f1: jax.Array
  status: jax.Array           # ST_* of the last turn
  facts: jax.Array            # int32[top_k] facts of the last search
  shown: jax.Array            # bool[top_k]
  found: jax.Array            # bool[MAX_HOPS] needed facts retrieved so far
  ext_tokens: jax.Array       # int32[C] last external-tool result (C = 0 without one)
  ext_len: jax.Array


class ToolCallEnv(TokenEnv):
  """`ToolCallEnv(tokenizer, split="train", kb=None, data_seed=42, top_k=3, tool=None, **options)`.

  `kb` defaults to the one prepared in `data_dir` (TFDS, `qa.ToolcallQa`) when given,
  else `generate_kb(data_seed, **kb_options)`; options may name ToolCallParams fields,
  generate_kb arguments, or max_words / max_reply_tokens / max_reply_bytes / max_text_bytes.
  `tool`: an ExternalTool replacing BM25 retrieval over the KB.
  """

  has_tools = True

  name = "toolcall"
  _KB_KEYS = ("num_people", "num_cities", "num_countries", "num_companies", "num_test", "min_hops",
              "max_hops")

  def __init__(self, tokenizer=None, split: str = "train", kb: KnowledgeBase | None = None,
               data_seed: int = 42, data_dir: str = "", top_k: int = 3, tool=None, max_words: int = 16,
               max_reply_tokens: int = 64, max_reply_bytes: int | None = None,
               max_text_bytes: int = 128, preset: str = "default", **options):
    if tokenizer is None:
      raise ValueError("the toolcall env needs a tokenizer: make('toolcall', tokenizer=...)")
    if preset != "default":
      raise ValueError(f"unknown toolcall preset {preset!r} (config.env.preset); known: default")
    fields = {f.name for f in dataclasses.fields(ToolCallParams)}
    unknown = set(options) - fields - set(self._KB_KEYS)
    if unknown:
      raise ValueError(f"unknown toolcall option(s) {sorted(unknown)}; known: "
                       f"{sorted(fields | set(self._KB_KEYS))}")
    if top_k < 1:
      raise ValueError(f"toolcall top_k must be >= 1, got {top_k}")
    if kb is None and data_dir:
      from tree_rl.envs.toolcall.qa import load_kb
      kb = load_kb(data_dir)
    self.kb = kb or generate_kb(data_seed, **{k: options[k] for k in self._KB_KEYS if k in options})
    self.questions = self.kb.split(split)
    self.split, self.top_k, self.tool = split, top_k, tool
    self.max_words, self.max_text_bytes = max_words, max_text_bytes
    self.max_reply_tokens = max_reply_tokens
    self.max_reply_bytes = max_reply_bytes
    p = {k: options[k] for k in fields if k in options}
    self._params = ToolCallParams(**{k: jnp.asarray(v) for k, v in
                                     dataclasses.asdict(ToolCallParams(**p)).items()})
    if not 0 <= int(self._params.max_calls) < _NUMBERS:
      raise ValueError(f"toolcall max_calls must be in [0, {_NUMBERS - 1}]")
    self.tokenizer = tokenizer
    self._build_tables(tokenizer)

  # ---------------------------------------------------------------- set-up
  def _build_tables(self, tok):
    kb, qs = self.kb, self.questions
    self.markup = tx.ChatMarkup.from_tokenizer(tok)
    self.bytes = tx.ByteTable.from_tokenizer(tok)
    pad = tok.pad_id
    words = [host_words(f.encode(), 10 ** 6) for f in kb.facts]
    vocab = sorted({w for ws in words for w in ws})
    vid = {w: i for i, w in enumerate(vocab)}
    tf = np.zeros((len(vocab) + 1, len(words)), np.float32)   # last row: words not in the KB
    for f, ws in enumerate(words):
      for w in ws:
        tf[vid[w], f] += 1
    self.vocab_hash = jnp.asarray(np.array([tx.host_word_hash(w) for w in vocab], np.uint32))
    self.tf = jnp.asarray(tf)
    self.df = jnp.asarray((tf > 0).sum(1).astype(np.float32))
    self.fact_len = jnp.asarray([len(w) for w in words], jnp.float32)
    self.fact_frags = tx.FragmentTable.build(tok, [f + "\n" for f in kb.facts], pad)
    needed = np.full((len(qs), MAX_HOPS), -1, np.int32)
    gold = np.zeros((len(qs), self.max_words, 2), np.uint32)
    gold_n = np.zeros((len(qs),), np.int32)
    for i, q in enumerate(qs):
      needed[i, :len(q.needed)] = q.needed
      g = host_words(q.answer.encode(), self.max_words)
      gold_n[i] = len(g)
      for j, w in enumerate(g):
        gold[i, j] = tx.host_word_hash(w)
    self.needed, self.gold, self.gold_n = jnp.asarray(needed), jnp.asarray(gold), jnp.asarray(gold_n)
    self.q_frags = tx.FragmentTable.build(tok, [self.question_content(i) for i in range(len(qs))], pad)
    m = self.markup
    self.wide = tx.FragmentTable.build(
        tok, [m.prompt_prefix, m.between_open, m.between_closed, m.gen_suffix, TAIL]
        + [HEADS[s] for s in range(len(HEADS))], pad)
    self._head0 = 5
    self.numbers = tx.FragmentTable.build(tok, [calls_text(n) for n in range(_NUMBERS)], pad)
    ext = self.tool.capacity if self.tool else 0
    wl = self.wide.lengths
    tail = self.numbers.max_length() + int(wl[3])
    self.prompt_capacity = int(wl[0]) + self.q_frags.max_length() + tail
    self.obs_capacity = (int(max(wl[1], wl[2]) + wl[self._head0:].max() + wl[4]) + ext + tail
                         + (0 if self.tool else self.top_k * self.fact_frags.max_length()))

  def question_content(self, i: int) -> str:
    return instructions(self.top_k) + f"Question: {self.questions[i].text}\n"

  def reply_byte_capacity(self, num_tokens: int) -> int:
    """Bytes of a reply the parser reads: max_reply_bytes, or 8 per token of the reply buffer."""
    return self.max_reply_bytes or 8 * num_tokens

  @property
  def default_params(self) -> ToolCallParams:
    return self._params

  @property
  def num_questions(self) -> int:
    return len(self.questions)

  # ---------------------------------------------------------------- dynamics
  def init_state(self, question) -> ToolCallState:
    z = jnp.int32(0)
    f = jnp.bool_(False)
    cap = self.tool.capacity if self.tool else 0
    return ToolCallState(jnp.asarray(question, jnp.int32), z, z, f, f, f, jnp.float32(0), jnp.int32(ST_START),
                         jnp.zeros((self.top_k,), jnp.int32), jnp.zeros((self.top_k,), bool),
                         jnp.zeros((MAX_HOPS,), bool), jnp.zeros((cap,), jnp.int32), z)

  def reset(self, key, params=None):
    state = self.init_state(jax.random.randint(key, (), 0, self.num_questions))
    return state, self._obs(state)

  def state_key(self, state):
    """The anchor of a state: the question, what the searches found and showed, the calls
    made and whether it is answered; the turn counter and last-turn status are left out."""
    return pytree_hash((state.question, state.calls, state.done, state.answered, state.facts,
                        state.shown, state.found, state.ext_tokens, state.ext_len))

  def _obs(self, state):
    return jnp.where(state.shown, state.facts, -1)

  def bm25(self, words, n_words, params=None):
    """float32[num_facts] BM25 scores of the query words against every fact.

    Query words are looked up in the KB's vocabulary (hash compare), then term frequencies and
    document frequencies come from tables built at set-up."""
    params = self._params if params is None else params
    qmask = jnp.arange(words.shape[0]) < n_words
    match = jnp.all(words[:, None, :] == self.vocab_hash[None], -1)        # [Wq, V]
    qid = jnp.where(jnp.any(match, 1), jnp.argmax(match, 1), self.vocab_hash.shape[0])
    tf = self.tf[qid]                                                      # [Wq, F]
    n_docs = self.tf.shape[1]
    df = self.df[qid]
    idf = jnp.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
    norm = params.k1 * (1.0 - params.b + params.b * self.fact_len / jnp.mean(self.fact_len))
    per = idf[:, None] * tf * (params.k1 + 1.0) / (tf + norm[None])
    return jnp.sum(jnp.where(qmask[:, None], per, 0.0), 0)

  def answer_match(self, words, n_words, question):
    """(exact match, word F1) of answer words against the gold answer of `question`."""
    gold, gn = self.gold[question], self.gold_n[question]
    w = self.max_words
    pm = jnp.arange(w) < n_words
    gm = jnp.arange(w) < gn
    eq = jnp.all(words[:, None] == gold[None, :], -1) & pm[:, None] & gm[None, :]
    em = (n_words == gn) & jnp.all(jnp.diagonal(eq) | ~gm)
    gg = jnp.all(gold[:, None] == gold[None, :], -1) & gm[:, None] & gm[None, :]
    cg = jnp.sum(gg, 1)
    cp = jnp.sum(eq, 0)
    overlap = jnp.sum(jnp.where(gm, jnp.minimum(cp, cg) / jnp.maximum(cg, 1), 0.0))
    prec = overlap / jnp.maximum(n_words, 1)
    rec = overlap / jnp.maximum(gn, 1)
    f1 = jnp.where(overlap > 0, 2 * prec * rec / jnp.maximum(prec + rec, 1e-9), 0.0)
    return em, f1

  def step(self, key, state, action: ToolAction, params=None):
    params = self._params if params is None else params
    active = ~state.done
    is_search = active & (action.kind == KIND_SEARCH)
    do_search = is_search & (state.calls < params.max_calls)
    is_answer = active & (action.kind == KIND_ANSWER)
    invalid = active & (action.kind == KIND_INVALID)
    if self.tool is None:
      scores = self.bm25(action.words, action.n_words, params)
      top, idx = jax.lax.top_k(scores, self.top_k)
      shown_new = top > 0
      ext_tokens, ext_len = state.ext_tokens, state.ext_len
      any_result = jnp.any(shown_new)
    else:
      idx, shown_new = state.facts, jnp.zeros_like(state.shown)
      ext_tokens, ext_len = self.tool(action.text, action.text_len, do_search)
      any_result = ext_len > 0
    facts = jnp.where(do_search, idx, state.facts)
    shown = jnp.where(do_search, shown_new, jnp.where(active, False, state.shown))
    needed = self.needed[state.question]
    hit = jnp.any((needed[:, None] == idx[None, :]) & shown_new[None, :], 1) & (needed >= 0)
    em, f1 = self.answer_match(action.words, action.n_words, state.question)
    reward = jnp.where(is_answer & em, 1.0, 0.0) + jnp.where(invalid, params.format_penalty, 0.0)
    turns = state.turns + active
    done = state.done | is_answer | (turns >= params.max_turns)
    status = jnp.where(invalid, ST_INVALID, jnp.where(is_answer, ST_ANSWERED, jnp.where(
        do_search, jnp.where(any_result, ST_SEARCH, ST_NO_RESULTS), ST_NO_CALLS)))
    new = state.replace(
        turns=turns, calls=state.calls + do_search, done=done, answered=state.answered | is_answer,
        correct=state.correct | (is_answer & em), f1=jnp.where(is_answer, f1, state.f1),
        status=jnp.where(active, status, state.status), facts=facts, shown=shown,
        found=state.found | (do_search & hit),
        ext_tokens=jnp.where(do_search, ext_tokens, jnp.where(active, 0, state.ext_tokens)),
        ext_len=jnp.where(do_search, ext_len, jnp.where(active, 0, state.ext_len)))
    info = {"em": is_answer & em, "f1": jnp.where(is_answer, f1, 0.0), "invalid": invalid,
            "tool_calls": new.calls, "searched": do_search}
    return new, self._obs(new), reward, done, info

  # ---------------------------------------------------------------- scorer signals
  def retrieval_progress(self, state):
    """Fraction of the facts the question needs that searches have already shown (0..1)."""
    needed = self.needed[state.question] >= 0
    return jnp.sum(state.found & needed) / jnp.maximum(jnp.sum(needed), 1)

  def tool_calls(self, before, after):
    return after.calls - before.calls

  # ---------------------------------------------------------------- tokens
  def parse_action(self, tokens, length) -> ToolAction:
    buf, n = tx.tokens_to_bytes(self.bytes, tokens, length, self.reply_byte_capacity(tokens.shape[-1]))
    fs, os_, ss, es = tx.first_block(buf, n, b"<search>", b"</search>")
    fa, oa, sa, ea = tx.first_block(buf, n, b"<answer>", b"</answer>")
    use_search = fs & (~fa | (os_ < oa))
    kind = jnp.where(use_search, KIND_SEARCH, jnp.where(fa, KIND_ANSWER, KIND_INVALID))
    s = jnp.where(use_search, ss, sa)
    e = jnp.where(use_search, es, ea)
    words, nw = tx.word_hashes(buf, s, e, self.max_words)
    size = buf.shape[0]
    j = jnp.arange(self.max_text_bytes)
    text_len = jnp.clip(e - s, 0, self.max_text_bytes)
    text = jnp.where(j < text_len, buf[jnp.clip(s + j, 0, size - 1)], 0)
    valid = kind != KIND_INVALID
    return ToolAction(kind.astype(jnp.int32), jnp.where(valid, words, jnp.uint32(0)),
                      jnp.where(valid, nw, 0).astype(jnp.int32), jnp.where(valid, text, 0),
                      jnp.where(valid, text_len, 0).astype(jnp.int32))

  def _calls_group(self, state, params):
    left = jnp.clip(params.max_calls - state.calls, 0, _NUMBERS - 1)
    return (jnp.asarray(self.numbers.tokens)[left][None], jnp.asarray(self.numbers.lengths)[left][None])

  def initial_prompt_tokens(self, state, params=None):
    params = self._params if params is None else params
    wt, wl = jnp.asarray(self.wide.tokens), jnp.asarray(self.wide.lengths)
    qt, ql = jnp.asarray(self.q_frags.tokens), jnp.asarray(self.q_frags.lengths)
    groups = [(wt[0][None], wl[0][None]), (qt[state.question][None], ql[state.question][None]),
              self._calls_group(state, params), (wt[3][None], wl[3][None])]
    return tx.concat_segments(groups, self.prompt_capacity, self.tokenizer.pad_id)

  def observation_tokens(self, state, turn_closed, params=None):
    params = self._params if params is None else params
    wt, wl = jnp.asarray(self.wide.tokens), jnp.asarray(self.wide.lengths)
    between = jnp.where(turn_closed, 2, 1)
    is_search = state.status == ST_SEARCH
    heads = jnp.stack([between, self._head0 + state.status])
    groups = [(wt[heads], wl[heads])]
    if self.tool is None:
      ft, fl_ = jnp.asarray(self.fact_frags.tokens), jnp.asarray(self.fact_frags.lengths)
      groups.append((ft[state.facts], jnp.where(state.shown & is_search, fl_[state.facts], 0)))
    else:
      groups.append((state.ext_tokens[None], jnp.where(is_search, state.ext_len, 0)[None]))
    groups += [(wt[4][None], jnp.where(is_search, wl[4], 0)[None]), self._calls_group(state, params),
               (wt[3][None], wl[3][None])]
    return tx.concat_segments(groups, self.obs_capacity, self.tokenizer.pad_id)


_WORD_RE = re.compile(rb"[A-Za-z0-9\x80-\xff]+")


def host_words(text: bytes, max_words: int) -> list[bytes]:
  """The words of `text` as the env compares them (lower-cased), at most max_words."""
  return [w.lower() for w in _WORD_RE.findall(text)][:max_words]
