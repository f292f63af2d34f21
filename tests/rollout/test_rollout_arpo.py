"""ARPO (`arpo`): its branching rule and group filling on hand-built trees, and real tiny-model
rollouts (full groups, the entropy it branches on)."""

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
from tree_rl.rollout import build, methods, routing, sequences, tree as tree_lib  # noqa: E402
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

def test_rollout_start_is_the_first_reply_of_the_chain_or_fork():
  #   0 - 1 - 3 - 5        a chain through first children
  #     - 2 - 4            2's first child 4 continues it
  #         - 6 - 7        6 is a fork of 2 (a later child): a rollout of its own, 7 continues it
  parent = jnp.array([-1, 0, 0, 1, 2, 3, 2, 6, -1])
  depth = jnp.array([0, 1, 1, 2, 2, 3, 2, 3, 0])
  used = jnp.arange(9) < 8
  np.testing.assert_array_equal(routing.rollout_start(parent, depth, used),
                                [0, 1, 2, 1, 2, 1, 6, 6, 8])


def test_arpo_wants_and_grants():
  rise = jnp.array([0.5, 0.25, 0.75, 1.0])
  may = jnp.array([1, 1, 1, 0], bool)
  draws = jnp.array([[0.1, 0.6], [0.55, 0.54], [0.64, 0.66], [0.0, 0.0]])
  # stochastic, alpha 0.5, beta 0.2: thresholds 0.6, 0.55, 0.65 (<=); a branch that may not, none
  got = routing.arpo_wants(rise, may, draws, rule="stochastic", alpha=0.5, beta=0.2, threshold=0.0)
  np.testing.assert_array_equal(got, [2, 2, 1, 0])
  got = routing.arpo_wants(rise, may, draws, rule="threshold", alpha=0.5, beta=0.2, threshold=0.25)
  np.testing.assert_array_equal(got, [2, 0, 2, 0])   # strictly above
  with pytest.raises(ValueError, match="arpo_rule='coin'"):
    routing.arpo_wants(rise, may, draws, rule="coin", alpha=0.5, beta=0.2, threshold=0.0)
  want = jnp.array([2, 0, 2, 1])
  np.testing.assert_array_equal(routing.grant_in_order(want, jnp.int32(10)), [2, 0, 2, 1])
  np.testing.assert_array_equal(routing.grant_in_order(want, jnp.int32(3)), [2, 0, 1, 0])
  np.testing.assert_array_equal(routing.grant_in_order(want, jnp.int32(0)), [0, 0, 0, 0])


# ----------------------------------------------------------------------------- the method

# One prompt:   root 0 - 1 (H 1.0) - 3 (H 1.5) - 5 (H 1.375, frontier, finished)
#                    `- 2 (H 2.0) - 4 (H 3.0, frontier)
#                                `- 6 (H 3.0, frontier: a fork of 2, created after 4)
# Rises over the first reply of each node's rollout: 5 -> 1: 0.375; 4 -> 2: 1.0; 6 is a
# rollout's first reply itself: 0.
NODES = [(-1, 0.0), (0, 1.0), (0, 2.0), (1, 1.5), (2, 3.0), (3, 1.375), (2, 3.0)]
FRONTIER = [5, 4, 6]


def hand_tree(calls=(1, 1, 1, 1, 1, 1, 1), finished=(5,)):
  t = tree_lib.empty(1, 16, 4, {"pos": jnp.zeros((), jnp.int32)})
  n = len(NODES)
  parent = np.full(16, -1, np.int32)
  depth = np.zeros(16, np.int32)
  ent = np.zeros(16, np.float32)
  for i, (par, h) in enumerate(NODES):
    parent[i], ent[i] = par, h
    depth[i] = 0 if par < 0 else depth[par] + 1
  kids = np.bincount(parent[parent >= 0], minlength=16).astype(np.int32)
  done = np.isin(np.arange(16), finished)
  tool = np.zeros(16, np.int32)
  tool[:n] = calls
  return t.replace(parent=jnp.asarray(parent)[None], depth=jnp.asarray(depth)[None],
                   used=(jnp.arange(16) < n)[None], entropy=jnp.asarray(ent)[None],
                   num_children=jnp.asarray(kids)[None], finished=jnp.asarray(done)[None],
                   tool_calls=jnp.asarray(tool)[None], size=jnp.array([n], jnp.int32))


def arpo(**fields):
  fields = dict(method="arpo", initial_branches=2, expand_children=3, max_branches=8,
                entropy_tokens=K) | fields
  cfg = rollout_config(**fields)
  return methods.get("arpo")(cfg.rollout)


def next_parents(method, tree=None, key=0):
  frontier = jnp.array([FRONTIER + [-1] * (method.slots - len(FRONTIER))], jnp.int32)
  parents, _, pruned = method.next(hand_tree() if tree is None else tree, frontier,
                                   method.init(1), None, jax.random.key(key))
  assert not np.asarray(pruned).any()
  return np.asarray(parents)[0].tolist()


def test_the_threshold_variant_forks_the_branch_itself_when_its_rise_crosses():
  # 5 finished (an answer: no more turns, so no fork); 4 rose 1.0, 6 (a fork's first reply) 0
  rule = dict(arpo_rule="threshold")
  assert next_parents(arpo(entropy_threshold=1.0, **rule)) == [4, 6, -1, -1, -1, -1, -1, -1]
  assert next_parents(arpo(entropy_threshold=0.5, **rule)) == [4, 4, 4, 6, -1, -1, -1, -1]
  # 3 rollouts so far (leaves 5, 4, 6): room for 5 more; granted in slot order
  assert next_parents(arpo(entropy_threshold=-0.5, **rule)) == [4, 4, 4, 6, 6, 6, -1, -1]
  assert next_parents(arpo(entropy_threshold=-0.5, max_branches=5, **rule)) == [4, 4, 4, 6, -1]
  assert next_parents(arpo(entropy_threshold=-0.5, max_branches=4, **rule)) == [4, 4, 6, -1]
  assert next_parents(arpo(entropy_threshold=-0.5, max_branches=3, **rule)) == [4, 6, -1]
  # only after a tool call: node 4's turn made none (the tool-call env's invalid reply)
  no_call = hand_tree(calls=(0, 1, 1, 1, 0, 1, 1))
  assert next_parents(arpo(entropy_threshold=-0.5, **rule), no_call) == [4, 6, 6, 6, -1, -1, -1, -1]


def test_a_prompt_with_no_running_branch_starts_one_chain_until_the_group_is_full():
  done = hand_tree(finished=(4, 5, 6))
  for rule in ("threshold", "stochastic"):
    assert next_parents(arpo(arpo_rule=rule), done) == [0, -1, -1, -1, -1, -1, -1, -1]
    # the group (3 rollouts) is full at max_branches = 3: nothing starts
    assert next_parents(arpo(arpo_rule=rule, max_branches=3), done) == [-1, -1, -1]


def test_stochastic_branch_frequencies_match_clip_alpha_plus_beta_rise():
  # one possible fork per trigger (beam 2); rises 1.0 (node 4) and 0 (node 6)
  m = dict(expand_children=2, max_branches=16)
  n = 4000
  sd = 4 * np.sqrt(0.25 / n)
  for alpha, beta, p4, p6 in ((0.3, 0.4, 0.7, 0.3), (0.5, 0.2, 0.7, 0.5), (0.5, 1.0, 1.0, 0.5),
                              (-0.5, 2.0, 1.0, 0.0)):
    method = arpo(arpo_alpha=alpha, arpo_beta=beta, **m)
    frontier = jnp.array([FRONTIER + [-1] * 13], jnp.int32)
    tree = hand_tree()
    nxt = jax.jit(jax.vmap(lambda k: method.next(tree, frontier, method.init(1), None, k)[0][0]))
    parents = np.asarray(nxt(jax.random.split(jax.random.key(1), n)))
    f4, f6 = ((parents == node).sum(1) - 1 for node in (4, 6))
    assert set(np.unique(f4)) <= {0, 1} and set(np.unique(f6)) <= {0, 1}
    assert abs(f4.mean() - p4) <= sd and abs(f6.mean() - p6) <= sd, (alpha, beta, f4.mean(), f6.mean())
    assert (parents == 5).sum() == 0   # the finished branch neither continues nor forks
  # the draws are keyed: the same key gives the same forks
  method = arpo(**m)
  assert next_parents(method, key=7) == next_parents(method, key=7)


def test_arpo_config_fields_and_shape():
  m = arpo(entropy_threshold=0.2)
  assert (m.slots, m.capacity(3), m.entropy_tokens, m.keep_contexts, m.keep_roots,
          m.num_trees) == (8, 25, K, False, True, 1)
  assert (m.rule, m.alpha, m.beta, m.entropy_top) == ("stochastic", 0.5, 0.2, 10)
  assert arpo(arpo_entropy="mean").entropy_top == 0
  np.testing.assert_array_equal(m.first(hand_tree(), m.init(1))[0], [[0, 0, -1, -1, -1, -1, -1, -1]])
  with pytest.raises(ValueError, match="max_branches"):
    arpo(initial_branches=9)
  with pytest.raises(ValueError, match=r"config\.rollout\.entropy_tokens=0 must be an integer >= 1"):
    build.validate(rollout_config(method="arpo", entropy_tokens=0))   # its declared range
  with pytest.raises(ValueError, match="arpo_entropy='top5'"):
    arpo(arpo_entropy="top5")
  with pytest.raises(ValueError, match="arpo_rule='always'"):
    arpo(arpo_rule="always")


def test_the_presets_group_is_n_with_half_started_as_chains():
  from configs import frozenlake, toolcall
  for module, n in ((frozenlake, 8), (toolcall, 8)):
    c = module.get_config("algo=arpo")
    assert (c.rollout.max_branches, c.rollout.initial_branches) == (n, n // 2)
    assert (c.rollout.arpo_rule, c.rollout.arpo_alpha, c.rollout.arpo_beta) == ("stochastic", 0.5, 0.2)
    assert (c.rollout.arpo_entropy, c.rollout.entropy_tokens) == ("reference", 20)


# ----------------------------------------------------------------------------- rollouts

@functools.lru_cache(maxsize=None)
def setup(top=10):
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  model = entropy_model(TOK)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  row_buckets="full", entropy_tokens=K, entropy_top=top)
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
  top = {"reference": 10, "mean": 0}[fields.get("arpo_entropy", "reference")]
  env, model, engine, states, box = setup(top)
  method = arpo(**fields)
  out, box[0] = run(engine, method, box[0], states, jax.random.key(seed), capacity=CAP,
                    budget=fields.get("budget", 0), budget_unit=fields.get("budget_unit", "generated"))
  return jax.device_get(out)


@pytest.mark.parametrize("form", ["reference", "mean"])
def test_tree_entropy_is_the_first_k_tokens_entropy_by_hand(form):
  """reference: sum over the reply's first K tokens of -sum p log p over the 10 most likely
  tokens (and the sampled one when it is not among them), / ln V; mean: the mean of the exact
  entropy over those tokens. Recomputed from a dense forward over each node's path."""
  out = rollout(arpo_entropy=form)
  _, model, engine, _, _ = setup(10 if form == "reference" else 0)
  t = out.tree
  nodes = np.where(t.used & (t.depth > 0), np.arange(t.capacity)[None], -1)
  seqs = jax.device_get(sequences.path_sequences(t, jnp.asarray(nodes), engine.max_context(), 3))
  width = int(seqs.lengths.max())
  logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(seqs.tokens[..., :width]).reshape(-1, width)),
                                       axis=-1), np.float64).reshape(P, t.capacity, width, -1)
  vocab = logp.shape[-1]
  checked = 0
  for p, i in zip(*np.nonzero(nodes >= 0)):
    start = int(seqs.lengths[p, i] - t.length[p, i])      # first reply token of node i
    k = min(K, int(t.policy_len[p, i]))
    per_token = []
    for j in range(k):
      lp = logp[p, i, start - 1 + j]
      if form == "mean":
        per_token.append(-(np.exp(lp) * lp).sum())
      else:
        top = np.sort(lp)[::-1][:10]
        sampled = lp[int(t.tokens[p, i, j])]
        h = -(np.exp(top) * top).sum() - (np.exp(sampled) * sampled if sampled < top[-1] else 0.0)
        per_token.append(h / np.log(vocab))
    want = (np.mean(per_token) if form == "mean" else np.sum(per_token)) if k else 0.0
    np.testing.assert_allclose(t.entropy[p, i], want, atol=2e-4)
    checked += 1
  assert checked > 8 and np.abs(t.entropy[t.depth > 0]).min() > 1e-3
  assert (t.entropy[t.depth == 0] == 0).all()


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("fields", [dict(), dict(arpo_rule="threshold", entropy_threshold=-100.0),
                                    dict(arpo_rule="threshold", entropy_threshold=100.0),
                                    dict(expand_children=1)])
def test_every_group_holds_max_branches_rollouts(seed, fields):
  """Forks (stochastic, all, none) and fresh chains fill every prompt's group to max_branches;
  every fork is a later child of a branch that made a tool call, continuing after its turn."""
  out = rollout(seed=seed, max_branches=6, **fields)
  t = out.tree
  assert (t.is_leaf.sum(1) == 6).all() and (np.asarray(out.valid).sum(1) == 6).all()
  assert out.stats["budget_cut"] == 0
  for p in range(P):
    root_kids = np.nonzero(t.used[p] & (t.parent[p] == 0))[0]
    for q in np.nonzero(t.used[p] & (t.num_children[p] > 0) & (t.depth[p] > 0))[0]:
      assert t.tool_calls[p, q] > 0 and not t.finished[p, q]
      assert t.num_children[p, q] <= fields.get("expand_children", 3)   # 1 + its forks
    if fields.get("expand_children") == 1 or fields.get("entropy_threshold") == 100.0:
      assert len(root_kids) == 6     # no fork: the group is all chains, 2 initial + 4 filled


def test_arpo_respects_the_budget_cap():
  for unit, limit in (("env_steps", 8), ("generated", 30)):
    out = rollout(arpo_rule="threshold", entropy_threshold=-100.0, max_branches=8, budget=limit,
                  budget_unit=unit)
    spent = np.asarray(out.budget.spent(unit))
    assert (spent <= limit).all(), (unit, spent)
    assert out.stats["budget_cut"] == 0
    leaves = np.asarray(out.tree.is_leaf)
    assert (leaves.sum(1) <= 8).all() and leaves.sum() > P * 2   # some forks did fit
    free = rollout(arpo_rule="threshold", entropy_threshold=-100.0, max_branches=8)
    assert (np.asarray(free.budget.spent(unit)) > limit).all()
  # the planned cost (ARPO.planned_trajectories: the full group) bounds the free rollout
  rc = rollout_config(method="arpo", initial_branches=2, max_branches=8).rollout
  assert (np.asarray(free.budget.env_steps) <= planned_cost(rc, "env_steps")).all()


def test_arpo_refuses_an_engine_that_reports_no_entropy():
  env, _, _, states, box = setup()
  plain = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference")
  with pytest.raises(ValueError, match=r"entropy of 3 reply tokens \(top 10\), the engine reports 0"):
    run(plain, arpo(), box[0], states, jax.random.key(0), capacity=CAP)
