"""ARPO (`arpo`): entropy-triggered forks on hand-built trees, and real tiny-model rollouts."""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import rollout_config, steered_model  # noqa: E402

from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, PAD, FrozenLake  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods, routing, sequences, tree as tree_lib  # noqa: E402
from tree_rl.rollout.budget import planned_cost  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout  # noqa: E402

P, K = 2, 3          # prompts, entropy tokens
CAP = 1 + 16 * 3     # node slots per prompt: max_branches <= 16, 3 turns
TOK = BuiltinTokenizer()


def entropy_model(tok):
  """Steered towards moves only mildly, so reply entropies vary with the context."""
  nl, down, right, eot = (tok.encode(s)[0] for s in ("\n", "Down", "Right", "<|im_end|>"))
  return steered_model(tok, {nl: (down, right), down: (eot,), right: (eot,)}, scale=2.0)


# ----------------------------------------------------------------------------- routing

def test_first_reply_is_the_depth_one_ancestor():
  #            0 - 1 - 3 - 5        0 - 2 - 4
  parent = jnp.array([-1, 0, 0, 1, 2, 3, -1])
  depth = jnp.array([0, 1, 1, 2, 2, 3, 0])
  np.testing.assert_array_equal(routing.first_reply(parent, depth), [0, 1, 2, 1, 2, 1, 6])


def test_arpo_forks_above_the_threshold_within_room():
  rise = jnp.array([0.5, 0.25, 0.75, 1.0])
  active = jnp.array([1, 1, 1, 0], bool)
  forks = lambda room: np.asarray(routing.arpo_forks(rise, active, jnp.int32(room),  # noqa: E731
                                                     threshold=0.25, extra=2))
  np.testing.assert_array_equal(forks(10), [2, 0, 2, 0])   # strictly above; inactive never
  np.testing.assert_array_equal(forks(3), [2, 0, 1, 0])    # the last granted gets fewer
  np.testing.assert_array_equal(forks(0), [0, 0, 0, 0])


# ----------------------------------------------------------------------------- the method

# One prompt:   root 0 - 1 (H 1.0) - 3 (H 1.5) - 5 (H 1.375, frontier, finished)
#                    `- 2 (H 2.0) - 4 (H 2.0625, frontier)
#                                `- 6 (H 3.0, frontier: a fork of 2, created after 4)
NODES = [(-1, 0.0), (0, 1.0), (0, 2.0), (1, 1.5), (2, 2.0625), (3, 1.375), (2, 3.0)]
FRONTIER = [5, 4, 6, -1, -1, -1]


def hand_tree():
  t = tree_lib.empty(1, 16, 4, {"pos": jnp.zeros((), jnp.int32)})
  n = len(NODES)
  parent = np.full(16, -1, np.int32)
  depth = np.zeros(16, np.int32)
  ent = np.zeros(16, np.float32)
  for i, (par, h) in enumerate(NODES):
    parent[i], ent[i] = par, h
    depth[i] = 0 if par < 0 else depth[par] + 1
  kids = np.bincount(parent[parent >= 0], minlength=16).astype(np.int32)
  finished = np.zeros(16, bool)
  finished[5] = True
  return t.replace(parent=jnp.asarray(parent)[None], depth=jnp.asarray(depth)[None],
                   used=(jnp.arange(16) < n)[None], entropy=jnp.asarray(ent)[None],
                   num_children=jnp.asarray(kids)[None], finished=jnp.asarray(finished)[None],
                   size=jnp.array([n], jnp.int32))


def arpo(**fields):
  fields = dict(method="arpo", initial_branches=2, expand_children=3, max_branches=8,
                entropy_tokens=K) | fields
  cfg = rollout_config(**fields)
  return methods.get("arpo")(cfg.rollout)


def next_parents(method):
  frontier = jnp.array([FRONTIER + [-1] * (method.slots - len(FRONTIER))], jnp.int32)
  parents, _, pruned = method.next(hand_tree(), frontier, method.init(1), None, jax.random.key(0))
  assert not np.asarray(pruned).any()
  return np.asarray(parents)[0].tolist()


def test_arpo_forks_the_parent_exactly_when_the_rise_over_the_first_reply_crosses():
  # node 5: H 1.375 - H_0 (node 1) 1.0 = 0.375 (its parent 3 has 1.5: the rise is not vs the
  # parent), and it finished: it does not continue, but the branching decision precedes the
  # outcome, so its parent 3 forks; node 4: 2.0625 - 2.0 = 0.0625; node 6: 3.0 - 2.0 = 1.0,
  # but it is itself a fork of 2 (one decision per path and step): it continues, never forks.
  assert next_parents(arpo(entropy_threshold=0.5)) == [4, 6, -1, -1, -1, -1, -1, -1]
  assert next_parents(arpo(entropy_threshold=0.375)) == [4, 6, -1, -1, -1, -1, -1, -1]  # strict
  assert next_parents(arpo(entropy_threshold=0.25)) == [3, 3, 4, 6, -1, -1, -1, -1]
  # 3 branches so far (leaves 5, 4, 6): room for 5 more; granted in slot order
  assert next_parents(arpo(entropy_threshold=0.0)) == [3, 3, 4, 2, 2, 6, -1, -1]
  # max_branches caps the branches started: room for 2, 1, 0 more
  assert next_parents(arpo(entropy_threshold=0.0, max_branches=5)) == [3, 3, 4, 6, -1]
  assert next_parents(arpo(entropy_threshold=0.0, max_branches=4)) == [3, 4, 6, -1]
  assert next_parents(arpo(entropy_threshold=0.0, max_branches=3)) == [4, 6, -1]


def test_arpo_config_fields_and_shape():
  m = arpo(entropy_threshold=0.2)
  assert (m.slots, m.capacity(3), m.entropy_tokens, m.keep_contexts, m.num_trees) == (8, 25, K, True, 1)
  assert m.entropy_threshold == pytest.approx(0.2)
  np.testing.assert_array_equal(m.first(hand_tree(), m.init(1))[0], [[0, 0, -1, -1, -1, -1, -1, -1]])
  with pytest.raises(ValueError, match="max_branches"):
    arpo(initial_branches=9)
  with pytest.raises(ValueError, match="entropy_tokens"):
    methods.get("arpo")(rollout_config(method="arpo", entropy_tokens=0).rollout)


# ----------------------------------------------------------------------------- rollouts

@functools.lru_cache(maxsize=None)
def setup():
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  model = entropy_model(TOK)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  row_buckets="full", entropy_tokens=K)
  f, h, g, x = FROZEN, HOLE, GOAL, PAD
  maps = [([[f, f, f, f], [f, f, h, f], [f, f, f, f], [f, f, f, g]], 4, (0, 0)),
          ([[f, f, f, x], [f, f, g, x], [h, f, f, x], [x, x, x, x]], 3, (0, 0))]
  states = [env.init_state(jnp.array(t), n, n, jnp.array(s)) for t, n, s in maps]
  states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  cache = new_cache(model, [(engine, Layout(P, CAP, 16, 1))], num_pages=800, page_size=16,
                    kv_dtype="float32")
  return env, model, engine, states, [cache]


@functools.lru_cache(maxsize=None)
def rollout(seed=0, **fields):
  env, model, engine, states, box = setup()
  method = arpo(**fields)
  out, box[0] = run(engine, method, box[0], states, jax.random.key(seed), capacity=CAP,
                    budget=fields.get("budget", 0), budget_unit=fields.get("budget_unit", "generated"))
  return jax.device_get(out)


def rises(t):
  first = np.asarray(jax.vmap(routing.first_reply)(t.parent, t.depth))
  return t.entropy - np.take_along_axis(t.entropy, first, axis=1)


def test_tree_entropy_is_the_mean_of_the_first_k_sampler_entropies():
  out = rollout(entropy_threshold=0.0)
  _, model, engine, _, _ = setup()
  t = out.tree
  nodes = np.where(t.used & (t.depth > 0), np.arange(t.capacity)[None], -1)
  seqs = jax.device_get(sequences.path_sequences(t, jnp.asarray(nodes), engine.max_context(), 3))
  width = int(seqs.lengths.max())
  logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(seqs.tokens[..., :width]).reshape(-1, width)),
                                       axis=-1), np.float64).reshape(P, t.capacity, width, -1)
  dense_h = -(np.exp(logp) * logp).sum(-1)               # [P, N, width]: at position j
  checked = 0
  for p, i in zip(*np.nonzero(nodes >= 0)):
    start = int(seqs.lengths[p, i] - t.length[p, i])      # first reply token of node i
    k = min(K, int(t.policy_len[p, i]))
    want = dense_h[p, i, start - 1:start - 1 + k].mean() if k else 0.0
    np.testing.assert_allclose(t.entropy[p, i], want, atol=2e-4)
    checked += 1
  assert checked > 8 and np.abs(t.entropy[t.depth > 0]).min() > 1e-3
  assert (t.entropy[t.depth == 0] == 0).all()


def test_arpo_rollout_forks_exactly_where_the_rise_crosses_the_threshold():
  tau = 1.8   # with seed 3, some replies cross it and most do not, and the cap never binds
  out = rollout(seed=3, entropy_threshold=tau, max_branches=16)
  t = out.tree
  rise = rises(t)
  ended = t.finished | t.truncated
  forks_seen = quiet = 0
  for p in range(P):
    assert t.is_leaf[p].sum() < 16     # the cap did not bind, so every trigger was granted
    for q in np.nonzero(t.used[p] & (t.num_children[p] > 0))[0]:
      kids = np.nonzero(t.used[p] & (t.parent[p] == q))[0]
      # only the continuation decides (ended replies too); the forks never fork q again
      triggers = int(q != 0 and rise[p, kids.min()] > tau)
      base = 2 if q == 0 else 1                   # initial branches / the continuation
      assert len(kids) == base + 2 * triggers, (p, q, kids, rise[p, kids])
      forks_seen += triggers
      quiet += int(((rise[p, kids] <= tau) & ~ended[p, kids] & (t.depth[p, kids] > 1)).sum())
  assert forks_seen >= 1 and quiet >= 1, (forks_seen, quiet)   # both cases occur
  assert np.asarray(out.valid).sum() == t.is_leaf.sum()   # every leaf enters the group
  assert out.stats["budget_cut"] == 0


def test_arpo_caps_max_branches_and_the_budget():
  out = rollout(entropy_threshold=-100.0, max_branches=5)   # every running branch forks
  t = out.tree
  assert (t.is_leaf.sum(1) == 5).all() and (np.asarray(out.valid).sum(1) == 5).all()
  assert out.stats["budget_cut"] == 0
  for unit, limit in (("env_steps", 8), ("generated", 40)):
    out = rollout(entropy_threshold=-100.0, max_branches=8, budget=limit, budget_unit=unit)
    spent = np.asarray(out.budget.spent(unit))
    assert (spent <= limit).all(), (unit, spent)
    assert out.stats["budget_cut"] == 0
    leaves = np.asarray(out.tree.is_leaf)
    assert (leaves.sum(1) <= 8).all() and leaves.sum() > P * 2   # some forks did fit
    free = rollout(entropy_threshold=-100.0, max_branches=8)
    assert (np.asarray(free.budget.spent(unit)) > limit).all()
  # the planned cost (budget.arpo_plan) is the worst case: the free rollout stays within it
  rc = rollout_config(method="arpo", initial_branches=2, max_branches=8, entropy_threshold=-100.0).rollout
  assert (np.asarray(free.budget.env_steps) <= planned_cost(rc, "env_steps")).all()


def test_arpo_refuses_an_engine_that_reports_no_entropy():
  env, _, _, states, box = setup()
  plain = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference")
  with pytest.raises(ValueError, match=r"entropy of 3 reply tokens, the engine reports 0"):
    run(plain, arpo(), box[0], states, jax.random.key(0), capacity=CAP)
