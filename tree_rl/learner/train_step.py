"""The sharded policy-gradient update.

`make_train_step(config, model)` returns a `TrainStep`: `init()` places float32 master weights and
the AdamW state on the mesh; `step(state, batch)` is one jitted update (explicit in/out
shardings, the state donated) over a `LeafBatch` or `PackedBatch`, with gradient accumulation
over `learner.microbatches`, or over a list of fixed-shape micro-batches (one jitted
gradient per micro-batch, summed, then one jitted apply: the same three programs every step). A non-finite loss, gradient, new weight or optimizer moment leaves
the state untouched and reports `skipped = 1` in the metrics.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import NamedSharding, PartitionSpec as P

from tree_rl import optim
from tree_rl.learner import losses, sharding
from tree_rl.learner.batches import LeafBatch, PackedBatch, packed_attention_mask
from tree_rl.learner.logprobs import make_attend, sequence_logprobs
from tree_rl.learner.tree_attention import GROUP_BLOCKS, block_visibility, tree_block_attention
from tree_rl.learner.tree_flash import flash_layout, tree_flash_attention


PACKED_ATTENTION = ("auto", "block", "pallas", "dense")   # tree-packed rows' attention


@struct.dataclass
class TrainState:
  step: jax.Array        # updates applied
  params: Any            # float32 master weights (pure dict, as nnx.to_pure_dict)
  opt_state: Any
  skipped: jax.Array     # updates skipped for a non-finite loss or gradient


def make_optimizer(lcfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, learning-rate schedule) of `config.learner`: `optim.adamw` with a linear warm-up
  into a constant or cosine (to 0 at `total_steps`) schedule."""
  lr = optim.schedule(lcfg.learning_rate, kind=lcfg.lr_schedule, warmup_steps=lcfg.warmup_steps,
                      total_steps=lcfg.total_steps, field="learner.lr_schedule")
  return optim.adamw(lr, grad_clip=lcfg.grad_clip, weight_decay=lcfg.weight_decay, b1=lcfg.b1,
                     b2=lcfg.b2, eps=lcfg.adam_eps), lr


def _token_arrays(batch, lcfg) -> dict:
  """The loss-side view shared by both formats: tokens and per-token weights."""
  if isinstance(batch, PackedBatch):
    return dict(tokens=batch.tokens, positions=batch.positions, pred_index=batch.pred_index,
                node_ids=batch.node_ids, ancestors=batch.ancestors, kv_blocks=batch.kv_blocks,
                old_logp=batch.old_logp,
                ref_logp=batch.ref_logp, pos=batch.pos_weight, neg=batch.neg_weight,
                weight=batch.weight)
  if isinstance(batch, LeafBatch):
    w = losses.leaf_token_weights(batch.loss_mask, batch.group_ids, lcfg.aggregation)
    pos, neg = losses.split_by_sign(batch.advantages, w)
    return dict(tokens=batch.tokens, old_logp=batch.old_logp, ref_logp=batch.ref_logp, pos=pos,
                neg=neg, weight=w)
  raise TypeError(f"train step takes a LeafBatch or PackedBatch, got {type(batch).__name__}")


def _merge_stats(a: dict, b: dict) -> dict:
  out = {}
  for k in a:
    if k == "ratio_max":
      out[k] = jnp.maximum(a[k], b[k])
    elif k == "ratio_min":
      out[k] = jnp.minimum(a[k], b[k])
    else:
      out[k] = a[k] + b[k]
  return out


class TrainStep:
  """Holds the mesh, shardings and jitted update for one model and config."""

  def __init__(self, config, model: nnx.Module, mesh=None, compiler_options=None):
    self.config = config
    self.compiler_options = compiler_options
    lcfg = config.learner
    losses.check_aggregation(lcfg.aggregation)
    self.mesh = mesh if mesh is not None else sharding.make_mesh(config.mesh)
    self.rules = tuple(tuple(r) for r in config.mesh.rules)
    self.graphdef, state = nnx.split(model)
    self.model_cfg, self.compute_dtype = model.cfg, model.dtype
    self._init_params = nnx.to_pure_dict(state)
    self.param_shardings = sharding.param_shardings(state, self.rules, self.mesh)
    self.tx, self.schedule = make_optimizer(lcfg)
    self.replicated = NamedSharding(self.mesh, P())
    f32_params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, _master(a.dtype)),
                              self._init_params)
    abstract_opt = jax.eval_shape(jax.jit(self.tx.init), f32_params)   # jit: its constants are traced too
    opt_shardings = optax.tree_map_params(self.tx, lambda _, s: s, abstract_opt,
                                          self.param_shardings,
                                          transform_non_params=lambda _: self.replicated)
    self.state_shardings = TrainState(step=self.replicated, params=self.param_shardings,
                                      opt_state=opt_shardings, skipped=self.replicated)
    self.trace_count = 0
    self._jitted: dict[type, Any] = {}

  # ------------------------------------------------------------------ state and batches
  @property
  def row_multiple(self) -> int:
    """Batch rows must be a multiple of this: every micro-batch splits evenly over the batch
    shards (mesh data x fsdp)."""
    return int(self.config.learner.microbatches) * self.mesh.shape["data"] * self.mesh.shape["fsdp"]

  def init(self, params: Any = None) -> TrainState:
    """Place float32 master weights (default: the model's) and a fresh optimizer state."""
    params = self._init_params if params is None else params
    if jax.process_count() > 1:
      params = jax.tree.map(lambda a, s: _global_array(np.asarray(a, _master(a.dtype)), s),
                            params, self.param_shardings)
    if "init" not in self._jitted:   # one program: cast (a copy, as the state gets donated), init
      def fresh(params):
        params = jax.tree.map(lambda a: a.astype(_master(a.dtype)), params)
        return params, self.tx.init(params)
      self._jitted["init"] = jax.jit(fresh, out_shardings=(self.param_shardings,
                                                            self.state_shardings.opt_state))
    params, opt_state = self._jitted["init"](params)
    zero = lambda: _global_array(np.zeros((), np.int32), self.replicated)
    return TrainState(step=zero(), params=params, opt_state=opt_state, skipped=zero())

  def batch_shardings(self, batch):
    return jax.tree.map(
        lambda a: NamedSharding(self.mesh, sharding.batch_spec(self.rules, self.mesh, a.ndim,
                                                               a.shape[0])), batch)

  def shard_batch(self, local_batch):
    """Global batch arrays from this process's rows (numpy), one shard of the batch per host."""
    procs = jax.process_count()
    def put(a):
      a = np.asarray(a)
      spec = sharding.batch_spec(self.rules, self.mesh, a.ndim, a.shape[0] * procs)
      return jax.make_array_from_process_local_data(NamedSharding(self.mesh, spec), a)
    return jax.tree.map(put, local_batch)

  # ------------------------------------------------------------------ the update
  def _logprobs(self, params, mb, with_entropy: bool):
    """Per-token log-probs (and entropies) of the batch arrays `mb` under `params`, for the
    policy the rollouts sampled: softmax(logits / config.rollout.temperature)."""
    lcfg = self.config.learner
    model = nnx.merge(self.graphdef, params)
    attend = self._attention(self._attention_inputs(mb))
    return sequence_logprobs(model, mb["tokens"], positions=mb.get("positions"),
                             pred_index=mb.get("pred_index"), remat=lcfg.remat,
                             logits_chunk=lcfg.logits_chunk, with_entropy=with_entropy,
                             attend=attend, temperature=float(self.config.rollout.temperature))

  def _attention_inputs(self, mb):
    """What the batch's attention reads, computed once for every layer: the block layout's
    (key positions, visibility) per causal group of tree-packed rows, their dense mask, or
    nothing (causal rows)."""
    if "node_ids" not in mb:
      return None
    kind = self.packed_attention()
    if kind == "pallas":
      return flash_layout(mb["node_ids"], mb["ancestors"], mb["kv_blocks"])
    if kind == "block":
      return [g[1:] for g in block_visibility(mb["node_ids"], mb["ancestors"], mb["kv_blocks"])]
    return packed_attention_mask(mb["node_ids"], mb["ancestors"])

  def packed_attention(self) -> str:
    """`learner.packed_attention` resolved on this mesh's platform: `auto` is the Pallas flash
    kernel on a TPU when blocks are a multiple of 128 tokens (Mosaic's lane width), else the
    block-sparse XLA attention."""
    kind = str(self.config.learner.packed_attention)
    platform = self.mesh.devices.flat[0].platform
    block = int(self.config.learner.attention_block)
    if kind == "auto":
      return "pallas" if platform == "tpu" and block % 128 == 0 else "block"
    if kind == "pallas" and platform == "tpu" and block % 128:
      raise ValueError(f"learner.packed_attention='pallas' on a TPU needs learner.attention_block "
                       f"a multiple of 128, got {block}")
    return kind

  def _attention(self, inputs):
    """The `attend` hook of every layer over `_attention_inputs`."""
    lcfg = self.config.learner
    if isinstance(inputs, dict):
      return self._flash_attention(inputs)
    if not isinstance(inputs, list):   # a dense packed mask, or causal rows (None)
      return make_attend(lcfg.attention, inputs)
    layout = tuple((g * GROUP_BLOCKS, kpos, vis) for g, (kpos, vis) in enumerate(inputs))
    remat = lcfg.remat != "none"
    return lambda i, q, k, v, s: (tree_block_attention(q, k, v, layout, remat), s)

  def _flash_attention(self, inputs):
    """The Pallas kernel per shard (`jax.shard_map`: a kernel is not partitioned by XLA): rows
    over the batch axes, heads over the tensor axis when both the query and the KV heads split
    there (else every tensor shard attends all heads). Compiled on a TPU, interpreted elsewhere
    (slow: for checking numerics)."""
    interpret = self.mesh.devices.flat[0].platform != "tpu"
    mesh, rules = self.mesh, self.rules

    def attend(i, q, k, v, state):
      def spec(heads, shape):
        return sharding.logical_to_spec(("batch", None, heads, None), shape, rules, mesh)
      qs, ks = spec("heads", q.shape), spec("kv_heads", k.shape)
      if qs[2] != ks[2]:
        qs = ks = P(qs[0], None, None, None)
      rows = jax.tree.map(lambda a: P(qs[0], *[None] * (a.ndim - 1)), inputs)
      kernel = jax.shard_map(
          lambda q, k, v, layout: tree_flash_attention(q, k, v, layout, interpret=interpret),
          mesh=mesh, in_specs=(qs, ks, ks, rows), out_specs=qs, check_vma=False)
      return kernel(q, k, v, inputs), state
    return attend

  def _loss(self, params, mb):
    lcfg = self.config.learner
    need_entropy = bool(lcfg.log_entropy or lcfg.entropy_coef)
    logp, ent = self._logprobs(params, mb, need_entropy)
    return losses.weighted_policy_loss(
        logp, mb["old_logp"], mb["pos"], mb["neg"], mb["weight"],
        ref_logp=mb["ref_logp"] if lcfg.kl_coef else None,   # unfilled without the KL term
        entropy=ent if need_entropy else None, clip_low=lcfg.clip_low, clip_high=lcfg.clip_high,
        kl_coef=lcfg.kl_coef, entropy_coef=lcfg.entropy_coef, dual_clip=float(lcfg.dual_clip))

  def _grads(self, params, arrays):
    """((loss, stats), grads) of one batch's arrays (`_token_arrays`)."""
    return jax.value_and_grad(self._loss, has_aux=True)(params, arrays)

  def _zeros(self, params, arrays):
    """(loss, stats, grads) of nothing yet: the start of a sum over micro-batches."""
    (loss, stats), grads = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                                        jax.eval_shape(self._grads, params, arrays))
    inf = jnp.full((), jnp.inf, jnp.float32)
    return loss, dict(stats, ratio_max=-inf, ratio_min=inf), grads

  def _sum(self, sums, params, arrays):
    """`sums` plus the loss, stats and gradient of one micro-batch's arrays."""
    (l, s), g = self._grads(params, arrays)
    loss, stats, grads = sums
    return loss + l, _merge_stats(stats, s), jax.tree.map(jnp.add, grads, g)

  def _zero_sums(self, params, batch):
    return self._zeros(params, _token_arrays(batch, self.config.learner))

  def _add(self, sums, params, batch):
    self.trace_count += 1
    return self._sum(sums, params, _token_arrays(batch, self.config.learner))

  def _update(self, state: TrainState, batch):
    self.trace_count += 1
    arrays = _token_arrays(batch, self.config.learner)
    n = int(self.config.learner.microbatches)
    rows = arrays["tokens"].shape[0]
    if n <= 1:
      return self._apply(state, self._sum(self._zeros(state.params, arrays), state.params, arrays))
    if rows % n:
      raise ValueError(f"learner.microbatches={n} does not divide the batch of {rows} rows")
    # Micro-batch k takes rows k, k+n, ...: every data shard contributes to every micro-batch.
    split = jax.tree.map(lambda a: jnp.swapaxes(a.reshape((rows // n, n) + a.shape[1:]), 0, 1),
                         arrays)
    spec = lambda a: NamedSharding(self.mesh, sharding.batch_spec(self.rules, self.mesh, a.ndim,  # noqa: E731
                                                                  a.shape[0]))

    def body(sums, mb):
      mb = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, spec(a)), mb)
      return self._sum(sums, state.params, mb), None

    first = jax.tree.map(lambda a: a[0], split)
    sums, _ = jax.lax.scan(body, self._zeros(state.params, first), split)
    return self._apply(state, sums)

  def _apply(self, state: TrainState, sums):
    """The optimizer update from summed (loss, stats, grads); skipped when not finite."""
    loss, stats, grads = sums
    grad_norm = optax.global_norm(grads)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # Skip an update whose loss, gradient, new weights or new optimizer state is not finite (a
    # finite gradient can still give inf weights, e.g. through an overflowing learning rate).
    finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm) & _all_finite(params)
              & _all_finite(opt_state))
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    new_state = TrainState(step=state.step + finite.astype(jnp.int32),
                           params=keep(params, state.params),
                           opt_state=keep(opt_state, state.opt_state),
                           skipped=state.skipped + (~finite).astype(jnp.int32))
    metrics = losses.finalize_metrics(stats)
    metrics.update(loss=loss, grad_norm=grad_norm, skipped=(~finite).astype(jnp.float32),
                   learning_rate=self.schedule(state.step))
    return new_state, metrics

  def _ref_program(self, batch):
    kind = ("ref", type(batch))
    if kind not in self._jitted:
      def fill(params, batch):
        logp, _ = self._logprobs(params, _token_arrays(batch, self.config.learner), False)
        return batch.replace(ref_logp=jnp.where(batch.loss_mask, logp, 0.0).astype(jnp.float32))
      shardings = self.batch_shardings(batch)
      self._jitted[kind] = jax.jit(fill, in_shardings=(self.param_shardings, shardings),
                                   out_shardings=shardings)
    return self._jitted[kind]

  def with_ref_logprobs(self, ref_params, batch):
    """`batch` with `ref_logp` filled by the frozen reference policy `ref_params` (for the KL
    term), computed on the mesh like the update (same attention path, same packing)."""
    return self._ref_program(batch)(ref_params, batch)

  def _update_program(self, batch):
    kind = type(batch)
    if kind not in self._jitted:
      self._jitted[kind] = jax.jit(
          self._update, in_shardings=(self.state_shardings, self.batch_shardings(batch)),
          out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,),
          compiler_options=self.compiler_options)
    return self._jitted[kind]

  def _micro_programs(self, batch):
    """(zero, add, apply): the jitted start of a gradient sum, one micro-batch's addition, and
    the update from the sum, for micro-batches shaped like `batch`."""
    kind = ("micro", type(batch))
    if kind not in self._jitted:
      bs = self.batch_shardings(batch)
      sums = self._sum_shardings(batch)
      self._jitted[kind] = (
          jax.jit(self._zero_sums, in_shardings=(self.param_shardings, bs), out_shardings=sums),
          jax.jit(self._add, in_shardings=(sums, self.param_shardings, bs), out_shardings=sums,
                  donate_argnums=(0,), compiler_options=self.compiler_options),
          jax.jit(self._apply, in_shardings=(self.state_shardings, sums),
                  out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,)))
    return self._jitted[kind]

  def _sum_shardings(self, batch):
    shapes = jax.eval_shape(self._zero_sums, self._init_params, batch)
    return (self.replicated, jax.tree.map(lambda _: self.replicated, shapes[1]),
            self.param_shardings)

  def __call__(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One update; `batch` is a LeafBatch or PackedBatch of global (or single-process) arrays,
    or a list of same-shape micro-batches (`batches.pack_microbatches`): their gradients are
    summed, one jitted call each, then applied once."""
    if isinstance(batch, (list, tuple)):
      return self._micro_update(state, list(batch))
    return self._update_program(batch)(state, batch)

  def _micro_update(self, state: TrainState, batches: list) -> tuple[TrainState, dict]:
    if not batches:
      raise ValueError("an update needs at least one micro-batch")
    zero, add, apply = self._micro_programs(batches[0])
    sums = zero(state.params, batches[0])
    for mb in batches:
      sums = add(sums, state.params, mb)
    return apply(state, sums)

  # ------------------------------------------------------------------ ahead of time
  def abstract_state(self) -> TrainState:
    """What `init` returns, as `jax.ShapeDtypeStruct`s with their shardings (nothing
    allocated): the state to compile the update for ahead of time."""
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, _master(a.dtype)),
                          self._init_params)
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    state = TrainState(step=scalar, params=params,
                       opt_state=jax.eval_shape(jax.jit(self.tx.init), params),
                       skipped=scalar)
    return _placed(state, self.state_shardings)

  def lowered(self, batch, *, reference: bool = False) -> dict:
    """The programs one update over batches shaped like `batch` runs, lowered for the mesh from
    abstract inputs (`batch`: arrays or `jax.ShapeDtypeStruct`s; a list means fixed-shape
    micro-batches, whose first gives the shape), as {name: jax.stages.Lowered}: `update`, or
    `micro_zero`, `micro_add` (run once per micro-batch) and `micro_apply`; with reference,
    `ref_logprobs` (the frozen policy's pass, once per batch) too."""
    micro = isinstance(batch, (list, tuple))
    one = batch[0] if micro else batch
    one = _placed(jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), one),
                  self.batch_shardings(one))
    state = self.abstract_state()
    out = {}
    if reference:
      out["ref_logprobs"] = self._ref_program(one).lower(state.params, one)
    if not micro:
      out["update"] = self._update_program(one).lower(state, one)
      return out
    zero, add, apply = self._micro_programs(one)
    sums = _placed(jax.eval_shape(self._zero_sums, state.params, one), self._sum_shardings(one))
    out["micro_zero"] = zero.lower(state.params, one)
    out["micro_add"] = add.lower(sums, state.params, one)
    out["micro_apply"] = apply.lower(state, sums)
    return out


@jax.jit
def copy_params(params):
  """A copy of `params` in one program (a frozen reference that the donated train state cannot
  delete); it keeps their shardings."""
  return jax.tree.map(jnp.copy, params)


def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def logits_loop_body(step: TrainStep, batch, *, backward: bool):
  """One iteration of the learner's vocabulary loop (`learner.logits_chunk` > 0) lowered alone:
  the projection and log-softmax of one chunk of every row (forward, or with `backward` its
  forward, recomputation and backward: one iteration of each of the update's two loops). XLA's cost
  analysis counts a loop's body once; the AOT tool adds this program's cost for the other
  iterations (`ceil(row tokens / logits_chunk)` of them per pass)."""
  from tree_rl.learner.logprobs import _chunk_stats
  lcfg = step.config.learner
  chunk = int(lcfg.logits_chunk)
  rows = batch.tokens.shape[0]
  shard = sharding.batch_spec(step.rules, step.mesh, 3, rows)
  hidden = jax.ShapeDtypeStruct((rows, chunk, step.model_cfg.hidden_size), step.compute_dtype,
                                sharding=NamedSharding(step.mesh, shard))
  targets = jax.ShapeDtypeStruct((rows, chunk), jnp.int32,
                                 sharding=NamedSharding(step.mesh, P(*shard[:2])))
  entropy = bool(lcfg.log_entropy or lcfg.entropy_coef) and backward
  temperature = float(step.config.rollout.temperature)

  def forward(params, h, y):
    model = nnx.merge(step.graphdef, params)
    return _chunk_stats(model, h, y, entropy, temperature)

  fn = forward
  if backward:   # the value too: the update's forward loop computes it, its backward recomputes
    fn = jax.value_and_grad(lambda p, h, y: sum(jnp.sum(x) for x in jax.checkpoint(forward)(p, h, y)),
                            argnums=(0, 1))
  params = step.abstract_state().params
  return jax.jit(fn).lower(params, hidden, targets)


def layer_loop_body(step: TrainStep, batch, *, backward: bool):
  """One iteration of the learner's layer scan (`learner.remat` != none) lowered alone: one
  decoder layer over the batch's rows, forward, or with `backward` the layer's forward, its
  recomputation and its backward (one iteration of each of the update's two scans). The
  attention's layout is an input, as the scan reads it. XLA's cost analysis counts a loop's
  body once; the AOT tool adds this program's cost for the other `num_layers - 1` iterations."""
  from tree_rl.learner.logprobs import layer_block
  from tree_rl.models.transformer import rope_inverse_frequencies
  lcfg = step.config.learner
  rows, t = batch.tokens.shape
  placed = lambda tree: _placed(tree, jax.tree.map(   # noqa: E731
      lambda a: NamedSharding(step.mesh, sharding.batch_spec(step.rules, step.mesh, a.ndim, rows)),
      tree))
  shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), batch)
  inputs = placed(jax.eval_shape(lambda b: step._attention_inputs(_token_arrays(b, lcfg)), shapes))
  positions = getattr(batch, "positions", None)
  positions = placed(jax.ShapeDtypeStruct((rows, t), jnp.int32) if positions is None
                     else jax.ShapeDtypeStruct(positions.shape, positions.dtype))
  x = placed(jax.ShapeDtypeStruct((rows, t, step.model_cfg.hidden_size), step.compute_dtype))

  model = nnx.merge(step.graphdef, step.abstract_state().params)   # shapes and shardings only
  graph, layer = nnx.split(model.layers[0])
  inv_freq = rope_inverse_frequencies(model.cfg)

  def forward(layer, x, positions, inputs):
    block = layer_block(graph, step._attention(inputs), inv_freq, model.dtype, lcfg.remat)
    return block(layer, x, positions, 0)

  fn = forward
  if backward:   # the value too: the forward scan computes it, the backward scan recomputes it
    fn = jax.value_and_grad(lambda *a: jnp.sum(forward(*a).astype(jnp.float32)), argnums=(0, 1))
  return jax.jit(fn).lower(layer, x, positions, inputs)


def _placed(tree, shardings):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves carrying `shardings` (a matching tree)."""
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                      tree, shardings)


def _master(dtype):
  return np.float32 if jnp.issubdtype(dtype, jnp.floating) else dtype


def _global_array(value: np.ndarray, sharding_: NamedSharding) -> jax.Array:
  """A global array from a value every process holds in full (multi-host safe)."""
  return jax.make_array_from_callback(value.shape, sharding_, lambda idx: value[idx])


def validate_config(config) -> None:
  """Check `config.learner`'s names and the fields' joint constraints, and `config.mesh`; errors
  name the field and the known values (each numeric range is checked with the schema's:
  `tree_rl.config.range_errors`)."""
  from tree_rl.learner import advantages, logprobs

  lcfg = config.learner
  if lcfg.advantage not in advantages.names():
    raise ValueError(f"learner.advantage={lcfg.advantage!r} is not registered; "
                     f"known: {advantages.names()}")
  losses.check_aggregation(lcfg.aggregation)
  if lcfg.attention not in logprobs.ATTENTION:
    raise ValueError(f"learner.attention={lcfg.attention!r}; known: {logprobs.ATTENTION}")
  if lcfg.remat not in logprobs.REMAT:
    raise ValueError(f"learner.remat={lcfg.remat!r}; known: {logprobs.REMAT}")
  if lcfg.packed_attention not in PACKED_ATTENTION:
    raise ValueError(f"learner.packed_attention={lcfg.packed_attention!r}; known: {PACKED_ATTENTION}")
  make_optimizer(lcfg)   # an unknown lr_schedule raises here, naming the known ones
  if int(lcfg.row_tokens) % int(lcfg.attention_block):
    raise ValueError(f"learner.row_tokens={lcfg.row_tokens} must be 0 (off) or a positive multiple "
                     f"of learner.attention_block={lcfg.attention_block}")
  if int(lcfg.row_tokens) and int(lcfg.microbatches) != 1:
    raise ValueError(f"learner.microbatches={lcfg.microbatches} and learner.row_tokens="
                     f"{lcfg.row_tokens} both set the micro-batches: with row_tokens > 0 their "
                     "count follows the data (set learner.microbatches=1)")
  if lcfg.shared_advantage not in ("per_leaf", "mean"):
    raise ValueError(f"learner.shared_advantage={lcfg.shared_advantage!r}; known: ('per_leaf', 'mean')")
  from tree_rl.learner.from_rollout import OVERLONG_TRUNCATED
  if lcfg.overlong_truncated not in OVERLONG_TRUNCATED:
    raise ValueError(f"learner.overlong_truncated={lcfg.overlong_truncated!r}; known: {OVERLONG_TRUNCATED}")
  if lcfg.overlong_truncated != "keep" and not float(lcfg.overlong_window) > 0:
    raise ValueError(f"learner.overlong_truncated={lcfg.overlong_truncated!r} acts only with overlong "
                     f"shaping on: set learner.overlong_window > 0 (DAPO: 0.2)")
  if lcfg.episode_stats not in advantages.EPISODE_STATS:
    raise ValueError(f"learner.episode_stats={lcfg.episode_stats!r}; known: {advantages.EPISODE_STATS}")
  if float(lcfg.dual_clip) and not float(lcfg.dual_clip) > 1.0:
    raise ValueError(f"learner.dual_clip={lcfg.dual_clip} must be 0 (off) or > 1 (verl: 3, DAPO: 10)")
  if len(config.mesh.axis_names) != len(config.mesh.shape):
    raise ValueError(f"mesh.axis_names={tuple(config.mesh.axis_names)} and "
                     f"mesh.shape={tuple(config.mesh.shape)} differ in length")
  for name, axes in config.mesh.rules:
    axes = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    unknown = [a for a in axes if a not in tuple(config.mesh.axis_names)]
    if unknown:
      raise ValueError(f"mesh.rules maps {name!r} to unknown mesh axes {unknown}; "
                       f"mesh.axis_names={tuple(config.mesh.axis_names)}")


def make_train_step(config, model: nnx.Module, *, mesh=None,
                    compiler_options: dict | None = None) -> TrainStep:
  """The sharded update for `model` under `config.learner` and `config.mesh`.

  The compute dtype is the model's `dtype` (build it with `config.model.dtype`); master weights
  are float32. Multi-host: call `sharding.maybe_initialize_distributed(config.mesh)` before
  creating the model (any JAX computation); it is a no-op when already initialised.
  `compiler_options` go to XLA for the update (e.g. {"xla_backend_optimization_level": 0}).
  """
  validate_config(config)
  sharding.maybe_initialize_distributed(config.mesh)
  return TrainStep(config, model, mesh=mesh, compiler_options=compiler_options)
