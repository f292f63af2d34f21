"""A persistent cache of compiled XLA programs, shared by every run on one machine.

Compilation dominates short runs on a CPU (a smoke run: ~45 of ~70 s); with the cache a rerun,
a resumed run, a sweep's later runs and the evaluation script load the programs instead of
compiling them again. Cached executables are the ones XLA would compile, so results are unchanged.
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "tree_rl", "jax")
# Programs that do bookkeeping, not FLOPs (a turn's plan and env step, tree writes, the turn
# boundary, advantages, initialisation): built without the backend's optimisation passes. On the
# 2-core CPU that halves their build time and leaves their run time in the noise; the model's
# forward passes (decode, prefill, the learner) keep every optimisation.
LIGHT = {"xla_backend_optimization_level": 0}


def light_jit(fun=None, **kwargs):
  """`jax.jit` with the `LIGHT` compiler options (usable as a decorator, with or without
  jit's keyword arguments)."""
  if fun is None:
    return functools.partial(light_jit, **kwargs)
  return jax.jit(fun, compiler_options=LIGHT, **kwargs)


def to_device(x, dtype=None) -> jax.Array:
  """`x` as a device array, as `jnp.asarray(x, dtype)` gives it, without building a program for a
  host value (`jnp.asarray` of a numpy array builds one per shape and dtype)."""
  if isinstance(x, jax.Array):
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)
  return jax.device_put(np.asarray(x, dtype))


def define_flag():
  """The entry points' --compile_cache flag (pass its value to `enable`)."""
  from absl import flags
  return flags.DEFINE_string("compile_cache", None, "Directory of the persistent compilation cache "
                             "(default: $JAX_COMPILATION_CACHE_DIR or ~/.cache/tree_rl/jax; '' disables).")


def enable(directory: str | None = None) -> str | None:
  """Cache every compiled program (however small or quick to compile) under `directory`
  (None: $JAX_COMPILATION_CACHE_DIR if set, else DEFAULT_DIR; "": no cache). Returns the
  directory used."""
  if directory is None:
    directory = os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_DIR
  if not directory:
    return None
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory


_BUILT = {"names": [], "seconds": 0.0, "listening": False}


def _on_duration(event: str, duration: float, fun_name: str = "?", **_):
  if event == "/jax/core/compile/backend_compile_duration":
    _BUILT["names"].append(fun_name)
    _BUILT["seconds"] += duration


def programs_built() -> tuple[int, float]:
  """(XLA programs built in this process since the first call, seconds spent): each compiled,
  or loaded from the persistent cache, once per shape (jax.monitoring's compile events)."""
  if not _BUILT["listening"]:
    jax.monitoring.register_event_duration_secs_listener(_on_duration)
    _BUILT["listening"] = True
  return len(_BUILT["names"]), _BUILT["seconds"]


def built_since(count: int) -> list[str]:
  """Names of the programs built after the first `count` (`programs_built`)."""
  return list(_BUILT["names"][count:])
