"""The persistent compilation cache: a program compiled in one process is stored, and a second
process running it loads it instead of adding an entry; "" disables the cache."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import sys, jax, jax.numpy as jnp
from tree_rl import compile_cache
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
print(compile_cache.enable(sys.argv[1]))
print(float(jax.jit(lambda x: jnp.sin(x) @ x.T)(jnp.ones((8, 8))).sum()))
print(jax.config.jax_compilation_cache_dir, len(hits))
"""


def _run(directory):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", XLA_FLAGS="")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  out = subprocess.run([sys.executable, "-c", PROGRAM, directory], env=env, check=True,
                       capture_output=True, text=True, timeout=300)
  return out.stdout.split()


def test_second_process_loads_instead_of_compiling(tmp_path):
  cache = str(tmp_path / "cache")
  used, value, configured, hits = _run(cache)
  assert used == configured == cache and hits == "0"
  entries = sorted(os.listdir(cache))
  assert entries
  _, again, _, hits = _run(cache)
  assert int(hits) >= 1                    # loaded from the cache ...
  assert again == value                    # ... with the same result
  assert sorted(os.listdir(cache)) == entries


def test_empty_directory_disables(tmp_path):
  used, _, configured, hits = _run("")
  assert used == configured == "None" and hits == "0"
