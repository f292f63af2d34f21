"""Rollout benchmark: chain, Tree-GRPO, PATR and Tree-Random on FrozenLake through one engine.

Per method (after warm-up rollouts that compile the shapes they meet): wall-clock, finished trajectories,
generated and prefilled (computed) tokens per trajectory, tokens reused from shared pages, peak
KV pages; for every method also the no-sharing baseline (each branch re-encodes its whole prefix,
as the public Tree-GRPO code does), run for real, with its wall-clock and prefill.

The policy has random weights; with --steer (default) its output head is biased towards the
FrozenLake move words so that episodes end in holes and goals after varied numbers of turns.

  python -m experiments.bench_rollout                                   # CPU, tiny model
  python -m experiments.bench_rollout --model=qwen25_05b --dtype=bfloat16 --prompts=64 \\
      --max_tokens=64 --num_pages=65536                                   # one GPU
Prints one JSON line per (method, sharing), then a table.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time

from absl import app, flags

_MODEL = flags.DEFINE_enum("model", "tiny", ["tiny", "small", "qwen25_05b"], "Model shape (random weights).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Weights and compute dtype.")
_KV = flags.DEFINE_enum("kv_dtype", None, ["float32", "bfloat16"], "KV dtype (default: --dtype).")
_PROMPTS = flags.DEFINE_integer("prompts", 4, "Prompts (FrozenLake maps) per rollout.")
_TURNS = flags.DEFINE_integer("max_turns", 10, "Agent turns per trajectory.")
_TOKENS = flags.DEFINE_integer("max_tokens", 16, "New tokens per turn.")
_METHODS = flags.DEFINE_list("methods", ["chain", "tree_grpo", "patr", "tree_random"], "Methods.")
_GROUP = flags.DEFINE_integer("group", 4, "chain: trajectories per prompt (Tree-GRPO's chain baseline: 4).")
_BASELINE = flags.DEFINE_list("baseline_methods", ["tree_grpo"],
                              "Methods also run without prefix sharing (the re-prefill baseline).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed rollouts (different seeds) after the warm-up.")
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed rollouts first (compilation of the shapes seen).")
_ROWS = flags.DEFINE_enum("row_buckets", "pow2", ["pow2", "full"], "Decode batch: power-of-two buckets or all slots.")
_OBS_CHUNK = flags.DEFINE_integer("obs_chunk", 64, "Observation tokens prefilled per call "
                                  "(0: the whole observation capacity in one call).")
_PAGES = flags.DEFINE_integer("num_pages", 4096, "KV pages in the pool.")
_PAGE = flags.DEFINE_integer("page_size", 16, "Tokens per page.")
_ATTN = flags.DEFINE_enum("attention", "auto", ["auto", "cascade", "reference"], "Paged attention.")
_STEER = flags.DEFINE_bool("steer", True, "Bias the random policy towards move words.")
_OUT = flags.DEFINE_string("out", "", "Also write the JSON lines to this file.")


def build(tok):
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from tree_rl.models.config import qwen25_05b, small, tiny
  from tree_rl.models.transformer import Transformer
  v = tok.vocab_size
  cfg = {"tiny": lambda: tiny(v), "small": lambda: small(v),
         "qwen25_05b": lambda: dataclasses.replace(qwen25_05b(), vocab_size=v)}[_MODEL.value]()
  cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
  dt = jnp.bfloat16 if _DTYPE.value == "bfloat16" else jnp.float32
  model = Transformer(cfg, dtype=dt, param_dtype=dt, rngs=nnx.Rngs(0))
  if _STEER.value:
    emb = jax.random.normal(jax.random.key(1), model.embed[...].shape, jnp.float32)
    head = 0.02 * jax.random.normal(jax.random.key(2), model.lm_head[...].shape, jnp.float32)
    ids = {s: tok.encode(s)[0] for s in ("\n", "Down", "Right", "Left", "Up", "<|im_end|>")}
    d = emb.shape[1]
    unit = lambda a: emb[a] / jnp.sqrt(jnp.mean(emb[a] ** 2)) / d ** 0.5  # noqa: E731
    for a, targets, s in ((ids["\n"], ("Down", "Right", "Left", "Up"), 7.0),
                          (ids["Down"], ("<|im_end|>",), 9.0), (ids["Right"], ("<|im_end|>",), 9.0),
                          (ids["Left"], ("<|im_end|>",), 9.0), (ids["Up"], ("<|im_end|>",), 9.0)):
      for t in targets:
        head = head.at[:, ids[t]].add(s * unit(a))
    model.embed[...] = emb.astype(dt)
    model.lm_head[...] = head.astype(dt)
  return model


def main(_):
  import jax
  import numpy as np
  from tree_rl.config import base_config
  from tree_rl.envs.frozenlake import FrozenLake
  from tree_rl.models.tokenizers import BuiltinTokenizer
  from tree_rl.rollout import build as rbuild
  from tree_rl.rollout.capacity import new_cache
  from tree_rl.rollout.driver import run
  from tree_rl.rollout.engine import Layout

  tok = BuiltinTokenizer()
  model = build(tok)
  env = FrozenLake("rllm", tokenizer=tok, max_reply_tokens=_TOKENS.value)
  reps = _WARMUP.value + _REPEATS.value
  maps = jax.random.split(jax.random.key(42), _PROMPTS.value * reps)
  states_all, _ = jax.vmap(env.reset)(maps)
  kv = _KV.value or _DTYPE.value
  c = base_config()
  c.rollout.max_turns, c.rollout.max_tokens_per_turn = _TURNS.value, _TOKENS.value
  c.rollout.group_size = _GROUP.value
  c.sampler.attention = _ATTN.value
  rows, caches = [], {}
  for name in _METHODS.value:
    c.rollout.method = name
    method = rbuild.make_method(c)
    scorer = rbuild.make_scorer(c, method, env=env, tokenizer=tok, policy_model=model)
    for share in ([True, False] if name in _BASELINE.value else [True]):
      engine = rbuild.make_engine(c, env, tok, share_prefix=share, row_buckets=_ROWS.value,
                                  obs_chunk=_OBS_CHUNK.value, entropy_tokens=method.entropy_tokens)
      layout = Layout(_PROMPTS.value, method.capacity(engine.max_turns), method.slots, method.num_trees)
      key = (layout.capacity, layout.slots)
      if key not in caches:
        caches[key] = new_cache(model, [(engine, layout)], num_pages=_PAGES.value,
                                page_size=_PAGE.value, kv_dtype=kv)
      walls, stats = [], []
      for rep in range(reps):
        p = _PROMPTS.value
        states = jax.tree.map(lambda x: x[rep * p:(rep + 1) * p], states_all)
        t0 = time.perf_counter()
        out, caches[key] = run(engine, method, caches[key], states, jax.random.key(rep),
                               scorer=scorer)
        jax.block_until_ready(out.tree.tokens)
        if rep >= _WARMUP.value:
          walls.append(time.perf_counter() - t0)
          stats.append(out.stats)
      agg = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
      traj = max(agg["trajectories"], 1)
      row = dict(method=name, sharing=share, wall_s=float(np.mean(walls)),
                 wall_per_traj_ms=1e3 * float(np.mean(walls)) / traj,
                 trajectories=agg["trajectories"], mean_turns=agg["mean_turns"],
                 engine_turns=agg["turns"], wall_per_turn_ms=1e3 * float(np.mean(walls)) / max(agg["turns"], 1),
                 success=agg["success_rate"], pruned=agg["pruned"],
                 generated_per_traj=agg["budget/generated"] / traj,
                 prefilled_per_traj=agg["budget/prefilled"] / traj,
                 reused_per_traj=agg["budget/reused"] / traj,
                 cost_per_traj=(agg["budget/generated"] + agg["budget/prefilled"]) / traj,
                 no_sharing_prefilled_per_traj=agg["budget/no_sharing_prefilled"] / traj,
                 peak_pages=agg["peak_pages"], prompts=_PROMPTS.value,
                 model=_MODEL.value, dtype=_DTYPE.value, device=jax.devices()[0].device_kind,
                 jax=jax.__version__, host=platform.node())
      rows.append(row)
      print(json.dumps(row), flush=True)
  chain = {r["sharing"]: r for r in rows if r["method"] == "chain"}
  print(f"\n{'method':<12}{'share':>6}{'traj':>6}{'turns':>6}{'gen/t':>8}{'pre/t':>8}{'cost/t':>8}"
        f"{'x chain':>8}{'ms/t':>9}{'x chain':>8}{'peak pg':>8}")
  for r in rows:
    base = chain.get(True)
    rc = r["cost_per_traj"] / base["cost_per_traj"] if base else float("nan")
    rw = r["wall_per_traj_ms"] / base["wall_per_traj_ms"] if base else float("nan")
    print(f"{r['method']:<12}{str(r['sharing']):>6}{r['trajectories']:>6.0f}{r['mean_turns']:>6.1f}"
          f"{r['generated_per_traj']:>8.0f}{r['prefilled_per_traj']:>8.0f}{r['cost_per_traj']:>8.0f}"
          f"{rc:>8.2f}{r['wall_per_traj_ms']:>9.1f}{rw:>8.2f}{r['peak_pages']:>8.0f}")
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
  app.run(main)
