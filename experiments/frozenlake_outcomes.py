"""How a saved FrozenLake policy's held-out episodes end: won, fell into a hole, out of moves or
out of turns, per mode (greedy / sampled) and map side; the turn of each fall; and the greedy
first-move falls by what the view's first two moves lead onto (the moves towards the goal first:
"_O" = the hint's direction is safe and the next move is a hole).

    python -m experiments.frozenlake_outcomes --workdir=runs/tb --step=0

Uses the run's own config and the training loop's eval key, so its success rates are the eval
row logged at that step. Prints one JSON line and a table.
"""

import collections
import json

import jax
import numpy as np
from absl import app, flags

from tree_rl.config import eval_config, exit_on_bad_input, parse_flags_or_exit
from tree_rl.envs import frozenlake as fl

_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Run directory holding checkpoints/.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
CELL = {fl.OBS_FROZEN: "_", fl.OBS_HOLE: "O", fl.OBS_GOAL: "G", fl.OBS_PAD: "#"}


def outcome(final, i, j, max_steps: int, max_turns: int) -> str:
  if final.won[i, j]:
    return "won"
  if final.fell[i, j]:
    return "fell"
  return "out_of_moves" if final.steps[i, j] >= max_steps else (
      "out_of_turns" if final.turns[i, j] >= max_turns else "stopped")


def tally(e, start, side, max_steps: int, max_turns: int) -> dict:
  """Counts from `Evaluator.episodes` columns and the initial states."""
  final, valid, greedy = e["final"], e["valid"], e["greedy"]
  view = np.asarray(jax.vmap(lambda s: fl.neighbour_cells(s)[fl.preferred_moves(s)[:2]])(start))
  ends, falls, first = (collections.defaultdict(collections.Counter) for _ in range(3))
  for i, j in zip(*np.nonzero(valid)):
    mode = "greedy" if greedy[i, j] else "sampled"
    end = outcome(final, i, j, max_steps, max_turns)
    for group in (f"side_{side[i]}", "all"):
      ends[mode][(group, end)] += 1
    if end == "fell":
      falls[mode][int(final.turns[i, j])] += 1
      if mode == "greedy" and final.turns[i, j] == 1:
        first["greedy"]["".join(CELL[int(c)] for c in view[i])] += 1
  views = collections.Counter("".join(CELL[int(c)] for c in v) for v in view)
  return {"outcomes": {m: {f"{g}/{k}": n for (g, k), n in sorted(c.items())} for m, c in ends.items()},
          "falls_by_turn": {m: dict(sorted(c.items())) for m, c in falls.items()},
          "greedy_first_move_falls_by_view": dict(first["greedy"].most_common()),
          "maps_by_view": dict(views.most_common())}


def main(argv):
  del argv
  try:
    config = eval_config(_WORKDIR.value, None, overrides=[])
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"error: {e}")
  if config.env.name != "frozenlake":
    raise SystemExit(f"error: {_WORKDIR.value} is a {config.env.name} run; this reads FrozenLake")
  from tree_rl.train import build_parts, eval_key, new_cache, restore_params
  parts = build_parts(config)
  try:
    step, params = restore_params(parts.train_step, _WORKDIR.value, _STEP.value, parts.tokenizer)
    ev = parts.evaluator
    e, _ = ev.episodes(new_cache(parts, params), eval_key(config), final=True)
  finally:
    parts.tasks.close()
  side = np.maximum(np.asarray(ev.states.nrow), np.asarray(ev.states.ncol))
  out = {"workdir": _WORKDIR.value, "step": step} | tally(
      e, ev.states, side, int(parts.tasks.test_env.default_params.max_steps),
      int(config.rollout.max_turns))
  print(json.dumps(out))
  for mode, counts in out["outcomes"].items():
    print(f"{mode:>8}: " + ", ".join(f"{k} {n}" for k, n in counts.items()))
  for mode, counts in out["falls_by_turn"].items():
    print(f"{mode:>8} falls by turn: " + ", ".join(f"{t}: {n}" for t, n in counts.items()))
  print("greedy first-move falls by view (first two moves):", out["greedy_first_move_falls_by_view"])
  print("maps by view:", out["maps_by_view"])


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
