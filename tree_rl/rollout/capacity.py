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
              kv_dtype: str = "bfloat16", mesh=None) -> sampling.Cache:
  """An empty cache bound to `model`'s weights that holds any of `rollouts` ((engine, layout)
  pairs): max(num_pages, each rollout's `pages_needed`) pages of `page_size` tokens."""
  if not rollouts:
    raise ValueError("new_cache needs at least one (engine, layout) rollout to size the cache")
  return sampling.init_cache(
      model, max_seqs=max(l.num_prompts * l.capacity for _, l in rollouts),
      num_pages=max([int(num_pages)] + [pages_needed(e, l, page_size) for e, l in rollouts]),
      max_pages_per_seq=max(e.pages_per_seq(page_size) for e, _ in rollouts),
      page_size=page_size, kv_dtype=kv_dtype, mesh=mesh)


def config_cache(config, model, rollouts: Sequence[tuple]) -> sampling.Cache:
  """`new_cache` with the pool size, page size and KV dtype of `config.sampler`."""
  s = config.sampler
  return new_cache(model, rollouts, num_pages=int(s.num_pages), page_size=int(s.page_size),
                   kv_dtype=s.kv_dtype)
