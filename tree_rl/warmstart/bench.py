"""Measure the warm start: SFT steps until the greedy first move matches the expert.

    python -m tree_rl.warmstart.bench                       # CPU: tiny model, FrozenLake rllm
    python -m tree_rl.warmstart.bench --preset=rllm_small --goal_hint --local_view --epsilon=0.2
    python -m tree_rl.warmstart.bench --steps=2000 --batch_size=64 --eval_every=100   # GPU

Prints one JSON line and a table of (step, loss, first-move accuracy on held-out noiseless demos).
On FrozenLake the accuracy is also split by the start (`CASES`): the hint's move leads into a
hole (the grid-blind hint rule fails there), a hole lies next to the start elsewhere, no hole.
`turn_k`: teacher-forced accuracy of the first reply token of turn k (the move word) on the
held-out demos, kept whole up to `--eval_max_len` tokens: whether later turns, at context
lengths past the training demos' `--max_len`, are learned too.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from tree_rl import config as config_lib
from tree_rl import envs, warmstart
from tree_rl.envs import frozenlake as fl
from tree_rl.models import build_model, build_tokenizer

CASES = ("hint_into_hole", "hole_beside", "no_hole")
TURNS = 6   # turn_1 .. turn_5, then turn_6+ together


def start_cases(env, key, n: int) -> np.ndarray:
  """int[n]: the `CASES` index of each start of `DemoGenerator(...)(key, n)` (same key split)."""
  def one(k):
    state, _ = env.reset(jax.random.split(k)[0], env.default_params)
    cells = fl.neighbour_cells(state)
    into = cells[fl.preferred_moves(state)[0]] == fl.OBS_HOLE
    return jnp.where(into, 0, jnp.where(jnp.any(cells == fl.OBS_HOLE), 1, 2))
  return np.asarray(jax.jit(jax.vmap(one))(jax.random.split(key, n)))


def accuracy_row(model, params, demos, gen, cases) -> dict:
  ok = np.asarray(warmstart.first_move_hits(model, params, demos, gen)[0])
  row = dict(first_move_acc=float(ok.mean()))
  hit, seen = warmstart.turn_hits(model, params, demos, gen.max_turns)
  for t in range(TURNS):
    h, s = (hit[:, t:], seen[:, t:]) if t == TURNS - 1 else (hit[:, t], seen[:, t])
    row[f"turn_{t + 1}" + ("+" if t == TURNS - 1 else "")] = float(h.sum() / max(s.sum(), 1))
  if cases is not None:
    row.update({c: float(ok[cases == i].mean()) if np.any(cases == i) else None
                for i, c in enumerate(CASES)})
  return row


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--env", default="frozenlake")
  ap.add_argument("--preset", default="rllm")
  ap.add_argument("--goal_hint", action="store_true", help="FrozenLake: observations name the goal's offset")
  ap.add_argument("--local_view", action="store_true", help="FrozenLake: observations name each move's cell")
  ap.add_argument("--model", default="tiny")
  ap.add_argument("--steps", type=int, default=100)
  ap.add_argument("--batch_size", type=int, default=16)
  ap.add_argument("--max_len", type=int, default=256)
  ap.add_argument("--num_demos", type=int, default=512)
  ap.add_argument("--epsilon", type=float, default=0.1)
  ap.add_argument("--loss_on_noise", action="store_true", help="also train on the noisy moves")
  ap.add_argument("--hard_fraction", type=float, default=0.0,
                  help="share of demos starting where the move needs the state read (Expert.hard)")
  ap.add_argument("--hard_turn_weight", type=float, default=1.0,
                  help="loss weight of replies on turns where the move needs the state read")
  ap.add_argument("--learning_rate", type=float, default=3e-3)
  ap.add_argument("--warmup_steps", type=int, default=20)
  ap.add_argument("--eval_every", type=int, default=25)
  ap.add_argument("--eval_demos", type=int, default=256)
  ap.add_argument("--eval_max_len", type=int, default=1024, help="tokens kept per held-out demo")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args(argv)

  c = config_lib.base_config()
  c.env.name, c.env.preset, c.model.preset = args.env, args.preset, args.model
  c.env.goal_hint, c.env.local_view = args.goal_hint, args.local_view
  for k in ("steps", "batch_size", "max_len", "num_demos", "epsilon", "learning_rate",
            "warmup_steps", "eval_every", "loss_on_noise", "hard_fraction", "hard_turn_weight"):
    c.warmstart[k] = getattr(args, k)
  w = c.warmstart
  warmstart.validate(w)
  tok = build_tokenizer(c.tokenizer, c.model.hf_path)
  env = envs.from_config(c, tokenizer=tok)
  model, _ = build_model(c.model, tok, seed=args.seed)
  key = jax.random.key(args.seed)
  k_demo, k_eval, k_train = jax.random.split(key, 3)
  gen = warmstart.DemoGenerator(env, tok, warmstart.make_expert(args.env, env, w.epsilon),
                                max_len=w.max_len, loss_on_noise=w.loss_on_noise,
                                hard_turn_weight=w.hard_turn_weight)
  eval_gen = warmstart.DemoGenerator(env, tok, warmstart.make_expert(args.env, env, 0.0),
                                     max_len=args.eval_max_len)
  t0 = time.perf_counter()
  demos = warmstart.draw_demos(gen, gen.expert, k_demo, w.num_demos, w.hard_fraction)
  eval_demos = eval_gen(k_eval, args.eval_demos)
  cases = start_cases(env, k_eval, args.eval_demos) if args.env == "frozenlake" else None
  jax.block_until_ready((demos.tokens, eval_demos.tokens))
  demo_s = time.perf_counter() - t0
  trainer = warmstart.SFTTrainer(model, w)
  rows, losses = [], []
  rows.append(dict(step=0, loss=None, train_s=0.0,
                   **accuracy_row(model, trainer.params_state(), eval_demos, eval_gen, cases)))
  train_s = 0.0
  for step in range(1, w.steps + 1):
    idx = jax.random.randint(jax.random.fold_in(k_train, step), (w.batch_size,), 0, w.num_demos)
    t = time.perf_counter()
    loss = float(trainer.step(warmstart.one_per_row(demos), idx))
    train_s += time.perf_counter() - t
    losses.append(loss)
    if step % w.eval_every == 0 or step == w.steps:
      rows.append(dict(step=step, loss=float(np.mean(losses[-10:])), train_s=round(train_s, 1),
                       **accuracy_row(model, trainer.params_state(), eval_demos, eval_gen, cases)))
      print(f"step {step} loss {rows[-1]['loss']:.4f} acc {rows[-1]['first_move_acc']:.3f} "
            f"train_s {train_s:.1f}", flush=True)
  out = dict(env=args.env, preset=args.preset, model=args.model, backend=jax.default_backend(),
             steps=w.steps, batch_size=w.batch_size, max_len=w.max_len, num_demos=w.num_demos,
             epsilon=w.epsilon, learning_rate=w.learning_rate,
             demo_success=float(demos.success.mean()), demo_tokens=float(demos.length.mean()),
             demo_truncated=float(demos.truncated.mean()), demo_seconds=round(demo_s, 1),
             train_seconds=round(train_s, 1), step_ms=round(1000 * train_s / w.steps, 1),
             hard_fraction=w.hard_fraction, hard_turn_weight=w.hard_turn_weight,
             loss_on_noise=w.loss_on_noise,
             eval_cases=None if cases is None else {c: int(np.sum(cases == i)) for i, c in enumerate(CASES)},
             curve=rows)
  print(json.dumps(out))
  split = (CASES if cases is not None else ()) + tuple(k for k in rows[0] if k.startswith("turn_"))
  print(f"{'step':>6} {'loss':>8} {'first-move acc':>15} " + "".join(f"{c:>15}" for c in split)
        + f" {'train s':>8}")
  for r in rows:
    loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
    print(f"{r['step']:>6} {loss:>8} {r['first_move_acc']:>15.3f} "
          + "".join(f"{r[c]:>15.3f}" for c in split) + f" {r['train_s']:>8}")
  return out


if __name__ == "__main__":
  main()
