"""Evaluate saved policies of a run on the held-out split, one JSON line per checkpoint step.

    python -m experiments.evaluate --config=configs/frozenlake.py --workdir=runs/default \\
        --steps=0,16 --config.train.eval_samples=8

With the run's own config, a step's numbers equal the eval row the training loop logged for it.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from tree_rl import compile_cache
from tree_rl.config import exit_on_bad_input, parse_flags_or_exit

_CACHE = compile_cache.define_flag()
_CONFIG = config_flags.DEFINE_config_file("config", "configs/frozenlake.py", "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Run directory holding checkpoints/.")
_STEPS = flags.DEFINE_list("steps", [], "Checkpoint steps to evaluate (default: the latest).")


def main(argv):
  del argv
  compile_cache.enable(_CACHE.value)
  from tree_rl.train import evaluate_checkpoint
  for step in [int(s) for s in _STEPS.value] or [None]:
    print(json.dumps(evaluate_checkpoint(_CONFIG.value, _WORKDIR.value, step)), flush=True)


if __name__ == "__main__":
  app.run(exit_on_bad_input(main), flags_parser=parse_flags_or_exit)
