"""The sharded update: meshes agree with one device, micro-batching, skip on NaN, one trace."""

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import multihost_case
from tree_rl.config import base_config
from tree_rl.learner import batches, make_mesh, make_train_step, synthetic, validate_config
from tree_rl.learner.sharding import logical_to_spec, resolve_mesh_shape
from tree_rl.models import Transformer
from tree_rl.models.config import ModelConfig

VOCAB = 64
# One layer keeps compilation short; 4 query / 2 kv heads still exercise tensor sharding.
MICRO = ModelConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=1,
                    num_heads=4, num_kv_heads=2, head_dim=16, tie_word_embeddings=True,
                    qkv_bias=True)


def config(shape=(1, 1, 1), **learner):
  c = base_config()
  c.learner.learning_rate = 1e-3
  # A large Adam eps keeps the update proportional to tiny gradients (eps=1e-8 makes it about
  # lr * sign(g), which turns fp32 reduction-order noise in near-zero gradients into lr-sized jumps).
  c.learner.adam_eps = 1e-3
  c.learner.kl_coef = 0.05
  c.learner.microbatches = 2
  c.learner.log_entropy = False
  c.learner.aggregation = "traj_mean_group_mean"
  c.learner.update(learner)
  c.mesh.shape = shape
  return c


def case_options():
  return multihost_case.FAST_COMPILE


def model():
  return Transformer(MICRO, rngs=nnx.Rngs(0))


def trees(seed=0, count=12):
  rng = np.random.default_rng(seed)
  return [synthetic.random_tree(rng, int(rng.integers(1, 6)), VOCAB, group_id=g // 3)
          for g in range(count)]


def run(c, batch, steps=1, devices=None):
  n = int(np.prod(resolve_mesh_shape(c.mesh.shape, len(devices or jax.devices()))))
  mesh = make_mesh(c.mesh, (devices or jax.devices())[:n])
  step = make_train_step(c, model(), mesh=mesh, compiler_options=case_options())
  state = step.init()
  for _ in range(steps):
    state, metrics = step(state, batch)
  return step, jax.tree.map(np.asarray, state), jax.tree.map(float, metrics)


def assert_same(a, b, params_atol=2e-5):
  sa, ma = a
  sb, mb = b
  for k in ("loss", "grad_norm", "clip_frac", "kl", "pg_loss", "ratio_max"):
    np.testing.assert_allclose(mb[k], ma[k], rtol=2e-5, atol=1e-7, err_msg=k)
  for x, y in zip(jax.tree.leaves(sa.params), jax.tree.leaves(sb.params)):
    np.testing.assert_allclose(y, x, atol=params_atol)


@pytest.fixture(scope="module")
def packed():
  return batches.pack_trees(trees(), seq_len=40, max_nodes=12, aggregation="traj_mean_group_mean",
                            rows=16)


@pytest.fixture(scope="module")
def single(packed):
  step, state, metrics = run(config(), packed, devices=jax.devices()[:1])
  return step, state, metrics


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (1, 2, 4)])
def test_sharded_step_equals_single_device(single, packed, shape):
  _, state, metrics = run(config(shape), packed)
  assert metrics["skipped"] == 0.0
  assert_same(single[1:], (state, metrics))


def test_params_are_sharded_by_logical_rules():
  c = config((2, 2, 2))
  mesh = make_mesh(c.mesh)
  rules = c.mesh.rules
  assert logical_to_spec(("embed", "mlp"), (128, 384), rules, mesh) == P("fsdp", "tensor")
  assert logical_to_spec(("vocab", "embed"), (64, 128), rules, mesh) == P("tensor", "fsdp")
  # 3 heads do not split over tensor=2: that dim stays replicated.
  assert logical_to_spec(("embed", "heads", "head_dim"), (128, 3, 32), rules, mesh) == P(
      "fsdp", None, None)
  step = make_train_step(c, model(), mesh=mesh)
  spec = step.state_shardings.params["layers"][0]["mlp"]["up_kernel"].spec
  assert spec == P("fsdp", "tensor")
  mu = step.state_shardings.opt_state[1][0].mu["layers"][0]["mlp"]["up_kernel"].spec
  assert mu == P("fsdp", "tensor")


def test_one_batch_with_remat_and_chunked_logits_equals_microbatches(single, packed):
  c = config(microbatches=1, remat="full", logits_chunk=16)
  _, state, metrics = run(c, packed, devices=jax.devices()[:1])
  assert_same(single[1:], (state, metrics))


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2)])
def test_pallas_interpret_packed_attention_step_equals_the_block_attention_step(single, packed,
                                                                                shape):
  """`learner.packed_attention=pallas` (the flash kernel, interpreted on the CPU, per shard
  under shard_map: rows over data x fsdp, heads over tensor) gives the update of the XLA
  block-sparse attention (`auto` on a CPU)."""
  c = config(shape, packed_attention="pallas")
  step, state, metrics = run(c, packed, devices=None if shape != (1, 1, 1) else jax.devices()[:1])
  assert step.packed_attention() == "pallas" and single[0].packed_attention() == "block"
  assert_same(single[1:], (state, metrics))


def test_leaf_batch_step_equals_packed_step(single):
  leaf = batches.leaf_batch(trees(), seq_len=24, rows=48)
  _, state, metrics = run(config(), leaf, devices=jax.devices()[:1])
  assert_same(single[1:], (state, metrics), params_atol=5e-5)


@pytest.mark.parametrize("per_leaf", [False, True])
def test_fixed_shape_microbatches_equal_one_batch(single, per_leaf):
  """The same trees as fixed [4, 32] micro-batches (trees cut to fit, or one path each) give
  the one-batch update, on a sharded mesh too, and every micro-batch reuses one trace."""
  mbs = batches.pack_microbatches(trees(), 32, 4, aggregation="traj_mean_group_mean",
                                  per_leaf=per_leaf, block=8)
  assert len(mbs) >= 2
  step, state, metrics = run(config(microbatches=1), mbs, devices=jax.devices()[:1])
  assert_same(single[1:], (state, metrics), params_atol=5e-5)
  assert step.trace_count == 1   # one gradient program for all micro-batches
  _, state, metrics = run(config((2, 2, 2), microbatches=1), mbs)
  assert_same(single[1:], (state, metrics), params_atol=5e-5)


def test_non_finite_loss_skips_the_update(single, packed):
  step = single[0]
  state = step.init()
  before = jax.tree.map(np.asarray, state.params)
  bad = packed.replace(old_logp=np.where(packed.loss_mask, np.nan, packed.old_logp))
  state, metrics = step(state, bad)
  assert float(metrics["skipped"]) == 1.0
  assert int(state.step) == 0 and int(state.skipped) == 1
  for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(y), x)
  state, metrics = step(state, packed)
  assert float(metrics["skipped"]) == 0.0 and int(state.step) == 1


@pytest.mark.parametrize("lr", [1e39, float("inf")])
def test_an_update_to_non_finite_weights_is_skipped(packed, lr):
  # the gradient is finite; the learning rate (1e39 is inf in float32) makes the new weights inf
  step, state, metrics = run(config(learning_rate=lr), packed, devices=jax.devices()[:1])
  assert metrics["skipped"] == 1.0 and np.isfinite(metrics["grad_norm"])
  assert int(state.step) == 0 and int(state.skipped) == 1
  for x, y in zip(jax.tree.leaves(step.init().params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_traced_once_per_shape(single, packed):
  step = single[0]
  traces = step.trace_count
  state = step.init()
  for _ in range(3):
    state, _ = step(state, packed)
  assert step.trace_count == traces
  smaller = batches.pack_trees(trees(1, 4), seq_len=40, max_nodes=12, rows=8)
  state, _ = step(state, smaller)
  state, _ = step(state, smaller)
  assert step.trace_count == traces + 1


def test_config_validation_names_field_and_known_values():
  c = config(advantage="nope")
  with pytest.raises(ValueError, match="learner.advantage.*grpo"):
    validate_config(c)
  with pytest.raises(ValueError, match="learner.aggregation"):
    validate_config(config(aggregation="mean"))
  with pytest.raises(ValueError, match="mesh.shape"):
    resolve_mesh_shape((-1, 3, 1), 8)
  assert resolve_mesh_shape((-1, 2, 2), 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="microbatches|rows"):
    run(config((8, 1, 1), microbatches=4),
        batches.pack_trees(trees(), seq_len=40, max_nodes=12, rows=16))


def test_the_kl_metric_is_logged_only_with_its_term(packed):
  one = jax.devices()[:1]
  _, _, with_kl = run(config(), packed, devices=one)
  _, _, without = run(config(kl_coef=0.0), packed, devices=one)   # no reference log-probs: nothing to compare
  assert "kl" in with_kl and "kl" not in without
  # the same first update less the KL term: loss = pg + kl_coef * KL
  assert without["loss"] == pytest.approx(with_kl["loss"] - 0.05 * with_kl["kl"], rel=1e-4, abs=1e-6)
  assert without["pg_loss"] == pytest.approx(with_kl["pg_loss"], rel=1e-5, abs=1e-7)
