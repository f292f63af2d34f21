"""Public sampler API: a `Cache` bound to one set of weights, and jitted, donating operations.

    cache = init_cache(model, max_seqs=64, num_pages=1024, max_pages_per_seq=64)
    cache, pre = prefill(cache, slots, tokens, lengths)        # prompts (or observation chunks)
    cache, status = fork(cache, parents, children)             # share prefixes
    cache, out = decode(cache, slots, key, max_new=64, stop_ids=[eot, eos], temperature=1.0)
    cache = release(cache, slots)

Weights: `init_cache` splits the NNX model once and keeps its parameter arrays inside the cache;
every operation runs with exactly those weights, so a cache filled under old weights cannot be
reused with new ones: `reset(cache, model)` (or `init_cache`) empties every slot and binds new
weights; `rebind(cache, params)` binds an already empty cache to other weights of the same model
(a flat tuple like `cache.params`) without rebuilding it. `cache.params_version` increases with
every binding.

Every operation donates the previous cache state: use only the returned cache. Slot ids are
global; with a mesh, slot g lives on data shard g // max_seqs (each shard has its own pool of
num_pages pages and max_seqs slots), every batch row must name a slot of the shard that holds
that row (rows are split over the data axis in order), and forks stay within a shard.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tree_rl.buckets import pow2_bucket
from tree_rl.compile_cache import to_device
from tree_rl.sampling import cache as C
from tree_rl.sampling import decode_turn as D
from tree_rl.sampling import prefill_chunks as PF

_VERSION = itertools.count(1)
# Hook applied to every per-shard function before jit (tests wrap it in chex.assert_max_traces).
WRAP = lambda name, fn: fn  # noqa: E731
TENSOR_LOGICAL_AXES = ("heads", "kv_heads", "mlp")
ATTENTION = ("auto", "reference", "cascade", "pallas")   # decode's paged attention layouts


class _Static:
  """A static value whose hash is computed once (an NNX GraphDef is slow to hash per call)."""

  def __init__(self, value):
    self.value, self._hash = value, hash(value)

  def __hash__(self):
    return self._hash

  def __eq__(self, other):
    return isinstance(other, _Static) and (self.value is other.value or self.value == other.value)


@struct.dataclass
class Cache:
  params: tuple                  # the weights this cache is bound to, as a flat tuple of arrays
  state: C.CacheState
  params_version: int = struct.field(pytree_node=False)
  graphdef: Any = struct.field(pytree_node=False)
  spec: C.CacheSpec = struct.field(pytree_node=False)
  mesh: Mesh | None = struct.field(pytree_node=False, default=None)
  data_axis: str = struct.field(pytree_node=False, default="data")
  tensor_axis: str | None = struct.field(pytree_node=False, default=None)

  @property
  def num_shards(self) -> int:
    return 1 if self.mesh is None else self.mesh.shape[self.data_axis]

  @property
  def lens(self) -> jax.Array:
    """Tokens per slot including the pending one (0 for empty slots), [num_shards * max_seqs]."""
    return self.state.lens + self.state.live


@struct.dataclass
class PrefillOutput:
  logits: jax.Array    # [B, V] float32 logits after each chunk's last token
  status: jax.Array    # [B] int32 `Status` code
  computed: jax.Array  # [B] int32 tokens run through the model


def init_cache(model: nnx.Module, *, max_seqs: int, num_pages: int, max_pages_per_seq: int,
               page_size: int = 16, kv_dtype: str = "bfloat16", mesh: Mesh | None = None,
               data_axis: str = "data", tensor_axis: str | None = "tensor",
               abstract: bool = False) -> Cache:
  """An empty cache bound to `model`'s current weights.

  max_seqs and num_pages are per data shard. With a mesh, slots and pages split over
  `data_axis`, and KV heads plus the heads/kv_heads/mlp weight axes over `tensor_axis`.
  abstract=True (with a mesh) allocates nothing: weights and state are `jax.ShapeDtypeStruct`s
  carrying their shardings, for compiling the operations ahead of time (`lowered`); `model`
  may then be abstract too (`nnx.eval_shape`).
  """
  cfg = model.cfg
  spec = C.CacheSpec(num_layers=cfg.num_layers, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                     page_size=page_size, num_pages=num_pages, max_seqs=max_seqs,
                     max_pages_per_seq=max_pages_per_seq, kv_dtype=kv_dtype)
  graphdef, params = nnx.split(model)
  if mesh is None:
    if abstract:
      raise ValueError("an abstract cache needs a mesh (the devices it compiles for)")
    state = _empty_single(spec, placement(params))()
  else:
    if data_axis not in mesh.shape:
      raise ValueError(f"mesh has no data axis {data_axis!r}; axes: {tuple(mesh.shape)}")
    tensor_axis = tensor_axis if tensor_axis in mesh.shape else None
    shardings = _param_shardings(params, mesh, tensor_axis)
    if abstract:
      shapes = jax.eval_shape(_all_shards(spec, mesh.shape[data_axis]))
      state = _with_shardings(shapes, _state_shardings(shapes, mesh, data_axis, tensor_axis))
      params = jax.tree.map(
          lambda v, sh: v.replace(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sh)),
          params, shardings, is_leaf=lambda x: isinstance(x, nnx.Variable))
    else:
      state = _empty_sharded(spec, mesh, data_axis, tensor_axis)()
      params = jax.device_put(params, shardings)
  leaves, treedef = jax.tree.flatten(params)
  return Cache(params=tuple(leaves), state=state, params_version=next(_VERSION),
               graphdef=_Static((graphdef, treedef)), spec=spec, mesh=mesh, data_axis=data_axis,
               tensor_axis=tensor_axis)


def placement(params) -> NamedSharding | None:
  """Where the outputs of operations on weights `params` (without a rollout mesh) live: the
  weights' one-device mesh, replicated, when they sit on one (the learner's), else None (the
  default device). A new or reset cache starts there, and so does a rollout's tree
  (`Engine.start`), so every operation meets its inputs in one placement and builds one program
  per shape."""
  lead = getattr(jax.tree.leaves(params)[0], "sharding", None)
  if isinstance(lead, NamedSharding) and lead.mesh.size == 1:
    return NamedSharding(lead.mesh, P())
  return None


@functools.lru_cache(maxsize=None)
def _empty_single(spec: C.CacheSpec, sharding):
  """The empty state of one shard as one compiled program (placed on `sharding`, or the
  default device)."""
  return jax.jit(lambda: C.empty_state(spec), out_shardings=sharding)


def _all_shards(spec: C.CacheSpec, shards: int):
  """A function building every shard's empty state side by side (pages along axis 1 of the
  KV pool, slots along axis 0 of the rest)."""
  def build():
    local = C.empty_state(spec)
    return jax.tree.map(lambda x: jnp.concatenate([x] * shards, axis=1 if x.ndim == 4 else 0), local)
  return build


def _with_shardings(tree, shardings):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves (arrays, NNX variables or shapes) placed by
  `shardings`."""
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                      tree, shardings)


@functools.lru_cache(maxsize=None)
def _empty_sharded(spec: C.CacheSpec, mesh: Mesh, data_axis: str, tensor_axis: str | None):
  """A jitted builder of every shard's empty state side by side, created in place on its
  devices (one program per cache shape and mesh, however often a cache is reset)."""
  build = _all_shards(spec, mesh.shape[data_axis])
  return jax.jit(build, out_shardings=_state_shardings(jax.eval_shape(build), mesh, data_axis,
                                                       tensor_axis))


def reset(cache: Cache, model: nnx.Module) -> Cache:
  """A cache with the same capacities and mesh bound to `model`'s current weights, every slot
  empty and every page free. The way to move to new weights: nothing cached under the old
  weights survives it."""
  return init_cache(model, max_seqs=cache.spec.max_seqs, num_pages=cache.spec.num_pages,
                    max_pages_per_seq=cache.spec.max_pages_per_seq, page_size=cache.spec.page_size,
                    kv_dtype=cache.spec.kv_dtype, mesh=cache.mesh, data_axis=cache.data_axis,
                    tensor_axis=cache.tensor_axis)


def rebind(cache: Cache, params) -> Cache:
  """`cache` bound to `params`: other weights of the same model, flat as `cache.params` (same
  leaf count, shapes and dtypes). The cache must hold no sequence (release every slot first):
  KV computed under other weights is never reused. Rebinding the arrays it holds is a no-op."""
  params = tuple(params)
  old = cache.params
  if len(params) == len(old) and all(a is b for a, b in zip(params, old)):
    return cache
  if len(params) != len(old):
    raise ValueError(f"rebind: {len(params)} weight arrays for a model of {len(old)}")
  bad = [i for i, (a, b) in enumerate(zip(params, old)) if a.shape != b.shape or a.dtype != b.dtype]
  if bad:
    i = bad[0]
    raise ValueError(f"rebind: weight {i} is {params[i].dtype}{list(params[i].shape)}, the "
                     f"cache's model has {old[i].dtype}{list(old[i].shape)} (another model?)")
  if bool(jnp.any(cache.lens > 0)):
    raise ValueError("rebind: the cache still holds sequences; release every slot first")
  return cache.replace(params=params, params_version=next(_VERSION))


def unbind(cache: Cache) -> Cache:
  """`cache` holding only its weights' shapes and dtypes (no arrays kept alive): no operation
  runs on it until `rebind` gives it weights again."""
  return cache.replace(params=tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in cache.params))


def free(cache: Cache) -> Cache:
  """`cache` holding no device memory: its weights and state (KV pool, page tables, counters)
  become shapes and dtypes only, so the pool is freed; `reset` builds a fresh cache of the same
  capacities on new weights. Between a step's rollouts and the next step's reset (the learner's
  update) the pool need not occupy memory."""
  shape = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
  return cache.replace(params=tuple(shape(x) for x in cache.params),
                       state=jax.tree.map(shape, cache.state))


def _state_specs(state: C.CacheState, data_axis, tensor_axis):
  return jax.tree.map(lambda x: P(None, data_axis, None, tensor_axis) if x.ndim == 4
                      else P(data_axis), state)


def _state_shardings(state, mesh, data_axis, tensor_axis):
  return jax.tree.map(lambda s: NamedSharding(mesh, s), _state_specs(state, data_axis, tensor_axis))


def _param_shardings(params, mesh, tensor_axis):
  def one(var):
    axes = getattr(var, "axes", None) or ()
    names = [tensor_axis if (tensor_axis and a in TENSOR_LOGICAL_AXES) else None for a in axes]
    return NamedSharding(mesh, P(*names))
  return jax.tree.map(one, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


# ----------------------------------------------------------------------------- jitted builders

def _localise(slots, valid, spec, cache_mesh, data_axis):
  """Global slot ids -> this shard's ids, rows naming another shard's slot become invalid."""
  if cache_mesh is None:
    return slots, valid
  base = jax.lax.axis_index(data_axis) * spec.max_seqs
  local = slots - base
  return local, valid & (local >= 0) & (local < spec.max_seqs)


@dataclasses.dataclass(frozen=True)
class _Layout:
  """How an operation's arguments and outputs split over a mesh: every argument after
  (params, state) is a per-row array split over the data axis except those in `replicated`;
  `state_out` / `rows_out`: whether it returns a new state / per-row outputs."""

  num_args: int
  replicated: tuple = ()
  state_out: bool = True
  rows_out: bool = True


def _operation(layout: _Layout):
  def deco(make):
    make.layout = layout
    return make
  return deco


@_operation(_Layout(num_args=4))
def _prefill_op(graphdef, spec, mesh, data_axis, st):
  def prefill_shard(params, state, slots, tokens, lengths, valid):
    slots, valid = _localise(slots, valid, spec, mesh, data_axis)
    state, logits, status, computed = PF.prefill(_merge(graphdef, params), state, slots, tokens,
                                                 lengths, valid, **st)
    return state, PrefillOutput(logits=logits, status=status, computed=computed)
  return prefill_shard


@_operation(_Layout(num_args=3))
def _fork_op(graphdef, spec, mesh, data_axis, st):
  def fork_shard(params, state, parents, children, valid):
    parents, _ = _localise(parents, valid, spec, mesh, data_axis)
    children, valid = _localise(children, valid, spec, mesh, data_axis)
    return C.fork(state, parents, children, valid)
  return fork_shard


@_operation(_Layout(num_args=2, rows_out=False))
def _release_op(graphdef, spec, mesh, data_axis, st):
  def release_shard(params, state, slots, valid):
    slots, valid = _localise(slots, valid, spec, mesh, data_axis)
    return C.release(state, slots, valid), None
  return release_shard


@_operation(_Layout(num_args=2, state_out=False))
def _plan_op(graphdef, spec, mesh, data_axis, st):
  def plan_shard(params, state, slots, valid):   # read-only: no state output, no copy
    slots, valid = _localise(slots, valid, spec, mesh, data_axis)
    return None, D.plan(state, slots, valid)
  return plan_shard


@_operation(_Layout(num_args=7, replicated=(5,)))   # stop_ids
def _decode_op(graphdef, spec, mesh, data_axis, st):
  def decode_shard(params, state, slots, valid, keys, max_tokens, budget, stop_ids, temperature):
    slots, valid = _localise(slots, valid, spec, mesh, data_axis)
    return D.decode(_merge(graphdef, params), state, slots, valid, keys, max_tokens, budget,
                    stop_ids, temperature, **st)
  return decode_shard


@functools.lru_cache(maxsize=None)
def _build(make, graphdef, spec: C.CacheSpec, mesh, data_axis: str, statics: tuple):
  """jit(+shard_map) of the per-shard function `make` builds; the state argument is donated
  unless the operation returns no state."""
  layout = make.layout
  local_fn = make(graphdef, spec, mesh, data_axis, dict(statics))
  fn = WRAP(local_fn.__name__.removesuffix("_shard"), local_fn)
  if mesh is not None:
    state_spec = _state_specs(jax.eval_shape(lambda: C.empty_state(spec)), data_axis, None)
    state_spec = jax.tree.map(lambda s: P(*[a if a == data_axis else None for a in s]), state_spec)
    rows = P(data_axis)
    arg_specs = tuple(P() if i in layout.replicated else rows for i in range(layout.num_args))
    out_specs = (state_spec if layout.state_out else None, rows if layout.rows_out else None)
    # manual over the data axis and every axis of size 1 (a Pallas kernel inside must not be
    # left to automatic partitioning); a tensor axis of size > 1 stays automatic
    manual = frozenset(a for a in mesh.axis_names if a == data_axis or mesh.shape[a] == 1)
    fn = jax.shard_map(fn, mesh=mesh, in_specs=(P(), state_spec) + arg_specs, out_specs=out_specs,
                       axis_names=manual, check_vma=False)
  return jax.jit(fn, donate_argnums=(1,) if layout.state_out else ())


def _merge(static: _Static, leaves):
  """The NNX model from plain arrays (trace-time only)."""
  graphdef, treedef = static.value
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, list(leaves)))


def _call(make, cache: Cache, *args, statics=(), run: bool = True):
  fn = _build(make, cache.graphdef, cache.spec, cache.mesh, cache.data_axis, tuple(statics))
  if not run:   # compile only (ahead of time): the later call with these shapes finds the program
    _, out = fn.lower(cache.params, cache.state, *args).compile().out_info
    # what a consumer's program is keyed by: shape, dtype (outputs are strongly typed) and,
    # when the inputs are committed to devices (so the outputs are too), placement; a memory
    # layout given to `lower` would key another program
    committed = any(getattr(x, "committed", False)
                    for x in jax.tree.leaves((cache.params, cache.state, args)))
    return cache, jax.tree.map(lambda s: jax.ShapeDtypeStruct(
        s.shape, s.dtype, sharding=s.sharding if committed else None), out)
  state, out = fn(cache.params, cache.state, *args)
  return (cache if state is None else cache.replace(state=state)), out


_OPERATIONS = {"prefill": _prefill_op, "fork": _fork_op, "release": _release_op,
               "decode": _decode_op}


def lowered(name: str, cache: Cache, *args, **statics) -> jax.stages.Lowered:
  """Operation `name` (prefill | fork | release | decode) lowered for `cache` (an abstract one
  too: `init_cache(..., abstract=True)`) and the per-shard function's arguments after `params,
  state` (arrays or `jax.ShapeDtypeStruct`s, as the public operation passes them: prefill
  slots, tokens, lengths, valid; fork parents, children, valid; release slots, valid; decode
  slots, valid, keys, max_tokens, budget, stop_ids, temperature), with the statics the public
  operation sets (`decode_statics` for decode; prefill's `prefix_pages`). Nothing runs: the
  result compiles ahead of time (`.compile()`), for any devices the cache's mesh names."""
  if name not in _OPERATIONS:
    raise KeyError(f"unknown sampler operation {name!r}; known: {sorted(_OPERATIONS)}")
  fn = _build(_OPERATIONS[name], cache.graphdef, cache.spec, cache.mesh, cache.data_axis,
              tuple(statics.items()))
  return fn.lower(cache.params, cache.state, *args)


def decode_statics(*, max_new: int, top_k: int = 0, top_p: float = 1.0, shared_pages: int = 0,
                   window_pages: int, turn_segments: int = 1, entropy_tokens: int = 0,
                   entropy_top: int = 0, window_kernel: str = "") -> dict:
  """The static arguments of one decode program (its jit key beside the shapes)."""
  return {"max_new": int(max_new), "top_k": int(top_k), "top_p": float(top_p),
          "shared_pages": int(shared_pages), "window_pages": int(window_pages),
          "turn_segments": int(turn_segments),
          "entropy_tokens": min(int(entropy_tokens), int(max_new)),
          "entropy_top": int(entropy_top) if int(entropy_tokens) else 0,
          "window_kernel": str(window_kernel)}


def window_kernel(cache: Cache, attention: str) -> str:
  """How decode reads each row's private pages (`decode_turn.decode`'s window_kernel): with
  the Pallas kernel compiled for TPU ("tpu": `pallas` on a TPU, and `auto` there), in Pallas'
  interpret mode (`pallas` elsewhere: slow, for checking numerics) or gathered ("": `cascade`,
  `reference`, and `auto` off TPUs). The kernel runs per data shard: a cache whose KV heads
  are split over a tensor axis keeps the gathered window."""
  if attention not in ("auto", "pallas"):
    return ""
  devices = cache.mesh.devices.flat if cache.mesh is not None else jax.devices()
  platform = next(iter(devices)).platform
  split = cache.mesh is not None and cache.tensor_axis is not None and \
      cache.mesh.shape[cache.tensor_axis] > 1
  if attention == "auto":
    return "tpu" if platform == "tpu" and not split else ""
  if split:
    raise ValueError("sampler.attention='pallas' reads whole KV pages per data shard: it needs "
                     "a rollout mesh without a tensor axis (mesh tensor size 1)")
  return "tpu" if platform == "tpu" else "interpret"


def _rows(x, dtype, name):
  x = jnp.asarray(x, dtype)
  if x.ndim != 1:
    raise ValueError(f"{name} must be 1-D [batch], got shape {x.shape}")
  return x


def _mask(valid, b):
  return np.ones((b,), bool) if valid is None else _rows(valid, bool, "valid")


# ----------------------------------------------------------------------------- public operations

def prefill(cache: Cache, slots, tokens, lengths, valid=None, *, read_cache: bool | None = None,
            run: bool = True) -> tuple[Cache, PrefillOutput]:
  """Append tokens[b, :lengths[b]] to slot slots[b]; a row starts a new sequence if its slot is
  empty. slots/lengths [B] int, tokens [B, T] int, valid [B] bool (default all).

  Invariant: afterwards the chunk's last token is the slot's pending token (KV not stored) and
  every earlier token has its KV stored, so `decode` starts without recomputing anything.
  Rows with status != Status.OK leave their sequence unchanged.
  read_cache=False skips attention to cached pages (valid when every row starts a new
  sequence: fresh prompts; a row with cached pages is refused); otherwise attention reads the
  cached pages in blocks, as far as the longest row's cache reaches, with no host round trip
  and one compiled program for every context length. run=False only compiles the program for
  these shapes (nothing runs; returns the cache and the output's shapes, dtypes and placements,
  as `jax.ShapeDtypeStruct`s, to build what consumes it ahead of time too).
  """
  slots = _rows(slots, jnp.int32, "slots")
  tokens = jnp.asarray(tokens, jnp.int32)
  if tokens.ndim != 2 or tokens.shape[0] != slots.shape[0]:
    raise ValueError(f"tokens must be [batch={slots.shape[0]}, T], got shape {tokens.shape}")
  lengths = _rows(lengths, jnp.int32, "lengths")
  valid = _mask(valid, slots.shape[0])
  # None: the whole page table, read only as far as the longest row's cache reaches
  statics = (("prefix_pages", 0 if read_cache is False else None),)
  return _call(_prefill_op, cache, slots, tokens, lengths, valid, statics=statics, run=run)


def fork(cache: Cache, parents, children, valid=None) -> tuple[Cache, jax.Array]:
  """Make each empty slot children[b] a copy of live slot parents[b]: full pages shared by
  reference count, a partially filled last page copied (at most one new page per child).
  Returns (cache, status [B]) with a `Status` (OK / INVALID / OUT_OF_PAGES) per row."""
  parents = _rows(parents, jnp.int32, "parents")
  children = _rows(children, jnp.int32, "children")
  return _call(_fork_op, cache, parents, children, _mask(valid, parents.shape[0]))


def release(cache: Cache, slots, valid=None) -> Cache:
  """Free the sequences in `slots` [B]; pages whose count reaches zero return to the free list."""
  slots = _rows(slots, jnp.int32, "slots")
  cache, _ = _call(_release_op, cache, slots, _mask(valid, slots.shape[0]))
  return cache


def pages_in_use(cache: Cache) -> jax.Array:
  """Pages currently referenced, per data shard ([num_shards] int32)."""
  return cache.spec.num_pages - cache.state.num_free


def decode(cache: Cache, slots, key, *, max_new: int, max_tokens=None, budget=None, stop_ids=(),
           temperature=1.0, top_k: int = 0, top_p: float = 1.0, valid=None,
           attention: str = "auto", max_shared_pages: int = 256,
           shared_pages: int | None = None, window_pages: int | None = None,
           turn_segments: int = 1, entropy_tokens: int = 0,
           entropy_top: int = 0) -> tuple[Cache, D.DecodeOutput]:
  """Generate one agent turn for rows `slots` [B] in one jitted `lax.while_loop`.

  key: one key (row b then draws with fold_in(key, b)) or keys [B], one per row (`row_keys`);
  either way a row's tokens depend on its own key only, never on the mesh. Each row runs from its pending token until it samples one of `stop_ids`, reaches
  min(max_tokens[b], budget[b], max_new) new tokens (defaults: max_new), or cannot store more
  KV. temperature: a scalar or one per row [B] (rows of greedy and sampled episodes can share
  a call); 0 is greedy; top_k (0 = off) and top_p (1.0 = off) are static. Returns
  DecodeOutput(tokens [B, max_new] (-1 padded), logprobs [B, max_new] under softmax(logits /
  temperature) (temperature 1 when greedy), lengths [B], stop_reason [B] (a `StopReason`),
  entropy [B, max_new] of that distribution at each row's first `entropy_tokens` tokens (static;
  0 after them and after the row's length), None when entropy_tokens is 0, the default; with
  entropy_top = k > 0, the part of it a top-k log-prob listing shows, / ln V: `listed_entropy`). Check
  `exhaustion_message` at the turn boundary: rows stopped by OUT_OF_PAGES keep a consistent
  cache and can continue after pages are released or config.sampler.num_pages is raised.

  attention: "reference" attends every row's whole page table; "cascade" (and "auto") read pages
  shared by several rows once per step for all rows (at most max_shared_pages of them) plus a
  per-row private window; "pallas" (and "auto" on a TPU) reads that window's pages in place with
  a Pallas kernel instead of gathering them (`window_kernel`). Unless shared_pages/window_pages are given, sizes are planned from the
  cache on the host (one small device-to-host copy per turn, rounded up to powers of two so only
  a few shapes are compiled). turn_segments > 1 splits the turn into that many loops so early
  steps read less of the turn's own keys (costs one more compiled loop body per segment).
  """
  slots = _rows(slots, jnp.int32, "slots")
  b = slots.shape[0]
  valid = _mask(valid, b)
  mp = cache.spec.max_pages_per_seq
  if attention not in ATTENTION:
    raise ValueError(f"attention must be one of {ATTENTION}, got {attention!r}")
  if int(max_new) < 1:
    raise ValueError(f"max_new must be >= 1, got {max_new}")
  if not 0.0 < float(top_p) <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p}")
  if int(top_k) < 0:
    raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
  if int(entropy_tokens) < 0 or int(entropy_top) < 0:
    raise ValueError(f"entropy_tokens and entropy_top must be >= 0 (0 disables them), got "
                     f"{entropy_tokens}, {entropy_top}")
  if attention == "reference" or (isinstance(cache.state.lens, jax.core.Tracer)
                                  and (shared_pages is None or window_pages is None)):
    # Under an outer jit the cache cannot be inspected: the reference layout is always valid.
    shared_pages, window_pages = 0, mp
  elif shared_pages is None or window_pages is None:
    _, pl = _call(_plan_op, cache, slots, valid)
    pl = np.asarray(jax.device_get(pl)).reshape(-1, 3)
    cand, priv, used = int(pl[:, 0].max()), int(pl[:, 1].max()), int(pl[:, 2].max())
    if shared_pages is None:
      shared_pages = pow2_bucket(min(cand, max_shared_pages), 0, max_shared_pages)
    if window_pages is None:
      window_pages = pow2_bucket(priv if cand <= shared_pages else used, 0, mp) or 1
  def per_row(x, name):   # None -> max_new, a scalar -> broadcast, else [B]
    if x is None or np.ndim(x) == 0:   # a host array: no program is compiled for it
      return np.full((b,), max_new if x is None else x, np.int32)
    return _rows(x, jnp.int32, name)

  kernel = window_kernel(cache, attention)
  statics = tuple(decode_statics(max_new=max_new, top_k=top_k, top_p=top_p,
                                 shared_pages=shared_pages, window_pages=window_pages,
                                 turn_segments=turn_segments,
                                 entropy_tokens=entropy_tokens,
                                 entropy_top=entropy_top, window_kernel=kernel).items())
  stop = to_device(stop_ids if hasattr(stop_ids, "shape") else list(stop_ids), np.int32).reshape(-1)
  if stop.shape[0] == 0:
    stop = to_device(np.full((1,), -1, np.int32))
  if np.ndim(temperature) == 0:   # a host array: no program is compiled for it
    temperature = np.full((b,), temperature, np.float32)
  temperature = to_device(temperature, np.float32)
  if temperature.shape != (b,):
    raise ValueError(f"decode: temperature must be a scalar or one per row [{b}], got shape "
                     f"{temperature.shape}")
  return _call(_decode_op, cache, slots, valid, row_keys(key, b), per_row(max_tokens, "max_tokens"),
               per_row(budget, "budget"), stop, temperature, statics=statics)


def row_keys(key, b: int) -> jax.Array:
  """Per-row keys [b]: `key` itself when it already holds one key per row, else
  fold_in(key, row). Row b's tokens depend only on its key, so how rows split over shards
  never changes what they sample."""
  key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
  if key.ndim == 1:
    if key.shape[0] != b:
      raise ValueError(f"decode: {key.shape[0]} row keys for {b} rows")
    return key
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(b))


def exhaustion_message(cache: Cache, slots, out: D.DecodeOutput) -> str | None:
  """None, or a message naming the slots that stopped for lack of pages and the config to raise."""
  reasons = np.asarray(out.stop_reason)
  hit = np.asarray(slots)[reasons == D.StopReason.OUT_OF_PAGES]
  if hit.size == 0:
    return None
  return (f"KV page pool exhausted: slots {hit.tolist()} could not continue (their cache is intact; "
          f"release finished sequences or raise config.sampler.num_pages, now {cache.spec.num_pages} "
          f"per shard)")
