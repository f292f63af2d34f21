"""The evaluator's one rollout of greedy and sampled chains against separate rollouts."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import moves_model  # noqa: E402

from tree_rl.config import base_config  # noqa: E402
from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, PAD, FrozenLake  # noqa: E402
from tree_rl.evaluation import Evaluator, _path_sums  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout  # noqa: E402

TOK = BuiltinTokenizer()


def _config():
  c = base_config()
  c.rollout.max_turns, c.rollout.max_tokens_per_turn, c.rollout.temperature = 3, 6, 1.0
  c.sampler.attention = "reference"
  c.train.eval_prompts, c.train.eval_samples = 0, 3
  return c


def _setup():
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  f, h, g, x = FROZEN, HOLE, GOAL, PAD
  maps = [([[f, f, f, f], [f, f, h, f], [f, f, f, f], [f, f, f, g]], 4, (0, 0)),
          ([[f, g, x, x], [f, f, x, x], [x, x, x, x], [x, x, x, x]], 2, (0, 0)),
          ([[f, f, f, x], [f, f, g, x], [h, f, f, x], [x, x, x, x]], 3, (0, 0))]
  states = [env.init_state(jnp.array(t), n, n, jnp.array(s)) for t, n, s in maps]
  return env, jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def test_greedy_chain_of_the_joint_rollout_equals_a_greedy_rollout_alone():
  env, states = _setup()
  config = _config()
  model = moves_model(TOK)
  ev = Evaluator(config, env, states, TOK)
  assert ev.engine.temperatures == (0.0, 1.0, 1.0, 1.0)
  cache = new_cache(model, ev.rollouts(), num_pages=400, page_size=16, kv_dtype="float32")
  metrics, cache = ev(cache, jax.random.key(0))

  # the greedy episodes alone: one chain per prompt at temperature 0
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  temperature=0.0)
  greedy = methods.get("chain")(_group(config, 1))
  layout = Layout(3, greedy.capacity(3), greedy.slots, greedy.num_trees)
  cache2 = new_cache(model, [(engine, layout)], num_pages=400, page_size=16, kv_dtype="float32")
  out, _ = run(engine, greedy, cache2, states, jax.random.key(9))   # greedy: any key
  v = np.asarray(out.valid)
  won = (np.asarray(out.reward) > 0) & v
  assert metrics["eval/greedy_success"] == won.sum() / v.sum()
  sides = (4, 2, 3)   # one map of each side: its success is its own prompt's
  for p, side in enumerate(sides):
    assert metrics[f"eval/greedy_success/side_{side}"] == won[p].sum() / v[p].sum()
  t = jax.device_get(out.tree)
  turns = t.depth[np.arange(3)[:, None], np.maximum(np.asarray(out.leaf), 0)]
  assert np.isclose(metrics["eval/greedy_mean_turns"], turns[v].sum() / v.sum())
  assert np.isclose(metrics["eval/greedy_tokens_per_episode"],
                    np.asarray(out.budget.generated).sum() / v.sum())

  # the sampled episodes: k per prompt, pass@k is "any of them wins"
  e, _ = ev.episodes(cache, jax.random.key(0), final=True)
  sampled = e["valid"] & ~e["greedy"]
  assert (sampled.sum(axis=1) == 3).all() and ((e["valid"] & e["greedy"]).sum(axis=1) == 1).all()
  won = (e["reward"] > 0) & sampled
  # each episode's final env state: won exactly where the episode was rewarded
  np.testing.assert_array_equal(e["final"].won[e["valid"]], (e["reward"] > 0)[e["valid"]])
  assert e["final"].pos.shape == e["reward"].shape + (2,)
  assert metrics["eval/pass_at_3"] == np.mean(won.any(axis=1))
  assert np.isclose(metrics["eval/sampled_success"], won.sum() / sampled.sum())
  for p, side in enumerate(sides):
    assert np.isclose(metrics[f"eval/sampled_success/side_{side}"], won[p].sum() / 3)
  assert sorted(k for k in metrics if "/side_" in k) == sorted(
      f"eval/{m}_success/side_{s}" for m in ("greedy", "sampled") for s in sides)


def test_a_greedy_only_evaluator_runs_one_chain_and_agrees_with_the_joint_one():
  env, states = _setup()
  config = _config()
  model = moves_model(TOK)
  joint = Evaluator(config, env, states, TOK)
  alone = Evaluator(config, env, states, TOK, prompts=2, samples=0)
  assert alone.num_prompts == 2 and alone.engine.temperatures == (0.0,)
  cache = new_cache(model, joint.rollouts() + alone.rollouts(), num_pages=400, page_size=16,
                    kv_dtype="float32")
  e, cache = joint.episodes(cache, jax.random.key(0))
  got, _ = alone.greedy_success(cache, jax.random.key(5))
  greedy = (e["valid"] & e["greedy"])[:2]
  assert got == ((e["reward"][:2] > 0) & greedy).sum() / greedy.sum()


def _group(config, g):
  r = config.copy_and_resolve_references().rollout
  r.group_size = g
  return r


def test_path_sums_walk_each_leaf_to_its_chain_head():
  """A hand-built tree: root 0; chain heads 1 and 2; 1 -> 3 -> 4 (leaf), 2 (leaf)."""
  class T:  # the host arrays `_path_sums` reads
    parent = np.array([[-1, 0, 0, 1, 3]])
    depth = np.array([[0, 1, 1, 2, 3]])
    policy_len = np.array([[0, 2, 5, 3, 4]])
    tool_calls = np.array([[0, 1, 0, 1, 1]])
  first, generated, calls = _path_sums(T, np.array([[4, 2, -1]]))
  np.testing.assert_array_equal(first[:, :2], [[1, 2]])
  np.testing.assert_array_equal(generated[:, :2], [[2 + 3 + 4, 5]])
  np.testing.assert_array_equal(calls[:, :2], [[3, 0]])
