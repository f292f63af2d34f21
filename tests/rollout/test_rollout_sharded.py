"""The engine under a (data=4, tensor=2) mesh of 8 CPU devices: every method's trees equal the
unsharded rollout's, and each prompt's slots and pages live on its own data shard."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import CAPACITY, moves_model, rollout_config  # noqa: E402

from tree_rl import sampling  # noqa: E402
from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, PAD, FrozenLake  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods, scorers  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout, slot_ids  # noqa: E402

TOK = BuiltinTokenizer()
P = 8   # two prompts per data shard
f, h, g, x = FROZEN, HOLE, GOAL, PAD
MAPS = [([[f, f, f, f], [f, f, h, f], [f, f, f, f], [f, f, f, g]], 4, (0, 0)),
        ([[f, f, f, x], [f, f, g, x], [h, f, f, x], [x, x, x, x]], 3, (0, 0)),
        ([[f, h, x, x], [f, g, x, x], [x, x, x, x], [x, x, x, x]], 2, (0, 0)),
        ([[f, f, f, x], [h, f, f, x], [g, f, f, x], [x, x, x, x]], 3, (0, 1))]


@pytest.fixture(scope="module")
def parts():
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  model = moves_model(TOK)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  entropy_tokens=2, entropy_top=10)
  states = [env.init_state(jnp.array(t), n, n, jnp.array(s)) for t, n, s in MAPS * 2]
  states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "tensor"))
  rollouts = [(engine, Layout(P, CAPACITY, 4, 2))]
  caches = {"single": new_cache(model, rollouts, page_size=16, kv_dtype="float32"),
            "sharded": new_cache(model, rollouts, page_size=16, kv_dtype="float32", mesh=mesh)}
  return env, engine, states, caches


def _rollout(parts, which, method):
  env, engine, states, caches = parts
  # ARPO's stochastic rule: a fork when its uniform draw (keyed by prompt and node ids) is at
  # most 0.5 + 0.2 dH; the draws are the same on every mesh, and dH moves the bound by far less
  # than the draws' spacing
  cfg = rollout_config(method=method, entropy_tokens=2)
  policy = methods.get(method)(cfg.rollout)
  sc = None
  if policy.score_every:
    scfg = cfg.scorer
    scfg.name = policy.scorer_override or "heuristic"
    sc = scorers.build(scfg, env=env)
  out, caches[which] = run(engine, policy, caches[which], states, jax.random.key(5), scorer=sc,
                           prompt_ids=jnp.arange(100, 100 + P), capacity=CAPACITY)
  return jax.device_get(out)


@pytest.mark.parametrize("method", ["chain", "tree_grpo", "patr", "tree_random", "arpo"])
def test_sharded_rollout_builds_the_same_trees(parts, method):
  a, b = _rollout(parts, "single", method), _rollout(parts, "sharded", method)
  for field in ("parent", "used", "tokens", "policy_len", "obs_len", "depth", "finished",
                "truncated", "pruned", "num_children"):
    np.testing.assert_array_equal(getattr(a.tree, field), getattr(b.tree, field), err_msg=field)
  for field in ("reward", "ret"):
    np.testing.assert_allclose(getattr(a.tree, field), getattr(b.tree, field), err_msg=field)
  np.testing.assert_allclose(a.tree.logprobs, b.tree.logprobs, atol=2e-4)
  if method == "arpo":   # it did fork: some reply has more than one child
    assert (a.tree.num_children[a.tree.depth > 0] > 1).any()
  np.testing.assert_array_equal(a.leaf, b.leaf)
  np.testing.assert_array_equal(a.valid, b.valid)
  assert a.tree.used.sum() > 2 * P                    # the rollout went somewhere
  for k in ("generated", "env_steps", "forks"):
    np.testing.assert_array_equal(getattr(a.budget, k), getattr(b.budget, k), err_msg=k)



@pytest.mark.parametrize("name, own", [("judge", False), ("prm", True)])
def test_model_scorers_split_their_rows_over_the_data_shards(parts, name, own):
  """A PATR rollout scored by the judge or the PRM (reading the policy, or a checkpoint of
  its own; the PRM in two passes of rows per shard) on the (data=4, tensor=2) mesh scores every
  branch as the one-device rollout; the
  judge's cache holds a quarter of the sequences and pages per shard, like the policy's."""
  from tree_rl.config import base_config
  from tree_rl.rollout.scorers.resources import sampler_generate
  env, engine, states, caches = parts
  mesh = caches["sharded"].mesh
  policy = methods.get("patr")(rollout_config().rollout)
  model = moves_model(TOK)
  c = base_config()
  c.scorer.update(name=name, judge_max_tokens=2, judge_context_tokens=12, prm_aggregate="mean")
  if own:
    c.scorer[f"{name}_model"] = "hf"
  scores = {}
  for which, m in (("single", None), ("sharded", mesh)):
    c.scorer.prm_chunk_rows = 0 if m is None else 2      # the sharded PRM: 2 passes per shard
    sc = scorers.from_config(c, env=env, tokenizer=TOK, policy_model=model, judge_model=model,
                             prm_model=model, max_batch=P * 4, mesh=m)
    out, caches[which] = run(engine, policy, caches[which], states, jax.random.key(2), scorer=sc,
                             prompt_ids=jnp.arange(100, 100 + P), capacity=CAPACITY)
    scores[which] = np.asarray(jax.device_get(out.tree.score))
  scored = np.isfinite(scores["single"])
  assert scored.sum() >= P                                   # every prompt was scored
  np.testing.assert_array_equal(scored, np.isfinite(scores["sharded"]))
  np.testing.assert_allclose(scores["sharded"][scored], scores["single"][scored], atol=1e-5)
  gen = sampler_generate(model, max_seqs=32, max_len=20, max_new=2, stop_ids=(), mesh=mesh)
  one = sampler_generate(model, max_seqs=32, max_len=20, max_new=2, stop_ids=())
  assert gen.cache().spec.max_seqs == one.cache().spec.max_seqs // 4
  assert gen.cache().spec.num_pages == one.cache().spec.num_pages // 4
  np.testing.assert_array_equal(gen.slots(8), [0, 1] * 4)   # rows in shard order, local slots

def test_each_prompt_lives_on_its_shard(parts):
  env, engine, states, caches = parts
  cache = caches["sharded"]
  layout = Layout(P, CAPACITY, 4, 2)
  assert cache.num_shards == 4 and cache.spec.max_seqs == (P // 4) * CAPACITY
  policy = methods.get("tree_grpo")(rollout_config().rollout)
  rs = engine.start(cache, states, layout, jnp.arange(P))
  frontier = policy.first(rs.tree, policy.init(P))[0]
  rs, _ = engine.advance(rs, frontier, jax.random.key(0), keep_parents=True)
  live = np.asarray(jax.device_get(rs.cache.state.live)).reshape(4, -1)
  nodes = np.asarray(rs.live)                      # [P, N]: the engine's live nodes
  pages = np.asarray(sampling.pages_in_use(rs.cache))
  for d in range(4):
    mine = np.asarray(slot_ids(jnp.repeat(jnp.arange(2 * d, 2 * d + 2), CAPACITY),
                               jnp.tile(jnp.arange(CAPACITY), 2), layout, 4, cache.spec.max_seqs))
    assert (mine // cache.spec.max_seqs == d).all()
    # shard d's live slots are exactly its two prompts' live nodes
    np.testing.assert_array_equal(live[d][mine % cache.spec.max_seqs],
                                  nodes[2 * d:2 * d + 2].reshape(-1))
    assert live[d].sum() == nodes[2 * d:2 * d + 2].sum() >= 2 and pages[d] > 0
  caches["sharded"] = engine.release(rs, rs.live).cache


def test_rollout_shards_follow_the_prompts_and_the_devices():
  from tree_rl.rollout.capacity import rollout_shards
  c = rollout_config()
  c.mesh.shape = (-1, 1, 2)
  for prompts, devices, want in ((8, 8, 4), (2, 8, 2), (6, 8, 3), (5, 8, 1), (8, 2, 1)):
    c.rollout.prompts_per_step = prompts
    assert rollout_shards(c, devices) == want, (prompts, devices)
  c.sampler.data_shards = 2
  assert rollout_shards(c, 8) == 2


def test_validation_refuses_shards_that_do_not_split_the_prompts():
  from configs import frozenlake
  from tree_rl.validation import ConfigError, validate
  c = frozenlake.get_config("algo=chain,smoke")   # 2 prompts per step
  c.sampler.data_shards = 3
  with pytest.raises(ConfigError, match=r"config.rollout.prompts_per_step=2 .* does not split over "
                                        r"config.sampler.data_shards=3"):
    validate(c)
  c.sampler.data_shards = 16
  c.rollout.prompts_per_step = 16
  with pytest.raises(ConfigError, match=r"data_shards=16 x tensor 1 needs 16 devices; this "
                                        r"process has 8"):
    validate(c)


def test_validation_refuses_prm_passes_that_do_not_split_a_shards_rows():
  """PATR's smoke layout: 2 prompts on 2 shards x 4 slots = 4 PRM rows per shard."""
  from configs import frozenlake
  from tree_rl.rollout.engine import Layout
  from tree_rl.validation import ConfigError, validate
  c = frozenlake.get_config("algo=patr,smoke")
  c.scorer.name, c.sampler.data_shards = "prm", 2
  for ok in (0, 1, 2, 4, 8):
    c.scorer.prm_chunk_rows = ok
    validate(c, layout=Layout(2, 16, 4, 2))
  c.scorer.prm_chunk_rows = 3
  with pytest.raises(ConfigError, match=r"prm_chunk_rows=3 must divide the PRM's rows per data "
                                        r"shard \(4: 1 prompts x 4 branch slots\)"):
    validate(c, layout=Layout(2, 16, 4, 2))
