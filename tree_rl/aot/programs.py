"""Every model-running program of one RL step of a config, lowered for a topology's devices
from abstract inputs only (no weight is allocated), with the real work each call does.

The step's shapes come from the config through the run's own builders: the env's prompt and
observation capacities, the method's layout, the sampler cache (`rollout.capacity`), the
engine's row buckets and the learner's batches (`from_rollout.make_batches` over synthetic
trees). The workload is stated, not measured: each prompt grows its method's planned number of
trajectories (`budget.planned_trajectories`), every one running `max_turns` turns with full
replies and observations (the longest the config allows); live rows per turn are that many
branches per prompt, rounded to the engine's row bucket. A model scorer (judge or PRM) adds its
programs to the rollout's (`ScorerModel`). Light bookkeeping programs (tree and
env updates, plans) hold no weights and are not listed.

Real work (`Work`) is counted by hand: a forward pass costs 2 x (matmul parameters) FLOPs per
token plus 4 x layers x heads x head_dim per (query, visible key) pair; training 3x that. Bytes
are per chip: the weights a chip must read (its shard; all of them once per pass when fsdp
gathers them) and the KV its rows must read or write once.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tree_rl import envs, sampling
from tree_rl.buckets import pow2_bucket
from tree_rl.learner import from_rollout, sharding
from tree_rl.learner.batches import TrainTree
from tree_rl.learner.train_step import layer_loop_body, logits_loop_body, make_train_step
from tree_rl.models import abstract_model, build_tokenizer
from tree_rl.rollout import build as rollout_build, capacity
from tree_rl.rollout.budget import planned_trajectories
from tree_rl.rollout.engine import Layout, shard_width
from tree_rl.sampling.paged_kernel import kernel_bytes

KV_BYTES = {"bfloat16": 2, "float32": 4}


@dataclasses.dataclass
class Work:
  flops: float = 0.0   # over all chips, one call
  bytes: float = 0.0   # per chip, one call


@dataclasses.dataclass
class Loop:
  """A loop of a program: XLA's cost analysis counts its body once, the tool adds the other
  `steps - 1` iterations from `body`'s cost."""

  name: str                         # decode steps | vocabulary | layers
  steps: int                        # iterations per call
  body: Callable[[], Any]           # -> Lowered: the body alone, or (twin) the program with
  twin: bool = False                # one more iteration, whose extra cost is one body


@dataclasses.dataclass
class Program:
  """One compiled program of the step."""

  name: str
  phase: str                        # rollout | learner | eval
  lower: Callable[[], Any]          # -> jax.stages.Lowered
  calls: float                      # calls per RL step (eval: per step, amortised)
  real: Work
  loops: list = dataclasses.field(default_factory=list)   # [Loop]
  per_step: bool = False            # `real` is one iteration of the first loop (decode: a token)
  note: str = ""
  kernel: Work | None = None        # per chip: work inside Pallas kernels per iteration of the
                                    # first loop (per call without one); XLA's cost analysis does
                                    # not see it, so it is counted from the kernels' DMAs


@dataclasses.dataclass(frozen=True)
class ModelWork:
  """Hand counts for one model shape."""

  matmul_params: int     # weights a token multiplies by, the vocabulary projection included
  head_params: int       # the vocabulary projection's share
  layers: int
  attn_width: int        # heads x head_dim
  kv_token_bytes: int    # K and V of one token over all layers, in the cache dtype
  param_count: int

  @staticmethod
  def of(cfg, kv_dtype: str) -> "ModelWork":
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    return ModelWork(matmul_params=cfg.num_params - head if not cfg.tie_word_embeddings
                     else cfg.num_params, head_params=cfg.vocab_size * cfg.hidden_size,
                     layers=cfg.num_layers,
                     attn_width=cfg.num_heads * cfg.head_dim,
                     kv_token_bytes=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
                     * KV_BYTES[kv_dtype], param_count=cfg.num_params)

  def forward(self, tokens: float, pairs: float, logits: float | None = None) -> float:
    """FLOPs of a forward pass over `tokens` tokens with `pairs` (query, visible key) pairs,
    projecting `logits` of them (default all) onto the vocabulary."""
    logits = tokens if logits is None else logits
    return (2.0 * (self.matmul_params - self.head_params) * tokens
            + 2.0 * self.head_params * logits + 4.0 * self.layers * self.attn_width * pairs)


def causal_pairs(start: int, length: int) -> int:
  """(query, key) pairs of `length` new tokens after `start` cached ones, causally."""
  return length * start + length * (length + 1) // 2


@dataclasses.dataclass(frozen=True)
class StepShape:
  """The config's step as the tool assumes it (module docstring)."""

  prompts: int                # prompts of one rollout
  rollouts: int               # rollouts per step (`rollout.prompts_per_rollout`)
  shards: int                 # rollout data shards
  tensor: int                 # rollout tensor axis
  slots: int                  # branches per prompt per turn (the layout's)
  trajectories: float         # planned trajectories per prompt
  turns: int
  max_new: int
  prompt_tokens: int
  obs_tokens: int
  obs_chunk: int
  page_size: int

  @property
  def trajectory_tokens(self) -> int:
    return self.prompt_tokens + self.turns * (self.max_new + self.obs_tokens)

  def live_rows(self) -> int:
    """Decode / observation-prefill rows of a turn: the planned branches of every prompt in
    the engine's row bucket (`shard_width`)."""
    per_shard = math.ceil(self.prompts / self.shards * min(self.trajectories, self.slots))
    return shard_width(per_shard, self.shards, self.prompts * self.slots, True)


def _rows(mesh, shape, dtype, data_axis="data"):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(
      mesh, P(data_axis, *([None] * (len(shape) - 1)))))


def _replicated(mesh, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P()))


def _keys(mesh, rows):
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
  return jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=NamedSharding(mesh, P("data")))


def chain_trees(shape: StepShape, vocab: int) -> list[TrainTree]:
  """Per prompt, ceil(planned trajectories) full-length episodes sharing the prompt (a tree of
  that many root-to-leaf chains), host arrays as a rollout hands them to the learner."""
  leaves = max(1, math.ceil(shape.trajectories))
  step = shape.max_new + shape.obs_tokens
  out = []
  for p in range(shape.prompts * shape.rollouts):
    parent, spans, cursor = [-1], [(0, shape.prompt_tokens)], shape.prompt_tokens
    for _ in range(leaves):
      prev = 0
      for _ in range(shape.turns):
        parent.append(prev)
        spans.append((cursor, cursor + step))
        prev = len(parent) - 1
        cursor += step
    n = cursor
    mask = np.zeros(n, bool)
    for a, _ in spans[1:]:
      mask[a:a + shape.max_new] = True
    out.append(TrainTree(parent=np.asarray(parent), spans=np.asarray(spans),
                         tokens=np.ones(n, np.int32) % vocab, loss_mask=mask,
                         old_logp=np.full(n, -1.0, np.float32),
                         ref_logp=np.full(n, -1.0, np.float32),
                         advantages=np.linspace(-1, 1, len(parent)).astype(np.float32),
                         group_id=p))
  return out


class StepPrograms:
  """The programs of one RL step of `config` on `devices` (module docstring)."""

  def __init__(self, config, devices: list, comparisons: bool = True):
    """comparisons: also list the paths printed beside the step's own for comparison (the
    gathered decode window, the block-sparse learner attention; 0 calls per step)."""
    self.config = config
    self.devices = devices
    self.comparisons = comparisons
    self.tokenizer = build_tokenizer(config.tokenizer, config.model.hf_path)
    self.model, self.model_config = abstract_model(config.model, self.tokenizer)
    env = envs.from_config(config, self.tokenizer)
    self.env = env
    self.method, self.engine, layout = rollout_build.make_training_engine(config, env,
                                                                          self.tokenizer)
    self.closers = [env]
    r, s = config.rollout, config.sampler
    self.rollout_mesh = capacity.rollout_mesh(config, devices, always=True)
    shards = self.rollout_mesh.shape["data"]
    self.layout = Layout(capacity.rollout_prompts(config.rollout), layout.capacity, layout.slots,
                         layout.num_trees)
    self.eval_engine, self.eval_layout = self._eval_rollout(env, shards)
    self.cache = capacity.config_cache(config.sampler, self.model,
                                       [(self.engine, self.layout),
                                        (self.eval_engine, self.eval_layout)],
                                       mesh=self.rollout_mesh, abstract=True)
    self.work = ModelWork.of(self.model_config, s.kv_dtype)
    self.shape = StepShape(
        prompts=self.layout.num_prompts, rollouts=int(r.prompts_per_step) // self.layout.num_prompts,
        shards=shards, tensor=self.rollout_mesh.shape["tensor"],
        slots=self.layout.slots, trajectories=planned_trajectories(r), turns=int(r.max_turns),
        max_new=self.engine.max_new, prompt_tokens=self.engine.prompt_capacity,
        obs_tokens=self.engine.obs_capacity, obs_chunk=self.engine.chunk_tokens,
        page_size=int(s.page_size))
    self.train_step = make_train_step(config, self.model,
                                      mesh=sharding.make_mesh(config.mesh, devices))
    self.scorer = ScorerModel.of(self)

  def close(self):
    for env in self.closers:
      if hasattr(env, "close"):
        env.close()

  def _eval_rollout(self, env, shards: int):
    """The evaluation's engine and layout: 1 greedy + `train.eval_samples` sampled chains per
    held-out prompt (`train.eval_prompts`, 100 when 0: the papers' test sets), in rollouts of
    `train.eval_chunk` prompts (0: all), rounded up to the data shards as `Evaluator` does."""
    c = self.config.copy_and_resolve_references()
    k = int(c.train.eval_samples)
    c.rollout.method, c.rollout.group_size, c.rollout.budget = "chain", 1 + k, 0
    method = rollout_build.make_method(c)
    engine = rollout_build.make_engine(
        c, env, self.tokenizer, temperature=(0.0,) + (float(c.rollout.temperature),) * k)
    total = int(c.train.eval_prompts) or 100
    chunk = -(-min(int(c.train.eval_chunk) or total, total) // shards) * shards
    self.eval_rollouts = -(-total // chunk)
    return engine, Layout(chunk, method.capacity(engine.max_turns), method.slots,
                          method.num_trees)

  # ------------------------------------------------------------------ weights and KV bytes
  def sampler_weight_bytes(self) -> float:
    """Bytes of the sampler's weights one chip holds (split over the tensor axis only)."""
    return _weight_bytes(self.cache.params, self.shape.tensor)

  def _kv(self, tokens: float) -> float:
    """KV bytes of `tokens` tokens on one chip (KV heads split over the tensor axis)."""
    return tokens * self.work.kv_token_bytes / self.shape.tensor

  # ------------------------------------------------------------------ sampler programs
  def _prefill(self, name, phase, rows, tokens, cached, calls):
    mesh, shape = self.rollout_mesh, self.shape
    args = (_rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows, tokens), jnp.int32),
            _rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows,), jnp.bool_))
    per_chip = rows / shape.shards
    run = tokens + (1 if cached else 0)   # a live slot's pending token runs with the chunk
    real = Work(flops=rows * self.work.forward(run, causal_pairs(cached, run), logits=1),
                bytes=self.sampler_weight_bytes() + self._kv(per_chip * (cached + run)))
    return Program(f"{phase}/prefill[{rows}x{tokens}]", phase,
                   lambda: sampling.lowered("prefill", self.cache, *args, prefix_pages=None),
                   calls, real,
                   note="prefix loop over cached pages: XLA counts one 128-token block")

  def window_kernel(self) -> str:
    """The decode window path a run of this config takes on the topology's chips
    (`sampling.window_kernel`)."""
    return sampling.window_kernel(self.cache, self.config.sampler.attention)

  def _decode(self, phase, rows, prompts, context, calls, kernel: str | None = None):
    """The decode turn over `rows` rows of `prompts` prompts whose contexts hold `context`
    tokens (each prompt's full pages shared by its rows), at the window the engine plans.
    kernel: the window path ("tpu": the Pallas kernel; "": gathered); default the config's."""
    mesh, shape, eng = self.rollout_mesh, self.shape, self.engine
    kernel = self.window_kernel() if kernel is None else kernel
    ps, mp = shape.page_size, self.cache.spec.max_pages_per_seq
    shared_cap = int(self.config.sampler.max_shared_pages)
    cascade = self.config.sampler.attention != "reference"
    prompt_pages = shape.prompt_tokens // ps
    cand = max(1, prompts // shape.shards) * prompt_pages
    shared = pow2_bucket(min(cand, shared_cap), 0, shared_cap) if cascade else 0
    private = -(-context // ps) - (prompt_pages if shared >= cand and cascade else 0)
    window = (pow2_bucket(private, 0, mp) or 1) if cascade else mp
    args = (_rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows,), jnp.bool_), _keys(mesh, rows),
            _rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows,), jnp.int32),
            _replicated(mesh, (len(eng.stop_ids) or 1,), jnp.int32),
            _rows(mesh, (rows,), jnp.float32))
    statics = lambda seg: sampling.decode_statics(  # noqa: E731
        max_new=eng.max_new, top_k=eng.top_k, top_p=eng.top_p, shared_pages=shared,
        window_pages=window, turn_segments=seg, entropy_tokens=eng.entropy_tokens,
        entropy_top=eng.entropy_top, window_kernel=kernel)
    per_chip = rows / shape.shards
    mid = context + eng.max_new // 2          # mean context over the turn's steps
    # each row reads its own context once, but a prompt's full pages once for all its rows
    prompt_tokens = prompt_pages * ps
    kv_read = self._kv(per_chip * (mid - prompt_tokens) + cand * ps)
    real = Work(flops=rows * self.work.forward(1, mid),
                bytes=self.sampler_weight_bytes() + kv_read)
    in_kernel = None
    if kernel:   # the window's pages, each read once per step by one DMA (`paged_kernel`)
      own = -(-context // ps) - (prompt_pages if shared >= cand and cascade else 0)
      m = self.model_config
      in_kernel = Work(flops=per_chip * 4.0 * m.num_layers * m.num_heads * m.head_dim * own * ps,
                       bytes=per_chip * kernel_bytes(own, self._kv(ps) / (2 * m.num_layers),
                                                     m.num_layers, m.num_heads, m.head_dim))
    lower = lambda seg: lambda: sampling.lowered("decode", self.cache, *args, **statics(seg))  # noqa: E731
    path = "Pallas window kernel" if kernel else "gathered window"
    return Program(f"{phase}/decode[{rows} rows, {context} ctx]", phase, lower(1), calls, real,
                   loops=[Loop("decode steps", eng.max_new, lower(2), twin=True)], per_step=True,
                   kernel=in_kernel,
                   note=f"per step; shared {shared} / window {window} pages; {path}")

  def _page_ops(self, rows, calls):
    mesh = self.rollout_mesh
    three = (_rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows,), jnp.int32),
             _rows(mesh, (rows,), jnp.bool_))
    page = self._kv(self.shape.page_size) * rows / self.shape.shards
    return [Program(f"rollout/fork[{rows}]", "rollout",
                    lambda: sampling.lowered("fork", self.cache, *three), calls,
                    Work(bytes=page), note="copies a partial last page per child"),
            Program(f"rollout/release[{rows}]", "rollout",
                    lambda: sampling.lowered("release", self.cache, *three[1:]), 2 * calls,
                    Work())]

  def rollout_programs(self) -> list[Program]:
    s = self.shape
    rows = s.live_rows()
    chunks = -(-s.obs_tokens // s.obs_chunk)
    mid = s.prompt_tokens + (s.turns // 2) * (s.max_new + s.obs_tokens)
    n = s.rollouts   # every program runs once per rollout of the step
    out = [self._prefill("rollout", "rollout", s.prompts, s.prompt_tokens, 0, n)]
    out[0].name = f"rollout/prompt_prefill[{s.prompts}x{s.prompt_tokens}]"
    out.append(self._decode("rollout", rows, s.prompts, mid, n * s.turns))
    if self.comparisons and self.window_kernel():   # the gathered window, for comparison
      out.append(self._decode("rollout", rows, s.prompts, mid, 0, kernel=""))
      out[-1].name += " (gathered, for comparison)"
    out.append(self._prefill("obs", "rollout", rows, s.obs_chunk, mid + s.max_new,
                             n * (s.turns - 1) * chunks))
    out[-1].name = f"rollout/obs_prefill[{rows}x{s.obs_chunk}]"
    out += self._page_ops(rows, n * s.turns)
    return out

  def eval_programs(self) -> list[Program]:
    s = self.shape
    every = max(1, int(self.config.train.eval_every)) / self.eval_rollouts   # calls per step
    lay = self.eval_layout
    rows = lay.num_prompts * lay.slots
    mid = s.prompt_tokens + (s.turns // 2) * (s.max_new + s.obs_tokens)
    chunks = -(-s.obs_tokens // s.obs_chunk)
    pre = self._prefill("eval", "eval", lay.num_prompts, s.prompt_tokens, 0, 1 / every)
    pre.name = f"eval/prompt_prefill[{lay.num_prompts}x{s.prompt_tokens}]"
    dec = self._decode("eval", rows, lay.num_prompts, mid, s.turns / every)
    obs = self._prefill("eval", "eval", rows, s.obs_chunk, mid + s.max_new,
                        (s.turns - 1) * chunks / every)
    obs.name = f"eval/obs_prefill[{rows}x{s.obs_chunk}]"
    return [pre, dec, obs]

  # ------------------------------------------------------------------ learner programs
  def learner_batches(self) -> list:
    """The step's learner batches (host arrays) for the synthetic trees."""
    trees = chain_trees(self.shape, self.model_config.vocab_size)
    return from_rollout.make_batches(self.config.learner, trees,
                                     minibatches=int(self.config.train.minibatches),
                                     row_multiple=self.train_step.row_multiple)

  def learner_programs(self) -> list[Program]:
    batches = self.learner_batches()
    lcfg = self.config.learner
    epochs = int(self.config.train.ppo_epochs)
    reference = bool(float(lcfg.kl_coef))
    first = batches[0]
    micro = isinstance(first, list)
    parts = [b for batch in batches for b in (batch if micro else [batch])]
    one = first[0] if micro else first
    tokens, pairs = _batch_work(one)
    n = len(parts)
    mw = self.work
    compute = mw.param_count * (2 if self.config.model.dtype == "bfloat16" else 4)
    fsdp = self.train_step.mesh.shape["fsdp"]
    f32 = 4 * mw.param_count / fsdp
    grad = Work(flops=3 * mw.forward(tokens, pairs), bytes=2 * compute + 2 * f32)
    real = {"ref_logprobs": (Work(flops=mw.forward(tokens, pairs), bytes=compute), n),
            "update": (dataclasses.replace(grad, bytes=grad.bytes + 6 * f32), len(batches) * epochs),
            "micro_zero": (Work(bytes=f32), len(batches) * epochs),
            "micro_add": (grad, n * epochs),
            "micro_apply": (Work(bytes=7 * f32), len(batches) * epochs)}
    shape = "x".join(str(d) for d in one.tokens.shape)

    def programs(step, names=None, suffix="", calls=1):
      """The learner's programs lowered by `step` (only `names`), with their loops' bodies."""
      out = [Program(f"learner/{name}[{shape}]{suffix}", "learner", (lambda l=low: l),
                     calls * real[name][1], real[name][0],
                     note="" if name != "micro_add" else f"{n} micro-batches per update")
             for name, low in step.lowered(first, reference=reference).items()
             if names is None or name in names]
      for p in out:   # each loop's body alone, for the iterations XLA's cost analysis leaves out
        if p.name.split("/")[1].split("[")[0] not in ("ref_logprobs", "update", "micro_add"):
          continue
        backward = not p.name.startswith("learner/ref_logprobs")
        if lcfg.remat != "none":
          p.loops.append(Loop("layers", self.work.layers, lambda b=backward: layer_loop_body(
              step, one, backward=b)))
        if int(lcfg.logits_chunk) and int(lcfg.logits_chunk) < one.tokens.shape[1]:
          p.loops.append(Loop("vocabulary", -(-one.tokens.shape[1] // int(lcfg.logits_chunk)),
                              lambda b=backward: logits_loop_body(step, one, backward=b)))
        if p.loops:
          p.note = "; ".join([p.note] * bool(p.note) +
                             [f"{lp.name} loop x{lp.steps}" for lp in p.loops])
      return out

    out = programs(self.train_step)
    if (self.comparisons and self.train_step.packed_attention() == "pallas"
        and hasattr(one, "node_ids")):
      # the block-sparse XLA attention beside the flash kernel, for comparison (not in the step)
      block = self.config.copy_and_resolve_references()
      block.learner.packed_attention = "block"
      other = make_train_step(block, self.model, mesh=self.train_step.mesh)
      out += programs(other, ("update", "micro_add"), " (block-sparse XLA, for comparison)", 0)
    return out

  def programs(self, phases=("rollout", "learner", "eval")) -> list[Program]:
    out = []
    if "rollout" in phases:
      out += self.rollout_programs()
      out += self.scorer.programs(self) if self.scorer else []
    if "learner" in phases:
      out += self.learner_programs()
    if "eval" in phases:
      out += self.eval_programs()
    return out


@dataclasses.dataclass
class ScorerModel:
  """The process scorer's model programs (`config.scorer.name` judge or prm, when the method
  scores), built as a run builds them (`scorers.from_config` on the rollouts' mesh) from
  abstract models. A scoring call takes every slot of the rollout ([prompts x slots] rows, at
  the engine's longest context); the real work is the planned live branches at their real
  length after the scoring turn (`rounds`: turns K, 2K, ... up to `max_turns`)."""

  name: str
  lower: dict               # program -> () -> Lowered
  rows: int                 # rows of one scoring call
  width: int                # tokens per row (the serialised trajectory or the judge's prompt)
  weights: tuple            # the scorer model's flat weights, placed as the sampler's
  work: ModelWork
  own_weights: bool         # a checkpoint of its own (else the policy's weights)
  cache: Any = None         # the judge's cache (abstract)
  extra: int = 0            # judge: tokens besides the trajectory; prm: per-step separators
  passes: int = 1           # prm: row chunks per call (`config.scorer.prm_chunk_rows`)

  @staticmethod
  def of(sp: "StepPrograms") -> "ScorerModel | None":
    from tree_rl.rollout.scorers.judge import judge_prompt
    from tree_rl.rollout.scorers.prm import PrmFormat
    from tree_rl.rollout.scorers.resources import dense_lm, sampler_generate
    sc, method = sp.config.scorer, sp.method
    name = method.scorer_override or sc.name
    if not method.score_every or name not in ("judge", "prm"):
      return None
    own = sc[f"{name}_model"] == "hf"
    model, cfg = (sp.model, sp.model_config) if not own else _checkpoint_shape(sp, name)
    mesh = sp.rollout_mesh
    rows = sp.layout.num_prompts * sp.layout.slots
    weights = sp.cache.params if not own else sampling.init_cache(
        model, max_seqs=1, num_pages=1, max_pages_per_seq=1, mesh=mesh, abstract=True).params
    work = ModelWork.of(cfg, sp.config.sampler.kv_dtype)
    if name == "prm":
      fmt = PrmFormat.from_config(sc, sp.tokenizer)
      d, ctx = sp.engine.max_turns, sp.engine.max_context()
      width = len(fmt.prefix) + ctx + len(fmt.middle) + d * len(fmt.separator)
      chunk = int(sc.prm_chunk_rows)
      lm = dense_lm(model, mesh, chunk_rows=chunk)
      args = lambda n: (weights, _rows(mesh, (n, width), jnp.int32),  # noqa: E731
                        _rows(mesh, (n, width), jnp.int32), _rows(mesh, (n, d), jnp.int32))
      lower = {"forward": lambda: lm.forward.lower(*args(rows))}
      passes = rows // sp.shape.shards // chunk if chunk else 1
      if passes > 1:   # one pass alone: `chunk` rows per shard, the loop's body
        lower["body"] = lambda: lm.forward.lower(*args(chunk * sp.shape.shards))
      return ScorerModel("prm", lower, rows, width, weights, work, own, extra=len(fmt.separator),
                         passes=passes)
    prompt = judge_prompt(sc, sp.env, sp.tokenizer)
    width = prompt.width + int(sc.judge_context_tokens)
    gen = sampler_generate(model, max_seqs=rows, max_len=width,
                           max_new=int(sc.judge_max_tokens), stop_ids=sp.tokenizer.stop_ids,
                           mesh=mesh, abstract=True)
    cache = gen.cache().replace(params=weights)
    return ScorerModel("judge", {}, rows, width, weights, work, own, cache=cache,
                       extra=prompt.width)

  def rounds(self, shape: "StepShape", every: int) -> list[int]:
    return list(range(every, shape.turns + 1, every))

  def programs(self, sp: "StepPrograms") -> list[Program]:
    shape, mesh, sc = sp.shape, sp.rollout_mesh, sp.config.scorer
    rounds = self.rounds(shape, sp.method.score_every)
    calls = shape.rollouts * len(rounds)
    live = shape.prompts * min(shape.trajectories, shape.slots)
    lengths = [shape.prompt_tokens + t * (shape.max_new + shape.obs_tokens) for t in rounds]
    weights = _weight_bytes(self.weights, shape.tensor)
    if self.name == "prm":
      flops = np.mean([live * self.work.forward(n + self.extra * t,
                                                causal_pairs(0, n + self.extra * t), logits=t)
                       for n, t in zip(lengths, rounds)])
      loops = ([Loop("row chunks", self.passes, self.lower["body"])]
               if self.passes > 1 else [])
      return [Program(f"rollout/prm[{self.rows}x{self.width}]", "rollout", self.lower["forward"],
                      calls, Work(flops=float(flops), bytes=weights), loops=loops,
                      note=f"{len(rounds)} scoring rounds per rollout; every slot at the longest "
                           f"context; {self.passes} pass(es) over the rows")]
    gen = int(sc.judge_max_tokens)
    ctx = [self.extra + min(n, int(sc.judge_context_tokens)) for n in lengths]
    per_chip = live / shape.shards
    prefill = Work(flops=float(np.mean([live * self.work.forward(n, causal_pairs(0, n), logits=1)
                                        for n in ctx])),
                   bytes=weights + float(np.mean([self._kv(per_chip * n, shape) for n in ctx])))
    step = Work(flops=float(np.mean([live * self.work.forward(1, n + gen / 2) for n in ctx])),
                bytes=weights + float(np.mean([self._kv(per_chip * (n + gen / 2), shape)
                                               for n in ctx])))
    rows, cache = self.rows, self.cache
    slots = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=NamedSharding(mesh, P("data")))
    pre_args = (slots, _rows(mesh, (rows, self.width), jnp.int32), _rows(mesh, (rows,), jnp.int32),
                _rows(mesh, (rows,), jnp.bool_))
    dec_args = (slots, _rows(mesh, (rows,), jnp.bool_), _keys(mesh, rows),
                _rows(mesh, (rows,), jnp.int32), _rows(mesh, (rows,), jnp.int32),
                _replicated(mesh, (len(sp.tokenizer.stop_ids) or 1,), jnp.int32),
                _rows(mesh, (rows,), jnp.float32))
    mp = cache.spec.max_pages_per_seq
    window = pow2_bucket(-(-(self.width + gen) // cache.spec.page_size), 0, mp) or 1
    statics = lambda seg: sampling.decode_statics(max_new=gen, window_pages=window,  # noqa: E731
                                                  turn_segments=seg)
    lower = lambda seg: lambda: sampling.lowered("decode", cache, *dec_args, **statics(seg))  # noqa: E731
    return [Program(f"rollout/judge_prefill[{rows}x{self.width}]", "rollout",
                    lambda: sampling.lowered("prefill", cache, *pre_args, prefix_pages=0), calls,
                    prefill, note=f"{len(rounds)} scoring rounds per rollout; every slot"),
            Program(f"rollout/judge_decode[{rows} rows, {self.width} ctx]", "rollout", lower(1),
                    calls, step, loops=[Loop("decode steps", gen, lower(2), twin=True)],
                    per_step=True, note=f"per step; window {window} pages")]

  def _kv(self, tokens: float, shape: "StepShape") -> float:
    return tokens * self.work.kv_token_bytes / shape.tensor

  def resident(self) -> dict:
    out = {"scorer_cache": per_chip_bytes(self.cache.state)} if self.cache is not None else {}
    if self.own_weights:
      out["scorer_weights"] = per_chip_bytes(self.weights)
    return out


def _checkpoint_shape(sp: "StepPrograms", name: str):
  """The abstract model of the scorer's own checkpoint (`config.scorer.{name}_hf_path`): its
  config.json only, no weight read."""
  from tree_rl.models import abstract_model
  c = sp.config.copy_and_resolve_references()
  path = c.scorer[f"{name}_hf_path"]
  if not path:
    raise ValueError(f"config.scorer.{name}_hf_path must name a local checkpoint when "
                     f"{name}_model=hf")
  c.model.preset, c.model.hf_path = "hf", path
  return abstract_model(c.model, sp.tokenizer)


def _weight_bytes(weights, tensor: int) -> float:
  """Bytes of flat weights one chip holds (those with a sharded axis split over `tensor`)."""
  total = sum(math.prod(x.shape) * x.dtype.itemsize for x in weights)
  sharded = sum(math.prod(x.shape) * x.dtype.itemsize for x in weights
                if any(a is not None for a in x.sharding.spec))
  return total - sharded + sharded / tensor


def _batch_work(batch) -> tuple[int, int]:
  """(real tokens, (query, visible key) pairs) of one host batch: a packed row's token sees
  its root-to-node path (`positions` + 1 keys); a per-leaf row its causal prefix."""
  if hasattr(batch, "node_ids"):
    real = np.asarray(batch.node_ids) >= 0
    pos = np.asarray(batch.positions)
    return int(real.sum()), int((pos[real] + 1).sum())
  mask = np.asarray(batch.tokens) != 0
  lengths = mask.sum(1)
  return int(lengths.sum()), int(sum(n * (n + 1) // 2 for n in lengths))


def per_chip_bytes(tree) -> float:
  """Bytes one chip holds of a tree of sharded `jax.ShapeDtypeStruct`s (the first device's
  shard; shards are equal under the meshes used here)."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) else x.shape
    total += math.prod(shard) * jnp.dtype(x.dtype).itemsize
  return total


def resident_bytes(step: StepPrograms) -> dict:
  """What stays in a chip's memory while a phase's programs run (`step.RESIDENT_IN`): the
  sampler cache (KV pool, page tables, its weights; rollouts and evaluation), the train state
  (float32 master weights, AdamW moments), the frozen reference weights when the KL term is
  on, the gradient sums (between the learner's micro-batches), and a model scorer's cache and
  own weights (`ScorerModel.resident`)."""
  state = step.train_step.abstract_state()
  out = {"sampler_cache": per_chip_bytes((step.cache.params, step.cache.state)),
         "train_state": per_chip_bytes(state)}
  if float(step.config.learner.kl_coef):
    out["reference"] = per_chip_bytes(state.params)
  if int(step.config.learner.row_tokens):
    out["gradient_sums"] = per_chip_bytes(state.params)
  if step.scorer:
    out.update(step.scorer.resident())
  return out
