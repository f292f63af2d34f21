"""The one rollout engine: agent turns over a tree of sampler sequences and env-state snapshots.

An agent turn (`Engine.advance`) for a set of (parent node -> new child node) requests:

    fork the parent's sampler sequence (shared pages) and env handle into the child   [sampler]
    decode one turn for every child                                                   [sampler]
    step the env from the parent's state with the reply, render the observation,      [env, one jit]
      write the child node into the tree, charge the budget
    prefill the observation tokens into the child's sequence                          [sampler]

Every node keeps its context in its own sampler slot (`rows.slot_ids`) and its env state in
the tree, so a branch can start from any kept node: a parent listed m times forks into m
children that continue the real environment state. Host round trips happen only at turn
boundaries (a handful of jitted calls per turn). Method policies (`methods.py`) only choose the
parents of the next turn.

Device and host environments step through one interface (`steppers.py`): a host env
(`tree_rl.envs.host.HostEnv`: a workspace, a process) keeps a handle per node, forked where the
node's KV pages fork (or handed over when the parent's pages are freed after the turn), stepped
on the host with the decoded reply, and released where the node's pages are freed (`close`
releases every handle of a rollout that fails). Rows and their shard compaction live in
`rows.py`, the tree writes of a turn in `commit.py`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl import sampling
from tree_rl.compile_cache import light_jit, to_device
from tree_rl.rollout import commit
from tree_rl.rollout import tree as tree_lib
from tree_rl.rollout.budget import Budget, CostModel, per_parent_forks
from tree_rl.rollout.host_nodes import HostNodes
from tree_rl.rollout.rows import (Layout, ObsRows, TurnPlan, bucket_requests, busiest_shard,
                                  fork_rows, layout_slots, node_keys, row_counts, shard_rows,
                                  shard_width, slot_ids)
from tree_rl.rollout.steppers import stepper_for

__all__ = ["Engine", "Layout", "RolloutError", "RolloutState", "TurnPlan", "ObsRows",
           "busiest_shard", "check_turn_limits", "layout_slots", "node_keys", "shard_rows",
           "shard_width", "slot_ids"]


@dataclasses.dataclass
class RolloutState:
  cache: Any                 # sampling.Cache
  tree: tree_lib.Tree
  budget: Budget
  live: jax.Array            # bool [P, N] node slots holding a sampler sequence
  peak_pages: jax.Array      # int32 [] largest pages_in_use seen
  layout: Layout
  turns: int = 0
  shards: int = 1            # the cache's data shards: prompts [d*P/D, (d+1)*P/D) live on shard d
  handles: HostNodes | None = None   # a host env's handle per node (None: a device env)

  def slots(self, wp, nodes) -> jax.Array:
    """Sampler slots of nodes `nodes` of batch prompts `wp` (`slot_ids`)."""
    return slot_ids(wp, nodes, self.layout, self.shards, self.cache.spec.max_seqs)


@dataclasses.dataclass
class Turn:
  """One turn in flight between the steps of `Engine.advance` (W rows)."""

  plan: TurnPlan
  children: jax.Array       # int32 [P, S] new child nodes (-1: none)
  parent_slots: jax.Array   # int32 [W]
  child_slots: jax.Array    # int32 [W]
  keys: jax.Array           # [W] the rows' decode keys (`node_keys`)
  live: jax.Array           # bool [P, N] live slots once the children hold sequences
  drop: jax.Array           # bool [P, N] parents released after the decode
  width: int                # W
  env_rows: Any = None      # what the stepper's fork hands its `act`
  forked: Any = None        # bool [W] rows whose sequence was forked
  fork_status: Any = None   # int32 [W] the sampler's fork status


@dataclasses.dataclass
class Observations:
  """A committed turn's observations to prefill: `going` holds (rows, first chunk) for each row
  count in `widths`; `sizes` = (longest observation, going rows of the busiest data shard)."""

  sizes: jax.Array
  widths: tuple[int, ...]
  going: list


class RolloutError(RuntimeError):
  """The sampler could not hold the rollout (page pool or sequence capacity)."""


def check_turn_limits(max_turns: int, max_tokens_per_turn: int) -> None:
  """The turn limits every rollout needs (config.rollout.max_turns / max_tokens_per_turn)."""
  for name, value in (("max_turns", max_turns), ("max_tokens_per_turn", max_tokens_per_turn)):
    if int(value) < 1:
      raise ValueError(f"config.rollout.{name} must be >= 1, got {value}")


def _temperatures(temperature) -> tuple[float, ...]:
  temps = tuple(float(t) for t in np.atleast_1d(temperature))
  if not temps or min(temps) < 0:
    raise ValueError(f"temperature must be >= 0 (one, or one per request slot), got {temperature}")
  return temps


def _check_options(row_buckets: str, obs_chunk: int, entropy_tokens: int, entropy_top: int):
  if row_buckets not in ("pow2", "full"):
    raise ValueError(f"row_buckets must be 'pow2' or 'full', got {row_buckets!r}")
  for name, value, zero in (("obs_chunk", obs_chunk, "the whole observation at once"),
                            ("entropy_tokens", entropy_tokens, "no entropy"),
                            ("entropy_top", entropy_top, "the whole distribution")):
    if int(value) < 0:
      raise ValueError(f"{name} must be >= 0 (0: {zero}), got {value}")


class Engine:
  """Drives the sampler and one environment; knows nothing about rollout methods.

  env: a `tree_rl.envs.TokenEnv` or `tree_rl.envs.HostEnv` (token rendering, action parsing,
  tool-call accounting); tokenizer: the policy's tokenizer (stop ids). Sampling:
  max_tokens_per_turn, temperature (one
  for every branch, or one per request slot: slot s of a prompt's requests decodes at
  temperature[s]; a chain keeps chain s in slot s, so an evaluation runs greedy and sampled
  chains in one rollout), top_k, top_p; attention: the sampler's paged attention (auto | cascade | reference).
  row_buckets: 'pow2' decodes only the live branches, padded to a power of two of at least an
  eighth of every slot (`shard_width`: at most four shapes),
  'full' always decodes every slot (one shape); observations are prefilled on the branches
  that go on only, compacted and padded the same way (with 'full', on every slot), so decode
  and prefill share one set of row counts.
  obs_chunk: observations are prefilled `obs_chunk` tokens per call, as many calls as the turn's
  longest observation needs (a row pads less than one chunk; one program per row count, never
  one per observation length); 0 prefills the whole observation capacity in one call.
  share_prefix=False is the no-sharing baseline: a
  new branch re-encodes its whole root..parent context instead of forking the parent's pages.
  entropy_tokens=k > 0 has the sampler report the entropy of each reply's first k tokens and
  stores their mean in `Tree.entropy` (a method that branches on it, e.g. `arpo`); 0 computes
  none (the tree's entropy stays 0). entropy_top=m > 0 stores instead the sum over those tokens
  of what a top-m log-prob listing shows, / ln V (ARPO's public code: m = 10, k = 20).
  """

  def __init__(self, env, tokenizer, *, max_turns: int, max_tokens_per_turn: int,
               temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               env_params=None, attention: str = "auto", max_shared_pages: int = 256,
               row_buckets: str = "pow2", share_prefix: bool = True, obs_chunk: int = 64,
               entropy_tokens: int = 0, entropy_top: int = 0):
    check_turn_limits(max_turns, max_tokens_per_turn)
    self.temperatures = _temperatures(temperature)
    _check_options(row_buckets, obs_chunk, entropy_tokens, entropy_top)
    self.env, self.tokenizer = env, tokenizer
    self.env_params = env.default_params if env_params is None else env_params
    self.max_turns, self.max_new = int(max_turns), int(max_tokens_per_turn)
    self.top_k, self.top_p = int(top_k), float(top_p)
    self.attention, self.max_shared_pages = attention, int(max_shared_pages)
    self.row_buckets, self.share_prefix = row_buckets, bool(share_prefix)
    self.obs_chunk = int(obs_chunk)
    self.entropy_tokens, self.entropy_top = int(entropy_tokens), int(entropy_top)
    self.stop_ids = tuple(tokenizer.stop_ids)
    self.eot = int(tokenizer.end_of_turn_id)
    self.stepper = stepper_for(env, self.env_params, self.eot)
    self.prompt_capacity = self.stepper.prompt_capacity
    self.obs_capacity = self.stepper.obs_capacity
    self.node_tokens = max(self.prompt_capacity, self.max_new + self.obs_capacity)
    self.chunk_tokens = self.obs_chunk or self.obs_capacity   # observation tokens per prefill call
    self._build_programs()
    self._slots = {}   # (layout, shards, seqs) -> device slots [P * N] of every node
    self._prefill_built = set()   # (cache spec, mesh, rows) of the observation prefills built

  def _build_programs(self) -> None:
    """Every array operation between sampler calls is one of these jitted pieces (an eager op
    would compile a program of its own for every shape it meets)."""
    self._init_jit = light_jit(self._init_tree, static_argnums=(2,))
    self._roots_jit = light_jit(self._roots, static_argnums=(4, 5))
    self._busiest_jit = light_jit(busiest_shard, static_argnums=(1,))
    self._plan_jit = light_jit(self._plan, static_argnums=(4, 5, 6, 7, 8, 9))
    self._commit_jit = light_jit(self._commit, donate_argnums=(0, 1),
                                 static_argnames=("shards", "widths"))
    self._charge_jit = light_jit(self._charge_prefill, donate_argnums=(0,))
    self._context_jit = light_jit(self._contexts)
    self._charge_next_jit = light_jit(self._charge_next, static_argnums=(6,), donate_argnums=(0,))
    self._release_jit = light_jit(lambda live, mask: ((mask & live).reshape(-1), live & ~mask))
    self._peak_jit = light_jit(lambda peak, num_free, pages: jnp.maximum(peak, jnp.max(pages - num_free)),
                               static_argnums=(2,))
    self._fork_rows_jit = light_jit(fork_rows, static_argnums=(1, 2))
    self._repeat_jit = light_jit(lambda toks, lens, m: (jnp.repeat(toks, m, axis=0), jnp.repeat(lens, m)),
                                 static_argnums=(2,))

  # ------------------------------------------------------------------ sizes
  @property
  def bucketed(self) -> bool:
    """Turns decode over the live branches' row count (`row_buckets='pow2'`)."""
    return self.row_buckets != "full"

  def max_context(self) -> int:
    """Tokens of the longest root-to-leaf context."""
    return self.prompt_capacity + self.max_turns * (self.max_new + self.obs_capacity)

  def cost_model(self) -> CostModel:
    """Per-branch cost bounds of this engine (the budget cap's `remaining`)."""
    calls = getattr(self.env_params, "max_calls", None)
    return CostModel(self.max_turns, self.max_new, prompt_tokens=self.prompt_capacity,
                     obs_tokens=self.obs_capacity, max_calls=None if calls is None else int(calls),
                     share_prefix=self.share_prefix)

  def row_counts(self, layout: Layout, shards: int) -> list[int]:
    """Every row count a turn of `layout` can decode over (`rows.row_counts`)."""
    return row_counts(layout, shards, self.bucketed)

  def bucket_requests(self, layout: Layout, shards: int) -> list[np.ndarray]:
    """Parent requests [P, S] whose turn decodes over each of `row_counts` in turn
    (`rows.bucket_requests`)."""
    return bucket_requests(layout, shards, self.bucketed)

  def pages_per_seq(self, page_size: int) -> int:
    return -(-(self.max_context() + 1) // page_size)

  # ------------------------------------------------------------------ jitted pieces
  def _init_tree(self, env_states, prompt_ids, layout: Layout, toks=None, lens=None):
    """The roots' tree; a host env's prompt tokens come rendered (toks, lens)."""
    p, m, n = layout.num_prompts, layout.num_trees, layout.capacity
    if toks is None:
      toks, lens = jax.vmap(lambda s: self.env.initial_prompt_tokens(s, self.env_params))(env_states)
    tree = tree_lib.empty(p, n, self.node_tokens, self.stepper.state_example, prompt_id=prompt_ids)
    roots = jnp.arange(m)
    width = toks.shape[1]
    tree = tree.replace(
        used=tree.used.at[:, roots].set(True),
        tree_id=tree.tree_id.at[:, roots].set(roots[None]),
        tokens=tree.tokens.at[:, roots, :width].set(toks[:, None]),
        obs_len=tree.obs_len.at[:, roots].set(lens[:, None]),
        ctx_len=tree.ctx_len.at[:, roots].set(lens[:, None]),
        env_state=jax.tree.map(lambda f, s: f.at[:, roots].set(s[:, None]), tree.env_state,
                               env_states),
        size=jnp.full((p,), m, jnp.int32))
    return tree, toks, lens

  def _roots(self, computed, lens, computed_more, num_free, layout: Layout, pages: int):
    """Budget, live slots and peak pages after `start` prefilled the prompts (computed [P]) and
    forked (or, computed_more [P * (M-1)], re-encoded) them into the other roots."""
    p, m = layout.num_prompts, layout.num_trees
    budget = Budget.zeros(p).add(prefilled=computed)
    live = jnp.zeros((p, layout.capacity), bool).at[:, :m].set(True)
    if m > 1:
      more = (m - 1) * lens if computed_more is None else computed_more.reshape(p, m - 1).sum(1)
      budget = budget.add(forks=jnp.full((p,), m - 1),
                          **{"reused" if computed_more is None else "prefilled": more})
    return budget, live, jnp.max(pages - num_free)

  def _plan(self, tree, live, parents, key, width: int, layout: Layout, shards: int, seqs: int,
            drop_parents: bool, keep_roots: bool):
    """Compact the [P, S] parent requests into `width` rows (grouped by data shard,
    `shard_rows`), allocate child nodes, and name their sampler slots and keys. drop_parents:
    the parents' slots (but the roots' with keep_roots) are released after the decode
    (returned as a [P, N] mask)."""
    mask = parents >= 0
    children, overflow = tree_lib.allocate(tree, mask)
    had = tree_lib.gather(tree.num_children, parents) > 0
    is_fork = per_parent_forks(parents, mask, had)
    s = parents.shape[1]
    flat = shard_rows((children >= 0).reshape(-1), shards, width)
    valid = flat >= 0
    f = jnp.maximum(flat, 0)
    wp = (f // s).astype(jnp.int32)
    take = lambda x: jnp.where(valid, x.reshape(-1)[f], -1)  # noqa: E731
    temps = jnp.asarray(self.temperatures, jnp.float32)
    plan = TurnPlan(prompt=jnp.where(valid, wp, 0), parent=take(parents), child=take(children),
                    valid=valid, fork=valid & is_fork.reshape(-1)[f],
                    temperature=temps[jnp.minimum(f % s, temps.shape[0] - 1)])
    at = lambda nodes: slot_ids(plan.prompt, nodes, layout, shards, seqs)  # noqa: E731
    p_idx = jnp.arange(layout.num_prompts)[:, None]
    live = live.at[p_idx, jnp.where(children >= 0, children, layout.capacity)].set(True, mode="drop")
    drop = jnp.zeros_like(live)
    if drop_parents:
      gone = mask & ~(keep_roots & (parents < layout.num_trees))
      drop = drop.at[p_idx, jnp.where(gone, parents, layout.capacity)].set(True, mode="drop")
    keys = node_keys(key, tree.prompt_id[plan.prompt], plan.child)
    return plan, children, jnp.any(overflow), at(plan.parent), at(plan.child), keys, live, drop

  def _commit(self, tree, budget, plan: TurnPlan, child_slots, out, key, hosted=None, *,
              shards: int = 1, widths: tuple[int, ...] = ()):
    """Step the env for every decoded row of `out` and write the child nodes (one jitted call);
    the env's keys derive from fold_in(key, 1); hosted: a host env's results (`act`). Returns
    (tree, budget, ended [P, N], sizes [2] = (longest observation, going rows of the busiest
    data shard), and for each row count in `widths` the going rows' `ObsRows` and first
    observation chunk: the host picks one once it has read `sizes`, so no program is built per
    pair of row counts)."""
    toks = jnp.where(out.tokens >= 0, out.tokens, 0).astype(jnp.int32)
    lens = jnp.where(plan.valid, out.lengths, 0).astype(jnp.int32)
    wp, par = plan.prompt, jnp.maximum(plan.parent, 0)
    parents = jax.tree.map(lambda x: x[wp, par], tree.env_state)
    step = self.stepper.step(jax.random.fold_in(key, 1), parents, plan, tree.prompt_id[wp],
                             toks, lens, hosted)
    trunc = ~step.done & (tree.depth[wp, par] + 1 >= self.max_turns)
    need_obs = plan.valid & ~step.done & ~trunc
    obs_len = jnp.where(need_obs, step.obs_len, 0).astype(jnp.int32)
    tree = commit.write_children(tree, plan, toks, lens, out.logprobs, step, obs_len, trunc)
    if out.entropy is not None:
      tree = commit.write_entropy(tree, plan, out.entropy, lens, self.entropy_tokens,
                                  self.entropy_top)
    budget = commit.charge_turn(budget, tree, plan, lens, step.tool_calls, self.share_prefix)
    ended = commit.ended_nodes(tree, plan, step.done | trunc)
    sizes = jnp.stack([jnp.max(obs_len), busiest_shard(need_obs, shards)]).astype(jnp.int32)
    going = [ObsRows.going(wp, child_slots, step.obs, obs_len, need_obs, shards, r)
             for r in widths]
    return tree, budget, ended, sizes, [(rows, rows.chunk(0, self.chunk_tokens)) for rows in going]

  def _contexts(self, tree, plan: TurnPlan, child_slots, rows):
    """Root..parent tokens of plan rows `rows`: what the no-sharing baseline re-encodes into
    their child slots; -> prompts, slots, tokens, lengths (at least 1)."""
    from tree_rl.rollout.sequences import path_sequences
    wp, nodes = plan.prompt[rows], plan.parent[rows]
    ids = jnp.full((tree.num_prompts, wp.shape[0]), -1, jnp.int32)
    ids = ids.at[wp, jnp.arange(wp.shape[0])].set(nodes)
    seqs = path_sequences(tree, ids, self.max_context(), self.max_turns)
    r = jnp.arange(wp.shape[0])
    return wp, child_slots[rows], seqs.tokens[wp, r], jnp.maximum(seqs.lengths[wp, r], 1)

  @staticmethod
  def _charge_prefill(budget, wp, computed, ok, status):
    p = budget.prefilled.shape[0]
    ok = ok & (status == sampling.Status.OK)
    return budget.add(prefilled=jax.ops.segment_sum(jnp.where(ok, computed, 0), wp, num_segments=p))

  @staticmethod
  def _charge_next(budget, rows: ObsRows, computed, ok, status, start, tokens: int):
    """Charge one observation chunk's prefill and slice the next one (one program per row
    count): (budget, the chunk at `start`)."""
    budget = Engine._charge_prefill(budget, rows.prompt, computed, ok, status)
    return budget, rows.chunk(start, tokens)

  # ------------------------------------------------------------------ host-level steps
  def _check(self, what: str, status, slots, valid):
    status, slots, valid = (np.asarray(x) for x in jax.device_get((status, slots, valid)))
    bad = valid & (status != sampling.Status.OK)
    if bad.any():
      names = sorted({sampling.Status(int(s)).name.lower() for s in status[bad]})
      raise RolloutError(
          f"sampler {what} failed for slots {slots[bad].tolist()[:8]} ({', '.join(names)}): "
          "raise config.sampler.num_pages (page pool) or lower config.rollout.max_turns / "
          "max_tokens_per_turn (sequence capacity)")

  def _node_slots(self, layout: Layout, shards: int, seqs: int) -> jax.Array:
    key = (layout, shards, seqs)
    if key not in self._slots:
      self._slots[key] = to_device(layout_slots(layout, shards, seqs).reshape(-1))
    return self._slots[key]

  def start(self, cache, env_states, layout: Layout, prompt_ids=None) -> RolloutState:
    """Roots for every prompt's trees: the prompt prefilled once, forked to the other roots."""
    p = layout.num_prompts
    shards = cache.num_shards
    if prompt_ids is None:
      prompt_ids = np.arange(p, dtype=np.int32)
    if p % shards:
      raise ValueError(f"{p} prompts do not split over the sampler cache's {shards} data shards: "
                       f"use a multiple of {shards} prompts")
    if cache.spec.max_seqs < (p // shards) * layout.capacity:
      raise ValueError(f"the sampler cache has {cache.spec.max_seqs} slots per data shard; the "
                       f"rollout needs {(p // shards) * layout.capacity} (prompts per shard x node "
                       f"capacity): size it with rollout.capacity.new_cache")
    handles, env_states, toks, lens = self.stepper.start(env_states, layout)
    try:
      return self._start(cache, env_states, layout, prompt_ids, handles, toks, lens)
    except BaseException:
      self.stepper.close(handles)
      raise

  def _start(self, cache, env_states, layout, prompt_ids, handles, toks, lens) -> RolloutState:
    p, m = layout.num_prompts, layout.num_trees
    shards = cache.num_shards
    tree, toks, lens = self._init_jit(env_states, to_device(prompt_ids, np.int32), layout, toks, lens)
    where = sampling.placement(cache.params) if cache.mesh is None else None
    if where is not None:   # where every later turn's tree lives (its ops read the weights)
      tree, toks, lens = jax.device_put((tree, toks, lens), where)
    tree = self.stepper.place(tree, handles)
    slots = layout_slots(layout, shards, cache.spec.max_seqs)
    slots0 = slots[:, 0]
    chi = slots[:, 1:m].reshape(-1)                       # the other roots, prompt-major
    cache, pre = sampling.prefill(cache, slots0, toks, lens)
    self._check("prefill", pre.status, slots0, np.ones((p,), bool))
    more = None
    if m > 1 and not self.share_prefix:   # baseline: every tree re-encodes the prompt
      toks_more, lens_more = self._repeat_jit(toks, lens, m - 1)
      cache, pre_more = sampling.prefill(cache, chi, toks_more, lens_more)
      self._check("prefill", pre_more.status, chi, np.ones(chi.shape, bool))
      more = pre_more.computed
    elif m > 1:
      cache, st = sampling.fork(cache, np.repeat(slots0, m - 1), chi)
      self._check("fork", st, chi, np.ones(chi.shape, bool))
    budget, live, peak = self._roots_jit(pre.computed, lens, more, cache.state.num_free, layout,
                                         cache.spec.num_pages)
    return RolloutState(cache=cache, tree=tree, budget=budget, live=live, peak_pages=peak,
                        layout=layout, shards=shards, handles=handles)

  def release(self, rs: RolloutState, mask: jax.Array) -> RolloutState:
    """Free the sampler slots (and a host env's handles) of nodes `mask` [P, N] that still
    hold a sequence."""
    flat, live = self._release_jit(rs.live, mask)
    self.stepper.release(rs.handles, flat)
    slots = self._node_slots(rs.layout, rs.shards, rs.cache.spec.max_seqs)
    return dataclasses.replace(rs, cache=sampling.release(rs.cache, slots, flat), live=live)

  def close(self, rs: RolloutState | None) -> None:
    """Release every host handle a rollout still holds (after an error or an interrupt)."""
    if rs is not None:
      self.stepper.close(rs.handles)

  def advance(self, rs: RolloutState, parents: jax.Array, key: jax.Array, *,
              keep_parents: bool, keep_roots: bool = False) -> tuple[RolloutState, jax.Array]:
    """One agent turn for every parent request [P, S] (-1: none; a parent listed m times gets
    m children): fork -> decode -> step envs and commit -> prefill observations. keep_roots:
    roots keep their sampler slot even when keep_parents is off (a budget-capped chain starts
    chains later). Returns (state, children [P, S] local node ids, -1 where none)."""
    # the turn's one host read: the requests themselves, so the plan meets them as host arrays
    # every turn (whatever the program that chose them), and one program serves each shape
    parents = np.asarray(jax.device_get(parents))
    busiest = int(busiest_shard(parents, rs.shards, xp=np))
    if busiest == 0:
      return rs, parents   # every entry is -1: no child
    turn = self._plan_turn(rs, parents, busiest, key, keep_parents, keep_roots)
    rs, turn = self._fork(rs, turn)
    rs, out = self._decode(rs, turn)
    if not keep_parents:
      rs = self.release(rs, turn.drop)
    rs, ended, observations = self._step_and_commit(rs, turn, out, key)
    rs = self._prefill_observations(rs, observations)
    return self.release(rs, ended), turn.children

  def _plan_turn(self, rs: RolloutState, parents, busiest: int, key, keep_parents: bool,
                 keep_roots: bool) -> Turn:
    """The requests compacted into rows (`_plan`), their child nodes, slots and keys."""
    layout = rs.layout
    width = shard_width(busiest, rs.shards, layout.num_prompts * layout.slots, self.bucketed)
    plan, children, overflow, par_slots, child_slots, keys, live, drop = self._plan_jit(
        rs.tree, rs.live, parents, key, width, layout, rs.shards, rs.cache.spec.max_seqs,
        not keep_parents, keep_roots)
    if bool(overflow):
      raise RolloutError("rollout tree node capacity exceeded (internal sizing error)")
    return Turn(plan=plan, children=children, parent_slots=par_slots, child_slots=child_slots,
                keys=keys, live=live, drop=drop, width=width)

  def _fork(self, rs: RolloutState, turn: Turn) -> tuple[RolloutState, Turn]:
    """Each child gets its parent's env handle and sampler sequence (shared pages; the
    no-sharing baseline re-encodes a new branch's context)."""
    turn = dataclasses.replace(turn, env_rows=self.stepper.fork(rs.handles, turn.plan, turn.drop))
    if not self.share_prefix:
      return self._reencode_forks(rs, turn)
    cache, status = sampling.fork(rs.cache, turn.parent_slots, turn.child_slots, turn.plan.valid)
    return (dataclasses.replace(rs, cache=cache),
            dataclasses.replace(turn, forked=turn.plan.valid, fork_status=status))

  def _decode(self, rs: RolloutState, turn: Turn):
    """One agent turn decoded for every child row -> (state, the sampler's output)."""
    cache, out = sampling.decode(rs.cache, turn.child_slots, turn.keys, max_new=self.max_new,
                                 stop_ids=self.stop_ids, temperature=turn.plan.temperature,
                                 top_k=self.top_k, top_p=self.top_p, valid=turn.plan.valid,
                                 attention=self.attention, max_shared_pages=self.max_shared_pages,
                                 entropy_tokens=self.entropy_tokens, entropy_top=self.entropy_top)
    # read after the decode is dispatched
    self._check("fork", turn.fork_status, turn.child_slots, turn.forked)
    msg = sampling.exhaustion_message(cache, turn.child_slots, out)
    if msg:
      raise RolloutError(msg)
    return dataclasses.replace(rs, cache=cache, live=turn.live), out

  def _step_and_commit(self, rs: RolloutState, turn: Turn, out, key):
    """Step every child's env with its reply (a host env acts first, on the host) and write the
    children into the tree (`_commit`) -> (state, ended [P, N], the observations to prefill)."""
    hosted = self.stepper.act(rs.handles, turn.env_rows, out)
    widths = tuple(r for r in self.row_counts(rs.layout, rs.shards) if r <= turn.width)
    tree, budget, ended, sizes, going = self._commit_jit(
        rs.tree, rs.budget, turn.plan, turn.child_slots, out, key, hosted, shards=rs.shards,
        widths=widths)
    rs = dataclasses.replace(rs, tree=tree, budget=budget)
    return rs, ended, Observations(sizes=sizes, widths=widths, going=going)

  def _prefill_observations(self, rs: RolloutState, obs: Observations) -> RolloutState:
    """The observations of the branches that go on (none after the last turn) prefilled into
    their children's sequences, on their rows only; the turn counted."""
    cache, budget = rs.cache, rs.budget
    for rows, first in obs.going:   # every prefill this row count can lead to, built now
      self._build_prefill(cache, budget, rows, first)
    longest, busiest = (int(x) for x in jax.device_get(obs.sizes))
    if busiest:
      full = rs.layout.num_prompts * rs.layout.slots
      rows, first = obs.going[obs.widths.index(shard_width(busiest, rs.shards, full,
                                                           self.bucketed))]
      cache, budget = self._prefill_chunks(cache, budget, rows, first, longest)
    peak = self._peak_jit(rs.peak_pages, cache.state.num_free, cache.spec.num_pages)
    return dataclasses.replace(rs, cache=cache, budget=budget, peak_pages=peak,
                               turns=rs.turns + 1)

  def _prefill_chunks(self, cache, budget, rows: ObsRows, first, longest: int):
    """`chunk_tokens` observation tokens per call, as many calls as the longest one needs (the
    commit sliced the first chunk, each charge slices the next) -> (cache, budget)."""
    chunk = self.chunk_tokens
    toks, lens, ok = first
    for start in range(0, longest, chunk):
      cache, pre = sampling.prefill(cache, rows.slots, toks, lens, ok)
      self._check("prefill", pre.status, rows.slots, ok)
      budget, (toks, lens, ok) = self._charge_next_jit(
          budget, rows, pre.computed, ok, pre.status, start + chunk, chunk)
    return cache, budget

  def _build_prefill(self, cache, budget, rows: ObsRows, first) -> None:
    """Compile (without running) the observation prefill and charge for `rows`' row count once
    (jit finds the program when it is called), so no later step meets a new row count."""
    key = (cache.spec, cache.mesh, rows.slots.shape[0])
    if key in self._prefill_built:
      return
    toks, lens, ok = first
    _, pre = sampling.prefill(cache, rows.slots, toks, lens, ok, run=False)
    c = self.chunk_tokens
    self._charge_next_jit.lower(budget, rows, pre.computed, ok, pre.status, c, c).compile()
    self._prefill_built.add(key)

  def _reencode_forks(self, rs: RolloutState, turn: Turn) -> tuple[RolloutState, Turn]:
    """The no-sharing baseline: a continuation keeps its parent's cache, a new branch
    re-encodes its whole root..parent context (charged as prefilled tokens)."""
    plan = turn.plan
    cont = plan.valid & ~plan.fork
    cache, st = sampling.fork(rs.cache, turn.parent_slots, turn.child_slots, cont)
    w = plan.prompt.shape[0]
    busiest = int(self._busiest_jit(plan.fork, rs.shards)) if self.bucketed else 0
    width = shard_width(busiest, rs.shards, w, self.bucketed)
    rows, fk = self._fork_rows_jit(plan, rs.shards, width)
    wp, slots, ctx, ctx_len = self._context_jit(rs.tree, plan, turn.child_slots, rows)
    cache, pre = sampling.prefill(cache, slots, ctx, ctx_len, fk)
    self._check("prefill", pre.status, slots, fk)
    rs = dataclasses.replace(rs, cache=cache,
                             budget=self._charge_jit(rs.budget, wp, pre.computed, fk, pre.status))
    return rs, dataclasses.replace(turn, forked=cont, fork_status=st)
