"""Jitted sampler over a paged KV cache that stores a shared tree prefix once.

Public API (see `tree_rl.sampling.api`): init_cache, prefill, fork, decode, release, pages_in_use,
reset (rebind to new weights), exhaustion_message.
"""

from tree_rl.sampling.api import (Cache, PrefillOutput, decode, exhaustion_message, fork, init_cache,
                                  init_cache_from_config, pages_in_use, prefill, release, reset)
from tree_rl.sampling.cache import CacheSpec, CacheState, OK, INVALID, OUT_OF_PAGES, SEQ_CAPACITY, STATUS_NAMES
from tree_rl.sampling.decode_turn import DecodeOutput, REASON_NAMES
from tree_rl.sampling import decode_turn as stop_reasons  # stop_reasons.OUT_OF_PAGES etc.
