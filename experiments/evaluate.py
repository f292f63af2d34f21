"""Evaluate saved policies of a run on the held-out split, one JSON line per checkpoint step.

    python -m experiments.evaluate --workdir=runs/default --steps=0,16 --config.train.eval_samples=8
    python -m experiments.evaluate --workdir=runs/default --maps=maps.json   # any FrozenLake maps

`--maps=FILE.json` evaluates on the maps of a JSON file instead of the held-out split (a list of
{"rows": ["SFFH", "FHFG", ...]} in gymnasium's letters; `tree_rl.envs.frozenlake.json_maps` says
what is checked), e.g. another framework's published test set; each row then names the file.

The run's own config (its config.json) is used; `--config.x=...` may change only fields that
change neither the policy nor the evaluation set (`tree_rl.config.EVAL_ONLY`), and an explicit
`--config=FILE` that differs from the run's elsewhere is refused, naming the fields. With the
run's config, a step's numbers equal the eval row the training loop logged for it.
"""

import json
import sys

from absl import app, flags
from ml_collections import config_flags

from tree_rl import compile_cache
from tree_rl.config import eval_config, exit_on_bad_input, parse_flags_or_exit
from tree_rl.validation import validate

_CACHE = compile_cache.define_flag()
_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/frozenlake.py",
    "Only to check against the run's saved config (default: the run's own config.json).")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Run directory holding checkpoints/.")
_STEPS = flags.DEFINE_list("steps", [], "Checkpoint steps to evaluate (default: the latest).")
_MAPS = flags.DEFINE_string("maps", "", "A JSON file of FrozenLake maps to evaluate on instead of "
                            "the held-out split (config.env.eval_maps).")


def _overrides(argv) -> list[str]:
  """Dotted fields set with --config.x=... on the command line."""
  out = []
  for arg in argv:
    if arg.startswith("--config."):
      out.append(arg[len("--config."):].split("=", 1)[0])
  return out


def main(argv):
  del argv
  explicit = flags.FLAGS["config"].present
  overrides = _overrides(sys.argv[1:])
  try:
    config = eval_config(_WORKDIR.value, _CONFIG.value if explicit or overrides else None,
                         overrides=None if explicit else overrides)
    if _MAPS.value:
      config.env.eval_maps = _MAPS.value
      validate(config)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
  compile_cache.enable(_CACHE.value)
  from tree_rl.train import evaluate_checkpoint
  named = {"maps": _MAPS.value} if _MAPS.value else {}
  for step in [int(s) for s in _STEPS.value] or [None]:
    try:
      row = evaluate_checkpoint(config, _WORKDIR.value, step)
    except FileNotFoundError as e:   # no such checkpoint: one line naming the saved steps
      print(f"error: {e}", file=sys.stderr, flush=True)
      sys.exit(2)
    print(json.dumps(named | row), flush=True)


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
