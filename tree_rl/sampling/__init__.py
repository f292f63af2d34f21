"""Jitted sampler over a paged KV cache that stores a shared tree prefix once.

Public API (see `tree_rl.sampling.api`): init_cache, prefill, fork, decode, release, pages_in_use,
reset (new weights, every slot emptied), rebind / unbind (an empty cache to other weights of the
same model, or to none), free (the cache's device memory released until `reset`), exhaustion_message, placement (where operations on given weights put their outputs),
lowered / decode_statics (an operation compiled ahead of time from abstract inputs),
window_kernel (whether decode reads private pages in place with the Pallas kernel).
"""

from tree_rl.sampling.api import (Cache, PrefillOutput, decode, decode_statics, exhaustion_message,
                                  fork, free, init_cache, lowered, pages_in_use, placement,
                                  prefill, rebind, release, reset, unbind, window_kernel)
from tree_rl.sampling.cache import CacheSpec, CacheState, Status
from tree_rl.sampling.decode_turn import DecodeOutput, StopReason
