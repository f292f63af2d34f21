r"""Vmapped environment throughput: steps/s of the dynamics alone, with token rendering, full turns.

    python -m experiments.bench_envs                         # CPU, batch 4,096
    python -m experiments.bench_envs --batch=65536 --steps=200 --json_out=/tmp/bench_envs.json  # GPU

Every measurement is one jitted `fori_loop` of `--steps` steps over a vmapped batch (envs that
finish restart from their episode's first state), timed after a compile run; the best of
`--repeats` is reported. Modes: `dynamics` (step), `render` (step + observation tokens),
`turn` (parse a reply's tokens + step + observation tokens).
"""

from __future__ import annotations

import json
import time

from absl import app, flags
import jax
import jax.numpy as jnp
import numpy as np

from tree_rl import envs
from tree_rl.models.tokenizers import BuiltinTokenizer

_BATCH = flags.DEFINE_integer("batch", 4096, "envs stepped together under vmap")
_STEPS = flags.DEFINE_integer("steps", 100, "steps per timed loop (FrozenLake)")
_TOOL_STEPS = flags.DEFINE_integer("tool_steps", 10, "steps per timed loop (tool-call env)")
_REPEATS = flags.DEFINE_integer("repeats", 3, "timed loops; the best is reported")
_ENVS = flags.DEFINE_list("envs", ["frozenlake", "toolcall"], "envs to benchmark")
_JSON = flags.DEFINE_string("json_out", "", "also write the results here")


def _time(fn, *args):
  jax.block_until_ready(fn(*args))               # compile + warm up
  best = float("inf")
  for _ in range(_REPEATS.value):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return best


def _loop(env, params, init, n_steps, action_fn, mode, reply=None):
  """A jitted loop of n_steps vmapped steps; returns the final states and a checksum, so no part
  of the work can be optimised away."""
  step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
  render = jax.vmap(env.observation_tokens, in_axes=(0, None, None))
  parse = jax.vmap(env.parse_action)

  @jax.jit
  def run(key):
    def body(t, carry):
      states, acc = carry
      k_act, k_step = jax.random.split(jax.random.fold_in(key, t))
      if mode == "turn":
        action = parse(*reply(k_act))
      else:
        action = action_fn(k_act)
      states, _, reward, done, _ = step(jax.random.split(k_step, init_batch), states, action, params)
      acc = acc + jnp.sum(reward)
      if mode in ("render", "turn"):
        toks, lens = render(states, True, params)
        acc = acc + jnp.sum(lens) + jnp.sum(toks[:, 0])
      states = jax.tree.map(lambda a, b: jnp.where(
          jnp.reshape(done, done.shape + (1,) * (a.ndim - 1)), b, a), states, init)
      return states, acc
    return jax.lax.fori_loop(0, n_steps, body, (init, jnp.float32(0)))  # final states stay live

  init_batch = jax.tree.leaves(init)[0].shape[0]
  return run


def _encode_batch(tok, texts, cap):
  ids = np.zeros((len(texts), cap), np.int32)
  lens = np.zeros((len(texts),), np.int32)
  for i, t in enumerate(texts):
    e = tok.encode(t)[:cap]
    ids[i, :len(e)], lens[i] = e, len(e)
  return jnp.asarray(ids), jnp.asarray(lens)


def _rates(env, p, init, n, action_fn, reply, batch) -> dict:
  """Env steps per second for dynamics alone, + rendering, and a full parse-step-render turn."""
  return {mode: batch * n / _time(_loop(env, p, init, n, action_fn, mode, reply), jax.random.key(1))
          for mode in ("dynamics", "render", "turn")}


def bench_frozenlake(tok, batch):
  env = envs.make("frozenlake", preset="rllm", tokenizer=tok)
  p = env.default_params
  init, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), batch), p)
  action_fn = lambda k: jax.random.randint(k, (batch, 1), 0, 4)
  ids, lens = _encode_batch(tok, ["I go Up.", "Left", "```\nDown\n```", "Right it is", "hmm"] * (batch // 5 + 1),
                            env.max_reply_tokens)
  ids, lens = ids[:batch], lens[:batch]
  reply = lambda k: (jnp.roll(ids, jax.random.randint(k, (), 0, 5), 0), lens)
  return _rates(env, p, init, _STEPS.value, action_fn, reply, batch)


def bench_toolcall(tok, batch):
  env = envs.make("toolcall", tokenizer=tok, split="train")
  p = env.default_params
  init, _ = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))(jax.random.split(jax.random.key(0), batch), p)
  qs = env.questions
  texts = [f"<search>{qs[i % len(qs)].queries[0]}</search>" if i % 3 else f"<answer>{qs[i % len(qs)].answer}</answer>"
           for i in range(batch)]
  ids, lens = _encode_batch(tok, texts, env.max_reply_tokens)
  acts = jax.jit(jax.vmap(env.parse_action))(ids, lens)
  action_fn = lambda k: jax.tree.map(lambda x: jnp.roll(x, jax.random.randint(k, (), 0, 7), 0), acts)
  reply = lambda k: (jnp.roll(ids, jax.random.randint(k, (), 0, 7), 0), lens)
  return _rates(env, p, init, _TOOL_STEPS.value, action_fn, reply, batch)


def main(argv):
  del argv
  tok = BuiltinTokenizer()
  batch = _BATCH.value
  result = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "batch": batch,
            "steps_per_s": {}}
  if "frozenlake" in _ENVS.value:
    result["steps_per_s"]["frozenlake"] = bench_frozenlake(tok, batch)
  if "toolcall" in _ENVS.value:
    result["steps_per_s"]["toolcall"] = bench_toolcall(tok, batch)
  print(json.dumps(result))
  print(f"\n{'env':<12}{'dynamics':>14}{'+render':>14}{'parse+step+render':>20}   steps/s, batch {batch}, "
        f"{result['backend']}")
  for name, r in result["steps_per_s"].items():
    print(f"{name:<12}{r['dynamics']:>14,.0f}{r['render']:>14,.0f}{r['turn']:>20,.0f}")
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(result, f, indent=1)


if __name__ == "__main__":
  app.run(main)
