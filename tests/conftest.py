"""Test set-up: 8 host CPU devices for the sharding tests, float32 matmuls everywhere, and one
persistent compilation cache per pytest run (shared by the xdist workers and the subprocesses
they start; a new run starts cold)."""

import gc
import os
import tempfile

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), "tree_rl_jax_cache", os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))))

import jax  # noqa: E402
import pytest  # noqa: E402

from tree_rl import compile_cache  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
compile_cache.enable()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drop every compiled program after each test module. A loaded XLA CPU executable holds
  about 17 memory mappings until its function's cache lets go of it, and a worker that runs
  hundreds of modules would otherwise pass the kernel's per-process limit (vm.max_map_count,
  65530 by default), where the next program load dies of a segmentation fault. Later modules
  load what they share from the persistent cache."""
  yield
  jax.clear_caches()
  gc.collect()
