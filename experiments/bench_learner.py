"""Benchmark of the learner update: tokens/s and MFU, and tree-packed vs per-leaf training.

CPU (tiny model, small trees; the default):
  python -m experiments.bench_learner
One GPU, Qwen2.5-0.5B shape, batch 8 x 2048, bf16, with the PyTorch peer run first in the same job:
  python -m experiments.bench_learner --model=qwen25_05b --batch=8 --seq=2048 --dtype=bfloat16 \
      --peak_tflops=790 --peer_script=PATH/hf_train_peer.py --tree_model=qwen25_05b \
      --tree_prompts=4 --tree_prompt_len=256 --tree_action=128 --tree_obs=128

Dense part: one update over B x T causal rows (every token but the first in the loss), as the peer
trains a causal LM on B x T tokens. MFU uses the peer's FLOPs count (6 x matmul params + causal
attention) against --peak_tflops (0: a measured matmul peak on this backend).
Tree part: the same trees trained as one row per leaf (shared ancestors repeated) and tree-packed
(each node once); Tree-GRPO trees (M=2 trees per prompt, N=2, L=1) and PATR trees (B0=4, M=2).
Prints one JSON object per measurement and a table at the end; --out writes them as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "tiny", ["tiny", "small", "qwen25_05b"], "dense-part model shape")
flags.DEFINE_integer("vocab", 512, "vocabulary of the tiny/small models")
flags.DEFINE_integer("batch", 8, "dense part: rows")
flags.DEFINE_integer("seq", 256, "dense part: tokens per row")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype (master weights fp32)")
flags.DEFINE_integer("steps", 5, "timed updates per measurement")
flags.DEFINE_integer("warmup", 2, "untimed updates (the first compiles)")
flags.DEFINE_list("variants", ["auto/none/0"],
                  "dense part: attention/remat/logits_chunk triples to time, e.g. auto/none/0,auto/none/512")
flags.DEFINE_integer("microbatches", 1, "gradient accumulation micro-batches")
flags.DEFINE_bool("log_entropy", False, "compute the entropy metric (one more pass over logits)")
flags.DEFINE_float("peak_tflops", 0.0, "peak for MFU (0: measure a matmul on this backend)")
flags.DEFINE_string("peer_script", "", "path of hf_train_peer.py: run it first, same shape")
flags.DEFINE_list("peer_args", ["--compile"], "extra arguments for the peer")
flags.DEFINE_list("parts", ["dense", "tree"], "which parts to run")
flags.DEFINE_string("tree_model", "tiny", "model of the tree part (tiny | small | qwen25_05b)")
flags.DEFINE_integer("tree_prompts", 2, "tree part: prompts per batch")
flags.DEFINE_integer("tree_prompt_len", 256, "tree part: prompt tokens")
flags.DEFINE_integer("tree_action", 64, "tree part: policy tokens per agent step")
flags.DEFINE_integer("tree_obs", 64, "tree part: observation tokens per agent step")
flags.DEFINE_integer("tree_steps", 4, "tree part: agent steps per Tree-GRPO episode")
flags.DEFINE_integer("tree_row", 2048, "tree part: packed row length (several trees per row)")
flags.DEFINE_integer("tree_block", 32, "tree part: block size of the block-sparse tree attention")
flags.DEFINE_string("xla_flags", "", "appended to XLA_FLAGS before JAX starts")
flags.DEFINE_string("out", "", "write all results as a JSON list here")


def flops_per_token(cfg, seq: int) -> float:
  """The peer's count: 6 x matmul params (lm head included) + causal attention."""
  e, h, kv, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  per_layer = e * (h + 2 * kv) * d + h * d * e + 3 * e * cfg.intermediate_size
  dense = cfg.num_layers * per_layer + e * cfg.vocab_size
  attn = cfg.num_layers * 2 * h * d * seq
  return 6 * dense + 6 * attn / 2


def measured_peak_tflops(dtype) -> float:
  import jax
  import jax.numpy as jnp
  n = 4096 if jax.default_backend() != "cpu" else 1024
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  reps = 5
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - t) / 1e12


def model_config(name: str):
  from tree_rl.models.config import qwen25_05b, small, tiny
  return {"tiny": lambda: tiny(FLAGS.vocab), "small": lambda: small(FLAGS.vocab),
          "qwen25_05b": qwen25_05b}[name]()


def make_step(cfg, attention="auto", remat="none", logits_chunk=0):
  import jax.numpy as jnp
  from flax import nnx
  from tree_rl.config import base_config
  from tree_rl.learner import make_train_step
  from tree_rl.models import Transformer
  c = base_config()
  c.learner.update(attention=attention, remat=remat, logits_chunk=logits_chunk,
                   microbatches=FLAGS.microbatches, log_entropy=FLAGS.log_entropy,
                   kl_coef=0.0, learning_rate=1e-6)
  dtype = jnp.bfloat16 if FLAGS.dtype == "bfloat16" else jnp.float32
  model = Transformer(cfg, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
  step = make_train_step(c, model)
  return step, step.init()


def time_steps(step, state, batch):
  """Seconds per update: the mean over --steps back-to-back updates on an accelerator; on a
  (shared) CPU the fastest single update, which is the least disturbed by other load."""
  import jax
  for _ in range(FLAGS.warmup):
    state, metrics = step(state, batch)
  jax.block_until_ready(metrics["loss"])
  if jax.default_backend() != "cpu":
    t = time.perf_counter()
    for _ in range(FLAGS.steps):
      state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    return (time.perf_counter() - t) / FLAGS.steps, state, metrics
  times, cpu = [], []
  for _ in range(FLAGS.steps):
    t, c = time.perf_counter(), time.process_time()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics["loss"])
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
  metrics = dict(metrics, cpu_s=min(cpu))
  return min(times), state, metrics


def dense_part(results, peak):
  import numpy as np
  from tree_rl.learner import LeafBatch
  cfg = model_config(FLAGS.model)
  rng = np.random.default_rng(0)
  b, t = FLAGS.batch, FLAGS.seq
  mask = np.ones((b, t), bool)
  mask[:, 0] = False
  batch = LeafBatch(tokens=rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32), loss_mask=mask,
                    old_logp=np.full((b, t), -np.log(cfg.vocab_size), np.float32),
                    ref_logp=np.zeros((b, t), np.float32),
                    advantages=rng.choice([-1.0, 1.0], b).astype(np.float32),
                    group_ids=np.zeros(b, np.int32))
  for variant in FLAGS.variants:
    attention, remat, chunk = variant.split("/")
    try:
      step, state = make_step(cfg, attention, remat, int(chunk))
      dt, state, metrics = time_steps(step, state, batch)
    except Exception as e:  # report and go on to the next variant
      emit(results, dict(part="dense", variant=variant, error=f"{type(e).__name__}: {e}"[:500]))
      continue
    tok = b * t / dt
    emit(results, dict(part="dense", model=FLAGS.model, variant=variant, dtype=FLAGS.dtype,
                       batch=b, seq=t, step_s=round(dt, 4), tok_per_s=round(tok, 1),
                       mfu=round(tok * flops_per_token(cfg, t) / (peak * 1e12), 4),
                       peak_tflops=round(peak, 2), loss=float(metrics["loss"]),
                       skipped=float(metrics["skipped"])))
    del step, state


def tree_part(results):
  import jax
  import numpy as np
  from tree_rl.learner import leaf_batch, pack_trees, synthetic
  from tree_rl.learner.batches import merge_shared_roots
  cfg = model_config(FLAGS.tree_model)
  rng = np.random.default_rng(0)
  shape = dict(prompt=FLAGS.tree_prompt_len, action=FLAGS.tree_action, obs=FLAGS.tree_obs,
               vocab=cfg.vocab_size)
  cases = {
      "tree_grpo_M2_N2_L1": [synthetic.tree_grpo_tree(rng, steps=FLAGS.tree_steps, n=2, l=1,
                                                      group_id=p, **shape)
                             for p in range(FLAGS.tree_prompts) for _ in range(2)],
      "patr_B4_M2": [synthetic.patr_tree(rng, b0=4, m=2, k=2, rounds=2, group_id=p, **shape)
                     for p in range(FLAGS.tree_prompts)],
  }
  ndev = jax.device_count()
  up = lambda x, m: -(-x // m) * m
  for name, trees in cases.items():
    leaves = sum(len(t.leaves()) for t in trees)
    leaf_len = max(len(t.path_tokens(l)) for t in trees for l in t.leaves())
    lb = leaf_batch(trees, seq_len=up(leaf_len, 64), rows=up(leaves, ndev))
    merged = merge_shared_roots(trees)
    row_len = max(FLAGS.tree_row, up(max(len(t.tokens) for t in merged), FLAGS.tree_block))
    max_nodes = sum(t.num_nodes for t in trees)
    pack = lambda rows=None: pack_trees(trees, seq_len=row_len, max_nodes=max_nodes, rows=rows,
                                        block=FLAGS.tree_block)
    pb = pack()
    pb = pack(up(pb.tokens.shape[0], ndev))
    unique = sum(len(t.tokens) for t in merged)
    materialised = sum(len(t.path_tokens(l)) for t in trees for l in t.leaves())
    row = dict(part="tree", case=name, model=FLAGS.tree_model, trees=len(trees), leaves=leaves,
               unique_tokens=unique, per_leaf_tokens=materialised,
               leaf_batch=list(lb.tokens.shape), packed_batch=list(pb.tokens.shape),
               kv_blocks=int(pb.kv_blocks.shape[2]))
    step, _ = make_step(cfg)
    for label, batch in (("per_leaf", lb), ("packed", pb)):
      # Same initial state and updates: the two losses must agree (a correctness check).
      dt, state, metrics = time_steps(step, step.init(), batch)
      row[f"{label}_s"] = round(dt, 4)
      row[f"{label}_loss"] = float(metrics["loss"])
      if "cpu_s" in metrics:
        row[f"{label}_cpu_s"] = round(metrics["cpu_s"], 4)
    row["speedup"] = round(row["per_leaf_s"] / row["packed_s"], 3)
    if "packed_cpu_s" in row:  # CPU seconds of work: robust to other load on a shared machine
      row["speedup_cpu_time"] = round(row["per_leaf_cpu_s"] / row["packed_cpu_s"], 3)
    row["token_ratio"] = round(materialised / unique, 3)
    emit(results, row)
    del step, state


def run_peer(results):
  peer = os.path.abspath(FLAGS.peer_script)
  shape = {"qwen25_05b": "qwen2.5-0.5b"}.get(FLAGS.model, FLAGS.model)
  cmd = [sys.executable, peer, "--shape", shape, "--batch", str(FLAGS.batch), "--seq",
         str(FLAGS.seq), "--steps", str(FLAGS.steps)] + [a for a in FLAGS.peer_args if a]
  if FLAGS.peak_tflops:
    cmd += ["--peak-tflops", str(FLAGS.peak_tflops)]
  proc = subprocess.run(cmd, cwd=os.path.dirname(peer), capture_output=True, text=True)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
  if proc.returncode or not lines:
    emit(results, dict(part="peer", error=(proc.stderr or proc.stdout)[-800:]))
    return
  emit(results, dict(part="peer", **json.loads(lines[-1])))


def emit(results, row):
  results.append(row)
  print(json.dumps(row), flush=True)


def table(results):
  print("\n| part | what | time (s) | tok/s | MFU | note |\n|---|---|---|---|---|---|")
  peer = next((r for r in results if r.get("part") == "peer" and "tok_per_s" in r), None)
  for r in results:
    if "error" in r:
      print(f"| {r['part']} | {r.get('variant', '')} | - | - | - | error: {r['error'][:80]} |")
    elif r["part"] == "dense":
      vs = f"{r['tok_per_s'] / peer['tok_per_s']:.2f}x peer" if peer else ""
      print(f"| dense | {r['model']} {r['variant']} {r['dtype']} {r['batch']}x{r['seq']} | "
            f"{r['step_s']} | {r['tok_per_s']:,.0f} | {r['mfu']:.1%} | {vs} |")
    elif r["part"] == "peer":
      print(f"| peer | {r['peer']} {r['batch']}x{r['seq']} | {r['step_s']} | "
            f"{r['tok_per_s']:,.0f} | {r['mfu_vs_peak']:.1%} | |")
    else:
      print(f"| tree | {r['case']} per-leaf {r['leaf_batch']} vs packed {r['packed_batch']} | "
            f"{r['per_leaf_s']} / {r['packed_s']} | - | - | packed {r['speedup']}x faster"
            + (f" ({r['speedup_cpu_time']}x in CPU time)" if "speedup_cpu_time" in r else "")
            + f", {r['token_ratio']}x fewer tokens |")


def main(argv):
  del argv
  results = []
  if FLAGS.peer_script and "dense" in FLAGS.parts:
    run_peer(results)   # before JAX takes the accelerator's memory
  if FLAGS.xla_flags:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAGS.xla_flags).strip()
  import jax
  import jax.numpy as jnp
  print(json.dumps(dict(backend=jax.default_backend(), devices=jax.device_count(),
                        jax=jax.__version__)), flush=True)
  peak = FLAGS.peak_tflops or measured_peak_tflops(
      jnp.bfloat16 if FLAGS.dtype == "bfloat16" else jnp.float32)
  if "dense" in FLAGS.parts:
    dense_part(results, peak)
  if "tree" in FLAGS.parts:
    tree_part(results)
  table(results)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
