"""What model scorers run on, built from models (the sampler as a judge's generator, a jitted
forward as a PRM's), and `from_config`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl.rollout.scorers.base import Scorer, build
from tree_rl.rollout.scorers.judge import judge_prompt


# ---------------------------------------------------------------------------------------------
# resources: the sampler as a judge's text generator, a model as a PRM's forward. Both take the
# weights per call (flat, as `sampling.Cache.params`) and check they fit the model they were
# built for.


def model_weights(model) -> tuple:
  """The flat weights of an NNX model, in the layout of `sampling.Cache.params`."""
  from flax import nnx
  return tuple(jax.tree.leaves(nnx.split(model)[1]))


def sampler_generate(model, *, max_seqs: int, max_len: int, max_new: int, stop_ids,
                     page_size: int = 16, kv_dtype: str = "float32", num_pages: int | None = None,
                     mesh=None, abstract: bool = False):
  """`generate(weights, tokens [B, L], lengths [B], key) -> (new_tokens [B, max_new], lengths [B])`:
  greedy decoding through the paged sampler of `model`'s architecture with `weights`. One
  cache is reused: rebound to the call's weights, released and unbound after every call.

  mesh: the rollouts' (data, tensor) mesh: the cache's slots and pages split over `data` as the
  policy's, so each chip generates for its own prompts' rows (a batch's rows in data-shard
  order, as `score_input` lays them out); without one the cache sits on one device.
  `max_seqs` (and `num_pages`) count all shards. abstract: shapes only (`generate.cache` for
  compiling ahead of time); nothing can run."""
  from tree_rl import sampling

  shards = 1 if mesh is None else mesh.shape["data"]
  if max_seqs % shards:
    raise ValueError(f"judge cache: {max_seqs} sequences do not split over {shards} data shards")
  per_shard = max_seqs // shards
  pages_per_seq = -(-(max_len + max_new + 1) // page_size)
  cache = sampling.init_cache(
      model, max_seqs=per_shard, page_size=page_size, kv_dtype=kv_dtype,
      num_pages=(num_pages or max_seqs * pages_per_seq) // shards,
      max_pages_per_seq=pages_per_seq, mesh=mesh, abstract=abstract)
  box = [cache if abstract else sampling.unbind(cache)]
  stops = tuple(stop_ids)
  # rows in data-shard order, each shard's rows on its own slots 0, 1, ...
  slots_of = lambda b: np.tile(np.arange(b // shards, dtype=np.int32), shards)  # noqa: E731

  def generate(weights, tokens, lengths, key):
    b = tokens.shape[0]
    if b > max_seqs or b % shards:
      raise ValueError(f"judge batch {b} does not fit the judge cache's {max_seqs} sequences "
                       f"over {shards} data shards")
    slots = slots_of(b)
    valid = lengths > 0
    cache = sampling.rebind(box[0], weights)
    cache, _ = sampling.prefill(cache, slots, tokens, jnp.maximum(lengths, 1), valid,
                                read_cache=False)
    cache, out = sampling.decode(cache, slots, key, max_new=max_new, stop_ids=stops,
                                 temperature=0.0, valid=valid)
    box[0] = sampling.unbind(sampling.release(cache, slots))
    return jnp.where(out.tokens >= 0, out.tokens, 0), jnp.where(valid, out.lengths, 0)

  generate.host = True  # calls the sampler's host API: not jittable as a whole
  generate.cache = lambda: box[0]   # the (unbound) cache it generates with
  generate.slots = slots_of
  return generate


def dense_lm(model, mesh=None, *, chunk_rows: int = 0, block: int = 512):
  """`lm(weights, tokens, positions, reads) -> logits [B, D, V]` at the positions `reads` [B, D]:
  a jitted causal forward of `model`'s architecture with the given flat weights
  (`model_weights` layout). mesh: the rollouts' mesh, whose `data` axis splits the rows (as
  the policy's rows are split), so no chip repeats another's work. chunk_rows > 0: each data
  shard runs its rows that many at a time (a loop), so activations are held for that many rows
  only; attention runs in causal query blocks of `block` tokens. `lm.forward` is the jitted
  function (for compiling ahead of time)."""
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec

  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  shapes = [(x.shape, x.dtype) for x in leaves]
  shards = 1 if mesh is None else mesh.shape["data"]
  place = lambda x, spec: x if mesh is None else jax.lax.with_sharding_constraint(  # noqa: E731
      x, NamedSharding(mesh, spec))

  @jax.jit
  def fwd(weights, tokens, positions, reads):
    tokens, positions, reads = (place(x, PartitionSpec("data")) for x in (tokens, positions, reads))
    model = nnx.merge(graphdef, jax.tree.unflatten(treedef, list(weights)))
    run = lambda t, p, r: model(t, p, reads=r, causal_block=block)  # noqa: E731
    b = tokens.shape[0]
    per_shard = b // shards
    if not chunk_rows or per_shard <= chunk_rows:
      return run(tokens, positions, reads)
    if per_shard % chunk_rows:
      raise ValueError(f"config.scorer.prm_chunk_rows={chunk_rows} must divide the PRM's rows "
                       f"per data shard ({per_shard})")
    n = per_shard // chunk_rows
    # [B] in shard order -> [n, shards x chunk]: pass i takes rows i*chunk.. of every shard
    split = lambda x: place(x.reshape(shards, n, chunk_rows, *x.shape[1:]).swapaxes(0, 1)  # noqa: E731
                            .reshape(n, shards * chunk_rows, *x.shape[1:]),
                            PartitionSpec(None, "data"))
    out = jax.lax.map(lambda a: run(*a), (split(tokens), split(positions), split(reads)))
    out = out.reshape(n, shards, chunk_rows, *out.shape[2:]).swapaxes(0, 1)
    return place(out.reshape(b, *out.shape[3:]), PartitionSpec("data"))

  def lm(weights, tokens, positions, reads):
    weights = tuple(weights)
    if [(x.shape, x.dtype) for x in weights] != shapes:
      raise ValueError(f"scorer 'prm': the {len(weights)} weight arrays passed do not fit its "
                       f"model ({len(shapes)} arrays): another architecture?")
    return fwd(weights, tokens, positions, reads)

  lm.host = True
  lm.forward = fwd
  return lm


def from_config(config, *, env=None, tokenizer=None, policy_model=None, judge_model=None,
                prm_model=None, max_batch: int = 256, name: str | None = None, mesh=None,
                abstract: bool = False) -> Scorer:
  """The scorer of `config.scorer` with the resources it needs built from the given models.

  judge / prm: `config.scorer.judge_model` / `prm_model` = 'policy' reads the policy's weights
  at every call (`policy_model` gives the architecture); 'hf' holds a fixed checkpoint: the
  `judge_model` / `prm_model` given, else the one at `judge_hf_path` / `prm_hf_path`.
  `name` overrides config.scorer.name. mesh: the rollouts' (data, tensor) mesh, which the
  judge's cache and the PRM's rows split over as the policy's (None: one device). abstract:
  the models are shapes only (`nnx.eval_shape`) and the judge's cache too: the scorer's
  programs can be compiled ahead of time, not run.
  """
  sc = config.scorer
  if name is not None:
    sc = sc.copy_and_resolve_references()
    sc.name = name
  res = dict(env=env, env_params=getattr(env, "default_params", None), tokenizer=tokenizer)
  if sc.name not in ("judge", "prm"):
    return build(sc, **res)
  model, weights_from = _scorer_model(sc, sc.name, policy_model,
                                      judge_model if sc.name == "judge" else prm_model)
  if sc.name == "judge":
    prompt = judge_prompt(sc, env, tokenizer)
    res["generate"] = sampler_generate(
        model, max_seqs=max_batch, max_len=prompt.width + int(sc.judge_context_tokens),
        max_new=int(sc.judge_max_tokens), stop_ids=tokenizer.stop_ids,
        page_size=int(config.sampler.page_size), kv_dtype=config.sampler.kv_dtype, mesh=mesh,
        abstract=abstract)
  else:
    res["lm"] = dense_lm(model, mesh, chunk_rows=int(sc.prm_chunk_rows))
  return build(sc, weights_from=weights_from,
               weights=model_weights(model) if weights_from == "own" else None, **res)


def _scorer_model(sc, kind: str, policy_model, own_model):
  """(model, weights_from) of the judge or the PRM under `config.scorer.{kind}_model`."""
  which = sc[f"{kind}_model"]
  if which not in ("policy", "hf"):
    raise ValueError(f"config.scorer.{kind}_model={which!r}; known: policy, hf")
  if which == "policy":
    if policy_model is None:
      raise ValueError(f"scorer {kind!r} with {kind}_model='policy' needs the policy model")
    return policy_model, "policy"
  if own_model is None:
    path = sc[f"{kind}_hf_path"]
    if not path:
      raise ValueError(f"config.scorer.{kind}_hf_path must name a local checkpoint when "
                       f"{kind}_model=hf")
    from tree_rl.models.hf_io import load_hf_checkpoint
    own_model, _ = load_hf_checkpoint(path)   # must share the policy's tokenizer
  return own_model, "own"
