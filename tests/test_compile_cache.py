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


def test_host_values_reach_the_device_without_a_program():
  import jax
  import numpy as np
  from tree_rl import compile_cache, tasks
  built, _ = compile_cache.programs_built()
  values = [np.arange(7, dtype=np.int64), [3, 1, 2], np.float64(2.5), np.zeros((3, 5), bool)]
  for v, dtype in zip(values, [None, np.int32, np.float32, None]):
    got = compile_cache.to_device(v, dtype)
    assert isinstance(got, jax.Array)
    want = np.asarray(v, dtype)
    assert got.dtype == jax.dtypes.canonicalize_dtype(want.dtype) and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)
  # the identity take hands the states back; any other index set is gathered
  states = {"a": compile_cache.to_device(np.arange(12).reshape(4, 3)),
            "b": compile_cache.to_device(np.arange(4.0))}
  assert tasks.take(states, np.arange(4)) is states
  assert compile_cache.programs_built()[0] == built        # nothing above built a program
  picked = tasks.take(states, np.array([2, 2, 0]))
  np.testing.assert_array_equal(np.asarray(picked["a"]), np.arange(12).reshape(4, 3)[[2, 2, 0]])
  np.testing.assert_array_equal(np.asarray(picked["b"]), np.array([2.0, 2.0, 0.0]))
  assert compile_cache.programs_built()[0] == built + 1    # the gather: one program
