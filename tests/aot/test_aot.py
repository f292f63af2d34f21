"""The AOT tool against what can be checked by hand: the smoke config's RL-step programs compile
for a TPU v5e 2x2 slice (libtpu on this CPU host), sharded weights take total / fsdp bytes per
chip, the learner's compiled FLOPs match a hand count, and a step that cannot fit says so."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import configs.frozenlake
from tree_rl import sampling
from tree_rl.aot import analysis, chips, hbm, programs, step, topology
from tree_rl.config import base_config, lock
from tree_rl.learner import sharding
from tree_rl.learner.batches import LeafBatch
from tree_rl.learner.train_step import layer_loop_body, make_train_step
from tree_rl.models.config import ModelConfig
from tree_rl.models.transformer import Transformer

V5E = chips.topology("v5e:2x2")


@pytest.fixture(scope="module")
def tpu_devices():
  topology.quiet_libtpu(V5E)
  return topology.devices(V5E)


def test_topology_names():
  assert chips.topology("v5e-8").num_chips == 8 and chips.topology("v5e-8").chip.hbm_bytes == 16 * 2**30
  assert chips.topology("v5p-8").num_chips == 4   # 8 TensorCores = 4 megacore chips
  assert chips.topology("v5e:2x2").name == "v5e-4"
  assert chips.topology("cpu-3").num_chips == 3
  with pytest.raises(KeyError, match="unknown topology"):
    chips.topology("v9z-8")


@pytest.fixture(scope="module")
def smoke_step(tpu_devices):
  config = configs.frozenlake.get_config("algo=patr,smoke")
  sp = programs.StepPrograms(config, tpu_devices)
  results = [analysis.compile_program(p) for p in sp.programs(("rollout", "learner"))]
  yield sp, results
  sp.close()


def test_smoke_step_compiles_for_v5e(smoke_step):
  sp, results = smoke_step
  names = [r.name for r in results]
  for part in ("prompt_prefill", "decode", "obs_prefill", "fork", "release", "ref_logprobs",
               "micro_add", "micro_apply"):
    assert any(part in n for n in names), (part, names)
  assert not [r.error for r in results if r.error]
  for r in results:
    assert 0 < r.peak_bytes < V5E.chip.hbm_bytes
  decode = next(r for r in results if "decode" in r.name)
  # the decode loop's step is isolated (a 2-segment twin) and a turn runs max_new of them
  (loop,) = decode.loops
  assert loop["steps"] == sp.config.rollout.max_tokens_per_turn and loop["flops"] > 0
  assert decode.turn("flops") > decode.flops
  # 4 chips of data parallelism: the gradient is all-reduced
  add = next(r for r in results if "micro_add" in r.name)
  assert add.collectives.get("all-reduce", 0) >= 1
  line = step.summary(results, V5E, "tiny", programs.resident_bytes(sp), 1.0)
  assert line["fits"] and line["refused"] == []
  assert line["step_estimate_s"] > 0 and line["learner_flops_ratio"] > 1.0


def _model(hidden=256, layers=2, vocab=4096):
  cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden,
                    num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                    tie_word_embeddings=False, qkv_bias=True)
  return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))), cfg


def _leaf_batch(rows, length):
  sds = lambda dt: jax.ShapeDtypeStruct((rows, length), dt)  # noqa: E731
  return LeafBatch(tokens=sds(jnp.int32), loss_mask=sds(jnp.bool_), old_logp=sds(jnp.float32),
                   ref_logp=sds(jnp.float32), advantages=jax.ShapeDtypeStruct((rows,), jnp.float32),
                   group_ids=jax.ShapeDtypeStruct((rows,), jnp.int32))


def _learner_config(shape, remat="none"):
  c = base_config()
  c.mesh.shape = shape
  c.learner.remat = remat
  c.learner.packed, c.learner.attention = False, "einsum"
  c.learner.log_entropy = False
  return lock(c)


def test_fsdp_weights_take_their_share_per_chip(tpu_devices):
  # weights large enough that the TPU's tile padding of the small arrays (biases, norms, the
  # batch's [2, 64] shards) stays under 2% of what a chip holds
  model, _ = _model(hidden=512, vocab=8192)
  ts = make_train_step(_learner_config((1, 4, 1)), model,
                       mesh=sharding.make_mesh(_learner_config((1, 4, 1)).mesh, tpu_devices))
  params = ts.abstract_state().params
  # by hand: a weight with an `embed` axis (512, divisible by 4) is split 4 ways, the biases
  # (heads x head_dim) are replicated
  leaves = jax.tree.leaves(params)
  sharded = [x for x in leaves if "fsdp" in jax.tree.leaves(tuple(x.sharding.spec))]
  assert sharded and len(sharded) < len(leaves)
  expect = sum(math.prod(x.shape) * 4 / (4 if x in sharded else 1) for x in leaves)
  assert programs.per_chip_bytes(params) == expect
  batch = _leaf_batch(8, 64)
  low = ts.lowered(batch, reference=True)["ref_logprobs"]
  res = analysis.compile_program(programs.Program("ref", "learner", lambda: low, 1, programs.Work()))
  batch_bytes = 8 * 64 * (4 + 1 + 4 + 4) / 4 + 8 * (4 + 4) / 4   # rows split over 4 chips
  assert res.argument_bytes == pytest.approx(expect + batch_bytes, rel=0.02)


def test_learner_flops_match_a_hand_count(tpu_devices):
  model, cfg = _model()
  config = _learner_config((-1, 1, 1))
  ts = make_train_step(config, model, mesh=sharding.make_mesh(config.mesh, tpu_devices))
  rows, length = 8, 128
  low = ts.lowered(_leaf_batch(rows, length))["update"]
  res = analysis.compile_program(programs.Program("update", "learner", lambda: low, 1,
                                                  programs.Work()))
  work = programs.ModelWork.of(cfg, "float32")
  # dense attention executes every (query, key) pair: T^2 per row; training = 3 x forward
  hand = 3 * work.forward(rows * length, rows * length * length)
  assert res.flops * V5E.num_chips == pytest.approx(hand, rel=0.10)


def test_the_layer_scan_is_counted_once_per_layer(tpu_devices):
  """With remat the layers are one scan, whose body XLA's cost analysis counts once; the tool
  adds the other layers' cost from the body compiled alone. By hand, full remat runs each
  layer's forward twice and its backward (2 x forward) once: 4 x the layers' forward FLOPs,
  plus 3 x the vocabulary projection's."""
  layers = 4
  model, cfg = _model(layers=layers)
  c = _learner_config((-1, 1, 1), remat="full")
  ts = make_train_step(c, model, mesh=sharding.make_mesh(c.mesh, tpu_devices))
  rows, length = 8, 128
  batch = _leaf_batch(rows, length)
  low = ts.lowered(batch)["update"]
  body = programs.Loop("layers", layers, lambda: layer_loop_body(ts, batch, backward=True))
  res = analysis.compile_program(programs.Program("update", "learner", lambda: low, 1,
                                                  programs.Work(), loops=[body]))
  work = programs.ModelWork.of(cfg, "float32")
  pairs = rows * length * length
  head = 2.0 * work.head_params * rows * length
  hand = 4 * (work.forward(rows * length, pairs) - head) + 3 * head
  assert res.turn("flops") * V5E.num_chips == pytest.approx(hand, rel=0.10)
  assert res.flops * V5E.num_chips < 0.6 * hand   # what the cost analysis alone says



@pytest.mark.parametrize("name", ["prm", "judge"])
def test_model_scorer_programs_split_their_rows_over_the_data_shards(tpu_devices, name):
  """PATR's judge / PRM programs compile with the step's. By hand: a PRM call is a forward of
  every slot's serialised trajectory (one query block: all T^2 pairs; logits at the D step
  reads) whose rows split over the rollouts' data shards, so a chip executes its share, not the
  whole batch, here in passes of 2 rows (the loop's other passes counted from its body); the
  judge's cache holds each shard's share of the sequences and pages; both stay resident."""
  config = configs.frozenlake.get_config("algo=patr,smoke")
  config.scorer.name, config.scorer.prm_chunk_rows = name, 2   # the PRM: 2 rows per pass
  sp = programs.StepPrograms(config, tpu_devices)
  try:
    sm, shards = sp.scorer, sp.rollout_mesh.shape["data"]
    assert shards > 1 and sm.rows == sp.layout.num_prompts * sp.layout.slots
    progs = sm.programs(sp)
    results = [analysis.compile_program(p) for p in progs]
    assert not [r.error for r in results if r.error]
    k = int(config.rollout.score_every)   # scored after turns k, 2k, ..., every rollout
    assert all(p.calls == sp.shape.turns // k * sp.shape.rollouts for p in progs)
    resident = programs.resident_bytes(sp)
    if name == "prm":
      d = sp.engine.max_turns
      hand = sm.rows * sm.work.forward(sm.width, sm.width * sm.width, logits=d)
      assert sm.passes == sm.rows // shards // 2 > 1 and results[0].loops
      assert results[0].turn("flops") * shards == pytest.approx(hand, rel=0.10)
      assert "scorer_cache" not in resident
    else:
      assert [p.name.split("[")[0] for p in progs] == ["rollout/judge_prefill", "rollout/judge_decode"]
      spec = sm.cache.spec
      assert spec.max_seqs == sm.rows // shards
      pages = -(-(sm.width + int(config.scorer.judge_max_tokens) + 1) // spec.page_size)
      assert spec.max_pages_per_seq == pages and spec.num_pages == sm.rows * pages // shards
      assert resident["scorer_cache"] >= spec.num_pages * spec.page_size * sm.work.kv_token_bytes
  finally:
    sp.close()


def test_decode_with_the_pallas_window_kernel_compiles_for_v5e(tpu_devices):
  """With `sampler.attention=auto` a TPU run reads private pages with the Pallas kernel: the
  decode turn compiles for v5e with it (the gathered path beside it for comparison), holds less
  than the gathered window in temporaries, and its step counts the kernel's DMAs by hand: each
  row's private pages of K and V in every layer."""
  config = configs.frozenlake.get_config("algo=patr,smoke")
  config.sampler.attention = "auto"
  sp = programs.StepPrograms(config, tpu_devices)
  try:
    assert sp.window_kernel() == "tpu"
    decs = [p for p in sp.rollout_programs() if "decode" in p.name]
    assert [p.calls > 0 for p in decs] == [True, False] and decs[0].kernel and not decs[1].kernel
    kernel, gathered = (analysis.compile_program(p) for p in decs)
    assert not kernel.error and not gathered.error
    assert kernel.temp_bytes < gathered.temp_bytes
    m, ps = sp.model_config, sp.shape.page_size
    page = ps * m.num_kv_heads * m.head_dim * 2            # one layer's K page, bf16
    assert decs[0].kernel.bytes > (sp.shape.live_rows() / sp.shape.shards) * m.num_layers * 2 * page
    assert kernel.loops[0]["bytes"] >= decs[0].kernel.bytes
    line = step.summary([kernel, gathered], V5E, "tiny", {}, 1.0)   # the comparison is not the step
    assert line["hbm_peak_gib"] == round(step.in_step_peak(kernel, {}) / 2**30, 3)
    assert line["decode_bytes_ratio"] == kernel.ratios(V5E.num_chips)[1]
  finally:
    sp.close()
  alone = programs.StepPrograms(config, tpu_devices, comparisons=False)   # --nocomparisons
  try:
    assert [p.calls > 0 for p in alone.rollout_programs() if "decode" in p.name] == [True]
  finally:
    alone.close()

def test_pallas_tree_flash_attention_compiles_for_v5e_and_moves_fewer_bytes_than_the_block_path(
    tpu_devices):
  """The Pallas flash kernel over packed trees compiles for v5e (Mosaic: 128-token blocks,
  grouped-query heads, bf16), forward and backward. Its forward FLOPs are the hand count over
  the most block pairs the lists can hold (4 x block^2 x head_dim per query head and pair),
  and it moves a fraction of the bytes of the XLA block-sparse attention, which gathers each
  group's key blocks and materialises its float32 scores."""
  from tree_rl.learner import batches, synthetic
  from tree_rl.learner.tree_attention import block_visibility, tree_block_attention
  from tree_rl.learner.tree_flash import flash_layout, tree_flash_attention
  rng = np.random.default_rng(0)
  trees = [synthetic.patr_tree(rng, prompt=64, action=16, obs=16, vocab=100, group_id=g)
           for g in range(2)]
  pb = batches.pack_trees(trees, seq_len=1024, max_nodes=128, block=128)
  b, t = pb.tokens.shape
  nb, width = pb.kv_blocks.shape[1:]
  assert width < nb
  h, kvh, d = 4, 2, 64
  sh = NamedSharding(jax.sharding.Mesh(np.array(tpu_devices[:1]), ("x",)), P())
  q = jax.ShapeDtypeStruct((b, t, h, d), jnp.bfloat16, sharding=sh)
  k = jax.ShapeDtypeStruct((b, t, kvh, d), jnp.bfloat16, sharding=sh)
  nid, anc, lists = (jnp.asarray(x) for x in (pb.node_ids, pb.ancestors, pb.kv_blocks))

  def flash(q, k, v):
    return jnp.sum(tree_flash_attention(q, k, v, flash_layout(nid, anc, lists))
                   .astype(jnp.float32))

  def block(q, k, v):
    out = tree_block_attention(q, k, v, block_visibility(nid, anc, lists))
    return jnp.sum(out.astype(jnp.float32))

  cost, counted, estimate = {}, {}, {}
  for name, fn in (("flash", flash), ("block", block)):
    for grad in (False, True):
      f = jax.grad(fn, argnums=(0, 1, 2)) if grad else fn
      compiled = jax.jit(f).lower(q, k, k).compile()
      cost[name, grad] = compiled.cost_analysis()
      text = compiled.as_text()
      no_estimate = hbm._KERNEL_BYTES.sub("bytes_accessed:0", text)
      counted[name, grad] = (hbm.Program(text).hbm_bytes(), hbm.Program(no_estimate).hbm_bytes())
      estimate[name, grad] = sum(map(int, hbm._KERNEL_BYTES.findall(text)))
  pairs = sum(min(width, i + 1) for i in range(nb))   # query block i lists <= i + 1 key blocks
  hand = 4 * b * kvh * pairs * (h // kvh) * 128 * 128 * d
  assert cost["flash", False]["flops"] == pytest.approx(hand, rel=0.02)
  for grad in (False, True):
    assert cost["flash", grad]["bytes accessed"] < cost["block", grad]["bytes accessed"] / 3
    # the HBM count takes (the HBM share of) each kernel call's own estimate, which the
    # custom call carries
    assert estimate["flash", grad] > 0 and estimate["block", grad] == 0
    with_estimate, without = counted["flash", grad]
    assert 0 <= with_estimate - without <= estimate["flash", grad]
  with_estimate, without = counted["flash", False]   # the forward reads q, k and v from HBM
  assert with_estimate > without


def test_a_step_that_cannot_fit_says_so(tpu_devices):
  mesh = jax.sharding.Mesh(np.array(tpu_devices), ("data",))
  x = jax.ShapeDtypeStruct((80_000,), jnp.float32, sharding=NamedSharding(mesh, P()))
  outer = jax.jit(lambda v: jnp.outer(v, v))   # a 25.6 GB result on a 16 GiB chip
  res = analysis.compile_program(programs.Program("outer", "learner", lambda: outer.lower(x), 1,
                                                  programs.Work()))
  line = step.summary([res], V5E, "none", {}, 0.0)
  assert not line["fits"] and line["refused"] == ["outer"]
  ok = analysis.compile_program(programs.Program("small", "learner",
                                                 lambda: jax.jit(lambda v: v * 2).lower(x), 1,
                                                 programs.Work()))
  too_big = {"train_state": 17 * 2**30}   # resident state beyond a 16 GiB chip
  assert not step.summary([ok], V5E, "none", too_big, 0.0)["fits"]
  assert step.summary([ok], V5E, "none", {"train_state": 2**30}, 0.0)["fits"]
  # the KV pool is not resident while the learner's programs run (it is freed before them)
  assert step.summary([ok], V5E, "none", {"sampler_cache": 17 * 2**30}, 0.0)["fits"]
  assert step.in_step_peak(ok, {"sampler_cache": 17 * 2**30}) < 2**30


def test_collective_counts_read_hlo_text():
  text = ("%a = f32[4] all-gather(%x), dims={0}\n%b = f32[4] all-reduce-start(%y)\n"
          "%c = f32[4] all-reduce-done(%b)\n%d = f32[2] reduce-scatter(%z)\n")
  assert analysis.collective_counts(text) == {"all-gather": 1, "reduce-scatter": 1, "all-reduce": 1}


def test_pool_writes_stay_in_place_on_tpu(tpu_devices):
  """A fork (copy-on-write of a partial page) into a donated bfloat16 pool compiles for v5e
  without a temporary copy of the pool: the pool keeps heads and head_dim in one minor
  dimension (with [.., KV=2, D=32] minor dims every write copied the whole pool twice)."""
  model, _ = _model(hidden=128, layers=2, vocab=512)
  mesh = jax.sharding.Mesh(np.array(tpu_devices).reshape(4, 1), ("data", "tensor"))
  cache = sampling.init_cache(model, max_seqs=16, num_pages=4096, max_pages_per_seq=64,
                              kv_dtype="bfloat16", mesh=mesh, abstract=True)
  pool = programs.per_chip_bytes((cache.state.k, cache.state.v))
  rows = lambda dt: jax.ShapeDtypeStruct((16,), dt, sharding=NamedSharding(mesh, P("data")))  # noqa: E731
  res = analysis.compile_program(programs.Program(
      "fork", "rollout", lambda: sampling.lowered("fork", cache, rows(jnp.int32), rows(jnp.int32),
                                                  rows(jnp.bool_)), 1, programs.Work()))
  assert not res.error and res.alias_bytes >= pool
  assert res.temp_bytes < 0.01 * pool
