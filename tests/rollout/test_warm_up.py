"""Rollout programs built ahead of time: the row counts a layout can meet, the warm-up turns,
and a rollout after the warm-up that builds no per-turn program and samples the same tree."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import moves_model, rollout_config  # noqa: E402

from tree_rl import compile_cache  # noqa: E402
from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, PAD, FrozenLake  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run, warm_up  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout, busiest_shard, shard_width  # noqa: E402

TOK = BuiltinTokenizer()
# the programs of one agent turn (engine pieces and sampler operations)
PER_TURN = {"jit(_plan)", "jit(fork_shard)", "jit(decode_shard)", "jit(_commit)",
            "jit(prefill_shard)", "jit(_charge_next)", "jit(release_shard)"}


def _engine(row_buckets="pow2"):
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  return env, Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                     row_buckets=row_buckets)


@pytest.mark.parametrize("shards, buckets, want", [
    (1, "pow2", [8, 16, 32, 64]),    # 64 slots: powers of two from an eighth
    (2, "pow2", [8, 16, 32, 64]),    # 32 per shard: 4..32 on each of the 2 shards
    (1, "full", [64]),
])
def test_row_counts_are_the_buckets_of_every_request_count(shards, buckets, want):
  _, engine = _engine(buckets)
  layout = Layout(num_prompts=8, capacity=20, slots=8, num_trees=1)
  assert engine.row_counts(layout, shards) == want
  # each request set of the warm-up decodes over its row count
  for width, parents in zip(want, engine.bucket_requests(layout, shards)):
    assert parents.shape == (8, 8)
    busiest = int(busiest_shard(parents, shards, xp=np))
    assert shard_width(busiest, shards, 64, buckets != "full") == width
    assert set(np.unique(parents)) <= {-1, 0}   # children of the first root only


def test_busiest_shard_agrees_on_host_and_device():
  mask = np.array([[0, -1, 3, -1], [-1, -1, -1, 2], [1, 1, 1, -1], [-1, -1, -1, -1]], np.int32)
  # requests per prompt row: 2, 1, 3, 0
  for shards, want in ((1, 6), (2, 3), (4, 3)):
    assert int(busiest_shard(mask, shards, xp=np)) == want
    assert int(busiest_shard(jnp.asarray(mask), shards)) == want


def _states(env):
  f, h, g, x = FROZEN, HOLE, GOAL, PAD
  maps = [([[f, f, f, f], [f, f, h, f], [f, f, f, f], [f, f, f, g]], 4, (0, 0)),
          ([[f, f, f, x], [f, f, g, x], [h, f, f, x], [x, x, x, x]], 3, (0, 0))] * 2
  states = [env.init_state(jnp.array(t), n, n, jnp.array(s)) for t, n, s in maps]
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def test_a_rollout_after_the_warm_up_builds_no_turn_program_and_samples_the_same_tree():
  env, engine = _engine()
  states = _states(env)
  policy = methods.get("chain")(rollout_config(group_size=4).rollout)
  layout = Layout(4, policy.capacity(engine.max_turns), policy.slots, policy.num_trees)
  model = moves_model(TOK)
  cache = new_cache(model, [(engine, layout)], num_pages=400, page_size=16, kv_dtype="float32")
  before, _ = compile_cache.programs_built()
  cache = warm_up(engine, policy, cache, states)
  built = compile_cache.built_since(before)
  assert {"jit(_plan)", "jit(_commit)"} <= set(built)
  # one observation prefill and one charge per row count (the prompts' prefill aside): what is
  # built ahead is what the turns then call
  assert built.count("jit(_charge_next)") == built.count("jit(prefill_shard)") - 1 >= 2, built
  assert int(jnp.sum(cache.state.live)) == 0   # the warm-up leaves every slot empty
  mid, _ = compile_cache.programs_built()
  warm, cache = run(engine, policy, cache, states, jax.random.key(3))
  assert not PER_TURN & set(compile_cache.built_since(mid)), compile_cache.built_since(mid)

  _, engine = _engine()   # the same rollout on a fresh engine without a warm-up
  cache = new_cache(model, [(engine, layout)], num_pages=400, page_size=16, kv_dtype="float32")
  cold, _ = run(engine, policy, cache, states, jax.random.key(3))
  np.testing.assert_array_equal(np.asarray(warm.tree.tokens), np.asarray(cold.tree.tokens))
  np.testing.assert_array_equal(np.asarray(warm.reward), np.asarray(cold.reward))
