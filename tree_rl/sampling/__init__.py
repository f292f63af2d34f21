"""Jitted sampler over a paged KV cache that stores a shared tree prefix once.

Public API (see `tree_rl.sampling.api`): init_cache, prefill, fork, decode, release, pages_in_use,
reset (rebind to new weights), exhaustion_message.
"""

from tree_rl.sampling.api import (Cache, PrefillOutput, decode, exhaustion_message, fork, init_cache,
                                  pages_in_use, prefill, release, reset)
from tree_rl.sampling.cache import CacheSpec, CacheState, Status
from tree_rl.sampling.decode_turn import DecodeOutput, StopReason
