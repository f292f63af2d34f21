"""The engine and the four methods on FrozenLake with the tiny model (CPU)."""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from rollout_helpers import CAPACITY, moves_model, rollout_config  # noqa: E402

from tree_rl.envs.frozenlake import FROZEN, GOAL, HOLE, PAD, FrozenLake  # noqa: E402
from tree_rl.models.tokenizers import BuiltinTokenizer  # noqa: E402
from tree_rl.rollout import methods, scorers, sequences  # noqa: E402
from tree_rl.learner.from_rollout import advantage_inputs, train_trees  # noqa: E402
from tree_rl.rollout.capacity import new_cache  # noqa: E402
from tree_rl.rollout.driver import run  # noqa: E402
from tree_rl.rollout.engine import Engine, Layout  # noqa: E402

P = 2
TOK = BuiltinTokenizer()


@functools.lru_cache(maxsize=None)
def setup():
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  model = moves_model(TOK)
  engine = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                  row_buckets="full")
  f, h, g, x = FROZEN, HOLE, GOAL, PAD
  maps = [  # 4x4 with the goal far away; 3x3 with the goal three moves from the start
      ([[f, f, f, f], [f, f, h, f], [f, f, f, f], [f, f, f, g]], 4, (0, 0)),
      ([[f, f, f, x], [f, f, g, x], [h, f, f, x], [x, x, x, x]], 3, (0, 0)),
  ]
  states = [env.init_state(jnp.array(t), n, n, jnp.array(s)) for t, n, s in maps]
  states = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
  cache = new_cache(model, [(engine, Layout(P, CAPACITY, 4, 2))], num_pages=400, page_size=16,
                    kv_dtype="float32")
  return env, model, engine, states, [cache]


def rollout(method, seed=0, scorer="heuristic", **overrides):
  env, model, engine, states, cache_box = setup()
  cfg = rollout_config(**overrides)
  policy = methods.get(method)(cfg.rollout)
  sc = None
  if policy.score_every:
    scfg = cfg.scorer
    scfg.name = policy.scorer_override or scorer
    sc = scorers.build(scfg, env=env)
  out, cache_box[0] = run(engine, policy, cache_box[0], states, jax.random.key(seed), scorer=sc,
                          capacity=CAPACITY, budget=cfg.rollout.budget,
                          budget_unit=cfg.rollout.budget_unit)
  return jax.device_get(out), policy


cached = functools.lru_cache(maxsize=None)(rollout)


def children(tree, p):
  kids = {}
  for i in np.nonzero(tree.used[p])[0]:
    kids.setdefault(int(tree.parent[p, i]), []).append(int(i))
  return kids


def test_tree_grpo_leaf_count_and_expansion_points():
  out, _ = cached("tree_grpo")
  t = out.tree
  m, n, l = 2, 2, 1
  for p in range(P):
    leaves = np.nonzero(t.is_leaf[p])[0]
    assert len(leaves) == m * (l * n + 1)
    assert np.asarray(out.valid[p]).sum() == m * (l * n + 1)
    for tree_id in range(m):
      assert (t.tree_id[p, leaves] == tree_id).sum() == l * n + 1
    ended = t.finished[p] | t.truncated[p]
    for parent, kids in children(t, p).items():
      if parent >= 0:   # every expansion starts at a root or a non-leaf node
        assert not ended[parent] and (t.depth[p, parent] == 0 or t.num_children[p, parent] > 0)
        assert all(t.tree_id[p, k] == t.tree_id[p, parent] for k in kids)
  # K-leaf subsampling keeps K random leaves per tree.
  sub, _ = cached("tree_grpo", keep_leaves=2)
  for p in range(P):
    assert sub.tree.is_leaf[p].sum() == 6
    for tree_id in range(m):
      assert (np.asarray(sub.valid[p]) & (np.asarray(sub.tree_id[p]) == tree_id)).sum() == 2


@pytest.mark.parametrize("method", ["tree_grpo", "patr"])
def test_branch_logprobs_equal_dense_forward_over_root_to_leaf(method):
  out, _ = cached(method)
  _, model, engine, _, _ = setup()
  seqs = jax.device_get(sequences.path_sequences(out.tree, jnp.asarray(out.leaf),
                                                 engine.max_context(), engine.max_turns))
  width = int(seqs.lengths.max())
  toks = jnp.asarray(seqs.tokens[..., :width]).reshape(-1, width)
  logp = jax.nn.log_softmax(model(toks), axis=-1)
  dense = jnp.take_along_axis(logp[:, :-1], toks[:, 1:, None], axis=-1)[..., 0]
  dense = np.asarray(dense).reshape(P, -1, width - 1)
  mask = seqs.loss_mask[..., 1:width] & np.asarray(out.leaf >= 0)[..., None]
  assert mask.sum() > 20
  np.testing.assert_allclose(seqs.logprobs[..., 1:width][mask], dense[mask], atol=2e-4)


def test_forked_frozenlake_branch_continues_from_the_node_state():
  out, _ = cached("tree_grpo")
  env = setup()[0]
  t = out.tree
  state = lambda p, i: jax.tree.map(lambda x: jnp.asarray(x[p, i]), t.env_state)  # noqa: E731
  step = jax.jit(lambda s, a: env.step(jax.random.key(0), s, a)[0])
  parse = jax.jit(env.parse_action)
  expansions_away_from_start = 0
  for p in range(P):
    root_state = state(p, 0)
    kids = children(t, p)
    for i in np.nonzero(t.used[p] & (t.depth[p] > 0))[0]:
      par = int(t.parent[p, i])
      toks = jnp.asarray(t.tokens[p, i, :engine_max_new()])
      action = parse(toks, jnp.int32(t.policy_len[p, i]))
      replay = step(state(p, par), action)
      np.testing.assert_array_equal(np.asarray(replay.pos), t.env_state.pos[p, i])
      np.testing.assert_array_equal(np.asarray(replay.steps), t.env_state.steps[p, i])
      from_start = step(root_state, action)
      forked = len(kids.get(par, [])) > 1 and t.depth[p, par] > 0
      if forked and not np.array_equal(np.asarray(from_start.pos), t.env_state.pos[p, i]):
        expansions_away_from_start += 1
  assert expansions_away_from_start > 0


def engine_max_new():
  return setup()[2].max_new


def hand_budget(out, num_trees):
  t = out.tree
  got = {k: np.asarray(v) for k, v in out.budget.as_dict().items()}
  for p in range(P):
    nodes = np.nonzero(t.used[p] & (t.depth[p] > 0))[0]
    prompt_len = t.obs_len[p, 0]
    nc = t.num_children[p]
    extra = np.maximum(nc - 1, 0) * t.used[p]
    want = dict(
        generated=t.policy_len[p, nodes].sum(),
        env_steps=len(nodes), tool_calls=len(nodes),
        # the prompt once; each observation plus the turn's last token, which waits in the cache
        prefilled=prompt_len + sum(t.obs_len[p, i] + 1 for i in nodes if t.obs_len[p, i] > 0),
        forks=extra.sum() + (num_trees - 1),
        reused=(extra * t.ctx_len[p]).sum() + (num_trees - 1) * prompt_len,
        pruned=t.pruned[p].sum())
    for k, v in want.items():
      assert got[k][p] == v, (k, p, got[k][p], v)


@pytest.mark.parametrize("method,trees", [("chain", 1), ("tree_grpo", 2), ("patr", 1),
                                          ("tree_random", 1)])
def test_budget_counts_equal_hand_count(method, trees):
  out, _ = cached(method)
  hand_budget(out, trees)
  assert out.stats["trajectories"] > 0 and out.stats["peak_pages"] > 0


def test_same_seed_same_rollout_and_different_seed_differs():
  a, _ = rollout("patr", seed=3)
  b, _ = rollout("patr", seed=3)
  c, _ = rollout("patr", seed=4)
  for field in ("parent", "tokens", "logprobs", "policy_len", "score", "pruned"):
    np.testing.assert_array_equal(getattr(a.tree, field), getattr(b.tree, field))
  assert not np.array_equal(a.tree.tokens, c.tree.tokens)


def test_chain_group_and_patr_pruned_branches_stay_in_group():
  out, _ = cached("chain")
  for p in range(P):
    assert out.tree.num_children[p, 0] == 4 and np.asarray(out.valid[p]).sum() == 4
  out, policy = cached("patr")
  t = out.tree
  assert t.pruned.sum() > 0                    # Theta = 2: moves repeat quickly
  leaf_pruned = np.asarray(t.pruned)[np.arange(P)[:, None], np.maximum(out.leaf, 0)]
  assert (np.asarray(out.valid) & leaf_pruned).sum() == t.pruned.sum()
  dropped, _ = cached("patr", keep_pruned=False)
  leaf_pruned = np.asarray(dropped.tree.pruned)[np.arange(P)[:, None], np.maximum(dropped.leaf, 0)]
  assert not (np.asarray(dropped.valid) & leaf_pruned).any()
  for p in range(P):   # never more branches than the cap
    assert t.is_leaf[p].sum() <= policy.max_branches
  assert np.isfinite(t.score[t.used & (t.depth > 0) & ~t.finished]).any()
  rand, _ = cached("tree_random")   # Tree-Random routes the same way on random scores
  scored = np.isfinite(rand.tree.score)
  assert scored.any() and not np.allclose(rand.tree.score[scored & np.isfinite(t.score)],
                                          t.score[scored & np.isfinite(t.score)])


def _best_n_by_hand(t, p, n):
  """The n leaves of prompt p with the highest Best_n key, walking parents in Python."""
  def key(i):
    if t.finished[p, i]:
      return float(t.ret[p, i])
    while i >= 0 and np.isnan(t.score[p, i]):
      i = int(t.parent[p, i])
    return float(t.score[p, i]) if i >= 0 else -np.inf
  leaves = [int(i) for i in np.nonzero(t.is_leaf[p])[0]]
  return set(sorted(leaves, key=lambda i: (-key(i), i))[:n]), {i: key(i) for i in leaves}


def test_patr_best_n_keeps_the_n_best_scored_leaves():
  full, _ = cached("patr")
  best, _ = cached("patr", keep_best=2)
  np.testing.assert_array_equal(best.tree.tokens, full.tree.tokens)   # selection only
  kinds = set()
  for p in range(P):
    want, keys = _best_n_by_hand(best.tree, p, 2)
    got = set(np.asarray(best.leaf[p])[np.asarray(best.valid[p])].tolist())
    assert len(keys) > 2 and got == want, (p, keys)
    kinds |= {bool(best.tree.finished[p, i]) for i in keys}
  assert kinds == {True, False}     # outcome-ranked and score-ranked leaves both met


def test_a_task_drawn_twice_gets_two_advantage_groups():
  from tree_rl import train
  from tree_rl.learner.from_rollout import advantages, learner_batches
  env, model, engine, states, box = setup()
  cfg = rollout_config()
  tasks, groups = train._prompt_batch(cfg, 1, 0, 2)   # one task: the batch draws it twice
  assert tasks.tolist() == [0, 0] and groups.tolist() == [0, 1]
  later = train._prompt_batch(cfg, 3, 2, 4)            # a function of the position (resume)
  np.testing.assert_array_equal(later[0], train._prompt_order(cfg, 3, 2, 4))
  assert later[1].tolist() == [2, 3, 4, 5]
  twice = jax.tree.map(lambda x: jnp.stack([x[1], x[1]]), states)
  policy = methods.get("chain")(cfg.rollout)
  out, box[0] = run(engine, policy, box[0], twice, jax.random.key(0),
                    prompt_ids=jnp.asarray(groups), capacity=CAPACITY)
  out = jax.device_get(out)
  r = np.asarray(out.reward)
  norm = lambda x: (x - x.mean()) / (x.std(ddof=1) + 1e-6)  # noqa: E731
  per_copy = np.stack([norm(r[0]), norm(r[1])])
  pooled = norm(r.reshape(-1)).reshape(r.shape)
  assert not np.allclose(per_copy, pooled)              # the two groupings differ here
  adv = np.asarray(advantages(cfg.learner, out, max_turns=cfg.rollout.max_turns)).reshape(r.shape)
  np.testing.assert_allclose(adv, per_copy, atol=1e-5)
  assert sorted(t.group_id for t in train_trees(out, adv)) == [0, 1]
  shared = out.replace(tree=out.tree.replace(prompt_id=jnp.asarray(tasks)))   # the old ids
  with pytest.raises(ValueError, match="repeat"):
    learner_batches(cfg, shared)


# Budget cap. Map 0 (prompt 0): every branch runs exactly to the turn limit (the hole is three
# moves away, the goal six), so a branch from a node at depth d takes exactly 3 - d env steps.
NO_PRUNE = dict(prune_repeat=0, prune_alpha=100.0)


def spent_and_leaves(out, unit):
  t = out.tree
  leaf = np.asarray(out.valid)
  ids = np.maximum(np.asarray(out.leaf), 0)
  rows = np.arange(P)[:, None]
  complete = (t.finished | t.pruned | (t.depth == 3))[rows, ids]
  return np.asarray(out.budget.spent(unit)), leaf, complete


@pytest.mark.parametrize("method", ["chain", "tree_grpo", "patr", "tree_random"])
def test_budget_caps_starts_and_never_cuts_a_training_leaf(method):
  extra = NO_PRUNE if method in ("patr", "tree_random") else {}
  for unit, limit in (("env_steps", 7), ("generated", 27)):   # 7/3 and 1.5 trajectories
    out, _ = cached(method, budget=limit, budget_unit=unit, **extra)
    spent, valid, complete = spent_and_leaves(out, unit)
    # every training leaf ended by the episode, the turn limit or pruning: none was cut
    assert valid.any() and complete[valid].all(), unit
    assert (spent <= limit).all(), (unit, spent)
    assert out.stats["budget_cut"] == 0
    assert out.stats["cost_per_prompt"] == pytest.approx(spent.mean())
  # Where costs are exact (map 0, env steps), the cap stops only when no requested branch fits:
  # spent is within one trajectory (3 steps) of the budget, below the free rollout's spend.
  out, _ = cached(method, budget=7, budget_unit="env_steps", **extra)
  free, _ = cached(method, **extra)
  assert 7 - 3 < int(out.budget.env_steps[0]) <= 7 < int(free.budget.env_steps[0])


def test_chain_under_a_budget_samples_fewer_complete_chains():
  out, _ = cached("chain", budget=7, budget_unit="env_steps")
  t = out.tree
  # map 0: 3 steps a chain, so 2 of the 4 chains fit in 7 steps; they start at once and the
  # other two are refused at every boundary (6 + 3 > 7)
  assert t.num_children[0, 0] == 2 and int(out.budget.env_steps[0]) == 6
  assert np.asarray(out.valid[0]).sum() == 2
  # map 1 (episodes can end after 2 steps): at least 2 chains, each complete, in waves
  assert 2 <= t.num_children[1, 0] <= 4 and int(out.budget.env_steps[1]) <= 7
  ids = np.asarray(out.leaf[1])[np.asarray(out.valid[1])]
  assert (t.finished[1, ids] | (t.depth[1, ids] == 3)).all()


def test_budget_below_one_trajectory_is_refused():
  env, model, engine, states, box = setup()
  policy = methods.get("chain")(rollout_config().rollout)
  with pytest.raises(ValueError, match=r"config.rollout.budget=17 generated .*\(18\)"):
    run(engine, policy, box[0], states, jax.random.key(0), capacity=CAPACITY, budget=17)


def test_planned_cost_is_what_full_length_branches_spend():
  """On map 0 every branch runs to the turn limit: chain and PATR (no pruning) spend exactly
  their planned cost in env steps."""
  from tree_rl.rollout.budget import planned_cost
  for method in ("chain", "patr"):
    cfg = rollout_config(method=method, **NO_PRUNE)
    out, _ = cached(method, **NO_PRUNE)
    assert int(out.budget.env_steps[0]) == planned_cost(cfg.rollout, "env_steps")


def test_learner_formats():
  out, _ = cached("tree_grpo")
  from tree_rl.learner import advantages, batches
  inp = advantage_inputs(out)
  adv = advantages.get("tree_grpo")(**inp)
  trees = train_trees(out, adv)
  assert len(trees) == P * 2
  leaf = batches.leaf_batch(trees, seq_len=setup()[2].max_context())
  rows = np.asarray(leaf.tokens)
  assert rows.shape[0] == int(np.asarray(inp["valid"]).sum())
  seqs = jax.device_get(sequences.path_sequences(out.tree, jnp.asarray(out.leaf),
                                                 setup()[2].max_context(), 3))
  mine = {tuple(s[:n]) for s, n in zip(seqs.tokens.reshape(-1, seqs.tokens.shape[-1]),
                                        seqs.lengths.reshape(-1)) if n}
  theirs = {tuple(r[:np.nonzero(r)[0].max() + 1]) for r in rows}
  assert theirs <= mine


def test_no_sharing_baseline_gives_the_same_tree_and_re_encodes_prefixes():
  env, model, engine, states, box = setup()
  base = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
                row_buckets="full", share_prefix=False)
  policy = methods.get("tree_grpo")(rollout_config().rollout)
  out, box[0] = run(base, policy, box[0], states, jax.random.key(0), capacity=CAPACITY)
  shared, _ = cached("tree_grpo")
  out = jax.device_get(out)
  np.testing.assert_array_equal(out.tree.tokens, shared.tree.tokens)
  np.testing.assert_allclose(out.tree.logprobs, shared.tree.logprobs, atol=2e-4)
  assert (np.asarray(out.budget.reused) == 0).all()
  np.testing.assert_array_equal(np.asarray(out.budget.prefilled),
                                np.asarray(shared.budget.prefilled) + np.asarray(shared.budget.reused))


def test_engine_steps_trace_once_per_shape():
  import chex
  env, model, _, states, box = setup()
  eng = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
               row_buckets="full")
  chex.clear_trace_counter()
  eng._commit_jit = jax.jit(chex.assert_max_traces(eng._commit, n=1), donate_argnums=(0, 1),
                          static_argnames=("shards", "widths"))
  eng._plan_jit = jax.jit(chex.assert_max_traces(eng._plan, n=1), static_argnums=(4, 5, 6, 7, 8, 9))
  policy = methods.get("chain")(rollout_config().rollout)
  for seed in range(2):   # 3 turns x 2 rollouts, one trace each
    out, box[0] = run(eng, policy, box[0], states, jax.random.key(seed), capacity=CAPACITY)
  assert int(out.tree.size.sum()) > P


def test_gigpo_on_a_tree_rollout_anchors_each_turn_at_its_parents_state():
  """Step-level advantages work on trees as on chains: each turn's anchor is the env
  `state_key` of the node it acted from (walked here node by node); within every anchor group
  of a prompt the step advantages (GiGPO less its episode part) sum to 0, and the first turns
  of the prompt's trees all act from its initial state; the learner takes the per-turn
  advantages in both batch formats."""
  from tree_rl.learner import advantages as adv_lib
  from tree_rl.learner.batches import LeafBatch, PackedBatch
  from tree_rl.learner.from_rollout import learner_batches, step_inputs
  out, _ = cached("tree_grpo")
  env = FrozenLake("rllm", tokenizer=TOK, min_size=2, max_size=4, max_reply_tokens=6)
  cfg = rollout_config()
  cfg.learner.advantage = "gigpo"
  steps = jax.device_get(step_inputs(out, 3))
  t = jax.device_get(out.tree)
  leaf = np.asarray(out.leaf)
  for p in range(P):
    for j in range(leaf.shape[1]):
      path, node = [], int(leaf[p, j])
      while node >= 0:
        path.append(node)
        node = int(t.parent[p, node])
      path = path[::-1]                                  # root first
      row = p * leaf.shape[1] + j
      for d in range(3):
        if leaf[p, j] >= 0 and d + 1 < len(path):
          state = jax.tree.map(lambda x: x[p, path[d]], t.env_state)
          assert steps.node[row, d] == path[d + 1]
          assert steps.state_key[row, d] == int(env.state_key(state))
        else:
          assert not steps.mask[row, d]
  inp = advantage_inputs(out)
  # the episode part with each trajectory once is `grpo` (step_rows weighs it by turns)
  full = np.asarray(adv_lib.compute("gigpo", **inp, steps=steps, step_weight=1.0, step_gamma=0.9,
                                    episode_stats="trajectories"))
  episode = np.asarray(adv_lib.get("grpo")(**inp))
  valid = np.asarray(inp["valid"])
  step = full - episode[:, None]
  groups = 0
  for p in range(P):
    rows = np.arange(p * leaf.shape[1], (p + 1) * leaf.shape[1])
    rows = rows[valid[rows]]
    keys = steps.state_key[rows][steps.mask[rows]]
    assert len(set(steps.state_key[rows, 0].tolist())) == 1    # one initial state per prompt
    for k in set(keys.tolist()):
      members = step[rows][steps.mask[rows] & (steps.state_key[rows] == k)]
      assert abs(float(members.sum())) < 1e-4
      groups += len(members) > 1 and np.abs(members).max() > 0
  assert groups > 0                                            # some anchor compared turns
  for packed, kind in ((True, PackedBatch), (False, LeafBatch)):
    cfg.learner.packed = packed
    (batch,) = learner_batches(cfg, out)
    assert isinstance(batch, kind)


def test_observation_prefill_runs_only_the_branches_that_go_on(monkeypatch):
  """With live-row buckets an observation prefill runs on the branches that go on only, compacted
  into a power of two of their count (at least an eighth of all slots: a row count decode uses
  too), fewer rows than the turn decoded once branches end, none after the last turn, and
  builds the same tree."""
  from tree_rl import sampling
  from tree_rl.buckets import pow2_bucket
  env, model, _, states, box = setup()
  eng = Engine(env, TOK, max_turns=3, max_tokens_per_turn=6, attention="reference",
               row_buckets="pow2")
  calls, real = [], sampling.prefill

  def spy(cache, slots, tokens, lengths, valid=None, **kw):
    if kw.get("run", True):   # not the ahead-of-time builds of a last turn's row count
      calls.append((tokens.shape[0], tokens.shape[0] if valid is None else int(np.sum(valid))))
    return real(cache, slots, tokens, lengths, valid, **kw)

  monkeypatch.setattr(sampling, "prefill", spy)
  turns, advance = [], eng.advance

  def count(rs, *a, **kw):
    n = len(calls)
    rs, children = advance(rs, *a, **kw)
    decoded = int(np.sum(np.asarray(children) >= 0))
    turns.append(decoded)
    paired.extend((call, decoded) for call in calls[n:n + 1])   # the turn's first obs chunk
    return rs, children
  paired = []

  monkeypatch.setattr(eng, "advance", count)
  policy = methods.get("tree_grpo")(rollout_config().rollout)
  out, box[0] = run(eng, policy, box[0], states, jax.random.key(0), capacity=CAPACITY)
  # the prompts, then one per turn that leaves a branch going on: fewer than the decoded turns
  assert 2 <= len(calls) < 1 + sum(t > 0 for t in turns), (calls, turns)
  assert calls[0] == (P, P) and len(paired) == len(calls) - 1, (calls, turns)
  full = P * policy.slots   # rows: a power of two of the branches going on, at least full / 8
  bucket = lambda n: min(full, max(pow2_bucket(n), pow2_bucket(full // 8)))  # noqa: E731
  assert all(1 <= n <= t and rows == bucket(n) for (rows, n), t in paired), (paired, full)
  # a turn whose branches partly ended prefills fewer rows than it decoded
  assert any(rows < bucket(t) for (rows, _), t in paired), f"none narrower than its decode: {paired}"
  shared, _ = cached("tree_grpo")
  np.testing.assert_array_equal(jax.device_get(out.tree.tokens), shared.tree.tokens)
