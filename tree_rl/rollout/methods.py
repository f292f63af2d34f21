"""Rollout methods over the one engine, and a registry of them.

A rollout method (the branching rule, not the LM policy) chooses, at every turn boundary, the parent node of each branch of the next turn
(`parents [P, S]`, -1 for none; a parent listed m times forks into m children):

- `chain`:       G children of the root, each continued alone (GRPO/RLOO's group);
- `tree_grpo`:   M chains (one per tree), then L rounds of N expansion points per tree drawn
                 among the root and non-leaf nodes, each run to the end of the episode; K
                 random leaves per tree enter the group (`keep_leaves`, the public code's
                 `sample_leaf(k)`; 0 keeps all);
- `patr`:        B0 children of the root; every K turns the frontier is scored and routed
                 (expand top-k into M children / survive / prune), the repeated-action rule
                 at every turn; pruned branches stay in the group (or are dropped), or only
                 the n best-scored leaves do (`keep_best`, the paper's Best_n ablation);
- `tree_random`: `patr` with the `random` scorer.
- `arpo`:        ARPO (arXiv 2507.19849) as its public rollout runs it: a group of
                 max_branches rollouts (its n), initial_branches chains from the root (n / 2
                 in its scripts); after a turn that made a tool call (on FrozenLake every move
                 is one: after every observation), a running branch forks
                 expand_children - 1 new branches (beam 2: one) that continue from its context,
                 observation included, each with probability clip(alpha + beta * dH, 0, 1)
                 (`arpo_rule=stochastic`: one uniform draw per possible fork, keyed by the
                 prompt and node ids) or all when dH > entropy_threshold (`threshold`, the
                 deterministic variant). dH = H - H_0, H the entropy of the reply just made
                 (`Tree.entropy`: `arpo_entropy=reference` sums the top-10 log-prob entropy of
                 its first entropy_tokens tokens / ln V, `mean` is the exact mean entropy in
                 nats) and H_0 that of the first reply of the same rollout (a chain's first
                 reply, a fork's own first). Forks are granted in slot order while the group has
                 room; a prompt with no running branch starts one fresh chain a turn until the
                 group holds max_branches (its group filling), so every group is full unless a
                 budget cap refuses.

Register a new method with `@register("name", fields=...)` on a `factory(rcfg) -> RolloutMethod`;
`fields` are its own `config.rollout` fields (name -> `tree_rl.fields.Field(default, range, doc)`:
the config schema adds them and checks their ranges; the factory checks what spans several
fields and raises a ValueError naming them). Its class fills in what `RolloutMethod` leaves
abstract: `capacity`, `first`, `next` and `planned_trajectories` (the cost
`tree_rl.rollout.budget` plans and the reports print).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from tree_rl import fields as fields_lib
from tree_rl.fields import Field
from tree_rl.rollout import routing
from tree_rl.rollout.tree import Tree, gather
from tree_rl.registry import Registry


def alive(tree: Tree, nodes: jax.Array) -> jax.Array:
  """bool [P, S]: nodes that exist and have not ended."""
  ok = nodes >= 0
  ended = gather(tree.finished | tree.truncated | tree.pruned, nodes)
  return ok & ~ended


@dataclasses.dataclass(frozen=True)
class RolloutMethod(abc.ABC):
  """Static description plus pure per-boundary decisions (all jittable)."""

  name: str
  num_trees: int
  slots: int
  keep_contexts: bool            # interior nodes keep their sampler slot (later expansions)
  score_every: int = 0           # scoring rounds every this many turns (0: never)
  scorer_override: str | None = None
  entropy_tokens: int = 0        # the engine must report the entropy of this many reply tokens
  entropy_top: int = 0           # ... as a top-m log-prob listing shows it (0: the exact entropy)
  keep_roots: bool = False       # roots keep their sampler slot (branches start from them later)
  keep_only_requested: bool = False   # with keep_contexts: at each boundary, release every node
                                      # the next turn does not branch from

  @abc.abstractmethod
  def capacity(self, max_turns: int) -> int:
    """Most tree nodes a prompt's rollout can create."""

  @abc.abstractmethod
  def planned_trajectories(self, max_turns: int) -> float:
    """Planned cost per prompt, in full trajectories, if every branch runs to `max_turns`
    (`tree_rl.rollout.budget`: x one trajectory's cost for a unit)."""

  def init(self, num_prompts: int) -> Any:
    return jnp.zeros((num_prompts,), jnp.int32)

  @abc.abstractmethod
  def first(self, tree: Tree, pstate):
    """-> (parents [P, S], pstate) right after the roots exist."""

  @abc.abstractmethod
  def next(self, tree: Tree, frontier, pstate, scores, key):
    """-> (parents [P, S], pstate, pruned [P, S]) after a turn; `scores` [P, S] or None."""

  def keep_leaves(self, tree: Tree, key) -> jax.Array:
    """bool [P, N]: leaves that enter the training group."""
    return tree.is_leaf

  def max_leaves(self) -> int:
    """Most leaves a prompt's rollout can end with (the width of the group arrays)."""
    return self.slots


def root_branches(num_prompts: int, count: int, slots: int) -> jax.Array:
  """parents [P, slots]: `count` children of the root in the first slots, -1 in the rest."""
  parents = jnp.where(jnp.arange(slots) < count, 0, -1).astype(jnp.int32)
  return jnp.broadcast_to(parents, (num_prompts, slots))


def prompt_keys(key: jax.Array, tree: Tree) -> jax.Array:
  """Keys [P], one per prompt: fold_in(key, prompt id), the same wherever the prompt sits in
  the batch (several hosts roll out different slices of a step's prompts)."""
  return jax.vmap(lambda p: jax.random.fold_in(key, p))(tree.prompt_id)


def _pad(x, width):
  return jnp.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=-1)


@dataclasses.dataclass(frozen=True)
class Chain(RolloutMethod):
  group_size: int = 8

  def capacity(self, max_turns):
    return 1 + self.group_size * max_turns

  def planned_trajectories(self, max_turns):
    """G chains."""
    return float(self.group_size)

  def first(self, tree, pstate):
    return jnp.zeros((tree.num_prompts, self.slots), jnp.int32), pstate

  def next(self, tree, frontier, pstate, scores, key):
    """Continue the running chains; ask for the chains not yet started (the budget cap may
    have refused them) in the free slots."""
    go = alive(tree, frontier)
    cont = jnp.where(go, frontier, -1)
    want = self.group_size - tree.num_children[:, 0]
    free = cont < 0
    start = free & (jnp.cumsum(free, axis=1) <= want[:, None])
    return jnp.where(start, 0, cont), pstate, jnp.zeros_like(go)


@dataclasses.dataclass(frozen=True)
class TreeGRPO(RolloutMethod):
  expand_nodes: int = 2
  expand_iterations: int = 1
  keep_k: int = 0

  def capacity(self, max_turns):
    return self.num_trees + self.max_leaves() * max_turns

  def max_leaves(self):
    return self.num_trees * (1 + self.expand_iterations * self.expand_nodes)

  def planned_trajectories(self, max_turns):
    """M * (1 + L * N / 2): the paper's E[B_tree] = M*B + L*N*B/2 with its N counted over the M
    trees; here N is per tree, so M*L*N expansions start half-way down on average (6
    trajectories for 4 at M=N=2, L=1: the paper's 1.5x)."""
    return self.num_trees * (1 + self.expand_iterations * self.expand_nodes / 2)

  def first(self, tree, pstate):
    p = tree.num_prompts
    roots = jnp.broadcast_to(jnp.arange(self.num_trees, dtype=jnp.int32), (p, self.num_trees))
    return _pad(roots, self.slots), pstate

  def next(self, tree, frontier, pstate, scores, key):
    go = alive(tree, frontier)
    cont = jnp.where(go, frontier, -1)
    running = jnp.any(go, axis=1)
    start = ~running & (pstate < self.expand_iterations)
    candidate = tree.used & ((tree.depth == 0) | (tree.num_children > 0))
    keys = prompt_keys(key, tree)
    picks = jax.vmap(lambda k, c, t: routing.tree_grpo_pick(k, c, t, self.num_trees,
                                                            self.expand_nodes))(
        keys, candidate, tree.tree_id)
    picks = _pad(picks, self.slots)
    parents = jnp.where(start[:, None], picks, cont)
    return parents, pstate + start, jnp.zeros_like(go)

  def keep_leaves(self, tree, key):
    keys = prompt_keys(key, tree)
    return jax.vmap(lambda k, l, t: routing.keep_random_leaves(k, l, t, self.num_trees, self.keep_k))(
        keys, tree.is_leaf, tree.tree_id)


@dataclasses.dataclass(frozen=True)
class Branching(RolloutMethod):
  """B0 branches from the root, then branches started by the method up to a per-prompt cap."""

  initial_branches: int = 4
  expand_children: int = 2
  max_branches: int = 16

  def capacity(self, max_turns):
    return 1 + self.max_branches * max_turns

  def first(self, tree, pstate):
    return root_branches(tree.num_prompts, self.initial_branches, self.slots), pstate

  def room(self, tree) -> jax.Array:
    """int32 [P]: branches each prompt may still start (started so far: its leaves)."""
    return self.max_branches - jnp.sum(tree.is_leaf, axis=1)


@dataclasses.dataclass(frozen=True)
class PATR(Branching):
  expand_top_k: int = 2
  prune_alpha: float = 0.5
  prune_repeat: int = 6
  keep_pruned: bool = True
  keep_best: int = 0

  def schedule(self, max_turns: int) -> tuple[float, int]:
    """`routing.patr_route` on B0 branches that all stay alive and unpruned: -> (trajectories,
    branches started). At every scoring round r (turn r*K < max_turns) the expansions start
    branches that run (max_turns - r*K) / max_turns of a trajectory."""
    alive = self.initial_branches
    total = float(alive)
    extra, k = self.expand_children - 1, self.score_every
    for depth in range(k, max_turns, k):
      if extra <= 0:
        break
      new = min(self.expand_top_k, alive, (self.max_branches - alive) // extra) * extra
      total += new * (max_turns - depth) / max_turns
      alive += new
    return total, alive

  def planned_trajectories(self, max_turns):
    return self.schedule(max_turns)[0]

  def next(self, tree, frontier, pstate, scores, key):
    go = alive(tree, frontier)
    run = gather(tree.action_run, frontier)
    if scores is None:
      route = jax.vmap(lambda a, r: routing.loop_prune(a, r, self.prune_repeat))(go, run)
    else:
      room = self.room(tree)
      route = jax.vmap(lambda s, a, r, m: routing.patr_route(
          s, a, r, alpha=self.prune_alpha, theta=self.prune_repeat, top_k=self.expand_top_k,
          children=self.expand_children, room=m))(scores, go, run, room)
    parents, _ = jax.vmap(lambda f, m: routing.expand_plan(f, m, self.slots))(
        frontier, route.multiplicity)
    return parents, pstate, route.prune

  def keep_leaves(self, tree, key):
    """The group: every leaf, less the pruned ones unless `keep_pruned`; with `keep_best` = n,
    only the n best of those by `routing.best_leaf_score` (the paper's Best_n)."""
    keep = tree.is_leaf & (~tree.pruned if not self.keep_pruned else True)
    if self.keep_best:
      rank = jax.vmap(routing.best_leaf_score)(tree.score, tree.parent, tree.finished, tree.ret)
      keep = jax.vmap(lambda r, c: routing.keep_best_leaves(r, c, self.keep_best))(rank, keep)
    return keep


@dataclasses.dataclass(frozen=True)
class ARPO(Branching):
  rule: str = "stochastic"
  alpha: float = 0.5
  beta: float = 0.2
  entropy_threshold: float = 0.0

  def planned_trajectories(self, max_turns):
    """Its full group of max_branches rollouts, each at most a whole trajectory (fresh chains
    fill the group; a fork starts after its parent's turn and costs less)."""
    return float(self.max_branches)

  def next(self, tree, frontier, pstate, scores, key):
    """Running branches continue and may fork; a prompt with none starts a chain (docstring)."""
    go = alive(tree, frontier)
    called = gather(tree.tool_calls, frontier) > 0
    start = jax.vmap(routing.rollout_start)(tree.parent, tree.depth, tree.used)
    rise = gather(tree.entropy, frontier) - gather(tree.entropy, gather(start, frontier))
    z = max(self.expand_children - 1, 0)
    # one uniform per (prompt, frontier node, fork): node ids are the prompt's own, so the
    # draws do not depend on where the prompt sits in the batch or on the shard count
    draws = jax.vmap(lambda k, f: jax.vmap(lambda n: jax.random.uniform(
        jax.random.fold_in(k, jnp.maximum(n, 0)), (z,)))(f))(prompt_keys(key, tree), frontier)
    want = jax.vmap(lambda r, m, d: routing.arpo_wants(
        r, m, d, rule=self.rule, alpha=self.alpha, beta=self.beta,
        threshold=self.entropy_threshold))(rise, go & called, draws)
    room = self.room(tree)
    forks = jax.vmap(routing.grant_in_order)(want, room)
    fill = ~jnp.any(go, axis=1) & (room > 0)
    src = jnp.concatenate([frontier, jnp.zeros((frontier.shape[0], 1), frontier.dtype)], axis=1)
    mult = jnp.concatenate([go * (1 + forks), fill[:, None]], axis=1).astype(jnp.int32)
    parents, _ = jax.vmap(lambda f, m: routing.expand_plan(f, m, self.slots))(src, mult)
    return parents, pstate, jnp.zeros_like(go)


Factory = Callable[[Any], RolloutMethod]
_REGISTRY = Registry("rollout method", "config.rollout.method")
get = _REGISTRY.get
names = _REGISTRY.names


def register(name: str, fields: dict[str, Field] | None = None, *, overwrite: bool = True):
  """Decorator: `@register("name", fields={...})` on a `factory(config.rollout) -> RolloutMethod`
  registers it and declares its own `config.rollout` fields (module docstring)."""

  def deco(factory: Factory) -> Factory:
    fields_lib.declare("rollout", name, fields)
    return _REGISTRY.register(name, overwrite=overwrite)(factory)

  return deco


_INT_POS, _INT_NN, _SPAN = "int [1 _)", "int [0 _)", "num [-100 100]"
_BRANCHING = dict(
    initial_branches=Field(4, _INT_POS, "branches started per prompt from the root (B0; ARPO's "
                           "initial rollouts)"),
    expand_children=Field(2, _INT_POS, "children of an expanded branch (M); arpo: its beam (a "
                          "forking branch gets expand_children - 1 new ones)"),
    max_branches=Field(16, _INT_POS, "cap on branches started per prompt; arpo: its group size n "
                       "(chains fill the group when a prompt has no running branch)"),
)
_PATR = dict(
    _BRANCHING,
    score_every=Field(5, _INT_POS, "agent steps between scoring rounds (K)"),
    expand_top_k=Field(2, _INT_NN, "branches expanded per scoring round"),
    prune_alpha=Field(0.5, _SPAN, "prune a branch scored s < median(active s) - alpha"),
    prune_repeat=Field(6, _INT_NN, "prune after the same action Theta times in a row; 0 off"),
    keep_pruned=Field(True, "", "pruned branches stay in the group (else dropped)"),
    keep_best=Field(0, _INT_NN, "only the n best-scored leaves enter the group (Best_n); 0 off"),
)


@register("chain", dict(group_size=Field(8, _INT_POS, "trajectories per prompt (G)")))
def make_chain(rc) -> RolloutMethod:
  return Chain(name="chain", num_trees=1, slots=int(rc.group_size), keep_contexts=False,
               group_size=int(rc.group_size))


@register("tree_grpo", dict(
    num_trees=Field(2, _INT_POS, "trees per prompt (M)"),
    expand_nodes=Field(2, _INT_POS, "expansion nodes per tree per iteration (N)"),
    expand_iterations=Field(1, _INT_NN, "expansion iterations (L); leaves = M * (L * N + 1)"),
    keep_leaves=Field(3, _INT_NN, "random leaves kept per tree (K, public code: 3); 0 keeps all")))
def make_tree_grpo(rc) -> RolloutMethod:
  m, n, k = int(rc.num_trees), int(rc.expand_nodes), int(rc.keep_leaves)
  per_tree = 1 + int(rc.expand_iterations) * n
  if k > per_tree:   # the public code asserts every tree has at least K leaves
    raise ValueError(
        f"config.rollout.keep_leaves={k} random leaves per tree, but a tree of expand_nodes={n} "
        f"x expand_iterations={rc.expand_iterations} has 1 + L*N = {per_tree} leaves: set "
        f"keep_leaves <= {per_tree} (0 keeps all) or grow expand_nodes / expand_iterations")
  return TreeGRPO(name="tree_grpo", num_trees=m, slots=max(m, m * n), keep_contexts=True,
                  expand_nodes=n, expand_iterations=int(rc.expand_iterations),
                  keep_k=k)


def _check_branches(rc) -> None:
  if int(rc.initial_branches) > int(rc.max_branches):
    raise ValueError(f"config.rollout.initial_branches={rc.initial_branches} exceeds "
                     f"config.rollout.max_branches={rc.max_branches}")


def _patr(rc, name, scorer=None) -> RolloutMethod:
  _check_branches(rc)
  if int(rc.keep_best) > int(rc.max_branches):
    raise ValueError(f"config.rollout.keep_best={rc.keep_best} must be in [0, max_branches="
                     f"{rc.max_branches}] (the most leaves a group can have; 0 keeps all)")
  return PATR(name=name, num_trees=1, slots=int(rc.max_branches), keep_contexts=False,
              score_every=int(rc.score_every), scorer_override=scorer,
              initial_branches=int(rc.initial_branches), expand_children=int(rc.expand_children),
              expand_top_k=int(rc.expand_top_k), prune_alpha=float(rc.prune_alpha),
              prune_repeat=int(rc.prune_repeat), keep_pruned=bool(rc.keep_pruned),
              keep_best=int(rc.keep_best),
              max_branches=int(rc.max_branches))


@register("patr", _PATR)
def make_patr(rc) -> RolloutMethod:
  return _patr(rc, "patr")


@register("tree_random", _PATR)
def make_tree_random(rc) -> RolloutMethod:
  return _patr(rc, "tree_random", scorer="random")


@register("arpo", dict(
    _BRANCHING,
    arpo_rule=Field("stochastic", "", "stochastic (fork with P = clip(alpha + beta * dH, 0, 1), "
                    "the public code) | threshold (fork when dH > entropy_threshold)"),
    arpo_alpha=Field(0.5, _SPAN, "base branch probability (public scripts: 0.5)"),
    arpo_beta=Field(0.2, _SPAN, "weight of the entropy change dH (public scripts: 0.2)"),
    arpo_entropy=Field("reference", "", "reference (top-10 log-prob entropy summed over the first "
                       "entropy_tokens tokens, / ln V) | mean (exact mean entropy, nats)"),
    entropy_tokens=Field(20, _INT_POS, "a reply's entropy is taken over its first k tokens "
                         "(public code: 20)"),
    entropy_threshold=Field(0.0, _SPAN, "arpo_rule=threshold: fork when H_t - H_0 exceeds this"),
))
def make_arpo(rc) -> RolloutMethod:
  _check_branches(rc)
  if rc.arpo_rule not in routing.ARPO_RULES:
    raise ValueError(f"config.rollout.arpo_rule={rc.arpo_rule!r}; known: {routing.ARPO_RULES}")
  if rc.arpo_entropy not in ARPO_ENTROPY:
    raise ValueError(f"config.rollout.arpo_entropy={rc.arpo_entropy!r}; known: {tuple(ARPO_ENTROPY)}")
  return ARPO(name="arpo", num_trees=1, slots=int(rc.max_branches), keep_contexts=False,
              entropy_tokens=int(rc.entropy_tokens), entropy_top=ARPO_ENTROPY[rc.arpo_entropy],
              keep_roots=True, initial_branches=int(rc.initial_branches),
              expand_children=int(rc.expand_children), max_branches=int(rc.max_branches),
              rule=str(rc.arpo_rule), alpha=float(rc.arpo_alpha), beta=float(rc.arpo_beta),
              entropy_threshold=float(rc.entropy_threshold))


# config.rollout.arpo_entropy -> the engine's entropy_top: the public code's listing of the top
# 10 log-probs (summed over the tokens, / ln V), or the exact entropy (mean over the tokens)
ARPO_ENTROPY = {"reference": 10, "mean": 0}
