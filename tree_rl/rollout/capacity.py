"""Sampler cache sizing: the one place that turns rollout shapes into a cache.

    cache = new_cache(model, [(engine, layout), ...], num_pages=..., page_size=16)

A cache built for several (engine, layout) rollouts (training and evaluation) holds any one of
them at a time: slots for the largest layout, a page table as wide as the longest context, and
at least `pages_needed` pages for each.
"""

from __future__ import annotations

from typing import Sequence

from tree_rl import sampling


def pages_needed(engine, layout, page_size: int) -> int:
  """KV pages a rollout can hold at once: each prompt's prompt pages plus, per live branch,
  its own pages of a longest branch (the partial page it shares is copied on fork)."""
  prompt_pages = -(-engine.prompt_capacity // page_size)
  branch_pages = engine.pages_per_seq(page_size) - prompt_pages + 1
  return layout.num_prompts * (prompt_pages + layout.slots * branch_pages)


def new_cache(model, rollouts: Sequence[tuple], *, num_pages: int = 0, page_size: int = 16,
              kv_dtype: str = "bfloat16", mesh=None, abstract: bool = False) -> sampling.Cache:
  """An empty cache bound to `model`'s weights that holds any of `rollouts` ((engine, layout)
  pairs): per data shard of `mesh` (one without), slots for its share of each layout's prompts
  and max(num_pages, each rollout's `pages_needed` share) pages of `page_size` tokens.
  abstract: shapes and shardings only (`sampling.init_cache`), for compiling ahead of time."""
  if not rollouts:
    raise ValueError("new_cache needs at least one (engine, layout) rollout to size the cache")
  shards = 1 if mesh is None else mesh.shape["data"]
  bad = [l.num_prompts for _, l in rollouts if l.num_prompts % shards]
  if bad:
    raise ValueError(f"rollouts of {bad} prompts do not split over {shards} data shards")
  return sampling.init_cache(
      model, max_seqs=max(l.num_prompts // shards * l.capacity for _, l in rollouts),
      num_pages=max([int(num_pages)] + [-(-pages_needed(e, l, page_size) // shards)
                                        for e, l in rollouts]),
      max_pages_per_seq=max(e.pages_per_seq(page_size) for e, _ in rollouts),
      page_size=page_size, kv_dtype=kv_dtype, mesh=mesh, abstract=abstract)


def config_cache(s, model, rollouts: Sequence[tuple], mesh=None,
                 abstract: bool = False) -> sampling.Cache:
  """`new_cache` with the pool size, page size and KV dtype of `s` (config.sampler)."""
  return new_cache(model, rollouts, num_pages=int(s.num_pages), page_size=int(s.page_size),
                   kv_dtype=s.kv_dtype, mesh=mesh, abstract=abstract)


def rollout_prompts(r) -> int:
  """Prompts of one training rollout on this process: its share of `r.prompts_per_rollout`
  (r: config.rollout; 0: of `prompts_per_step`, the whole step at once)."""
  import jax
  per = int(r.prompts_per_rollout) or int(r.prompts_per_step)
  return per // jax.process_count()


def rollout_shards(config, local_devices: int | None = None) -> int:
  """Data shards of this process's rollouts: `sampler.data_shards`, or (0, the default) the
  most that divide the prompts per step and fit this process's devices (over the tensor
  axis's size). An explicit count that does not divide the prompts or exceeds the devices is
  refused by validation."""
  import jax
  devices = jax.local_device_count() if local_devices is None else local_devices
  n = devices // tensor_size(config.mesh)
  prompts = rollout_prompts(config.rollout)   # this process's share of one rollout
  want = int(config.sampler.data_shards)
  if want > 0:
    return want
  return max(d for d in range(1, max(n, 1) + 1) if prompts % d == 0)


def tensor_size(mesh_config) -> int:
  """The size of the mesh's tensor axis as configured in `config.mesh` (1 when -1 or absent)."""
  names, shape = tuple(mesh_config.axis_names), tuple(mesh_config.shape)
  return max(int(shape[names.index("tensor")]), 1) if "tensor" in names else 1


def rollout_mesh(config, devices=None, *, always: bool = False):
  """The rollouts' mesh: this process's first `rollout_shards` x tensor devices (or of
  `devices`, e.g. a TPU topology's for compiling ahead of time) as (data, tensor); None for
  one shard without tensor parallelism (the unsharded cache) unless `always`."""
  import jax
  import numpy as np
  from jax.sharding import Mesh
  devices = jax.local_devices() if devices is None else list(devices)
  shards, tensor = rollout_shards(config, len(devices)), tensor_size(config.mesh)
  if shards * tensor == 1 and not always:
    return None
  return Mesh(np.array(devices[:shards * tensor]).reshape(shards, tensor), ("data", "tensor"))
