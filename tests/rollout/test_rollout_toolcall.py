"""Every rollout method, and every scorer, on the tool-call environment (tiny model, CPU)."""

import functools
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import CAPACITY, rollout_config, toolcall_model  # noqa: E402

from tree_rl.envs.toolcall import ToolCallEnv  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods, scorers  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout  # noqa: E402

P = 2
TOK = BuiltinTokenizer()


@functools.lru_cache(maxsize=None)
def setup():
  env = ToolCallEnv(tokenizer=TOK, max_reply_tokens=6, max_calls=2)
  model = toolcall_model(TOK)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  row_buckets="full")
  states, _ = jax.vmap(env.reset)(jax.random.split(jax.random.key(7), P))
  cache = new_cache(model, [(engine, Layout(P, CAPACITY, 4, 2))], num_pages=300, page_size=16,
                    kv_dtype="float32")
  return env, model, engine, states, [cache]


@functools.lru_cache(maxsize=None)
def rollout(method, scorer="heuristic"):
  env, model, engine, states, box = setup()
  cfg = rollout_config()
  policy = methods.get(method)(cfg.rollout)
  sc = None
  if policy.score_every:
    sc = scorers.from_config(cfg, env=env, tokenizer=TOK, policy_model=model,
                             name=policy.scorer_override or scorer, max_batch=P * policy.slots)
  out, box[0] = run(engine, policy, box[0], states, jax.random.key(1), scorer=sc,
                    capacity=CAPACITY)
  return jax.device_get(out)


def search_calls(tree, p, i, max_calls):
  """Hand count: the reply holds a complete search block and the parent had calls left."""
  text = TOK.decode(tree.tokens[p, i, :tree.policy_len[p, i]])
  parent = tree.parent[p, i]
  return int("<search>" in text and "</search>" in text
             and text.index("<search>") < text.find("<answer>") % 10**6
             and tree.env_state.calls[p, parent] < max_calls)


@pytest.mark.parametrize("method", ["chain", "tree_grpo", "patr", "tree_random"])
def test_every_method_runs_on_toolcall_with_tool_call_accounting(method):
  out = rollout(method)
  t = out.tree
  assert out.stats["trajectories"] > 0
  for p in range(P):
    nodes = np.nonzero(t.used[p] & (t.depth[p] > 0))[0]
    assert out.budget.env_steps[p] == len(nodes)
    assert out.budget.generated[p] == t.policy_len[p, nodes].sum()
    calls = sum(search_calls(t, p, i, 2) for i in nodes)
    assert out.budget.tool_calls[p] == calls
    # a branch's env state continues its parent's: tool calls never decrease along a path
    for i in nodes:
      assert t.env_state.calls[p, i] >= t.env_state.calls[p, t.parent[p, i]]
  assert int(np.asarray(out.budget.tool_calls).sum()) > 0


@pytest.mark.parametrize("scorer", ["judge", "prm"])
def test_patr_with_model_scorers(scorer):
  out = rollout("patr", scorer)
  t = out.tree
  scored = t.used & (t.depth > 0) & np.isfinite(t.score)
  assert scored.any()
  assert ((t.score[scored] >= 0) & (t.score[scored] <= 1)).all()
