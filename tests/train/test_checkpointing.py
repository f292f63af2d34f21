"""Orbax checkpoints: exact round trip, retention of last N plus best, refusal of NaN, clear errors."""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tree_rl.checkpointing import Checkpointer, CheckpointRestoreError


def _state(seed):
  k = jax.random.key(seed)
  return {"params": {"w": jax.random.normal(k, (3, 4)), "b": jnp.arange(4, dtype=jnp.bfloat16)},
          "rng": jax.random.key_data(jax.random.split(k)[0]), "count": jnp.int32(seed)}


def test_round_trip_is_bitwise(tmp_path):
  ckpt = Checkpointer(str(tmp_path), keep=2)
  assert ckpt.restore(_state(0)) is None
  ckpt.save(5, _state(5), {"data_position": 40, "config": {"a": 1}})
  step, state, meta = Checkpointer(str(tmp_path)).restore(jax.eval_shape(lambda: _state(0)))
  assert step == 5 and meta == {"data_position": 40, "config": {"a": 1}}
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(_state(5))):
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_keeps_last_n_and_best(tmp_path):
  ckpt = Checkpointer(str(tmp_path), keep=2, best_metric="eval/success")
  for step, success in [(1, 0.1), (2, 0.9), (3, 0.2), (4, 0.3), (5, 0.4)]:
    ckpt.save(step, _state(step), {}, metrics={"eval/success": success})
  assert sorted(ckpt.all_steps()) == [2, 4, 5]


def test_refuses_non_finite_state(tmp_path):
  ckpt = Checkpointer(str(tmp_path))
  bad = _state(1)
  bad["params"]["w"] = bad["params"]["w"].at[0, 0].set(jnp.nan)
  with pytest.raises(ValueError, match="non-finite"):
    ckpt.save(1, bad, {})
  assert ckpt.latest_step() is None


def test_mismatched_checkpoint_is_a_clear_error(tmp_path):
  ckpt = Checkpointer(str(tmp_path))
  ckpt.save(3, _state(3), {})
  wrong = jax.eval_shape(lambda: {"params": {"w": jnp.zeros((5, 5))}, "rng": jnp.zeros(2, jnp.uint32),
                                  "count": jnp.int32(0)})
  with pytest.raises(CheckpointRestoreError, match="step 3"):
    ckpt.restore(wrong)
  shutil.rmtree(os.path.join(str(tmp_path), "3", "state"))
  with pytest.raises(CheckpointRestoreError, match="remove that step"):
    Checkpointer(str(tmp_path)).restore(jax.eval_shape(lambda: _state(0)))
