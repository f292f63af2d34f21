"""Sampler benchmark: tree rollouts through the paged cache vs the no-sharing baseline.

Workloads (one prompt of P tokens, B branches of G new tokens each, sampling at temperature 1):
  tree      prefill P once, fork into B branches, decode G tokens each
  two_level prefill P, fork into `fanout` branches, decode G, prefill an observation of `obs`
            tokens each, fork every branch into B / fanout children, decode G again
  baseline  every branch re-prefills the whole prompt into its own cache (no sharing), decode G
Per workload: new tokens/s (decode only and end to end), prefill tokens computed, peak pages,
time per decode step and its roofline floor ((weight bytes + KV bytes read) / bandwidth, KV read
counting each cached token once per step, as an ideal shared-prefix kernel would).

  python -m experiments.bench_sampler                                   # CPU, tiny model
  python -m experiments.bench_sampler --model=qwen25_05b --dtype=bfloat16 --batch=256 \\
      --prompt=512 --gen=256 --peer                                       # one H200
Prints one JSON line per workload, then a table.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time

from absl import app, flags

_MODEL = flags.DEFINE_enum("model", "tiny", ["tiny", "small", "qwen25_05b"], "Model shape (random weights).")
_VOCAB = flags.DEFINE_integer("vocab", 512, "Vocabulary size for tiny/small.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights and compute dtype.")
_KV_DTYPE = flags.DEFINE_enum("kv_dtype", None, ["float32", "bfloat16"], "KV dtype (default: --dtype).")
_BATCH = flags.DEFINE_integer("batch", 16, "Branches B.")
_PROMPT = flags.DEFINE_integer("prompt", 256, "Prompt tokens P.")
_GEN = flags.DEFINE_integer("gen", 64, "New tokens per branch and turn G.")
_FANOUT = flags.DEFINE_integer("fanout", 4, "two_level: first-level branches.")
_OBS = flags.DEFINE_integer("obs", 32, "two_level: observation tokens between the turns.")
_PAGE = flags.DEFINE_integer("page_size", 16, "Tokens per page.")
_SEGMENTS = flags.DEFINE_integer("turn_segments", 1, "Decode loop segments (see sampling.decode).")
_WORKLOADS = flags.DEFINE_list("workloads", ["tree", "two_level", "baseline"], "Workloads to run.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed repetitions after the warm-up (best is reported).")
_BANDWIDTH = flags.DEFINE_float("bandwidth", 3.35e12, "Memory bandwidth in bytes/s for the roofline.")
_RNG = flags.DEFINE_string("rng_impl", "rbg", "PRNG impl of the sampling keys (rbg: XLA RngBitGenerator; '' = jax default).")
_PEER = flags.DEFINE_bool("peer", False, "Also run ../shared/peers/hf_generate_peer.py on the same workload.")
_PEER_SCRIPT = flags.DEFINE_string("peer_script", "../shared/peers/hf_generate_peer.py", "Peer script path.")
_PEER_CACHE = flags.DEFINE_string("peer_cache", "", "Peer cache kinds (default: static on GPU, dynamic on CPU).")
_OUT = flags.DEFINE_string("out", "", "Also write the JSON lines to this file.")


def build_model():
  import jax.numpy as jnp
  from flax import nnx
  from tree_rl.models.config import qwen25_05b, small, tiny
  from tree_rl.models.transformer import Transformer
  cfg = {"tiny": lambda: tiny(_VOCAB.value), "small": lambda: small(_VOCAB.value),
         "qwen25_05b": qwen25_05b}[_MODEL.value]()
  dt = jnp.bfloat16 if _DTYPE.value == "bfloat16" else jnp.float32
  return Transformer(cfg, dtype=dt, param_dtype=dt, rngs=nnx.Rngs(0))


class Workload:
  """Runs one workload on a fresh cache; returns timings and counters."""

  def __init__(self, name, model, key_fn):
    import numpy as np
    self.name, self.model, self.key_fn = name, model, key_fn
    b, p, g, ps = _BATCH.value, _PROMPT.value, _GEN.value, _PAGE.value
    self.b, self.p, self.g, self.ps = b, p, g, ps
    total = p + 2 * g + _OBS.value + 2
    self.mp = math.ceil(total / ps) + 1
    self.num_pages = (b + 1) * self.mp
    rng = np.random.default_rng(0)
    self.prompt = rng.integers(0, model.cfg.vocab_size, (p,), dtype=np.int32)
    self.obs = rng.integers(0, model.cfg.vocab_size, (b, max(_OBS.value, 1)), dtype=np.int32)

  def run(self):
    import jax
    import numpy as np
    from tree_rl import sampling
    b, p, g = self.b, self.p, self.g
    kv = _KV_DTYPE.value or _DTYPE.value
    cache = sampling.init_cache(self.model, max_seqs=b + 1, num_pages=self.num_pages,
                                max_pages_per_seq=self.mp, page_size=self.ps, kv_dtype=kv)
    jax.block_until_ready(cache.state)
    stats = dict(prefill_tokens=0, decode_s=0.0, steps=0, new_tokens=0)
    t0 = time.perf_counter()
    kids = np.arange(1, b + 1, dtype=np.int32)

    def decode(cache, slots, key, attention):
      t = time.perf_counter()
      cache, out = sampling.decode(cache, slots, self.key_fn(key), max_new=g, temperature=1.0,
                                   attention=attention, turn_segments=_SEGMENTS.value)
      n = int(np.asarray(out.lengths).sum())
      stats["decode_s"] += time.perf_counter() - t
      stats["steps"] += int(np.asarray(out.steps).max())
      stats["new_tokens"] += n
      assert n == len(slots) * g, "every branch must produce G tokens"
      return cache

    def prefill(cache, slots, toks, lens):
      cache, out = sampling.prefill(cache, slots, toks, lens)
      assert (np.asarray(out.status) == sampling.Status.OK).all()
      stats["prefill_tokens"] += int(np.asarray(out.computed).sum())
      return cache

    if self.name == "baseline":
      cache = prefill(cache, kids, np.tile(self.prompt, (b, 1)), np.full(b, p, np.int32))
      cache = decode(cache, kids, 0, "reference")
    else:
      cache = prefill(cache, np.zeros(1, np.int32), self.prompt[None], np.array([p], np.int32))
      if self.name == "tree":
        cache, st = sampling.fork(cache, np.zeros(b, np.int32), kids)
        cache = decode(cache, kids, 0, "auto")
      else:
        f = _FANOUT.value
        first = np.arange(1, f + 1, dtype=np.int32)
        cache, st = sampling.fork(cache, np.zeros(f, np.int32), first)
        cache = decode(cache, first, 0, "auto")
        cache = prefill(cache, first, self.obs[:f], np.full(f, _OBS.value, np.int32))
        # Children of branch i take slots f+1+... ; each first-level branch keeps one leaf itself.
        per = b // f
        parents = np.repeat(first, per - 1)
        children = np.arange(f + 1, f + 1 + len(parents), dtype=np.int32)
        cache, st = sampling.fork(cache, parents, children)
        leaves = np.concatenate([first, children])
        cache = decode(cache, leaves, 1, "auto")
    jax.block_until_ready(cache.state)
    stats["total_s"] = time.perf_counter() - t0
    stats["peak_pages"] = int(np.asarray(cache.state.peak_pages).max())
    return stats

  def floor_ms(self, steps_per_turn):
    """Weights + ideal KV bytes per decode step (each cached token read once), over bandwidth."""
    cfg = self.model.cfg
    wbytes = cfg.num_params * (2 if _DTYPE.value == "bfloat16" else 4)
    kvb = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (2 if (_KV_DTYPE.value or _DTYPE.value) == "bfloat16" else 4)
    b, p, g = self.b, self.p, self.g
    if self.name == "tree":
      ctx = [p + b * g / 2]
    elif self.name == "baseline":
      ctx = [b * (p + g / 2)]
    else:
      f = _FANOUT.value
      ctx = [p + f * g / 2, p + f * (g + _OBS.value) + b * g / 2]
    mean_ctx = sum(ctx) / len(ctx)
    return 1e3 * (wbytes + kvb * mean_ctx) / _BANDWIDTH.value


def run_peer():
  """The HF peer in a subprocess, run before JAX claims the accelerator's memory."""
  if not os.path.exists(_PEER_SCRIPT.value):
    return [{"peer": "hf_generate", "error": f"{_PEER_SCRIPT.value} not found"}]
  try:
    import torch
  except ImportError:
    return [{"peer": "hf_generate", "error": "torch not installed"}]
  on_gpu = torch.cuda.is_available() and os.environ.get("JAX_PLATFORMS", "") != "cpu"
  shape = "qwen2.5-0.5b" if _MODEL.value == "qwen25_05b" else "tiny"
  cmd = [sys.executable, _PEER_SCRIPT.value, "--shape", shape, "--batch", str(_BATCH.value),
         "--prompt", str(_PROMPT.value), "--gen", str(_GEN.value),
         "--cache", _PEER_CACHE.value or ("static" if on_gpu else "dynamic"),
         "--device", "cuda" if on_gpu else "cpu"]
  res = subprocess.run(cmd, capture_output=True, text=True)
  rows = [json.loads(l) for l in res.stdout.splitlines() if l.startswith("{")]
  return rows or [{"peer": "hf_generate", "error": res.stderr[-500:]}]


def main(_):
  peer_rows = run_peer() if _PEER.value else []
  import jax
  import flax
  model = build_model()
  key_fn = (lambda k: jax.random.key(k, impl=_RNG.value)) if _RNG.value else jax.random.key
  meta = dict(device=str(jax.devices()[0].device_kind), backend=jax.default_backend(),
              jax=jax.__version__, flax=flax.__version__, python=platform.python_version(),
              model=_MODEL.value, dtype=_DTYPE.value, rng_impl=_RNG.value or "default", kv_dtype=_KV_DTYPE.value or _DTYPE.value,
              B=_BATCH.value, P=_PROMPT.value, G=_GEN.value, page_size=_PAGE.value,
              turn_segments=_SEGMENTS.value,
              command="python -m experiments.bench_sampler " + " ".join(sys.argv[1:]))
  rows = []
  for name in _WORKLOADS.value:
    w = Workload(name, model, key_fn)
    w.run()                                        # warm-up: compiles every shape
    best = min((w.run() for _ in range(_REPEATS.value)), key=lambda s: s["total_s"])
    turns = 1 if name != "two_level" else 2
    step_ms = 1e3 * best["decode_s"] / best["steps"]
    floor = w.floor_ms(best["steps"] / turns)
    rows.append(dict(meta, workload=name, new_tokens=best["new_tokens"],
                     decode_tok_per_s=round(best["new_tokens"] / best["decode_s"], 1),
                     end_to_end_tok_per_s=round(best["new_tokens"] / best["total_s"], 1),
                     total_s=round(best["total_s"], 4), prefill_tokens=best["prefill_tokens"],
                     peak_pages=best["peak_pages"], step_ms=round(step_ms, 4),
                     floor_ms=round(floor, 4), step_over_floor=round(step_ms / floor, 2)))
    print(json.dumps(rows[-1]), flush=True)
  for r in peer_rows:
    rows.append(dict(r, workload="hf_peer"))
    print(json.dumps(rows[-1]), flush=True)
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("\n".join(json.dumps(r) for r in rows) + "\n")
  print("\n| workload | new tok/s (decode) | new tok/s (end to end) | prefill tokens | peak pages | ms/step | floor ms/step |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    if r["workload"] == "hf_peer":
      print(f"| {r.get('peer')} | | {r.get('new_tok_per_s', r.get('error'))} | | | | |")
      continue
    print(f"| {r['workload']} | {r['decode_tok_per_s']:,} | {r['end_to_end_tok_per_s']:,} | {r['prefill_tokens']:,} | "
          f"{r['peak_pages']:,} | {r['step_ms']} | {r['floor_ms']} |")
  base = {r["workload"]: r for r in rows}
  if "tree" in base and "baseline" in base:
    print(f"\ntree / baseline end-to-end speed-up: "
          f"{base['tree']['end_to_end_tok_per_s'] / base['baseline']['end_to_end_tok_per_s']:.2f}x")


if __name__ == "__main__":
  app.run(main)
